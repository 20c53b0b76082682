"""Tree search vs flat baselines on Countdown, from the same tiny policy, at EQUAL generated-
token budgets, over several seeds (the paper's efficiency claim, measured here).

Each arm is a real `python -m flywheel fit` run: the quickstart recipe with the arm's
overlays and overrides, all trained and evaluated on the same split, each stopped by
`--budget.max_tokens` (tokens generated for training; held-out evaluation and hard-set
screening are not counted). At the end of a round once every `--eval-every-tokens`
training tokens (and always at the budget) each run evaluates the held-out split with
16 samples per problem: pass@1 (= mean@16, the seed's Countdown write-up's number) and
pass@8, read from each run's summary.json.

    python tools/compare.py --seeds 3                      # every arm, 3 seeds (CPU, hours)
    python tools/compare.py --tokens 300000 --numbers 3 --eval-split test --arms rollout dapo

Arms: the quickstart's tree (deepsearch), the paper's defaults (deepsearch_paper), the
rollout tree (rollout: whole rollouts forked from the steps found, subtree credit, every
trajectory trained, solved trees stop early; rollout_mb16: the same in mini-batches of 16 problems; rollout_bon: the same trees credited as
best-of-N, the correct trajectories only), its control that never forks below the root
(rollout_root: flat sampling under the same stopping rule and credit), the flat baselines DAPO (8 samples),
CISPO (16 samples) and best-of-N (8), and the ReST-MCTS* recipe (rest_mcts: the quickstart's
tree guided by the previous round's value model, the policy self-trained on the weighted
correct paths with a KL to the round's start; its summary also holds the value model's
held-out AUC per round, printed beside pass@k), and the seed's Countdown MCTS recipe (countdown_mcts:
agents sharing one pUCT tree, a value head, one greedy trajectory per tree, CISPO, KL). The last line is
`RESULT <arm>_pass1=mean <arm>_pass1_sd=... <arm>_pass8=... base_pass1=... base_pass8=... tokens=...`.

A comparison is resumable and can grow: every run keeps its last.ckpt under OUT/<arm>_seed<s>/,
so running the same command again skips the finished runs and resumes an interrupted one from
its last epoch, and a larger `--tokens` (or `--seeds`) continues the finished runs from where
they stopped (the same as one longer run: a run stopped by its budget inside a round evaluated
the policy it left as a partial round, which the resumed run's whole round replaces).
`--report` prints the tables of whatever has finished, running nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from flywheel.io import atomic_write_json  # noqa: E402

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
    # the same with mini-batches of 16 problems (DAPO's), so ~320 rows per optimizer step
    "rollout_mb16": ([], ROLLOUT + ["--data.batching.mini_batch_problems=16"]),
    # the same trees as rejection sampling: only their correct trajectories train, each token +1
    # (best-of-N's credit; added once bon and rollout_mb16 had finished at 3M, where bon won, and run unchanged)
    "rollout_bon": ([], ROLLOUT + ["--data.batching.mini_batch_problems=16", "--data.credit.advantage=best_of_n"]),
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


def run_folder(args: argparse.Namespace, arm: str, seed: int) -> Path:
    return args.out / f"{arm}_seed{seed}"


def finished(folder: Path) -> dict | None:
    """The record compare.py wrote when the run in `folder` ended (its budget and command)."""
    done = folder / "done.json"
    return json.loads(done.read_text()) if done.is_file() else None


def finished_at(folder: Path, tokens: int) -> dict | None:
    """The record of the run in `folder` when it has run to `tokens` or more, else None."""
    done = finished(folder)
    return done if done is not None and done["tokens"] >= tokens else None


def latest_summary(folder: Path) -> dict:
    """summary.json of the run's newest part (a resumed part carries every earlier round)."""
    parts = sorted(folder.glob("version_*/summary.json"), key=lambda p: int(p.parent.name.split("_")[1]))
    return json.loads(parts[-1].read_text())


def run(arm: str, seed: int, args: argparse.Namespace) -> dict:
    """One arm's run at `args.tokens`: reused when it already ran that far, resumed from its
    last.ckpt when it stopped earlier (interrupted, or finished on a smaller budget)."""
    overlays, overrides = ARMS[arm]
    folder = run_folder(args, arm, seed)
    done = finished_at(folder, args.tokens)
    if done is not None:
        print(f"  {folder.name}: finished earlier at {done['tokens']} tokens; reused", flush=True)
        return latest_summary(folder)
    cmd = [sys.executable, "-m", "flywheel", "fit", "--config", "conf/quickstart.yaml"]
    for overlay in overlays:
        cmd += ["--config", overlay]
    cmd += overrides
    cmd += [
        f"--trainer.logger.init_args.save_dir={args.out}",
        f"--trainer.logger.init_args.name={folder.name}",  # checkpoints: OUT/<name>/checkpoints
        "--trainer.max_epochs=100000",
        f"--budget.max_tokens={args.tokens}",
        f"--data.epochs_per_round={args.epochs_per_round}",
        f"--data.problems.eval_split={args.eval_split}",
        f"--data.eval.samples={EVAL_SAMPLES}",
        f"--data.eval.k={EVAL_K}",
        f"--data.eval.every_tokens={args.eval_every_tokens}",
        f"--data.task.init_args.numbers_count={args.numbers}",
        f"--seed_everything={seed}",
        f"--data.seed={seed}",
        *args.extra,
    ]
    if (folder / "checkpoints" / "last.ckpt").is_file():
        cmd += ["--ckpt_path", "last"]
        print(f"  {folder.name}: resuming from its last.ckpt", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    parts = len(list(folder.glob("*.log")))
    log = folder / f"fit-{parts}.log"
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"{folder.name} failed (exit {proc.returncode}); see {log}")
    atomic_write_json(folder / "done.json", {"tokens": args.tokens, "command": cmd[1:]})
    return latest_summary(folder)


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def evaluated(summary: dict) -> list[dict]:
    """The run's rounds that were evaluated (`--data.eval.every_tokens` skips some)."""
    return [r for r in summary.get("rounds", []) if r.get("eval_pass1") is not None]


