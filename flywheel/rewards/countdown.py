"""The Countdown verifier (rest-mcts-and-countdown.md §C, dense reward §B).

The completion is untrusted model output, so the rule is narrow and every bound is explicit:

- the answer is the LAST complete `<answer>...</answer>` block (multi-line allowed); an
  unclosed trailing tag (a step cut off at its token cap) does not hide an earlier answer;
- the expression may hold ASCII non-negative integer literals without leading zeros, binary
  `+ - * /`, unary minus, parentheses and ASCII whitespace; everything else (`**`, `//`, `%`,
  `^`, `=`, unicode digits or operators, names, calls, LaTeX) is a parse error;
- a hand-written recursive-descent parser evaluates it exactly: over Python integers, and
  over `fractions.Fraction` from the first inexact division on, so a route through fractions
  (6/(1-3/4) = 24) counts and nothing is ever handed to eval();
- the literals must be the given numbers as a multiset: each exactly once, or with
  `each_number="at_most_once"` each at most once;
- bounds: the completion length, the answer length, the nesting depth (explicit counter
  bounded by what the answer length allows, so no RecursionError) and the bit length of
  every intermediate value (so a product of huge literals cannot blow up). Every call
  returns in well under a millisecond or two.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction
from typing import Sequence

from flywheel.rewards import Verdict

__all__ = [
    "EACH_NUMBER_RULES",
    "INVALID_EXPRESSION_REWARD",
    "MAX_ANSWER_CHARS",
    "MAX_COMPLETION_CHARS",
    "MAX_DEPTH",
    "MAX_VALUE_BITS",
    "dense_reward",
    "extract_answer",
    "verify",
]

EACH_NUMBER_RULES = ("exactly_once", "at_most_once")
MAX_COMPLETION_CHARS = 1_000_000
"""Longer completions are rejected outright ("too_long"): a bound on the tag search itself."""
MAX_ANSWER_CHARS = 256
"""Longest answer expression parsed (stripped); a 4-number answer needs about 20."""
MAX_DEPTH = MAX_ANSWER_CHARS // 2
"""Deepest nesting of parentheses ("too_deep"): as deep as an answer of MAX_ANSWER_CHARS can
nest, since every level takes two characters. Each level costs the parser four Python
frames (expression, term, unary, primary): the deepest answer takes about 520 frames, under
the interpreter's limit of 1000 with room for a caller 300 frames deep (tested); a run of
unary minuses is counted in a loop, not recursed."""
MAX_VALUE_BITS = 1024
"""Largest numerator or denominator bit length of any literal or intermediate ("too_big")."""
INVALID_EXPRESSION_REWARD = -0.9
"""Dense reward of an answer that is present but unusable (§B: invalid numbers, unevaluable)."""

_OPEN, _CLOSE = "<answer>", "</answer>"
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() would accept '٣'
_ALLOWED = re.compile(r"[0-9+\-*/() \t\r\n]*")  # ASCII digits, the operators, ASCII whitespace
_TOKEN = re.compile(r"[0-9]+|[-+*/()]")
_LEADING_ZERO = re.compile(r"(?<![0-9])0[0-9]")

Value = int | Fraction
"""An exact value: an int until a division leaves a remainder, then a Fraction (ints are
several times cheaper, and every search grades thousands of answers, issue 18)."""


class _Reject(Exception):
    """Ends a parse early; `reason` becomes the Verdict's reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def extract_answer(completion: str) -> str | None:
    """The stripped text of the last complete `<answer>...</answer>` block, or None.

    >>> extract_answer("<answer>1+2</answer> no, <answer>\\n 3*1 \\n</answer>")
    '3*1'
    >>> extract_answer("9*8=72\\n<answer>(9*8)-") is None
    True
    """
    end = completion.rfind(_CLOSE)
    if end < 0:
        return None
    start = completion.rfind(_OPEN, 0, end)
    if start < 0:
        return None
    return completion[start + len(_OPEN) : end].strip()


