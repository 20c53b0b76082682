"""Decode attention with each prompt's KV kept once (flywheel/generation/prefix_attention.py,
decode_loop.py's SharedPromptKV): the kernel against SDPA over replicated rows, the decode
loop's two KV strategies against each other, and the fallback when the kernel cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation import prefix_attention as pa
from flywheel.generation.hf import HFGenerator
from flywheel.policies.tiny import build_tiny_llama

needs_kernel = pytest.mark.skipif(pa.kernel() is None, reason="no C compiler: the kernel cannot be built")


@pytest.fixture
def replicated(monkeypatch):
    """The generator's other path: prompts replicated to their rows, SDPA."""
    monkeypatch.setitem(pa._state, "kernel", None)


def reference(q, prompts, row_keys, row_values, columns, scale):
    """SDPA over each row's prompt KV copied in front of its own columns."""
    layer_keys, layer_values = prompts.layers[0]
    u = prompts.row_prompt
    keys = torch.cat([layer_keys[u], row_keys[:, :, :columns]], 2)
    values = torch.cat([layer_values[u], row_values[:, :, :columns]], 2)
    groups = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
    mask = torch.cat([prompts.mask[u], torch.ones(len(u), columns, dtype=torch.bool)], 1)
    return F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask[:, None, None], scale=scale)[:, :, 0]


@needs_kernel
@pytest.mark.parametrize("q_heads,kv_heads,threads", [(4, 4, 1), (4, 2, 1), (6, 2, 2)])
def test_kernel_equals_sdpa_over_replicated_rows(q_heads, kv_heads, threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    gen = torch.Generator().manual_seed(0)
    prompts_n, rows, dim, width, capacity, columns = 5, 520, 16, 12, 20, 7  # 520 rows: two threads
    keys = torch.randn(prompts_n, kv_heads, width, dim, generator=gen)
    values = torch.randn(prompts_n, kv_heads, width, dim, generator=gen)
    mask = torch.zeros(prompts_n, width, dtype=torch.bool)
    for u, (start, stop) in enumerate([(0, 12), (3, 12), (5, 9), (11, 12), (0, 0)]):  # left pads, gaps, none
        mask[u, start:stop] = True
    mask[1, 6] = False  # a hole inside a prompt (the prefill's [pad | cached | pad | new] layout)
    row_prompt = torch.randint(0, prompts_n, (rows,), generator=gen)
    row_keys = torch.randn(rows, kv_heads, capacity, dim, generator=gen)
    row_values = torch.randn(rows, kv_heads, capacity, dim, generator=gen)
    row_keys[:, :, columns:] = float("nan")  # unwritten columns are never read
    q = torch.randn(rows, q_heads, dim, generator=gen)
    prompts = pa.SharedPrompts([(keys, values)], mask, row_prompt)
    got = pa.prefix_attention(q, 0, prompts, row_keys, row_values, columns, 0.3)
    want = reference(q, prompts, row_keys, row_values, columns, 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_kernel
def test_kernel_rejects_what_it_cannot_read():
    keys = torch.zeros(1, 1, 4, 8)
    prompts = pa.SharedPrompts([(keys, keys)], torch.ones(1, 4, dtype=torch.bool), torch.zeros(2, dtype=torch.long))
    rows = torch.zeros(2, 1, 4, 8)
    with pytest.raises(ValueError, match="shapes disagree"):
        pa.prefix_attention(torch.zeros(2, 1, 8), 0, prompts, rows, rows, 5, 1.0)  # 5 columns of a 4-column buffer
    with pytest.raises(ValueError, match="contiguous"):
        pa.prefix_attention(torch.zeros(2, 1, 8), 0, prompts, rows[:, :, ::2], rows, 2, 1.0)


def _calls(policy, tok):
    prompts = [tuple(tok(text)["input_ids"]) for text in ("5 9 8|67\n", "12 3 4 7|25\n", "1|1\n")]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, stop_strings=("\n",), top_logprobs=1)
    first = [GenerationRequest(p, 4, params, seed=i) for i, p in enumerate(prompts)]
    return first, params


@needs_kernel
def test_generator_paths_agree_with_the_prefix_cache(tok, one_thread, monkeypatch):
    """Two calls (the second continues the first's samples, so its prompts hit the prefix
    cache): the kernel's path and the replicated path sample the same tokens with the same
    log-probs and entropies, and store the same prefix KV."""
    policy = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=4, num_key_value_heads=2,
                              intermediate_size=64, seed=3, initializer_range=0.4)

    def run():
        generator = HFGenerator(policy, tok, seed=0, prefix_cache_mb=16)
        first, params = _calls(policy, tok)
        a = generator.sample(first)
        follow = [GenerationRequest(r.prompt_ids + a[i][j].token_ids, 3, params, seed=10 + i)
                  for i, r in enumerate(first) for j in range(2) if a[i][j].finish_reason != "eos"]
        return a + generator.sample(follow), generator

    shared, with_kernel = run()
    monkeypatch.setitem(pa._state, "kernel", None)
    copied, without = run()
    for xs, ys in zip(shared, copied):
        for x, y in zip(xs, ys):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(torch.tensor(x.entropies), torch.tensor(y.entropies), atol=1e-5, rtol=1e-5)
    assert with_kernel.stats.extra["prefix_cache_hit_tokens"] > 0
    for key in ("prefill_tokens", "cached_prompt_tokens", "generated_tokens"):
        assert getattr(with_kernel.stats, key) == getattr(without.stats, key)
    for key in ("decode_passes", "decode_row_steps", "decode_kv_columns", "decode_real_columns"):
        assert with_kernel.stats.extra[key] == without.stats.extra[key]
    stored, copied_kv = with_kernel.prefix_cache.entries, without.prefix_cache.entries
    assert stored.keys() == copied_kv.keys() and stored
    for key, layers in stored.items():
        for (k, v), (k2, v2) in zip(layers, copied_kv[key]):
            assert k.shape == k2.shape == (2, len(key), 8)  # kv heads, every fed token, head size
            torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v, v2, atol=1e-5, rtol=1e-5)


def test_switched_off_or_unbuildable_falls_back(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path))
    monkeypatch.setenv("FLYWHEEL_PREFIX_ATTENTION", "0")
    assert pa._load() is None
    monkeypatch.delenv("FLYWHEEL_PREFIX_ATTENTION")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with caplog.at_level(logging.WARNING):
        assert pa._load() is None
    assert "decoding with SDPA" in caplog.text
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob("*.partial"))


@needs_kernel
def test_build_writes_one_library_per_source_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path))
    assert pa._load() is not None
    built = list(tmp_path.iterdir())
    assert [p.name for p in built] == [pa._library_name()]  # no partial file left behind
    stamp = built[0].stat().st_mtime_ns
    assert pa._load() is not None and built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt


@needs_kernel
def test_loading_the_kernel_leaves_the_float_environment_alone(tmp_path, monkeypatch):
    """A library linked with -ffast-math turns on flush-to-zero for the whole process when it
    loads; subnormal numbers must survive a fresh build and load."""
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path))
    assert pa._load() is not None
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    assert (tiny * 1.0).item() > 0 and 5e-324 * 1.0 > 0


def test_bf16_models_keep_the_replicated_path(tok):
    policy = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1)
    assert not pa.usable(policy.to(torch.bfloat16))
