"""Mastermind's data: every code, a noisy player that makes diverse episodes, and why one was lost.

`NoisySolver` is the player whose episodes become SFT data for a tiny policy (as chain_data's
solver trace is for the chain policy): it guesses a code drawn uniformly from those that fit
all the feedback so far (the consistent-random strategy), and with probability `noise` makes
a mistake instead: a uniformly random code (often one the feedback already ruled out) or,
for a `malformed_share` of the mistakes, a line that is not a code at all. So its lost
episodes fail in each of the ways a policy can (`failure_kind`).

`play` runs it against the environment through `MastermindTask.respond` only, reading the
feedback back from the observation text: the player never sees the secret, and the
observations are checked to say all a player needs. Everything is deterministic given the
`random.Random` passed in. `measure` gives a player's win rate and mean turns under several
turn limits (how MastermindTask's default `max_turns` was chosen: its module docstring).

Measured (all 1296 secrets of 4 digits 1-6, seed 0): the noiseless player wins 0.9900 of the
games within 6 turns (mean 4.60 turns) and all of them within 8 (mean 4.61; its longest game
is 7 turns) or 10; at noise 0.4 it wins 0.6968 / 0.9367 / 0.9884 within 6 / 8 / 10.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Hashable, Sequence

from flywheel.rewards.mastermind import Code, code_text, consistent
from flywheel.tasks.base import Problem
from flywheel.tasks.environment import Turn
from flywheel.tasks.mastermind import MastermindProblem, MastermindTask

__all__ = ["FAILURE_KINDS", "MALFORMED", "MAX_CODES", "PICKS", "first_mistake", "NoisySolver", "SolverRecord", "all_codes", "failure_kind",
           "malformed_guess", "measure", "play"]

MAX_CODES = 100_000
"""Most codes a game may have for the player (it keeps every code that fits the feedback)."""

FAILURE_KINDS = ("invalid_guess", "inconsistent_guess", "out_of_turns", "unfinished")
"""A lost episode's kinds, in `failure_kind`'s order of precedence."""

PICKS = ("random", "lowest")
"""`NoisySolver.pick`: how the player picks among the codes that fit the feedback."""

MALFORMED = ("{short}", "{long}", "{zero}", "{over}", "{letter}", "", "{code} {code}")
"""Shapes of a malformed guess: a digit short, a digit more, a 0, a digit past the range, a
letter, an empty line, two codes on one line."""


def all_codes(length: int, digits: int) -> list[Code]:
    """Every code of `length` digits 1..`digits`, in order.

    >>> all_codes(2, 2)
    [(1, 1), (1, 2), (2, 1), (2, 2)]
    """
    if digits**length > MAX_CODES:
        raise ValueError(f"{digits}**{length} = {digits**length} codes is more than the player handles ({MAX_CODES}): "
                         "use fewer digits or a shorter code")
    return list(itertools.product(range(1, digits + 1), repeat=length))


@dataclass(frozen=True)
class NoisySolver:
    """The consistent player with mistakes (the module docstring).

    Attributes:
        noise: probability that a guess is a mistake instead of a consistent code.
        malformed_share: share of the mistakes that are malformed lines; the rest are
            uniformly random codes.
        pick: which consistent code it guesses, one of `PICKS`: "random" (uniformly: the
            consistent-random player) or "lowest" (the smallest in digit order: 1111 first,
            then the digits the marks keep, the next digit elsewhere; a deterministic play a
            3-layer model imitates, where it did not learn the random player's).
    """

    noise: float = 0.0
    malformed_share: float = 0.25
    pick: str = "random"

    def __post_init__(self) -> None:
        for name in ("noise", "malformed_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")
        if self.pick not in PICKS:
            raise ValueError(f"pick must be one of {', '.join(PICKS)}, got {self.pick!r}")

    def guess(self, candidates: Sequence[Code], length: int, digits: int, rng: random.Random) -> str:
        """One action (a line ended by "\\n"): a code from `candidates` (those that fit the
        feedback so far), or with probability `noise` a mistake."""
        draw = rng.random()
        if draw < self.noise * self.malformed_share:
            return malformed_guess(length, digits, rng)
        if draw < self.noise:
            return code_text(tuple(rng.randint(1, digits) for _ in range(length))) + "\n"
        return code_text(rng.choice(candidates) if self.pick == "random" else min(candidates)) + "\n"


def malformed_guess(length: int, digits: int, rng: random.Random) -> str:
    """A line (ended by "\\n") that is not a code of `length` digits 1..`digits`: one of the
    `MALFORMED` shapes, built around a random code."""
    code = code_text(tuple(rng.randint(1, digits) for _ in range(length)))
    place = rng.randrange(length)
    fields = {
        "code": code, "short": code[:-1], "long": code + code[0],
        "zero": code[:place] + "0" + code[place + 1:],
        "over": code[:place] + ("0" if digits == 9 else str(digits + 1)) + code[place + 1:],
        "letter": code[:place] + rng.choice("abxo") + code[place + 1:],
    }
    return rng.choice(MALFORMED).format(**fields) + "\n"


def play(task: MastermindTask, problem: Problem, solver: NoisySolver, rng: random.Random) -> list[str]:
    """One episode's actions, the solver against the environment until it says done.

    The codes that fit the feedback are kept as the episode goes (filtered by each valid
    guess's observation), so a game costs one pass over the codes, not one per turn."""
    candidates = all_codes(task.code_length, task.digits)
    actions: list[str] = []
    while True:
        actions.append(solver.guess(candidates, task.code_length, task.digits, rng))
        turn = task.respond(problem, actions)
        if turn.done:
            return actions
        earned = task.read_feedback(turn.observation)
        guess = task.read_guess(actions[-1])
        if earned is not None and guess is not None:  # the feedback is true even of a noisy guess
            candidates = [code for code in candidates if task.rule.score(code, guess) == earned]


def failure_kind(task: MastermindTask, problem: Problem, actions: Sequence[str]) -> str | None:
    """Why the episode of `actions` was lost; None when it was won.

    Precedence, the most basic mistake first: "invalid_guess" (some action was not a code),
    else "inconsistent_guess" (some guess could not have been the secret given the feedback
    before it: a waste of a turn, a repeated guess included), else how the episode ended
    without a mistake: "out_of_turns" (every guess well-formed and consistent, the turns ran
    out) or "unfinished" (the actions stop before the episode is done).
    """
    turns = task.episode(problem, actions)
    if turns and turns[-1].correct:
        return None
    if any(turn.invalid for turn in turns):
        return "invalid_guess"
    if _first_mistake(task, actions, turns) is not None:  # every guess is a code: the mistake is one ruled out
        return "inconsistent_guess"
    return "out_of_turns" if turns and turns[-1].done else "unfinished"


def first_mistake(task: MastermindTask, problem: Problem, actions: Sequence[str]) -> int | None:
    """The turn (1-based) of the episode's first mistake: a guess that is not a code, or one the
    feedback before it had ruled out (a repeat included); None when every guess is a consistent
    code. Where a credit rule should put the blame (tools/mistake_credit.py).

    >>> task = MastermindTask()
    >>> secret = MastermindProblem.create("s", (3, 5, 1, 2))
    >>> first_mistake(task, secret, ["1111\\n", "2212\\n", "9\\n"]), first_mistake(task, secret, ["1111\\n", "1222\\n"])
    (3, 2)
    >>> first_mistake(task, secret, ["1111\\n", "2212\\n", "3312\\n"]) is None
    True
    """
    return _first_mistake(task, actions, task.episode(problem, actions))


def _first_mistake(task: MastermindTask, actions: Sequence[str], turns: Sequence[Turn]) -> int | None:
    """`first_mistake` of an episode already replayed (`turns`: the environment's answers)."""
    history: list[tuple[Code, Hashable]] = []
    for number, (action, answer) in enumerate(zip(actions, turns), start=1):
        guess = task.read_guess(action)
        if guess is None or not consistent(history, guess, task.rule.score):
            return number
        history.append((guess, task.read_feedback(answer.observation)))
    return None


@dataclass(frozen=True)
class SolverRecord:
    """How a player fares under one turn limit.

    Attributes:
        max_turns: the limit.
        win_rate: share of the games won within it.
        mean_turns: mean episode length under it (a lost game counts all `max_turns`).
    """

    max_turns: int
    win_rate: float
    mean_turns: float


def measure(task: MastermindTask, problems: Sequence[MastermindProblem], solver: NoisySolver, seed: int,
            limits: Sequence[int]) -> list[SolverRecord]:
    """The solver's record under each of `limits`, from one game per problem (game i seeded
    `seed + i`) played under `task.max_turns`: the player's draws do not depend on the limit,
    so a game under a lower limit is the first turns of this one."""
    if max(limits) > task.max_turns:
        raise ValueError(f"limits up to {max(limits)} need a task with max_turns >= {max(limits)}, "
                         f"got {task.max_turns}")
    needed = []  # per problem: the turns its game took to win, None for a game lost under task.max_turns
    for index, problem in enumerate(problems):
        actions = play(task, problem, solver, random.Random(seed + index))
        won = task.respond(problem, actions).correct
        needed.append(len(actions) if won else None)
    records = []
    for limit in limits:
        wins = sum(1 for n in needed if n is not None and n <= limit)
        turns = sum(limit if n is None else min(n, limit) for n in needed)
        records.append(SolverRecord(limit, wins / len(needed), turns / len(needed)))
    return records