def dense_reward(target: int, value: Fraction | None, *, answered: bool = True) -> float:
    """The Countdown reference's shaped training reward (rest-mcts-and-countdown.md §B):
    1 - 2 * min(|t - p| / |t|, 1) for a valid expression of value p, -0.9 for an answer that
    uses invalid numbers or cannot be evaluated (`value` None), -1 for no answer (`answered`
    False). |t| counts as 1 for a target of 0. Evaluation uses exact match, never this.

    >>> dense_reward(24, Fraction(24)), dense_reward(24, Fraction(18)), dense_reward(24, Fraction(60))
    (1.0, 0.5, -1.0)
    >>> dense_reward(24, None), dense_reward(24, None, answered=False)
    (-0.9, -1.0)
    """
    if not answered:
        return -1.0
    if value is None:
        return INVALID_EXPRESSION_REWARD
    return float(1 - 2 * min(abs(Fraction(target) - value) / (abs(target) or 1), 1))


def verify(
    numbers: Sequence[int],
    target: int,
    completion: str,
    *,
    each_number: str = "exactly_once",
    dense: bool = False,
) -> Verdict:
    """Grade a Countdown completion: does its last answer use `numbers` and equal `target`?

    `correct` always means an exact match. The reward is +1 / -1 by default; with
    `dense=True` it is the Countdown reference's shaped reward (§B): 1 - 2 * min(|t - p| / |t|, 1)
    for a valid expression of value p (so exactly 1.0 when correct), -0.9 for an answer with
    the wrong numbers or one that cannot be evaluated, -1 for no answer at all. (|t| is taken
    as 1 when the target is 0.)

    Reasons: "correct", "wrong_value", "no_answer", "too_long", "parse_error", "too_deep",
    "bad_numbers", "too_big", "div_by_zero". `answer` is the extracted expression (cut to
    MAX_ANSWER_CHARS when too long), or None when there is no complete answer block.

    >>> verify([5, 9, 8], 67, "9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>")
    Verdict(correct=True, reward=1.0, answer='(9*8)-5', reason='correct')
    >>> verify([6, 1, 3, 4], 24, "<answer>6 / (1 - 3/4)</answer>").correct
    True
    >>> verify([5, 9, 8], 67, "<answer>9*8-5+0</answer>").reason
    'bad_numbers'
    >>> verify([5, 9, 8], 67, "<answer>9*8</answer>", each_number="at_most_once").reason
    'wrong_value'
    >>> verify([2, 3], 8, "<answer>2**3</answer>").reason
    'parse_error'
    >>> verify([5, 9, 8], 67, "<answer>9*8+5</answer>", dense=True).reward  # 1 - 2*10/67
    0.7014925373134329
    >>> verify([5, 9, 8], 67, "I give up", dense=True).reward
    -1.0
    """
    if each_number not in EACH_NUMBER_RULES:
        raise ValueError(f"each_number must be one of {EACH_NUMBER_RULES}, got {each_number!r}")
    if len(completion) > MAX_COMPLETION_CHARS:
        return _rejected(target, dense, "too_long", None)
    answer = extract_answer(completion)
    if answer is None:
        return _rejected(target, dense, "no_answer", None)
    if len(answer) > MAX_ANSWER_CHARS:
        return _rejected(target, dense, "too_long", answer[:MAX_ANSWER_CHARS])
    try:
        parser = _Parser(_tokenize(answer))
        value = parser.parse()
    except _Reject as err:
        return _rejected(target, dense, err.reason, answer)

    if each_number == "exactly_once":
        numbers_ok = sorted(parser.literals) == sorted(numbers)  # equal multisets
    else:
        numbers_ok = Counter(parser.literals) <= Counter(numbers)
    if not numbers_ok:
        return _rejected(target, dense, "bad_numbers", answer)
    if parser.failure is not None:
        return _rejected(target, dense, parser.failure, answer)
    if value == target:
        return Verdict(correct=True, reward=1.0, answer=answer, reason="correct")
    reward = dense_reward(target, Fraction(value)) if dense else -1.0
    return Verdict(correct=False, reward=reward, answer=answer, reason="wrong_value")


