"""Where a fit's wall time goes: a short real `flywheel fit`, split per epoch and in total.

    python tools/bench_flywheel.py                                  # the quickstart, one round (5 epochs)
    python tools/bench_flywheel.py --epochs 2 --config conf/quickstart.yaml --config conf/dapo.yaml
    python tools/bench_flywheel.py --config conf/quickstart_vllm.yaml   # the vLLM sidecar (FLYWHEEL_VLLM_PYTHON)
    python tools/bench_flywheel.py --epochs 1 --data.batching.problems_per_epoch=8   # any fit override
    python tools/bench_flywheel.py --overlap     # the sidecar without and with the search ahead

Runs `python -m flywheel fit` with the given configs (the quickstart by default) for `--epochs`
epochs into a temporary folder, with any further arguments as fit overrides, and prints the
run's wall split as summary.json records it (callbacks.wall_time: every run has it, in
TensorBoard under compute/wall/ too): search (the generator's own seconds, and the search's
bookkeeping), training, held-out evaluation, hard-set screening, weight sync, the value model,
checkpoints, data-loader rebuild and other (the wall time minus all of them, so the parts add
up to the wall). busy_fraction = (search generator + training) / wall. The wall time runs from
the fit's setup to its end; `process_s` is the whole command's, start-up included. The
machine's load average is printed before and after: the 2-core machines this is measured on
are often shared.

Last line: RESULT busy_fraction=... search_s=... train_s=... other_s=... (every part).

`--overlap`: the same fit twice through the vLLM sidecar (conf/quickstart_vllm.yaml on the
quickstart unless `--config` says otherwise), without and with `--data.async_search.max_staleness=1`
(both with `--model.old_logprobs=recompute_tis`, so only the overlap differs), the trainer
pinned to one core and the server to another (`--cores`, taskset: the server through a
wrapper of its interpreter, $FLYWHEEL_VLLM_PYTHON, passed as --data.generator.init_args.python).
Last line: RESULT overlap_speedup=(wall without / wall with) overlap_bound=(the most the overlap
can gain, from the arm without it: `overlap_bound`) of_bound=(the two's ratio) wall_without_s=...
wall_with_s=... search_wait_s=... (the epochs' ends waiting for the search ahead) overlapped_search_s=...

`--split-cores`: the same fit twice through the vLLM sidecar with the search ahead, nothing
pinned from outside: `--data.generator.init_args.cpu_cores=shared` (the server's and the trainer's
threads each ask for every core) and `auto` (the sidecar splits the cores: flywheel/generation/
vllm/cores.py). Last line: RESULT split_speedup=(wall shared / wall split) wall_shared_s=...
wall_split_s=... and each arm's search wait, training, search and searched-ahead seconds.

`--parity --seeds 3`: learning parity of the same two arms (not pinned: only the learning is
compared), `--seeds` runs each, every round evaluated on the held-out split: held-out pass@1
per round, each arm's mean and standard deviation over the seeds, and per round the gap of the
means against the seeds' noise (the standard error of that difference). Each run keeps its
folder under `--run-dir` (reused when it finished: a stopped comparison runs only what is left).
Last line: RESULT parity_max_gap=(largest |mean with - mean without| over rounds)
parity_max_gap_se=(that round's standard error of the difference) within_noise=(every round's
gap <= 2 standard errors) seeds=... rounds=...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from callbacks.wall_time import PARTS  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402

COLUMNS = [f"{p}_s" for p in PARTS] + ["other_s", "wall_s", "busy_fraction"]
HEADS = ["generator", "bookkeep", "train", "eval", "screen", "sync", "value", "ckpt", "rebuild", "other", "wall", "busy"]


def table(split: dict) -> str:
    """Per-epoch rows and the total of summary.json's `wall_split`, in seconds."""
    lines = [f"{'epoch':>6} " + " ".join(f"{h:>9}" for h in HEADS)]
    rows = [(str(r["epoch"]), r) for r in split["epochs"]] + [("total", split["total"])]
    for name, row in rows:
        lines.append(f"{name:>6} " + " ".join(f"{row.get(c, 0.0):9.3f}" if c != "busy_fraction"
                                              else f"{row.get(c, 0.0):9.2%}" for c in COLUMNS))
    return "\n".join(lines)


