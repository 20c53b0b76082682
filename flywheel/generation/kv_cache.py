"""The decode loop's KV cache: each layer's keys and values live in one contiguous buffer
that grows a block of columns at a time, and every decode step writes its one new column
in place.

transformers' `DynamicCache` concatenates the whole cache with the new column at every
step: it copies every row's keys and values once per token into a freshly allocated
buffer, which on CPU was the largest single cost of a decode pass (29% of the search's
generator time, more than the attention itself). Handing attention a view of a larger
preallocated buffer instead (its first columns) avoids the copy but makes the keys and
values non-contiguous, and CPU attention on such views ran 1.8x slower. This cache hands
attention the whole buffer, always contiguous, and copies only when a block is full (once
per `block` steps); the columns not yet written are masked out by causality, since a new
token's position is the number of columns written so far.

Models with sliding-window or other non-standard layers, and flash-attention kernels (which
read the 2D mask alone), keep `DynamicCache`.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, get_layer_types_and_kwargs

from flywheel.training.tree_attention import TREE_ATTENTION

BLOCK = 16


class _BlockLayer(DynamicLayer):
    """One layer's keys and values [B, H, C, D]: `length` columns written, C the smallest
    multiple of `block` that holds them; `keys` / `values` are the whole buffers."""

    def __init__(self, block: int) -> None:
        super().__init__()
        self.block = block
        self.length = 0

    def capacity_for(self, length: int) -> int:
        return -(-length // self.block) * self.block

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        if not self.is_initialized:  # empty buffers of the right shape: the growth below allocates
            self.device = key_states.device
            self.is_initialized = True
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        needed = self.capacity_for(self.length + new)
        if needed > self.keys.shape[-2]:  # the block is full: one copy into a longer buffer
            self.keys = self._resized(self.keys, needed)
            self.values = self._resized(self.values, needed)
        self.keys[:, :, self.length : self.length + new] = key_states
        self.values[:, :, self.length : self.length + new] = value_states
        self.length += new
        return self.keys, self.values

    def _resized(self, buffer: torch.Tensor, columns: int) -> torch.Tensor:
        b, h, _, d = buffer.shape
        out = buffer.new_empty((b, h, columns, d))
        out[:, :, : self.length] = buffer[:, :, : self.length]
        out[:, :, self.length :].zero_()  # masked, but must not hold NaN (0 x NaN is NaN)
        return out

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The buffer's width after this step's update (the attention's key length)."""
        current = self.keys.shape[-2] if self.is_initialized else 0
        return max(current, self.capacity_for(self.length + query_length)), 0

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor, drop: int = 0) -> None:
        """Keep (or repeat) the rows `indices`, without the first `drop` columns."""
        if not self.is_initialized:
            return
        if drop:
            self.keys, self.values = self.keys[:, :, drop:], self.values[:, :, drop:]
            self.length -= drop
        self.keys = self.keys.index_select(0, indices)  # contiguous again
        self.values = self.values.index_select(0, indices)

    def keep_first(self, rows: int, moves: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Keep the first `rows` rows after copying rows `moves[0]` (all >= rows) over rows
        `moves[1]` (all < rows): only the moved rows are copied, and the kept buffer is a
        contiguous view (the first dimension is the outermost)."""
        if not self.is_initialized:
            return
        sources, targets = moves
        if len(targets):
            self.keys[targets] = self.keys[sources]
            self.values[targets] = self.values[sources]
        self.keys, self.values = self.keys[:rows], self.values[:rows]

    def reset(self) -> None:
        self.length = 0
        super().reset()


class BlockCache(Cache):
    """A `_BlockLayer` per layer, with two ways to drop finished rows (see `compaction`)."""

    def __init__(self, layers: int, block: int = BLOCK) -> None:
        super().__init__(layers=[_BlockLayer(block) for _ in range(layers)])
        self.block = block

    def compact(self, indices: torch.Tensor, drop: int = 0) -> None:
        """Keep the rows `indices` and drop the first `drop` columns of every row (columns
        that are padding for every row kept): copies every row kept."""
        for layer in self.layers:
            layer.batch_select_indices(indices, drop)

    def keep_first(self, rows: int, moves: tuple[torch.Tensor, torch.Tensor]) -> None:
        """`_BlockLayer.keep_first` on every layer: copies only the moved rows."""
        for layer in self.layers:
            layer.keep_first(rows, moves)


def compaction(active: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The batch positions to keep, in their new order, when the rows still `active` [B]
    keep their places and each finished row among the first n = active.sum() positions is
    filled by an active row from beyond them; and those moves as (sources, targets)."""
    n = int(active.sum())
    order = torch.arange(n, device=active.device)
    targets = (~active[:n]).nonzero().squeeze(1)
    sources = active[n:].nonzero().squeeze(1) + n
    order[targets] = sources
    return order, (sources, targets)


MASKED_IMPLEMENTATIONS = ("sdpa", "eager", TREE_ATTENTION)
"""Attention implementations that build their mask from the cache's key length, so keys
past the 2D attention mask (the unwritten columns) are masked; flash-attention kernels read
the 2D mask alone and keep `DynamicCache` (TREE_ATTENTION is sdpa when decoding)."""


def _full_attention_layers(config) -> int | None:
    """The number of layers when every one is full attention through one of
    MASKED_IMPLEMENTATIONS (what a `BlockCache` serves), else None."""
    layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    if any(kind != "full_attention" for kind in layer_types) or implementation not in MASKED_IMPLEMENTATIONS:
        return None
    return len(layer_types)


def uses_block_cache(config) -> bool:
    """Whether `block_cache(config)` is a `BlockCache`."""
    return _full_attention_layers(config) is not None


def block_cache(config, block: int = BLOCK) -> Cache:
    """The decode loop's cache (see the module docstring); `DynamicCache` for models whose
    layers are not all full attention or whose attention is not in MASKED_IMPLEMENTATIONS."""
    layers = _full_attention_layers(config)
    return DynamicCache(config=config) if layers is None else BlockCache(layers, block)
