r"""The credit rules (flywheel/objectives/credit.py) on a hand-built tree and a hand-built
mixed rollout: every rule's per-token advantages, dropped trajectories kept in the group
baseline, the settings each rule refuses, and a rule registered by a test alone.

The tree (token ids in brackets, node ids in parentheses, q~ = the soft-clipped value):

    root -- A (1) [10 11]  q~ 0.6 -- A1 (3) [12 13 14]  correct,   reward +1
         |                        \- A2 (4) [15]        incorrect, reward -1
         \- B (2) [20]     q~ -0.4 -- B1 (5) [21 22]    incorrect, reward -1, overlong penalty -0.5

Trajectories T1 = A.A1 (final 1.0), T2 = A.A2 (final -1.0), T3 = B.B1 (final -1.5).
Tree mean mu = (1.0 - 1.0 - 1.5) / 3 = -0.5.
"""

import math

import re

import pytest

from flywheel.adaptive import CachedSolution
from flywheel.objectives import credit
from flywheel.objectives.credit import Credit, CreditRule, Group, check, check_loss, credit_groups, node_credit
from flywheel.objectives.self_training import PathWeighting
from flywheel.rewards import Verdict
from flywheel.search.config import SearchConfig
from flywheel.search.outputs import StepRecord, Trajectory, TreeResult

NAN = float("nan")
PROMPT = (1, 5, 6)


def step(node, depth, tokens, q_soft, logprobs=None):
    logprobs = logprobs if logprobs is not None else tuple(-0.1 * (i + 1) for i in range(len(tokens)))
    return StepRecord(node, depth, tuple(tokens), tuple(logprobs), q=0.0, q_soft=q_soft, visits=1, finish_reason="stop")


A = step(1, 1, [10, 11], 0.6, (-0.5, NAN))  # the generator gave no log-prob for token 11
B = step(2, 1, [20], -0.4)


def trajectory(terminal, steps, correct, overlong=0.0, index=0):
    reward = 1.0 if correct else -1.0
    verdict = Verdict(correct, reward, "x", "correct" if correct else "wrong_value")
    return Trajectory(terminal, index, tuple(steps), "correct" if correct else "incorrect", reward, overlong, verdict, "text")


T1 = trajectory(3, [A, step(3, 2, [12, 13, 14], 1.0)], True, index=0)
T2 = trajectory(4, [A, step(4, 2, [15], -1.0)], False, index=1)
T3 = trajectory(5, [B, step(5, 2, [21, 22], -1.0)], False, overlong=-0.5, index=2)


def result(*trajectories):
    return TreeResult(0, "p7", PROMPT, tuple(trajectories), "complete", None, SearchConfig(), tree=None)


def tree_rows(*trajectories, **settings):
    return credit_groups([Group.of(result(*trajectories))], Credit(**settings)).rows[0]


def close(a, b):
    return len(a) == len(b) and all(x == pytest.approx(y, abs=1e-9) for x, y in zip(a, b))


# ------------------------------------------------------------------ the rules on the tree
def test_node_advantages_are_step_value_plus_overlong_minus_the_tree_mean_per_token():
    rows = tree_rows(T1, T2, T3, advantage="node")
    assert [r.response_ids for r in rows] == [(10, 11, 12, 13, 14), (10, 11, 15), (20, 21, 22)]
    # T1: A 0.6 - (-0.5) = 1.1 on its 2 tokens; A1 1.0 + 0.5 = 1.5 on 3 tokens.
    assert close(rows[0].advantages, [1.1, 1.1, 1.5, 1.5, 1.5])
    # T2: A 1.1 again; A2 -1.0 + 0.5 = -0.5.
    assert close(rows[1].advantages, [1.1, 1.1, -0.5])
    # T3: every step also carries the overlong penalty: B -0.4 - 0.5 + 0.5 = -0.4; B1 -1.5 + 0.5 = -1.0.
    assert close(rows[2].advantages, [-0.4, -1.0, -1.0])
    assert rows[0].step_ids == (0, 0, 1, 1, 1) and rows[2].step_ids == (0, 1, 1)
    assert [r.reward for r in rows] == [1.0, -1.0, -1.0]  # the terminal reward, without the penalty
    assert all(r.problem_id == "p7" and r.prompt_ids == PROMPT for r in rows)
    # The generator's log-probs, step after step, NaN kept where it gave none.
    assert rows[0].behaviour_logprobs[0] == -0.5 and math.isnan(rows[0].behaviour_logprobs[1])
    assert close(rows[0].behaviour_logprobs[2:], [-0.1, -0.2, -0.3])


