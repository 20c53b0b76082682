"""The clipped policy-gradient loss of Tree-GRPO / DAPO, and the truncated importance weight."""

from __future__ import annotations

import torch

from flywheel.objectives.aggregation import aggregate, masked_mean
from flywheel.objectives.config import ObjectiveConfig
from flywheel.objectives.losses import LOSSES, Surrogate

_D = ObjectiveConfig

LOG_RATIO_CLAMP = 20.0
"""|log rho| is clamped to this before exp: exp(20) ~ 4.9e8 is finite in fp32 and far past
every clip bound, so the clamp changes no clipped value, only prevents inf."""


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = _D.clip_low,
    clip_high: float = _D.clip_high,
    dual_clip: float = _D.dual_clip,
    aggregation: str = _D.aggregation,
    step_ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
    loss_type: str = _D.loss_type,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A clipped surrogate of `LOSSES` (PPO with DAPO clip-higher and dual clip, DeepSearch Eq. 14, or CISPO).

    Per token, rho = exp(logprobs - old_logprobs):
        "ppo":   L = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
                 L = min(L, -A * dual_clip)      if A < 0
        "cispo": L = -sg(clip(rho, 1 - clip_low, 1 + clip_high)) * A * logprobs
                 (its gradient is -clip(rho) * A * grad log pi: PPO's without dropped tokens)
    then `aggregate`d. Minimising L maximises the surrogate objective.

    Masked positions are selected away with torch.where before any arithmetic, so
    garbage there (-inf log-probs, NaN advantages) yields neither NaN loss nor NaN grads.

    Args:
        logprobs: [B, T] log pi_theta(token), with grad.
        old_logprobs: [B, T] log pi_old(token) (no grad needed).
        advantages: [B, T] per-token advantage.
        mask: [B, T] 1/True on response tokens.
        clip_low, clip_high, dual_clip: see `ObjectiveConfig`.
        aggregation: "token_mean" | "step_mean" | "sequence_mean" (see `aggregate`).
        step_ids: [B, T] step index of each token, for "step_mean".
        weights: [B, T] per-token factor on the loss (e.g. `truncated_importance_weight`),
            treated as a constant.
        denominator: passed to `aggregate`.
    Returns:
        loss [] and stats (detached [] tensors; token means over the mask):
        clip_frac_low (A < 0 and rho < 1 - clip_low: gradient removed by the lower clip),
        clip_frac_high (A > 0 and rho > 1 + clip_high: removed by the upper clip),
        dual_clip_frac (A < 0 and rho > dual_clip), ratio_mean, approx_kl (k3 estimate of
        KL(pi_old || pi_theta): rho - 1 - log rho).
    """
    if not (logprobs.shape == old_logprobs.shape == advantages.shape == mask.shape):
        raise ValueError(
            "logprobs, old_logprobs, advantages and mask must share one [B, T] shape, got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, "
            f"{tuple(advantages.shape)}, {tuple(mask.shape)}"
        )
    valid = mask.bool()
    zeros = torch.zeros_like(logprobs)
    log_ratio = torch.where(valid, logprobs - old_logprobs, zeros)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = torch.where(valid, advantages, zeros).detach()  # [B, T]

    surrogate = _surrogate(loss_type)
    loss = surrogate(ratio, adv, torch.where(valid, logprobs, zeros), clip_low, clip_high, dual_clip)  # [B, T]
    if weights is not None:
        loss = loss * torch.where(valid, weights, zeros).detach()
    total = aggregate(loss, valid, aggregation, step_ids, denominator)

    with torch.no_grad():
        ratio_d, log_ratio_d = ratio.detach(), log_ratio.detach()
        stats = {
            "clip_frac_low": masked_mean(((adv < 0) & (ratio_d < 1.0 - clip_low)).float(), valid),
            "clip_frac_high": masked_mean(((adv > 0) & (ratio_d > 1.0 + clip_high)).float(), valid),
            "dual_clip_frac": masked_mean(((adv < 0) & (ratio_d > dual_clip)).float(), valid),
            "ratio_mean": masked_mean(ratio_d, valid),
            "approx_kl": masked_mean(ratio_d - 1.0 - log_ratio_d, valid),
        }
    return total, stats


def _surrogate(loss_type: str) -> Surrogate:
    rule = LOSSES.get(loss_type)
    if rule is None or rule.surrogate is None:
        clipped = [name for name, r in LOSSES.items() if r.surrogate is not None]
        raise ValueError(f"policy_loss takes a loss_type with a clipped surrogate, one of {clipped}, got {loss_type!r}"
                         + (" (it weights paths: flywheel.objectives.self_training_loss)" if rule else ""))
    return rule.surrogate


def truncated_importance_weight(
    target_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float = _D.tis_cap,
) -> torch.Tensor:
    """Truncated importance sampling (TIS) weight, per token:

        w = min(exp(target_logprobs - behaviour_logprobs), cap)

    The generator (vLLM, or the in-process sampler at another precision) is the behaviour
    policy mu that produced the tokens; the PPO objective is defined under the trainer's
    pi_old. Multiplying each token's loss by w = min(pi_old / mu, C) corrects for the
    mismatch with bounded variance (Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"). When the trainer takes the generator's log-probs
    as old_logprobs, pass the trainer's log-probs of the same tokens (detached) as target.

    Args:
        target_logprobs: [B, T] log pi_old (trainer) of the sampled tokens.
        behaviour_logprobs: [B, T] log mu (generator) of the same tokens.
        mask: [B, T] 1/True on response tokens.
        cap: C >= 1.
    Returns:
        [B, T] detached weights in [0, cap]; 1 where mask is 0.
    """
    valid = mask.bool()
    zeros = torch.zeros_like(target_logprobs)
    log_w = torch.where(valid, target_logprobs - behaviour_logprobs, zeros)  # [B, T]
    return torch.exp(log_w.detach().clamp(max=LOG_RATIO_CLAMP)).clamp(max=cap)