def last_round(summary: dict) -> dict | None:
    rounds = evaluated(summary)
    return rounds[-1] if rounds else None


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    print(f"\nheld-out {args.eval_split}: pass@1 (= mean@{EVAL_SAMPLES}) and pass@{EVAL_K} against training tokens")
    print(f"{'arm':<18} {'seed':>4} {'round':>7} {'tokens':>10} {'pass@1':>7} {f'pass@{EVAL_K}':>7} {'wall s':>7}")
    for arm, runs in results.items():
        for seed, summary in runs:
            print(f"{arm:<18} {seed:>4} {'base':>7} {0:>10} {summary['base_eval_pass1']:7.4f} {summary['base_eval_passk']:7.4f}")
            for r in evaluated(summary):
                label = f"{r['round']}{'*' if r.get('partial') else ''}"
                auc = f" prm_auc {r['prm_auc']:.4f}" if r.get("prm_auc") is not None else ""
                print(f"{arm:<18} {seed:>4} {label:>7} {r['generated_tokens']:>10} {r['eval_pass1']:7.4f} "
                      f"{r['eval_passk']:7.4f} {r.get('wall_seconds', 0):7.0f}{auc}")
    print("(* a partial round: the budget ended the run inside it)")
    fields = []
    print("\nlast evaluation, mean +- sd over the seeds that have one")
    for arm, runs in results.items():
        ends = [last_round(s) for _, s in runs if last_round(s) is not None]
        if not ends:
            continue
        p1, pk = [r["eval_pass1"] for r in ends], [r["eval_passk"] for r in ends]
        tokens = statistics.mean(r["generated_tokens"] for r in ends)
        print(f"{arm:<18} pass@1 {statistics.mean(p1):.4f} +- {spread(p1):.4f}   pass@{EVAL_K} "
              f"{statistics.mean(pk):.4f} +- {spread(pk):.4f}   {len(ends)} seed(s), {tokens:,.0f} tokens")
        fields += [f"{arm}_pass1={statistics.mean(p1):.4f}", f"{arm}_pass1_sd={spread(p1):.4f}",
                   f"{arm}_pass{EVAL_K}={statistics.mean(pk):.4f}", f"{arm}_seeds={len(ends)}"]
    bases = [s for runs in results.values() for _, s in runs if s.get("base_eval_pass1") is not None]
    if not bases:
        print("RESULT none: no run has finished")
        return
    base1 = statistics.mean(s["base_eval_pass1"] for s in bases)
    basek = statistics.mean(s["base_eval_passk"] for s in bases)
    print(f"RESULT {' '.join(fields)} base_pass1={base1:.4f} base_pass{EVAL_K}={basek:.4f} tokens={args.tokens} "
          f"seeds={args.seeds}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=3_000_000, help="training generation budget per run")
    parser.add_argument("--numbers", type=int, default=4, help="Countdown numbers per problem (4 = the hard problems)")
    parser.add_argument("--eval-split", default="test_hard", help="held-out split (test_hard: 500 4-number hard problems)")
    parser.add_argument("--epochs-per-round", type=int, default=5, help="epochs per flywheel round")
    parser.add_argument("--eval-every-tokens", type=int, default=1_000_000,
                        help="held-out evaluations at round ends at least this many training tokens apart, and always "
                             "at the budget (a flat arm's round is ~0.14M tokens; 500 x 16 samples cost more than it)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per arm, seeds 0 .. seeds-1")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--arms", "--methods", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--report", action="store_true", help="print the tables of the runs found in --out; run nothing")
    # Any other --key=value is passed to every run, e.g. --data.hard_set.enabled=false.
    args, args.extra = parser.parse_known_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[tuple[int, dict]]] = {}
    failed = []
    for seed in range(args.seeds):  # seed-major: a stopped comparison still has every arm
        for arm in args.arms:
            folder = run_folder(args, arm, seed)
            if args.report:
                if finished_at(folder, args.tokens) is not None:
                    results.setdefault(arm, []).append((seed, latest_summary(folder)))
                elif list(folder.glob("version_*/summary.json")):
                    print(f"{folder.name}: not finished at {args.tokens} tokens; left out (run without --report to go on)")
                continue
            print(f"running {arm} seed {seed} ...", flush=True)
            try:
                results.setdefault(arm, []).append((seed, run(arm, seed, args)))
            except RuntimeError as err:  # the other arms still run; the failure is listed at the end
                print(f"  {err}", flush=True)
                failed.append(folder.name)
    report(results, args)
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)} (their logs are in their folders)")


if __name__ == "__main__":
    main()
