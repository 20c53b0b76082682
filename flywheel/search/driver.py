"""The batched multi-tree driver: many DeepSearch trees in lock-step over one Generator.

Every round: each live tree names the one leaf it wants expanded (with selection
"puct_agents", one leaf per agent of the tree, flywheel.search.live_agents); ONE
`generator.sample` call carries all of those expansions (n children each); then each tree adds its
children, grades its new terminals, backs one up (§3-4) and selects its next leaf (§5).
Finished trees leave and queued problems join at once (continuous batching), so the
generator batch stays at `max_concurrent_trees` requests until the queue runs dry.

A tree's evolution depends only on its own generator outputs, its index in the input
and the config seed (per-request seeds and its rng are derived from them), so the same
seed and the same generator outputs give an identical tree at any concurrency.
"""


from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from flywheel.generation.base import Generator
from flywheel.search.config import SearchConfig
from flywheel.search.expansion import Decode, SearchProblem, check_outputs, step_sampling_params
from flywheel.search.expansion import derive_seed  # noqa: F401  (re-exported: flywheel.search.driver.derive_seed)
from flywheel.search.live import LiveTree
from flywheel.search.live_agents import AgentTree
from flywheel.search.outputs import TreeResult
from flywheel.tasks.base import StepSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchProgress:
    """A snapshot after each round, for a progress bar (the DataModule wraps it in tqdm)."""

    trees_done: int
    trees_live: int
    trees_total: int | None
    """None when the problems came from an iterable without len()."""
    trajectories: int
    """Backed-up trajectories so far, finished and live trees together."""
    expansions: int
    generated_tokens: int
    rounds: int
    elapsed_seconds: float


@dataclass
class DriverStats:
    """Cumulative accounting of one driver (logged under search/)."""

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