def test_outcome_advantages_give_every_token_its_final_score_minus_the_mean():
    rows = tree_rows(T1, T2, T3, advantage="outcome")
    # finals 1.0, -1.0, -1.5 minus mu = -0.5: 1.5, -0.5, -1.0.
    assert close(rows[0].advantages, [1.5] * 5)
    assert close(rows[1].advantages, [-0.5] * 3)
    assert close(rows[2].advantages, [-1.0] * 3)


def test_outcome_advantages_divided_by_the_population_std_when_asked():
    rows = tree_rows(T1, T2, T3, advantage="outcome", normalize_std=True)
    # deviations 1.5, -0.5, -1.0: variance (2.25 + 0.25 + 1.0) / 3 = 7/6, std 1.0801...
    std = math.sqrt(7 / 6) + 1e-6
    assert close(rows[0].advantages, [1.5 / std] * 5) and close(rows[2].advantages, [-1.0 / std] * 3)


def test_subtree_advantages_by_hand():
    """V(root) = -0.5; V(A) = (1 - 1) / 2 = 0 over 2 trajectories; V(B) = -1.5; each leaf its final.
    T1: A ((0 + 0.5) + (0 + 0.5)) / sqrt 2 = 0.707107; A1 (1 - 0) + (1 + 0.5) = 2.5.
    T2: A 0.707107; A2 (-1 - 0) + (-1 + 0.5) = -1.5.
    T3: B (-1.5 + 0.5) * 2 = -2.0; B1 (-1.5 + 1.5) + (-1.5 + 0.5) = -1.0."""
    rows = tree_rows(T1, T2, T3, advantage="subtree")
    assert close(rows[0].advantages, [1 / math.sqrt(2)] * 2 + [2.5] * 3)
    assert close(rows[1].advantages, [1 / math.sqrt(2)] * 2 + [-1.5])
    assert close(rows[2].advantages, [-2.0, -1.0, -1.0])


def test_best_of_n_trains_on_the_correct_trajectories_only_with_advantage_one():
    rows = tree_rows(T1, T2, T3, advantage="best_of_n")
    assert [r.response_ids for r in rows] == [(10, 11, 12, 13, 14)]
    assert rows[0].advantages == (1.0,) * 5
    assert tree_rows(T2, T3, advantage="best_of_n") == []  # nothing correct


def test_self_training_rows_carry_their_path_weights():
    # Outcome scores 1, -1, -1 with no filter at temperature 1: e, 1/e, 1/e over 3 kept paths,
    # e + 2/e = 3.454041; w = 3e / 3.454041 = 2.360958 and 3/e / 3.454041 = 0.319521 (twice); they average 1.
    rows = tree_rows(T1, T2, T3, advantage="self_training",
                     path_weights=PathWeighting(source="outcome", correct_only=False))
    assert [r.advantages[0] for r in rows] == pytest.approx([2.360958, 0.319521, 0.319521], abs=1e-6)
    assert all(len(set(r.advantages)) == 1 for r in rows)
    # The default keeps the correct paths only: T1 alone, weight 1.
    assert [r.advantages for r in tree_rows(T1, T2, T3, advantage="self_training")] == [(1.0,) * 5]


def test_dropped_trajectories_still_count_in_the_group_baseline(monkeypatch):
    monkeypatch.setattr(Credit, "drops", lambda self, t: t.terminal_id == 5)
    rows = tree_rows(T1, T2, T3, advantage="node")
    assert [r.response_ids for r in rows] == [(10, 11, 12, 13, 14), (10, 11, 15)]
    # mu is still -0.5 with T3 left out of training (without it mu would be 0 and T1's A 0.6).
    assert close(rows[0].advantages, [1.1, 1.1, 1.5, 1.5, 1.5])
    assert close(rows[1].advantages, [1.1, 1.1, -0.5])
    assert close(tree_rows(T1, T2, T3, advantage="outcome")[0].advantages, [1.5] * 5)


