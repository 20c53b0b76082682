"""Invariants of the search, checked with hypothesis on random trees and random searches."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.search.config import SearchAblations
from flywheel.generation.base import Completion
from flywheel.search import SearchConfig, run_search
from flywheel.search.backup import backup_trajectory
from flywheel.search.driver import SearchProblem
from flywheel.search.rule_table import SELECTION
from scripted import HashGenerator, toy_decode, toy_score
from flywheel.search.selection import FrontierSettings, PuctSettings, descend_puct, descend_uct, frontier_score, select_frontier
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec

SETTINGS = settings(max_examples=40, deadline=None)


def random_tree(seed: int, expansions: int, width: int, max_depth: int, terminal_prob: float) -> SearchTree:
    """Grow a tree by expanding random frontier leaves; children terminal at random or at max depth."""
    rng = random.Random(seed)
    tree = SearchTree((0,))
    leaves = [0]
    for _ in range(expansions):
        if not leaves:
            break
        node = leaves.pop(rng.randrange(len(leaves)))
        depth = tree.depth[node] + 1
        comps = [Completion((5,), (-rng.random() * 3,), "length") for _ in range(width)]
        terminal = [depth >= max_depth or rng.random() < terminal_prob for _ in range(width)]
        kids = tree.add_children(node, comps, terminal)
        leaves += [k for k, t in zip(kids, terminal) if not t]
    return tree


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    expansions=st.integers(1, 30),
    width=st.integers(1, 4),
    rewards=st.lists(st.sampled_from([1.0, -1.0, 0.5, -0.3]), min_size=1, max_size=30),
    gamma_rule=st.sampled_from(["paper", "code"]),
)
def test_constrained_backup_keeps_correct_paths_nonnegative(seed, expansions, width, rewards, gamma_rule):
    """Any sequence of backups (Eq. 5): a node that ever lay on a path backed up with r > 0 keeps
    q >= 0 forever; a terminal's value is exactly its reward; N counts the backups through it."""
    tree = random_tree(seed, expansions, width, max_depth=6, terminal_prob=0.4)
    terminals = [n for n in range(len(tree)) if tree.terminal[n]]
    if not terminals:
        return
    cfg = SearchConfig(gamma_rule=gamma_rule, max_depth=6)
    rng = random.Random(seed)
    rng.shuffle(terminals)
    on_correct: set[int] = set()
    through = [0] * len(tree)
    for terminal, reward in zip(terminals, rewards):
        backup_trajectory(tree, terminal, reward, cfg)
        path = tree.path(terminal)
        for node in path:
            through[node] += 1
        if reward > 0:
            on_correct.update(path)
        assert all(tree.value[n] >= 0 for n in on_correct)
        assert tree.value[terminal] == reward
    for node in range(len(tree)):
        initial = 1 if node and not tree.terminal[node] else 0
        assert tree.visits[node] == initial + through[node]


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    expansions=st.integers(0, 25),
    width=st.integers(1, 4),
    lambda2=st.sampled_from([0.0, 0.7]),
    bonus=st.sampled_from(["sqrt", "linear", "log"]),
)
def test_frontier_yields_a_childless_non_terminal_argmax(seed, expansions, width, lambda2, bonus):
    tree = random_tree(seed, expansions, width, max_depth=5, terminal_prob=0.3)
    rng = random.Random(seed)
    for node in range(len(tree)):  # arbitrary values
        tree.visits[node] += rng.randrange(3)
        tree.value[node] = rng.uniform(-2, 2)
    cfg = FrontierSettings(lambda2=lambda2, depth_bonus=bonus, max_depth=5)
    # brute force over every node of F = {non-terminal, no children, depth < d_T}, root excluded
    brute = [
        n
        for n in range(1, len(tree))
        if not tree.terminal[n] and not tree.children[n] and tree.depth[n] < cfg.max_depth
    ]
    picked = select_frontier(tree, cfg)
    if not brute:
        assert picked is None
        assert tree.dead[0] or len(tree) == 1
        return
    assert picked in brute
    score = {
        n: frontier_score(tree.mean_q(tree.parent[n]), tree.step_mean_nll(n), tree.depth[n], cfg) for n in brute
    }
    best = max(score.values())
    assert score[picked] == best and picked == min(n for n in brute if score[n] == best)
    # the descents reach the same kind of node
    for leaf in (descend_uct(tree, cfg.local, rng), descend_puct(tree, PuctSettings())):
        assert leaf in brute


