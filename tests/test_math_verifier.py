"""The math verifier: extraction, normalisation and comparison rules by hand, its budgets on
adversarial input (also in threads and worker processes), and its accuracy on the dev and
the frozen held-out corpus (the numbers the README states)."""

import hashlib
import json
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flywheel.rewards.math import answers_equal, extract_answer, parse, read_answer, verify
from flywheel.rewards.math.evaluate import Budget
from flywheel.rewards.math.expr import Reject

CORPUS = Path(__file__).parent / "data" / "math_verifier_cases.jsonl"
HELDOUT = Path(__file__).parent / "data" / "math_verifier_heldout.jsonl"

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
    # Issue 16: a gold written to 3 decimals is not a license to round the prediction.
    ("0.333", "\\boxed{\\frac{1}{3}}", False),
    ("0.125", "\\boxed{\\frac{1}{8}}", True),
    ("16386.17", "\\boxed{16386.16}", False),  # one cent off: relative 6e-7, but a whole unit of the last place
    ("\\frac{2}{3}", "\\boxed{0.666666667}", True),  # within 1e-6 and half a unit of the 9th place
    ("\\frac{1}{3}", "\\boxed{0.33}", False),
    ("0.5", "\\boxed{0.50001}", False),
    ("A", "\\boxed{\\text{(A)}}", True),
    ("2", "The final answer is 2.", True),
    ("2", "Answer: 2", True),
    ("2", "I think it is 2", False),  # the last number of prose is never read (issue 36)
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
    # Unboxed answers, in the documented fallback order.
    ("41", "so the total is $41$.", True),
    ("12", "Hence\n\\[ 12 \\]", True),
    ("58", "She needs **58** tiles.", True),
    ("1200", "The total is 1,200 dollars.\n#### $1,200.00", True),
    ("9", "Final Answer: The final answer is 9. I hope it is correct.", True),
    ("10455", "... = \\boxed{255} ... Final Answer: The final answer is $10,455$.", True),  # the phrase after the box
    ("12", "where $d = \\frac{90}{n}$, so there are 12 sequences.", True),  # prose number after the math
    # Notation.
    ("\\frac{1}{6}", "\\boxed{0.1\\overline{6}}", True),  # 0.1666... = 1/10 + 6/90
    ("-3", "\\boxed{\u22123}", True),
    ("1000000", "\\boxed{1,\\!000,\\!000}", True),
    ("32349", "\\boxed{32, 349}", False),  # a space after the comma: a list, not a separator
    ("3+4i", "\\boxed{3+4j}", True),
    ("\\frac{7}{2}", "\\boxed{3\\tfrac12}", True),
    # Equivalent forms.
    ("25\\%", "\\boxed{0.25}", True),
    ("25\\%", "\\boxed{2.5}", False),
    ("\\frac{\\pi}{3}", "\\boxed{60^\\circ}", True),
    ("[2,5)", "\\boxed{2 \\le x < 5}", True),
    ("y \\le 7", "\\boxed{7 \\ge y}", True),
    ("x > -2", "\\boxed{-x < 2}", True),
    ("y \\le 7", "\\boxed{7 \\le y}", False),
    ("(-\\infty,-1]\\cup[1,\\infty)", "\\boxed{|x| \\geq 1}", True),
    ("(-\\infty,3)\\cup(3,\\infty)", "\\boxed{\\mathbb{R} \\setminus \\{3\\}}", True),
    ("(-\\infty,3)\\cup(3,\\infty)", "\\boxed{x \\neq 3}", True),
    ("1 \\pm \\sqrt{2}", "\\boxed{1-\\sqrt{2}, 1+\\sqrt{2}}", True),
    ("1 \\pm \\sqrt{2}", "\\boxed{1+\\sqrt{2}}", False),
    ("(3, 4)", "\\boxed{(x, y) = (3, 4)}", True),
    ("AB=4,CD=5", "\\boxed{4, 5}", True),
    ("a + 3z = 0", "\\boxed{0}", False),  # a sum is not a label
    ("p=5,q=2;p=7,q=2", "\\boxed{(5,2),(7,2)}", True),
    ("(1,2),(3,4)", "\\boxed{(3,4)} and \\boxed{(1,2)}", True),
    ("2, 3", "\\boxed{2 \\text{ and } 3}", True),
    ("\\begin{pmatrix} 3 \\\\ -1 \\end{pmatrix}", "\\boxed{(3, -1)}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
     "\\boxed{\\left[\\begin{array}{c} 1 \\\\ 2 \\end{array}\\right]}", True),
    ("\\sqrt{2}", "\\boxed{\\sqrt{2} \\approx 1.414}", True),
    # Expressions to evaluate.
    ("\\frac{1}{2}", "\\boxed{\\sin 30^\\circ}", True),
    ("3", "\\boxed{\\log_2 8}", True),
    ("10", "\\boxed{\\binom{5}{2}}", True),
    ("-1", "\\boxed{e^{i\\pi}}", True),
    ("\\frac{1}{3}", "\\boxed{\\int_0^1 x^2\\,dx}", True),
    ("3", "\\boxed{\\lfloor \\pi \\rfloor}", True),
    ("\\sin 2x", "\\boxed{2\\sin x\\cos x}", True),
    ("2i", "\\boxed{\\sqrt{-4}}", True),
    ("\\frac{n(n+1)}{2}", "\\boxed{\\binom{n+1}{2}}", True),
    ("2", "\\boxed{\\log 100}", True),  # \\log without a base: ln or log10
    # More notation and extraction.
    ("D", "Therefore (D).", True),
    ("\\pi", "pi", True),
    ("\\frac{5}{2}", "\\boxed{2\u00bd}", True),
    ("(2,\\infty)", "\\boxed{\\{x \\mid x > 2\\}}", True),
    ("(1, 2)", "\\boxed{x = 1, y = 2}", True),
    ("\\sqrt{2}", "\\boxed{1.4142135623730951}", True),  # a float's repr, one unit of its last place
    ("f(x) = 2x + 3", "\\boxed{y = 2x + 3}", True),
    ("a = 2, b = 3", "\\boxed{a = 3, b = 2}", False),
    # Issue 36. Units convert when the reference carries one: 2 kg = 2000 g; 1.5 h = 90 min;
    # 60 mph = 60 * 5280 ft / 3600 s = 88 ft/s; 5 m is no mass.
    ("2\\text{ kg}", "\\boxed{2000\\text{ g}}", True),
    ("1.5\\text{ hours}", "\\boxed{90 \\text{ minutes}}", True),
    ("60\\text{ mph}", "\\boxed{88\\text{ ft/s}}", True),
    ("5\\text{ m}", "\\boxed{5\\text{ kg}}", False),
    ("5\\text{ cm}", "\\boxed{5\\text{ m}}", False),  # once read as 5 = 5, the units dropped
    # A decimal names a value at its own precision: 6 significant digits, within one unit of
    # its last place. 1/3 - 0.333333 = 3.3e-7 < 1e-6; 0.3333 has 4 digits; 2/3 - 0.666665 = 1.7e-6 > 1e-6.
    ("\\frac{1}{3}", "\\boxed{0.333333}", True),
    ("0.333333", "\\boxed{\\frac13}", True),
    ("\\frac{1}{3}", "\\boxed{0.3333}", False),
    ("\\frac{2}{3}", "\\boxed{0.666665}", False),
    ("\\pi", "\\boxed{3.14159}", True),  # pi - 3.14159 = 2.7e-6 < 1e-5, 6 digits
    # Near zero: relative, never absolute. 1/2004! / (1/2006!) = 2005 * 2006; e^{-100} / e^{-101} = e;
    # sin(pi) is 40-digit rounding residue that vanishes at 80 digits.
    ("\\frac{1}{2006!}", "\\boxed{\\frac{1}{2004!}}", False),
    ("e^{-100}", "\\boxed{e^{-101}}", False),
    ("0", "\\boxed{\\sin(\\pi)}", True),
    ("\\frac{1}{2004!}", "\\boxed{0}", False),
    # Expressions against their values: [1 2; 3 4] + [5 6; 7 8] = [6 8; 10 12];
    # [1 2; 3 4][5 6; 7 8] = [19 22; 43 50]; 1 + ... + 10 = 55; 5! = 120.
    ("\\begin{pmatrix}6&8\\\\10&12\\end{pmatrix}",
     "\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}+\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}}", True),
    ("\\begin{pmatrix}19&22\\\\43&50\\end{pmatrix}",
     "\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}}", True),
    ("55", "\\boxed{\\sum_{k=1}^{10} k}", True),
    ("120", "\\boxed{\\prod_{k=1}^{5} k}", True),
    ("a_n = \\sum_{i=1}^{n} a_i b_{n-i}", "\\boxed{a_n = \\sum_{i=1}^{n} b_{n-i} a_i}", True),  # products commute
    ("4, 4, 4", "\\boxed{4}", True),  # a set with a member repeated
    ("25", "\\boxed{\\text{twenty-five}}", True),
    ("42", "\\boxed{\\text{The answer is } 42}", True),
    ("x = 2, y = 3", "So $x = \\boxed{2}$ and $y = \\boxed{3}$.", True),
    ("3, 5", "(a) \\boxed{3} (b) \\boxed{5}", True),
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
    assert verify("2", "nothing to see here").reason == "no_answer"
    assert verify("2", "nothing").reason == "wrong_value:last_line"  # a one-word response is its answer ("odd")
    assert extract_answer("Final Answer: The largest $n$ is 34.") == "34"
    # A response that runs on into a new chat turn: only what came before, by the strict rules (issue 36).
    assert extract_answer("The answer is 7. <|im_start|>user 8") is None
    assert extract_answer("So \\boxed{7}. <|im_start|>user What is 8?") == "7"
    assert extract_answer("The answer is 7.<|im_end|>") == "7"  # an end of turn with nothing after it
    assert extract_answer("so $x = 3$", require_box=True) is None
    assert not verify("3", "so $x = 3$", require_box=True).correct
    assert verify("3", "so $x = 3$").correct
    assert verify("2", "\\boxed{2 or 3}", hedged="first").correct
    assert not verify("2", "\\boxed{2 or 3}", hedged="last").correct


