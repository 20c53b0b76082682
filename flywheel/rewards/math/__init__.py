"""The math verifier: `verify(gold, completion) -> Verdict`.

Four bounded stages, none calling eval() or sympify on text (model output is untrusted):

1. extract.py -- the final answer given as an answer, and the rule that read it: a box, a
   "final answer" phrase, a `####` line, a last line that is just the answer, a concluding
   sentence (clause.py: what counts as "just the answer"; response.py: chat turns, code and
   degenerate text; spans.py: boxes and math spans); boxes only under the strict rules
   (`require_box`, a `truncated` response, one that ran on into a new chat turn);
2. normalize.py -- canonical LaTeX: notation, units, separators, %, degrees, number words,
   lists; units.py converts a quantity into the reference's unit family;
3. expr.py / values.py -- flywheel's own recursive-descent parser into expression trees and
   a small value language (numbers, expressions, tuples and intervals, sets and lists,
   unions, matrices and matrix expressions (matrices.py), equations, marked % / degree
   values, multiple choice);
4. compare.py -- exact rationals, decimals at their own precision, sympy identity of small
   rational expressions (symbolic.py, built from the parser's tree), values at random
   points (evaluate.py) for the rest.

Budgets: completion and answer length, parse depth and nodes, exact-number bits, power and
factorial sizes, sympy input size and degree, and a per-call work budget (steps and a
deadline, evaluate.Budget) checked during evaluation -- no signals, no global state, so it
holds in threads and dataloader workers.
"""

from __future__ import annotations

import re
from typing import Literal

from flywheel.rewards import Verdict
from flywheel.rewards.math.compare import answers_equal
from flywheel.rewards.math.evaluate import Budget
from flywheel.rewards.math.expr import Reject
from flywheel.rewards.math.evaluate import HP
from flywheel.rewards.math.extract import ANSWER_RULES, MAX_ANSWER_CHARS, Extraction, extract_answer, read_answer
from flywheel.rewards.math.normalize import normalize
from flywheel.rewards.math.units import split_quantity
from flywheel.rewards.math.values import Num, Union_, Unordered, Value, parse_value

__all__ = ["ANSWER_RULES", "Extraction", "read_answer", "MAX_ANSWER_CHARS", "MAX_COMPLETION_CHARS", "TIME_BUDGET_S", "extract_answer", "normalize", "parse",
           "answers_equal", "verify"]

MAX_COMPLETION_CHARS = 400_000
TIME_BUDGET_S = 0.5
"""Deadline of the work budget of one call (checked during evaluation, never by a signal)."""
Hedged = Literal["wrong", "first", "last"]
_HEDGE = re.compile(r"\s(?:or|either)\s|\\text\{\s*or\s*\}|\\lor", re.IGNORECASE)
_ERRORS = (Reject, ZeroDivisionError, ValueError, OverflowError, TypeError, RecursionError, KeyError,
           ArithmeticError, IndexError)


def parse(answer: str) -> Value:
    """The value of a normalised answer (raises ValueError when it cannot be read)."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise ValueError("too_long")
    try:
        return parse_value(answer)
    except _ERRORS as err:
        raise ValueError(str(err) or type(err).__name__) from None


def _compact(text: str) -> str:
    """Text without spacing, except between two digits ("1 00" is not "100")."""
    return re.sub(r"\s+", "", re.sub(r"(?<=\d)\s+(?=\d)", "_", text)).lower()


def _imaginary_j(gold: str, pred: str) -> str:
    """Engineers' j for the imaginary unit, when the reference uses i and the answer no i."""
    lone = r"(?<![a-zA-Z\\]){}(?![a-zA-Z])"
    has = lambda text, letter: re.search(lone.format(letter), text) is not None  # noqa: E731
    if has(gold, "i") and has(pred, "j") and not has(pred, "i"):
        return re.sub(lone.format("j"), "i", pred)
    return pred


