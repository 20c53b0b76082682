"""The lock-step batching loop shared by the tree search (flywheel.search.driver) and the flat
rollouts (flywheel.search.flat).

Every round: each live member (a search tree, a flat group) names its requests; ONE
`generator.sample` call carries all of them; each member absorbs the completions of its own
requests; an optional `settle` hook runs over the whole batch (the search: one value-model
call for every tree's new nodes, then every tree picks its next node); finished members
leave and queued ones join at once (continuous batching), so the batch stays at `max_live`
members until the queue runs dry. Pure: no torch, no Lightning, no I/O.
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

    def requests(self) -> list[GenerationRequest]:
        """This round's requests (at least one while the member is not done)."""
        ...

    def absorb(self, outputs: Sequence[Sequence[Completion]]) -> None:
        """Take the completions of this round's requests, in request order."""
        ...

    @property
    def done(self) -> bool:
        """Finished after this round (checked after `settle`)."""
        ...

    def result(self) -> TreeResult:
        """The finished member's record."""
        ...


M = TypeVar("M", bound=Member)


class Lockstep(Generic[M]):
    """Runs members in lock-step rounds over one Generator (see the module docstring).

    Args:
        generator: each round makes exactly one `sample` call.
        members: the queue, consumed lazily: a member is built (its clock started) when it
            joins the batch.
        max_live: members in flight at once.
        stats: rounds, requests, generated tokens, finished members and their trajectories,
            generator and total seconds are added to it.
        settle: called with the live members after they absorbed a round and before the
            finished ones leave.
        on_round: called after every round with the members still live and those that
            finished in it (before their results are yielded).
    """

    def __init__(
        self,
        generator: Generator,
        members: Iterable[M],
        *,
        max_live: int,
        stats: DriverStats,
        settle: Callable[[list[M]], None] | None = None,
        on_round: Callable[[list[M], list[M]], None] | None = None,
    ) -> None:
        self.generator = generator
        self.queue = iter(members)
        self.max_live = max_live
        self.stats = stats
        self.settle = settle
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
            per_member = [m.requests() for m in live]
            requests = [r for own in per_member for r in own]
            gen_start = time.perf_counter()
            # No requests at all: every member finished when it joined (a tree whose first
            # rollouts, sampled before it, left it nothing to do); the generator is not called.
            outputs = self.generator.sample(requests) if requests else []
            stats.generator_seconds += time.perf_counter() - gen_start
            check_outputs(self.generator, requests, outputs)
            first = 0
            for member, own in zip(live, per_member):
                mine = outputs[first : first + len(own)]
                first += len(own)
                member.absorb(mine)
                stats.generated_tokens += sum(len(c.token_ids) for comps in mine for c in comps)
            if self.settle is not None:
                self.settle(live)
            ended = [m for m in live if m.done]
            results = [m.result() for m in ended]
            live[:] = [m for m in live if not m.done]
            self._refill()
            stats.rounds += 1
            stats.requests += len(requests)
            stats.expansions += len(requests)
            stats.trees_done += len(results)
            stats.trajectories += sum(len(r.trajectories) for r in results)
            stats.total_seconds += time.perf_counter() - round_start
            if self.on_round is not None:
                self.on_round(live, ended)
            yield from results
