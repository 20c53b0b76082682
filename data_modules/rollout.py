"""One epoch's rollouts: problems in, training rows and finished trees out.

`rollout` is the whole of it: tree search (or flat / best-of-N sampling) for the problems
without cached solutions, mixed rollouts (cached + direct samples, deepsearch.md §7) for the
problems in the replay buffer, then the credit (flywheel.objectives.credit, one call) turns
every group into training rows.
No Lightning: the generator, the task, the tokenizer and the settings are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Sequence

from data_modules.solved import solved_ids
from data_modules.token_split import TokenSplit
from flywheel.adaptive import CachedSolution, direct_samples_needed
from flywheel.reporting.problem_view import decoder, encode_prompt, eos_ids, search_problems
from flywheel.generation.base import Generator
from flywheel.objectives.credit import ROLLOUTS, Credit, Group, TrainingRow, credit_groups
from flywheel.ports import PolicyPort
from flywheel.prm import ValueFn
from flywheel.search.config import SearchConfig
from flywheel.search.driver import DriverStats, SearchDriver, SearchProblem, derive_seed
from flywheel.search.flat import flat_responses, flat_rollouts
from flywheel.search.outputs import TreeResult
from flywheel.search.rule_table import SELECTION
from flywheel.tasks import Problem, Task
from flywheel.tasks.grading import Grader



@dataclass(frozen=True)
class Rollouts:
    """An epoch's rollouts on one rank."""

    rows: list[list[TrainingRow]]
    """Training rows per problem, in problem order ([] for a left-out group)."""
    results: list[TreeResult]
    """The trees (or flat groups) that were sampled, in problem order."""
    stats: DriverStats
    uniform_groups: int
    """Groups left out by `drop_uniform_groups`."""
    tokens: TokenSplit = TokenSplit()
    """`stats.generated_tokens` split: the tree search's, and the flat samples' (flat rollouts,
    `flat_first` samples and the direct samples of mixed rollouts). Counted from the generator
    calls of each, so it adds up even when a problem is drawn twice in one epoch (its results
    share one id)."""
    searched: frozenset[str] = frozenset()
    """Ids of the problems searched afresh under kind "search" (a tree, or with
    `flat_first` the flat group that solved it), not given a mixed rollout: what the
    replay buffer is offered (`search_outcomes`)."""
    solved: frozenset[str] = frozenset()
    """Ids of the problems a response generated for them here solved (data_modules.solved): a
    mixed rollout's replayed cached solutions are not among `results`, so they do not count."""


def value_head_fn(module: PolicyPort, config: SearchConfig) -> ValueFn | None:
    """The policy's own value head as the search's value function (search.selection=puct_agents)."""
    if SELECTION[config.selection].uses_value_head and getattr(module, "value_head", None) is not None:
        return module.search_values
    return None