def run_fit(command: list[str], run_dir: Path) -> tuple[dict, float]:
    """Run the fit `command` (writing under `run_dir`): its summary.json's wall split, and the
    command's own seconds."""
    print("command:", shlex.join(command))
    print("load average before: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"the fit failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summaries = sorted(run_dir.glob("**/summary.json"))
    if not summaries:
        sys.exit(f"the fit wrote no summary.json under {run_dir}")
    split = json.loads(summaries[-1].read_text())["wall_split"]
    print("load average after:  %.2f %.2f %.2f" % os.getloadavg())
    print(f"wall split in seconds (busy = (generator + train) / wall); the command took {process_s:.1f} s")
    print(table(split))
    return split, process_s


def outputs(run_dir: Path) -> list[str]:
    """The fit's logs and checkpoints under `run_dir` (conf/quickstart_vllm.yaml names a
    checkpoint folder of its own under runs/, which a second run would refuse), no progress bar."""
    return [f"--trainer.logger.init_args.save_dir={run_dir}", f"--trainer.callbacks.init_args.dirpath={run_dir / 'checkpoints'}",
            "--trainer.enable_progress_bar=false"]


def sidecar_configs(args: argparse.Namespace) -> list[str]:
    """The fit's configs for the sidecar's arms: `--config`, else the quickstart through the sidecar."""
    return args.config or [str(ROOT / "conf" / "quickstart.yaml"), str(ROOT / "conf" / "quickstart_vllm.yaml")]


def vllm_python() -> str:
    """The interpreter with vLLM: $FLYWHEEL_VLLM_PYTHON, else this one."""
    return os.environ.get("FLYWHEEL_VLLM_PYTHON") or sys.executable


def pinned_python(folder: Path, core: str) -> Path:
    """An interpreter wrapper that runs $FLYWHEEL_VLLM_PYTHON (or this one) on `core`: the
    sidecar launches its server (and the server's watchdog) with it."""
    python = vllm_python()
    wrapper = folder / "pinned-python"
    wrapper.write_text(f"#!/bin/sh\nexec taskset -c {shlex.quote(core)} {shlex.quote(python)} \"$@\"\n")
    wrapper.chmod(0o700)
    return wrapper


def overlap(args: argparse.Namespace, overrides: list[str], folder: Path) -> None:
    """Both arms of `--overlap` (module docstring) and their RESULT line."""
    trainer_core, server_core = args.cores.split(",")
    configs = sidecar_configs(args)
    walls, splits = {}, {}
    for arm, staleness in (("without", 0), ("with", 1)):
        run_dir = folder / arm
        print(f"\n== {arm} the search ahead (--data.async_search.max_staleness={staleness})")
        command = ["taskset", "-c", trainer_core,
                   *sidecar_arm(configs, args.epochs, run_dir, staleness, str(pinned_python(folder, server_core)), overrides)]
        splits[arm], _ = run_fit(command, run_dir)
        walls[arm] = splits[arm]["total"]["wall_s"]
    total = splits["with"]["total"]
    bound = overlap_bound(splits["without"]["epochs"])
    speedup = walls["without"] / walls["with"]
    fields = {"overlap_speedup": round(speedup, 3), "overlap_bound": round(bound, 3),
              "of_bound": round(speedup / bound, 3), "wall_without_s": walls["without"],
              "wall_with_s": walls["with"], "search_wait_s": total.get("search_wait_s", 0.0),
              "overlapped_search_s": total.get("overlapped/search_ahead_s", 0.0),
              "checkpoint_write_s": total.get("overlapped/checkpoint_write_s", 0.0),
              "search_s_without": splits["without"]["total"]["search_s"], "train_s_without": splits["without"]["total"]["train_s"],
              "epochs": len(splits["with"]["epochs"])}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


GENERATOR_BOUND = ("weight_sync_s", "eval_s", "screening_s", "value_model_s")
"""The parts of an epoch's end that sample from (or change) the generator: no search runs beside them."""


def overlap_bound(epochs: list[dict]) -> float:
    """The most the search ahead can gain, from the per-epoch split of a run without it: epoch
    e+1's search (generator + bookkeeping) runs beside epoch e's training, checkpoint, loader
    rebuild and the rest, but not beside its weight push, evaluation, screening or value model,
    and epoch 0 searches in place, after its loader's rebuild started the generator (a server's
    launch). Wall without / the least wall with: search_0 + sum_e [G_e + max(rest_e, search_{e+1})],
    G_e the generator-bound parts (and epoch 0's rebuild), rest_e the others."""
    search = [e["search_generator_s"] + e["search_bookkeeping_s"] for e in epochs]
    bound = [sum(e.get(part, 0.0) for part in GENERATOR_BOUND) + (e.get("rebuild_s", 0.0) if i == 0 else 0.0)
             for i, e in enumerate(epochs)]
    rest = [e["wall_s"] - s - g for e, s, g in zip(epochs, search, bound)]
    least = search[0] + sum(g + max(r, nxt) for g, r, nxt in zip(bound, rest, [*search[1:], 0.0]))
    return sum(e["wall_s"] for e in epochs) / least


def split_cores(args: argparse.Namespace, overrides: list[str], folder: Path) -> None:
    """`--split-cores` (module docstring): the sidecar searching ahead with the cores shared and
    split by the sidecar itself, nothing pinned from outside, and their RESULT line."""
    configs = sidecar_configs(args)
    python = vllm_python()
    walls, splits = {}, {}
    for arm in ("shared", "auto"):
        run_dir = folder / arm
        print(f"\n== --data.generator.init_args.cpu_cores={arm}")
        command = [*sidecar_arm(configs, args.epochs, run_dir, 1, python, overrides),
                   f"--data.generator.init_args.cpu_cores={arm}"]
        splits[arm], _ = run_fit(command, run_dir)
        walls[arm] = splits[arm]["total"]["wall_s"]
    parts = ("search_wait_s", "train_s", "search_s")
    fields = {"split_speedup": round(walls["shared"] / walls["auto"], 3), "wall_shared_s": walls["shared"],
              "wall_split_s": walls["auto"],
              **{f"{k.removesuffix('_s')}_{arm}_s": splits[arm]["total"].get(k, 0.0) for arm in walls for k in parts},
              **{f"search_ahead_{arm}_s": splits[arm]["total"].get("overlapped/search_ahead_s", 0.0) for arm in walls},
              "epochs": len(splits["auto"]["epochs"])}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


def sidecar_arm(configs: list[str], epochs: int, run_dir: Path, staleness: int, python: str, overrides: list[str]) -> list[str]:
    """The fit command of one arm of `--overlap` / `--parity`: the sidecar recipe, `recompute_tis`
    in both arms so that only the search ahead differs."""
    return [sys.executable, "-m", "flywheel", "fit", *[a for c in configs for a in ("--config", c)],
            f"--trainer.max_epochs={epochs}", *outputs(run_dir), f"--data.generator.init_args.python={python}",
            "--model.old_logprobs=recompute_tis", f"--data.async_search.max_staleness={staleness}", *overrides]


def pass1_per_round(summary: dict) -> list[float]:
    """Held-out pass@1 before training and after every round, from a summary.json."""
    return [summary["base_eval_pass1"], *(r["eval_pass1"] for r in summary["rounds"] if r.get("eval_pass1") is not None)]


def parity(args: argparse.Namespace, overrides: list[str], folder: Path) -> None:
    """`--parity` (module docstring): both arms, `args.seeds` seeds each, and the RESULT line."""
    configs = sidecar_configs(args)
    python = vllm_python()
    curves: dict[str, list[list[float]]] = {"without": [], "with": []}
    for seed in range(args.seeds):
        for arm, staleness in (("without", 0), ("with", 1)):
            run_dir = folder / f"{arm}_seed{seed}"
            done = sorted(run_dir.glob("**/summary.json"))
            summary = json.loads(done[-1].read_text()) if done else None
            if summary is None or not summary["rounds"] or summary["rounds"][-1]["epoch"] + 1 < args.epochs:
                shutil.rmtree(run_dir, ignore_errors=True)  # a run stopped part-way is run again whole
                print(f"\n== seed {seed}, {arm} the search ahead", flush=True)
                command = sidecar_arm(configs, args.epochs, run_dir, staleness, python,
                                      [f"--seed_everything={seed}", f"--data.seed={seed}", *overrides])
                run_fit(command, run_dir)
                summary = json.loads(sorted(run_dir.glob("**/summary.json"))[-1].read_text())
            curves[arm].append(pass1_per_round(summary))
            print(f"seed {seed} {arm}: pass@1 per round " + " ".join(f"{v:.4f}" for v in curves[arm][-1]), flush=True)
    rounds = min(len(c) for arm in curves.values() for c in arm)
    print(f"\nheld-out pass@1 per round over {args.seeds} seeds: mean (sd); gap = with - without, +- its standard error")
    print(f"{'round':>5} {'without':>16} {'with':>16} {'gap':>16}")
    worst = (0.0, 0.0)
    within = True
    for r in range(rounds):
        a = [c[r] for c in curves["without"]]
        b = [c[r] for c in curves["with"]]
        sd_a = statistics.stdev(a) if len(a) > 1 else 0.0
        sd_b = statistics.stdev(b) if len(b) > 1 else 0.0
        gap = statistics.mean(b) - statistics.mean(a)
        se = math.sqrt(sd_a ** 2 / len(a) + sd_b ** 2 / len(b))
        print(f"{r:>5} {statistics.mean(a):>8.4f} ({sd_a:.4f}) {statistics.mean(b):>8.4f} ({sd_b:.4f}) {gap:>+8.4f} +- {se:.4f}")
        if r > 0:  # round 0 is the same base policy in both arms
            within &= abs(gap) <= 2 * se
            if abs(gap) >= abs(worst[0]):
                worst = (gap, se)
    print(f"RESULT parity_max_gap={abs(worst[0]):.4f} parity_max_gap_se={worst[1]:.4f} within_noise={within} "
          f"seeds={args.seeds} rounds={rounds - 1}")


def main() -> None:
    parser = StrictParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other arguments are passed to `flywheel fit` as overrides.")
    parser.add_argument("--config", action="append", help="config file(s) of the fit (default: conf/quickstart.yaml)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs to run (--trainer.max_epochs)")
    parser.add_argument("--run-dir", type=Path, help="where the run goes (default: a temporary folder, removed after)")
    parser.add_argument("--overlap", action="store_true", help="the sidecar without and with the search ahead, "
                        "trainer and server pinned to a core each; RESULT overlap_speedup=...")
    parser.add_argument("--cores", default="0,1", help="with --overlap: the trainer's core and the server's core")
    parser.add_argument("--split-cores", action="store_true", help="the sidecar searching ahead with the cores "
                        "shared and split by the sidecar (cpu_cores=shared / auto), nothing pinned from outside; "
                        "RESULT split_speedup=...")
    parser.add_argument("--parity", action="store_true", help="held-out pass@1 per round of the same two arms "
                        "(not pinned), --seeds seeds each; RESULT parity_max_gap=... within_noise=...")
    parser.add_argument("--seeds", type=int, default=3, help="with --parity: seeds per arm")
    args, overrides = parser.parse_known_args()
    if args.parity and args.seeds < 2:
        parser.error(f"--parity --seeds {args.seeds}: the seeds' noise needs at least 2 seeds per arm; give --seeds 2 or more")
    folder = args.run_dir or Path(tempfile.mkdtemp(prefix="bench_flywheel_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        if args.overlap:
            return overlap(args, overrides, folder)
        if args.parity:
            return parity(args, overrides, folder)
        if args.split_cores:
            return split_cores(args, overrides, folder)
        configs = args.config or [str(ROOT / "conf" / "quickstart.yaml")]
        command = [sys.executable, "-m", "flywheel", "fit", *[a for c in configs for a in ("--config", c)],
                   f"--trainer.max_epochs={args.epochs}", *outputs(folder), *overrides]
        split, process_s = run_fit(command, folder)
    finally:
        if args.run_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    total = split["total"]
    first = ["busy_fraction", "search_s", "train_s", "other_s"]
    fields = {**{k: total[k] for k in first}, **{k: v for k, v in total.items() if k not in first}}
    fields.update(epochs=len(split["epochs"]), process_s=round(process_s, 1))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
