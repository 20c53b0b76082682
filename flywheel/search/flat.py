"""Flat rollouts for the baselines (DAPO / GRPO, best-of-N) in the search's output format.

n independent responses per problem, each grown step by step (one generator call per
round for every unfinished response of every live problem, in lock-step). A response ends
at EOS or after `config.max_depth` steps; with `StepSpec(max_tokens=budget)` and
max_depth=1 a response is one call. The result is a TreeResult (mode "flat") whose root has
n chains; every node's value is its chain's terminal reward, which is what DAPO trains on
(§6: replacing q~(s_j) by q(s_end) turns Tree-GRPO into DAPO).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

from flywheel.generation.base import Completion, GenerationRequest, Generator
from flywheel.search.config import SearchConfig
from flywheel.search.driver import DriverStats
from flywheel.search.expansion import (
    Decode,
    SearchProblem,
    check_outputs,
    derive_seed,
    grade_terminal,
    step_end,
    step_sampling_params,
)
from flywheel.search.outputs import TreeResult, TreeStats, build_trajectory
from flywheel.search.tree import ROOT, SearchTree
from flywheel.tasks.base import StepSpec


class _FlatProblem:
    def __init__(self, index: int, problem: SearchProblem) -> None:
        self.index = index
        self.problem = problem
        self.tree = SearchTree(problem.prompt_ids)
        self.leaves: list[int] = []  # chain j's current last node; ROOT before the first round
        self.rounds = 0
        self.requests = 0
        self.generated_tokens = 0
        self.started = time.perf_counter()

    def open_chains(self) -> list[int]:
        return [j for j, leaf in enumerate(self.leaves) if not self.tree.terminal[leaf]]


def flat_rollouts(
    problems: Iterable[SearchProblem],
    generator: Generator,
    *,
    n: int,
    step: StepSpec,
    decode: Decode,
    config: SearchConfig = SearchConfig(),
    max_concurrent_problems: int = 64,
    eos_token_ids: Iterable[int] = (),
    stats: DriverStats | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[TreeResult]:
    """n independent rollouts per problem, graded at their ends; results in input order.

    Args:
        n: responses per problem (the group size).
        step: what one generator call produces per response (a step, or the whole budget).
        config: reads max_depth (most steps per response), temperature, top_p, seed, the
            overlong penalty and incomplete_reward; the tree rules are unused.
        max_concurrent_problems: problems in flight; finished ones are replaced at once.
        stats: accumulate rounds / tokens / generator time into this DriverStats.
        progress: called with the number of finished problems after every round.
    """
    if n < 1:
        raise ValueError(f"flat rollouts need n >= 1, got {n}")
    if max_concurrent_problems < 1:
        raise ValueError(f"max_concurrent_problems must be >= 1, got {max_concurrent_problems}")
    params = step_sampling_params(step, config)
    eos_ids = frozenset(eos_token_ids)
    stats = stats if stats is not None else DriverStats()
    queue = enumerate(problems)
    live: list[_FlatProblem] = []
    results: list[TreeResult] = []

    def refill() -> None:
        while len(live) < max_concurrent_problems:
            item = next(queue, None)
            if item is None:
                return
            live.append(_FlatProblem(*item))

    refill()
    while live:
        round_start = time.perf_counter()
        requests: list[GenerationRequest] = []
        owners: list[tuple[_FlatProblem, list[int]]] = []  # per request: problem, chains it feeds
        for fp in live:
            if not fp.leaves:  # first round: n samples of the prompt in one request
                seed = derive_seed(config.seed, fp.index, 0)
                requests.append(GenerationRequest(fp.tree.prompt_ids, n, params, seed, affinity=fp.index))
                owners.append((fp, list(range(n))))
                continue
            for j in fp.open_chains():
                leaf = fp.leaves[j]
                seed = derive_seed(config.seed, fp.index, fp.tree.depth[leaf], j)
                requests.append(GenerationRequest(fp.tree.prefix_ids(leaf), 1, params, seed, affinity=fp.index))
                owners.append((fp, [j]))
        gen_start = time.perf_counter()
        outputs = generator.sample(requests)
        stats.generator_seconds += time.perf_counter() - gen_start
        check_outputs(generator, requests, outputs)
        for (fp, chains), comps in zip(owners, outputs):
            fp.requests += 1
            _extend(fp, chains, comps, config, decode, eos_ids)
            stats.generated_tokens += sum(len(c.token_ids) for c in comps)
        still = []
        for fp in live:
            fp.rounds += 1
            if fp.open_chains():
                still.append(fp)
            else:
                results.append(_result(fp, config))
                stats.trees_done += 1
                stats.trajectories += n
        live[:] = still
        refill()
        stats.rounds += 1
        stats.requests += len(requests)
        stats.expansions += len(requests)
        stats.total_seconds += time.perf_counter() - round_start
        if progress is not None:
            progress(len(results))
    results.sort(key=lambda r: r.index)
    return results


def _extend(
    fp: _FlatProblem,
    chains: list[int],
    completions: Sequence[Completion],
    config: SearchConfig,
    decode: Decode,
    eos_ids: frozenset[int],
) -> None:
    """Append one step to each chain in `chains`; grade chains that ended."""
    tree = fp.tree
    fp.generated_tokens += sum(len(c.token_ids) for c in completions)
    if not fp.leaves:  # the first round's n completions are the root's n children
        flags = [step_end(c, 1, config.max_depth, eos_ids) for c in completions]
        fp.leaves = tree.add_children(ROOT, completions, [t for t, _ in flags])
        ends = [(leaf, e) for leaf, (_, e) in zip(fp.leaves, flags)]
    else:
        ends = []
        for j, completion in zip(chains, completions):
            leaf = fp.leaves[j]
            terminal, e = step_end(completion, tree.depth[leaf] + 1, config.max_depth, eos_ids)
            (child,) = tree.add_children(leaf, [completion], [terminal])
            fp.leaves[j] = child
            ends.append((child, e))
    for node, e in ends:
        if tree.terminal[node]:
            grade_terminal(tree, node, fp.problem, decode, e, config)
            reward = tree.reward[node]
            assert reward is not None
            for step_node in tree.path(node)[1:]:  # every node carries the outcome (DAPO)
                tree.value[step_node] = reward
                tree.visits[step_node] = 1


def _result(fp: _FlatProblem, config: SearchConfig) -> TreeResult:
    tree = fp.tree
    for j, leaf in enumerate(fp.leaves):
        tree.backup_index[leaf] = j
    return TreeResult(
        index=fp.index,
        problem_id=fp.problem.id,
        prompt_ids=fp.problem.prompt_ids,
        trajectories=tuple(build_trajectory(tree, leaf, config, mode="flat") for leaf in fp.leaves),
        status="complete",
        stats=TreeStats(
            expansions=fp.requests,
            nodes=len(tree),
            generated_tokens=fp.generated_tokens,
            max_depth=max(tree.depth),
            terminals=len(fp.leaves),
            rounds=fp.rounds,
            wall_seconds=time.perf_counter() - fp.started,
        ),
        config=config,
        tree=tree,
        mode="flat",
    )
