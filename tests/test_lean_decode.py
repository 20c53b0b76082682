"""The lean decode pass (flywheel.generation.lean_decode): the model's own logits, bit for bit,
for Llama and Qwen2 (grouped-query attention, bf16, scaled RoPE), and the model's forward
wherever that equality is not known to hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM

from flywheel.generation.base import GenerationRequest, SamplingParams
from flywheel.generation.hf import HFGenerator
from flywheel.generation.kv_cache import BlockCache, block_cache
from flywheel.generation.lean_decode import LeanDecoder, lean_decoder
from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


def build(family: str, kv_heads: int = 4, dtype=torch.float32, **config):
    model = build_tiny_llama(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                             max_position_embeddings=64, seed=5, family=family, initializer_range=0.3,
                             num_key_value_heads=kv_heads, **config)
    if family == "qwen2":  # nonzero QKV biases, so a dropped bias would show
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.bias.normal_(0, 0.3)
                layer.self_attn.k_proj.bias.normal_(0, 0.3)
    return model.to(dtype).eval()


CASES = {
    "llama": lambda: build("llama"),
    "llama-gqa": lambda: build("llama", kv_heads=2),
    "llama-bf16": lambda: build("llama", dtype=torch.bfloat16),
    "llama-rope-scaled": lambda: build("llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2": lambda: build("qwen2"),
    "qwen2-gqa": lambda: build("qwen2", kv_heads=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lean_pass_equals_the_models_forward(case):
    model = CASES[case]()
    lean = lean_decoder(model)
    assert isinstance(lean, LeanDecoder)
    torch.manual_seed(0)
    rows, width, steps = 3, 6, 20  # 6 + 20 columns cross a block boundary of 16
    prompt_mask = torch.ones(rows, width, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    ids = torch.randint(0, 40, (rows, width))
    visible = torch.cat([prompt_mask.bool(), torch.zeros(rows, steps + 16, dtype=torch.bool)], 1)
    theirs, ours = block_cache(model.config), block_cache(model.config)
    assert isinstance(ours, BlockCache)
    with torch.no_grad():
        for cache in (theirs, ours):
            model(input_ids=ids, attention_mask=prompt_mask, position_ids=positions, cache=cache, use_cache=True)
        for t in range(steps):
            new = torch.randint(0, 40, (rows,))
            at = positions[:, -1] + 1 + t
            visible[:, width + t] = True
            want = model(input_ids=new[:, None], attention_mask=visible[:, : width + t + 1].long(),
                         position_ids=at[:, None], cache=theirs, use_cache=True).logits[:, -1].float()
            columns = ours.layers[0].get_mask_sizes(1)[0]
            got = lean(new, at, visible[:, None, None, :columns], ours)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    for mine, reference in zip(ours.layers, theirs.layers):  # the same keys and values were written
        torch.testing.assert_close(mine.keys[:, :, : mine.length], reference.keys[:, :, : reference.length], rtol=0, atol=0)


class LoraLinear(nn.Linear):
    """Stands for an adapter-wrapped projection: a forward the lean pass would skip."""

    def forward(self, x):
        return super().forward(x) + 1.0


class MyLlama(LlamaForCausalLM):
    pass


def test_models_the_lean_pass_may_differ_from_decode_through_their_forward():
    assert lean_decoder(build("llama")) is not None
    eager = build("llama")
    eager.config._attn_implementation = "eager"  # its softmax is computed differently
    assert lean_decoder(eager) is None
    hooked = build("llama")
    handle = hooked.model.layers[1].mlp.register_forward_hook(lambda *a: None)
    assert lean_decoder(hooked) is None
    handle.remove()
    assert lean_decoder(hooked) is not None
    adapted = build("llama")
    old = adapted.model.layers[0].self_attn.v_proj
    adapted.model.layers[0].self_attn.v_proj = LoraLinear(old.in_features, old.out_features, bias=False)
    assert lean_decoder(adapted) is None
    assert lean_decoder(MyLlama(build("llama").config)) is None


def test_the_generator_samples_the_same_with_and_without_the_lean_pass(tok, monkeypatch):
    from flywheel.generation import prefix_attention

    # The lean pass over replicated prompts (SDPA) is exact; the prefix-attention kernel's sums
    # differ in rounding (tests/test_prefix_attention.py compares it with this path).
    monkeypatch.setitem(prefix_attention._state, "kernel", None)
    model = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=3,
                             initializer_range=0.4)
    prompts = [tok.encode(text, add_special_tokens=False) for text in ("12+3=", "7*8-1=", "99")]
    params = SamplingParams(max_new_tokens=30, temperature=1.0, stop_strings=("\n",), top_logprobs=1)
    requests = [GenerationRequest(tuple(p), 4, params, seed=i) for i, p in enumerate(prompts)]

    def sample():
        return HFGenerator(model, tok, max_batch_size=8, compact_fraction=0.0, prefix_cache_mb=0).sample(requests)

    lean = sample()
    handle = model.register_forward_pre_hook(lambda *a: None)  # any hook: decode through model(...)
    try:
        assert lean_decoder(model) is None
        plain = sample()
    finally:
        handle.remove()
    assert lean == plain
    assert sum(len(c.token_ids) for cs in lean for c in cs) > 12 * 3  # it decoded several steps
