"""An exact value oracle for Countdown partial solutions: can the numbers left still reach
the target?

For measurement only (tools/bench_explore.py --oracle): plugged into the search as its
value function it gives the upper bound of what a perfect process value model could buy,
which separates "the search spends its budget badly" from "there is no value signal".
A trained value model (flywheel.prm) is what a real run uses.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

from flywheel.tasks.countdown_data import apply_step, solve

_STEP = re.compile(r"\s*(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)\s*")
_HEADER = re.compile(r"\s*([\d ]+)\|(\d+)\s*")


def remaining_numbers(numbers: Sequence[int], response: str) -> tuple[int, ...] | None:
    """The numbers left after the response's complete step lines ("9*8=72"), or None when a
    line is not a valid step on the numbers available (a wrong result, a number not there).
    A last line without its newline is still being written and is not applied.

    >>> remaining_numbers([5, 9, 8], "9*8=72\\n")
    (5, 72)
    >>> remaining_numbers([5, 9, 8], "9*8=71\\n") is None
    True
    >>> remaining_numbers([5, 9, 8], "9*8=72\\n72-5=6")
    (5, 72)
    """
    pool = sorted(numbers)
    for line in response.split("\n")[:-1]:
        match = _STEP.fullmatch(line)
        if match is None:
            return None
        a, op, b, result = int(match[1]), match[2], int(match[3]), int(match[4])
        if apply_step(a, op, b) != result or a not in pool:
            return None
        pool.remove(a)
        if b not in pool:
            return None
        pool.remove(b)
        pool.append(result)
        pool.sort()
    return tuple(pool)


@lru_cache(maxsize=65536)
def _reachable(pool: tuple[int, ...], target: int) -> bool:
    return solve(pool, target) is not None


def state_value(numbers: Sequence[int], target: int, response: str) -> float:
    """1.0 if the numbers left after the response's steps can still make the target, else 0.0.

    >>> state_value([5, 9, 8], 67, "9*8=72\\n"), state_value([5, 9, 8], 67, "9+8=17\\n")
    (1.0, 0.0)
    """
    pool = remaining_numbers(numbers, response)
    return float(pool is not None and _reachable(pool, target))


def prompt_value(text: str) -> float:
    """state_value of a whole prefix in the default prompt format "5 9 8|67\\n" + response."""
    header, _, response = text.partition("\n")
    match = _HEADER.fullmatch(header)
    if match is None:
        raise ValueError(f"not a Countdown prompt in the default format: {header!r}")
    return state_value([int(n) for n in match[1].split()], int(match[2]), response)
