"""TrainingBatch: one mini-batch of an epoch's training rows, as the training step reads it.

`data_modules.examples.collate` builds each one whole when the epoch's data loader is built:
the padded rows, pi_old and the forward layout the module chose for it. Nothing is added to
it afterwards, so every pass over it (pi_old, the policy, the KL reference) sees the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flywheel.training.packing import Packed


@dataclass
class TrainingBatch:
    """B right-padded training rows of length L. A per-token field is aligned with the next-token
    targets: its position t describes token t+1, the token the logits at t predict.

    input_ids, attention_mask: [B, L]; attention_mask is 1 on each row's tokens.
    loss_mask: [B, L-1] bool, True on the response tokens the loss trains (an environment's
        observations are response tokens it does not train).
    advantages: [B, L-1] float, each target's advantage from the credit rule (0 off the response).
    behaviour_logprobs: [B, L-1] float, the generator's log-prob of each target, and pi_old's
        where the generator gave none (a cached solution's tokens).
    old_logprobs: [B, L-1] float, pi_old: the policy's log-probs before the epoch's updates.
    step_ids: [B, L-1] long, each target's step within its trajectory (-1 off the response).
    group_ids: [B] long, the mini-batch's problem of each row: the rows of one tree or one
        prompt's samples share it.
    rewards: [B] float, each row's final reward.
    weight_version: [B] long, the optimizer step of the weights that sampled each row, or None
        when a row carries none.
    staleness: [B] long, weight syncs between the weights that sampled the rows and those that
        train on them (`--data.async_search`), or None without it.
    packed: the rows as token tries (flywheel.training.packing) when the module packs this
        batch (`--model.packing`), None for one row per trajectory.

    Not frozen: Lightning moves a batch to the module's device by setting each field of a copy,
    and refuses a frozen dataclass (lightning_utilities' apply_to_collection); `packed` moves
    by its own `to`.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    behaviour_logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    step_ids: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor
    weight_version: torch.Tensor | None = None
    staleness: torch.Tensor | None = None
    packed: Packed | None = None
