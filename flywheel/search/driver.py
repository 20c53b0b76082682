"""The batched multi-tree driver: many DeepSearch trees in lock-step over one Generator.

Every round: each live tree names the one leaf it wants expanded (with selection
"puct_agents", one leaf per agent of the tree, flywheel.search.live_agents); ONE
`generator.sample` call carries all of those expansions (n children each); then each tree adds its
children, grades its new terminals, backs one up (§3-4) and selects its next leaf (§5).
Finished trees leave and queued problems join at once (continuous batching), so the
generator batch stays at `max_concurrent_trees` requests until the queue runs dry. The loop
itself is flywheel.search.lockstep's, shared with the flat rollouts; a tree enters it as a
`_TreeMember`.

A tree's evolution depends only on its own generator outputs, its index in the input
and the config seed (per-request seeds and its rng are derived from them), so the same
seed and the same generator outputs give an identical tree at any concurrency.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Sequence

from flywheel.generation.base import Completion, GenerationRequest, Generator
from flywheel.prm import ValueFn
from flywheel.search.config import MAX_CONCURRENT_TREES, SearchConfig
from flywheel.search.expansion import Decode, SearchProblem, StepEnds, step_sampling_params
from flywheel.search.expansion import derive_seed  # noqa: F401  (re-exported: flywheel.search.driver.derive_seed)
from flywheel.search.episode_rollouts import EpisodeRolloutTree
from flywheel.search.live import LiveTree
from flywheel.search.live_agents import AgentTree
from flywheel.search.lockstep import DriverStats, Lockstep
from flywheel.search.outputs import TreeResult
from flywheel.search.rule_table import EXPANSION, SELECTION
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


class SearchDriver:
    """Runs DeepSearch trees for a stream of problems over one Generator, in lock-step rounds.

    Args:
        generator: any `Generator`; each round makes exactly one `sample` call.
        config: the search rules and their parameters.
        step: what one step is (the Task's StepSpec): fixed chunk or delimiter + cap.
        decode: token ids -> text, used to build the response text the verifier grades.
        max_concurrent_trees: trees searched at once = requests per generator call (the
            official code: 16 per rank; default `MAX_CONCURRENT_TREES`, the data module's too).
            Finished trees are replaced from the queue at once.
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
        max_concurrent_trees: int = MAX_CONCURRENT_TREES,
        eos_token_ids: Iterable[int] = (),
        progress: Callable[[SearchProgress], None] | None = None,
        log_every_seconds: float = 30.0,
        value_fn: ValueFn | None = None,
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
        if config.distinct_children:  # the search's children only: flat rollouts share step_sampling_params
            self.params = replace(self.params, distinct_first_token=True)
        self.ends_step = StepEnds(step, decode)
        self.new_tree = self._tree_factory()

    def _tree_factory(self) -> Callable[[int, SearchProblem], LiveTree | AgentTree]:
        """The config's rules, resolved once (flywheel.search.rule_table): a tree searched by several
        agents (a selection rule with `agents`), else a LiveTree grown by the config's expansion mode."""
        config = self.config
        selection = SELECTION[config.selection]
        if selection.agents:
            return lambda index, problem: AgentTree(index, problem, config, selection.run)
        mode = EXPANSION[config.expansion].run(config, self.step, self.ends_step)
        if config.whole_rollouts:  # an episode's rollouts are played turn by turn
            return lambda index, problem: (EpisodeRolloutTree(index, problem, config, mode) if problem.respond is not None
                                           else LiveTree(index, problem, config, mode))
        return lambda index, problem: LiveTree(index, problem, config, mode)

    def join(self, index: int, problem: SearchProblem) -> LiveTree | AgentTree:
        """The tree of `problem`. One with `first_rollouts` (`--data.batching.flat_first`) starts
        from them before its first round: absorbed as the root's first expansion, their new
        steps scored by the value model (if any), then its first fork chosen."""
        tree = self.new_tree(index, problem)
        if problem.first_rollouts:
            if problem.respond is not None:
                raise ValueError(f"problem {problem.id!r} is an environment's episode: a tree cannot start from flat "
                                 "samples of it (--data.batching.flat_first); its rollouts are played turn by turn")
            if not self.config.whole_rollouts or not isinstance(tree, LiveTree):
                raise ValueError(f"problem {problem.id!r} comes with first rollouts, which only a rollout-expansion tree "
                                 "can start from: set --data.search.expansion=rollout")
            tree.start_from(problem.first_rollouts, self.decode, self.eos_token_ids)
            if self.value_fn is not None and tree.status is None:
                self._score_new_nodes([tree])
            tree.choose_next()
        return tree

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
        trees = (_TreeMember(self.join(index, problem), self) for index, problem in enumerate(problems))
        done = done_trajectories = 0
        start = last_log = time.perf_counter()

        def on_round(live: list[_TreeMember], finished: list[_TreeMember]) -> None:
            nonlocal done, done_trajectories, last_log
            done += len(finished)
            done_trajectories += sum(len(m.tree.trajectories) for m in finished)
            now = time.perf_counter()
            if self.progress is None and now - last_log < self.log_every_seconds:
                return
            snapshot = SearchProgress(
                trees_done=done,
                trees_live=len(live),
                trees_total=total,
                trajectories=done_trajectories + sum(len(m.tree.trajectories) for m in live),
                expansions=self.stats.expansions,
                generated_tokens=self.stats.generated_tokens,
                rounds=self.stats.rounds,
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

        yield from Lockstep(
            self.generator, trees, max_live=self.max_concurrent_trees, stats=self.stats,
            settle=self._settle, on_round=on_round,
        )

    def _settle(self, live: list[_TreeMember]) -> None:
        """After a round: one value-model call for every live tree's new nodes, then each tree
        picks its next node (§5) or finishes."""
        if self.value_fn is not None:
            self._score_new_nodes([m.tree for m in live if m.tree.status is None])
        for member in live:
            member.tree.choose_next()


class _TreeMember:
    """A live tree as a member of the lock-step loop (flywheel.search.lockstep)."""

    __slots__ = ("tree", "driver")

    def __init__(self, tree: LiveTree | AgentTree, driver: SearchDriver) -> None:
        self.tree = tree
        self.driver = driver

    def requests(self) -> list[GenerationRequest]:
        # One request per tree, or one per agent that reached a leaf (selection "puct_agents");
        # none for a tree that finished when it joined (its first rollouts left nothing to do).
        if self.tree.status is not None:
            return []
        return self.tree.requests(self.driver.params)

    def absorb(self, outputs: Sequence[Sequence[Completion]]) -> None:
        if self.tree.status is None:
            self.tree.absorb_all(outputs, self.driver.decode, self.driver.eos_token_ids)

    @property
    def done(self) -> bool:
        return self.tree.status is not None

    def result(self) -> TreeResult:
        return self.tree.result()


def run_search(
    problems: Iterable[SearchProblem],
    generator: Generator,
    config: SearchConfig,
    *,
    step: StepSpec,
    decode: Decode,
    max_concurrent_trees: int = MAX_CONCURRENT_TREES,
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
