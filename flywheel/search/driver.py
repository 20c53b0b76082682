"""The batched multi-tree driver: many DeepSearch trees in lock-step over one Generator.

A round is `SearchDriver.search_round`, the whole algorithm in one function: expand (ONE
`generator.sample` call carries the node each live tree selected, n samples each; with selection
"puct_agents", one node per agent, flywheel.search.live_agents), evaluate (the samples become
children or whole paths, new terminals are graded), back up (§3-4), the value model (one call
for every tree still searching), select (§5, or a fork rule). Finished trees leave and queued
problems join at once (continuous batching, flywheel.search.lockstep's engine, shared with the
flat rollouts), so the generator batch stays at `max_concurrent_trees` requests until the queue
runs dry.

A tree's evolution depends only on its own generator outputs, its index in the input
and the config seed (per-request seeds and its rng are derived from them), so the same
seed and the same generator outputs give an identical tree at any concurrency.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

from flywheel.generation.base import Generator
from flywheel.prm import ValueFn
from flywheel.search.config import MAX_CONCURRENT_TREES, SearchConfig
from flywheel.search.expansion import Decode, SearchProblem, StepEnds, step_sampling_params
from flywheel.search.expansion import derive_seed  # noqa: F401  (re-exported: flywheel.search.driver.derive_seed)
from flywheel.search.episode_rollouts import EpisodeRolloutTree
from flywheel.search.live import LiveTree
from flywheel.search.live_agents import AgentTree
from flywheel.search.lockstep import DriverStats, Lockstep, sample
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
        """The config's rules, looked up and their settings bound once (flywheel.search.rule_table): a tree searched by several
        agents (a selection rule with `agents`), else a LiveTree grown by the config's expansion mode."""
        config = self.config
        selection = SELECTION[config.selection]
        if selection.agents:
            descend = selection.bind(config)
            return lambda index, problem: AgentTree(index, problem, config, descend)
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
            tree.select()
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
        trees = (self.join(index, problem) for index, problem in enumerate(problems))
        done = done_trajectories = 0
        start = last_log = time.perf_counter()

        def on_round(live: list[LiveTree | AgentTree], finished: list[LiveTree | AgentTree]) -> None:
            nonlocal done, done_trajectories, last_log
            done += len(finished)
            done_trajectories += sum(len(tree.trajectories) for tree in finished)
            now = time.perf_counter()
            if self.progress is None and now - last_log < self.log_every_seconds:
                return
            snapshot = SearchProgress(
                trees_done=done,
                trees_live=len(live),
                trees_total=total,
                trajectories=done_trajectories + sum(len(tree.trajectories) for tree in live),
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

        yield from Lockstep(trees, max_live=self.max_concurrent_trees, round=self.search_round, stats=self.stats,
                            on_round=on_round)

    def search_round(self, trees: list[LiveTree | AgentTree]) -> None:
        """One round of every live tree (mctx's loop body). Each tree selected its node(s) at the
        end of its last round (or when it joined); the rules each phase runs are the tree's own,
        resolved once from the config (`_tree_factory`)."""
        # Expand: every tree's selected node(s), n samples each, in ONE generator call.
        outputs = sample(self.generator, [tree.requests(self.params) for tree in trees], self.stats)
        # Evaluate: the samples hang below the selected nodes (a step each, or whole paths), new
        # terminals are graded.
        for tree, completions in zip(trees, outputs):
            tree.grow(completions, self.decode, self.eos_token_ids)
        # Back up: the new terminals' rewards along their paths (§3-4); a tree that holds K
        # trajectories, or meets another stopping rule, finishes here.
        for tree in trees:
            tree.back_up()
        # Evaluate: the value model scores the new nodes of the trees still searching, one call.
        if self.value_fn is not None:
            self._score_new_nodes([tree for tree in trees if tree.status is None])
        # Select: each tree's node(s) for the next round (§5, the fork rule, the agents' descents
        # after they back up their leaves' values), or it finishes as exhausted.
        for tree in trees:
            tree.select()


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
