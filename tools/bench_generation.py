"""The same DeepSearch search through the in-process generator and through the vLLM sidecar.

    FLYWHEEL_VLLM_PYTHON=/path/to/vllm-venv/bin/python python tools/bench_generation.py

Both arms search the same Countdown problems with the same tree settings and seeds, with the
shipped `tiny-countdown-h3` policy (head size 32: vLLM's CPU attention needs at least 32) or
`--policy random`, a randomly initialised character-level Llama of the same head size (longer,
less repetitive samples). `--replicas 2` spreads the sidecar arm over two servers. Printed per arm: wall time of the search, generated
tokens per second, prompt tokens submitted, prompt tokens computed, and the prefix-cache
hit rate (the in-process generator's own accounting; the server's /metrics counters).
Server start-up is reported apart and not counted.

Batch efficiency, per arm: the search's generated tokens per second of generator time, as a
fraction of the same generator sampling flat batches (every problem's prompt, `--width`
complete samples each, all problems in one call). 1.0 = the search keeps the generator batch
as full as flat sampling does; trees finishing at different rounds, short steps and
expansions of different sizes make it lower. In-process arm: each search call is followed at
once by one flat call on a generator of its own, so drifts in machine load hit both within
seconds; the search runs `--repeats` times (after an uncounted warm-up) and
`batch_efficiency` is the median ratio of this process's CPU seconds (`--threads 1` by
default), `batch_efficiency_wall` of wall seconds. Sidecar arm: as many flat tokens after
the search; its generator is another process, so both of its numbers are wall-time ratios. `--profile` prints, for the search and
the flat batches, the decode passes, their mean batch and the KV width per row
(docs/performance.md explains the gap with them).

    python tools/bench_generation.py --quickstart --skip-sidecar   # the quickstart's search, in-process
    python tools/bench_generation.py --policy smollm2-135m-instruct --task math --problems 8 --width 4 --k 4 \
        --max-expansions 16 --repeats 1    # a real pretrained model on conf/smollm2_cpu.yaml's search shapes

`--task math` searches built-in arithmetic with MathTask (the chat template's prompt, fixed
`--step-tokens` chunks, `--max-depth` of them) instead of Countdown.

Last line: RESULT ... batch_efficiency=<in-process arm, CPU time> batch_efficiency_wall=...
(and vllm_batch_efficiency=...).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from flywheel.reporting.problem_view import decoder  # noqa: E402
from flywheel.reporting.problem_view import encode_prompt  # noqa: E402
from flywheel.generation.base import GenerationRequest, SamplingParams  # noqa: E402
from flywheel.generation.hf import HFGenerator  # noqa: E402
from flywheel.generation.vllm import VLLMSidecar  # noqa: E402
from flywheel.policies.load import load_policy  # noqa: E402
from flywheel.search import SearchConfig, SearchDriver, SearchProblem  # noqa: E402
from flywheel.tasks.countdown import CountdownTask  # noqa: E402
from flywheel.tasks.math import MathTask  # noqa: E402
from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402
from flywheel.reporting.roofline import flops_per_token, matmul_peak, matmul_share  # noqa: E402


class Timed:
    """A generator whose `sample` calls are timed: wall seconds and this process's CPU seconds."""

    def __init__(self, generator) -> None:
        self.generator = generator
        self.stats = generator.stats
        self.wall = self.cpu = 0.0

    def sample(self, requests):
        wall, cpu = time.perf_counter(), time.process_time()
        out = self.generator.sample(requests)
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu
        return out


def decode_shapes(stats) -> str:
    """A generator's decode passes (one new token per row), their mean batch and the mean
    attention width per row (columns of the padded KV cache, and the real ones among them),
    from its own counters."""
    extra = stats.extra
    passes, rows = extra.get("decode_passes", 0), max(extra.get("decode_row_steps", 0), 1)
    return (f"{passes:.0f} decode passes, mean batch {rows / max(passes, 1):.0f} rows, "
            f"{extra.get('decode_sparse_passes', 0) / max(passes, 1):.0%} of them with under half the row budget busy, "
            f"KV width {extra.get('decode_kv_columns', 0) / rows:.1f} ({extra.get('decode_real_columns', 0) / rows:.1f} real)")


