"""A causal LM's compute per token and the machine's matmul peak at the model's own shapes:
how far a generation or training benchmark runs from what the cores can do.

`flops_per_token` counts a Llama-shaped decoder's multiply-adds (2 FLOPs each) per token:
the attention projections, the MLP, the output layer and the attention itself at a given
context length (the columns a token attends to). `matmul_peak` times `F.linear` at exactly
the model's weight shapes with a given number of rows, in a given dtype, with the process's
current torch threads: the most those matmuls can do here. A benchmark's
`roofline_fraction` is its achieved FLOP/s (tokens/s x FLOPs per token) over that peak.
`matmul_share` profiles a call and returns the share of its time spent in matmul kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math")
"""Profiler op names counted as matmul time (a linear's addmm is inside its aten::linear: only
the outermost op of a stack is counted)."""


@dataclass(frozen=True)
class Shapes:
    """A decoder's sizes, read from a transformers config (Llama, Qwen2, Mistral names)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Shapes:
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(config.hidden_size, config.num_hidden_layers, heads,
                   getattr(config, "num_key_value_heads", None) or heads, head_dim, config.intermediate_size,
                   config.vocab_size)

    def weights(self) -> list[tuple[int, int, int]]:
        """(in features, out features, times per token) of every weight matrix a token passes."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(self.hidden, q, self.layers), (self.hidden, kv, 2 * self.layers), (q, self.hidden, self.layers),
                (self.hidden, self.intermediate, 2 * self.layers), (self.intermediate, self.hidden, self.layers),
                (self.hidden, self.vocab, 1)]


def flops_per_token(config: Any, context: float, backward: bool = False) -> dict[str, float]:
    """Forward FLOPs of one token attending to `context` columns, by part (projections, mlp,
    output, attention) and their `total`; with `backward`, three times that (the backward pass
    costs two forwards' worth of matmuls)."""
    s = Shapes.of(config)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    parts = {
        "projections": 2.0 * s.layers * (s.hidden * q * 2 + s.hidden * kv * 2),
        "mlp": 2.0 * s.layers * 3 * s.hidden * s.intermediate,
        "output": 2.0 * s.hidden * s.vocab,
        "attention": 2.0 * s.layers * 2 * q * context,  # q.k over the context, then the weighted values
    }
    scale = 3.0 if backward else 1.0
    parts = {k: v * scale for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def matmul_peak(config: Any, rows: int, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """FLOP/s of `F.linear` over the model's weight shapes with `rows` input rows, in `dtype`,
    on the current torch threads: the weights' FLOPs per pass over the time of one pass (each
    shape as often as a token meets it), the median of repeated passes over about `seconds`."""
    s = Shapes.of(config)
    generator = torch.Generator().manual_seed(0)
    weights = [(torch.randn(out, inp, generator=generator, dtype=torch.float32).to(dtype) * inp ** -0.5,
                torch.randn(rows, inp, generator=generator, dtype=torch.float32).to(dtype), times)
               for inp, out, times in s.weights()]
    flops = sum(2.0 * rows * w.shape[0] * w.shape[1] * times for w, _, times in weights)

    def one_pass() -> float:
        start = time.perf_counter()
        for w, x, times in weights:
            for _ in range(times):
                F.linear(x, w)
        return time.perf_counter() - start

    one_pass()  # warm-up: the kernels' first call packs and allocates
    times = [one_pass()]
    while sum(times) < seconds:
        times.append(one_pass())
    times.sort()
    return flops / times[len(times) // 2]


def matmul_share(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run `fn` under torch's profiler; (the share of its wall time spent in matmul ops, its result)."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    wall = time.perf_counter() - start
    events = [e for e in prof.events() if e.name in MATMUL_OPS]
    outermost = _outermost(events)
    matmul = sum(e.cpu_time_total for e in outermost) / 1e6
    return min(matmul / wall, 1.0), result


def _outermost(events: list) -> list:
    """The events not inside another of `events` on the same thread (a linear's addmm is counted once)."""
    spans = sorted(events, key=lambda e: (e.thread, e.time_range.start, -e.time_range.end))
    kept, end = [], {}
    for e in spans:
        if e.time_range.start >= end.get(e.thread, -1):
            kept.append(e)
            end[e.thread] = e.time_range.end
    return kept
