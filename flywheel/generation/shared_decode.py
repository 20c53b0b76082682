"""The in-process generator's decode loop with each prompt's KV kept once
(flywheel.generation.prefix_attention): `HFGenerator._decode` runs this one for float32
Llama / Qwen2 models on CPU, where the lean pass and the kernel are available.

The loop is `HFGenerator._decode`'s (sample, stop rules, record, prefix-cache stores,
compaction), with two differences: the chunk's distinct prompts are prefilled into a cache
of their own that is never copied to the rows, and the rows' `BlockCache` holds only their
generated columns, which every row writes one of per pass (so no row has padding there and
compaction never needs to drop columns). A row's KV, when the prefix cache keeps it, is its
prompt's real columns followed by its own.
"""

from __future__ import annotations

import torch

from flywheel.generation.base import Completion
from flywheel.generation.decoding import _ACTIVE, _Record, _StopRules, compaction_due, decode_step, row_settings
from flywheel.generation.kv_cache import BlockCache, compaction
from flywheel.generation.prefix_attention import SharedPrompts
from flywheel.generation.prefix_cache import keep_stopped_kv


def decode_shared(generator, rows: list, lean) -> list[Completion]:
    """Decode one chunk of rows (`HFGenerator._decode`'s contract): their completions in row order."""
    model, stats = generator.model, generator.stats
    device = model.device
    vocab = model.config.get_text_config().vocab_size
    horizon = max(r.params.max_new_tokens for r in rows)
    prompt_cache, logits, prompt_mask, row_prompt = generator._prefill(rows, share=True)
    capacity = prompt_cache.layers[0].keys.shape[2]
    mask = torch.zeros(prompt_mask.shape[0], capacity, dtype=torch.bool, device=device)  # [U, P]
    mask[:, : prompt_mask.shape[1]] = prompt_mask.bool()
    prompts = SharedPrompts([(layer.keys, layer.values) for layer in prompt_cache.layers], mask, row_prompt)
    cache = BlockCache(len(prompt_cache.layers), prompt_cache.block)  # the rows' generated columns
    rules = _StopRules(rows, generator.eos_token_ids, vocab, generator._stop_matcher, device)
    record = _Record(rows, horizon, device)

    slots = torch.arange(len(rows), device=device)
    active = torch.ones(len(rows), dtype=torch.bool, device=device)
    prompt_len = mask.sum(-1)[row_prompt]  # [B]
    temperature, top_p, uniforms = row_settings(rows, horizon, device)  # [B], [B], [B, T]
    real_columns: dict[int, torch.Tensor] = {}  # prompt -> its real columns, for prefix-cache stores
    passes = row_steps = kv_columns = real = 0
    width = prompt_mask.shape[1]
    for t in range(horizon):
        new, reason = decode_step(t, logits, temperature, top_p, uniforms, slots, active, record, rules,
                                  generator.tokenizer)  # [B], [B]
        if generator.prefix_cache is not None:
            keep_stopped_kv(generator.prefix_cache, rows, slots, reason, record.tokens, t,
                            _shared_row_kv(prompts, cache, t, real_columns))
        active &= reason == _ACTIVE
        if not bool(active.any()):
            break
        if compaction_due(active, generator.compact_fraction):
            keep, moves = compaction(active)
            slots, new, active = slots[keep], new[keep], active[keep]
            prompt_len, temperature, top_p, uniforms = (x[keep] for x in (prompt_len, temperature, top_p, uniforms))
            prompts.row_prompt = prompts.row_prompt[keep]
            cache.keep_first(len(keep), moves)
        passes += 1
        row_steps += len(slots)
        kv_columns += len(slots) * (width + t + 1)
        real += int(prompt_len.sum()) + len(slots) * (t + 1)
        logits = lean(new, prompt_len + t, None, cache, prompts=prompts)
    stats.add(decode_passes=passes, decode_row_steps=row_steps, decode_kv_columns=kv_columns,
              decode_real_columns=real)
    return record.completions(rows)


def _shared_row_kv(prompts: SharedPrompts, cache, t: int, real_columns: dict[int, torch.Tensor]):
    """`keep_stopped_kv`'s reader here: a row's prompt's real columns, then its first t
    generated columns. `real_columns`: prompt -> its real columns, filled as needed."""

    def read(b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
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