class Paired:
    """The search's generator, timed per call, each call followed by one flat call (every
    problem's prompt, `--width` complete samples each) on a generator of its own, timed the
    same way: drifts in machine load hit both arms within seconds of each other."""

    def __init__(self, search_generator, flat_generator, prompts, args) -> None:
        self.search, self.flat = Timed(search_generator), Timed(flat_generator)
        self.stats = search_generator.stats
        self.prompts, self.args = prompts, args
        self.flat_tokens = self.calls = 0

    def sample(self, requests):
        out = self.search.sample(requests)
        flat = flat_call(self.prompts, self.args.width, self.args.flat_max_new_tokens, self.calls)
        self.flat_tokens += sum(len(c.token_ids) for r in self.flat.sample(flat) for c in r)
        self.calls += 1
        return out

    def ratios(self, tokens: int) -> tuple[float, float]:
        """(by wall time, by CPU time): the search's tokens/s over flat sampling's."""
        return (tokens / self.search.wall / (self.flat_tokens / self.flat.wall),
                tokens / self.search.cpu / (self.flat_tokens / self.flat.cpu))


def flat_call(prompts, width: int, max_new_tokens: int, call: int) -> list[GenerationRequest]:
    """The requests of flat sampling's call number `call`: `width` complete samples of every
    prompt, each request seeded by the call and its place."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    return [GenerationRequest(tuple(p), width, params, seed=call * len(prompts) + i) for i, p in enumerate(prompts)]


def flat_tokens_per_second(generator, prompts, width: int, tokens: int, max_new_tokens: int) -> tuple[float, float]:
    """Generated tokens per wall second and per CPU second of `generator` sampling `width`
    complete samples of every prompt in one call, repeated until at least `tokens` tokens came out."""
    timed = Timed(generator)
    done, call = 0, 0
    while done < tokens:
        done += sum(len(c.token_ids) for r in timed.sample(flat_call(prompts, width, max_new_tokens, call)) for c in r)
        call += 1
    return done / timed.wall, done / timed.cpu


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-expansions", type=int, default=32)
    parser.add_argument("--python", default=os.environ.get("FLYWHEEL_VLLM_PYTHON", sys.executable),
                        help="interpreter with vLLM installed")
    parser.add_argument("--policy", default="tiny-countdown-h3", help="a model folder, a built-in name, or 'random'")
    parser.add_argument("--replicas", type=int, default=1, help="vLLM servers of the sidecar arm")
    parser.add_argument("--block-size", type=int, default=None, help="the servers' KV block size (default: the sidecar's)")
    parser.add_argument("--skip-sidecar", action="store_true", help="the in-process arm only (no vLLM needed)")
    parser.add_argument("--task", choices=["countdown", "math"], default="countdown",
                        help="countdown: 3-number Countdown, steps end at a newline; math: built-in arithmetic with MathTask")
    parser.add_argument("--step-tokens", type=int, default=32, help="--task math: tokens per step")
    parser.add_argument("--max-depth", type=int, default=8, help="steps per trajectory at most")
    parser.add_argument("--quickstart", action="store_true",
                        help="conf/quickstart.yaml's search: tiny-countdown, 64 expansions, merged duplicate steps, "
                             "random terminal choice")
    parser.add_argument("--flat-max-new-tokens", type=int, default=96,
                        help="cap of a flat sample (a complete Countdown solution is shorter)")
    parser.add_argument("--profile", action="store_true",
                        help="also print the in-process arm's decode passes, mean batch and KV width, search and flat")
    parser.add_argument("--repeats", type=int, default=5,
                        help="in-process arm: the search (each call paired with a flat call) measured this many "
                             "times; batch_efficiency is the median of the per-repeat ratios")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32"],
                        help="the in-process arm once per dtype, side by side (the generator's "
                             "--data.generator.init_args.dtype); the first is the table's hf row")
    parser.add_argument("--vllm-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the sidecar arm's server dtype (--data.generator.init_args.dtype of VLLMSidecar)")
    parser.add_argument("--max-concurrent-trees", type=int, default=64,
                        help="trees searched together: their frontiers' nodes share each generator call")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; with 1 the in-process arm's CPU time is its compute time, which other "
                             "jobs on the machine change far less than its wall time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.quickstart:
        args.policy, args.max_expansions = "tiny-countdown", 64

    policy = args.policy
    if policy == "random":
        folder = Path(tempfile.mkdtemp(prefix="bench-generation-"))
        tok = build_char_tokenizer()
        build_tiny_llama(tok, hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256, seed=0,
                         initializer_range=0.2).save_pretrained(folder)
        tok.save_pretrained(folder)
        policy = str(folder)
    model, tok = load_policy(policy)
    model.eval()
    if args.task == "math":
        task, split = MathTask(step_tokens=args.step_tokens, max_response_tokens=args.step_tokens * args.max_depth), "arith_test"
    else:
        task, split = CountdownTask(numbers_count=3), "test"
    problems = [SearchProblem(encode_prompt(tok, task, p), functools.partial(task.score, p), p.id)
                for p in task.problems(split)[: args.problems]]
    quickstart = dict(merge_duplicate_steps=True, terminal_choice="random") if args.quickstart else {}
    config = SearchConfig(max_depth=args.max_depth, expansion_width=args.width, trajectories_per_tree=args.k,
                          max_expansions_per_tree=args.max_expansions, **quickstart)
    decode = decoder(tok)

    def search(generator):
        timed = Timed(generator)
        driver = SearchDriver(timed, config, step=task.step, decode=decode,
                              max_concurrent_trees=args.max_concurrent_trees,
                              eos_token_ids=[tok.eos_token_id])
        start = time.perf_counter()
        driver.run(problems)
        return time.perf_counter() - start, driver.stats.generated_tokens, timed

    prompts = [p.prompt_ids for p in problems]

    def efficiency(generator, tokens: int, timed: Timed) -> tuple[float, float]:
        """(by wall time, by CPU time): the search's tokens/s over flat sampling's."""
        flat_wall, flat_cpu = flat_tokens_per_second(generator, prompts, args.width, tokens, args.flat_max_new_tokens)
        return tokens / timed.wall / flat_wall, tokens / timed.cpu / flat_cpu

    rows, roofline = {}, {}
    for dtype in args.dtypes:
        row, roofline[dtype] = in_process_arm(model, tok, dtype, problems, prompts, config, task, decode, search, args)
        rows["hf" if not rows else f"hf_{dtype}"] = row
    if args.skip_sidecar:
        report(args, rows, roofline, startup=None)
        return

    sidecar = VLLMSidecar(python=args.python, replicas=args.replicas, max_num_seqs=256, startup_timeout=600, block_size=args.block_size,
                          dtype=args.vllm_dtype)
    start = time.perf_counter()
    generator = sidecar.build(model, tok)
    startup = time.perf_counter() - start
    try:
        search(generator)  # warm-up: first requests pay one-off costs
        before = sidecar.prefix_cache_counters() or (0.0, 0.0)
        submitted_before = generator.stats.prompt_tokens
        seconds, tokens, timed = search(generator)
        after = sidecar.prefix_cache_counters() or (0.0, 0.0)
        queries, hits = after[0] - before[0], after[1] - before[1]
        # The server computes in another process: only the wall-time ratio means something here.
        wall_efficiency = efficiency(generator, tokens, timed)[0]
        rows["vllm"] = (seconds, tokens, generator.stats.prompt_tokens - submitted_before, queries - hits,
                        hits / queries if queries else 0.0, wall_efficiency, wall_efficiency)
    finally:
        sidecar.close()
    report(args, rows, roofline, startup)


def in_process_arm(model, tok, dtype: str, problems, prompts, config, task, decode, search, args):
    """The search through HFGenerators sampling in `dtype`, `--repeats` times, each call paired
    with a flat call; (its table row, its roofline dict)."""
    def generator():
        return HFGenerator(model, tok, seed=0, prefix_cache_mb=256, dtype=dtype)

    # Warm-up, not counted: the process's first search pays one-off costs (allocator growth,
    # stop-string tables).
    SearchDriver(generator(), config, step=task.step, decode=decode, max_concurrent_trees=args.max_concurrent_trees,
                 eos_token_ids=[tok.eos_token_id]).run(problems[:16])
    ratios, rates = [], []
    for _ in range(args.repeats):
        # Fresh generators (empty prefix caches); each search call is followed by one flat call.
        paired = Paired(generator(), generator(), prompts, args)
        seconds, tokens, _ = search(paired)
        seconds -= paired.flat.wall  # the search's own wall time
        submitted, computed = paired.stats.prompt_tokens, paired.stats.prefill_tokens
        ratios.append(paired.ratios(tokens))
        rates.append((tokens / paired.search.cpu, paired.flat_tokens / paired.flat.cpu))
        if args.profile and len(ratios) == 1:
            print(f"in-process search ({dtype}): {decode_shapes(paired.search.stats)}\n"
                  f"in-process flat ({dtype}):   {decode_shapes(paired.flat.stats)}")
    print(f"in-process {dtype}, per repeat: batch_efficiency (CPU time) " + " ".join(f"{c:.3f}" for _, c in ratios)
          + "; generated tokens per CPU second, search / flat " + " ".join(f"{a:.0f}/{b:.0f}" for a, b in rates))
    row = (seconds, tokens, submitted, computed, 1 - computed / max(submitted, 1),
           statistics.median(w for w, _ in ratios), statistics.median(c for _, c in ratios))
    return row, roofline_of(model, generator, paired.search.stats, tokens / seconds, dtype, prompts, args)


def roofline_of(model, generator, stats, tokens_per_second: float, dtype: str, prompts, args) -> dict:
    """The search's achieved FLOP/s against the matmul peak at the model's shapes, its mean
    decode batch and this dtype, on the same threads; and the share of a flat call's time
    spent outside the matmuls (profiled)."""
    extra = stats.extra
    passes, row_steps = max(extra.get("decode_passes", 0), 1), max(extra.get("decode_row_steps", 0), 1)
    batch = max(1, round(row_steps / passes))
    context = extra.get("decode_real_columns", 0) / row_steps
    flops = flops_per_token(model.config, context)
    peak = matmul_peak(model.config, batch, getattr(torch, dtype))
    share, _ = matmul_share(lambda: generator().sample(flat_call(prompts, args.width, args.flat_max_new_tokens, 0)))
    out = {"tok_per_s": tokens_per_second, "gflop_per_token": flops["total"] / 1e9, "batch": batch,
           "context": context, "peak_gflops": peak / 1e9, "achieved_gflops": tokens_per_second * flops["total"] / 1e9,
           "roofline_fraction": tokens_per_second * flops["total"] / peak, "outside_matmul_share": 1 - share}
    parts = ", ".join(f"{k} {v / flops['total']:.0%}" for k, v in flops.items() if k != "total")
    print(f"roofline {dtype}: {out['gflop_per_token']:.3f} GFLOP per generated token at a mean context of "
          f"{context:.0f} ({parts}); "
          f"matmul peak {out['peak_gflops']:.0f} GFLOP/s at the model's shapes and {batch} rows (the search's mean "
          f"decode batch), {args.threads} thread(s); achieved {out['achieved_gflops']:.0f} GFLOP/s = "
          f"{out['roofline_fraction']:.2f} of it; a flat call spends {out['outside_matmul_share']:.0%} of its time "
          "outside the matmuls (sampling over the vocabulary, the KV cache, Python)")
    return out


def report(args, rows: dict, roofline: dict, startup: float | None) -> None:

    servers = "no vLLM server" if startup is None else f"{args.replicas} vLLM server(s), start-up {startup:.0f} s (not counted)"
    print(f"{args.problems} {args.task} trees, width {args.width}, K {args.k}, at most {args.max_expansions} expansions; "
          f"policy {args.policy}; {servers}; {args.threads} torch thread(s)")
    print(f"{'backend':<8} {'seconds':>8} {'gen tok/s':>10} {'prompt tok':>11} {'computed':>9} {'hit rate':>9} "
          f"{'eff wall':>9} {'eff cpu':>8}")
    for name, (sec, tok_count, prompt, computed, rate, eff_wall, eff_cpu) in rows.items():
        print(f"{name:<8} {sec:8.2f} {tok_count / sec:10.0f} {prompt:11d} {int(computed):9d} {rate:9.3f} "
              f"{eff_wall:9.3f} {eff_cpu:8.3f}")
    hf_row = rows["hf"]
    line = (f"RESULT hf_seconds={hf_row[0]:.2f} hf_tok_per_s={hf_row[1] / hf_row[0]:.0f} hf_hit_rate={hf_row[4]:.3f} "
            f"batch_efficiency={hf_row[6]:.3f} batch_efficiency_wall={hf_row[5]:.3f}")
    for dtype, r in roofline.items():
        line += (f" {dtype}_tok_per_s={r['tok_per_s']:.0f} {dtype}_roofline_fraction={r['roofline_fraction']:.3f} "
                 f"{dtype}_peak_gflops={r['peak_gflops']:.0f} {dtype}_outside_matmul_share={r['outside_matmul_share']:.2f}")
    if {"float32", "bfloat16"} <= roofline.keys():
        line += f" bf16_speedup={roofline['bfloat16']['tok_per_s'] / roofline['float32']['tok_per_s']:.2f}"
    if "vllm" in rows:
        v_row = rows["vllm"]
        line += (f" vllm_seconds={v_row[0]:.2f} speedup={hf_row[0] / v_row[0]:.2f} vllm_tok_per_s={v_row[1] / v_row[0]:.0f} "
                 f"vllm_hit_rate={v_row[4]:.3f} vllm_batch_efficiency={v_row[5]:.3f} vllm_dtype={args.vllm_dtype}")
        for dtype, r in roofline.items():  # the sidecar's tokens/s over each in-process dtype's
            line += f" vllm_over_{dtype}={v_row[1] / v_row[0] / r['tok_per_s']:.2f}"
    print(line)


if __name__ == "__main__":
    main()
