"""The math verifier: extraction, normalisation and comparison rules by hand, its budgets on
adversarial input (also in threads), and accuracy on the shipped regression corpus."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flywheel.rewards.math import extract_answer, verify

CORPUS = Path(__file__).parent / "data" / "math_verifier_cases.jsonl"

CASES = [
    # (gold, completion, equal)
    ("\\frac{1}{2}", "so \\boxed{\\dfrac{1}{2}}", True),
    ("0.5", "\\boxed{\\frac12}", True),
    ("1000", "\\boxed{1,000}", True),
    ("1000", "\\boxed{1{,}000}", True),
    ("1000", "\\boxed{10^{3}}", True),
    ("(1,2]", "\\boxed{\\left(1, 2\\right]}", True),
    ("(1,2]", "\\boxed{(1,2)}", False),
    ("[1,2]", "\\boxed{(1,2)}", False),
    ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}", True),
    ("1, 2", "\\boxed{2}, \\boxed{1}", True),
    ("(1,2)", "\\boxed{(2,1)}", False),
    ("(-\\infty, 3]", "\\boxed{(-\\infty,3]}", True),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", True),
    ("3\\sqrt{2}", "\\boxed{2\\sqrt{3}}", False),
    ("7/2", "\\boxed{3\\frac{1}{2}}", True),
    ("4.5 \\times 10^{33}", "\\boxed{4.5e33}", True),
    ("3", "\\boxed{x = 3}", True),
    ("30", "\\boxed{30^\\circ}", True),
    ("50", "\\boxed{50\\%}", True),
    ("5", "\\boxed{5 \\text{ cm}}", True),
    ("5", "\\boxed{\\$5}", True),
    ("y = 2x + 1", "\\boxed{y - 2x = 1}", True),
    ("y = 2x + 1", "\\boxed{y = 2x - 1}", False),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}}", True),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\boxed{\\begin{pmatrix}1&2\\\\4&3\\end{pmatrix}}", False),
    ("0.333", "\\boxed{\\frac{1}{3}}", True),
    ("\\frac{1}{3}", "\\boxed{0.33}", False),
    ("0.5", "\\boxed{0.50001}", False),
    ("A", "\\boxed{\\text{(A)}}", True),
    ("2", "The final answer is 2.", True),
    ("2", "Answer: 2", True),
    ("2", "I think it is 2", False),
    ("2", "\\boxed{2 \\text{ or } 3}", False),
    ("(x+1)^2", "\\boxed{x^2+2x+1}", True),
    ("x^2", "\\boxed{x^3}", False),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\sqrt{2}/2}", True),
    ("1024", "\\boxed{2^{10}}", True),
    ("-\\frac{1}{2}", "\\boxed{\\frac{-1}{2}}", True),
    ("\\infty", "\\boxed{-\\infty}", False),
    ("5", "\\boxed{5i}", False),
    ("\\frac{\\pi}{2}", "\\boxed{\\pi/2}", True),
    ("3.14", "\\boxed{\\pi}", False),
    ("10", "\\boxed{100}", False),
    ("-5", "\\boxed{5}", False),
    ("\\text{Evelyn}", "\\boxed{\\text{Evelyn}}", True),
]


@pytest.mark.parametrize("gold, completion, equal", CASES)
def test_rules_by_hand(gold, completion, equal):
    verdict = verify(gold, completion)
    assert verdict.correct is equal, verdict
    assert verdict.reward == (1.0 if equal else -1.0)


def test_extraction():
    assert extract_answer("a \\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert extract_answer("\\boxed{1}, \\boxed{2} and \\boxed{3}") == "1, 2, 3"
    assert extract_answer("\\fbox{7}") == "7"
    assert extract_answer("\\boxed{unclosed") is None
    assert extract_answer("nothing here") is None
    assert verify("2", "nothing").reason == "no_answer"
    assert verify("2", "\\boxed{2 or 3}", hedged="first").correct
    assert not verify("2", "\\boxed{2 or 3}", hedged="last").correct


ADVERSARIAL = [
    "\\boxed{10^{10^{10^{10}}}}",
    "\\boxed{" + "(" * 5000 + "}",
    "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}",
    "\\boxed{" + "x+" * 3000 + "1}",
    "\\boxed{9^{9^{9^{9^{9}}}}!}",
    "\\boxed{(10^{100})!}",
    "\\boxed{" + "\\sqrt{" * 500 + "2" + "}" * 500 + "}",
    "x" * 300_000 + "\\boxed{1}",
    "\\boxed{" * 20000,
]


@pytest.mark.parametrize("completion", ADVERSARIAL)
def test_budgets_on_adversarial_input(completion):
    start = time.perf_counter()
    verdict = verify("1", completion)
    assert time.perf_counter() - start < 2.0
    assert verdict.correct is (completion.endswith("\\boxed{1}"))


def test_runs_in_threads():
    """Many threads switching often: a verifier with shared mutable state (mpmath's global
    precision, once) gives an occasional wrong verdict here."""
    import sys

    work = [(g, c) for g, c, _ in CASES] * 60 + [("1", c) for c in ADVERSARIAL[:3]]
    expected = [verify(g, c).correct for g, c in work]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            threaded = list(pool.map(lambda gc: verify(*gc).correct, work))
    finally:
        sys.setswitchinterval(interval)
    assert threaded == expected


@pytest.mark.skipif(not CORPUS.is_file(), reason="regression corpus not present")
def test_regression_corpus():
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 300
    wrong = [r for r in rows if verify(r["gold"], r["prediction"]).correct != r["equal"]]
    false_positive = [r for r in wrong if not r["equal"]]
    # Accept means equal: a false positive rewards a wrong answer, the costlier error in RL.
    assert len(false_positive) <= 0.01 * len(rows), [r["id"] for r in false_positive]
    assert len(wrong) <= 0.05 * len(rows), [r["id"] for r in wrong]


def test_verdicts_do_not_depend_on_the_global_mpmath_precision():
    """Another thread (or library) changing mpmath's global precision must not change a verdict:
    with the global context at 5 digits, every case still grades as at the default."""
    import mpmath

    expected = [verify(g, c).correct for g, c, _ in CASES]
    saved = mpmath.mp.dps
    try:
        mpmath.mp.dps = 5
        assert [verify(g, c).correct for g, c, _ in CASES] == expected
    finally:
        mpmath.mp.dps = saved
