"""Flat rollouts for the baselines (DAPO / GRPO, best-of-N) in the search's output format.

n independent responses per problem, sampled whole: one request of n samples per problem (with
room for `config.max_depth` steps of the task's step cap), each response cut into steps
afterwards as the step rule would have sampled them (rollout.split_steps: at the delimiter or
the cap; tokens past the max_depth-th step are dropped, but counted as generated). An
environment's episode goes turn by turn instead (one generator call a turn for every episode
still going), since each action waits for the environment's answer. Problems run in
flywheel.search.lockstep's loop, shared with the tree search. The result is a TreeResult (mode
"flat") whose root has n chains, graded at their ends and never backed up: a flat group is
credited by its outcomes (DAPO, `ROLLOUTS["flat"]` in flywheel.objectives.credit).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from flywheel.generation.base import Completion, GenerationRequest, Generator, SamplingParams
from flywheel.search.config import MAX_CONCURRENT_TREES, SearchConfig
from flywheel.search.expansion import (Decode, SearchProblem, StepEnds, child_ends, derive_seed, emitted_eos,
                                       grade_terminal, rollout_sampling_params, step_sampling_params)
from flywheel.search.lockstep import DriverStats, Lockstep, sample
from flywheel.search.outputs import TreeResult, TreeStats, build_trajectory
from flywheel.search.rollout import insert_path, split_steps
from flywheel.search.tree import ROOT, SearchTree
from flywheel.tasks.base import StepSpec


@dataclass(frozen=True)
class Whole:
    """How a flat response is sampled whole and cut into the task's steps."""

    params: SamplingParams
    """Room for max_depth steps of the step cap, no stop string (rollout_sampling_params)."""
    step: StepSpec
    ends_step: StepEnds


class _FlatProblem:
    """One problem's n responses, a member of the lock-step loop (flywheel.search.lockstep)."""

    def __init__(
        self, index: int, problem: SearchProblem, n: int, params: SamplingParams, config: SearchConfig,
        decode: Decode, eos_ids: frozenset[int], seed: tuple[int, int] | None = None, whole: Whole | None = None,
    ) -> None:
        self.index = index
        self.seed = seed if seed is not None else (config.seed, index)
        """What its request seeds derive from: (the config's seed, its index), or its own."""
        self.problem = problem
        self.n = n
        self.params = params
        self.config = config
        self.decode = decode
        self.eos_ids = eos_ids
        self.whole = whole if problem.respond is None else None
        """How a whole response is requested and cut into steps; None: an episode, turn by turn."""
        self.tree = SearchTree(problem.prompt_ids)
        self.leaves: list[int] = []  # chain j's current last node; ROOT before the first round
        self.chains: list[list[int]] = []  # per request of this round: the chains it feeds
        self.rounds = 0
        self.requests_made = 0
        self.generated_tokens = 0
        self.started = time.perf_counter()

    def open_chains(self) -> list[int]:
        return [j for j, leaf in enumerate(self.leaves) if not self.tree.terminal[leaf]]

    def requests(self) -> list[GenerationRequest]:
        tree = self.tree
        if not self.leaves:  # first round: n samples of the prompt in one request (whole ones but for an episode)
            self.chains = [list(range(self.n))]
            params = self.whole.params if self.whole is not None else self.params
            return [GenerationRequest(tree.prompt_ids, self.n, params, derive_seed(*self.seed, 0), affinity=self.index)]
        self.chains = [[j] for j in self.open_chains()]
        return [
            GenerationRequest(tree.prefix_ids(self.leaves[j]), 1, self.params,
                              derive_seed(*self.seed, tree.depth[self.leaves[j]], j), affinity=self.index)
            for (j,) in self.chains
        ]

    def absorb(self, outputs: Sequence[Sequence[Completion]]) -> None:
        for chains, comps in zip(self.chains, outputs, strict=True):
            self.requests_made += 1
            _extend(self, chains, comps, self.config, self.decode, self.eos_ids)
        self.rounds += 1

    @property
    def done(self) -> bool:
        return not self.open_chains()

    def result(self) -> TreeResult:
        return _result(self, self.config)


