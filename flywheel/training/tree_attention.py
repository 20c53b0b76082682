"""Block-sparse attention over a packed token trie: cost follows the tree's distinct tokens.

A packed tree (flywheel.training.packing) holds P distinct tokens; a token attends to its ancestors
only. A dense P x P mask makes attention cost grow with P^2 although each token has only
its depth's worth of ancestors, so long trees lost to the flat form (issue 18). Here the
packed positions are cut into query blocks of `block` consecutive tokens; each block
attends to the sorted union of its tokens' ancestors (one path or a few, since a row's new
tokens are packed contiguously), gathered into a short key list. Blocks with key lists of
about the same length form one batched `scaled_dot_product_attention` call, so attention
costs about sum over blocks of block x (key list length) ~ the ancestor pairs, not P^2.

FlexAttention (`torch.nn.attention.flex_attention`) would express the same mask, but in
torch 2.13 it has no backward on CPU ("FlexAttention does not support backward on CPU")
and its compiled CPU forward was no faster than SDPA here (30-56 ms against 24 ms with a
dense causal mask, 4 x 1280 tokens, 4 heads of 24, after 11 s of compiling; 0.87 s eager);
this layout is plain SDPA plus gathers, needs no
compiler and runs on any device.

The layout is built once per mini-batch (pure torch, no model); `tree_attention_forward`
is registered with transformers' AttentionInterface under TREE_ATTENTION and used by a
model whose `config._attn_implementation` is TREE_ATTENTION: with a `tree_layout` keyword
it computes the packed attention, without one (generation, scoring of unpacked rows) it is
exactly transformers' sdpa.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

TREE_ATTENTION = "flywheel_tree"
"""The attention implementation name a packable model is switched to (sdpa otherwise)."""

BLOCK = 64
"""Query positions per block; the key list of a block is the union of its tokens' ancestors."""


@dataclass
class Bucket:
    """Query blocks whose key lists pad to the same length, computed in one SDPA call.

    queries: [N * block] packed flat indices (g * P + position) of the blocks' queries; a
    short block repeats its last query. keys: [N * K] flat indices of the key lists (padding
    repeats a key, masked out). mask: [N, 1, block, K] True where the query may attend the key.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    mask: torch.Tensor

    def to(self, device: torch.device) -> Bucket:
        return Bucket(self.queries.to(device), self.keys.to(device), self.mask.to(device))


@dataclass
class TreeLayout:
    """The block-sparse attention of a packed batch of G groups of width P. gather: [G * P]
    where each packed position's output lies in the buckets' concatenated outputs (one past
    their end, a zero row, for padding)."""

    groups: int
    width: int
    buckets: tuple[Bucket, ...]
    gather: torch.Tensor

    @property
    def pairs(self) -> int:
        """Query-key pairs computed (padding included): the attention's cost."""
        return sum(b.mask.numel() for b in self.buckets)

    def to(self, device: torch.device) -> TreeLayout:
        return TreeLayout(self.groups, self.width, tuple(b.to(device) for b in self.buckets), self.gather.to(device))


def ancestor_mask(parent: torch.Tensor) -> torch.Tensor:
    """[G, P] parent pointers (-1 for a root or padding) -> [G, 1, P, P] bool mask:
    position i may attend to j iff j is i or an ancestor of i. Padding attends to itself.

    Pointer doubling: after round r each row holds the 2^r nearest ancestors, so a tree of
    depth D takes log2(D) rounds of [G, P, P] work (no Python loop over positions)."""
    g, p = parent.shape
    rows = torch.arange(g, device=parent.device)[:, None]  # [G, 1]
    mask = torch.eye(p, dtype=torch.bool, device=parent.device).expand(g, p, p).clone()  # [G, P, P]
    jump = parent.clone()  # [G, P] the 2^r-th ancestor, -1 when there is none
    while bool((jump >= 0).any()):
        has = jump >= 0
        at = jump.clamp(min=0)
        mask |= mask[rows, at] & has[..., None]
        jump = torch.where(has, jump.gather(1, at), jump)  # 2^(r+1)-th = the 2^r-th of the 2^r-th
    return mask[:, None]


