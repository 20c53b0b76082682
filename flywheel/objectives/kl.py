"""KL penalty to a frozen reference policy (off by default: DeepSearch uses no KL)."""

from __future__ import annotations

import torch

from flywheel.objectives.aggregation import aggregate
from flywheel.objectives.config import KL_ESTIMATORS, ObjectiveConfig
from flywheel.objectives.policy_loss import LOG_RATIO_CLAMP

_D = ObjectiveConfig


def kl_per_token(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kind: str = _D.kl_estimator,
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled by pi_theta
    (Schulman, "Approximating KL divergence", 2020). With d = ref_logprobs - logprobs:

        k1 = -d                    unbiased, can be negative
        k2 = d^2 / 2               biased, low variance
        k3 = exp(d) - d - 1        unbiased, >= 0, low variance (GRPO's choice)

    Args:
        logprobs: [B, T] log pi_theta, with grad.
        ref_logprobs: [B, T] log pi_ref.
        mask: [B, T] 1/True on response tokens.
        kind: "k1", "k2" or "k3".
    Returns:
        [B, T], 0 where mask is 0.
    """
    valid = mask.bool()
    d = torch.where(valid, ref_logprobs - logprobs, torch.zeros_like(logprobs))
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # exp(d) stays finite
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        return torch.exp(d) - d - 1.0
    raise ValueError(
        f"unknown KL estimator {kind!r}; choose one of {KL_ESTIMATORS} "
        "(ObjectiveConfig.kl_estimator)"
    )


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kind: str = _D.kl_estimator,
    aggregation: str = _D.aggregation,
    step_ids: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """`kl_per_token` aggregated like the policy loss; the caller multiplies by kl_coef.

    Returns:
        [] scalar.
    """
    per_token_kl = kl_per_token(logprobs, ref_logprobs, mask, kind)  # [B, T]
    return aggregate(per_token_kl, mask, aggregation, step_ids, denominator)