ANSWER_RULES = [
    # (completion, answer read, rule) -- issue 36: only answers given as answers.
    ("so \\boxed{7}", "7", "box"),
    ("\\boxed{2} and \\boxed{3}", "2, 3", "box"),
    ("\\boxed{2} or \\boxed{3}", "2 or 3", "box"),  # a hedge, graded "hedged"
    ("The final answer is $7$. I hope it is correct.", "$7$", "phrase"),  # normalize drops the $
    ("Final Answer: The largest $n$ is 34.", "34", "phrase"),
    ("**Final Answer**\n\n7", "7", "phrase"),
    ("The total is 1,200 dollars.\n#### $1,200.00", "$1,200.00", "hashes"),
    ("We add them.\n7", "7", "last_line"),
    ("Hence the side length is\n\\[ 12 \\]", "\\[ 12 \\]", "conclusion"),
    ("Adding the two counts, the total is $41$.", "$41$", "conclusion"),
    ("So she needs **58** tiles in total.", "**58**", "conclusion"),
    ("Therefore (D).", "(D)", "conclusion"),
    ("10 square units", "10 square units", "last_line"),
]
NO_ANSWER = [
    "First, 3 x 4 = 12. Then we need to",  # unfinished prose
    "AZYUK2A x",  # a number inside a word
    "$$$$$$$$$$$$$$$$$$$$7",  # the end of degenerate text
    "the the the the the the the the the the the\n7",  # a loop, then a clean last line
    "```python\nprint('Answer:', 7)\n```",  # code
    "print(\"Answer:\", 7)",
    "def solve():\n    return 7",
    "Let me think.<|im_start|>user\nIs it 7?<|im_end|>\n<|im_start|>assistant\nThe answer is 7.",  # a new turn
    "Let me think.\nuser\nIs it 7?\nassistant\nThe answer is 7.",  # the same, special tokens dropped
    "1\n2\n3\n7",  # candidates listed
    "Maybe $7$",  # tried, not concluded
    "The final answer is not 7, because",
    "The answer is $7$ if we assume that",
    "So far we have $7$, but",
]


