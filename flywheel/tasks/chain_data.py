"""Chain arithmetic's data: the chains, their solver traces, and where a response went wrong.

A chain is a start integer and operations applied in order, left to right (no precedence):
37, [+48, -19, *3] -> 85 -> 66 -> 198. The solver trace writes one operation per line and
then the answer (the format the tiny chain policy is trained on):

    37+48=85
    85-19=66
    66*3=198
    <answer>198</answer>

`make_chain` draws the built-in splits' chains (tools/make_chain_splits.py): values stay in
0..99, additions and subtractions take operands 2..49, multiplications one digit, so every
line is small enough for a character-level policy to learn and to get occasionally, locally
wrong. `line_errors` reads a response line by line against its chain: that is how
the policy's card measures whether its failures are one wrong line in an otherwise correct
chain (the setting where resampling from the step before the mistake should pay).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "OPS",
    "ChainReading",
    "FailureProfile",
    "apply",
    "chain_values",
    "format_completion",
    "format_ops",
    "failure_profile",
    "line_errors",
    "make_chain",
]

OPS = ("+", "-", "*")
"""The operations a chain may hold."""

MAX_LINE_CHARS = 64
"""A response line longer than this is not read as a step (a bound on the per-line match)."""

_LINE = re.compile(r"\s*(-?[0-9]{1,12})\s*([-+*])\s*(-?[0-9]{1,12})\s*=\s*(-?[0-9]{1,12})\s*")
_ANSWER = re.compile(r"\s*<answer>\s*(-?[0-9]{1,12})\s*</answer>\s*")


def apply(value: int, op: str, operand: int) -> int:
    """One operation.

    >>> apply(85, "-", 19), apply(66, "*", 3), apply(37, "+", 48)
    (66, 198, 85)
    """
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    raise ValueError(f"unknown chain operation {op!r}; known: {', '.join(OPS)}")


def chain_values(start: int, ops: Sequence[tuple[str, int]]) -> list[int]:
    """The value after each operation.

    >>> chain_values(37, [("+", 48), ("-", 19), ("*", 3)])
    [85, 66, 198]
    """
    values, value = [], start
    for op, operand in ops:
        value = apply(value, op, operand)
        values.append(value)
    return values


def format_ops(ops: Sequence[tuple[str, int]]) -> str:
    """The operations as the prompt shows them.

    >>> format_ops([("+", 48), ("-", 19), ("*", 3)])
    '+48 -19 *3'
    """
    return " ".join(f"{op}{operand}" for op, operand in ops)


def format_completion(start: int, ops: Sequence[tuple[str, int]]) -> str:
    """The solver trace: one line per operation, then the answer line (no EOS).

    >>> print(format_completion(37, [("+", 48), ("-", 19), ("*", 3)]))
    37+48=85
    85-19=66
    66*3=198
    <answer>198</answer>
    """
    lines, value = [], start
    for op, operand in ops:
        after = apply(value, op, operand)
        lines.append(f"{value}{op}{operand}={after}")
        value = after
    lines.append(f"<answer>{value}</answer>")
    return "\n".join(lines)


def make_chain(
    rng: random.Random, length: int, *, start_range: tuple[int, int] = (2, 99), add_max: int = 49,
    mul_max: int = 9, value_max: int = 99,
) -> tuple[int, list[tuple[str, int]]]:
    """A random chain of `length` operations whose every value stays in 0..`value_max`:
    + and - take operands 2..`add_max`, * takes 2..`mul_max`; an operation that would leave
    the range is redrawn (the three are equally likely where all fit)."""
    if length < 1:
        raise ValueError(f"a chain needs at least one operation, got length {length}")
    start = rng.randint(*start_range)
    ops: list[tuple[str, int]] = []
    value = start
    while len(ops) < length:
        op = rng.choice(OPS)
        operand = rng.randint(2, mul_max if op == "*" else add_max)
        after = apply(value, op, operand)
        if 0 <= after <= value_max:
            ops.append((op, operand))
            value = after
    return start, ops


@dataclass(frozen=True)
class ChainReading:
    """A response read line by line against its chain.

    Attributes:
        lines: step lines read before the answer line (or the end).
        wrong_lines: 1-based positions of the step lines that are wrong locally: a line
            that does not state "a op b = c" with the chain's operation at that position,
            a = the previous line's stated result (the start for line 1) and c = a op b.
            A line right from a wrong predecessor's value is not wrong: the mistake is the
            one line, and what follows carries it on consistently.
        complete: as many step lines as the chain has operations, then an answer line that
            repeats the last stated result.
    """

    lines: int
    wrong_lines: tuple[int, ...]
    complete: bool

    @property
    def first_wrong(self) -> int | None:
        return self.wrong_lines[0] if self.wrong_lines else None

    @property
    def one_local_mistake(self) -> bool:
        """Exactly one wrong line in an otherwise correct, complete chain."""
        return self.complete and len(self.wrong_lines) == 1


def line_errors(start: int, ops: Sequence[tuple[str, int]], completion: str) -> ChainReading:
    """Read `completion` against the chain (start, ops).

    >>> line_errors(37, [("+", 48), ("-", 19), ("*", 3)], "37+48=85\\n85-19=67\\n67*3=201\\n<answer>201</answer>")
    ChainReading(lines=3, wrong_lines=(2,), complete=True)
    >>> line_errors(37, [("+", 48), ("-", 19)], "37+48=85\\n85+19=104\\n<answer>104</answer>").wrong_lines
    (2,)
    >>> line_errors(37, [("+", 48), ("-", 19)], "37+48=85\\n<answer>85</answer>").complete
    False
    """
    previous = start
    wrong: list[int] = []
    position = 0
    answer: int | None = None
    last: int | None = None
    for raw in completion.split("\n"):
        if len(raw) > MAX_LINE_CHARS:
            position += 1
            wrong.append(position)
            continue
        found = _ANSWER.fullmatch(raw)
        if found:
            answer = int(found.group(1))
            break
        if not raw.strip():
            continue
        position += 1
        line = _LINE.fullmatch(raw)
        if line is None or position > len(ops):
            wrong.append(position)
            continue
        a, op, b, c = int(line.group(1)), line.group(2), int(line.group(3)), int(line.group(4))
        if (op, b) != tuple(ops[position - 1]) or a != previous or c != apply(a, op, b):
            wrong.append(position)
        previous = last = c
    complete = position == len(ops) and answer is not None and answer == last
    return ChainReading(lines=position, wrong_lines=tuple(wrong), complete=complete)


@dataclass(frozen=True)
class FailureProfile:
    """How a set of failed responses went wrong, each read by `line_errors`.

    Attributes:
        failed: the failed responses read.
        one_wrong_line: ONE wrong line in an otherwise correct, complete chain (the local
            mistake resampling from the step before it can repair).
        several_wrong_lines: a complete chain with more than one wrong line.
        not_a_complete_chain: a line missing or added, no answer line, or an answer that is
            not the last stated result.
        first_wrong_line: how many failures first go wrong at each 1-based line.
        first_wrong_fifth: the same as a share of the chain's length, in fifths (first to last).
    """

    failed: int
    one_wrong_line: int
    several_wrong_lines: int
    not_a_complete_chain: int
    first_wrong_line: dict[int, int]
    first_wrong_fifth: tuple[int, ...]


def failure_profile(failures: Sequence[tuple[int, Sequence[tuple[str, int]], str]]) -> FailureProfile:
    """Summarise failed responses, each given as (start, ops, completion).

    >>> p = failure_profile([(1, [("+", 2)], "1+2=4\\n<answer>4</answer>"), (1, [("+", 2)], "<answer>3</answer>")])
    >>> p.one_wrong_line, p.not_a_complete_chain, p.first_wrong_line
    (1, 1, {1: 1})
    """
    one = several = incomplete = 0
    first: dict[int, int] = {}
    fifths = [0] * 5
    for start, ops, completion in failures:
        reading = line_errors(start, ops, completion)
        if not reading.complete:
            incomplete += 1
        elif len(reading.wrong_lines) == 1:
            one += 1
        else:
            several += 1
        if reading.first_wrong is not None:
            first[reading.first_wrong] = first.get(reading.first_wrong, 0) + 1
            fifths[min(4, 5 * (reading.first_wrong - 1) // max(len(ops), 1))] += 1
    return FailureProfile(len(failures), one, several, incomplete, dict(sorted(first.items())), tuple(fifths))
