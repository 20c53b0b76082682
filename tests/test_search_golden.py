"""Fixed-seed searches pinned bit for bit: the search's outputs must not change when its
bookkeeping is made faster (issue 18). Each case runs a multi-tree search on HashGenerator
(a pure function of the request seeds) and hashes every tree's full state (structure,
statistics, graded terminals, the frontier) and every trained trajectory (floats by repr,
so any change in a value or an order changes the digest). A digest here changes only
when a search rule changes on purpose; then re-pin it and say why in the commit."""

from __future__ import annotations

import hashlib

import pytest

from flywheel.search.config import SearchAblations
from flywheel.search import SearchConfig, SearchProblem, run_search
from scripted import HashGenerator, toy_decode, toy_score
from flywheel.tasks.base import StepSpec


def tree_state(tree) -> tuple:
    return (
        tree.parent, tree.children, tree.depth, tree.visits, tree.value, tree.prm_value, tree.tokens,
        tree.logprobs, tree.entropies, tree.finish, tree.path_nll_sum, tree.path_nll_count,
        tree.path_entropy_sum, tree.path_length, tree.terminal, tree.kind, tree.reward, tree.backup_index,
        tree.expanded, tree.dead, tree.live_children, sorted(tree.frontier.items()), sorted(tree.texts.items()),
        tree.observation,
        sorted((k, (v.correct, v.reward, v.answer, v.reason)) for k, v in tree.verdicts.items()),
    )


def digest(results) -> str:
    h = hashlib.sha256()
    for r in results:
        stats = (r.stats.expansions, r.stats.nodes, r.stats.generated_tokens, r.stats.max_depth, r.stats.terminals,
                 r.stats.rounds, r.stats.tokens_to_first_correct)
        h.update(repr((r.index, r.problem_id, r.status, stats, r.trajectories, tree_state(r.tree))).encode())
    return h.hexdigest()[:16]


CASES = {
    # name: (SearchConfig overrides, step, eos_prob, pinned digest)
    "frontier": ({}, StepSpec(4, delimiter="\n"), 0.15, "3c402df7c209ada4"),
    "frontier_lambda2_log": ({"frontier_lambda2": 0.3, "ablations": SearchAblations(depth_bonus="log"), "backup": "vanilla",
                              "gamma_rule": "code"},
                             StepSpec(6), 0.1, "948053618c4558db"),
    "vanilla_uct_softmax": ({"selection": "vanilla_uct", "ablations": SearchAblations(uct_sampling="softmax")}, StepSpec(4, delimiter="\n"),
                            0.15, "904f8918894bfd2e"),
    "puct_random": ({"selection": "puct", "terminal_choice": "random"}, StepSpec(4, delimiter="\n"), 0.2,
                    "c916d50210203bbe"),
    "merge_backup_all_train_all": ({"merge_duplicate_steps": True, "ablations": SearchAblations(
        backup_all_terminals=True, train_all_terminals=True)}, StepSpec(2), 0.25, "329970a936ad927a"),
    "entropy": ({"terminal_choice": "entropy"}, StepSpec(4, delimiter="\n"), 0.15, "7fb8c940cc91a9e0"),
    "rollout": ({"expansion": "rollout"}, StepSpec(4, delimiter="\n"), 0.1, "8012e7371eba7c54"),
    "puct_agents": ({"selection": "puct_agents"}, StepSpec(4, delimiter="\n"), 0.15, "b0922198634746d7"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixed_seed_search_is_pinned(name):
    overrides, step, eos_prob, pinned = CASES[name]
    cfg = SearchConfig(expansion_width=4, trajectories_per_tree=5, max_depth=10, seed=11, **overrides)
    problems = [SearchProblem((0, 40 + i), toy_score, id=str(i)) for i in range(12)]
    results = run_search(problems, HashGenerator(eos_prob, correct_prob=0.3, salt=5, nan_prob=0.05), cfg, step=step,
                         decode=toy_decode, max_concurrent_trees=5)
    assert sum(len(r.trajectories) for r in results) >= 12  # the searches did real work
    assert digest(results) == pinned