@pytest.mark.parametrize("completion, answer, rule", ANSWER_RULES)
def test_answer_rules(completion, answer, rule):
    found = read_answer(completion)
    assert (found.answer, found.rule) == (answer, rule)


@pytest.mark.parametrize("completion", NO_ANSWER)
def test_no_answer_is_read_from_what_was_never_given_as_one(completion):
    assert read_answer(completion) is None
    assert verify("7" if "7" in completion else "12", completion).reason == "no_answer"


def test_strict_rules_for_cut_responses():
    """Cut by the length limit, or run on into a new turn: boxes only."""
    assert verify("7", "The answer is 7.", truncated=True).reason == "no_answer"
    assert verify("7", "... \\boxed{7}. Let me double-check", truncated=True).reason == "correct:box"
    assert verify("7", "\\boxed{7}<|im_end|>\n<|im_start|>user\nAnd 8?").reason == "correct:box"
    assert verify("7", "The answer is 7.<|im_end|>\n<|im_start|>user\nAnd 8?").reason == "no_answer"


def test_hedges_across_statements():
    assert verify("3", "\\boxed{2} or possibly \\boxed{3}").reason == "hedged:box"
    assert verify("3", "The answer is 2. Or maybe the answer is 3.").reason == "hedged:phrase"
    assert verify("12", "Answer: 10\nAnswer: 11\nAnswer: 12").reason == "hedged:phrase"  # candidates listed
    assert verify("5", "First we get \\boxed{3}, but correcting the sign gives \\boxed{5}.").correct  # a correction