def test_uniform_groups_are_left_out_when_asked():
    both = [Group.of(result(T2, T3)), Group.of(result(T1, T2))]  # finals -1, -1.5 differ; so do 1, -1
    same = Group.of(result(T2, trajectory(6, [B, step(6, 2, [23], -1.0)], False)))  # -1, -1: uniform
    out = credit_groups(both + [same], Credit(drop_uniform_groups=True))
    assert [len(r) for r in out.rows] == [2, 2, 0] and out.uniform_groups == 1
    assert credit_groups([same], Credit()).uniform_groups == 0


def test_pass_at_k_by_hand_on_the_tree():
    """T1 right, T2 and T3 wrong: n = 3, c = 1.
    k = 2: mean pass@2 = 1 - C(2,2)/C(3,2) = 2/3; right 2 (1 - 2/3) = 2/3; a wrong one's failing
    share C(1,1)/C(2,1) = 1/2: 2 (1 - 2/3 - 1/2) = -1/3 (the three sum to 0).
    k = 1 is outcome credit without the overlong penalty: 2 (1 - 1/3) = 4/3 and 2 (0 - 1/3) = -2/3.
    k = 3 (or more) is capped at n - 1 = 2: at 3 every subset would hold T1 and nothing would train."""
    rows = tree_rows(T1, T2, T3, advantage="pass_at_k", pass_k=2)
    assert close(rows[0].advantages, [2 / 3] * 5) and close(rows[1].advantages, [-1 / 3] * 3)
    assert close(rows[2].advantages, [-1 / 3] * 3)
    assert [r.advantages[0] for r in tree_rows(T1, T2, T3, advantage="pass_at_k", pass_k=1)] == \
        pytest.approx([4 / 3, -2 / 3, -2 / 3])
    assert tree_rows(T1, T2, T3, advantage="pass_at_k", pass_k=3) == rows
    # all wrong: no signal
    assert all(set(r.advantages) == {0.0} for r in tree_rows(T2, T3, advantage="pass_at_k", pass_k=1))
    # std-normalised: the std of the 2-subsets' rewards on the +-1 scale, 2 sqrt(2/3 x 1/3)
    std = 2 * math.sqrt(2 / 9) + 1e-6
    normed = tree_rows(T1, T2, T3, advantage="pass_at_k", pass_k=2, normalize_std=True)
    assert [r.advantages[0] for r in normed] == pytest.approx([2 / 3 / std, -1 / 3 / std, -1 / 3 / std])


def test_pass_k_is_refused_where_the_rule_does_not_read_it_and_checked():
    with pytest.raises(ValueError, match="pass_k is set but --data.credit.advantage=outcome"):
        check(Credit(advantage="outcome", pass_k=8))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="pass_k must be an integer >= 1"):
            Credit(advantage="pass_at_k", pass_k=bad)
    # A k the trees cannot use as given is said (the rule caps it at n - 1); below n, or flat, nothing.
    (warning,) = check(Credit(advantage="pass_at_k", pass_k=8), "search", trajectories_per_tree=8)
    assert "--data.credit.pass_k=8 is not below --data.search.trajectories_per_tree=8: each tree's pass@k uses k = 7" \
        in warning
    assert check(Credit(advantage="pass_at_k", pass_k=7), "search", trajectories_per_tree=8) == []
    assert check(Credit(advantage="pass_at_k"), "search") == []


def test_positive_weight_damps_the_positive_advantages_only():
    # node credit, mu = -0.5 (the module doc): T1 = [1.1, 1.1, 1.5 x 3], T2 = [1.1, 1.1, -0.5], T3 = [-0.4, -1.0 x 2]
    # (T3's steps carry its overlong penalty: -0.4 - 0.5 + 0.5 and -1.0 - 0.5 + 0.5)
    rows = tree_rows(T1, T2, T3, advantage="node", positive_weight=0.1)
    assert close(rows[0].advantages, [0.11, 0.11, 0.15, 0.15, 0.15])
    assert close(rows[1].advantages, [0.11, 0.11, -0.5])
    assert close(rows[2].advantages, [-0.4, -1.0, -1.0])  # all negative: kept
    # outcome credit: T1 1.0 + 0.5 = 1.5 -> 0.15; T2 -0.5 and T3 -1.0 kept; 0 = the negative samples only
    assert [r.advantages[0] for r in tree_rows(T1, T2, T3, advantage="outcome", positive_weight=0.1)] == \
        pytest.approx([0.15, -0.5, -1.0])
    assert [r.advantages[0] for r in tree_rows(T1, T2, T3, advantage="outcome", positive_weight=0.0)] == \
        pytest.approx([0.0, -0.5, -1.0])
    assert tree_rows(T1, T2, T3, advantage="outcome", positive_weight=1.0) == tree_rows(T1, T2, T3, advantage="outcome")


