"""Decode attention with each prompt's KV kept once, for the in-process generator.

The n samples of a request share their prompt. With one padded KV buffer per layer, the
decode loop copies every prompt's keys and values into each of its rows and SDPA reads every
column of every row, padding included; in a search most of a row's columns are its prompt
(the node's prefix), so that copy and that reading are most of the attention's cost
(docs/performance.md). Here a chunk keeps its prompts' KV once, [U, H, P, D], and its rows'
generated columns apart, [B, H, T, D]; the C kernel in `csrc/prefix_attention.c` attends each
row to its prompt's real columns and its own columns in one pass (an online softmax), reading
no padding and no copy.

The kernel is compiled on first use with the machine's C compiler (`CC`, else `cc` or `gcc`;
under a second) into `$FLYWHEEL_CACHE` (default `~/.cache/flywheel`), one library per source
and CPU (it is built for the CPU it runs on), written atomically. Without a compiler, or with
`FLYWHEEL_PREFIX_ATTENTION=0`, the decode loop replicates the prompts and uses SDPA as before
(logged once). Float32 on CPU only. The result equals SDPA's up to float rounding (the order
of the sums), not bit for bit.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from flywheel.io import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "prefix_attention.c"
_state: dict = {}
_lock = threading.Lock()


@dataclass
class SharedPrompts:
    """A chunk's prompts, kept once: per layer keys and values [U, Hkv, P, D] (P the buffer's
    capacity), which of their columns are real [U, P] (bool), and each row's prompt [B]."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor
    row_prompt: torch.Tensor


def _library_name() -> str:
    """From the source, the architecture and the CPU's feature flags: a library built with
    -march=native must not run on another CPU that shares the cache directory."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(platform.machine().encode())
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        digest.update(next((s for s in lines if s.startswith(("flags", "Features"))), "").encode())
    except OSError:
        pass
    return f"prefix_attention-{digest.hexdigest()[:16]}.so"


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (set CC)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    error = ""
    for arch in (["-march=native"], []):  # some compilers or CPUs refuse -march=native
        # Not -ffast-math: linking with it sets flush-to-zero for the whole process on load.
        # These let the sums vectorise and nothing more.
        command = [compiler, "-O3", *arch, "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
                   "-fassociative-math", "-fPIC", "-shared", str(SOURCE), "-o", str(partial), "-lm"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode == 0:
            os.replace(partial, target)  # atomic: a concurrent loader sees the whole library or none
            return
        error = done.stderr.strip()[-500:]
    raise RuntimeError(f"compiling {SOURCE.name} failed: {error}")


def kernel():
    """The compiled kernel, or None where it is unavailable (see the module docstring)."""
    if "kernel" not in _state:
        with _lock:
            if "kernel" not in _state:
                _state["kernel"] = _load()
    return _state["kernel"]


def _load():
    if os.environ.get("FLYWHEEL_PREFIX_ATTENTION", "1") == "0":
        return None
    try:
        target = cache_dir() / _library_name()
        if not target.exists():
            _build(target)
        function = ctypes.CDLL(str(target)).prefix_attention  # a CDLL call releases the GIL
    except Exception as err:  # noqa: BLE001 - whatever failed, decoding falls back to SDPA
        log.warning("prefix attention kernel unavailable, decoding with SDPA over replicated prompts: %s", err)
        return None
    function.restype = ctypes.c_int
    pointer, integer = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [pointer] * 4 + [integer] * 2 + [pointer] * 3 + [integer] * 2 + [pointer] + [integer] * 3 + [
        ctypes.c_float] + [integer] * 2
    return function


def usable(model: torch.nn.Module) -> bool:
    """Whether a model's decode can use the kernel: float32 on CPU, and the kernel built."""
    parameter = next(model.parameters(), None)
    return (parameter is not None and parameter.dtype == torch.float32 and parameter.device.type == "cpu"
            and kernel() is not None)


def prefix_attention(q: torch.Tensor, layer: int, prompts: SharedPrompts, row_keys: torch.Tensor,
                     row_values: torch.Tensor, row_columns: int, scale: float) -> torch.Tensor:
    """q [B, Hq, D]; the prompts' KV of `layer`; row_keys, row_values [B, Hkv, T, D], of which
    the first `row_columns` columns are written. Returns [B, Hq, D]. Rows are split across
    torch's intra-op threads when there are enough of them."""
    function = kernel()
    if function is None:
        raise RuntimeError("the prefix attention kernel is not available; check usable() first")
    keys, values = prompts.layers[layer]
    rows, q_heads, dim = q.shape
    tensors = (keys, values, prompts.mask, prompts.row_prompt, row_keys, row_values)
    if not all(t.is_contiguous() for t in tensors) or prompts.mask.dtype != torch.bool:
        raise ValueError("prefix_attention needs contiguous tensors and a bool prompt mask")
    if prompts.row_prompt.shape != (rows,) or row_keys.shape[0] != rows or row_columns > row_keys.shape[2]:
        raise ValueError(f"shapes disagree: q {tuple(q.shape)}, row keys {tuple(row_keys.shape)}, "
                         f"row_prompt {tuple(prompts.row_prompt.shape)}, row_columns {row_columns}")
    q = q.contiguous()
    out = torch.empty_like(q)
    args = (q.data_ptr(), keys.data_ptr(), values.data_ptr(), prompts.mask.data_ptr(), keys.shape[2],
            prompts.mask.shape[1], prompts.row_prompt.data_ptr(), row_keys.data_ptr(), row_values.data_ptr(),
            row_keys.shape[2], row_columns, out.data_ptr(), q_heads, keys.shape[1], dim, scale)
    threads = min(torch.get_num_threads(), rows // 256)  # a thread pays off from ~256 rows each
    step = -(-rows // max(1, threads))
    spans = [(lo, min(rows, lo + step)) for lo in range(0, rows, step)]
    if len(spans) == 1:
        failed = [function(*args, 0, rows)]
    else:
        failed = list(_pool(len(spans)).map(lambda span: function(*args, *span), spans))
    if any(failed):
        raise ValueError(f"prefix_attention: unsupported head size {dim} or heads {q_heads}/{keys.shape[1]}")
    return out


def _pool(workers: int) -> ThreadPoolExecutor:
    pool = _state.get("pool")
    if pool is None or pool._max_workers < workers:
        pool = _state["pool"] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="flywheel-attention")
    return pool
