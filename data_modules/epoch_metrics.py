"""The scalars of one epoch's data generation: search shape, rewards and compute
(`search/*`, `compute/*`), logged once per epoch by the round protocol (callbacks.rounds)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from flywheel.generation.base import Generator
from flywheel.search.driver import DriverStats
from flywheel.search.outputs import TreeResult


def epoch_metrics(results: Sequence[TreeResult], stats: DriverStats, seconds: float, cumulative_tokens: int,
                  generator: Generator | None, answer_rules: Sequence[str] = (), **data: float) -> dict[str, float]:
    """`results`: the epoch's trees and flat groups on this rank; `stats`: their driver
    counters; `cumulative_tokens`: training tokens generated over the run, all ranks;
    `answer_rules`: the task's verifier rules (Task.answer_rules), each logged as
    `reward/answer_rule/<rule>`, the share of the epoch's trajectories whose answer it read
    (and `reward/answer_rule/none`: no answer read), so a policy that starts leaning on an
    unboxed fallback shows (issue 36); `data`: the curriculum's and the credit's counts,
    logged as `data/<name>`. An environment's epoch also logs its invalid actions (count and
    share of the actions answered) and the observation tokens it prefilled."""
    searched = [r for r in results if r.searched]
    trajectories = [t for r in results for t in r.trajectories]
    metrics = {
        "search/seconds": seconds,
        "search/trees": float(len(searched)),
        "search/trees_short": float(sum(not r.complete for r in searched)),
        "search/iterations_per_tree": sum(r.stats.expansions for r in searched) / max(len(searched), 1),
        "search/nodes_per_tree": sum(r.stats.nodes for r in searched) / max(len(searched), 1),
        # steps, not nodes: a rollout cut inside a step (fork_rule "entropy") has more nodes than steps
        "search/depth": sum(t.steps[-1].depth for t in trajectories if t.steps) / max(len(trajectories), 1),
        "search/max_depth": float(max((r.stats.max_depth for r in results), default=0)),
        "search/reward": sum(t.reward for t in trajectories) / max(len(trajectories), 1),
        "search/correct_fraction": sum(t.verdict.correct for t in trajectories) / max(len(trajectories), 1),
        "search/solved_fraction": sum(any(t.verdict.correct for t in r.trajectories) for r in results) / max(len(results), 1),
        "search/overhead_pct": stats.overhead_pct,
        "search/valued_nodes": float(stats.valued_nodes),
        "compute/generated_tokens": float(cumulative_tokens),
        "compute/epoch_generated_tokens": float(stats.generated_tokens),
        **{f"data/{name}": float(value) for name, value in data.items()},
    }
    if answer_rules:
        read = Counter(t.verdict.answer_rule or "none" for t in trajectories)
        for rule in (*answer_rules, "none"):
            metrics[f"reward/answer_rule/{rule}"] = read[rule] / max(len(trajectories), 1)
    actions = [turn for r in results for turn in r.tree.turns.values()]
    if actions:  # an environment's episodes: actions it answered "invalid", and the prefilled observation tokens
        metrics["search/invalid_actions"] = float(sum(turn.invalid for turn in actions))
        metrics["search/invalid_action_share"] = metrics["search/invalid_actions"] / len(actions)
        metrics["compute/epoch_observation_tokens"] = float(sum(len(o) for r in results for o in r.tree.observation))
    if stats.valued_nodes:
        metrics["search/prm_value_mean"] = stats.value_sum / stats.valued_nodes
    if generator is not None:
        g = generator.stats
        metrics["compute/prefill_tokens"] = float(g.prefill_tokens)
        metrics["compute/prompt_tokens"] = float(g.prompt_tokens)
        metrics["compute/prefill_saved_tokens"] = float(g.prompt_tokens - g.prefill_tokens)
        queries = g.extra.get("server_prefix_cache_queries")
        if queries is not None:  # a server's own counters: shared by every rank, so its own ratio
            metrics["compute/prefix_hit_rate"] = g.extra["server_prefix_cache_hits"] / queries if queries else 0.0
        else:
            metrics["compute/prefix_hit_rate"] = 1.0 - g.prefill_tokens / g.prompt_tokens if g.prompt_tokens else 0.0
    return metrics