@pytest.mark.parametrize("weight", [-0.1, float("inf"), float("nan"), "x"])
def test_positive_weight_must_be_a_finite_number_at_least_zero(weight):
    with pytest.raises(ValueError, match="positive_weight must be a number >= 0"):
        Credit(positive_weight=weight)


def test_positive_weight_is_refused_with_path_weights():
    with pytest.raises(ValueError, match="positive_weight=0.5 scales advantages"):
        Credit(advantage="self_training", positive_weight=0.5)


# ------------------------------------------------------------------ mixed rollouts follow the rule
# A buffered problem: 2 cached correct solutions, n = 4, so 2 direct samples are kept.
C1 = CachedSolution("p7", (30, 31), "c1", round=0)
C2 = CachedSolution("p7", (32,), "c2", round=1)
D0 = trajectory(6, [step(6, 1, [40], 1.0)], True)
D1 = trajectory(7, [step(7, 1, [41, 42], -1.0, (-0.3, -0.4))], False)
D2 = trajectory(8, [step(8, 1, [43], -1.0, (-0.6,))], False, overlong=-0.5)


def mixed(direct, **settings):
    group = Group("p7", PROMPT, result(*direct), (C1, C2), n=4)
    return credit_groups([group], Credit(**settings)).rows[0]


@pytest.mark.parametrize("direct", [[D1, D2], [D0, D1, D2]], ids=["only-the-needed", "n-direct"])
@pytest.mark.parametrize("advantage", ["node", "outcome"])
def test_a_mixed_rollout_scores_cached_solutions_plus_one_against_the_direct_samples(direct, advantage):
    rows = mixed(direct, advantage=advantage)
    # cached[:2] + the last 2 of direct[:4]: C1, C2, D1, D2 either way.
    assert [r.response_ids for r in rows] == [(30, 31), (32,), (41, 42), (43,)]
    # scores 1, 1, -1, -1.5: mean -0.125; advantages 1.125, 1.125, -0.875, -1.375 (DAPO's r - mean).
    assert [r.reward for r in rows] == [1.0, 1.0, -1.0, -1.5]
    for row, adv in zip(rows, [1.125, 1.125, -0.875, -1.375]):
        assert close(row.advantages, [adv] * len(row.response_ids))
        assert row.step_ids == (0,) * len(row.response_ids)
    # A cached solution has no behaviour log-probs (NaN, filled later); a direct sample keeps its own.
    assert all(math.isnan(x) for x in rows[0].behaviour_logprobs + rows[1].behaviour_logprobs)
    assert rows[2].behaviour_logprobs == (-0.3, -0.4) and rows[3].behaviour_logprobs == (-0.6,)


def test_a_mixed_rollout_credited_best_of_n_trains_no_negative():
    # Before issue 34 a replay-buffer problem was credited DAPO whatever the rule: -0.875 and
    # -1.375 on D1 and D2 under best-of-N. Now: the correct responses only, +1 each.
    rows = mixed([D1, D2], advantage="best_of_n")
    assert [(r.response_ids, set(r.advantages), r.correct) for r in rows] == [((30, 31), {1.0}, True), ((32,), {1.0}, True)]
    rows = mixed([D0, D2], advantage="best_of_n")  # C1, C2, D0 (correct), D2: all but D2
    assert [(r.response_ids, set(r.advantages)) for r in rows] == [((30, 31), {1.0}), ((32,), {1.0}), ((40,), {1.0})]


def test_a_mixed_rollout_credited_by_subtree_has_one_step_per_response():
    # One-step paths: V(s) = r, so A = (r - mean) + (r - mean) = 2 (r - mean): 2.25, 2.25, -1.75, -2.75.
    rows = mixed([D1, D2], advantage="subtree")
    for row, adv in zip(rows, [2.25, 2.25, -1.75, -2.75]):
        assert close(row.advantages, [adv] * len(row.response_ids))