ADVERSARIAL = [
    "\\boxed{10^{10^{10^{10}}}}",
    "so the answer is $10^{10^{10^{10}}}$",
    "\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}",
    "\\boxed{(10^{100})! - (10^{100})!}",
    "\\boxed{\\binom{10^{9}}{10^{5}}}",
    "\\boxed{\\int_0^{10^{9}} \\sin(x^{50}) dx}",
    "\\boxed{" + "+".join(["x"] * 600) + "}",
    "\\boxed{" + ", ".join(str(k) for k in range(400)) + "}",
    "\\boxed{" + "\\pm 1" * 40 + "}",
    "\\boxed{(x+y+z)^{16} - (x+y+z)^{16}}",
    "\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}",
    "1" * 100_000,
    "$" + "1+" * 50_000 + "1$",
    "\\boxed{" + "(" * 5000 + "}",
    "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}",
    "\\boxed{" + "x+" * 3000 + "1}",
    "\\boxed{9^{9^{9^{9^{9}}}}!}",
    "\\boxed{(10^{100})!}",
    "\\boxed{" + "\\sqrt{" * 500 + "2" + "}" * 500 + "}",
    "x" * 300_000 + "\\boxed{1}",
    "\\boxed{" * 20000,
    # Issue 36's new paths: a chain of 8x8 matrix products (entry trees grow 16x a product:
    # their sizes are counted as they are built), nested sums of 10^8 terms, soup and loops.
    "\\boxed{" + ("\\begin{pmatrix}" + "\\\\".join(["&".join(["x"] * 8)] * 8) + "\\end{pmatrix}") * 5 + "}",
    "\\boxed{\\sum_{k=1}^{10000} \\sum_{j=1}^{10000} j}",
    "the " * 50_000 + "1",
    "`" * 100_000 + "1",
    "a;\n" * 50_000 + "1",
]