@SETTINGS
@given(
    salt=st.integers(0, 1000),
    eos_prob=st.sampled_from([0.0, 0.05, 0.2, 0.6]),
    correct_prob=st.sampled_from([0.0, 0.3, 1.0]),
    width=st.integers(1, 4),
    k=st.integers(1, 5),
    max_depth=st.integers(1, 7),
    cap=st.integers(1, 40),
    selection=st.sampled_from([name for name, rule in SELECTION.items() if not rule.agents]),
    terminal_choice=st.sampled_from(["mean_nll", "random"]),
    backup_all=st.booleans(),
    nan_prob=st.sampled_from([0.0, 0.3]),
    trees=st.integers(1, 4),
    concurrency=st.integers(1, 3),
    delimiter=st.sampled_from([None, "\n"]),
)
def test_full_searches_keep_every_invariant(
    salt, eos_prob, correct_prob, width, k, max_depth, cap, selection, terminal_choice, backup_all, nan_prob,
    trees, concurrency, delimiter,
):
    cfg = SearchConfig(
        expansion_width=width, trajectories_per_tree=k, max_depth=max_depth, max_expansions_per_tree=cap,
        selection=selection, terminal_choice=terminal_choice, ablations=SearchAblations(backup_all_terminals=backup_all), seed=salt,
    )
    gen = HashGenerator(eos_prob, correct_prob, nan_prob=nan_prob, salt=salt, pool_size=8)
    problems = [SearchProblem((0, 9, i), toy_score, id=str(i)) for i in range(trees)]
    results = run_search(
        problems, gen, cfg, step=StepSpec(3, delimiter=delimiter), decode=toy_decode, max_concurrent_trees=concurrency
    )
    assert [r.index for r in results] == list(range(trees))
    assert gen.stats.requests == sum(r.stats.expansions for r in results)
    for res in results:
        tree = res.tree
        # exactly K trajectories for a finished tree; fewer only when flagged
        if res.status == "complete":
            assert len(res.trajectories) == k
        else:
            assert len(res.trajectories) < k
            assert res.status == "exhausted" or res.stats.expansions == cap
        assert res.stats.expansions <= cap
        # every expanded node was a non-terminal leaf with exactly n children (add_children
        # refuses to re-expand or to expand a terminal), depth < d_T
        for node in range(len(tree)):
            assert len(tree.children[node]) in (0, width)
            assert tree.depth[node] <= max_depth
            if tree.children[node]:
                assert not tree.terminal[node]
            if tree.terminal[node]:
                assert tree.kind[node] in ("correct", "incorrect", "incomplete")
            elif tree.depth[node] == max_depth:
                raise AssertionError("a node at max depth must be terminal")
        # visit counts: creation visit of non-terminal non-root nodes + backed-up terminals below
        backed = [t.terminal_id for t in res.trajectories]
        through = [0] * len(tree)
        for terminal in backed:
            for node in tree.path(terminal):
                through[node] += 1
        for node in range(len(tree)):
            initial = 1 if node and not tree.terminal[node] else 0
            assert tree.visits[node] == initial + through[node]
        # correct paths stay non-negative; terminals hold their reward; q~ in [-1, 1]
        for t in res.trajectories:
            assert t.steps[-1].q == t.reward and t.steps[-1].q_soft == t.reward
            if t.kind == "correct":
                assert all(s.q >= 0 for s in t.steps)
            assert all(-1.0 <= s.q_soft <= 1.0 for s in t.steps)
            assert [s.node_id for s in t.steps] == tree.path(t.terminal_id)[1:]
            assert t.backup_index == backed.index(t.terminal_id)
        assert sorted(tree.backup_index[n] for n in range(len(tree)) if tree.backup_index[n] >= 0) == list(
            range(len(backed))
        )
        # the frontier structure matches its definition
        frontier = sorted(n for kids in tree.frontier.values() for n in kids)
        assert frontier == [
            n for n in range(1, len(tree)) if not tree.terminal[n] and not tree.children[n]
        ]
        assert not math.isnan(tree.value[0])