def test_a_mixed_rollout_self_trains_on_its_cached_solutions():
    # Zero, then the path weights: the correct C1, C2 kept (scores 1, 1: weight 1 each).
    rows = mixed([D1, D2], advantage="self_training")
    assert [(r.response_ids, r.advantages[0]) for r in rows] == [((30, 31), 1.0), ((32,), 1.0)]


def test_a_mixed_rollout_drops_a_direct_sample_but_keeps_it_in_the_baseline(monkeypatch):
    monkeypatch.setattr(Credit, "drops", lambda self, t: t.terminal_id == 8)
    rows = mixed([D1, D2])
    assert [r.response_ids for r in rows] == [(30, 31), (32,), (41, 42)]
    # The mean still holds D2's -1.5: -0.125 (without it: 1/3 and C1 would get 2/3).
    assert close(rows[0].advantages, [1.125, 1.125]) and close(rows[2].advantages, [-0.875, -0.875])


# ------------------------------------------------------------------ settings
def test_an_unknown_rule_fails_with_the_flag_and_every_choice():
    from flywheel.objectives.credit import RULES

    assert next(iter(RULES)) == Credit().advantage  # the table's first rule is the default
    with pytest.raises(ValueError, match=re.escape(f"--data.credit.advantage must be one of {RULES.names()}, got 'tree'")):
        Credit(advantage="tree")


@pytest.mark.parametrize("advantage, rollout, rule", [
    ("subtree", "search", "subtree"), ("best_of_n", "search", "best_of_n"), ("self_training", "search", "self_training"),
    ("node", "best_of_n", "best_of_n"), ("self_training", "flat", "self_training"),
])
def test_normalize_std_is_refused_where_the_credit_ignores_it(advantage, rollout, rule):
    readers = ", ".join(repr(name) for name, r in credit.RULES.items() if "normalize_std" in r.reads)
    with pytest.raises(ValueError, match=rf"^--data\.credit\.normalize_std=true but .* credits by the '{rule}' rule, "
                                         rf"which ignores it: remove it \(the rules that read it: {readers}\)$"):
        check(Credit(advantage=advantage, normalize_std=True), rollout)
    # Where a rule reads it, it is fine: node and outcome trees, and flat DAPO groups.
    for fine in [("node", "search"), ("outcome", "search"), ("node", "flat"), ("subtree", "flat")]:
        check(Credit(advantage=fine[0], normalize_std=True), fine[1])


def test_path_weights_and_a_changed_degenerate_filter_are_refused_where_ignored():
    from flywheel.adaptive import DegenerateFilter

    weights = PathWeighting(temperature=0.5)
    with pytest.raises(ValueError, match=r"--data\.credit\.path_weights is set but --data\.credit\.advantage=node .*"
                                         r"\(the rules that read it: 'self_training'\)"):
        check(Credit(path_weights=weights))
    check(Credit(advantage="self_training", path_weights=weights), "best_of_n")  # best-of-N samples, weighted
    off = DegenerateFilter(enabled=False)
    with pytest.raises(ValueError, match=r"--data\.credit\.degenerate_filter is set but .* 'best_of_n' rule"):
        check(Credit(advantage="best_of_n", degenerate_filter=off))
    check(Credit(advantage="subtree", degenerate_filter=off))
    # A setting written at its default is no setting.
    check(Credit(advantage="best_of_n", normalize_std=False, path_weights=PathWeighting(temperature=1.0)))


def test_a_rule_the_rollout_does_not_use_is_warned_about():
    assert check(Credit(advantage="subtree"), "flat") == [
        "--data.credit.advantage=subtree is not used with --data.rollout=flat: its groups are credited by the "
        "'outcome' rule (every token gets its final score minus the group mean); remove "
        "--data.credit.advantage or use --data.rollout=search"]
    assert check(Credit(advantage="best_of_n"), "best_of_n") == []  # it is the rule used
    assert check(Credit(advantage="outcome"), "flat") == []  # DAPO's, the flat kind's own rule
    assert check(Credit(), "flat") == check(Credit(advantage="self_training"), "flat") == []


