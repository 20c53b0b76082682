"""Hand-worked examples for every search rule (deepsearch.md §1-6, rest-mcts-and-countdown.md §B)."""

from __future__ import annotations

import doctest
import math
import random

import pytest

import flywheel.search.backup as backup_mod
import flywheel.search.expansion as expansion_mod
import flywheel.search.rollout as rollout_mod
import flywheel.search.selection as selection_mod
import flywheel.search.terminal as terminal_mod
import flywheel.search.values as values_mod
from flywheel.generation.base import Completion
from flywheel.rewards import Verdict
from flywheel.search.backup import backup_trajectory, constrained_update, time_decay_weight, vanilla_update
from flywheel.search.config import RolloutSettings, SearchAblations, SearchConfig
from flywheel.search.rule_table import FORK, SELECTION
from flywheel.search.selection import (
    ForkSettings,
    FrontierSettings,
    PuctSettings,
    UctSettings,
    depth_bonus,
    descend_puct,
    descend_uct,
    frontier_score,
    local_uct_select,
    puct_score,
    select_frontier,
    sequence_priors,
    uct_score,
)
from flywheel.search.terminal import choose_terminals, is_terminal_step, terminal_kind, terminal_reward
from flywheel.search.tree import SearchTree
from flywheel.search.values import overlong_penalty, soft_clip


def step(tokens=(9,), logprob=-1.0, finish="length", entropies=None) -> Completion:
    return Completion(tuple(tokens), (logprob,) * len(tokens), finish, entropies)


