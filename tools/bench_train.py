"""Tree-packed vs flat training steps on DeepSearch-shaped trees, measured side by side.

Each tree: a prompt and K trajectories of `depth` steps of `step_tokens` tokens; the first
trajectory is random, every later one branches off an earlier one at a random step
boundary (as the frontier selection does) and continues with fresh steps; 8 children per
expansion means up to 8 branches per node. The flat form trains one row per trajectory;
the packed form computes every shared prefix once (flywheel.training.packing: the mini-batch as one
token trie, block-sparse tree attention over each token's ancestors). Both run the same
forward + backward of the Tree-GRPO loss, alternating, and the loss difference is printed.
The packed layout is built once per mini-batch (as in training) and not timed; its build
time is printed.

Growth lines: the tiny policy's time per trained token (the loss-bearing response tokens,
the same count for both forms), flat and packed, at each of --growth-depths (4 to 64), and
the last/first ratios next to the growth of a trajectory's length.

    python tools/bench_train.py                 # tiny policy and a ~100M Llama, depth 4 and 16; growth lines
    python tools/bench_train.py --models tiny   # the tiny policy only
    python tools/bench_train.py --models tiny --growth-depths   # without the growth lines
    python tools/bench_train.py --models tiny smollm2 --depths 4 --k 4 --step-tokens 32 --prompt-tokens 64 \
        --trees-100m 2 --growth-depths     # the real pretrained model at conf/smollm2_cpu.yaml's tree shapes

The `roofline` column: the packed step's achieved training FLOP/s (flywheel.reporting.roofline's
count, backward included) over the fp32 matmul peak measured at the model's own weight shapes
with as many rows, on the same threads (tools/bench_precision.py does the same for bf16-mixed).

Last line: RESULT token_ratio=<flat/packed tokens> speedup=<flat/packed step wall time>
cpu_speedup=<flat/packed step CPU time> roofline_fraction=<packed, fp32> ... for the depth-16 trees with the tiny policy, then
<model>_d<depth>_speedup=... and _cpu_speedup=... for the others, then
growth_{flat,packed}[_cpu]_per_token_d4_to_d64=... and growth_row_length_d4_to_d64=... Wall and
CPU time are medians of alternating steps; on a loaded machine the CPU-time ratio is the steadier one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flywheel.objectives import policy_loss, token_logprobs  # noqa: E402
from flywheel.training.packing import pack_for, packed_logprobs, right_pad  # noqa: E402
from flywheel.training.tree_attention import enable_tree_attention  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402
from flywheel.reporting.roofline import flops_per_token, matmul_peak  # noqa: E402


def tree_rows(rng: random.Random, vocab: int, trees: int, k: int, depth: int, step_tokens: int, prompt_tokens: int):
    rows, groups = [], []
    for g in range(trees):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
        steps = lambda n: [rng.randrange(3, vocab) for _ in range(n * step_tokens)]  # noqa: E731
        paths = [prompt + steps(depth)]
        branches: dict[tuple[int, int], int] = {}
        while len(paths) < k:
            base = rng.randrange(len(paths))
            cut = rng.randrange(0, depth)  # branch after `cut` shared steps
            if branches.get((base, cut), 0) >= 7:  # 8 children per expansion at most
                continue
            branches[(base, cut)] = branches.get((base, cut), 0) + 1
            shared = paths[base][: prompt_tokens + cut * step_tokens]
            paths.append(shared + steps(depth - cut))
        rows += paths
        groups += [g] * len(paths)
    ids, mask = right_pad(rows, pad_id=0)
    return ids, mask, torch.tensor(groups), prompt_tokens


def build(name: str):
    if name in ("tiny", "smollm2"):
        from flywheel.policies.load import load_policy

        model, _ = load_policy("tiny-countdown" if name == "tiny" else "smollm2-135m-instruct")
        return model.train()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float().train()


def step_time(model, fn, repeats: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of `repeats` forward + backward steps. The CPU time of this process
    (all its threads) is the work done; on a shared machine it is far less noisy than the wall."""
    times = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start, cpu = time.perf_counter(), time.process_time()
        loss = fn()
        loss.backward()
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "100m"], choices=["tiny", "100m", "smollm2"],
                        help="smollm2: the real pretrained SmolLM2-135M-Instruct (python tools/get_policy.py "
                             "smollm2-135m-instruct first), with --trees-100m trees")
    parser.add_argument("--depths", nargs="+", type=int, default=[4, 16])
    parser.add_argument("--growth-depths", nargs="*", type=int, default=[4, 8, 16, 32, 64],
                        help="depths of the tiny policy's growth lines (time per trained token); none: skip them")
    parser.add_argument("--trees", type=int, default=4, help="trees per mini-batch of the tiny policy")
    parser.add_argument("--trees-100m", type=int, default=4,
                        help="trees per mini-batch of the ~100M model: 4 by default, as for the tiny policy "
                             "(about 13 minutes on 2 cores); 1 is faster, but its one tree shares less of its "
                             "tokens at depth 16 (1.58x against the 4 trees' 1.87x)")
    parser.add_argument("--k", type=int, default=8, help="trajectories per tree")
    parser.add_argument("--step-tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); 1 keeps the CPU-time ratio honest on a loaded "
                             "machine, where idle OpenMP threads spin and bill CPU time")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    results = {}
    print(f"{'model':<6} {'depth':>5} {'flat tok':>9} {'packed tok':>10} {'ratio':>6} {'flat s':>8} {'packed s':>8} "
          f"{'speedup':>7} {'cpu spd':>7} {'|dloss|':>9} {'layout s':>8} {'roofline':>8}")
    tiny_rows: dict[int, dict] = {}
    for name in args.models:
        model = build(name)
        enable_tree_attention(model)  # packed passes block-sparse; flat rows stay plain sdpa
        repeats = args.repeats if name == "tiny" else 1
        trees = args.trees if name == "tiny" else args.trees_100m
        for depth in args.depths:
            r = measure(model, depth, trees, args, repeats)
            if name == "tiny":
                tiny_rows[depth] = r
            r["roofline"] = roofline_fraction(model, r)
            results[(name, depth)] = (r["token_ratio"], r["flat_s"] / r["packed_s"], r["flat_cpu"] / r["packed_cpu"],
                                      r["roofline"])
            print(f"{name:<6} {depth:>5} {r['flat_tokens']:>9} {r['packed_tokens']:>10} {r['token_ratio']:6.2f} "
                  f"{r['flat_s']:8.3f} {r['packed_s']:8.3f} {r['flat_s'] / r['packed_s']:7.2f} "
                  f"{r['flat_cpu'] / r['packed_cpu']:7.2f} {r['dloss']:9.2e} {r['layout_s']:8.3f} "
                  f"{r['roofline']:8.3f}", flush=True)
    key = ("tiny", 16) if ("tiny", 16) in results else next(iter(results))
    ratio, speedup, cpu, roofline = results[key]
    fields = [f"token_ratio={ratio:.2f}", f"speedup={speedup:.2f}", f"cpu_speedup={cpu:.2f}", f"model={key[0]}",
              f"depth={key[1]}", f"roofline_fraction={roofline:.3f}"]
    fields += [f"{n}_d{d}_speedup={s:.2f} {n}_d{d}_cpu_speedup={c:.2f} {n}_d{d}_roofline_fraction={f:.3f}"
               for (n, d), (_, s, c, f) in results.items() if (n, d) != key]
    growth = growth_lines(args, tiny_rows) if args.growth_depths else {}
    fields += [f"{k}={v:.3g}" for k, v in growth.items()]
    print("RESULT " + " ".join(fields))


