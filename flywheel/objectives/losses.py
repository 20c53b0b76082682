"""The policy losses, every one in one table (`LOSSES`), read by the settings check
(`--model.objective.loss_type`), `policy_loss`, the LightningModule and the credit check.

A loss is either a clipped surrogate on the importance ratio (`surrogate`: per token, from the
ratio, the advantage and the log-prob; `policy_loss` masks, weights and aggregates it), or one
that trains on the paths' weights instead of a ratio (`weights_paths`: ReST-MCTS*'s
self-training, `flywheel.objectives.self_training_loss`, paired with the credit rule that puts
path weights in the advantage column). A new surrogate is one function and one `LOSSES.register(LossRule(...))`, from the library or
from a user's module (`--plugins`, flywheel.tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from flywheel.tables import Table

Surrogate = Callable[..., torch.Tensor]
"""(ratio, adv, logprobs, clip_low, clip_high, dual_clip) -> [B, T] per-token loss. `ratio`
[B, T] carries the gradient, `adv` [B, T] is detached; masked positions hold zeros."""


def ppo_surrogate(ratio, adv, logprobs, clip_low: float, clip_high: float, dual_clip: float) -> torch.Tensor:
    """max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high)), capped at -A dual_clip where A < 0."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    return torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)


def cispo_surrogate(ratio, adv, logprobs, clip_low: float, clip_high: float, dual_clip: float) -> torch.Tensor:
    """-sg(clip(rho, 1 - clip_low, 1 + clip_high)) A log pi: the clip weights the gradient, drops no token."""
    return -adv * ratio.detach().clamp(1.0 - clip_low, 1.0 + clip_high) * logprobs


@dataclass(frozen=True)
class LossRule:
    name: str
    summary: str
    surrogate: Surrogate | None = None
    """The per-token clipped surrogate; None for a loss that weights paths."""
    weights_paths: bool = False
    """Trains on the credit rule's path weights (`self_training_loss`), no ratio, no clip."""


LOSSES: Table[LossRule] = Table("--model.objective.loss_type")
"""Every policy loss by name (flywheel.tables: the first is the default)."""
LOSSES.register(LossRule("ppo", "PPO's clipped ratio with DAPO clip-higher and the dual clip (the paper, Eq. 14)",
                         ppo_surrogate))
LOSSES.register(LossRule("cispo", "CISPO's clipped, stop-gradient importance weight on the log-prob (MiniMax-M1)",
                         cispo_surrogate))
LOSSES.register(LossRule("self_training", "ReST-MCTS*'s path-weighted log-likelihood of the tree's paths (no ratio)",
                         weights_paths=True))
