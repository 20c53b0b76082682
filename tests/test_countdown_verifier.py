"""The Countdown verifier: hand-worked cases, adversarial inputs in bounded time, properties."""

from __future__ import annotations

import doctest
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flywheel.rewards.countdown as countdown
from flywheel.rewards.countdown import MAX_ANSWER_CHARS, MAX_COMPLETION_CHARS, MAX_DEPTH, verify

REASONS = {
    "correct", "wrong_value", "no_answer", "too_long", "parse_error", "too_deep", "bad_numbers", "too_big",
    "div_by_zero",
}


def answer(expression: str) -> str:
    return f"<answer>{expression}</answer>"


def test_doctests_pass():
    assert doctest.testmod(countdown).failed == 0


# (numbers, target, completion, keyword args, expected reason)
CASES = [
    # the trace format of the tiny policy: 9*8 = 72, 72 - 5 = 67
    ([5, 9, 8], 67, "9*8=72\n72-5=67\n<answer>(9*8)-5</answer>", {}, "correct"),
    ([5, 9, 8], 67, answer(" 9 * 8 - 5 "), {}, "correct"),  # precedence: (9*8)-5
    ([5, 9, 8], 67, answer("9*(8-5)"), {}, "wrong_value"),  # 9*3 = 27
    ([5, 9, 8], 67, answer("9-8-5"), {}, "wrong_value"),  # left-assoc: (9-8)-5 = -4
    ([2, 8, 4], 1, answer("8/4/2"), {}, "correct"),  # left-assoc: (8/4)/2 = 1, not 8/(4/2) = 4
    # the last complete answer block wins, earlier ones and unclosed trailing tags do not
    ([5, 9, 8], 67, answer("9+8+5") + "\nno wait\n" + answer("9*8-5"), {}, "correct"),
    ([5, 9, 8], 67, answer("9*8-5") + "\nno wait\n" + answer("9+8+5"), {}, "wrong_value"),
    ([5, 9, 8], 67, answer("9*8-5") + "\n<answer>9+8", {}, "correct"),
    ([5, 9, 8], 67, "<answer>\n(9*8)\n-5\n</answer>", {}, "correct"),  # multi-line
    # numbers as a multiset: reused, missing, extra, duplicates needed
    ([5, 9, 8], 67, answer("9*8-5+5-5"), {}, "bad_numbers"),
    ([5, 9, 8], 72, answer("9*8"), {}, "bad_numbers"),
    ([5, 9, 8], 72, answer("9*8"), {"each_number": "at_most_once"}, "correct"),
    ([5, 9, 8], 77, answer("9*8+5+5"), {"each_number": "at_most_once"}, "bad_numbers"),
    ([3, 3, 5], 14, answer("3*3+5"), {}, "correct"),
    ([3, 3, 5], 8, answer("3+5"), {}, "bad_numbers"),
    ([3, 5], 8, answer("3+5+0"), {}, "bad_numbers"),
    ([0, 5], 5, answer("0+5"), {}, "correct"),  # a lone 0 is a literal
    # leading zeros are not the given number
    ([5, 9, 8], 67, answer("09*8-5"), {}, "parse_error"),
    ([5, 9, 8], 67, answer("9*8-05"), {}, "parse_error"),
    ([0, 5], 5, answer("00+5"), {}, "parse_error"),
    # unary minus, also after an operator and doubled
    ([5, 9, 8], -67, answer("-(9*8)+5"), {}, "correct"),
    ([5, 9, 8], 67, answer("5--9*8"), {}, "wrong_value"),  # 5 - (-72) = 77
    ([5, 9, 8], 77, answer("5--9*8"), {}, "correct"),
    ([5, 9, 8], 67, answer("9*8 - - -5"), {}, "correct"),
    # exact fractions: 6/(1-3/4) = 6/(1/4) = 24; 1/3 + 1/3 + 1/3 = 1
    ([6, 1, 3, 4], 24, answer("6/(1-3/4)"), {}, "correct"),
    ([3, 3, 3, 1, 1, 1], 1, answer("1/3+1/3+1/3"), {}, "correct"),
    ([7, 2], 3, answer("7/2"), {}, "wrong_value"),  # 3.5, no rounding
    # division by zero, also nested and after the value would otherwise be right
    ([5, 5, 3], 3, answer("3/(5-5)"), {}, "div_by_zero"),
    ([5, 5, 3, 1], 1, answer("1+3/(5-5)"), {}, "div_by_zero"),
    # no answer at all
    ([5, 9, 8], 67, "9*8=72\n72-5=67", {}, "no_answer"),
    ([5, 9, 8], 67, "", {}, "no_answer"),
    ([5, 9, 8], 67, "</answer>9*8-5<answer>", {}, "no_answer"),
    ([5, 9, 8], 67, answer(""), {}, "parse_error"),
    ([5, 9, 8], 67, answer("   "), {}, "parse_error"),
]