def measure(model, depth: int, trees: int, args, repeats: int) -> dict:
    """Flat and packed steps of one mini-batch of `trees` trees of this depth, alternating."""
    ids, mask, groups, prompt = tree_rows(random.Random(depth), model.config.vocab_size, trees, args.k, depth,
                                          args.step_tokens, args.prompt_tokens)
    start = time.perf_counter()
    packed = pack_for(model, ids, mask, groups)
    layout_s = time.perf_counter() - start
    loss_mask = mask[:, 1:].bool() & (torch.arange(ids.shape[1] - 1) >= prompt - 1)
    advantages = torch.randn(loss_mask.shape, generator=torch.Generator().manual_seed(depth))
    with torch.no_grad():
        old = packed_logprobs(model, packed, ids.shape)

    def flat():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        return policy_loss(token_logprobs(logits, ids[:, 1:]), old, advantages, loss_mask)[0]

    def tree():
        return policy_loss(packed_logprobs(model, packed, ids.shape), old, advantages, loss_mask)[0]

    with torch.no_grad():
        diff = abs(float(flat()) - float(tree()))
    step_time(model, flat, 1), step_time(model, tree, 1)  # warm-up
    flat_times, tree_times = [], []
    for _ in range(repeats):  # alternate, so drifts in machine load hit both
        flat_times += step_time(model, flat, 1)
        tree_times += step_time(model, tree, 1)
    f, t = (statistics.median(w for w, _ in x) for x in (flat_times, tree_times))
    fc, tc = (statistics.median(c for _, c in x) for x in (flat_times, tree_times))
    flat_tok, tree_tok = int(mask.sum()), packed.tokens
    return {"flat_tokens": flat_tok, "packed_tokens": tree_tok, "token_ratio": flat_tok / tree_tok,
            "trained_tokens": int(loss_mask.sum()), "flat_s": f, "packed_s": t, "flat_cpu": fc, "packed_cpu": tc,
            "dloss": diff, "layout_s": layout_s, "context": mean_context(mask)}


