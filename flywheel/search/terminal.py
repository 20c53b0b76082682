"""Terminals: when a step ends a trajectory, what it earns, and which new terminal is backed up.

deepsearch.md §1 (terminal condition), §2 (paper Eq. 4, terminal reward) and §3 (paper
Eq. 2 + the official code, terminal choice).
"""

from __future__ import annotations

import math
import random
from typing import Literal, Sequence

from flywheel.rewards import Verdict

TerminalKind = Literal["correct", "incorrect", "incomplete"]
KIND_RANK: dict[str, int] = {"correct": 0, "incorrect": 1, "incomplete": 2}
"""Priority of §3 step 1: correct > incorrect > incomplete (lower rank wins)."""


def is_terminal_step(finish_reason: str, depth: int, max_depth: int) -> bool:
    """A child ends its trajectory if it emitted EOS or its depth reached d_T (§1).

    A step that stopped at the delimiter ("stop") or at its token cap ("length") is an
    ordinary step unless it sits at max depth.

    >>> is_terminal_step("eos", 3, 64), is_terminal_step("length", 3, 64), is_terminal_step("stop", 64, 64)
    (True, False, True)
    """
    return finish_reason == "eos" or depth >= max_depth


def terminal_kind(verdict: Verdict, emitted_eos: bool) -> TerminalKind:
    """Classify a graded terminal (§2, Eq. 4 and the code's rule).

    correct: the verifier says so, even for a trajectory cut at max depth (its text still
    holds a correct answer). incomplete: cut at max depth without EOS and no parsable
    answer. incorrect: everything else (an answer that is wrong, or EOS without an answer).

    >>> terminal_kind(Verdict(False, -1.0, None, "no_answer"), emitted_eos=False)
    'incomplete'
    >>> terminal_kind(Verdict(False, -1.0, None, "no_answer"), emitted_eos=True)
    'incorrect'
    """
    if verdict.correct:
        return "correct"
    if not emitted_eos and verdict.answer is None:
        return "incomplete"
    return "incorrect"


def terminal_reward(kind: str, verdict: Verdict, incomplete_reward: float = -1.0) -> float:
    """q(s_end) of Eq. 4: the verifier's reward (+1 correct / -1 incorrect by default, a task may
    give a dense variant), or `incomplete_reward` (-1) for an incomplete trajectory.

    >>> terminal_reward("incomplete", Verdict(False, 0.0, None, "no_answer"))
    -1.0
    """
    return incomplete_reward if kind == "incomplete" else float(verdict.reward)


def confidence_key(value: float) -> float:
    """Lower = more confident; NaN (a broken log-prob or entropy, §9) sorts last as +inf."""
    return math.inf if value != value else value


def _choice_key(row: tuple[int, str, float]) -> tuple[int, float, int]:
    """(kind rank, confidence, node id) of a (node, kind, uncertainty) row: §3's order."""
    node, kind, uncertainty = row
    return KIND_RANK[kind], confidence_key(uncertainty), node


def choose_terminals(
    node_ids: Sequence[int],
    kinds: Sequence[str],
    uncertainty: Sequence[float],
    *,
    rule: str = "mean_nll",
    rng: random.Random | None = None,
    back_up_all: bool = False,
) -> list[int]:
    """Which of an expansion's new terminals are backed up, in order (§3, Eq. 2 + code).

    1. keep the best kind present (correct > incorrect > incomplete);
    2. among those take the most confident: lowest `uncertainty` (mean NLL of the whole
       trajectory, or its mean entropy), NaN last, ties to the lowest node id;
       rule "random" (Table 5 ablation) draws uniformly among them instead.
    With `back_up_all`, every new terminal is returned, best first (kind, then confidence).

    >>> choose_terminals([5, 6, 7], ["incorrect", "incomplete", "incorrect"], [0.9, 0.1, 0.4])
    [7]
    >>> choose_terminals([5, 6, 7], ["incorrect", "correct", "incorrect"], [0.9, 2.0, 0.4], back_up_all=True)
    [6, 7, 5]
    """
    if not node_ids:
        return []
    if rule == "random":
        if rng is None:
            raise ValueError("terminal rule 'random' needs an rng")
        keyed = [(KIND_RANK[kind], rng.random(), node) for node, kind in zip(node_ids, kinds)]
        order = [node for _, _, node in sorted(keyed)]
    else:
        rows = zip(node_ids, kinds, uncertainty)
        if not back_up_all:  # the first of the sorted order (node ids: no ties), without sorting
            return [min(rows, key=_choice_key)[0]]
        order = [node for node, _, _ in sorted(rows, key=_choice_key)]
    return order if back_up_all else order[:1]
