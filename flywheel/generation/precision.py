"""The dtype the in-process generator samples in, and the copy of the policy it samples from.

On CPUs with native bf16 matmuls (AVX512-BF16, AMX-BF16) a bf16 decode pass runs the
weights' matmuls about twice as fast as fp32 and reads half the bytes, which is what a bf16
vLLM server does on a GPU. The trainer keeps its fp32 weights; the generator samples from a
bf16 copy of them, refreshed whenever the live parameters change (an optimizer step or a
weight load moves their in-place version counters). The log-probs it reports are the ones it
sampled with (the bf16 model's), so the behaviour policy is recorded truthfully; the
trainer's importance correction (`--model.old_logprobs=recompute_tis`) covers the gap to the
fp32 policy it trains.

`--data.generator.init_args.dtype`: "auto" (bf16 for a policy of at least
`BF16_MIN_PARAMETERS` parameters on a CPU with native bf16, else the policy's own dtype; the
choice is logged), "float32" or "bfloat16".
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from flywheel.generation.base import SAMPLING_DTYPES

logger = logging.getLogger(__name__)

BF16_MIN_PARAMETERS = 20_000_000
"""Below this a decode pass is bound by per-op overhead, not by the matmuls (the tiny
policies' steps take the same time in both dtypes), so "auto" keeps such a policy in its own
dtype and its samples exact."""


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX-BF16, read from
    /proc/cpuinfo; oneDNN's own check where that file is missing)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return bool(set(line.split(":", 1)[1].split()) & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    check = getattr(torch.backends.mkldnn, "is_bf16_supported", None)
    return bool(check and check())


def resolve_dtype(model: nn.Module, requested: str, flag: str = "--data.generator.init_args.dtype") -> torch.dtype:
    """The dtype to sample `model` in for `requested` (one of `SAMPLING_DTYPES`); "auto" is decided and logged.
    `flag`: the running command's flag of the setting (`fit`'s default; `eval`'s is --generator.init_args.dtype)."""
    if requested not in SAMPLING_DTYPES:
        raise ValueError(f"{flag} must be one of {', '.join(SAMPLING_DTYPES)}; got {requested!r}")
    parameter = next(model.parameters())
    if requested != "auto":
        return getattr(torch, requested)
    size = sum(p.numel() for p in model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        chosen, why = parameter.dtype, f"the policy's own ({parameter.device.type}, {parameter.dtype})"
    elif size < BF16_MIN_PARAMETERS:
        chosen, why = torch.float32, f"{size / 1e6:.1f}M parameters: below {BF16_MIN_PARAMETERS // 10**6}M a decode pass is overhead-bound"
    elif not cpu_has_bf16():
        chosen, why = torch.float32, "this CPU has no native bf16 matmuls (AVX512-BF16 / AMX-BF16)"
    else:
        chosen, why = torch.bfloat16, "a CPU with native bf16 matmuls; the trainer keeps fp32 weights"
    logger.info("the in-process generator samples in %s: %s (%s=float32|bfloat16 to choose)",
                str(chosen).removeprefix("torch."), why, flag)
    return chosen


class SamplingWeights:
    """The model the generator samples from: the live policy itself when it already has the
    sampling dtype, else a copy in that dtype whose parameters follow the live ones (copied
    again whenever any live parameter's version counter has moved)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.live = model
        self.dtype = dtype
        self.copy: nn.Module | None = None
        self.refreshes = 0
        self._versions: tuple[int, ...] | None = None
        parameter = next(model.parameters())
        if parameter.dtype == dtype:
            return
        if any(hasattr(p, "ds_id") for p in model.parameters()):
            logger.warning("the policy's parameters are partitioned by DeepSpeed: the in-process generator samples "
                           "from them as they are (%s), not from a %s copy", parameter.dtype, dtype)
            return
        self.copy = copy.deepcopy(model).eval()
        # Parameters only: buffers keep their dtype (the rotary frequencies stay fp32, as
        # transformers builds them for a bf16 model).
        for p in self.copy.parameters():
            p.data = p.data.to(dtype)
            p.requires_grad_(False)
            p.grad = None
        self._versions = self._live_versions()

    def _live_versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.live.parameters())

    def current(self) -> nn.Module:
        """The model to sample from now, its weights equal (up to rounding) to the live ones."""
        if self.copy is None:
            return self.live
        versions = self._live_versions()
        if versions != self._versions:
            with torch.no_grad():
                for source, target in zip(self.live.parameters(), self.copy.parameters()):
                    target.copy_(source)
            self._versions = versions
            self.refreshes += 1
        return self.copy
