"""The chain-arithmetic verifier: does the completion's last answer equal the chain's value?

Only the final answer is graded (outcome reward): the step lines are free text, so a tree
has to find a wrong step by itself. The completion is untrusted model output, and every
pass over it is linear with explicit bounds:

- the answer is the LAST complete `<answer>...</answer>` block (the same reading as the
  Countdown verifier's, `flywheel.rewards.countdown.extract_answer`: two `rfind`s);
- the answer must be an ASCII integer, optionally negative, of at most `MAX_ANSWER_DIGITS`
  digits (surrounding whitespace allowed); anything else ("198.0", "1e3", "+198", "٣")
  is a parse error, and nothing is ever handed to eval();
- a completion longer than `MAX_COMPLETION_CHARS` is refused before any scan ("too_long").
"""

from __future__ import annotations

import re

from flywheel.rewards import Verdict
from flywheel.rewards.countdown import extract_answer

__all__ = ["MAX_ANSWER_DIGITS", "MAX_COMPLETION_CHARS", "REASONS", "verify"]

MAX_COMPLETION_CHARS = 1_000_000
"""Longer completions are rejected outright ("too_long"): a bound on the tag search itself."""
MAX_ANSWER_DIGITS = 24
"""Most digits an answer may have; a chain's values stay far below (the built-in splits < 1000)."""
REASONS = ("correct", "wrong_value", "no_answer", "parse_error", "too_long")

_INTEGER = re.compile(r"-?[0-9]{1,%d}" % MAX_ANSWER_DIGITS)


def verify(answer: int, completion: str) -> Verdict:
    """Grade a chain completion: +1 when its last answer block holds the integer `answer`, else -1.

    >>> verify(198, "37+48=85\\n85-19=66\\n66*3=198\\n<answer>198</answer>")
    Verdict(correct=True, reward=1.0, answer='198', reason='correct')
    >>> verify(198, "37+48=85\\n85-19=67\\n67*3=201\\n<answer>201</answer>").reason
    'wrong_value'
    >>> verify(-4, "<answer> -4 </answer>").correct, verify(198, "<answer>198.0</answer>").reason
    (True, 'parse_error')
    >>> verify(198, "37+48=85\\n<answer>19").reason
    'no_answer'
    """
    if isinstance(answer, bool) or not isinstance(answer, int):
        raise TypeError(f"the chain's answer must be an int, got {answer!r}")
    if len(completion) > MAX_COMPLETION_CHARS:
        return Verdict(correct=False, reward=-1.0, answer=None, reason="too_long")
    text = extract_answer(completion)
    if text is None:
        return Verdict(correct=False, reward=-1.0, answer=None, reason="no_answer")
    if len(text) > MAX_ANSWER_DIGITS + 1 or not _INTEGER.fullmatch(text):
        return Verdict(correct=False, reward=-1.0, answer=text[: MAX_ANSWER_DIGITS + 1], reason="parse_error")
    if int(text) == answer:
        return Verdict(correct=True, reward=1.0, answer=text, reason="correct")
    return Verdict(correct=False, reward=-1.0, answer=text, reason="wrong_value")
