"""Training rows into padded mini-batches, each built whole: pi_old, the module's packing
decision and the rows' staleness are in it from the start (flywheel.training.batch.TrainingBatch).

The rows themselves (one per trajectory: prompt, response, per-token advantage, behaviour
log-prob and step index) come from the credit rules of `flywheel.objectives.credit`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

import torch

from flywheel.objectives.credit import TrainingRow
from flywheel.training.batch import TrainingBatch
from flywheel.training.packing import Packed

Pack = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Packed | None]
"""The module's packing decision for one mini-batch (flywheel.ports.PolicyPort.pack_batch):
input_ids, attention_mask [B, L] and group_ids [B] -> the rows' token tries, or None for one
row per trajectory."""

Score = Callable[[torch.Tensor, torch.Tensor, Packed | None], torch.Tensor]
"""pi_old of one mini-batch (flywheel.ports.PolicyPort.score_batch): input_ids, attention_mask
[B, L] and the packed layout -> [B, L-1] log-probs of the policy before the epoch's updates."""


def collate(rows: Sequence[TrainingRow], pad_id: int, *, pack: Pack, score: Score,
            staleness: int | None = None) -> TrainingBatch:
    """The rows as one right-padded mini-batch (shapes: TrainingBatch), laid out by `pack` and
    scored by `score` once, here; `staleness` (weight syncs behind the trainer, with
    `--data.async_search`) is stamped on every row.

    weight_version is set when every row is stamped with one. The generator's log-probs are
    unknown (NaN) on some tokens (a cached solution's); pi_old stands in for them there.
    """
    if not rows:
        raise ValueError("cannot collate an empty mini-batch")
    length = max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    b = len(rows)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length - 1), dtype=torch.bool)
    advantages = torch.zeros((b, length - 1), dtype=torch.float32)
    behaviour = torch.full((b, length - 1), float("nan"), dtype=torch.float32)
    step_ids = torch.full((b, length - 1), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        input_ids[i, : p + r] = torch.tensor(row.prompt_ids + row.response_ids)
        attention_mask[i, : p + r] = 1
        span = slice(p - 1, p - 1 + r)  # targets p .. p+r-1 are predicted at positions p-1 ..
        loss_mask[i, span] = torch.tensor(row.loss_mask) if row.loss_mask else True
        advantages[i, span] = torch.tensor(row.advantages)
        behaviour[i, span] = torch.tensor(row.behaviour_logprobs)
        step_ids[i, span] = torch.tensor(row.step_ids)
    group_ids = torch.tensor([r.group for r in rows], dtype=torch.long)
    packed = pack(input_ids, attention_mask, group_ids)
    old_logprobs = score(input_ids, attention_mask, packed)
    stamped = all(r.weight_version is not None for r in rows)
    return TrainingBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        advantages=advantages,
        behaviour_logprobs=torch.where(torch.isnan(behaviour), old_logprobs, behaviour),
        old_logprobs=old_logprobs,
        step_ids=step_ids,
        group_ids=group_ids,
        rewards=torch.tensor([r.reward for r in rows], dtype=torch.float32),
        weight_version=torch.tensor([r.weight_version for r in rows], dtype=torch.long) if stamped else None,
        staleness=None if staleness is None else torch.full((b,), staleness, dtype=torch.long),
        packed=packed,
    )


def empty_batch(pad_id: int) -> TrainingBatch:
    """A one-row batch with no response token: loss 0, zero gradients. Keeps the number of
    optimizer steps equal on every rank when a rank has nothing to train on in a slot."""
    return TrainingBatch(
        input_ids=torch.full((1, 2), pad_id, dtype=torch.long),
        attention_mask=torch.ones((1, 2), dtype=torch.long),
        loss_mask=torch.zeros((1, 1), dtype=torch.bool),
        advantages=torch.zeros((1, 1)),
        behaviour_logprobs=torch.zeros((1, 1)),
        old_logprobs=torch.zeros((1, 1)),
        step_ids=torch.full((1, 1), -1, dtype=torch.long),
        group_ids=torch.zeros(1, dtype=torch.long),
        rewards=torch.zeros(1),
    )


def mini_batches(
    per_problem: Sequence[Sequence[TrainingRow]],
    *,
    problems_per_rank: int,
    problems_per_batch: int,
    world: int,
    pad_id: int,
    pack: Pack,
    score: Score,
    staleness: int | None = None,
) -> list[TrainingBatch]:
    """An epoch's mini-batches, `problems_per_batch` problems each (a problem's rows stay
    together: the group baseline needs them), each built whole by `collate`: laid out by
    `pack`, pi_old scored by `score`, every row stamped with `staleness`.

    Every rank makes the same number of optimizer steps, or DDP's gradient all-reduce would
    hang: with `world` > 1 a slot with nothing to train on becomes an all-masked batch. An
    epoch with nothing to train on at all (every group left out by a filter) is one
    all-masked batch too: an empty loader would end the fit ("No training batches")."""
    slots = math.ceil(problems_per_rank / problems_per_batch)
    batches = []
    for slot in range(slots):
        first = slot * problems_per_batch
        rows = [replace(row, group=group) for group, problem_rows in enumerate(per_problem[first : first + problems_per_batch])
                for row in problem_rows]
        if rows:
            batch = collate(rows, pad_id, pack=pack, score=score, staleness=staleness)
        elif world > 1:
            batch = empty_batch(pad_id=pad_id)
        else:
            continue
        batches.append(batch)
    return batches or [empty_batch(pad_id=pad_id)]