class SearchDriver:
    """Runs DeepSearch trees for a stream of problems over one Generator, in lock-step rounds.

    Args:
        generator: any `Generator`; each round makes exactly one `sample` call.
        config: the search rules and their parameters.
        step: what one step is (the Task's StepSpec): fixed chunk or delimiter + cap.
        decode: token ids -> text, used to build the response text the verifier grades.
        max_concurrent_trees: trees searched at once = requests per generator call (the
            official code: 16 per rank). Finished trees are replaced from the queue at once.
        eos_token_ids: also treat a completion whose last token is one of these as EOS (for
            backends that report it as "stop"); the generator's "eos" finish reason always counts.
        progress: called with a SearchProgress after every round.
        log_every_seconds: how often to log progress at INFO level (0 = every round).
        value_fn: a value model (e.g. the previous round's PRM): prefixes (prompt + partial
            response) -> values in [0, 1]; called once per round for every new non-terminal
            node of every live tree; the values enter selection with weight
            `config.prm_weight` (rest-mcts-and-countdown.md §A).
    """

    def __init__(
        self,
        generator: Generator,
        config: SearchConfig,
        *,
        step: StepSpec,
        decode: Decode,
        max_concurrent_trees: int = 16,
        eos_token_ids: Iterable[int] = (),
        progress: Callable[[SearchProgress], None] | None = None,
        log_every_seconds: float = 30.0,
        value_fn: Callable[[list[tuple[int, ...]]], Sequence[float]] | None = None,
    ) -> None:
        if max_concurrent_trees < 1:
            raise ValueError(f"max_concurrent_trees must be >= 1, got {max_concurrent_trees}")
        self.generator = generator
        self.config = config
        self.step = step
        self.decode = decode
        self.max_concurrent_trees = max_concurrent_trees
        self.eos_token_ids = frozenset(eos_token_ids)
        self.progress = progress
        self.log_every_seconds = log_every_seconds
        self.value_fn = value_fn
        self.stats = DriverStats()
        self.params = step_sampling_params(step, config)
        self._step_enders: dict[int, bool] = {}

    def ends_step(self, token: int) -> bool:
        """Does this token end a step (its text holds the delimiter)? Memoised per token id."""
        known = self._step_enders.get(token)
        if known is None:
            known = self._step_enders[token] = self.step.delimiter is not None and self.step.delimiter in self.decode([token])
        return known

    def _score_new_nodes(self, trees: list[LiveTree | AgentTree]) -> None:
        """One value-model call for the new non-terminal children of every live tree."""
        nodes = [(t, c) for t in trees for c in t.new_live_children()]
        if not nodes:
            return
        start = time.perf_counter()
        values = self.value_fn([t.tree.prefix_ids(c) for t, c in nodes])
        if len(values) != len(nodes):
            raise RuntimeError(f"value_fn returned {len(values)} values for {len(nodes)} nodes")
        for (t, c), v in zip(nodes, values):
            t.tree.prm_value[c] = float(v)
        self.stats.value_calls += 1
        self.stats.valued_nodes += len(nodes)
        self.stats.value_sum += float(sum(values))
        self.stats.value_seconds += time.perf_counter() - start

    def run(self, problems: Iterable[SearchProblem]) -> list[TreeResult]:
        """Search every problem; results in input order."""
        results = list(self.iter_run(problems))
        results.sort(key=lambda r: r.index)
        return results

    def iter_run(self, problems: Iterable[SearchProblem]) -> Iterator[TreeResult]:
        """Search every problem, yielding each TreeResult as soon as its tree finishes (so the
        caller can persist it); the order is completion order, `TreeResult.index` is input order."""
        total = len(problems) if hasattr(problems, "__len__") else None  # type: ignore[arg-type]
        queue = enumerate(problems)
        live: list[LiveTree | AgentTree] = []
        stats = self.stats
        done = done_trajectories = 0
        start = last_log = time.perf_counter()

        def refill() -> None:
            while len(live) < self.max_concurrent_trees:
                item = next(queue, None)
                if item is None:
                    return
                kind = AgentTree if self.config.selection == "puct_agents" else LiveTree
                live.append(kind(item[0], item[1], self.config, self.step, self.ends_step))

        refill()
        while live:
            round_start = time.perf_counter()
            # One request per tree, or one per agent that reached a leaf (selection "puct_agents").
            per_tree = [t.requests(self.params) for t in live]
            requests = [r for tree_requests in per_tree for r in tree_requests]
            gen_start = time.perf_counter()
            outputs = self.generator.sample(requests)
            gen_seconds = time.perf_counter() - gen_start
            check_outputs(self.generator, requests, outputs)
            finished: list[TreeResult] = []
            still: list[LiveTree | AgentTree] = []
            first = 0
            for tree, tree_requests in zip(live, per_tree):
                before = tree.generated_tokens
                tree.absorb_all(outputs[first : first + len(tree_requests)], self.decode, self.eos_token_ids)
                first += len(tree_requests)
                stats.generated_tokens += tree.generated_tokens - before
            if self.value_fn is not None:
                self._score_new_nodes([t for t in live if t.status is None])
            for tree in live:
                tree.choose_next()
                if tree.status is None:
                    still.append(tree)
                else:
                    finished.append(tree.result())
                    done_trajectories += len(tree.trajectories)
            live[:] = still
            refill()
            done += len(finished)
            stats.rounds += 1
            stats.requests += len(requests)
            stats.expansions += len(requests)
            stats.trees_done += len(finished)
            stats.trajectories += sum(len(r.trajectories) for r in finished)
            stats.generator_seconds += gen_seconds
            now = time.perf_counter()
            stats.total_seconds += now - round_start
            if self.progress is not None or now - last_log >= self.log_every_seconds:
                snapshot = SearchProgress(
                    trees_done=done,
                    trees_live=len(live),
                    trees_total=total,
                    trajectories=done_trajectories + sum(len(t.trajectories) for t in live),
                    expansions=stats.expansions,
                    generated_tokens=stats.generated_tokens,
                    rounds=stats.rounds,
                    elapsed_seconds=now - start,
                )
                if self.progress is not None:
                    self.progress(snapshot)
                if now - last_log >= self.log_every_seconds:
                    last_log = now
                    log.info(
                        "search: %d/%s trees done, %d live, %d trajectories, %d expansions, %d tokens, %.0f s",
                        done, total if total is not None else "?", len(live), snapshot.trajectories,
                        snapshot.expansions, snapshot.generated_tokens, snapshot.elapsed_seconds,
                    )
            yield from finished


def run_search(
    problems: Iterable[SearchProblem],
    generator: Generator,
    config: SearchConfig,
    *,
    step: StepSpec,
    decode: Decode,
    max_concurrent_trees: int = 16,
    eos_token_ids: Iterable[int] = (),
    progress: Callable[[SearchProgress], None] | None = None,
) -> list[TreeResult]:
    """Search every problem with a fresh SearchDriver; results in input order."""
    driver = SearchDriver(
        generator,
        config,
        step=step,
        decode=decode,
        max_concurrent_trees=max_concurrent_trees,
        eos_token_ids=eos_token_ids,
        progress=progress,
    )
    return driver.run(problems)
