"""The math verifier: `verify(gold, completion) -> Verdict`.

Four bounded stages, none calling eval() or sympify on text (model output is untrusted):

1. extract.py -- the final answer: the last box, else a "final answer" phrase, a `####`
   line, the last display / inline math or bold, a short formula, the last number
   (`require_box=True`: boxes only);
2. normalize.py -- canonical LaTeX: notation, units, separators, %, degrees, lists;
3. expr.py / values.py -- flywheel's own recursive-descent parser into expression trees and
   a small value language (numbers, expressions, tuples and intervals, sets and lists,
   unions, matrices, equations, marked % / degree values, multiple choice);
4. compare.py -- exact rationals, decimal precision as written, sympy identity of small
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
from flywheel.rewards.math.extract import MAX_ANSWER_CHARS, extract_answer
from flywheel.rewards.math.normalize import normalize
from flywheel.rewards.math.values import Union_, Unordered, Value, parse_value

__all__ = ["MAX_ANSWER_CHARS", "MAX_COMPLETION_CHARS", "TIME_BUDGET_S", "extract_answer", "normalize", "parse",
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


def verify(gold: str, completion: str, *, require_box: bool = False, hedged: Hedged = "wrong",
           correct_reward: float = 1.0, wrong_reward: float = -1.0) -> Verdict:
    """Grade `completion` against the reference answer `gold` (LaTeX allowed).

    Args:
        require_box: only a \\boxed{} / \\fbox{} answer counts (a strict format reward);
            the default also reads unboxed answers (see extract.py), the more accurate grader.
        hedged: an answer like "2 or 3" against a single reference: "wrong" (default), or
            grade its "first" / "last" option.
    """
    if len(completion) > MAX_COMPLETION_CHARS:
        return Verdict(False, wrong_reward, None, "too_long")
    answer = extract_answer(completion, require_box=require_box)
    if answer is None:
        return Verdict(False, wrong_reward, None, "no_answer")
    if len(answer) > MAX_ANSWER_CHARS:
        return Verdict(False, wrong_reward, answer[:80], "too_long")
    budget = Budget(seconds=TIME_BUDGET_S)
    gold_text = normalize(gold)
    try:
        gold_value = parse(gold_text)
    except ValueError:
        gold_value = None  # a reference that is not mathematics ("Evelyn", "\\text{yes}"): text equality only
    if _HEDGE.search(f" {answer} ") and not isinstance(gold_value, (Unordered, Union_)):
        options = [p for p in _HEDGE.split(answer) if p.strip()]
        if hedged == "wrong" or not options:
            return Verdict(False, wrong_reward, answer, "hedged")
        answer = options[0] if hedged == "first" else options[-1]
    pred_text = _imaginary_j(gold_text, normalize(answer))
    if _compact(gold_text) == _compact(pred_text):
        return Verdict(True, correct_reward, answer, "correct")
    if gold_value is None:
        return Verdict(False, wrong_reward, answer, "wrong_value")
    try:
        pred_value = parse(pred_text)
    except ValueError:
        return Verdict(False, wrong_reward, answer, "parse_error")
    try:
        ok = answers_equal(gold_value, pred_value, budget)
    except _ERRORS:
        ok = False
    return Verdict(ok, correct_reward if ok else wrong_reward, answer, "correct" if ok else "wrong_value")
