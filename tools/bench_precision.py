"""Training in fp32 against bf16 mixed precision on CPU, side by side: speed, roofline, parity.

Two copies of one policy, one trained in fp32 and one under bf16 autocast (what
`--trainer.precision=bf16-mixed` does on a CPU: the weights, the optimizer and the gradients
stay fp32, the matmuls run in bf16), take the same `--steps` optimizer steps on the same
tree-packed mini-batches (DeepSearch-shaped trees of random tokens, tools/bench_train.py's, a
fresh batch every step, identical for both), alternating step by step so that drifts in the
machine's load hit both. Per step: the loss and the gradient norm (before clipping) of each arm.

Printed: tokens per second of each arm (packed tokens through forward + backward + AdamW, wall
and CPU time), the matmul peak at the model's own shapes in each dtype on the same threads,
each arm's roofline fraction (achieved training FLOP/s, 6 x parameters-ish per token from
flywheel.reporting.roofline, over its dtype's peak), and the two curves with their largest
relative gaps. `--plot FILE` draws the curves overlaid (docs/performance.md shows one).

    python tools/bench_precision.py                                    # the tiny policy, 20 steps
    python tools/bench_precision.py --model smollm2-135m-instruct --trees 2 --k 4 --depth 4 \
        --step-tokens 32 --prompt-tokens 64 --steps 20 --plot docs/images/precision_smollm2.png

Last line: RESULT bf16_train_speedup=<fp32 / bf16 step wall time> bf16_train_cpu_speedup=...
fp32_tok_per_s=... bf16_tok_per_s=... fp32_roofline_fraction=... bf16_roofline_fraction=...
loss_max_rel_gap=... grad_norm_max_rel_gap=... (the gaps over all steps).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train import mean_context, tree_rows  # noqa: E402
from flywheel.objectives import policy_loss  # noqa: E402
from flywheel.policies.load import load_policy  # noqa: E402
from flywheel.reporting.roofline import flops_per_token, matmul_peak  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402
from flywheel.training.packing import pack_for, packed_logprobs  # noqa: E402
from flywheel.training.tree_attention import enable_tree_attention  # noqa: E402

ARMS = {"fp32": None, "bf16": torch.bfloat16}
"""Each arm's autocast dtype (None: no autocast, fp32 throughout)."""


def batches(model, args) -> list[dict]:
    """`args.steps` packed mini-batches, each with its old log-probs and advantages."""
    out = []
    for step in range(args.steps):
        ids, mask, groups, prompt = tree_rows(random.Random(step), model.config.vocab_size, args.trees, args.k,
                                              args.depth, args.step_tokens, args.prompt_tokens)
        packed = pack_for(model, ids, mask, groups)
        loss_mask = mask[:, 1:].bool() & (torch.arange(ids.shape[1] - 1) >= prompt - 1)
        advantages = torch.randn(loss_mask.shape, generator=torch.Generator().manual_seed(step))
        with torch.no_grad():
            old = packed_logprobs(model, packed, ids.shape)
        out.append({"packed": packed, "shape": ids.shape, "old": old, "advantages": advantages, "mask": loss_mask,
                    "context": mean_context(mask)})
    return out


def train_step(model, optimizer, batch: dict, dtype: torch.dtype | None, clip: float) -> dict:
    """One optimizer step on `batch` under autocast to `dtype` (None: fp32); its loss, gradient
    norm and wall / CPU seconds."""
    optimizer.zero_grad(set_to_none=True)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logprobs = packed_logprobs(model, batch["packed"], batch["shape"])
        loss = policy_loss(logprobs, batch["old"], batch["advantages"], batch["mask"])[0]
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return {"loss": loss.item(), "grad_norm": norm.item(), "wall": time.perf_counter() - start,
            "cpu": time.process_time() - cpu}


def max_rel_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