def rollout(
    problems: Sequence[Problem],
    *,
    generator: Generator,
    task: Task,
    tokenizer: Any,
    kind: str,
    search: SearchConfig,
    flat_samples: int,
    max_concurrent_trees: int,
    credit: Credit,
    flat_first: int = 0,
    cached: Callable[[str], Sequence[CachedSolution]] = lambda problem_id: (),
    value_fn: ValueFn | None = None,
    node_values: ValueFn | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    grader: Grader | None = None,
) -> Rollouts:
    """Training rows per problem (in problem order), the rollout results and their cost.

    kind "search": DeepSearch MCTS (`search`, its seed already this epoch's and rank's),
    credited by `credit.advantage`; "flat": `flat_samples` independent responses, DAPO
    advantages; "best_of_n": the same samples, the correct ones only. A problem with
    `cached(id)` solutions gets a mixed rollout instead, credited by the same rule
    (`flywheel.objectives.credit.credit_groups`). With `flat_first` = m (kind "search"), every
    fresh problem first gets m flat samples: a problem with a correct one keeps them as its
    flat group, one with none gets a tree that starts from them (`SearchProblem.first_rollouts`).
    `value_fn` scores new search nodes
    when `search.prm_weight` > 0; otherwise `node_values` does (the policy's value head, for
    `search.selection=puct_agents`). `progress(problems done, tokens or None)`. `grader`: the
    grading guard every response (and an environment's every answer) goes through (default: the
    task unguarded).
    """
    buffered = [p for p in problems if cached(p.id)]
    fresh = [p for p in problems if not cached(p.id)]
    sampler = Sampler(generator, task, tokenizer, search, max_concurrent_trees, grader)
    searches = ROLLOUTS[kind].searches
    if searches:
        found = search_fresh(fresh, sampler, flat_first, value_fn if search.prm_weight > 0 else node_values, progress)
    else:
        found = sampler.flat(fresh, flat_samples, (lambda done: progress(done, None)) if progress else None) if fresh else []
    results = {r.problem_id: r for r in found}
    groups = {r.problem_id: Group.of(r) for r in found}
    n = search.trajectories_per_tree if searches else flat_samples
    mixed_results, mixed_groups = mixed_rollouts(buffered, sampler, cached, n)
    results.update(mixed_results)
    groups.update(mixed_groups)
    credited = credit_groups([groups[p.id] for p in problems], credit, kind, value_fn)
    ordered = [results[p.id] for p in problems if p.id in results]
    stats = sampler.stats
    return Rollouts(credited.rows, ordered, stats, credited.uniform_groups,
                    tokens=TokenSplit(tree=sampler.tree_tokens, flat=stats.generated_tokens - sampler.tree_tokens),
                    searched=frozenset(p.id for p in fresh) if searches else frozenset(),
                    solved=solved_ids([*found, *results.values()]))  # found: both searches of a problem drawn twice


class Sampler:
    """What the parts of one `rollout` sample with, and the counters they add up: `stats` over
    every generator call, `tree_tokens` the tree search's share of them."""

    def __init__(self, generator: Generator, task: Task, tokenizer: Any, search: SearchConfig, max_concurrent_trees: int,
                 grader: Grader | None) -> None:
        self.generator, self.task, self.tokenizer, self.search = generator, task, tokenizer, search
        self.max_concurrent_trees, self.grader = max_concurrent_trees, grader
        self.decode, self.eos = decoder(tokenizer), eos_ids(tokenizer)
        self.stats = DriverStats()
        self.tree_tokens = 0

    def problems(self, problems: Sequence[Problem]) -> list[SearchProblem]:
        return search_problems(self.tokenizer, self.task, problems, self.grader)

    def flat(self, problems: Sequence[Problem], n: int, on_done: Callable[[int], None] | None,
             config: SearchConfig | None = None) -> list[TreeResult]:
        """n independent responses per problem, as flat groups (counted in `stats`)."""
        return flat_rollouts(self.problems(problems), self.generator, n=n, step=self.task.step, decode=self.decode,
                             config=config or self.search, max_concurrent_problems=self.max_concurrent_trees,
                             eos_token_ids=self.eos, stats=self.stats, progress=on_done)

    def trees(self, problems: Sequence[SearchProblem], values: ValueFn | None,
              progress: Callable[[Any], None] | None) -> list[TreeResult]:
        """The multi-tree search of `problems` (counted in `stats` and `tree_tokens`)."""
        driver = SearchDriver(self.generator, self.search, step=self.task.step, decode=self.decode,
                              max_concurrent_trees=self.max_concurrent_trees, eos_token_ids=self.eos, value_fn=values,
                              progress=progress)
        found = driver.run(problems)
        self.tree_tokens += driver.stats.generated_tokens
        self.stats = added(self.stats, driver.stats)
        return found