@pytest.mark.parametrize("completion", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_budgets_on_adversarial_input(completion):
    """Every input is bounded by sizes and a work budget; the clock here is only a hang guard."""
    start = time.perf_counter()
    verdict = verify("1", completion)
    assert time.perf_counter() - start < 5.0
    assert verdict.correct is (completion.endswith("\\boxed{1}"))


def test_work_budget_counts_steps_and_holds_a_deadline():
    budget = Budget(steps=10, seconds=60)
    for _ in range(10):
        budget.tick()
    with pytest.raises(Reject, match="budget"):
        budget.tick()
    late = Budget(steps=10**9, seconds=-1)  # past its deadline: the first clock check stops it
    with pytest.raises(Reject, match="budget"):
        for _ in range(257):
            late.tick()


def test_comparisons_stop_at_the_work_budget():
    """A 200-element list against itself takes about 40k comparisons: inside the default
    budget, over a budget of 1000 steps (which raises instead of running on)."""
    values = parse(", ".join(str(k) for k in range(200)))
    assert answers_equal(values, values, Budget())
    with pytest.raises(Reject, match="budget"):
        answers_equal(values, values, Budget(steps=1000, seconds=60))


def _verdicts(completions):
    return [verify("1", c).correct for c in completions]


def test_budgets_hold_in_a_worker_process():
    """No signals: the same bounds hold in a dataloader-style worker process."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_verdicts, (ADVERSARIAL,)).get(timeout=60)
    assert got == [c.endswith("\\boxed{1}") for c in ADVERSARIAL]


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


def _misjudged(path: Path) -> tuple[list[dict], list[dict], int]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    wrong = [r for r in rows if verify(r["gold"], r["prediction"]).correct != r["equal"]]
    return [r for r in wrong if not r["equal"]], [r for r in wrong if r["equal"]], len(rows)


def test_dev_corpus():
    """The README's dev numbers (tools/bench_verifier.py): 905 cases, all judged right."""
    false_positive, false_negative, n = _misjudged(CORPUS)
    assert n == 905
    assert [r["id"] for r in false_positive] == []
    assert [r["id"] for r in false_negative] == []


def test_heldout_corpus():
    """The README's held-out numbers: the split chosen before tuning, never tuned on.
    Accept means equal: a false positive rewards a wrong answer, the costlier error in RL."""
    false_positive, false_negative, n = _misjudged(HELDOUT)
    assert n == 224
    # Exactly the README's numbers (0.964: no false positive, 8 false negatives; before issue
    # 36: 0.955, 1 and 9): a change either way means the README is out of date.
    assert len(false_positive) == 0, [r["id"] for r in false_positive]
    assert len(false_negative) == 8, [r["id"] for r in false_negative]


def test_heldout_split_is_the_hash_rule():
    """The held-out cases are exactly the first batch of issue-16 cases (mv-, nemo-, fw-) whose
    sha256 starts with 0-7; dev cases added after the split (mario-, qwen-, ...) are dev only."""
    def held(r):
        return hashlib.sha256((r["gold"] + "\x1f" + r["prediction"]).encode()).hexdigest()[0] in "01234567"

    dev = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    heldout = [json.loads(line) for line in HELDOUT.read_text().splitlines() if line.strip()]
    added = [r for r in dev if r["id"].startswith(("mv-", "nemo-", "fw-"))]
    assert len(heldout) >= 200 and all(held(r) for r in heldout)
    assert not any(held(r) for r in added if r["id"] != "mv-230")  # its gold was fixed after the split
    assert not {(r["gold"], r["prediction"]) for r in dev} & {(r["gold"], r["prediction"]) for r in heldout}


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
