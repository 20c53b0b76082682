"""Regenerate the shipped Countdown splits (flywheel/assets/countdown/*.jsonl), deterministically.

    python tools/make_countdown_splits.py            # rewrites the shipped files
    python tools/make_countdown_splits.py --out /tmp/splits --seed 1   # a variant elsewhere

Held out BY NUMBER MULTISET: every multiset of 3 (and of 4) numbers in [1, 13] is assigned
to train or to a test split before any problem is drawn, so no multiset appears in two
splits and memorised number sets cannot inflate held-out scores (tiny-countdown-rl.md,
"Memorisation"). Every problem is checked: the solver finds a route and its trace verifies.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from pathlib import Path

from flywheel.assets import asset_path
from flywheel.rewards.countdown import verify
from flywheel.tasks.countdown_data import GenerationConfig, format_completion, generate_problems, solve
from flywheel.run.flags import StrictParser

log = logging.getLogger("make_countdown_splits")

SEED = 20_250_925
LOW, HIGH = 1, 13
HELD_OUT_FRACTION = 0.15
"""Share of number multisets reserved for the test splits (68 of 455 triples, 273 of 1820 quads)."""
RANDOM_3 = GenerationConfig(count=3, low=LOW, high=HIGH, mode="random", target_min=1, target_max=99)
HARD_4 = GenerationConfig(count=4, low=LOW, high=HIGH, mode="hard", target_min=1, target_max=None)


def held_out_multisets(count: int, seed: int) -> frozenset[tuple[int, ...]]:
    """A seeded HELD_OUT_FRACTION of all sorted `count`-multisets of [LOW, HIGH]."""
    multisets = list(itertools.combinations_with_replacement(range(LOW, HIGH + 1), count))
    random.Random(seed).shuffle(multisets)
    return frozenset(multisets[: round(HELD_OUT_FRACTION * len(multisets))])


def build_splits(seed: int, sizes: dict[str, int]) -> dict[str, list[dict]]:
    """Rows of every split; the same seed and sizes give the same rows."""
    held_3 = held_out_multisets(3, seed)
    held_4 = held_out_multisets(4, seed + 1)

    def draw(key: str, offset: int, config: GenerationConfig, held_out: bool) -> list[tuple]:
        """(config, numbers, target) triples from the held-out multisets or from the others."""
        held = held_3 if config.count == 3 else held_4
        keep = held.__contains__ if held_out else (lambda multiset: multiset not in held)
        problems = generate_problems(sizes[key], seed=seed + offset, config=config, keep=keep)
        return [(config, numbers, target) for numbers, target in problems]

    parts = {
        "train": draw("train_3", 2, RANDOM_3, False) + draw("train_4", 3, HARD_4, False),
        "test": draw("test", 4, RANDOM_3, True),
        "test_hard": draw("test_hard", 5, HARD_4, True),
    }
    splits = {}
    for split, problems in parts.items():
        splits[split] = [
            {
                "id": f"countdown-{split}-{i:05d}",
                "numbers": list(numbers),
                "target": target,
                "mode": config.mode,
            }
            for i, (config, numbers, target) in enumerate(problems)
        ]
    return splits


def check_rows(rows: list[dict]) -> None:
    """Every problem must be solvable and its solver trace must pass the verifier."""
    for row in rows:
        steps = solve(row["numbers"], row["target"])
        if steps is None:
            raise AssertionError(f"{row['id']} has no solution: {row}")
        verdict = verify(row["numbers"], row["target"], format_completion(row["numbers"], steps))
        if not verdict.correct:
            raise AssertionError(f"{row['id']}: solver trace fails to verify ({verdict.reason})")


def main() -> None:
    parser = StrictParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=asset_path("countdown"), help="output folder")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--train-3", type=int, default=4000, help="3-number random-target train problems")
    parser.add_argument("--train-4", type=int, default=4000, help="4-number hard train problems")
    parser.add_argument("--test", type=int, default=600, help="3-number held-out problems")
    parser.add_argument("--test-hard", type=int, default=500, help="4-number hard held-out problems")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    sizes = {"train_3": args.train_3, "train_4": args.train_4, "test": args.test, "test_hard": args.test_hard}
    splits = build_splits(args.seed, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        check_rows(rows)
        path = args.out / f"{split}.jsonl"
        text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        path.write_text(text, encoding="utf-8")
        log.info("%s: %d problems, %d bytes", path, len(rows), len(text))


if __name__ == "__main__":
    main()