def _ladder(length: int, step: int) -> int:
    """The padded key-list length: the first of step, 2 step, 3 step, 5 step, 8 step, ... (x1.5,
    rounded up to `step`, growing by at least `step`) >= length. Few buckets (few SDPA calls and gathers per layer), each
    key list padded by at most half its length."""
    padded = step
    while padded < length:
        padded = max(padded + step, -(-(padded * 3 // 2) // step) * step)
    return padded


def tree_layout(position: torch.Tensor, origin: torch.Tensor, index: torch.Tensor, block: int = BLOCK,
                pad_to: int = BLOCK) -> TreeLayout:
    """The block-sparse layout of packed groups (the fields of flywheel.training.packing.Packed).

    Packed token j is an ancestor of (or is) token i iff depth(j) <= depth(i) and the row
    that first held i has j at depth(j): index[origin[i], position[j]] == j. So a block's key
    list is the union of its queries' rows' prefixes, and its mask that test, with no P x P
    mask built.

    Args:
        position: [G, P] depth of each packed token (-1 on padding, which comes last).
        origin: [G, P] the flat row that first held each packed token.
        index: [B, L] packed position of each flat token (-1 on padding).
        block: query positions per block.
        pad_to: key lists are padded up to a multiple of this, and blocks whose padded
            lengths are equal share one SDPA call.
    """
    if block < 1 or pad_to < 1:
        raise ValueError(f"block ({block}) and pad_to ({pad_to}) must be >= 1")
    g, p = position.shape
    by_length: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for group in range(g):
        n = int((position[group] >= 0).sum())
        for start in range(0, n, block):
            queries = torch.arange(start, min(start + block, n))
            rows, depths = origin[group, queries].tolist(), position[group, queries].tolist()
            deepest: dict[int, int] = {}
            for row, depth in zip(rows, depths):
                deepest[row] = max(depth, deepest.get(row, -1))
            keys = torch.cat([index[row, : depth + 1] for row, depth in deepest.items()]).unique()  # sorted
            padded = _ladder(len(keys), pad_to)
            by_length.setdefault(padded, []).append((group, queries, keys))
    buckets, gather, done = [], torch.full((g * p,), -1, dtype=torch.long), 0
    for length, items in sorted(by_length.items()):
        q_local = torch.stack([torch.cat([q, q[-1:].expand(block - len(q))]) for _, q, _ in items])  # [N, block]
        k_local = torch.stack([torch.cat([k, k[:1].expand(length - len(k))]) for _, _, k in items])  # [N, K]
        k_real = torch.stack([torch.arange(length) < len(k) for _, _, k in items])  # [N, K]
        group = torch.tensor([it[0] for it in items])[:, None]  # [N, 1]
        q_depth, k_depth = position[group, q_local], position[group, k_local]  # [N, block], [N, K]
        q_row = origin[group, q_local]  # [N, block]
        on_path = index[q_row[:, :, None], k_depth[:, None, :]] == k_local[:, None, :]  # [N, block, K]
        mask = on_path & (k_depth[:, None, :] <= q_depth[:, :, None]) & k_real[:, None, :]
        queries = (group * p + q_local).reshape(-1)
        real = torch.stack([torch.arange(block) < len(q) for _, q, _ in items]).reshape(-1)
        gather[queries[real]] = done + torch.arange(len(queries))[real]
        done += len(queries)
        buckets.append(Bucket(queries, (group * p + k_local).reshape(-1), mask[:, None]))
    gather[gather < 0] = done  # padding positions read the zero row
    return TreeLayout(g, p, tuple(buckets), gather)


def tree_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                           tree_layout: TreeLayout | None = None, **kwargs):
    """transformers attention function: query [G, H, P, D], key/value [G, Hkv, P, D] ->
    ([G, P, H, D], None). Without `tree_layout`, transformers' sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if tree_layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    g, h, p, d = query.shape
    hkv = key.shape[1]
    flat_q = query.transpose(1, 2).reshape(g * p, h, d)  # [G*P, H, D]
    flat_kv = torch.cat([key, value], dim=1).transpose(1, 2).reshape(g * p, 2 * hkv, d)  # [G*P, 2 Hkv, D]
    outs = []
    for b in tree_layout.buckets:
        n, _, block, length = b.mask.shape
        q = flat_q.index_select(0, b.queries).view(n, block, h, d).transpose(1, 2)  # [N, H, block, D]
        kv = flat_kv.index_select(0, b.keys).view(n, length, 2 * hkv, d).transpose(1, 2)  # [N, 2 Hkv, K, D]
        o = F.scaled_dot_product_attention(q, kv[:, :hkv], kv[:, hkv:], attn_mask=b.mask, dropout_p=dropout,
                                           scale=scaling, enable_gqa=hkv != h)  # [N, H, block, D]
        outs.append(o.transpose(1, 2).reshape(n * block, h, d))
    outs.append(query.new_zeros(1, h, d))  # read by padding positions
    return torch.cat(outs).index_select(0, tree_layout.gather).view(g, p, h, d), None


def enable_tree_attention(model: torch.nn.Module) -> bool:
    """Switch `model` (an sdpa Llama / Qwen2) to TREE_ATTENTION; False (unchanged) for any
    other attention implementation, whose packed passes keep the dense mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == TREE_ATTENTION:
        return True
    if current != "sdpa":
        return False
    AttentionInterface.register(TREE_ATTENTION, tree_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TREE_ATTENTION, sdpa_mask)
    config._attn_implementation = TREE_ATTENTION
    return True


def uses_tree_attention(model: torch.nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == TREE_ATTENTION
