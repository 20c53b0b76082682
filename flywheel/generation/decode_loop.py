"""The in-process generator's decode loop (flywheel.generation.hf), one for every model: each
pass samples every row's token and tests the stop rules (flywheel.generation.decoding), keeps
the KV of rows that stopped unfinished in the prefix cache, drops finished rows once enough
have finished (compaction), and runs the next model pass.

Where a chunk's KV lives, and so how a pass attends, is the loop's strategy (`RowKV`):
  * `ReplicatedKV`: each distinct prompt's KV, prefilled once, copied to its n rows; one padded
    cache per layer, [B, H, P + T, D] (a `BlockCache`, or transformers' `DynamicCache` for the
    models a BlockCache cannot serve); passes run through the lean decoder or `model(...)`.
  * `SharedPromptKV`: the prompts' KV kept once, [U, H, P, D], apart from the rows' generated
    columns, [B, H, T, D]; the lean decoder attends with the prefix-attention kernel
    (flywheel.generation.prefix_attention). Every row writes one generated column per pass, so
    that cache has no padding and compaction never drops columns. Float32 Llama / Qwen2 on CPU.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from flywheel.generation.base import Completion, GenerationStats
from flywheel.generation.decoding import ACTIVE, DecodeRecord, StopRules, compaction_due, decode_step, row_settings
from flywheel.generation.distinct_first import distinct_first_tokens
from flywheel.generation.kv_cache import BlockCache, compaction
from flywheel.generation.lean_decode import LeanDecoder
from flywheel.generation.prefix_attention import SharedPrompts
from flywheel.generation.prefix_cache import PrefixCache, keep_stopped_kv

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
"""One (keys, values) [H, columns, D] per layer."""


class RowKV(Protocol):
    """Where the KV of a chunk's rows lives: the decode loop's strategy."""

    prompt_len: torch.Tensor
    """[B] each row's real prompt tokens: its first generated token's position."""

    def reader(self, t: int) -> Callable[[int], LayerKV]:
        """`keep_stopped_kv`'s reader at step t: batch position b's KV, its prompt's real columns
        and its first t generated ones (everything fed to the model so far)."""
        ...

    def compact(self, keep: torch.Tensor, moves: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Keep the batch positions `keep`, as `kv_cache.compaction` chose them."""
        ...

    def columns(self, t: int) -> int:
        """KV columns each row's pass t reads, padding included (`decode_kv_columns`)."""
        ...

    def forward(self, new: torch.Tensor, positions: torch.Tensor, t: int) -> torch.Tensor:
        """Feed step t's tokens [B] at `positions` [B]; returns fp32 logits [B, V] for step t + 1."""
        ...


def decode_rows(
    rows: list,
    logits: torch.Tensor,
    kv: RowKV,
    *,
    rules: StopRules,
    tokenizer,
    compact_fraction: float,
    prefix_cache: PrefixCache | None,
    stats: GenerationStats,
    row_budget: int = 0,
) -> list[Completion]:
    """Decode one chunk of rows from the prefill's last-position logits [R, V]; their
    completions in row order.

    Batch position b holds row `slots[b]`, still decoding while `active[b]`. Finished rows ride
    along masked until enough have finished to compact the batch; the per-position tensors are
    gathered anew only then. `row_budget`: the rows the generator could decode at once in this
    call (its chunk size, or all of the call's rows when fewer); a pass with fewer than half of
    them still decoding counts as sparse (`decode_sparse_passes`: the chunk's tail of stragglers).
    """
    device = logits.device
    horizon = max(r.params.max_new_tokens for r in rows)
    record = DecodeRecord(rows, horizon, device)
    slots = torch.arange(len(rows), device=device)
    active = torch.ones(len(rows), dtype=torch.bool, device=device)
    prompt_len = kv.prompt_len  # [B]
    prompt_total = int(prompt_len.sum())
    temperature, top_p, uniforms = row_settings(rows, horizon, device)  # [B], [B], [B, T]
    first = distinct_first_tokens(rows, logits, temperature, top_p)  # [B] or None
    passes = row_steps = kv_columns = real_columns = sparse = 0
    for t in range(horizon):
        new, reason = decode_step(t, logits, temperature, top_p, uniforms, slots, active, record, rules,
                                  tokenizer, first if t == 0 else None)  # [B], [B]
        if prefix_cache is not None:
            keep_stopped_kv(prefix_cache, rows, slots, reason, record.tokens, t, kv.reader(t))
        if stats.live is not None:  # a bar listens: one sync per step, only then
            emitted = int(active.sum())
            stats.tick(emitted, emitted - int((active & (reason == ACTIVE)).sum()))
        active &= reason == ACTIVE
        busy = int(active.sum())
        if not busy:
            break
        sparse += 2 * busy < row_budget
        if compaction_due(active, compact_fraction):
            keep, moves = compaction(active)
            slots, new, active = slots[keep], new[keep], active[keep]
            prompt_len, temperature, top_p, uniforms = (x[keep] for x in (prompt_len, temperature, top_p, uniforms))
            prompt_total = int(prompt_len.sum())
            kv.compact(keep, moves)
        passes += 1
        row_steps += len(slots)
        kv_columns += len(slots) * kv.columns(t)
        real_columns += prompt_total + len(slots) * (t + 1)
        logits = kv.forward(new, prompt_len + t, t)
    stats.add(decode_passes=passes, decode_row_steps=row_steps, decode_kv_columns=kv_columns,
              decode_real_columns=real_columns, decode_sparse_passes=sparse)
    return record.completions(rows)


