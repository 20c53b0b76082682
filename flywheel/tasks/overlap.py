"""Repeated problems: training problems that repeat one another, and training problems that are
held-out problems (a leak: held-out pass@k would then measure memory, not generalisation).

Two problems are the same when their keys' normalised texts are equal (Unicode NFKC, case
folded, every run of whitespace one space, stripped); the key is the task's `problem_key`: the
prompt, not the question alone, because a task's question may not be the whole problem (a
Countdown question is its numbers; the target is in the prompt), and for an environment the
prompt and the answer it hides. Pure: the caller logs and drops.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, Sequence

from flywheel.tasks.base import Problem

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """The text two copies of one problem share.

    >>> normalise("  What is\\n2 + 2?  ") == normalise("WHAT IS 2 + 2?")
    True
    """
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


@dataclass(frozen=True)
class Overlap:
    """`repeats`: (id, id of the first training problem it repeats), in training order.
    `leaks`: ids of training problems that are held-out problems, in training order."""

    repeats: tuple[tuple[str, str], ...]
    leaks: tuple[str, ...]


def find_overlap(train: Sequence[Problem], held_out: Sequence[Problem], text: Callable[[Problem], str]) -> Overlap:
    """The repeats within `train` and its problems that are also in `held_out`, comparing
    `normalise(text(problem))` (`text`: the task's `problem_key`)."""
    held = {normalise(text(p)) for p in held_out}
    first: dict[str, str] = {}
    repeats: list[tuple[str, str]] = []
    leaks: list[str] = []
    for problem in train:
        key = normalise(text(problem))
        if key in first:
            repeats.append((problem.id, first[key]))
        else:
            first[key] = problem.id
        if key in held:
            leaks.append(problem.id)
    return Overlap(tuple(repeats), tuple(leaks))


def first_few(ids: Sequence[str], count: int = 5) -> str:
    """`'a', 'b', 'c'` or `'a', 'b', ... (12 in all)`, for a log line."""
    shown = ", ".join(repr(i) for i in ids[:count])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > count else "")
