"""Tree search vs flat baselines on Countdown, from the same tiny policy, at EQUAL generated-
token budgets, over several seeds (the paper's efficiency claim, measured here).

Each arm is a real `python -m flywheel fit` run: the quickstart recipe with the arm's
overlays and overrides, all trained and evaluated on the same split, each stopped by
`--budget.max_tokens` (tokens generated for training; held-out evaluation and hard-set
screening are not counted). After every round each run evaluates the held-out split with
16 samples per problem: pass@1 (= mean@16, the seed's Countdown write-up's number) and
pass@8, read from each run's summary.json.

    python tools/compare.py --seeds 3                      # every arm, 3 seeds (CPU, hours)
    python tools/compare.py --tokens 300000 --numbers 3 --eval-split test --arms rollout dapo

Arms: the quickstart's tree (deepsearch), the paper's defaults (deepsearch_paper), the
rollout tree (rollout: whole rollouts forked from the steps found, subtree credit, every
trajectory trained, solved trees stop early), its control that never forks below the root
(rollout_root: flat sampling under the same stopping rule and credit), the flat baselines DAPO (8 samples),
CISPO (16 samples) and best-of-N (8), and the ReST-MCTS* recipe (rest_mcts: the quickstart's
tree guided by the previous round's value model, the policy self-trained on the weighted
correct paths with a KL to the round's start; its summary also holds the value model's
held-out AUC per round, printed beside pass@k), and the seed's Countdown MCTS recipe (countdown_mcts:
agents sharing one pUCT tree, a value head, one greedy trajectory per tree, CISPO, KL). The last line is
`RESULT <arm>_pass1=mean <arm>_pass1_sd=... <arm>_pass8=... base_pass1=... base_pass8=... tokens=...`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = [
    "--data.search.expansion=rollout", "--data.search.trajectories_per_tree=32", "--data.search.stop_when_solved=8",
    "--data.credit.advantage=subtree",
    # A rollout tree trains ~20 trajectories per problem: mini-batches of 4 problems keep the
    # rows per optimizer step, and the steps per generated token, near DAPO's (16 x 8 samples).
    "--data.batching.mini_batch_problems=4",
]
ARMS: dict[str, tuple[list[str], list[str]]] = {
    # name: (overlay configs, overrides) on top of conf/quickstart.yaml
    "deepsearch": ([], []),  # the quickstart's search: random terminal choice, outcome credit
    "deepsearch_paper": ([], ["--data.credit.advantage=node", "--data.search.terminal_choice=mean_nll"]),  # paper defaults
    "rollout": ([], ROLLOUT),
    "rollout_root": ([], ROLLOUT + ["--data.search.fork_rule=root"]),  # the same, never forking below the root
    "rollout_outcome": ([], ROLLOUT + ["--data.credit.advantage=outcome"]),  # the same trees, DAPO's credit
    "dapo": (["conf/dapo.yaml"], []),
    "cispo": (["conf/cispo.yaml"], []),
    "bon": (["conf/best_of_n.yaml"], []),
    # ReST-MCTS*: value-guided search, the value model refitted every round, self-training
    "rest_mcts": (["conf/rest_mcts.yaml"], []),
    "countdown_mcts": (["conf/countdown_mcts.yaml"], []),  # the seed's Countdown MCTS recipe
}
EVAL_SAMPLES, EVAL_K = 16, 8


def run(arm: str, seed: int, args: argparse.Namespace) -> dict:
    overlays, overrides = ARMS[arm]
    name = f"{arm}_seed{seed}"
    cmd = [sys.executable, "-m", "flywheel", "fit", "--config", "conf/quickstart.yaml"]
    for overlay in overlays:
        cmd += ["--config", overlay]
    cmd += overrides
    cmd += [
        f"--trainer.logger.init_args.save_dir={args.out}",
        f"--trainer.logger.init_args.name={name}",
        "--trainer.max_epochs=100000",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        f"--budget.max_tokens={args.tokens}",
        f"--data.epochs_per_round={args.epochs_per_round}",
        f"--data.problems.eval_split={args.eval_split}",
        f"--data.eval.samples={EVAL_SAMPLES}",
        f"--data.eval.k={EVAL_K}",
        f"--data.task.init_args.numbers_count={args.numbers}",
        f"--seed_everything={seed}",
        f"--data.seed={seed}",
        *args.extra,
    ]
    start = time.perf_counter()
    log = args.out / f"{name}.log"
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"{name} failed (exit {proc.returncode}); see {log}")
    summary = json.loads(sorted((args.out / name).glob("version_*/summary.json"))[-1].read_text())
    summary["wall_seconds"] = time.perf_counter() - start
    return summary


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=3_000_000, help="training generation budget per run")
    parser.add_argument("--numbers", type=int, default=4, help="Countdown numbers per problem (4 = the hard problems)")
    parser.add_argument("--eval-split", default="test_hard", help="held-out split (test_hard: 500 4-number hard problems)")
    parser.add_argument("--epochs-per-round", type=int, default=5, help="epochs between held-out evaluations")
    parser.add_argument("--seeds", type=int, default=1, help="runs per arm, seeds 0 .. seeds-1")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--arms", "--methods", nargs="+", default=list(ARMS), choices=list(ARMS))
    # Any other --key=value is passed to every run, e.g. --data.hard_set.enabled=false.
    args, args.extra = parser.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[dict]] = {}
    for seed in range(args.seeds):  # seed-major: a stopped comparison still has every arm
        for arm in args.arms:
            print(f"running {arm} seed {seed} ...", flush=True)
            results.setdefault(arm, []).append(run(arm, seed, args))

    print(f"\nheld-out {args.eval_split}: pass@1 (= mean@{EVAL_SAMPLES}) and pass@{EVAL_K} against training tokens")
    print(f"{'arm':<18} {'seed':>4} {'round':>5} {'tokens':>10} {'pass@1':>7} {f'pass@{EVAL_K}':>7} {'wall s':>7}")
    for arm, runs in results.items():
        for seed, summary in enumerate(runs):
            print(f"{arm:<18} {seed:>4} {'base':>5} {0:>10} {summary['base_eval_pass1']:7.4f} {summary['base_eval_passk']:7.4f}")
            for r in summary["rounds"]:
                auc = f" prm_auc {r['prm_auc']:.4f}" if r.get("prm_auc") is not None else ""
                print(f"{arm:<18} {seed:>4} {r['round']:>5} {r['generated_tokens']:>10} {r['eval_pass1']:7.4f} "
                      f"{r['eval_passk']:7.4f}{auc}")
            print(f"{arm:<18} {seed:>4} {'wall':>5} {summary['wall_seconds']:>37.0f}")
    fields = []
    print(f"\nlast round, mean +- sd over {args.seeds} seed(s)")
    for arm, runs in results.items():
        p1 = [s["rounds"][-1]["eval_pass1"] for s in runs]
        pk = [s["rounds"][-1]["eval_passk"] for s in runs]
        print(f"{arm:<18} pass@1 {statistics.mean(p1):.4f} +- {spread(p1):.4f}   pass@{EVAL_K} "
              f"{statistics.mean(pk):.4f} +- {spread(pk):.4f}")
        fields += [f"{arm}_pass1={statistics.mean(p1):.4f}", f"{arm}_pass1_sd={spread(p1):.4f}",
                   f"{arm}_pass{EVAL_K}={statistics.mean(pk):.4f}"]
    first = next(iter(results.values()))
    base1 = statistics.mean(s["base_eval_pass1"] for s in first)
    basek = statistics.mean(s["base_eval_passk"] for s in first)
    print(f"RESULT {' '.join(fields)} base_pass1={base1:.4f} base_pass{EVAL_K}={basek:.4f} tokens={args.tokens} "
          f"seeds={args.seeds}")


if __name__ == "__main__":
    main()