@pytest.mark.parametrize("numbers, target, completion, kwargs, reason", CASES)
def test_hand_worked_cases(numbers, target, completion, kwargs, reason):
    verdict = verify(numbers, target, completion, **kwargs)
    assert verdict.reason == reason
    assert verdict.correct == (reason == "correct")
    assert verdict.reward == (1.0 if reason == "correct" else -1.0)


@pytest.mark.parametrize(
    "expression",
    [
        "2**3", "2*3**1", "8//2", "8%3", "2^3", "x=6", "2*3=6", "(2*3", "2*3)", "2 3", "+2*3", "2*+3",
        "2×3", "6÷3", "2−3", "٣*2", "２*3", "2.0*3", "2e0*3", "2_0", "abs(2)*3", "__import__('os')",
        "\\frac{2}{1}*3", "$2*3$", "2*3;", "[2]*3", "2 * 3 # comment", "2\u00a0*3", "2*3\x00",
    ],
)
def test_rejected_syntax(expression):
    verdict = verify([2, 3], 6, answer(expression))
    assert (verdict.correct, verdict.reason, verdict.reward) == (False, "parse_error", -1.0)


def test_answer_is_stripped_expression_or_none():
    assert verify([5, 9, 8], 67, "<answer>\n 9*8-5 \n</answer>").answer == "9*8-5"
    assert verify([5, 9, 8], 67, "no tags").answer is None
    assert verify([5, 9, 8], 67, answer("9**8")).answer == "9**8"


def test_dense_reward():
    # §B: 1 - 2 * min(|t - p| / t, 1); -0.9 for an unusable answer; -1 without one
    dense = lambda completion: verify([5, 9, 8], 67, completion, dense=True)  # noqa: E731
    assert dense(answer("9*8-5")).reward == 1.0
    assert dense(answer("9*8+5")).reward == pytest.approx(1 - 2 * 10 / 67)  # p = 77
    assert dense(answer("9*8*5")).reward == -1.0  # p = 360: relative error capped at 1
    assert dense(answer("9*8+5")).correct is False
    assert dense(answer("9*8")).reward == -0.9  # bad numbers
    assert dense(answer("9*8-5-")).reward == -0.9  # parse error
    assert verify([5, 5, 3], 3, answer("3/(5-5)"), dense=True).reward == -0.9
    assert dense("9*8=72").reward == -1.0
    assert verify([6, 2], 0, answer("6-2"), dense=True).reward == -1.0  # |t| taken as 1 at t = 0


def test_each_number_rule_is_validated():
    with pytest.raises(ValueError, match="exactly_once.*at_most_once"):
        verify([1, 2], 3, answer("1+2"), each_number="once")


