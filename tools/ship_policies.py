"""Ship the final policies of a tools/compare.py comparison as small model folders, each with the
command that trained it and the command that evaluates it, so any row of a results table can be
checked without retraining.

    python tools/ship_policies.py runs/plateau results/plateau --checkpoints --verify

For every finished run `<arm>_seed<s>` under the comparison folder (one with compare.py's
done.json), the destination gets `<arm>_seed<s>/`:
- `policy/`: the run's last policy (tools/export_hf.py, bf16 safetensors by default, about 1 MB
  for the tiny policy), usable as `--model.policy`, `flywheel eval --policy` or `--init`-style
  starts;
- `done.json`, `init.json` and the newest `version_<n>/` with its `summary.json` (every round's
  held-out pass@1 / pass@k, tokens, steps) and `solved_problems.json`: enough for
  `python tools/compare.py --report --out <dest> ...` (and tools/plateau.py) to print the
  comparison's tables from the shipped folder, with P's screens (`init_screen_seed<s>.json`);
- `run.json`: the compare.py command that makes the run, the exact `flywheel fit` command it ran,
  the run's last held-out evaluation and the `flywheel eval` command that reproduces it;
- with `--checkpoints`, `last.ckpt`: the full checkpoint (weights, AdamW moments, data state), for
  `tools/compare.py --init` continuations.

`--verify` evaluates every shipped policy exactly as the comparison did (the same split, samples,
k and sampling seed) and records the result in run.json beside the run's own; the last line is

    RESULT runs=... max_abs_diff_pass1=... max_abs_diff_passk=...

(bf16 rounding moves single samples; the differences should sit well inside the seeds' spread).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path
from flywheel.run.flags import StrictParser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def option(command: list[str], key: str, default: str | None = None) -> str | None:
    """The value of `--key=value` in a recorded command line (the last one wins, as in fit).

    >>> option(["fit", "--data.eval.k=8", "--seed_everything=2", "--data.eval.k=4"], "--data.eval.k")
    '4'
    """
    values = [a.split("=", 1)[1] for a in command if a.startswith(key + "=")]
    return values[-1] if values else default


EVAL_OPTIONS = {  # flywheel eval's argument: (the fit option it mirrors, compare.py's value when not given)
    "split": ("--data.problems.eval_split", "test_hard"), "samples": ("--data.eval.samples", "16"),
    "k": ("--data.eval.k", "8"), "max_problems": ("--data.problems.max_eval_problems", None),
    "temperature": ("--data.eval.temperature", None), "top_p": ("--data.eval.top_p", None),
    "seed": ("--data.eval.seed", None),
}


def eval_spec(command: list[str]) -> dict:
    """The held-out evaluation a recorded fit command ran, as `flywheel eval` arguments (None:
    eval's default, which is fit's)."""
    spec = {name: option(command, key, default) for name, (key, default) in EVAL_OPTIONS.items()}
    for name in ("samples", "k", "max_problems", "seed"):
        spec[name] = None if spec[name] is None else int(spec[name])
    for name in ("temperature", "top_p"):
        spec[name] = None if spec[name] is None else float(spec[name])
    return spec


def compare_command(name: str, done: dict, out: Path, init: str | None) -> str:
    """The tools/compare.py command that makes (or resumes, or reuses) the run `name`: its task
    (from the fit's base config) and the overrides compare.py passed to every run."""
    from tools.compare import EVAL_EVERY_TOKENS, TASKS

    arm, seed = name.rsplit("_seed", 1)
    command = done["command"]
    base = command[command.index("--config") + 1]
    task = next((name for name, (config, _, _) in TASKS.items() if config == base), "countdown")
    every = option(command, "--data.eval.every_tokens")  # compare.py's --eval-every-tokens, where not its default
    cmd = ["python", "tools/compare.py", *(["--task", task] if task != "countdown" else []), "--arms", arm,
           "--seed-list", seed, "--tokens", str(done["tokens"]),
           *(["--eval-every-tokens", every] if every not in (None, str(EVAL_EVERY_TOKENS)) else []),
           "--out", str(out), *passed_overrides(command)]
    if init is not None:
        cmd += ["--init", init]
    return shlex.join(cmd)


def passed_overrides(command: list[str]) -> list[str]:
    """The overrides compare.py passed to every run (its unknown flags): in the fit command they
    follow `--data.seed=...`, before --init's overrides and `--ckpt_path`.

    >>> passed_overrides(["-m", "flywheel", "fit", "--data.seed=0", "--model.optimizer.lr=3e-5", "--ckpt_path", "last"])
    ['--model.optimizer.lr=3e-5']
    """
    start = next((i + 1 for i, a in enumerate(command) if a.startswith("--data.seed=")), len(command))
    out = []
    for arg in command[start:]:
        if arg == "--ckpt_path" or arg.startswith("--trainer.callbacks+=callbacks.optimizer_from") or (
                arg.startswith("--model.policy=") and arg.endswith("init_policy")):
            break
        out.append(arg)
    return out


def eval_task(command: list[str]) -> list[str]:
    """`flywheel eval`'s --task arguments for the task the fit ran (its base config's
    data.task and the command's --data.task.init_args overrides); none for eval's default, Countdown
    with its own defaults."""
    import yaml

    config = yaml.safe_load((ROOT / command[command.index("--config") + 1]).read_text())
    task = (config.get("data") or {}).get("task") or {}
    class_path = task.get("class_path", "flywheel.tasks.countdown.CountdownTask")
    args = [f"--task.init_args.{k}={json.dumps(v)}" for k, v in (task.get("init_args") or {}).items()]
    args += [a.replace("--data.task.init_args.", "--task.init_args.", 1) for a in command
             if a.startswith("--data.task.init_args.")]
    if class_path == "flywheel.tasks.countdown.CountdownTask" and not args:
        return []
    return ["--task", class_path, *args]


def in_repo(path: Path) -> Path:
    """`path` relative to the repository when it lies inside it (commands that work from any
    clone), else as it is.

    >>> in_repo(ROOT / "results" / "x"), in_repo(Path("/elsewhere/x"))
    (PosixPath('results/x'), PosixPath('/elsewhere/x'))
    """
    try:
        return path.resolve().relative_to(ROOT)
    except ValueError:
        return path


def ship(run: Path, dest: Path, out_label: Path, dtype: str, checkpoints: bool) -> dict:
    from tools.compare import latest_summary, last_round
    from tools.compare_report import newest_part
    from tools.export_hf import export

    done = json.loads((run / "done.json").read_text())
    command = done["command"]
    checkpoint = run / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        raise SystemExit(f"{run.name}: no checkpoints/last.ckpt to ship")
    dest.mkdir(parents=True, exist_ok=True)
    export(checkpoint, dest / "policy", dtype=dtype)
    summary = latest_summary(run)
    for name in ("done.json", "init.json"):  # what tools/compare.py --report reads back
        if (run / name).is_file():
            shutil.copyfile(run / name, dest / name)
    newest = newest_part(run, "summary.json").parent
    (dest / newest.name).mkdir(exist_ok=True)
    for name in ("summary.json", "solved_problems.json"):
        if (newest / name).is_file():
            shutil.copyfile(newest / name, dest / newest.name / name)
    if checkpoints:
        shutil.copyfile(checkpoint, dest / "last.ckpt")
    init = json.loads((run / "init.json").read_text())["checkpoint"] if (run / "init.json").is_file() else None
    end = last_round(summary)
    spec = eval_spec(command)
    record = {
        "run": run.name,
        "compare_command": compare_command(run.name, done, out_label, init),
        "fit_command": shlex.join(["python", *command]),
        "tokens": done["tokens"],
        "policy_dtype": dtype,
        "last_eval": None if end is None else {"round": end["round"], "generated_tokens": end["generated_tokens"],
                                               "pass1": end["eval_pass1"], "passk": end["eval_passk"]},
        "eval": spec,
        "eval_command": shlex.join(["python", "-m", "flywheel", "eval", "--policy", str(in_repo(dest / "policy")),
                                    *eval_task(command),
                                    *[a for key, value in spec.items() if key != "k" and value is not None
                                      for a in (f"--{key}", str(value))], "--k", f"[1,{spec['k']}]"]),
    }
    (dest / "run.json").write_text(json.dumps(record, indent=1))
    return record


def verify(dest: Path, record: dict) -> dict:
    """Evaluate the shipped policy by its recorded `flywheel eval` command (the comparison's task,
    split, samples, k and sampling seed); the numbers, kept in run.json."""
    from flywheel.__main__ import main as flywheel_main

    spec = record["eval"]
    argv = shlex.split(record["eval_command"])[3:]  # after "python -m flywheel"
    argv[argv.index("--policy") + 1] = str(dest / "policy")  # wherever dest is, the command names it from the repo
    report = flywheel_main([*argv, "--out", str(dest / "eval")])
    result = report["results"][spec["split"]]
    record["shipped_eval"] = {"pass1": result["pass@1"], "passk": result[f"pass@{spec['k']}"]}
    (dest / "run.json").write_text(json.dumps(record, indent=1))
    shutil.rmtree(dest / "eval", ignore_errors=True)  # TensorBoard events of the check: not shipped
    return record


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="a tools/compare.py --out folder")
    parser.add_argument("dest", type=Path, help="where the shipped folders go (e.g. results/plateau)")
    parser.add_argument("--runs-as", type=Path, default=None, metavar="FOLDER",
                        help="the comparison folder as the recorded compare.py command names it (default: RUNS)")
    parser.add_argument("--only", nargs="+", default=None, metavar="RUN", help="ship these runs only (e.g. dapo_seed0)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--checkpoints", action="store_true", help="also ship each run's last.ckpt (for --init)")
    parser.add_argument("--verify", action="store_true", help="evaluate every shipped policy as the comparison did")
    args = parser.parse_args()
    runs = sorted(p.parent for p in args.runs.glob("*/done.json") if args.only is None or p.parent.name in args.only)
    if not runs:
        raise SystemExit(f"no finished runs (a done.json) under {args.runs}")
    args.dest.mkdir(parents=True, exist_ok=True)
    for screen in args.runs.glob("init_screen_seed*.json"):  # P's screens: the newly solved counts
        shutil.copyfile(screen, args.dest / screen.name)
    diffs = []
    for run in runs:
        record = ship(run, args.dest / run.name, args.runs_as or args.runs, args.dtype, args.checkpoints)
        print(f"{run.name}: shipped to {args.dest / run.name}", flush=True)
        if args.verify and record["last_eval"] is not None:
            record = verify(args.dest / run.name, record)
            own, shipped = record["last_eval"], record["shipped_eval"]
            diffs.append((abs(own["pass1"] - shipped["pass1"]), abs(own["passk"] - shipped["passk"])))
            print(f"  pass@1 {own['pass1']:.4f} in the run, {shipped['pass1']:.4f} shipped; pass@k {own['passk']:.4f}, "
                  f"{shipped['passk']:.4f}", flush=True)
    if diffs:
        print(f"RESULT runs={len(runs)} max_abs_diff_pass1={max(d[0] for d in diffs):.4f} "
              f"max_abs_diff_passk={max(d[1] for d in diffs):.4f}")
    else:
        print(f"RESULT runs={len(runs)}")


if __name__ == "__main__":
    main()
