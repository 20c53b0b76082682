"""DeepSearch vs DAPO vs best-of-N on Countdown, from the same tiny policy, at EQUAL
generated-token budgets (the paper's efficiency claim, measured here).

Each method is a real `python -m flywheel fit` run: the quickstart recipe, with the flat
baselines as the shipped overlays (conf/dapo.yaml, conf/best_of_n.yaml), all trained and
evaluated on the same split, each stopped by `--budget.max_tokens` (tokens generated for
training; held-out evaluation and hard-set screening are not counted). Held-out Pass@1 is
read from each run's summary.json after every round.

    python tools/compare.py                          # the default comparison (CPU, ~1 h)
    python tools/compare.py --tokens 300000 --numbers 3 --eval-split test

The last line is `RESULT deepsearch_pass1=... dapo_pass1=... bon_pass1=... tokens=...`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS: dict[str, tuple[list[str], list[str]]] = {
    # name: (overlay configs, overrides) on top of conf/quickstart.yaml
    "deepsearch": ([], []),  # the quickstart's search: random terminal choice, outcome credit
    "deepsearch_paper": ([], ["--data.advantage=node", "--data.search.terminal_choice=mean_nll"]),  # paper defaults
    "dapo": (["conf/dapo.yaml"], []),
    "bon": (["conf/best_of_n.yaml"], []),
}


def run(method: str, overlays: list[str], overrides: list[str], args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "flywheel", "fit", "--config", "conf/quickstart.yaml"]
    for overlay in overlays:
        cmd += ["--config", overlay]
    cmd += overrides
    cmd += [
        f"--trainer.logger.init_args.save_dir={out}",
        f"--trainer.logger.init_args.name={method}",
        "--trainer.max_epochs=100000",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        f"--budget.max_tokens={args.tokens}",
        f"--data.epochs_per_round={args.epochs_per_round}",
        f"--data.eval_split={args.eval_split}",
        f"--data.task.init_args.numbers_count={args.numbers}",
        f"--seed_everything={args.seed}",
        *args.extra,
    ]
    start = time.perf_counter()
    log = out / f"{method}.log"
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"{method} failed (exit {proc.returncode}); see {log}")
    summary = json.loads(sorted((out / method).glob("version_*/summary.json"))[-1].read_text())
    summary["wall_seconds"] = time.perf_counter() - start
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_500_000, help="training generation budget per method")
    parser.add_argument("--numbers", type=int, default=4, help="Countdown numbers per problem (4 = the hard problems)")
    parser.add_argument("--eval-split", default="test_hard", help="held-out split (test_hard: 500 4-number hard problems)")
    parser.add_argument("--epochs-per-round", type=int, default=5, help="epochs between held-out evaluations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    # Any other --key=value is passed to every run, e.g. --data.hard_set.enabled=false.
    args, args.extra = parser.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)

    results = {}
    for method in args.methods:
        print(f"running {method} ...", flush=True)
        results[method] = run(method, *METHODS[method], args, args.out)

    print(f"\nheld-out Pass@1 ({args.eval_split}) against training tokens generated")
    print(f"{'method':<18} {'round':>5} {'tokens':>10} {'pass@1':>7} {'hard set':>8} {'cached':>6}")
    for method, summary in results.items():
        print(f"{method:<18} {'base':>5} {0:>10} {summary['base_eval_pass1']:7.4f}")
        for r in summary["rounds"]:
            print(f"{method:<18} {r['round']:>5} {r['generated_tokens']:>10} {r['eval_pass1']:7.4f} "
                  f"{r['hard_set_size'] if r['hard_set_size'] is not None else '-':>8} {r['cached'] or 0:>6}")
        print(f"{method:<18} wall {summary['wall_seconds']:.0f} s")
    final = {m: s["rounds"][-1] for m, s in results.items()}
    fields = " ".join(f"{m}_pass1={final[m]['eval_pass1']:.4f}" for m in results)
    tokens = " ".join(f"{m}_tokens={final[m]['generated_tokens']}" for m in results)
    base = next(iter(results.values()))["base_eval_pass1"]
    print(f"RESULT {fields} base_pass1={base:.4f} tokens={args.tokens} {tokens}")


if __name__ == "__main__":
    main()
