"""Hand-worked checks of flywheel.objectives: every expected value is derived in a comment."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.objectives import (
    ObjectiveConfig,
    aggregate,
    group_baseline,
    kl_penalty,
    kl_per_token,
    per_token,
    policy_loss,
    token_logprobs,
    tree_grpo_advantages,
    truncated_importance_weight,
)
from flywheel import logprobs as logprobs_module

approx = pytest.approx


# ---------------------------------------------------------------- advantages

# One tree, K = 3 trajectories (step token scores, overlong 0):
#   t1: [0.5, 1.0]          correct
#   t2: [0.5, -0.2, -1.0]   incorrect, shares its first step with t1
#   t3: [-0.6, -1.0]        incorrect
# finals [1, -1, -1] -> mu = -1/3
TREE = [[0.5, 1.0], [0.5, -0.2, -1.0], [-0.6, -1.0]]


def test_tree_grpo_advantages_mean_only():
    adv = tree_grpo_advantages(TREE)
    # t1: [0.5 + 1/3, 1 + 1/3] = [0.8333, 1.3333]
    # t2: [0.8333, -0.2 + 1/3, -1 + 1/3] = [0.8333, 0.1333, -0.6667]
    # t3: [-0.6 + 1/3, -0.6667] = [-0.2667, -0.6667]
    assert adv[0] == approx([0.833333, 1.333333], abs=1e-6)
    assert adv[1] == approx([0.833333, 0.133333, -0.666667], abs=1e-6)
    assert adv[2] == approx([-0.266667, -0.666667], abs=1e-6)
    # signs: the correct terminal and the step on the correct path are pushed up, the
    # incorrect terminals down; a weak step of a failed path is still above mu
    assert adv[0][1] > 0 and adv[1][2] < 0 and adv[2][1] < 0 and adv[1][1] > 0


def test_tree_grpo_advantages_std_is_population_std():
    adv = tree_grpo_advantages(TREE, normalize_std=True)
    # finals [1, -1, -1], mean -1/3; population var = ((4/3)^2 + 2 (2/3)^2) / 3 = 8/9,
    # std = 0.94281 (the sample std would be sqrt(4/3) = 1.1547)
    # t1 final: (4/3) / (0.94281 + 1e-6) = 1.41421 = sqrt(2)
    assert adv[0][1] == approx(math.sqrt(2), abs=1e-5)
    # t3 first step: (-0.6 + 1/3) / 0.94281 = -0.28284
    assert adv[2][0] == approx(-0.282843, abs=1e-5)


def test_tree_grpo_std_switch_leaves_all_equal_group_unscaled():
    # all trajectories failed: finals [-1, -1], std 0. Intermediate step 0.29 above mu
    # keeps A = -0.29 + 1 = 0.71 instead of 0.71 / 1e-6
    adv = tree_grpo_advantages([[-0.29, -1.0], [-1.0]], normalize_std=True)
    assert adv == [approx([0.71, 0.0]), approx([0.0])]


def test_tree_grpo_explicit_final_scores():
    # baseline over finals [1, 0] (mu = 0.5) while training one trajectory
    assert tree_grpo_advantages([[0.25, 1.0]], final_scores=[1.0, 0.0]) == [approx([-0.25, 0.5])]


def flat_advantages(finals: list[float], normalize_std: bool) -> torch.Tensor:
    """DAPO's flat advantage of one group, (r - mean) / divisor (GRPO's std when normalized)."""
    rewards = torch.tensor(finals, dtype=torch.float64)
    mean, divisor = group_baseline(rewards, None, normalize_std)
    return (rewards - mean) / divisor


def test_tree_grpo_with_terminal_reward_everywhere_is_dapo():
    # Replace every node's score by its trajectory's final score (reward + overlong):
    # A_j = r_t - mu = the DAPO advantage of trajectory t, on every step.
    finals = [1.0 - 0.25, -1.0, -1.0 - 0.5, 1.0]
    steps = [3, 1, 4, 2]
    tree = [[f] * n for f, n in zip(finals, steps)]
    for normalize_std in (False, True):
        flat = flat_advantages(finals, normalize_std)
        adv = tree_grpo_advantages(tree, normalize_std=normalize_std)
        assert adv == [approx([float(a)] * n) for a, n in zip(flat, steps)]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([-1.0, 1.0]), st.floats(-1.0, 0.0), st.integers(1, 5)),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_tree_grpo_equals_dapo_property(trajectories, normalize_std):
    finals = [r + overlong for r, overlong, _ in trajectories]
    tree = [[f] * n for f, (_, _, n) in zip(finals, trajectories)]
    flat = flat_advantages(finals, normalize_std)
    for steps, a in zip(tree_grpo_advantages(tree, normalize_std=normalize_std), flat.tolist()):
        assert steps == approx([a] * len(steps), abs=1e-9)


def test_per_token():
    assert per_token([0.5, -1.0], [2, 1]) == [0.5, 0.5, -1.0]
    with pytest.raises(ValueError, match="one length per step"):
        per_token([0.5], [2, 1])


# ---------------------------------------------------------------- policy loss

def _one_token(rho: float, adv: float, **kwargs):
    """Loss and d loss / d logprob for a single response token with ratio rho."""
    lp = torch.tensor([[math.log(rho)]], requires_grad=True)
    old, mask = torch.zeros(1, 1), torch.ones(1, 1)
    loss, stats = policy_loss(lp, old, torch.tensor([[adv]]), mask, **kwargs)
    loss.backward()
    return loss.item(), lp.grad.item(), stats


@pytest.mark.parametrize(
    "rho, adv, loss, grad, clipped",
    [
        # A = +1, rho = e = 2.718: unclipped -2.718, clip(rho) = 1.28 -> -1.28;
        # max(-2.718, -1.28) = -1.28 (constant: no gradient), upper clip engaged
        (math.e, 1.0, -1.28, 0.0, "clip_frac_high"),
        # A = +1, rho = 0.5: unclipped -0.5, clip(rho) = 0.8 -> -0.8; max = -0.5.
        # No clip for A > 0 below 1: grad = d(-A rho)/d lp = -A rho = -0.5
        (0.5, 1.0, -0.5, -0.5, None),
        # A = -1, rho = 0.5: unclipped 0.5, clipped 0.8; max = 0.8, lower clip engaged
        (0.5, -1.0, 0.8, 0.0, "clip_frac_low"),
        # A = -1, rho = 1.2 (inside [0.8, 1.28]): L = 1.2, grad = -A rho = 1.2
        (1.2, -1.0, 1.2, 1.2, None),
        # A = -1, rho = 5: unclipped 5, clipped 1.28; max = 5 < dual cap 10 -> 5, grad 5
        (5.0, -1.0, 5.0, 5.0, None),
        # A = -1, rho = 20: unclipped 20, clipped 1.28; max = 20; dual clip
        # min(20, -A * 10) = 10 (constant: no gradient)
        (20.0, -1.0, 10.0, 0.0, "dual_clip_frac"),
        # A = -2, rho = 1.5: unclipped 3, clipped 2 * 1.28 = 2.56; max 3 < cap 20; grad 3
        (1.5, -2.0, 3.0, 3.0, None),
        # A = 0: no loss, no gradient
        (3.0, 0.0, 0.0, 0.0, None),
    ],
)
def test_policy_loss_single_token(rho, adv, loss, grad, clipped):
    got_loss, got_grad, stats = _one_token(rho, adv)
    assert got_loss == approx(loss, abs=1e-5)
    assert got_grad == approx(grad, abs=1e-5)
    for name in ("clip_frac_low", "clip_frac_high", "dual_clip_frac"):
        assert stats[name].item() == (1.0 if name == clipped else 0.0), name


def test_policy_loss_clip_settings():
    # clip_high 0.5: A = +1, rho = e -> clip to 1.5, L = -1.5
    assert _one_token(math.e, 1.0, clip_high=0.5)[0] == approx(-1.5)
    # dual_clip 4: A = -1, rho = 5 -> min(5, 4) = 4
    assert _one_token(5.0, -1.0, dual_clip=4.0)[0] == approx(4.0)
    # dual clip off: A = -1, rho = 20 -> 20
    assert _one_token(20.0, -1.0, dual_clip=math.inf)[0] == approx(20.0)


def test_policy_loss_stats():
    # rho = e, A = +1: ratio_mean e; approx_kl (k3) = e - 1 - 1 = 0.71828
    _, _, stats = _one_token(math.e, 1.0)
    assert stats["ratio_mean"].item() == approx(math.e, rel=1e-6)
    assert stats["approx_kl"].item() == approx(math.e - 2.0, rel=1e-6)
    assert all(not v.requires_grad for v in stats.values())


def test_policy_loss_huge_log_ratio_is_finite():
    # log rho = 1000 would overflow exp; clamped to 20: A = -1 -> dual clip -> 10
    lp = torch.tensor([[1000.0, -1000.0]], requires_grad=True)
    loss, stats = policy_loss(lp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    loss.backward()
    # token 1: rho = exp(-20) ~ 0, A = +1: max(-0, -0.8) = 0. Mean (10 + 0) / 2 = 5
    assert loss.item() == approx(5.0, abs=1e-6)
    assert torch.isfinite(lp.grad).all() and torch.isfinite(stats["ratio_mean"])


# Aggregation example, per-token losses (NaN at padding):
#   row 0: [1, 2, 4, pad]  steps [0, 0, 1]
#   row 1: [3, 6, pad, pad] steps [0, 1]
# token_mean    = (1 + 2 + 4 + 3 + 6) / 5                 = 16 / 5   = 3.2
# sequence_mean = ((1 + 2 + 4) / 3 + (3 + 6) / 2) / 2      = (2.3333 + 4.5) / 2 = 3.41667
# step_mean     = ((1 + 2) / 2 + 4 + 3 + 6) / 4           = 14.5 / 4 = 3.625
LOSSES = torch.tensor([[1.0, 2.0, 4.0, float("nan")], [3.0, 6.0, float("nan"), float("nan")]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
STEPS = torch.tensor([[0, 0, 1, -1], [0, 1, -1, -1]])
EXPECTED = {"token_mean": 3.2, "sequence_mean": 3.416667, "step_mean": 3.625}


@pytest.mark.parametrize("aggregation", sorted(EXPECTED))
def test_aggregation_modes(aggregation):
    loss = aggregate(LOSSES, MASK, aggregation, STEPS)
    assert loss.item() == approx(EXPECTED[aggregation], abs=1e-5)


@pytest.mark.parametrize("aggregation", sorted(EXPECTED))
def test_policy_loss_aggregation_modes(aggregation):
    # rho = 1 (logprobs = old) makes the per-token loss -A, so A = -LOSSES gives LOSSES
    lp = torch.zeros(2, 4)
    loss, _ = policy_loss(lp, lp, -LOSSES, MASK, aggregation=aggregation, step_ids=STEPS)
    assert loss.item() == approx(EXPECTED[aggregation], abs=1e-5)


def test_step_ids_need_not_be_contiguous():
    # row 0 steps [3, 3, 7] are the same two steps as [0, 0, 1]: still 3.625
    steps = torch.tensor([[3, 3, 7, -1], [0, 1, -1, -1]])
    assert aggregate(LOSSES, MASK, "step_mean", steps).item() == approx(3.625)


def test_aggregation_denominator():
    # token_mean over a micro-batch whose mini-batch has 10 tokens: 16 / 10
    assert aggregate(LOSSES, MASK, "token_mean", denominator=10).item() == approx(1.6)


def test_aggregation_errors():
    with pytest.raises(ValueError, match="needs step_ids"):
        aggregate(LOSSES, MASK, "step_mean")
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(LOSSES, MASK, "sum")


def test_token_mean_gradient_by_hand():
    # two tokens, rho = 1, A = [+1, -1]: L = (-A1 rho1 - A2 rho2) / 2,
    # d L / d lp_i = -A_i rho_i / 2 = [-0.5, +0.5]
    lp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(lp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == 0.0
    assert lp.grad.tolist() == [[-0.5, 0.5]]


def test_masked_tokens_add_no_loss_and_no_nan_gradient():
    # valid tokens: rho = 1, A = [2, -1] -> per-token [-2, 1], token mean -0.5.
    # Padding holds -inf log-probs (and -inf old, so lp - old = NaN) and NaN advantages.
    inf, nan = float("inf"), float("nan")
    lp = torch.tensor([[0.0, -inf], [0.0, -inf]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0], [0.0, -inf]])
    adv = torch.tensor([[2.0, nan], [-1.0, nan]])
    mask = torch.tensor([[True, False], [True, False]])
    for aggregation in EXPECTED:
        lp.grad = None
        steps = torch.zeros(2, 2, dtype=torch.long)
        loss, stats = policy_loss(lp, old, adv, mask, aggregation=aggregation, step_ids=steps)
        loss.backward()
        # every mode gives -0.5 here: two one-token rows, one step each
        assert loss.item() == approx(-0.5)
        # d L / d lp = -A rho / 2 = [-1, +0.5] on valid tokens, exactly 0 on padding
        assert lp.grad.tolist() == [[-1.0, 0.0], [0.5, 0.0]]
        assert all(torch.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("aggregation", sorted(EXPECTED))
def test_empty_mask_gives_zero_loss(aggregation):
    lp = torch.zeros(1, 3, requires_grad=True)
    steps = torch.full((1, 3), -1)
    loss, stats = policy_loss(
        lp, torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3), aggregation=aggregation, step_ids=steps
    )
    loss.backward()
    assert loss.item() == 0.0 and lp.grad.eq(0).all()
    assert stats["clip_frac_high"].item() == 0.0


def test_policy_loss_weights_scale_token_loss():
    # rho = 1, A = [1, 1] -> per-token [-1, -1]; weights [2, 0.5] -> [-2, -0.5], mean -1.25
    lp = torch.zeros(1, 2)
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = policy_loss(lp, lp, torch.ones(1, 2), torch.ones(1, 2), weights=weights)
    assert loss.item() == approx(-1.25)


def test_policy_loss_shape_mismatch():
    with pytest.raises(ValueError, match="share one"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 2))


def test_truncated_importance_weight():
    # token 0: pi_old / mu = 1 / 0.25 = 4 -> capped at 2; token 1: 0.5 / 1 = 0.5;
    # token 2 is padding (NaN inputs) -> 1
    target = torch.tensor([[0.0, math.log(0.5), float("nan")]], requires_grad=True)
    behaviour = torch.tensor([[math.log(0.25), 0.0, float("nan")]])
    w = truncated_importance_weight(target, behaviour, torch.tensor([[1, 1, 0]]), cap=2.0)
    assert w[0].tolist() == approx([2.0, 0.5, 1.0])
    assert not w.requires_grad


# ---------------------------------------------------------------- KL

def test_kl_zero_when_equal():
    lp = torch.tensor([[-0.3, -2.0, -5.0]])
    for kind in ("k1", "k2", "k3"):
        assert kl_per_token(lp, lp.clone(), torch.ones(1, 3), kind).abs().max().item() == 0.0


def test_kl_estimators_by_hand():
    # lp = 0, ref = log 0.5: d = ref - lp = -0.69315
    # k1 = -d = 0.69315; k2 = d^2 / 2 = 0.24023; k3 = e^d - d - 1 = 0.5 + 0.69315 - 1 = 0.19315
    lp, ref, mask = torch.zeros(1, 1), torch.full((1, 1), math.log(0.5)), torch.ones(1, 1)
    assert kl_per_token(lp, ref, mask, "k1").item() == approx(0.693147, abs=1e-6)
    assert kl_per_token(lp, ref, mask, "k2").item() == approx(0.240227, abs=1e-6)
    assert kl_per_token(lp, ref, mask, "k3").item() == approx(0.193147, abs=1e-6)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_per_token(lp, ref, mask, "k4")


def test_kl_penalty_aggregates_and_ignores_padding():
    # token 0: k3 = 0.19315 (as above); token 1: equal -> 0; token 2 padding with -inf
    # token mean over 2 tokens: 0.19315 / 2 = 0.09657, and the gradient stays finite
    lp = torch.tensor([[0.0, -1.0, -float("inf")]], requires_grad=True)
    ref = torch.tensor([[math.log(0.5), -1.0, 0.0]])
    kl = kl_penalty(lp, ref, torch.tensor([[1, 1, 0]]))
    kl.backward()
    assert kl.item() == approx(0.096574, abs=1e-6)
    # d k3 / d lp = -(e^d - 1) = -(0.5 - 1) = 0.5, halved by the mean: 0.25
    assert lp.grad[0].tolist() == approx([0.25, 0.0, 0.0])


# ---------------------------------------------------------------- log-probs, entropy

def test_token_logprobs_by_hand():
    # logits [0, ln 3] -> p = [1/4, 3/4]; log p(token 1) = ln 0.75 = -0.28768
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logprobs(logits, torch.tensor([[1]])).item() == approx(-0.287682, abs=1e-6)
    # temperature 2 halves the logits: [0, ln 3 / 2] -> p1 = sqrt3 / (1 + sqrt3) = 0.63397
    hot = token_logprobs(logits, torch.tensor([[1]]), temperature=2.0)
    assert hot.item() == approx(math.log(0.633975), abs=1e-6)


@pytest.mark.parametrize("chunk_rows", [1024, 3])
def test_token_logprobs_equals_log_softmax_gather(monkeypatch, chunk_rows):
    monkeypatch.setattr(logprobs_module, "CHUNK_ROWS", chunk_rows)  # 3: several chunks of 8 rows
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 11, generator=gen, requires_grad=True)
    ids = torch.randint(0, 11, (2, 4), generator=gen)
    got = token_logprobs(logits, ids, temperature=0.7)
    ref = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, ids[..., None]).squeeze(-1)
    assert torch.allclose(got, ref, atol=1e-6)
    (g_got,) = torch.autograd.grad(got.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    assert torch.allclose(g_got, g_ref, atol=1e-6)


def test_token_logprobs_bf16_in_fp32_out():
    logits = torch.randn(1, 3, 7, generator=torch.Generator().manual_seed(1)).bfloat16()
    ids = torch.tensor([[0, 3, 6]])
    got = token_logprobs(logits, ids)
    assert got.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[..., None]).squeeze(-1)
    assert torch.allclose(got, ref, atol=1e-6)


def test_token_logprobs_errors():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.long), 0.0)
    with pytest.raises(ValueError, match="must match logits"):
        token_logprobs(torch.zeros(1, 2, 2), torch.zeros(1, 3, dtype=torch.long))


# ---------------------------------------------------------------- config

def test_config_defaults_are_the_papers():
    c = ObjectiveConfig()
    assert (c.clip_low, c.clip_high, c.dual_clip, c.aggregation) == (0.2, 0.28, 10.0, "token_mean")
    assert c.kl_coef == 0.0


@pytest.mark.parametrize(
    "field, value",
    [
        ("clip_low", 1.0),
        ("clip_low", -0.1),
        ("clip_high", -0.1),
        ("dual_clip", 1.2),  # not above 1 + clip_high = 1.28
        ("aggregation", "sum"),
        ("kl_coef", -0.1),
        ("kl_estimator", "k4"),
        ("tis_cap", 0.5),
    ],
)
def test_config_validation_names_field_and_fix(field, value):
    with pytest.raises(ValueError, match=rf"--model\.objective\.{field}=.*Set `{field}`"):
        ObjectiveConfig(**{field: value})


# ------------------------------------------------------------------- subtree (TreeRL) credit
def test_subtree_advantages_hand_worked():
    """root -> a -> {c: +1, d: -1}; root -> b: -1 (b is a terminal at depth 1).

    V(root) = (1 - 1 - 1) / 3 = -1/3; V(a) = (1 - 1) / 2 = 0 with L(a) = 2; V(c) = 1, V(d) = -1,
    V(b) = -1, each L = 1.
    a: ((0 + 1/3) + (0 + 1/3)) / sqrt(2) = 0.4714; c: (1 - 0) + (1 + 1/3) = 2.3333;
    d: (-1 - 0) + (-1 + 1/3) = -1.6667; b: (-1 + 1/3) + (-1 + 1/3) = -1.3333.
    """
    from flywheel.objectives import subtree_advantages

    adv = subtree_advantages([["a", "c"], ["a", "d"], ["b"]], [1.0, -1.0, -1.0])
    assert adv[0] == pytest.approx([0.471405, 2.333333], abs=1e-6)
    assert adv[1] == pytest.approx([0.471405, -1.666667], abs=1e-6)
    assert adv[2] == pytest.approx([-1.333333], abs=1e-6)


def test_subtree_advantages_of_a_uniform_tree_are_zero():
    """All wrong (or all right): every V equals V(root), so nothing is pushed up or down -- unlike
    Tree-GRPO's node scores, where tanh(q) > -1 = mu gives every inner step of an all-wrong
    tree a positive advantage."""
    from flywheel.objectives import subtree_advantages

    adv = subtree_advantages([[1, 2], [1, 3], [4]], [-1.0, -1.0, -1.0])
    assert adv == [[0.0, 0.0], [0.0, 0.0], [0.0]]
    with pytest.raises(ValueError, match="one non-empty path"):
        subtree_advantages([[1]], [1.0, -1.0])


def test_cispo_keeps_the_gradient_ppo_clips_away():
    """Two tokens, token mean over 2.
    Token 1: A = +1, rho = 0.5 / 0.25 = 2 -> clipped to 1 + 0.28 = 1.28.
      CISPO: L = -1.28 * 1 * log 0.5 = 0.887228; dL/dlogp = -1.28 / 2 = -0.64.
      PPO: A > 0 and rho above the upper bound: the clipped branch wins, gradient 0.
    Token 2: A = -1, rho = 0.25 / 0.5 = 0.5 -> clipped to 1 - 0.2 = 0.8.
      CISPO: L = 0.8 * log 0.25 = -1.109035; dL/dlogp = 0.8 / 2 = 0.4.
    Loss = (0.887228 - 1.109035) / 2 = -0.110904.
    """
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([[1.0, -1.0]])
    old = torch.log(torch.tensor([[0.25, 0.5]]))
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    loss, _ = policy_loss(logp, old, adv, mask, loss_type="cispo")
    loss.backward()
    assert loss.item() == pytest.approx(-0.110904, abs=1e-5)
    assert logp.grad[0].tolist() == pytest.approx([-0.64, 0.4], abs=1e-6)
    logp.grad = None
    ppo, _ = policy_loss(logp, old, adv, mask, loss_type="ppo")
    ppo.backward()
    assert logp.grad[0, 0].item() == 0.0
    with pytest.raises(ValueError, match="loss_type"):
        ObjectiveConfig(loss_type="reinforce")


def test_the_loss_table_is_what_the_settings_and_policy_loss_read(monkeypatch):
    """Every loss in LOSSES is a valid loss_type; a surrogate added to the table is taken by
    ObjectiveConfig and policy_loss with no other change; a path-weighting loss is refused by
    policy_loss, naming the function that computes it."""
    from flywheel.objectives.losses import LOSSES, LossRule

    assert all(ObjectiveConfig(loss_type=name).loss_type == name for name in LOSSES)
    with pytest.raises(ValueError, match="weights paths: flywheel.objectives.self_training_loss"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), loss_type="self_training")

    def reinforce(ratio, adv, logprobs, clip_low, clip_high, dual_clip):
        return -adv * logprobs

    monkeypatch.setitem(LOSSES, "reinforce", LossRule("reinforce", "plain REINFORCE", reinforce))
    ObjectiveConfig(loss_type="reinforce")
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    loss, _ = policy_loss(logp, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), loss_type="reinforce")
    assert loss.item() == pytest.approx((-math.log(0.5) + math.log(0.25)) / 2)
    with pytest.raises(ValueError, match=r"--model.objective.loss_type must be one of \('ppo', .*'reinforce'\), "
                                         r"got 'reinforced'"):
        ObjectiveConfig(loss_type="reinforced")
