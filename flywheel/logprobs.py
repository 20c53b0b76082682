"""Per-token log-probabilities from model logits, in fp32.

They are computed on row chunks of the flattened [B*T, V] logits, so the fp32 copy of
bf16 logits and the exp() temporaries are one chunk at a time, never the whole
[B, T, V] log_softmax.
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 1024
"""Token positions processed at once: 1024 x 152k vocab x 4 bytes ~ 0.6 GB of fp32 temporaries."""


def _check(logits: torch.Tensor, temperature: float) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(
            f"temperature must be > 0, got {temperature}; use the generator's sampling "
            "temperature (greedy sampling has no log-probs to correct)"
        )


def token_logprobs(
    logits: torch.Tensor, target_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / temperature)[target], in fp32.

    Computed as logit[target] - logsumexp(logits), which never builds the full
    log_softmax. `temperature` must match the one the tokens were sampled at, or the
    ratio pi_theta / pi_old is biased from the first step.

    Args:
        logits: [B, T, V] (any float dtype) where logits[:, t] predicts target_ids[:, t].
        target_ids: [B, T] token ids.
    Returns:
        [B, T] fp32 log-probabilities.
    """
    _check(logits, temperature)
    if target_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"target_ids {tuple(target_ids.shape)} must match logits [B, T] "
            f"{tuple(logits.shape[:2])}"
        )
    flat = logits.reshape(-1, logits.shape[-1])  # [B*T, V]
    ids = target_ids.reshape(-1, 1)  # [B*T, 1]
    out = []
    for start in range(0, flat.shape[0], CHUNK_ROWS):
        chunk = flat[start : start + CHUNK_ROWS].float() / temperature  # [C, V]
        picked = chunk.gather(1, ids[start : start + CHUNK_ROWS]).squeeze(1)  # [C]
        out.append(picked - torch.logsumexp(chunk, dim=-1))
    if not out:
        return logits.new_zeros(target_ids.shape, dtype=torch.float32)
    return torch.cat(out).reshape(target_ids.shape)


def row_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """[N, V] logits (any float dtype) -> [N] fp32 logsumexp, one chunk of rows at a time."""
    out = [torch.logsumexp(logits[start : start + CHUNK_ROWS].float(), dim=-1) for start in range(0, logits.shape[0], CHUNK_ROWS)]
    return torch.cat(out) if out else logits.new_zeros((0,), dtype=torch.float32)

