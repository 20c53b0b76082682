"""The process reward / value model: a causal LM backbone with a scalar head.

V(question, partial solution) = Linear(hidden state of the last token), trained with MSE
to the ReST-MCTS* targets (flywheel.prm.targets) and clipped to [0, 1] where it is used.
By default the backbone starts as a copy of the policy of the round that produced the
trees, so the scorer of round i+1's search is round i's model (spec §A).
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from flywheel.training.packing import right_pad
from flywheel.policies.load import merged


class ValueModel(nn.Module):
    """Scalar value head over a transformers decoder (e.g. `LlamaForCausalLM.model`)."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.constant_(self.head.bias, 0.5)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> ValueModel:
        """A value model whose backbone is a copy of `policy`'s decoder (the LM head dropped;
        LoRA adapters, if any, folded into the weights)."""
        plain = merged(policy)  # a copy already when adapters were folded in
        backbone = plain.base_model if plain is not policy else copy.deepcopy(policy.base_model)
        hidden = policy.config.get_text_config().hidden_size
        return cls(backbone, hidden).to(next(policy.parameters()).device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L] right-padded ids -> [B] raw values (the hidden state of each row's last token)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, L, H]
        last = attention_mask.sum(dim=1) - 1  # [B]
        picked = hidden[torch.arange(len(last), device=hidden.device), last]  # [B, H]
        return self.head(picked.float()).squeeze(-1)

    @torch.no_grad()
    def score(self, sequences: Sequence[Sequence[int]], pad_id: int, batch_size: int = 256) -> list[float]:
        """Clipped values in [0, 1] of token sequences (prompt + partial response)."""
        was_training = self.training
        self.eval()
        out: list[float] = []
        try:
            device = next(self.parameters()).device
            for lo in range(0, len(sequences), batch_size):
                ids, mask = right_pad(sequences[lo : lo + batch_size], pad_id)
                out += self(ids.to(device), mask.to(device)).clamp(0.0, 1.0).tolist()
        finally:
            self.train(was_training)
        return out


@dataclass(frozen=True)
class PRMTrainConfig:
    """How the value model is fitted at each round's end.

    Args:
        lr: AdamW learning rate.
        epochs: passes over the accumulated samples.
        batch_size: samples per optimizer step.
        weight_decay: AdamW weight decay.
    """

    lr: float = 1e-4
    epochs: int = 2
    batch_size: int = 64
    weight_decay: float = 0.0


def fit_value_model(
    model: ValueModel,
    samples: Sequence[tuple[Sequence[int], float]],
    config: PRMTrainConfig,
    pad_id: int,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
) -> tuple[float, torch.optim.Optimizer]:
    """MSE regression of `model` onto (sequence, target) samples; returns the last epoch's
    mean loss and the optimizer (kept so its state is part of the checkpoint)."""
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    device = next(model.parameters()).device
    rng = random.Random(seed)
    order = list(range(len(samples)))
    model.train()
    mean = math.nan
    for _ in range(config.epochs):
        rng.shuffle(order)
        total, count = 0.0, 0
        for lo in range(0, len(order), config.batch_size):
            batch = [samples[i] for i in order[lo : lo + config.batch_size]]
            ids, mask = right_pad([s for s, _ in batch], pad_id)
            target = torch.tensor([t for _, t in batch], dtype=torch.float32, device=device)
            loss = torch.nn.functional.mse_loss(model(ids.to(device), mask.to(device)), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        mean = total / max(count, 1)
    model.eval()
    return mean, optimizer


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve (ties count half); NaN when one class is missing."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return math.nan
    ranked = sorted([(s, 1) for s in pos] + [(s, 0) for s in neg])
    # Mann-Whitney U with average ranks for ties.
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        avg = (i + j + 1) / 2  # ranks are 1-based
        rank_sum += avg * sum(label for _, label in ranked[i:j])
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def calibration_error(scores: Sequence[float], labels: Sequence[bool], bins: int = 10) -> float:
    """Expected calibration error of scores in [0, 1] as probabilities of `labels`."""
    if not scores:
        return math.nan
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [(s, y) for s, y in zip(scores, labels) if lo <= s < hi or (b == bins - 1 and s == 1.0)]
        if members:
            confidence = sum(s for s, _ in members) / len(members)
            accuracy = sum(y for _, y in members) / len(members)
            total += len(members) / len(scores) * abs(confidence - accuracy)
    return total
