"""Choose an SFT length on held-out problems: one `flywheel sft` run per step count, each
measured on the same val problems, resumable (a finished run is read back, an interrupted one
resumed), and a table of held-out loss, pass@1 and pass@k per length.

    python tools/sft_sweep.py --out results/smollm2_sft --steps 10,20,40,80 -- \\
        --policy smollm2-135m-instruct --task flywheel.tasks.chain.ChainTask \\
        --task.init_args.chat_template=true --task.init_args.lengths=[2,3,4] --max_rows 400 \\
        --train.batch_size 16 --train.warmup_steps 2 --train.lr 1e-4 --eval_max_problems 100 --eval_samples 8

Everything after `--` goes to every run unchanged (`--train.steps` and `--out` are the sweep's).
The warmup must stay below the shortest length. Last line: `RESULT` with each length's pass@1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flywheel.run.flags import StrictParser  # noqa: E402
from flywheel.sft.train import CHECKPOINT  # noqa: E402


def run_one(out: Path, steps: int, passed: list[str]) -> dict:
    """sft.json of the run of `steps` steps in `out`, running (or resuming) it when not finished."""
    record = out / "sft.json"
    if record.exists():
        return json.loads(record.read_text())
    command = [sys.executable, "-m", "flywheel", "sft", *passed, "--train.steps", str(steps), "--out", str(out)]
    if (out / CHECKPOINT).exists():
        command.append("--resume=true")
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
    return json.loads(record.read_text())


def main(argv: list[str]) -> None:
    passed = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = StrictParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder per length goes below it: steps_N")
    parser.add_argument("--steps", required=True, help="the SFT lengths, comma-separated, e.g. 10,20,40")
    args = parser.parse_args(own)
    lengths = [int(s) for s in args.steps.split(",") if s]
    rows = {}
    for steps in lengths:
        record = run_one(args.out / f"steps_{steps}", steps, passed)
        (source, scores), = record["eval"].items()
        k = max(int(m.split("@")[1]) for m in scores if m.startswith("pass@"))
        rows[steps] = {"heldout_loss": record.get("heldout_loss"), "pass@1": scores["pass@1"], f"pass@{k}": scores[f"pass@{k}"],
                       "problems": scores["problems"], "sft_seconds": record["sft_seconds"],
                       "tokens_per_second": record["tokens_per_second"], "source": source}
        print(f"steps {steps:>5}: held-out loss {rows[steps]['heldout_loss']:.4f}  pass@1 {scores['pass@1']:.4f}  "
              f"pass@{k} {scores[f'pass@{k}']:.4f}  ({scores['problems']} {source} problems; SFT {record['sft_seconds']:.0f} s, "
              f"{record['tokens_per_second']:.0f} trained tok/s)", flush=True)
    (args.out / "sweep.json").write_text(json.dumps({"lengths": rows, "passed": passed}, indent=2) + "\n")
    print("RESULT " + " ".join(f"pass1_steps{s}={r['pass@1']:.4f}" for s, r in rows.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