def mean_context(mask: torch.Tensor) -> float:
    """The columns a trained token attends to on average: half of a row's mean length."""
    return float(mask.sum(-1).float().mean()) / 2


def roofline_fraction(model, r: dict) -> float:
    """The packed step's achieved training FLOP/s (forward + backward of every packed token at
    the rows' mean context) over the fp32 matmul peak at the model's shapes with as many rows,
    on the same threads (flywheel.reporting.roofline)."""
    flops = flops_per_token(model.config, r["context"], backward=True)["total"]
    return r["packed_tokens"] * flops / r["packed_s"] / matmul_peak(model.config, r["packed_tokens"], torch.float32)


def growth_lines(args, measured: dict[int, dict]) -> dict[str, float]:
    """Time per trained token (the loss-bearing response tokens, the same for both forms) of the
    tiny policy from the first to the last of --growth-depths, flat and packed."""
    model = build("tiny")
    enable_tree_attention(model)
    rows = {d: measured.get(d) or measure(model, d, args.trees, args, args.repeats) for d in args.growth_depths}
    print(f"growth with depth, tiny policy ({args.trees} trees of K = {args.k}, {args.step_tokens}-token steps): "
          "time per trained token")
    print(f"{'depth':>5} {'trained tok':>11} {'flat tok':>9} {'packed tok':>10} {'flat us/tok':>11} "
          f"{'packed us/tok':>13} {'flat cpu us/tok':>15} {'packed cpu us/tok':>17}")
    per_token = {}
    for d, r in rows.items():
        n = r["trained_tokens"]
        per_token[d] = {k: 1e6 * r[k] / n for k in ("flat_s", "packed_s", "flat_cpu", "packed_cpu")}
        p = per_token[d]
        print(f"{d:>5} {n:>11} {r['flat_tokens']:>9} {r['packed_tokens']:>10} {p['flat_s']:>11.2f} "
              f"{p['packed_s']:>13.2f} {p['flat_cpu']:>15.2f} {p['packed_cpu']:>17.2f}")
    lo, hi = args.growth_depths[0], args.growth_depths[-1]
    tag = f"d{lo}_to_d{hi}"
    out = {
        f"growth_flat_per_token_{tag}": per_token[hi]["flat_s"] / per_token[lo]["flat_s"],
        f"growth_packed_per_token_{tag}": per_token[hi]["packed_s"] / per_token[lo]["packed_s"],
        f"growth_flat_cpu_per_token_{tag}": per_token[hi]["flat_cpu"] / per_token[lo]["flat_cpu"],
        f"growth_packed_cpu_per_token_{tag}": per_token[hi]["packed_cpu"] / per_token[lo]["packed_cpu"],
        f"growth_row_length_{tag}": row_length(args, hi) / row_length(args, lo),
    }
    wall = out[f"growth_flat_per_token_{tag}"], out[f"growth_packed_per_token_{tag}"]
    cpu = out[f"growth_flat_cpu_per_token_{tag}"], out[f"growth_packed_cpu_per_token_{tag}"]
    print(f"depth {lo} -> {hi}: time per trained token x{wall[0]:.2f} flat, x{wall[1]:.2f} packed (CPU time "
          f"x{cpu[0]:.2f}, x{cpu[1]:.2f}); a trajectory's length, what each token attends to, grows "
          f"x{out[f'growth_row_length_{tag}']:.2f}")
    return out


def row_length(args, depth: int) -> int:
    """Tokens of one trajectory: the prompt and `depth` steps."""
    return args.prompt_tokens + depth * args.step_tokens

if __name__ == "__main__":
    main()