@pytest.mark.parametrize("module", [backup_mod, selection_mod, terminal_mod, values_mod, expansion_mod, rollout_mod])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------------------- backup §4
def test_time_decay_weights_paper_and_code():
    # paper: gamma(i, l) = max(i / l, 0.1); l = 4 -> 0.1 (0/4 floored), 0.25, 0.5, 0.75, 1
    assert [time_decay_weight(i, 4, 0.1) for i in range(5)] == [0.1, 0.25, 0.5, 0.75, 1.0]
    # code: max((i + 1) / (l + 1), 0.1); l = 4 -> 1/5, 2/5, 3/5, 4/5, 1
    assert [time_decay_weight(i, 4, 0.1, "code") for i in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    # the floor bites for long paths: l = 20, i = 1 -> max(0.05, 0.1) = 0.1
    assert time_decay_weight(1, 20, 0.1) == 0.1


def test_constrained_update_cases():
    assert constrained_update(0.0, -1.0, 0.5) == -0.5  # 0 * r = 0 counts as same sign: add
    assert constrained_update(-0.5, -1.0, 0.5) == -1.0  # same sign: add
    assert constrained_update(-0.7, 1.0, 0.25) == 0.25  # correct overwrites a negative
    assert constrained_update(0.3, -1.0, 1.0) == 0.3  # a success is never undone
    assert constrained_update(0.3, 1.0, 0.5) == 0.8


def test_vanilla_update_cases():
    assert vanilla_update(-0.7, 1.0, 0.25) == 0.0  # max(-0.45, 0)
    assert vanilla_update(-0.2, 1.0, 0.5) == pytest.approx(0.3)  # max(0.3, 0)
    assert vanilla_update(0.3, -1.0, 0.5) == 0.0  # max(-0.2, 0)
    assert vanilla_update(0.0, -1.0, 0.5) == -0.5  # same sign (0): add


def _path_tree() -> tuple[SearchTree, int, int, int]:
    """root(0) -> a(1) -> {t1(2), t2(3)}, both terminal; a is non-terminal (N = 1 from creation)."""
    tree = SearchTree((0,))
    (a,) = tree.add_children(0, [step()], [False])
    t1, t2 = tree.add_children(a, [step(finish="eos"), step(finish="eos")], [True, True])
    return tree, a, t1, t2


def test_three_node_path_backed_up_with_minus_one_then_plus_one():
    tree, a, t1, t2 = _path_tree()
    cfg = SearchConfig()
    # Backup 1: t1 with r = -1, l = 2. gammas: root max(0/2, 0.1) = 0.1, a 1/2, t1 2/2 = 1.
    #   root: 0 -1*0.1 = -0.1; a: 0 - 0.5 = -0.5; t1: -1.
    backup_trajectory(tree, t1, -1.0, cfg)
    assert [tree.value[n] for n in (0, a, t1)] == pytest.approx([-0.1, -0.5, -1.0])
    assert [tree.visits[n] for n in (0, a, t1)] == [1, 2, 1]  # a: 1 at creation + 1
    # Backup 2: t2 with r = +1, same gammas. Signs differ and r > 0: overwrite with gamma * r.
    #   root: 0.1 * 1 = 0.1; a: 0.5; t2: 1.
    backup_trajectory(tree, t2, 1.0, cfg)
    assert [tree.value[n] for n in (0, a, t2)] == pytest.approx([0.1, 0.5, 1.0])
    assert [tree.visits[n] for n in (0, a, t1, t2)] == [2, 3, 1, 1]
    assert tree.value[t1] == -1.0  # a sibling's value is untouched
    # Q = q / N: root 0.1 / 2 = 0.05, a 0.5 / 3
    assert tree.mean_q(0) == pytest.approx(0.05)
    assert tree.mean_q(a) == pytest.approx(0.5 / 3)


def test_three_node_path_plus_one_then_minus_one_keeps_positive():
    tree, a, t1, t2 = _path_tree()
    cfg = SearchConfig()
    backup_trajectory(tree, t1, 1.0, cfg)  # root 0.1, a 0.5, t1 1
    backup_trajectory(tree, t2, -1.0, cfg)  # q_old > 0, r < 0: unchanged; t2 = -1
    assert [tree.value[n] for n in (0, a, t1, t2)] == pytest.approx([0.1, 0.5, 1.0, -1.0])


def test_three_node_path_vanilla_update_ablation():
    tree, a, t1, t2 = _path_tree()
    cfg = SearchConfig(backup="vanilla")
    backup_trajectory(tree, t1, -1.0, cfg)  # root -0.1, a -0.5
    # r = +1: root max(-0.1 + 0.1, 0) = 0, a max(-0.5 + 0.5, 0) = 0
    backup_trajectory(tree, t2, 1.0, cfg)
    assert [tree.value[n] for n in (0, a, t2)] == pytest.approx([0.0, 0.0, 1.0])


def test_code_gamma_rule_backup():
    tree, a, t1, _ = _path_tree()
    # code: root (0+1)/(2+1) = 1/3, a 2/3, t1 1
    backup_trajectory(tree, t1, 1.0, SearchConfig(gamma_rule="code"))
    assert [tree.value[n] for n in (0, a, t1)] == pytest.approx([1 / 3, 2 / 3, 1.0])


# ----------------------------------------------------------------------------- terminals §1-3
def test_terminal_condition():
    assert is_terminal_step("eos", 1, 64)
    assert not is_terminal_step("stop", 63, 64)  # a delimiter step is an ordinary step
    assert not is_terminal_step("length", 63, 64)  # a capped step too
    assert is_terminal_step("length", 64, 64)


@pytest.mark.parametrize(
    "verdict, eos, kind, reward",
    [
        (Verdict(True, 1.0, "4", "correct"), True, "correct", 1.0),
        (Verdict(True, 1.0, "4", "correct"), False, "correct", 1.0),  # cut at d_T, answer still right
        (Verdict(False, -1.0, "5", "wrong_value"), False, "incorrect", -1.0),  # cut, wrong answer
        (Verdict(False, -1.0, None, "no_answer"), False, "incomplete", -0.5),  # cut, no answer
        (Verdict(False, -1.0, None, "no_answer"), True, "incorrect", -1.0),  # EOS without an answer
        (Verdict(False, 0.2, "7", "dense"), True, "incorrect", 0.2),  # a task's dense reward is kept
    ],
)
def test_terminal_kind_and_reward(verdict, eos, kind, reward):
    assert terminal_kind(verdict, emitted_eos=eos) == kind
    assert terminal_reward(kind, verdict, incomplete_reward=-0.5) == reward


def test_choose_terminals_priority_and_confidence():
    ids = [10, 11, 12, 13]
    # no correct -> incorrect ones (11, 13), the lowest mean NLL 0.3 wins
    assert choose_terminals(ids, ["incomplete", "incorrect", "incomplete", "incorrect"], [0.1, 0.9, 0.2, 0.3]) == [13]
    # a correct one beats any incorrect, however confident
    assert choose_terminals(ids, ["incorrect", "correct", "incorrect", "correct"], [0.0, 5.0, 0.0, 4.0]) == [13]
    # only incomplete: the most confident of them
    assert choose_terminals(ids[:2], ["incomplete", "incomplete"], [0.5, 0.4]) == [11]
    # NaN sorts last; ties go to the lowest id
    assert choose_terminals(ids[:3], ["incorrect"] * 3, [math.nan, 0.5, 0.5]) == [11]
    assert choose_terminals([], [], []) == []


def test_choose_terminals_back_up_all_and_random():
    ids = [1, 2, 3, 4]
    kinds = ["incorrect", "correct", "incomplete", "correct"]
    assert choose_terminals(ids, kinds, [0.1, 0.7, 0.0, 0.2], back_up_all=True) == [4, 2, 1, 3]
    picks = {choose_terminals(ids, kinds, [0.0] * 4, rule="random", rng=random.Random(s))[0] for s in range(40)}
    assert picks == {2, 4}  # random only within the best kind
    a = choose_terminals(ids, kinds, [0.0] * 4, rule="random", rng=random.Random(3), back_up_all=True)
    b = choose_terminals(ids, kinds, [0.0] * 4, rule="random", rng=random.Random(3), back_up_all=True)
    assert a == b and set(a[:2]) == {2, 4} and a[2:] == [1, 3]


def test_trajectory_mean_nll_skips_nan_and_handles_empty():
    tree = SearchTree((0,))
    (a,) = tree.add_children(0, [Completion((5, 6), (-1.0, -3.0), "length")], [False])
    (b,) = tree.add_children(a, [Completion((7, 8), (math.nan, -2.0), "eos")], [True])
    # finite log-probs on the path: -1, -3, -2 -> mean NLL 2.0 (the NaN is skipped)
    assert tree.trajectory_mean_nll(b) == pytest.approx(2.0)
    empty = SearchTree((0,))
    (e,) = empty.add_children(0, [Completion((), (), "eos")], [True])
    assert empty.trajectory_mean_nll(e) == math.inf


# ----------------------------------------------------------------------------- selection §5
def test_uct_score_worked():
    # Q = 0.25, N(parent) = 8, N(c) = 2: 0.25 + 2 * sqrt(ln 8 / 2) = 0.25 + 2 * 1.0196 = 2.2892
    assert uct_score(0.25, 8, 2, 2.0) == pytest.approx(0.25 + 2 * math.sqrt(math.log(8) / 2))
    assert uct_score(0.25, 1, 2, 2.0) == 0.25  # ln 1 = 0


def _root_with_children(k: int, terminal=None) -> SearchTree:
    tree = SearchTree((0,))
    tree.add_children(0, [step((9 + i,)) for i in range(k)], terminal or [False] * k)
    return tree


def test_local_uct_prefers_unvisited_bonus_and_skips_terminals():
    tree = _root_with_children(3, [False, False, True])
    cfg = UctSettings()
    rng = random.Random(0)
    # root N = 4; child 1: q = 0.5, N = 2 -> 0.25 + 2 sqrt(ln4/2) = 1.915
    # child 2: q = 0, N = 1 -> 0 + 2 sqrt(ln4) = 2.355 -> child 2 wins; child 3 is terminal
    tree.visits[0] = 4
    tree.value[1], tree.visits[1] = 0.5, 2
    assert local_uct_select(tree, 0, cfg, rng) == 2
    tree.value[1], tree.visits[1] = 2.0, 2  # 1.0 + 1.665 = 2.665 > 2.355
    assert local_uct_select(tree, 0, cfg, rng) == 1
    # fresh siblings tie (Q = 0, ln N(parent) = 0): the lowest id
    fresh = _root_with_children(4)
    assert local_uct_select(fresh, 0, cfg, rng) == 1
    # all children terminal: nothing to choose
    assert local_uct_select(_root_with_children(2, [True, True]), 0, cfg, rng) is None


def test_local_uct_softmax_is_seeded():
    tree = _root_with_children(4)
    cfg = UctSettings(sampling="softmax")
    picks_a = [local_uct_select(tree, 0, cfg, random.Random(s)) for s in range(30)]
    picks_b = [local_uct_select(tree, 0, cfg, random.Random(s)) for s in range(30)]
    assert picks_a == picks_b and len(set(picks_a)) > 1


def test_depth_bonus_variants():
    assert depth_bonus(16, 64, "sqrt") == 0.5
    assert depth_bonus(5, 64, "linear") == 5.0
    assert depth_bonus(math.e**2 - 1, 64, "log") == pytest.approx(2.0)


def test_frontier_score_worked():
    cfg = FrontierSettings(max_depth=4)
    # 0.4 * tanh(-0.5) + 0.01 * sqrt(2 / 4) = -0.184846 + 0.007071 = -0.177775
    assert frontier_score(-0.5, math.nan, 2, cfg) == pytest.approx(-0.177775, abs=1e-6)
    # lambda2 on: + 0.5 * H; H = NaN adds nothing
    cfg2 = FrontierSettings(max_depth=4, lambda2=0.5)
    assert frontier_score(0.0, 1.2, 1, cfg2) == pytest.approx(0.6 + 0.005)
    assert frontier_score(0.0, math.nan, 1, cfg2) == pytest.approx(0.005)


def _frontier_tree() -> SearchTree:
    """root -> P1(1), P2(2); P1 -> X(3), X'(4); d_T = 4. Frontier: P2 (parent root), X, X' (parent P1)."""
    tree = SearchTree((0,))
    tree.add_children(0, [step((5,)), step((6,))], [False, False])
    tree.add_children(1, [step((7,), logprob=-2.0), step((8,), logprob=-0.1)], [False, False])
    return tree


def test_select_frontier_worked():
    tree = _frontier_tree()
    cfg = FrontierSettings(max_depth=4)
    # Q(root) = 0 -> P2: 0.4 * tanh(0) + 0.01 * sqrt(1/4) = 0.005
    # Q(P1) = -0.5 (q = -1, N = 2) -> X: 0.4 * tanh(-0.5) + 0.01 * sqrt(2/4) = -0.1778
    tree.value[1], tree.visits[1] = -1.0, 2
    assert select_frontier(tree, cfg) == 2
    # Q(P1) = +0.5 -> X: 0.4 * 0.4621 + 0.0071 = 0.1920 > 0.005; X and X' tie -> lowest id X
    tree.value[1] = 1.0
    assert select_frontier(tree, cfg) == 3
    # lambda2 = 1 adds each node's step mean NLL: X 2.0, X' 0.1, P2 1.0. At Q(P1) = -0.5:
    # X: -0.1778 + 2.0 = 1.822 > P2: 0.005 + 1.0 = 1.005 > X': -0.1778 + 0.1
    tree.value[1] = -1.0
    assert select_frontier(tree, FrontierSettings(max_depth=4, lambda2=1.0)) == 3
    # equal parents' Q: the depth bonus makes the deeper node win
    tree.value[1] = 0.0
    assert select_frontier(tree, cfg) == 3
    # nothing non-terminal and childless: None
    dead = _root_with_children(2, [True, True])
    assert select_frontier(dead, cfg) is None


def test_frontier_never_offers_expanded_or_terminal_nodes():
    tree = _frontier_tree()
    assert tree.frontier == {0: [2], 1: [3, 4]}
    tree.add_children(3, [step(finish="eos"), step()], [True, False])
    assert tree.frontier == {0: [2], 1: [4], 3: [6]}


def test_descend_uct_from_root():
    tree = _frontier_tree()
    cfg = UctSettings()
    # root N = 0 -> both children score Q = 0: P1 (id 1) by tie; P1 has children, descend:
    # X, X' fresh -> X (id 3), a leaf
    assert descend_uct(tree, cfg, random.Random(0)) == 3
    tree.value[1], tree.visits[1] = -1.0, 2  # Q(P1) = -0.5 < Q(P2) = 0
    assert descend_uct(tree, cfg, random.Random(0)) == 2


def test_sequence_priors_and_puct():
    priors = sequence_priors([-1.0, -1.0 + math.log(3.0), math.nan])
    assert priors == pytest.approx([0.25, 0.75, 0.0])
    assert sequence_priors([-math.inf, math.nan]) == [0.5, 0.5]
    # Q = 0.1, P = 0.75, N(parent) = 9, N = 2: 0.1 + 0.5 * 0.75 * 3 / 3 = 0.475
    assert puct_score(0.1, 0.75, 9, 2, 0.5) == pytest.approx(0.475)
    assert puct_score(0.0, 0.5, 0, 1, 0.5) == pytest.approx(0.125)  # sqrt(max(0, 1)) = 1


def test_descend_puct_follows_prior_then_value():
    tree = SearchTree((0,))
    # two root children with summed log-probs -2 and -0.5: priors 0.18, 0.82
    kids = [Completion((5, 5), (-1.0, -1.0), "length"), Completion((6,), (-0.5,), "length")]
    tree.add_children(0, kids, [False, False])
    cfg = PuctSettings()
    assert descend_puct(tree, cfg) == 2
    # root N = 0 -> sqrt(max(0, 1)) = 1: child 1 0.5 * 0.18 / 2 = 0.046 < child 2 0.5 * 0.82 / 2 = 0.204
    # then child 2 fails badly: q = -3, N = 2 -> -1.5 + 0.5 * 0.82 / 3 = -1.364 < 0.046
    tree.value[2], tree.visits[2] = -3.0, 2
    assert descend_puct(tree, cfg) == 1


def test_each_rule_is_bound_to_its_own_settings_read_from_the_flags():
    cfg = SearchConfig(max_depth=9, uct_lambda=1.5, frontier_lambda2=0.3, puct_c=0.7, prm_weight=0.2,
                       ablations=SearchAblations(depth_bonus="log", uct_sampling="softmax"))
    uct = UctSettings(lam=1.5, value_weight=0.2, sampling="softmax")
    assert SELECTION["frontier"].settings(cfg) == FrontierSettings(0.4, 0.3, 0.01, "log", 9, 0.2, uct)
    assert SELECTION["vanilla_uct"].settings(cfg) == uct
    assert SELECTION["puct"].settings(cfg) == PuctSettings(c=0.7, value_weight=0.2)
    rollout = SearchConfig(expansion="rollout", fork_rule="entropy", max_depth=9,
                           rollout=RolloutSettings(max_children=3, entropy_forks_per_chain=4))
    entropy = FORK["entropy"].settings(rollout)
    assert (entropy.open, entropy.per_chain) == (ForkSettings(max_depth=9, max_children=3), 4)
    # bound once: the tree calls the rule without any config
    tree = _frontier_tree()
    tree.value[1], tree.visits[1] = -1.0, 2
    assert SELECTION["frontier"].bind(SearchConfig(max_depth=4))(tree, 1, True, random.Random(0)) == 2


# ---------------------------------------------------------------------------- values §2, §6
def test_soft_clip():
    assert soft_clip(0.0) == 0.0
    assert soft_clip(0.5) == pytest.approx(math.tanh(0.5))  # 0.4621
    assert soft_clip(3.0, eps_q=2.0, q_max=0.5) == pytest.approx(0.5 * math.tanh(1.5))
    # tanh(1) = 0.761594 and tanh(-1) = -0.761594; tanh(-2 / 2) * 0.5 = -0.380797
    assert soft_clip(1.0) == pytest.approx(0.761594, abs=1e-6)
    assert soft_clip(-1.0) == pytest.approx(-0.761594, abs=1e-6)
    assert soft_clip(-2.0, eps_q=2.0, q_max=0.5) == pytest.approx(-0.380797, abs=1e-6)
    # q is a sum of many backups; q = 5 still stays below q_max: tanh(5) = 0.999909
    assert soft_clip(5.0) == pytest.approx(0.999909, abs=1e-6)


@pytest.mark.parametrize(
    "length, expected",
    [
        (0, 0.0),  # far below the ramp
        (1000, 0.0),
        (12288, 0.0),  # L_max - L_buf = 16384 - 4096: the ramp starts here, still 0
        (13312, -0.25),  # -(13312 - 12288) / 4096 = -1024 / 4096
        (14336, -0.5),  # -(14336 - 12288) / 4096 = -2048 / 4096
        (16384, -1.0),  # -(16384 - 12288) / 4096 = -1
        (20480, -2.0),  # the formula as written keeps falling past L_max: -8192 / 4096
    ],
)
def test_overlong_penalty(length, expected):
    assert overlong_penalty(length) == pytest.approx(expected)


def test_overlong_penalty_small_budget():
    # L_max = 100, L_buf = 20: the ramp starts at 80; L = 90 -> -(90 - 80) / 20 = -0.5
    assert overlong_penalty(90, max_tokens=100, buffer_tokens=20) == pytest.approx(-0.5)
    # L_max = 40, L_buf = 20: ramp from 20; L = 30 -> -(30 - 20) / 20 = -0.5
    assert overlong_penalty(30, max_tokens=40, buffer_tokens=20) == pytest.approx(-0.5)


# ------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"selection": "bfs"}, "search.selection must be one of"),
        ({"expansion_width": 0}, "search.expansion_width must be >= 1"),
        ({"max_depth": 0}, "search.max_depth must be >= 1"),
        ({"gamma_min": 0.0}, "search.gamma_min"),
        ({"overlong_buffer_tokens": 0}, "overlong_penalty=false"),
        ({"overlong_buffer_tokens": 20000}, "overlong_penalty=false"),  # above overlong_max_tokens
        ({"soft_clip_eps": 0.0}, "search.soft_clip_eps"),
        ({"soft_clip_qmax": -1.0}, "search.soft_clip_qmax"),
        ({"terminal_choice": "entropy", "entropy_top_k": 0}, "entropy_top_k"),
        ({"top_p": 0.0}, "search.top_p"),
    ],
)
def test_config_validation_names_the_field(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SearchConfig(**kwargs)


def test_an_ablation_switch_is_checked_in_its_group():
    with pytest.raises(ValueError, match=r"--data\.search\.ablations\.depth_bonus must be one of \('sqrt', 'linear', "
                                         r"'log'\), got 'cubic'"):
        SearchAblations(depth_bonus="cubic")


def test_config_defaults_are_the_paper():
    cfg = SearchConfig()
    assert (cfg.expansion_width, cfg.max_depth, cfg.trajectories_per_tree) == (8, 64, 8)
    assert (cfg.uct_lambda, cfg.frontier_lambda1, cfg.frontier_lambda2, cfg.frontier_lambda3) == (2.0, 0.4, 0.0, 0.01)
    assert (cfg.ablations.depth_bonus, cfg.selection, cfg.backup, cfg.gamma_min, cfg.gamma_rule) == (
        "sqrt", "frontier", "constrained", 0.1, "paper",
    )
    assert (cfg.overlong_max_tokens, cfg.overlong_buffer_tokens, cfg.soft_clip_eps, cfg.soft_clip_qmax) == (
        16384, 4096, 1.0, 1.0,
    )
    assert SearchConfig(overlong_penalty=False, overlong_buffer_tokens=0).overlong_buffer_tokens == 0