def test_node_credit_gives_the_wrong_step_of_an_all_wrong_tree_a_positive_advantage():
    """The flaw `fit_cautions` names (docs/credit.md). A tree of T2 and T3 only: mu = (-1.0 - 1.5) / 2 = -1.25.
    node: T3's wrong first step B -0.4 - 0.5 (overlong) + 1.25 = +0.35, pushed UP; B1 -1.5 + 1.25 = -0.25.
    subtree: V(root) = -1.25, V(B) = -1.5 on 1 trajectory: B 2 (-1.5 + 1.25) = -0.5; B1 0 + (-0.25).
    outcome: every step -1.5 + 1.25 = -0.25."""
    assert close(tree_rows(T2, T3, advantage="node")[1].advantages, [0.35, -0.25, -0.25])
    assert close(tree_rows(T2, T3, advantage="subtree")[1].advantages, [-0.5, -0.25, -0.25])
    assert close(tree_rows(T2, T3, advantage="outcome")[1].advantages, [-0.25] * 3)


@pytest.mark.parametrize("advantage, rollout, cautioned", [
    ("node", "search", True), ("subtree", "search", False), ("outcome", "search", False),
    ("pass_at_k", "search", False), ("node", "flat", False),  # flat groups under "node" are DAPO's, no tree
])
def test_a_fit_crediting_trees_by_the_paper_node_rule_logs_its_measured_flaw(caplog, advantage, rollout, cautioned):
    import logging

    from data_modules.search import SearchDataModule

    data = SearchDataModule(rollout=rollout, credit=Credit(advantage=advantage))
    with caplog.at_level(logging.WARNING, logger="data_modules.search"):
        data.setup("validate")  # not a fit: nothing
        assert caplog.records == []
        data.setup("fit")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not cautioned:
        assert lines == []
        return
    (line,) = lines
    assert line.startswith("--data.credit.advantage=node (the paper's Tree-GRPO node credit, the default) was "
                           "measured collapsing on chains")
    assert "79-82%" in line and "docs/results.md" in line and "--data.credit.advantage=subtree" in line


def test_the_self_training_rule_and_the_self_training_loss_go_together():
    check_loss("self_training", "self_training")
    check_loss("subtree", "cispo")
    for advantage, loss in [("self_training", "ppo"), ("node", "self_training")]:
        with pytest.raises(ValueError, match=rf"--data\.credit\.advantage='{advantage}' and "
                                             rf"--model\.objective\.loss_type='{loss}' do not go together"):
            check_loss(advantage, loss)


# ------------------------------------------------------------------ a new rule is one table entry
def test_a_rule_registered_in_the_table_alone_is_checked_and_computed(monkeypatch):
    """docs/credit.md's example: half of Tree-GRPO's node advantages, reading normalize_std."""
    halved = CreditRule("halved_node", "node credit at half strength",
                        lambda group, std: [[a / 2 for a in steps] for steps in node_credit(group, std)],
                        reads=frozenset({"normalize_std", "degenerate_filter"}))
    with pytest.raises(ValueError, match="halved_node"):
        Credit(advantage="halved_node")
    monkeypatch.setitem(credit.RULES, "halved_node", halved)
    settings = Credit(advantage="halved_node", normalize_std=True)
    assert check(settings) == []
    rows = credit_groups([Group.of(result(T1, T2, T3))], Credit(advantage="halved_node")).rows[0]
    assert close(rows[0].advantages, [0.55, 0.55, 0.75, 0.75, 0.75])  # node's 1.1 and 1.5, halved
    assert close(mixed([D1, D2], advantage="halved_node")[0].advantages, [0.5625] * 2)  # 1.125 / 2
    with pytest.raises(ValueError, match=r"the rules that read it: 'node', .*'halved_node'\)$"):
        check(Credit(advantage="subtree", normalize_std=True))
    with pytest.raises(ValueError, match=r"'halved_node'\), got 'tree'"):
        Credit(advantage="tree")


def test_every_rollout_kind_names_a_credit_rule():
    from flywheel.objectives.credit import ROLLOUTS, RULES

    assert all(kind.credit is None or kind.credit in RULES for kind in ROLLOUTS.values())
    assert all(name == kind.name for name, kind in ROLLOUTS.items())
    first = next(iter(ROLLOUTS.values()))
    assert first.name == "search" and first.searches and first.credit is None  # trees get the chosen rule
