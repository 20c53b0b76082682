"""Where `eval` and `diagnose` run a policy, and in what dtype: `--device` and `--dtype`.

"auto" takes CUDA when this machine has it (the GPU of `torchrun`'s LOCAL_RANK under
torchrun), else the CPU: the rule of Lightning's `--trainer.accelerator=auto`, which places
the fit's policy and so its held-out evaluation (callbacks.evaluation.HeldOutEval samples
with the fit's generator, on the trainer's device). `--dtype auto` is the parameter dtype the
device computes natively: bf16 on a CUDA device with bf16 matmuls (Ampere and later), fp32
elsewhere. On the CPU that is the choice the commands always made: fp32 weights, and the
in-process generator samples from a bf16 copy by itself where the CPU has native bf16
(flywheel.generation.precision).
"""

from __future__ import annotations

import logging
import os
import re

import torch

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
"""`--device` values; `cuda:N` names one GPU."""


def resolve_device(requested: str, flag: str = "--device") -> torch.device:
    """The device `requested` names ("auto", "cpu", "cuda", "cuda:N"); a CUDA device this
    machine does not have is a PreflightError naming `flag` and the way out."""
    from flywheel.run.errors import PreflightError

    if requested not in DEVICES and not re.fullmatch(r"cuda:\d+", requested):
        raise PreflightError(f"{flag}={requested}: not a device; use auto (CUDA when present), cpu, cuda or cuda:N")
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise PreflightError(f"{flag}={requested}: this machine has no CUDA device (torch.cuda.is_available() is "
                             f"False); use {flag}=cpu, or {flag}=auto to take a GPU where there is one")
    index = int(requested.split(":")[1]) if ":" in requested else int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.cuda.device_count():
        raise PreflightError(f"{flag}={requested}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1}); name one of them, or {flag}=auto")
    return torch.device("cuda", index)


def native_dtype(device: torch.device) -> str:
    """The parameter dtype `device` computes natively: "bfloat16" on a CUDA device with bf16
    matmuls, else "float32" (a CUDA device without bf16 would need fp16, whose range a policy
    trained in fp32 or bf16 can overflow)."""
    # including_emulation=False: a pre-Ampere GPU runs bf16 tensors, but emulated, not natively
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bfloat16"
    return "float32"


def resolve_dtype(requested: str, device: torch.device, flag: str = "--dtype") -> str:
    """`requested`, or for "auto" the device's `native_dtype`; an unknown dtype is a
    PreflightError naming `flag`."""
    from flywheel.policies.check import DTYPES
    from flywheel.run.errors import PreflightError

    if requested == "auto":
        return native_dtype(device)
    if requested not in DTYPES:
        raise PreflightError(f"{flag}={requested}: not a parameter dtype; choose auto (the device's own) or one "
                             f"of {', '.join(DTYPES)}")
    return requested


def placement(device: str, dtype: str) -> tuple[torch.device, str]:
    """(device, dtype) of `--device` and `--dtype`, said in one log line."""
    chosen = resolve_device(device)
    parameters = resolve_dtype(dtype, chosen)
    log.info("the policy runs on %s in %s (--device=%s, --dtype=%s; auto: CUDA when present, in the device's own "
             "dtype)", chosen, parameters, device, dtype)
    return chosen, parameters
