"""The in-process generator's prefix KV cache: the KV of unfinished completions (search
nodes) kept across calls, so expanding a node computes only its new tokens."""

from __future__ import annotations

from collections import Counter, OrderedDict

import torch

from flywheel.generation.decoding import LENGTH, STOP


class PrefixCache:
    """KV caches of token sequences kept across generator calls, least recently used first
    out, bounded in bytes, emptied when the model's parameters change (their in-place
    version counters move on every optimizer step or weight load)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self.sizes: dict[tuple[int, ...], int] = {}
        self.lengths: Counter[int] = Counter()
        self.bytes = 0
        self.weights: tuple[int, ...] | None = None

    def follow_weights(self, model: torch.nn.Module) -> None:
        version = tuple(p._version for p in model.parameters())
        if version != self.weights:
            self.clear()
            self.weights = version

    def clear(self) -> None:
        self.entries.clear()
        self.sizes.clear()
        self.lengths.clear()
        self.bytes = 0

    def __contains__(self, key: tuple[int, ...]) -> bool:
        return key in self.entries

    def longest(self, prompt: tuple[int, ...]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest cached sequence that is a proper prefix of `prompt` (at least the
        prompt's last token is always computed: its logits start the decoding)."""
        for length in sorted((n for n in self.lengths if n < len(prompt)), reverse=True):
            kv = self.entries.get(prompt[:length])
            if kv is not None:
                self.entries.move_to_end(prompt[:length])
                return length, kv
        return 0, None

    def put(self, key: tuple[int, ...], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if key in self.entries or size > self.max_bytes or not key:
            return
        self.entries[key] = kv
        self.sizes[key] = size
        self.lengths[len(key)] += 1
        self.bytes += size
        while self.bytes > self.max_bytes:
            old, _ = self.entries.popitem(last=False)
            self.bytes -= self.sizes.pop(old)
            self.lengths[len(old)] -= 1
            if not self.lengths[len(old)]:
                del self.lengths[len(old)]


def left_padded(kvs, lengths: list[int], width: int):
    """Per layer, the cached KV of each prompt left-padded with zeros to `width`:
    yields (keys, values) [U, H, width, D]; prompts without a hit are all padding."""
    template = next(kv for kv in kvs if kv is not None)
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(kvs), k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((len(kvs), v0.shape[0], width, v0.shape[2]))
        for i, (kv, c) in enumerate(zip(kvs, lengths)):
            if kv is not None and c:
                keys[i, :, width - c :] = kv[layer][0]
                values[i, :, width - c :] = kv[layer][1]
        yield keys, values


def keep_stopped_kv(prefix_cache: PrefixCache, rows, slots, reason, tokens, t: int, row_kv) -> None:
    """Store the KV of rows that just stopped without EOS (search nodes to be expanded):
    prompt + tokens[:t], everything that was fed to the model (the last sampled token was
    not). `tokens` [R, T]: the rows' sampled tokens by slot; `row_kv(b)`: the KV of
    batch position b, one (keys, values) [H, prompt + t, D] per layer, read only for rows
    the cache does not hold yet."""
    ended = ((reason == STOP) | (reason == LENGTH)).nonzero().squeeze(1)
    if not len(ended):
        return
    ended_slots = slots[ended]
    generated = tokens[ended_slots, :t].tolist()
    for b, slot, row_tokens in zip(ended.tolist(), ended_slots.tolist(), generated):
        key = rows[slot].prompt + tuple(row_tokens)
        if key not in prefix_cache:  # else a sibling already stopped with the same tokens
            prefix_cache.put(key, row_kv(b))
