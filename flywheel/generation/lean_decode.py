"""One decode pass of a Llama or Qwen2 model as plain torch calls: transformers' arithmetic,
op for op, without its per-call machinery.

On the tiny policy a decode pass through `model(...)` spends 2.5-3.5 ms in Python whatever
the batch: module calls, keyword plumbing, the 4D mask built from the 2D one. A tree search
makes more passes per generated token than flat sampling (docs/performance.md), so this
fixed cost weighs most on it. `LeanDecoder` runs the same operations on the model's own
parameters (always the current weights) and the same `BlockCache`, and takes the 4D boolean
mask that transformers would hand to SDPA; its logits equal the model's forward (tested
bit for bit in fp32, Llama and Qwen2, grouped-query attention included).

Used only where that equality is known to hold: `LlamaForCausalLM` and `Qwen2ForCausalLM`
themselves (not subclasses) with SDPA attention (or tree attention, which is SDPA when
decoding), every projection a plain `nn.Linear`, and no hooks on any module (adapters,
quantized layers, ZeRO-3 parameter gathering and profiling hooks all change what a forward
does). Everything else decodes through `model(...)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaForCausalLM, Qwen2ForCausalLM

from flywheel.generation.prefix_attention import SharedPrompts, prefix_attention
from flywheel.training.tree_attention import TREE_ATTENTION

SUPPORTED = (LlamaForCausalLM, Qwen2ForCausalLM)
IMPLEMENTATIONS = ("sdpa", TREE_ATTENTION)


def lean_decoder(model: nn.Module) -> LeanDecoder | None:
    """A `LeanDecoder` for `model`, or None where its forward may differ from the model's."""
    if type(model) not in SUPPORTED or getattr(model.config, "_attn_implementation", None) not in IMPLEMENTATIONS:
        return None
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return None
    for module in model.modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return None
    for layer in model.model.layers[: model.config.num_hidden_layers]:
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                       mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(p) is not nn.Linear for p in projections):
            return None
    if type(model.lm_head) is not nn.Linear or type(model.model.embed_tokens) is not nn.Embedding:
        return None
    return LeanDecoder(model)


class _Layer:
    """One decoder layer's tensors and settings, read once per `LeanDecoder`."""

    def __init__(self, layer: nn.Module) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.q = (attention.q_proj.weight, attention.q_proj.bias)
        self.k = (attention.k_proj.weight, attention.k_proj.bias)
        self.v = (attention.v_proj.weight, attention.v_proj.bias)
        self.o = (attention.o_proj.weight, attention.o_proj.bias)
        self.gate = (mlp.gate_proj.weight, mlp.gate_proj.bias)
        self.up = (mlp.up_proj.weight, mlp.up_proj.bias)
        self.down = (mlp.down_proj.weight, mlp.down_proj.bias)
        self.act = mlp.act_fn
        self.input_norm = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        self.post_norm = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        self.head_dim = attention.head_dim
        self.groups = attention.num_key_value_groups
        self.scaling = attention.scaling


class LeanDecoder:
    """`decoder(ids, positions, mask, cache)`: the model's logits [B, V] (fp32) for one new
    token per row. ids, positions [B]; mask [B, 1, 1, C] bool, True where a row attends, C
    the cache's key length after this pass (`get_mask_sizes`); cache a `BlockCache` that
    this pass appends one column to. Build one per generator call: it reads the
    parameters' tensors when built.

    With `prompts` (flywheel.generation.prefix_attention), the cache holds only the rows'
    generated columns and each row also attends to its prompt's KV, kept once per prompt;
    `mask` is then unused, and the logits equal the model's up to float rounding."""

    def __init__(self, model: nn.Module) -> None:
        base = model.model
        self.embedding = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.layers = [_Layer(layer) for layer in base.layers[: model.config.num_hidden_layers]]
        self.norm = (base.norm.weight, base.norm.variance_epsilon)
        self.head = (model.lm_head.weight, model.lm_head.bias)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache,
                 prompts: SharedPrompts | None = None) -> torch.Tensor:
        b = ids.shape[0]
        hidden = F.embedding(ids[:, None], self.embedding)  # [B, 1, H]
        cos, sin = self.rotary(hidden, positions[:, None])  # [B, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D]: broadcast over heads
        for index, (layer, cache_layer) in enumerate(zip(self.layers, cache.layers)):
            x = _rms_norm(hidden, *layer.input_norm)
            q = F.linear(x, *layer.q).view(b, 1, -1, layer.head_dim).transpose(1, 2)  # [B, heads, 1, D]
            k = F.linear(x, *layer.k).view(b, 1, -1, layer.head_dim).transpose(1, 2)
            v = F.linear(x, *layer.v).view(b, 1, -1, layer.head_dim).transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            keys, values = cache_layer.update(k, v)
            if prompts is not None:  # the prompt's KV once, then the row's own columns
                out = prefix_attention(q.reshape(b, -1, layer.head_dim), index, prompts, keys, values,
                                       cache_layer.length, layer.scaling).reshape(b, 1, -1)
            else:
                if layer.groups > 1:  # one query row per grouped head, as transformers' sdpa does
                    q = q.reshape(b, -1, layer.groups, layer.head_dim)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=layer.scaling)
                out = out.reshape(b, -1, 1, layer.head_dim).transpose(1, 2).reshape(b, 1, -1)
            hidden = hidden + F.linear(out, *layer.o)
            x = _rms_norm(hidden, *layer.post_norm)
            hidden = hidden + F.linear(layer.act(F.linear(x, *layer.gate)) * F.linear(x, *layer.up), *layer.down)
        return F.linear(_rms_norm(hidden, *self.norm), *self.head)[:, -1].float()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm / Qwen2RMSNorm: the statistics in fp32, the weight in the input's dtype."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