def test_too_big_intermediate_is_rejected(monkeypatch):
    # Unreachable at the default bounds (256 characters hold at most ~850 bits of
    # literals); a small cap shows the guard: 255 * 255 = 65025 needs 16 bits.
    monkeypatch.setattr(countdown, "MAX_VALUE_BITS", 15)
    assert verify([255, 255], 65025, answer("255*255")).reason == "too_big"
    assert verify([255, 255], 510, answer("255+255")).reason == "correct"


ADVERSARIAL = [
    answer("9" * 100_000),
    answer("9**9**9**9**9**9"),
    answer("(" * 10_000 + "1" + ")" * 10_000),
    answer("(" * 100 + "1" + ")" * 100),  # within the length cap, too deep
    answer("-" * 200 + "1"),
    answer("1+" * 127 + "1"),
    answer("*".join(["9" * 60] * 4)),  # a 240-digit product
    answer("/".join(["7" * 20] * 12)),  # a fraction with a 220-digit denominator
    answer("__import__('os').system('true')"),
    answer("٣" * 200),
    "<answer>" * 50_000,
    "</answer>" * 50_000,
    "<answer>1</answer>" * 5_000,
    "x" * (MAX_COMPLETION_CHARS + 1) + answer("1"),
    "\u0000\ud800" * 50_000 + answer("1"),
]


def python_lines(fn, *args):
    """fn(*args) and the number of Python lines it executed: a machine-independent work count."""
    import sys

    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        out = fn(*args)
    finally:
        sys.settrace(None)
    return out, count


# The parser touches each of the at most MAX_ANSWER_CHARS answer characters a bounded number of
# times; 100 lines per character is far above that and far below what an unbounded parse of
# these inputs (up to 1,000,000 characters, 10,000 nesting levels) would execute. Values are
# capped at MAX_VALUE_BITS bits, so no single line does unbounded arithmetic either.
MAX_LINES = 100 * MAX_ANSWER_CHARS