def search_fresh(fresh: Sequence[Problem], sampler: Sampler, flat_first: int, values: ValueFn | None,
                 progress: Callable[[int, int | None], None] | None) -> list[TreeResult]:
    """Kind "search" on the problems without cached solutions: with `flat_first` = m, m flat
    samples each first (a problem one of them solves keeps them as its group; the others' trees
    start from them), then a tree for every problem left."""
    found: list[TreeResult] = []
    first_rollouts: dict[str, tuple] = {}
    searched = list(fresh)
    if fresh and flat_first:  # tree tokens only where flat fails
        samples = sampler.flat(fresh, flat_first, (lambda done: progress(0, None)) if progress else None,
                               flat_first_config(sampler.search))
        for problem, result in zip(fresh, samples):
            if any(t.verdict.correct for t in result.trajectories):
                found.append(result)
            else:
                first_rollouts[problem.id] = flat_responses(result)
        searched = [p for p in fresh if p.id in first_rollouts]
    if searched:
        done_flat = len(found)
        on_round = (lambda p: progress(done_flat + p.trees_done, p.generated_tokens)) if progress else None
        found += sampler.trees([replace(sp, first_rollouts=first_rollouts.get(sp.id, ())) for sp in sampler.problems(searched)],
                               values, on_round)
    return found


def mixed_rollouts(buffered: Sequence[Problem], sampler: Sampler, cached: Callable[[str], Sequence[CachedSolution]],
                   n: int) -> tuple[dict[str, TreeResult], dict[str, Group]]:
    """The problems with cached solutions: each group of n is its cached solutions and as many
    direct samples as it needs (deepsearch.md §7), sampled together per need."""
    results: dict[str, TreeResult] = {}
    groups: dict[str, Group] = {}
    by_need: dict[int, list[Problem]] = {}
    for problem in buffered:
        by_need.setdefault(direct_samples_needed(len(cached(problem.id)), n), []).append(problem)
    for need, group in by_need.items():
        direct = sampler.flat(group, need, None) if need else [None] * len(group)
        for problem, result in zip(group, direct):
            if result is not None:
                results[problem.id] = result
            groups[problem.id] = Group(problem.id, encode_prompt(sampler.tokenizer, sampler.task, problem), result,
                                       tuple(cached(problem.id)), n)
    return results, groups


FLAT_FIRST_SEED = 1
"""Salt of the flat-first samples' seed: derive_seed(search.seed, FLAT_FIRST_SEED), so that a
tree's requests (derived from search.seed and the tree's index) never repeat a flat request's
seed (derived from the same root and the problem's index) and resample its very responses."""


def check_flat_first(m: int, kind: str, search: SearchConfig) -> None:
    """Refuse a `--data.batching.flat_first` that cannot work, naming the flag and the fix."""
    if not m:
        return
    if not ROLLOUTS[kind].searches:
        raise ValueError(f"--data.batching.flat_first={m} builds trees where flat samples fail, but --data.rollout={kind} "
                         "builds none: set --data.rollout=search, or --data.batching.flat_first=0")
    if not search.whole_rollouts:
        raise ValueError(f"--data.batching.flat_first={m} starts each tree from whole flat responses, which only rollout "
                         "expansion takes in: set --data.search.expansion=rollout, or --data.batching.flat_first=0")
    if m >= search.trajectories_per_tree:
        raise ValueError(f"--data.batching.flat_first={m} must be below --data.search.trajectories_per_tree="
                         f"{search.trajectories_per_tree}: the m flat responses count towards a tree's K rollouts, so "
                         "the tree would end before its first fork; raise trajectories_per_tree or lower flat_first")


def flat_first_config(search: SearchConfig) -> SearchConfig:
    """The config of the flat samples taken before the trees (`--data.batching.flat_first`)."""
    return replace(search, seed=derive_seed(search.seed, FLAT_FIRST_SEED))


def added(a: DriverStats, b: DriverStats) -> DriverStats:
    """The counters of two passes (the flat-first samples and the trees) as one."""
    return DriverStats(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(DriverStats)})


def search_outcomes(problems: Sequence[Problem], out: Rollouts):
    """What the replay buffer needs of the searched (not mixed) problems: (id, correct
    responses as (ids, text), trajectories searched), in problem order."""
    by_id = {r.problem_id: r for r in out.results if r.problem_id in out.searched}
    return [
        (p.id, [(t.response_ids, t.response_text) for t in by_id[p.id].trajectories if t.verdict.correct],
         len(by_id[p.id].trajectories))
        for p in problems if p.id in by_id
    ]
