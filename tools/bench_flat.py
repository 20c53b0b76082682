"""Flat sampling's generated tokens per second, this tree against an earlier commit, side by side.

    python tools/bench_flat.py --before fb56549      # flat samples grown a step a call, before issue 60

Both arms run `flywheel.search.flat_rollouts` on the same Countdown train problems with the
shipped tiny-countdown policy, the in-process generator and the DAPO overlay's shapes (8 samples
a problem, 64 problems in flight, the quickstart's step and max depth), each arm in a process of
its own importing its tree's flywheel (`--before REV` is checked out into a temporary git
worktree). The arms alternate `--repeats` times, so drifts in machine load hit both; each
prints its generated tokens, generator calls and seconds, and the median tokens/s is compared.

Last line: RESULT flat_tokens_per_s_before=... flat_tokens_per_s_after=... speedup=... calls_before=... calls_after=...
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(root: str, problems: int, samples: int, threads: int) -> dict:
    """One arm: flat rollouts of `problems` train problems with `samples` each, in this process,
    from the flywheel checked out at `root`."""
    sys.path.insert(0, root)
    import time

    import torch

    from flywheel.generation.hf import HFGenerator
    from flywheel.policies.load import load_policy
    from flywheel.reporting.problem_view import decoder, search_problems
    from flywheel.search import SearchConfig
    from flywheel.search.flat import flat_rollouts
    from flywheel.search.lockstep import DriverStats
    from flywheel.tasks.countdown import CountdownTask

    torch.set_num_threads(threads)
    model, tokenizer = load_policy("tiny-countdown", "float32")
    task = CountdownTask()
    pool = task.problems("train")[:problems]
    eos = [tokenizer.eos_token_id]
    generator = HFGenerator(model, tokenizer, seed=0)
    config = SearchConfig(max_depth=8, seed=0)  # the quickstart's d_T, its sampling (T = 1)
    stats = DriverStats()
    start = time.perf_counter()
    with torch.no_grad():
        results = flat_rollouts(search_problems(tokenizer, task, pool), generator, n=samples, step=task.step,
                                decode=decoder(tokenizer), config=config, max_concurrent_problems=64,
                                eos_token_ids=eos, stats=stats)
    seconds = time.perf_counter() - start
    tokens = sum(r.stats.generated_tokens for r in results)
    correct = sum(t.verdict.correct for r in results for t in r.trajectories)
    return {"tokens": tokens, "seconds": seconds, "calls": stats.rounds, "requests": stats.requests,
            "correct": correct, "responses": sum(len(r.trajectories) for r in results)}


def run_arm(root: Path, args) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'tools')!r}); import bench_flat; "
            f"print(json.dumps(bench_flat.measure({str(root)!r}, {args.problems}, {args.samples}, {args.threads})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from flywheel.run.flags import StrictParser  # here, not at the top: an arm's process imports its own tree's flywheel

    parser = StrictParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare with (checked out in a worktree)")
    parser.add_argument("--problems", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flat-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before], check=True,
                       capture_output=True)
        try:
            arms: dict[str, list[dict]] = {"before": [], "after": []}
            for repeat in range(args.repeats):
                for name, root in (("before", before), ("after", ROOT)):
                    got = run_arm(root, args)
                    arms[name].append(got)
                    print(f"repeat {repeat} {name}: {got['tokens']} tokens in {got['seconds']:.1f} s "
                          f"({got['tokens'] / got['seconds']:.0f} tok/s), {got['calls']} generator calls, "
                          f"{got['requests']} requests, {got['correct']}/{got['responses']} correct", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
    rate = {name: statistics.median(a["tokens"] / a["seconds"] for a in runs) for name, runs in arms.items()}
    print(f"RESULT flat_tokens_per_s_before={rate['before']:.0f} flat_tokens_per_s_after={rate['after']:.0f} "
          f"speedup={rate['after'] / rate['before']:.2f} calls_before={arms['before'][0]['calls']} "
          f"calls_after={arms['after'][0]['calls']}")


if __name__ == "__main__":
    main()
