"""Regenerate the shipped Mastermind splits (flywheel/assets/mastermind/*.jsonl), deterministically.

    python tools/make_mastermind_splits.py                  # rewrites the shipped files
    python tools/make_mastermind_splits.py --out /tmp/mm --seed 1   # a variant elsewhere

The 1296 secrets of 4 digits 1-6 (MastermindTask's defaults) are shuffled once and dealt out:
test 200, val 200, train the other 896, so no secret is in two splits. Rows are
`{"id": "test-0000", "answer": "3512"}`, each read back by MastermindTask.problem_from_row.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from flywheel.assets import asset_path
from flywheel.rewards.mastermind import code_text
from flywheel.run.flags import StrictParser
from flywheel.tasks.mastermind import MastermindTask
from flywheel.tasks.mastermind_data import all_codes

log = logging.getLogger("make_mastermind_splits")

SEED = 20_261_210
HELD_OUT = {"test": 200, "val": 200}
"""Secrets of each held-out split; train takes the rest."""


def build_splits(seed: int) -> dict[str, list[dict]]:
    """Rows of every split ("train", "val", "test"); the same seed gives the same rows."""
    task = MastermindTask()
    codes = all_codes(task.code_length, task.digits)
    random.Random(seed).shuffle(codes)
    sizes = {**HELD_OUT, "train": len(codes) - sum(HELD_OUT.values())}
    out: dict[str, list[dict]] = {}
    start = 0
    for name, size in sizes.items():
        dealt = codes[start:start + size]
        rows = [{"id": f"{name}-{i:04d}", "answer": code_text(code)} for i, code in enumerate(dealt)]
        for row in rows:
            task.problem_from_row(row, f"{name} row {row['id']}")  # raises on a row the task would refuse
        out[name] = rows
        start += size
    return {name: out[name] for name in ("train", "val", "test")}


def main() -> None:
    parser = StrictParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=asset_path("mastermind"), help="output folder")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in build_splits(args.seed).items():
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        log.info("%s: %d secrets -> %s", name, len(rows), path)


if __name__ == "__main__":
    main()