@pytest.mark.parametrize("completion", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_do_bounded_work(completion):
    start = time.monotonic()
    verdict, lines = python_lines(verify, [1, 2, 3, 4], 10, completion)
    assert lines <= MAX_LINES
    assert time.monotonic() - start < 60  # a hang guard only
    assert verdict.reason in REASONS
    assert not verdict.correct


def test_bounds_give_their_reasons():
    assert verify([1], 1, answer("(" * 10_000 + "1" + ")" * 10_000)).reason == "too_long"
    assert len(verify([1], 1, answer("1" * 1000)).answer) == MAX_ANSWER_CHARS
    assert verify([1], -1, answer("-" * 201 + "1")).reason == "correct"  # odd count: -1
    assert verify([1], 1, answer("-" * 200 + "1")).reason == "correct"


def test_nesting_is_bounded_by_the_answer_length_not_a_small_constant():
    """Issue 16: 50 parentheses around a valid expression are valid; the deepest nesting an
    answer of MAX_ANSWER_CHARS holds parses without a RecursionError, even when the caller is
    already 300 frames deep; one level more is too long before it is too deep."""

    assert verify([1, 2, 3, 4], 10, answer("(" * 50 + "1+2+3+4" + ")" * 50)).correct
    deepest = MAX_DEPTH - 1  # "1" inside: 2 * deepest + 1 <= MAX_ANSWER_CHARS
    assert 2 * deepest + 1 <= MAX_ANSWER_CHARS
    assert verify([1], 1, answer("(" * deepest + "1" + ")" * deepest)).correct
    assert verify([1], 1, answer("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1))).reason == "too_long"

    def nested_call(frames: int):
        return nested_call(frames - 1) if frames else verify([1], 1, answer("(" * deepest + "1" + ")" * deepest))

    assert nested_call(300).correct  # a Lightning step or dataloader worker is far shallower
    assert verify([1], 1, "x" * MAX_COMPLETION_CHARS + answer("1")).reason == "too_long"


# ---- properties: random well-formed expressions against a Fraction reference -------------

# operator -> (precedence, Fraction operation)
OPS = {
    "+": (1, Fraction.__add__),
    "-": (1, Fraction.__sub__),
    "*": (2, Fraction.__mul__),
    "/": (2, Fraction.__truediv__),
}


@st.composite
def expression_trees(draw, leaves):
    """A random tree over `leaves` (each used once): int | ("neg", t) | (op, left, right)."""
    if len(leaves) == 1:
        tree = leaves[0]
    else:
        split = draw(st.integers(1, len(leaves) - 1))
        op = draw(st.sampled_from(sorted(OPS)))
        tree = (op, draw(expression_trees(leaves[:split])), draw(expression_trees(leaves[split:])))
    return ("neg", tree) if draw(st.integers(0, 5)) == 0 else tree


def evaluate(tree) -> Fraction:
    """Reference value; ZeroDivisionError on division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    if tree[0] == "neg":
        return -evaluate(tree[1])
    return OPS[tree[0]][1](evaluate(tree[1]), evaluate(tree[2]))


def render(tree, draw) -> str:
    """Minimal parentheses by precedence (plus random redundant ones and spaces)."""
    if isinstance(tree, int):
        text = str(tree)
    elif tree[0] == "neg":
        inner = render(tree[1], draw)
        text = "-" + (f"({inner})" if isinstance(tree[1], tuple) and tree[1][0] != "neg" else inner)
    else:
        op, left, right = tree
        level = OPS[op][0]

        def side(child, is_right):
            child_level = OPS[child[0]][0] if isinstance(child, tuple) and child[0] != "neg" else 3
            needs = child_level < level or (is_right and child_level == level and op in "-/")
            inner = render(child, draw)
            return f"({inner})" if needs else inner

        space = draw(st.sampled_from(["", " ", "\n"]))
        text = f"{side(left, False)}{space}{op}{space}{side(right, True)}"
    return f"({text})" if draw(st.integers(0, 7)) == 0 else text


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_expressions_match_the_fraction_reference(data):
    numbers = data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=5))
    order = data.draw(st.permutations(numbers))
    tree = data.draw(expression_trees(list(order)))
    text = render(tree, data.draw)
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        assert verify(numbers, 0, answer(text)).reason == "div_by_zero"
        return
    target = value.numerator // value.denominator  # floor: equal to value iff it is an integer
    verdict = verify(numbers, target, f"steps\n{answer(text)}")
    assert verdict.reason == ("correct" if value == target else "wrong_value"), text
    assert verify(numbers, target + 1, answer(text)).reason == "wrong_value"
    # a proper sub-multiset passes only under at_most_once
    extra = numbers + [7]
    assert verify(extra, target, answer(text)).reason == "bad_numbers"
    assert verify(extra, target, answer(text), each_number="at_most_once").correct == (value == target)


ANSWERISH = st.text(alphabet="0123456789+-*/() \n<>answer/٣x.", max_size=300)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=400), ANSWERISH, ANSWERISH.map(answer)), dense=st.booleans())
def test_never_raises_on_arbitrary_text(text, dense):
    verdict = verify([1, 2, 3], 6, text, dense=dense)
    assert verdict.reason in REASONS
    assert -1.0 <= verdict.reward <= 1.0
    assert verdict.correct == (verdict.reason == "correct")


def test_dense_reward_function_by_hand():
    from fractions import Fraction

    from flywheel.rewards.countdown import dense_reward

    assert dense_reward(24, Fraction(47, 2)) == pytest.approx(1 - 2 * (1 / 2) / 24)  # off by 1/2: 0.9583
    assert dense_reward(24, Fraction(30)) == pytest.approx(0.5)  # off by 6 = a quarter of 24
    assert dense_reward(24, Fraction(-24)) == -1.0  # off by 48: capped at 1
    assert dense_reward(0, Fraction(1, 2)) == 0.0  # |t| = 1 at t = 0: 1 - 2 * 0.5
    assert dense_reward(24, None) == -0.9 and dense_reward(24, Fraction(24), answered=False) == -1.0