def _rejected(target: int, dense: bool, reason: str, answer: str | None) -> Verdict:
    reward = dense_reward(target, None, answered=answer is not None) if dense else -1.0
    return Verdict(correct=False, reward=reward, answer=answer, reason=reason)


def _tokenize(text: str) -> list[str]:
    """Split into integer literals and single-character symbols; anything else is rejected.

    >>> _tokenize("(12 +3)\t/ 4")
    ['(', '12', '+', '3', ')', '/', '4']
    """
    if _ALLOWED.fullmatch(text) is None or _LEADING_ZERO.search(text) is not None:
        raise _Reject("parse_error")  # a foreign character, or a leading zero ("07" is no given number)
    return _TOKEN.findall(text)


class _Parser:
    """Recursive descent that evaluates as it parses.

        expression := term (("+" | "-") term)*
        term       := unary (("*" | "/") unary)*
        unary      := "-" unary | primary
        primary    := INTEGER | "(" expression ")"

    Division by zero and oversized values do not stop the parse: they are recorded in
    `failure` (the first one wins) and the value continues as 0, so a malformed expression
    still reports "parse_error" and wrong numbers still report "bad_numbers" first.
    """

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = [*tokens, ""]  # "" ends the input: peeking past the last token needs no bounds check
        self.pos = 0
        self.depth = 0
        self.literals: list[int] = []
        self.failure: str | None = None

    def parse(self) -> Value:
        value = self.expression()
        if self.tokens[self.pos]:  # tokens left after a complete expression
            raise _Reject("parse_error")
        return value

    def fail(self, reason: str) -> Value:
        if self.failure is None:
            self.failure = reason
        return 0

    def bounded(self, value: Value) -> Value:
        if type(value) is int:  # an int's denominator is 1: its own bit length decides
            bits = value.bit_length()
        else:
            bits = max(value.numerator.bit_length(), value.denominator.bit_length())
        if bits > MAX_VALUE_BITS:
            return self.fail("too_big")
        return value

    def descend(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Reject("too_deep")

    def expression(self) -> Value:
        value = self.term()
        while (op := self.tokens[self.pos]) in ("+", "-"):
            self.pos += 1
            right = self.term()
            value = self.bounded(value + right if op == "+" else value - right)
        return value

    def term(self) -> Value:
        value = self.unary()
        while (op := self.tokens[self.pos]) in ("*", "/"):
            self.pos += 1
            right = self.unary()
            if op == "*":
                value = self.bounded(value * right)
            elif right == 0:
                value = self.fail("div_by_zero")
            elif type(value) is int and type(right) is int:  # exact: int / int would be a float
                value = self.bounded(value // right if value % right == 0 else Fraction(value, right))
            else:
                value = self.bounded(Fraction(value) / right)
        return value

    def unary(self) -> Value:
        if self.tokens[self.pos] != "-":
            return self.primary()
        negations = 0
        while self.tokens[self.pos] == "-":  # a loop, not recursion: "----1" costs no depth
            self.pos += 1
            negations += 1
        value = self.primary()
        return -value if negations % 2 else value

    def primary(self) -> Value:
        token = self.tokens[self.pos]
        if token == "(":
            self.pos += 1
            self.descend()
            value = self.expression()
            if self.tokens[self.pos] != ")":
                raise _Reject("parse_error")
            self.pos += 1
            self.depth -= 1
            return value
        if not token or token[0] not in _DIGITS:
            raise _Reject("parse_error")
        self.pos += 1
        literal = int(token)
        self.literals.append(literal)
        return literal if literal.bit_length() <= MAX_VALUE_BITS else self.fail("too_big")
