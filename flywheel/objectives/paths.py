"""What the objectives read of a search, and the training row they make of it: a leaf.

The credit rules (credit.py) read a searched group (a tree's or a flat group's trajectories)
through the two Protocols below, which flywheel.search's TreeResult and Trajectory satisfy as
they are: the objectives name the shape they need and never import the search (docs/architecture.md).
`TrainingRow` is what credit hands the trainer and the self-training loss reweights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from flywheel.rewards import Verdict


class SearchedStep(Protocol):
    """One step of a path, as credit reads it: q~(s_j), its soft-clipped score (a terminal's is
    its reward), the tree node it is (steps shared by several paths share it) and its tokens."""

    @property
    def q_soft(self) -> float: ...

    @property
    def node_id(self) -> int: ...

    @property
    def token_ids(self) -> tuple[int, ...]: ...


class SearchedPath(Protocol):
    """One response of a group (flywheel.search.outputs.Trajectory)."""

    @property
    def steps(self) -> Sequence[SearchedStep]: ...

    @property
    def step_lengths(self) -> Sequence[int]: ...

    @property
    def response_ids(self) -> tuple[int, ...]: ...

    @property
    def response_logprobs(self) -> tuple[float, ...]: ...

    @property
    def loss_mask(self) -> tuple[bool, ...]: ...

    @property
    def response_text(self) -> str: ...

    @property
    def reward(self) -> float: ...

    @property
    def overlong_penalty(self) -> float: ...

    @property
    def final_score(self) -> float: ...

    @property
    def verdict(self) -> Verdict: ...


class SearchedGroup(Protocol):
    """One problem's searched responses (flywheel.search.outputs.TreeResult)."""

    @property
    def problem_id(self) -> str: ...

    @property
    def prompt_ids(self) -> tuple[int, ...]: ...

    @property
    def trajectories(self) -> Sequence[SearchedPath]: ...


@dataclass(frozen=True)
class TrainingRow:
    """One trajectory ready for the objective."""

    problem_id: str
    group: int
    """Index of its tree (or flat group) within the epoch."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    advantages: tuple[float, ...]
    """[len(response_ids)] per-token advantage."""
    behaviour_logprobs: tuple[float, ...]
    """[len(response_ids)] the generator's log-probs; NaN where unknown (a cached solution,
    or a backend that gave none): the data module fills those with the trainer's own."""
    step_ids: tuple[int, ...]
    """[len(response_ids)] index of the step each token belongs to."""
    reward: float
    correct: bool = False
    """Verified correct (a cached solution is)."""
    loss_mask: tuple[bool, ...] = ()
    """[len(response_ids)] which tokens are trained on (an episode's observations are not);
    empty: every response token."""
    weight_version: int | None = None
    """The optimizer step of the generator's weights when its search started (stamped by the
    data module; None: not stamped). Under `--data.async_search` it lags the trained weights."""
