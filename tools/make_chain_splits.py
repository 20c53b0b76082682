"""Regenerate the shipped chain-arithmetic splits (flywheel/assets/chain/*.jsonl), deterministically.

    python tools/make_chain_splits.py                  # rewrites the shipped files
    python tools/make_chain_splits.py --out /tmp/chain --seed 1   # a variant elsewhere

Splits (flywheel.tasks.chain_data.make_chain: values in 0..99, + and - by 2..49, * by 2..9):
train (8000 chains of 2-8 operations, equally many of each length), val and test (500 each,
the same lengths; val is for choosing settings, test is read once per chosen recipe),
test_hard (500 chains of 9-12 operations) and short (500 of 1-2 operations, the size a small
pretrained model sometimes solves: its fork_gain diagnostic). No chain (start and operations) appears in two
splits or twice in one. Every row is checked: its answer is the chain's value and the
solver trace verifies.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from flywheel.assets import asset_path
from flywheel.rewards.chain import verify
from flywheel.tasks.chain_data import chain_values, format_completion, make_chain
from flywheel.run.flags import StrictParser

log = logging.getLogger("make_chain_splits")

SEED = 20_261_204
RANGES = {"start_range": (2, 99), "add_max": 49, "mul_max": 9, "value_max": 99}
"""make_chain's ranges (its defaults): two-digit values, so that a character-level policy can learn
the lines' arithmetic and still slip on some (with three-digit values and + and - by up to 99,
after 600 SFT steps nearly every line of the tiny policy was wrong)."""
SPLITS = {
    # name: (rows, operation counts)
    "train": (8000, range(2, 9)),
    "val": (500, range(2, 9)),
    "test": (500, range(2, 9)),
    "test_hard": (500, range(9, 13)),
    "short": (500, range(1, 3)),
}


def build_splits(seed: int) -> dict[str, list[dict]]:
    """Rows of every split; the same seed gives the same rows. Held-out splits are drawn first,
    so their chains are never in train."""
    rng = random.Random(seed)
    seen: set[tuple] = set()
    out: dict[str, list[dict]] = {}
    for name in ("test", "test_hard", "val", "train", "short"):  # short last: the others as before it existed
        count, lengths = SPLITS[name]
        lengths = list(lengths)
        rows: list[dict] = []
        while len(rows) < count:
            length = lengths[len(rows) % len(lengths)]  # equally many of each length
            start, ops = make_chain(rng, length, **RANGES)
            key = (start, tuple(ops))
            if key in seen:
                continue
            seen.add(key)
            answer = chain_values(start, ops)[-1]
            if not verify(answer, format_completion(start, ops)).correct:
                raise AssertionError(f"the solver trace of {key} fails the verifier")
            rows.append({"id": f"{name}-{len(rows):05d}", "start": start, "ops": [list(op) for op in ops],
                         "answer": answer})
        rng_order = random.Random(seed + len(name))
        rng_order.shuffle(rows)  # lengths interleaved at random, ids kept
        out[name] = rows
    return {name: out[name] for name in SPLITS}


def main() -> None:
    parser = StrictParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=asset_path("chain"), help="output folder")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in build_splits(args.seed).items():
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        log.info("%s: %d chains -> %s", name, len(rows), path)


if __name__ == "__main__":
    main()
