"""Turning a [B, T] matrix of per-token losses into one scalar.

- "token_mean": sum over all response tokens / their number. Every token of the
  mini-batch weighs the same (DAPO; DeepSearch code "token-mean").
- "step_mean": the paper's 1/|s_j| per-step normalisation (DeepSearch Eq. 14). A step is
  a (row, step id) pair: its tokens are averaged, then the mean is taken over every step
  of every row in the mini-batch, so each step of each trajectory weighs the same
  whatever its token count. A step shared by several trajectories of a tree appears once
  per row that holds it, as in the flat (unpacked) batch.
- "sequence_mean": tokens averaged per row, then mean over rows (GRPO's original form).
  Rows with no response token are left out.

`denominator` replaces the count of units (tokens, steps or rows) by a caller-given
number, e.g. the count over the whole mini-batch when it is split into micro-batches
or across ranks, so the sum of the pieces equals the mean of the whole.
"""

from __future__ import annotations

import torch

from flywheel.objectives.config import AGGREGATIONS, ObjectiveConfig


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` [B, T] over mask [B, T] == 1; 0 when the mask is empty. NaN-safe
    at masked positions (torch.where, not a product)."""
    valid = mask.bool()
    total = torch.where(valid, values, torch.zeros_like(values)).sum()
    return total / valid.sum().clamp(min=1)


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = ObjectiveConfig.aggregation,
    step_ids: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses to a scalar (modes: see the module docstring).

    Args:
        loss: [B, T] per-token loss.
        mask: [B, T] 1/True on response tokens.
        aggregation: "token_mean", "step_mean" or "sequence_mean".
        step_ids: [B, T] integer step index (0, 1, ...) of each token within its row;
            needed by "step_mean", ignored where mask is 0 (padding may hold -1).
        denominator: number of units to divide by instead of this batch's count.
    Returns:
        [] scalar.
    """
    if loss.shape != mask.shape or loss.dim() != 2:
        raise ValueError(
            f"loss {tuple(loss.shape)} and mask {tuple(mask.shape)} must both be [B, T]"
        )
    valid = mask.bool()
    loss = torch.where(valid, loss, torch.zeros_like(loss))  # [B, T]; garbage/NaN at pads -> 0

    if aggregation == "token_mean":
        total, count = loss.sum(), valid.sum()
    elif aggregation == "sequence_mean":
        row_tokens = valid.sum(dim=1)  # [B]
        total = (loss.sum(dim=1) / row_tokens.clamp(min=1)).sum()
        count = (row_tokens > 0).sum()
    elif aggregation == "step_mean":
        if step_ids is None or step_ids.shape != loss.shape:
            raise ValueError(
                "aggregation='step_mean' needs step_ids [B, T] (the step index of each token "
                "within its row); pass step_ids, or use aggregation='token_mean'"
            )
        if (step_ids[valid] < 0).any():
            raise ValueError("step_ids must be >= 0 on response tokens (mask == 1)")
        n_steps = int(step_ids[valid].max()) + 1 if valid.any() else 1
        rows = torch.arange(loss.shape[0], device=loss.device)[:, None]  # [B, 1]
        keys = (rows * n_steps + step_ids)[valid]  # [N] one key per (row, step)
        _, bucket = torch.unique(keys, return_inverse=True)  # [N] in 0..S_total-1
        n_buckets = int(bucket.max()) + 1 if bucket.numel() else 0
        picked = loss[valid]  # [N]
        sums = loss.new_zeros(n_buckets).index_add(0, bucket, picked)  # [S_total]
        sizes = loss.new_zeros(n_buckets).index_add(0, bucket, torch.ones_like(picked))
        total, count = (sums / sizes).sum(), torch.tensor(n_buckets, device=loss.device)
    else:
        raise ValueError(
            f"unknown aggregation {aggregation!r}; choose one of {AGGREGATIONS} "
            "(ObjectiveConfig.aggregation)"
        )
    if denominator is not None:
        return total / denominator
    return total / count.clamp(min=1)
