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
Switched to flywheel.training.tree_attention (`enable_tree_attention`), attention is block-sparse and
its cost follows the ancestor pairs; otherwise the mask is dense P x P per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from flywheel.logprobs import row_logsumexp
from flywheel.training.tree_attention import TreeLayout, ancestor_mask, tree_layout, uses_tree_attention

PACKABLE_MODEL_TYPES = frozenset({"llama", "qwen2"})
"""transformers model types whose attention honours a custom 4D mask with position ids."""


@dataclass
class Packed:
    """A mini-batch's rows as one packed sequence per group.

    input_ids, position_ids, parent: [G, P]; parent is the packed index of the previous token
    on the token's path (-1 for a row's first token and for padding). row_group: [B] the
    packed sequence of each flat row. index: [B, L] the packed position of each flat token
    (-1 on padding). origin: [G, P] the flat row that first holds each packed token (-1 on
    padding); its ancestors are that row's tokens before it.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    parent: torch.Tensor
    row_group: torch.Tensor
    index: torch.Tensor
    origin: torch.Tensor
    layout: TreeLayout | None = None
    """The block-sparse attention layout (flywheel.training.tree_attention), when built."""

    @property
    def tokens(self) -> int:
        """Packed positions holding a token (padding excluded)."""
        return int((self.position_ids >= 0).sum())

    def group_tokens(self) -> torch.Tensor:
        """[G] real tokens of each packed sequence (they come first)."""
        return (self.position_ids >= 0).sum(dim=1)

    def with_layout(self) -> Packed:
        """This batch with its tree-attention layout built (once per mini-batch)."""
        if self.layout is None:
            self.layout = tree_layout(self.position_ids.cpu(), self.origin.cpu(), self.index.cpu())
        return self

    def to(self, device: torch.device | str, **kwargs) -> Packed:
        """A copy on `device` (also what Lightning's batch transfer calls)."""
        fields = (self.input_ids, self.position_ids, self.parent, self.row_group, self.index, self.origin)
        layout = None if self.layout is None else self.layout.to(device)
        return Packed(*(t.to(device, **kwargs) for t in fields), layout=layout)


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
    origins: list[list[int]] = [[] for _ in order]
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
                origins[g].append(b)
            where.append(node)
            prev = node
        index[b, : len(where)] = torch.tensor(where, dtype=torch.long)
    width = max(len(t) for t in tokens)
    packed_ids = torch.full((len(order), width), pad_id, dtype=torch.long)
    position = torch.full((len(order), width), -1, dtype=torch.long)
    parent = torch.full((len(order), width), -1, dtype=torch.long)
    origin = torch.full((len(order), width), -1, dtype=torch.long)
    for g in range(len(order)):
        n = len(tokens[g])
        packed_ids[g, :n] = torch.tensor(tokens[g], dtype=torch.long)
        position[g, :n] = torch.tensor(depths[g], dtype=torch.long)
        parent[g, :n] = torch.tensor(parents[g], dtype=torch.long)
        origin[g, :n] = torch.tensor(origins[g], dtype=torch.long)
    return Packed(packed_ids, position, parent, row_group, index, origin)


def pack_for(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, group_ids: torch.Tensor,
             pad_id: int = 0) -> Packed:
    """`pack_rows` laid out for `model`'s attention. With tree attention the whole mini-batch is
    ONE trie (exact: a token's log-prob depends on its prefix only, whichever tree holds it),
    so there is no padding between groups and rows of different trees share their common
    prefix; the block layout is built here, once. With the dense mask, one sequence per group
    keeps each P x P mask small."""
    if not uses_tree_attention(model):
        return pack_rows(input_ids, attention_mask, group_ids, pad_id)
    return pack_rows(input_ids, attention_mask, torch.zeros_like(group_ids), pad_id).with_layout()


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences -> right-padded ids and attention mask, both [B, max length]."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def packed_logprobs(model: torch.nn.Module, packed: Packed, flat_shape: torch.Size) -> torch.Tensor:
    """Flat-layout next-token log-probs [B, L-1] (position t predicts flat token t+1), from
    one forward pass over the packed sequences: block-sparse tree attention when the model
    uses it (flywheel.training.tree_attention), else the dense [G, 1, P, P] ancestor mask."""
    g, p = packed.input_ids.shape
    position_ids = packed.position_ids.clamp(min=0)
    if uses_tree_attention(model):
        layout = packed.layout
        if layout is None:
            layout = packed.to("cpu").with_layout().layout.to(packed.input_ids.device)
        # A 4D mask is taken as given (no P x P causal mask is built); the layout replaces it.
        dummy = torch.ones((g, 1, 1, 1), dtype=torch.bool, device=packed.input_ids.device)
        logits = model(input_ids=packed.input_ids, attention_mask=dummy, position_ids=position_ids,
                       tree_layout=layout).logits  # [G, P, V]
    else:
        logits = model(input_ids=packed.input_ids, attention_mask=ancestor_mask(packed.parent),
                       position_ids=position_ids).logits  # [G, P, V]
    # A token's log-prob is read from its parent's logits: logit[parent, token] - logsumexp[parent].
    rows = logits.reshape(g * p, -1)  # [G*P, V]
    source = (torch.arange(g, device=rows.device)[:, None] * p + packed.parent.clamp(min=0)).reshape(-1)  # [G*P]
    picked = rows[source, packed.input_ids.reshape(-1)].float()
    per_token = (picked - row_logsumexp(rows)[source]).view(g, p)  # [G, P]; junk where parent = -1
    b, length = flat_shape
    targets = packed.index[:, 1:]  # [B, L-1] packed position of flat token t+1
    group = packed.row_group[:, None].expand(-1, length - 1)
    out = per_token[group, targets.clamp(min=0)]
    return torch.where(targets >= 0, out, torch.zeros_like(out))


MIN_TOKEN_RATIO = 1.2
"""`packing="auto"` packs a mini-batch when a flat pass would compute at least this many times
the packed tokens. tools/bench_train.py measured the packed step at about 0.9x the token
ratio in time (tiny policy, block-sparse attention), so below ~1.1 the gathers and the
layout cost more than the shared tokens save."""


def packing_pays(packed: Packed, attention_mask: torch.Tensor, tree_attention: bool) -> bool:
    """The `packing="auto"` rule for one mini-batch: flat tokens / packed tokens >=
    MIN_TOKEN_RATIO and, with the dense mask (no tree attention), the packed attention pairs
    G x P^2 no more than the flat form's B x L^2 (the dense mask grows with the square of
    the packed length, the tree layout with the ancestor pairs only)."""
    if attention_mask.sum() < MIN_TOKEN_RATIO * packed.tokens:
        return False
    if tree_attention:
        return True
    g, p = packed.input_ids.shape
    b, length = attention_mask.shape
    return g * p * p <= b * length * length


def packable(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in PACKABLE_MODEL_TYPES