def verify(gold: str, completion: str, *, require_box: bool = False, truncated: bool = False,
           hedged: Hedged = "wrong", correct_reward: float = 1.0, wrong_reward: float = -1.0) -> Verdict:
    """Grade `completion` against the reference answer `gold` (LaTeX allowed).

    The verdict's reason is "<outcome>:<rule>" once an answer was read ("correct:box",
    "wrong_value:phrase", "hedged:box"; the rules are extract.ANSWER_RULES), else
    "no_answer" or "too_long".

    Args:
        require_box: only a \\boxed{} / \\fbox{} answer counts (a strict format reward);
            the default also reads answers given as answers without a box (extract.py).
        truncated: the response was cut by the length limit (it never ended): graded on
            the strict rules, as if `require_box` (issue 36).
        hedged: an answer like "2 or 3" against a single reference: "wrong" (default), or
            grade its "first" / "last" option.
    """
    if len(completion) > MAX_COMPLETION_CHARS:
        return Verdict(False, wrong_reward, None, "too_long")
    found = read_answer(completion, strict=require_box or truncated)
    if found is None:
        return Verdict(False, wrong_reward, None, "no_answer")
    answer, rule = found.answer, found.rule

    def verdict(ok: bool, outcome: str, shown: str | None = None) -> Verdict:
        return Verdict(ok, correct_reward if ok else wrong_reward, shown or answer, f"{outcome}:{rule}")

    if len(answer) > MAX_ANSWER_CHARS:
        return Verdict(False, wrong_reward, answer[:80], f"too_long:{rule}")
    budget = Budget(seconds=TIME_BUDGET_S)
    gold_text = normalize(gold)
    try:
        gold_value = parse(gold_text)
    except ValueError:
        gold_value = None  # a reference that is not mathematics ("Evelyn", "\\text{yes}"): text equality only
    one_answer = not isinstance(gold_value, (Unordered, Union_))
    if found.hedged:  # given beside another candidate answer: "\\boxed{2} or possibly \\boxed{3}"
        return verdict(False, "hedged")
    if _HEDGE.search(f" {answer} ") and one_answer:
        options = [p for p in _HEDGE.split(answer) if p.strip()]
        if hedged == "wrong" or not options:
            return verdict(False, "hedged")
        answer = options[0] if hedged == "first" else options[-1]
    converted = _in_units(gold, answer, budget)
    if converted is not None:
        return verdict(converted, "correct" if converted else "wrong_value")
    pred_text = _imaginary_j(gold_text, normalize(answer))
    if _compact(gold_text) == _compact(pred_text):
        return verdict(True, "correct")
    if gold_value is None:
        return verdict(False, "wrong_value")
    try:
        pred_value = parse(pred_text)
    except ValueError:
        return verdict(False, "parse_error")
    try:
        ok = answers_equal(gold_value, pred_value, budget)
    except _ERRORS:
        ok = False
    return verdict(ok, "correct" if ok else "wrong_value")


def _in_units(gold: str, answer: str, budget: Budget) -> bool | None:
    """Equality of two quantities with units of one family, the reference converted into
    the answer's unit (so the answer keeps the precision it was written to); None when
    either side carries no unit units.py converts."""
    gold_q, pred_q = split_quantity(gold), split_quantity(answer)
    if gold_q is None or pred_q is None:
        return None
    (gold_number, gold_unit), (pred_number, pred_unit) = gold_q, pred_q
    if gold_unit.dims != pred_unit.dims:
        return False  # 5 m against 5 kg
    try:
        gold_value, pred_value = parse(normalize(gold_number)), parse(normalize(pred_number))
        if not (isinstance(gold_value, Num) and gold_value.exact is not None):
            return None
        scaled = gold_value.exact * gold_unit.factor / pred_unit.factor
        rescaled = Num(scaled, HP.mpf(scaled.numerator) / scaled.denominator, None)
        return answers_equal(rescaled, pred_value, budget)
    except (ValueError, *_ERRORS):
        return None
