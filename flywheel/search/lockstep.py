"""The lock-step batching engine shared by the tree search (flywheel.search.driver) and the flat
rollouts (flywheel.search.flat): it keeps members in flight and knows nothing of what a round does.

`Lockstep` hands the live members (search trees, flat groups) to a `round` function, then the
finished ones leave and queued ones join at once (continuous batching), so a round holds
`max_live` members until the queue runs dry. A round makes ONE generator call for every live
member's requests through `sample`, which counts the requests, tokens and generator time. Pure:
no torch, no Lightning, no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Iterator, Protocol, Sequence, TypeVar

from flywheel.generation.base import Completion, GenerationRequest, Generator
from flywheel.search.expansion import check_outputs
from flywheel.search.outputs import TreeResult


@dataclass
class DriverStats:
    """Cumulative accounting of the lock-step loop of a search driver or of flat rollouts (logged under search/)."""

    rounds: int = 0
    requests: int = 0
    expansions: int = 0
    generated_tokens: int = 0
    trees_done: int = 0
    trajectories: int = 0
    generator_seconds: float = 0.0
    total_seconds: float = 0.0
    value_calls: int = 0
    valued_nodes: int = 0
    value_sum: float = 0.0
    value_seconds: float = 0.0
    """Time in the value model (a model call like the generator's, not bookkeeping)."""

    @property
    def bookkeeping_seconds(self) -> float:
        """Everything that is not a model call: selection, grading, backup, batching."""
        return self.total_seconds - self.generator_seconds - self.value_seconds

    @property
    def overhead_pct(self) -> float:
        """Share of the driver's wall time spent outside generator calls (paper: < 0.4%)."""
        return 100.0 * self.bookkeeping_seconds / self.total_seconds if self.total_seconds else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "rounds": float(self.rounds),
            "requests": float(self.requests),
            "expansions": float(self.expansions),
            "generated_tokens": float(self.generated_tokens),
            "trees_done": float(self.trees_done),
            "trajectories": float(self.trajectories),
            "generator_seconds": self.generator_seconds,
            "bookkeeping_seconds": self.bookkeeping_seconds,
            "overhead_pct": self.overhead_pct,
        }


class Member(Protocol):
    """One unit of work in the loop: a search tree or a flat group of responses."""

    @property
    def done(self) -> bool:
        """Finished after this round."""
        ...

    def result(self) -> TreeResult:
        """The finished member's record."""
        ...


M = TypeVar("M", bound=Member)


def sample(generator: Generator, requests: Sequence[Sequence[GenerationRequest]], stats: DriverStats
           ) -> list[list[list[Completion]]]:
    """ONE generator call for every member's `requests` (a member may have none): each member's
    completions, request by request. The requests, expansions, generated tokens and generator
    time are added to `stats`; with no request at all the generator is not called."""
    flat = [r for own in requests for r in own]
    start = time.perf_counter()
    outputs = generator.sample(flat) if flat else []
    stats.generator_seconds += time.perf_counter() - start
    check_outputs(generator, flat, outputs)
    stats.requests += len(flat)
    stats.expansions += len(flat)
    stats.generated_tokens += sum(len(c.token_ids) for comps in outputs for c in comps)
    per_member, first = [], 0
    for own in requests:
        per_member.append(list(outputs[first : first + len(own)]))
        first += len(own)
    return per_member


class Lockstep(Generic[M]):
    """Runs members in lock-step rounds (see the module docstring).

    Args:
        members: the queue, consumed lazily: a member is built (its clock started) when it
            joins the batch.
        max_live: members in flight at once.
        round: one round of the live members (its one generator call through `sample`).
        stats: rounds, finished members and their trajectories, and total seconds are added to it.
        on_round: called after every round with the members still live and those that
            finished in it (before their results are yielded).
    """

    def __init__(
        self,
        members: Iterable[M],
        *,
        max_live: int,
        round: Callable[[list[M]], None],
        stats: DriverStats,
        on_round: Callable[[list[M], list[M]], None] | None = None,
    ) -> None:
        self.queue = iter(members)
        self.max_live = max_live
        self.round = round
        self.stats = stats
        self.on_round = on_round
        self.live: list[M] = []

    def _refill(self) -> None:
        while len(self.live) < self.max_live:
            member = next(self.queue, None)
            if member is None:
                return
            self.live.append(member)

    def __iter__(self) -> Iterator[TreeResult]:
        """Run to the end, yielding each result in the round its member finishes."""
        stats, live = self.stats, self.live
        self._refill()
        while live:
            round_start = time.perf_counter()
            self.round(live)
            ended = [m for m in live if m.done]
            results = [m.result() for m in ended]
            live[:] = [m for m in live if not m.done]
            self._refill()
            stats.rounds += 1
            stats.trees_done += len(results)
            stats.trajectories += sum(len(r.trajectories) for r in results)
            stats.total_seconds += time.perf_counter() - round_start
            if self.on_round is not None:
                self.on_round(live, ended)
            yield from results