def flat_rollouts(
    problems: Iterable[SearchProblem],
    generator: Generator,
    *,
    n: int,
    step: StepSpec,
    decode: Decode,
    config: SearchConfig = SearchConfig(),
    max_concurrent_problems: int = MAX_CONCURRENT_TREES,
    eos_token_ids: Iterable[int] = (),
    stats: DriverStats | None = None,
    progress: Callable[[int], None] | None = None,
    seeds: Sequence[int] | None = None,
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
        seeds: one per problem, what its request seeds derive from instead of (config.seed,
            its index): the same samples of a problem wherever it stands in the input.
    """
    if n < 1:
        raise ValueError(f"flat rollouts need n >= 1, got {n}")
    if max_concurrent_problems < 1:
        raise ValueError(f"max_concurrent_problems must be >= 1, got {max_concurrent_problems}")
    params = step_sampling_params(step, config)
    whole = Whole(rollout_sampling_params(step, config, depth=0), step, StepEnds(step, decode))
    eos_ids = frozenset(eos_token_ids)
    groups = (_FlatProblem(i, p, n, params, config, decode, eos_ids, None if seeds is None else (seeds[i], 0), whole)
              for i, p in enumerate(problems))
    finished = 0

    def on_round(live: list[_FlatProblem], ended: list[_FlatProblem]) -> None:
        nonlocal finished
        finished += len(ended)
        if progress is not None:
            progress(finished)

    stats = stats if stats is not None else DriverStats()

    def one_round(live: list[_FlatProblem]) -> None:
        """Every open response of every live problem sampled in one generator call, then each extended."""
        for group, outputs in zip(live, sample(generator, [group.requests() for group in live], stats)):
            group.absorb(outputs)

    loop = Lockstep(groups, max_live=max_concurrent_problems, round=one_round, stats=stats, on_round=on_round)
    return sorted(loop, key=lambda r: r.index)


def _extend(
    fp: _FlatProblem,
    chains: list[int],
    completions: Sequence[Completion],
    config: SearchConfig,
    decode: Decode,
    eos_ids: frozenset[int],
) -> None:
    """Append one step to each chain in `chains` (whole responses: all of their steps); grade
    chains that ended."""
    tree = fp.tree
    fp.generated_tokens += sum(len(c.token_ids) for c in completions)
    if fp.whole is not None:  # n whole responses, each the root's chain of its steps, terminal at its end
        ends = []
        for completion in completions:
            pieces = split_steps(completion, fp.whole.step, fp.whole.ends_step, config.max_depth)
            leaf, _ = insert_path(tree, ROOT, pieces, True, merge=False)
            fp.leaves.append(leaf)
            ends.append((leaf, emitted_eos(pieces[-1], eos_ids)))  # False when the cut at max depth dropped the end
    elif not fp.leaves:  # the first round's n completions are the root's n children
        flags, turns = child_ends(tree, ROOT, completions, fp.problem, decode, config.max_depth, eos_ids)
        fp.leaves = tree.add_children(ROOT, completions, [t for t, _ in flags], turns=turns)
        ends = [(leaf, e) for leaf, (_, e) in zip(fp.leaves, flags)]
    else:
        ends = []
        for j, completion in zip(chains, completions):
            leaf = fp.leaves[j]
            ((terminal, e),), turns = child_ends(tree, leaf, [completion], fp.problem, decode, config.max_depth, eos_ids)
            (child,) = tree.add_children(leaf, [completion], [terminal], turns=turns)
            fp.leaves[j] = child
            ends.append((child, e))
    for node, e in ends:
        if tree.terminal[node]:
            grade_terminal(tree, node, fp.problem, decode, e, config)


def _result(fp: _FlatProblem, config: SearchConfig) -> TreeResult:
    tree = fp.tree
    for j, leaf in enumerate(fp.leaves):
        tree.backup_index[leaf] = j
    return TreeResult(
        index=fp.index,
        problem_id=fp.problem.id,
        prompt_ids=fp.problem.prompt_ids,
        trajectories=tuple(build_trajectory(tree, leaf, config) for leaf in fp.leaves),
        status="complete",
        stats=TreeStats(
            expansions=fp.requests_made,
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


def flat_responses(result: TreeResult) -> tuple[Completion, ...]:
    """A flat group's responses as whole completions, in chain order: each chain's steps joined
    (tokens, log-probs, entropies when every step has them), ending as its last step ended.
    What a rollout-expansion tree starts from (`SearchProblem.first_rollouts`,
    `--data.batching.flat_first`); cut into steps again there, they give back the chain's steps."""
    tree = result.tree
    out = []
    for trajectory in result.trajectories:
        path = tree.path(trajectory.terminal_id)[1:]
        entropies = [tree.entropies[v] for v in path]
        out.append(Completion(
            trajectory.response_ids, trajectory.response_logprobs, tree.finish[path[-1]] or "stop",  # type: ignore[arg-type]
            None if any(e is None for e in entropies) else tuple(x for e in entropies for x in e),  # type: ignore[union-attr]
        ))
    return tuple(out)
