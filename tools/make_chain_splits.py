"""Regenerate the shipped chain-arithmetic splits (flywheel/assets/chain/*.jsonl), deterministically.

    python tools/make_chain_splits.py                  # rewrites the shipped files
    python tools/make_chain_splits.py --out /tmp/chain --seed 1   # a variant elsewhere

Splits (flywheel.tasks.chain_data.make_chain: values in 0..999, + and - by 2..99, * by 2..9):
train (8000 chains of 2-8 operations, equally many of each length), val and test (500 each,
the same lengths; val is for choosing settings, test is read once per chosen recipe) and
test_hard (500 chains of 9-12 operations). No chain (start and operations) appears in two
splits or twice in one. Every row is checked: its answer is the chain's value and the
solver trace verifies.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from pathlib import Path

from flywheel.assets import asset_path
from flywheel.rewards.chain import verify
from flywheel.tasks.chain_data import chain_values, format_completion, make_chain

log = logging.getLogger("make_chain_splits")

SEED = 20_261_204
SPLITS = {
    # name: (rows, operation counts)
    "train": (8000, range(2, 9)),
    "val": (500, range(2, 9)),
    "test": (500, range(2, 9)),
    "test_hard": (500, range(9, 13)),
}


def build_splits(seed: int) -> dict[str, list[dict]]:
    """Rows of every split; the same seed gives the same rows. Held-out splits are drawn first,
    so their chains are never in train."""
    rng = random.Random(seed)
    seen: set[tuple] = set()
    out: dict[str, list[dict]] = {}
    for name in ("test", "test_hard", "val", "train"):
        count, lengths = SPLITS[name]
        lengths = list(lengths)
        rows: list[dict] = []
        while len(rows) < count:
            length = lengths[len(rows) % len(lengths)]  # equally many of each length
            start, ops = make_chain(rng, length)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
