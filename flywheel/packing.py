"""Tree-packed forward passes: every shared prefix of a tree's trajectories computed once.

The K trajectories of a search tree share the prompt and most early steps. Flat training
runs one row per trajectory and recomputes those tokens K times. Packing puts the token
trie of a group's rows into ONE sequence: each distinct prefix is one position, its
position id is its depth (its index in the flat row), and it attends to its ancestors only
(a 4D boolean mask). The log-prob of a token is read from its parent's logits. The result
is laid back out as the flat [B, L-1] log-probs, so the loss (clipping, aggregation,
token-mean over the flat tokens) is unchanged and exact: a shared token's log-prob is one
tensor element that the gather hands to every row that contains it, and its gradient is
the sum of theirs.

Pure torch; the model is any causal LM whose forward takes a 4D boolean attention mask and
explicit position ids (transformers' Llama and Qwen2 families do, through sdpa or eager).
The mask is P x P per group, fine for the trees of a CPU run or a few thousand tokens; very
long trees want a block-sparse (flex attention) mask instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from flywheel.objectives.logprobs import token_logprobs

PACKABLE_MODEL_TYPES = frozenset({"llama", "qwen2"})
"""transformers model types whose attention honours a custom 4D mask with position ids."""


@dataclass
class Packed:
    """A mini-batch's rows as one packed sequence per group.

    input_ids, position_ids, parent: [G, P]; parent is the packed index of the previous token
    on the token's path (-1 for a row's first token and for padding). row_group: [B] the
    packed sequence of each flat row. index: [B, L] the packed position of each flat token
    (-1 on padding).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    parent: torch.Tensor
    row_group: torch.Tensor
    index: torch.Tensor

    @property
    def tokens(self) -> int:
        """Packed positions holding a token (padding excluded)."""
        return int((self.position_ids >= 0).sum())


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, group_ids: torch.Tensor, pad_id: int = 0) -> Packed:
    """Build the token trie of each group's rows (right-padded flat rows, as `collate` makes).

    Args:
        input_ids, attention_mask: [B, L]; attention_mask 1 on real tokens, a prefix of each row.
        group_ids: [B]; rows with equal ids are packed together (one tree, or one prompt's samples).
    """
    ids = input_ids.tolist()
    lengths = attention_mask.sum(dim=1).tolist()
    order: dict[int, int] = {}
    for g in group_ids.tolist():
        order.setdefault(g, len(order))
    tries: list[dict[tuple[int, int], int]] = [{} for _ in order]
    tokens: list[list[int]] = [[] for _ in order]
    parents: list[list[int]] = [[] for _ in order]
    depths: list[list[int]] = [[] for _ in order]
    index = torch.full(input_ids.shape, -1, dtype=torch.long)
    row_group = torch.tensor([order[g] for g in group_ids.tolist()], dtype=torch.long)
    for b, (row, length) in enumerate(zip(ids, lengths)):
        g = int(row_group[b])
        trie, prev, where = tries[g], -1, []
        for t in range(int(length)):
            key = (prev, row[t])
            node = trie.get(key)
            if node is None:
                node = len(tokens[g])
                trie[key] = node
                tokens[g].append(row[t])
                parents[g].append(prev)
                depths[g].append(t)
            where.append(node)
            prev = node
        index[b, : len(where)] = torch.tensor(where, dtype=torch.long)
    width = max(len(t) for t in tokens)
    packed_ids = torch.full((len(order), width), pad_id, dtype=torch.long)
    position = torch.full((len(order), width), -1, dtype=torch.long)
    parent = torch.full((len(order), width), -1, dtype=torch.long)
    for g in range(len(order)):
        n = len(tokens[g])
        packed_ids[g, :n] = torch.tensor(tokens[g], dtype=torch.long)
        position[g, :n] = torch.tensor(depths[g], dtype=torch.long)
        parent[g, :n] = torch.tensor(parents[g], dtype=torch.long)
    return Packed(packed_ids, position, parent, row_group, index)


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences -> right-padded ids and attention mask, both [B, max length]."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def ancestor_mask(parent: torch.Tensor) -> torch.Tensor:
    """[G, P] parent pointers (each parent before its child) -> [G, 1, P, P] bool mask:
    position i may attend to j iff j is i or an ancestor of i. Padding attends to itself."""
    g, p = parent.shape
    mask = torch.zeros((g, p, p), dtype=torch.bool, device=parent.device)
    eye = torch.eye(p, dtype=torch.bool, device=parent.device)
    rows = torch.arange(g, device=parent.device)
    for i in range(p):  # parents come first, so their rows are complete when read
        has = parent[:, i] >= 0
        inherited = mask[rows, parent[:, i].clamp(min=0)] & has[:, None]  # [G, P]
        mask[:, i] = inherited | eye[i]
    return mask[:, None]


def packed_logprobs(model: torch.nn.Module, packed: Packed, flat_shape: torch.Size) -> torch.Tensor:
    """Flat-layout next-token log-probs [B, L-1] (position t predicts flat token t+1), from
    one forward pass over the packed sequences."""
    device = packed.input_ids.device
    mask = ancestor_mask(packed.parent)
    logits = model(
        input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids.clamp(min=0)
    ).logits  # [G, P, V]
    source = packed.parent.clamp(min=0)  # the position whose logits predict each token
    at_parent = logits.gather(1, source[..., None].expand(-1, -1, logits.shape[-1]))  # [G, P, V]
    per_token = token_logprobs(at_parent, packed.input_ids)  # [G, P]; junk where parent = -1
    b, length = flat_shape
    targets = packed.index[:, 1:].to(device)  # [B, L-1] packed position of flat token t+1
    rows = packed.row_group.to(device)[:, None].expand(-1, length - 1)
    out = per_token[rows, targets.clamp(min=0)]
    return torch.where(targets >= 0, out, torch.zeros_like(out))


def packable(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in PACKABLE_MODEL_TYPES