def plot(path: str, curves: dict[str, list[dict]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for axis, key in zip(axes, ("loss", "grad_norm")):
        for arm, style in (("fp32", "-o"), ("bf16", "--x")):
            axis.plot(range(1, len(curves[arm]) + 1), [s[key] for s in curves[arm]], style, label=arm, markersize=4)
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(key.replace("_", " "))
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-countdown", help="a built-in policy name or a model folder")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of each arm")
    parser.add_argument("--trees", type=int, default=4, help="trees per mini-batch")
    parser.add_argument("--k", type=int, default=8, help="trajectories per tree")
    parser.add_argument("--depth", type=int, default=4, help="steps per trajectory")
    parser.add_argument("--step-tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--clip", type=float, default=1.0, help="gradient clipping (the recipes' gradient_clip_val)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--plot", default=None, help="write the loss and gradient-norm curves, overlaid, to this PNG")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    base, _ = load_policy(args.model)
    base = base.float().train()
    enable_tree_attention(base)
    models = {"fp32": base, "bf16": copy.deepcopy(base)}
    optimizers = {arm: torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.1) for arm, m in models.items()}
    data = batches(base, args)
    warm = copy.deepcopy(base)  # warm-up, not counted: the kernels' first calls pack and allocate
    for dtype in ARMS.values():
        train_step(warm, torch.optim.SGD(warm.parameters(), lr=0.0), data[0], dtype, args.clip)
    del warm
    curves: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    print(f"{'step':>4} {'loss fp32':>10} {'loss bf16':>10} {'gnorm fp32':>10} {'gnorm bf16':>10} "
          f"{'s fp32':>7} {'s bf16':>7}", flush=True)
    for step, batch in enumerate(data):
        order = list(ARMS) if step % 2 == 0 else list(reversed(ARMS))  # alternate which goes first
        for arm in order:
            curves[arm].append(train_step(models[arm], optimizers[arm], batch, ARMS[arm], args.clip))
        f, b = curves["fp32"][-1], curves["bf16"][-1]
        print(f"{step + 1:>4} {f['loss']:10.5f} {b['loss']:10.5f} {f['grad_norm']:10.4f} {b['grad_norm']:10.4f} "
              f"{f['wall']:7.2f} {b['wall']:7.2f}", flush=True)

    tokens = statistics.mean(b["packed"].tokens for b in data)
    context = statistics.mean(b["context"] for b in data)
    flops = flops_per_token(base.config, context, backward=True)["total"]
    rows = int(tokens)
    fields = {}
    for arm, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        wall = statistics.median(s["wall"] for s in curves[arm])
        cpu = statistics.median(s["cpu"] for s in curves[arm])
        peak = matmul_peak(base.config, rows, dtype)
        fields[arm] = {"wall": wall, "cpu": cpu, "tok_per_s": tokens / wall, "peak": peak,
                       "roofline": tokens / wall * flops / peak}
        print(f"{arm}: {tokens / wall:.0f} packed tokens/s ({wall:.2f} s a step, {cpu:.2f} CPU s); training "
              f"{flops / 1e9:.3f} GFLOP a token at a mean context of {context:.0f}; matmul peak "
              f"{peak / 1e9:.0f} GFLOP/s at the model's shapes and {rows} rows, {torch.get_num_threads()} thread(s); "
              f"achieved {tokens / wall * flops / 1e9:.0f} GFLOP/s = {fields[arm]['roofline']:.2f} of it")
    loss_gap = max_rel_gap([s["loss"] for s in curves["fp32"]], [s["loss"] for s in curves["bf16"]])
    norm_gap = max_rel_gap([s["grad_norm"] for s in curves["fp32"]], [s["grad_norm"] for s in curves["bf16"]])
    print(f"over {args.steps} steps: largest relative gap of the loss {loss_gap:.3f}, of the gradient norm {norm_gap:.3f}")
    if args.plot:
        plot(args.plot, curves, f"{args.model}: fp32 vs bf16-mixed, the same {args.steps} tree-packed mini-batches")
        print(f"curves: {args.plot}")
    f, b = fields["fp32"], fields["bf16"]
    print(f"RESULT bf16_train_speedup={f['wall'] / b['wall']:.2f} bf16_train_cpu_speedup={f['cpu'] / b['cpu']:.2f} "
          f"fp32_tok_per_s={f['tok_per_s']:.0f} bf16_tok_per_s={b['tok_per_s']:.0f} "
          f"fp32_roofline_fraction={f['roofline']:.3f} bf16_roofline_fraction={b['roofline']:.3f} "
          f"loss_max_rel_gap={loss_gap:.4f} grad_norm_max_rel_gap={norm_gap:.4f}")


if __name__ == "__main__":
    main()
