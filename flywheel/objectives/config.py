"""The objective's settings, with the paper's defaults in one place.

Every function in `flywheel.objectives` takes its defaults from this class
(`clip_low: float = ObjectiveConfig.clip_low`), so a default is written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NoReturn, get_args

from flywheel.finite import check_finite_fields
from flywheel.objectives.losses import LOSSES

Aggregation = Literal["token_mean", "step_mean", "sequence_mean"]
"""How per-token losses become one scalar (see `flywheel.objectives.aggregation`)."""

KLEstimator = Literal["k1", "k2", "k3"]
"""Schulman's estimators of KL(pi_theta || pi_ref) from samples of pi_theta."""

AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)

KLReference = Literal["base", "round"]
"""The frozen policy the KL term compares with: the base policy, or the policy as it was at
the start of the current round."""

KL_REFERENCES: tuple[str, ...] = get_args(KLReference)


@dataclass(frozen=True)
class ObjectiveConfig:
    """Tree-GRPO / DAPO objective settings (DeepSearch paper and code defaults).

    Args:
        clip_low: PPO lower clip, rho >= 1 - clip_low (DAPO clip-higher: 0.2).
        clip_high: PPO upper clip, rho <= 1 + clip_high (DAPO clip-higher: 0.28).
        dual_clip: for A < 0 the per-token loss is capped at -A * dual_clip (dual-clip
            PPO, Ye et al. 2020; DeepSearch code: 10). `math.inf` turns it off.
        aggregation: "token_mean" (mean over every response token of the mini-batch; the
            code's default), "step_mean" (the paper's per-step 1/|s_j| normalisation) or
            "sequence_mean" (per-sequence mean, then mean over sequences).
        kl_coef: weight of the KL penalty to a frozen reference policy; 0 = no reference
            model at all (the paper's setting).
        kl_estimator: which estimator `kl_penalty` uses ("k3" is non-negative, low variance).
        loss_type: the policy loss, a name in `LOSSES` (flywheel.objectives.losses; --help lists
            the registered ones): "ppo" (the paper's clipped ratio with the dual clip) by default;
            a loss that weights paths ("self_training", ReST-MCTS*) goes with the credit rule
            that puts path weights in the advantage column (`--data.credit.advantage=self_training`).
        kl_reference: the frozen reference of the KL term (kl_coef > 0): "base" = the policy
            the run started from; "round" = the policy at the start of the current round
            (copied into the reference at each round's first epoch; ReST-MCTS*'s "the policy
            before this round's training").
        tis_cap: cap C of the truncated importance weight min(pi_old / pi_behaviour, C),
            used when the old log-probs come from the generator (see
            `truncated_importance_weight`).
        value_coef: weight of the value loss mean (V(s_t) - r)^2 over the states each step starts
            from; > 0 gives the module a value head (MLP + tanh on the policy's last hidden
            state, flywheel.training.value_head), trained with the policy, saved in checkpoints, and used
            by search.selection=puct_agents as the value of new nodes (the seed's Countdown MCTS).
            0 = no value head.
        value_baseline: replace the data's advantages by A_t = r - sg(V_old(s_t)) (the row's
            reward minus the value head's V of the state its step starts from); needs value_coef > 0.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 10.0
    aggregation: Aggregation = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    tis_cap: float = 2.0
    loss_type: str = "ppo"
    kl_reference: KLReference = "base"
    value_coef: float = 0.0
    value_baseline: bool = False

    def __post_init__(self) -> None:
        check_finite_fields(self, "model.objective", allow_inf=("dual_clip",))
        def fail(field: str, why: str, fix: str) -> NoReturn:
            raise ValueError(
                f"--model.objective.{field}={getattr(self, field)!r} is invalid: {why}. {fix}"
            )

        if not 0.0 <= self.clip_low < 1.0:
            fail("clip_low", "the lower ratio bound 1 - clip_low must stay in (0, 1]",
                 "Set `clip_low` in [0, 1), e.g. 0.2 (the paper's value).")
        if self.clip_high < 0.0:
            fail("clip_high", "the upper ratio bound 1 + clip_high must be >= 1",
                 "Set `clip_high` >= 0, e.g. 0.28 (DAPO clip-higher).")
        if not self.dual_clip > 1.0 + self.clip_high:
            fail("dual_clip",
                 f"the dual-clip cap must lie above the upper clip bound 1 + clip_high = "
                 f"{1.0 + self.clip_high}, or it would cap losses PPO keeps",
                 "Set `dual_clip` > 1 + clip_high, e.g. 10.0 (the paper's value), or "
                 "math.inf to turn it off.")
        if self.aggregation not in AGGREGATIONS:
            fail("aggregation", f"it must be one of {AGGREGATIONS}",
                 "Set `aggregation` to 'token_mean' (the default) or another listed mode.")
        if self.kl_coef < 0.0:
            fail("kl_coef", "a negative coefficient would reward drifting from the reference",
                 "Set `kl_coef` >= 0 (0 = no KL, the paper's setting).")
        if self.kl_estimator not in KL_ESTIMATORS:
            fail("kl_estimator", f"it must be one of {KL_ESTIMATORS}",
                 "Set `kl_estimator` to 'k3' (the default), 'k2' or 'k1'.")
        LOSSES.check(self.loss_type)
        if self.kl_reference not in KL_REFERENCES:
            fail("kl_reference", f"it must be one of {KL_REFERENCES}",
                 "Set `kl_reference` to 'base' (the run's starting policy) or 'round'.")
        if self.value_coef < 0.0:
            fail("value_coef", "a negative weight would train the value head away from the rewards",
                 "Set `--model.objective.value_coef` >= 0 (0 = no value head; the Countdown recipe: 0.5).")
        if self.value_baseline and not self.value_coef > 0.0:
            fail("value_baseline", "the baseline V(s_t) comes from the value head, which value_coef = 0 leaves out",
                 "Set `--model.objective.value_coef` > 0 as well, or `--model.objective.value_baseline=false`.")
        if not self.tis_cap >= 1.0:
            fail("tis_cap", "a cap below 1 would down-weight even on-policy tokens",
                 "Set `tis_cap` >= 1, e.g. 2.0.")