class ReplicatedKV:
    """The prompts copied to their rows: one padded cache, [R, H, W + T (+ a block), D].

    `visible[b]`: the columns row b attends to, [B, W + T + block]: the prompt's real tokens,
    then each generated column once written; the slack past them stays False (the block
    cache's unwritten columns). The cache holds columns `start:` (compaction drops leading
    columns that are padding for every row left).

    Args:
        cache: the prefill's cache, replicated to the rows.
        prompt_mask: [R, W] the rows' real prompt columns.
        horizon: the most tokens any row may generate.
        lean: the lean decode pass, or None to run `model_pass(ids [B, 1], mask [B, columns],
            positions [B, 1], cache)`.
    """

    def __init__(self, cache, prompt_mask: torch.Tensor, horizon: int, lean: LeanDecoder | None,
                 model_pass: Callable[..., torch.Tensor]) -> None:
        self.cache = cache
        self.width = prompt_mask.shape[1]
        slack = cache.block if isinstance(cache, BlockCache) else 0
        self.visible = torch.cat(
            [prompt_mask.bool(), prompt_mask.new_zeros((len(prompt_mask), horizon + slack), dtype=torch.bool)], 1)
        self.prompt_len = prompt_mask.sum(-1)
        self.start = 0
        self.lean = lean
        self.model_pass = model_pass

    def reader(self, t: int) -> Callable[[int], LayerKV]:
        fed = self.visible[:, self.start : self.width + t]  # [B, columns]: which filled columns are real

        def read(b: int) -> LayerKV:
            columns = fed[b].nonzero().squeeze(1)
            return [(layer.keys[b].index_select(1, columns), layer.values[b].index_select(1, columns))
                    for layer in self.cache.layers]

        return read

    def compact(self, keep: torch.Tensor, moves: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.visible = self.visible[keep]
        cache = self.cache
        if not isinstance(cache, BlockCache):
            cache.batch_select_indices(keep)
        elif (drop := int(self.visible[:, self.start : self.width].any(0).int().argmax())) >= cache.block:
            # A block or more of columns is padding for every row left (the long prompts have
            # finished): copy every row without them.
            cache.compact(keep, drop)
            self.start += drop
        else:
            cache.keep_first(len(keep), moves)

    def columns(self, t: int) -> int:
        return self.width + t + 1 - self.start

    def forward(self, new: torch.Tensor, positions: torch.Tensor, t: int) -> torch.Tensor:
        self.visible[:, self.width + t] = True  # the column this pass writes
        start = self.start
        if self.lean is not None:
            columns = self.cache.layers[0].get_mask_sizes(1)[0]  # the buffer's width after this pass
            return self.lean(new, positions, self.visible[:, None, None, start : start + columns], self.cache)
        return self.model_pass(new[:, None], self.visible[:, start : self.width + t + 1], positions[:, None], self.cache)


class SharedPromptKV:
    """The prompts' KV kept once, the rows' generated columns apart (the prefix-attention kernel).

    Args:
        prompt_cache: the prefill's cache, one row per distinct prompt, [U, H, P, D] per layer.
        prompt_mask: [U, W] the prompts' real columns (W <= P, the buffer's capacity).
        row_prompt: [R] each row's prompt.
        lean: the lean decode pass, which attends through the kernel.
    """

    def __init__(self, prompt_cache: BlockCache, prompt_mask: torch.Tensor, row_prompt: torch.Tensor,
                 lean: LeanDecoder) -> None:
        capacity = prompt_cache.layers[0].keys.shape[2]
        mask = torch.zeros(prompt_mask.shape[0], capacity, dtype=torch.bool, device=prompt_mask.device)  # [U, P]
        mask[:, : prompt_mask.shape[1]] = prompt_mask.bool()
        self.prompts = SharedPrompts([(layer.keys, layer.values) for layer in prompt_cache.layers], mask, row_prompt)
        self.cache = BlockCache(len(prompt_cache.layers), prompt_cache.block)  # the rows' generated columns
        self.prompt_len = mask.sum(-1)[row_prompt]
        self.width = prompt_mask.shape[1]
        self.lean = lean
        self.real_columns: dict[int, torch.Tensor] = {}  # prompt -> its real columns, for prefix-cache stores

    def reader(self, t: int) -> Callable[[int], LayerKV]:
        prompts, cache, real_columns = self.prompts, self.cache, self.real_columns

        def read(b: int) -> LayerKV:
            u = int(prompts.row_prompt[b])
            if u not in real_columns:
                real_columns[u] = prompts.mask[u].nonzero().squeeze(1)
            columns, kv = real_columns[u], []
            for (keys, values), layer in zip(prompts.layers, cache.layers):
                own_k = layer.keys[b, :, :t] if t else keys[u, :, :0]  # no generated column yet at t = 0
                own_v = layer.values[b, :, :t] if t else values[u, :, :0]
                kv.append((torch.cat([keys[u].index_select(1, columns), own_k], 1),
                           torch.cat([values[u].index_select(1, columns), own_v], 1)))
            return kv

        return read

    def compact(self, keep: torch.Tensor, moves: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.prompts.row_prompt = self.prompts.row_prompt[keep]
        self.cache.keep_first(len(keep), moves)

    def columns(self, t: int) -> int:
        return self.width + t + 1

    def forward(self, new: torch.Tensor, positions: torch.Tensor, t: int) -> torch.Tensor:
        return self.lean(new, positions, None, self.cache, prompts=self.prompts)
