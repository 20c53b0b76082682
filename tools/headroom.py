"""Headroom of a policy: the problems it fails under a small flat budget but solves under a large one.

A flat-RL plateau is either exploration-bound (problems the policy fails with the group it
trains on, n = 8, that it can still solve with many more samples: a better explorer could find
those solutions and train on them) or capacity-bound (no such problems: no explorer helps).
This tool measures which: on `--limit` problems of a split (a seeded sample, never the held-out
split a comparison reports on), `--screen` flat samples each (the screen: 0/8 = failed), then, for
the failed ones only, up to `--samples` flat samples each, drawn `--chunk` at a time and stopped
at the first correct one (the same outcome as drawing all of them, for fewer tokens). Sampling
is the recipe's flat sampling (temperature, top_p, step rule, max_depth), as fit draws DAPO's
groups.

    python tools/headroom.py --config conf/quickstart.yaml --config conf/dapo.yaml --numbers 4 \\
        --policy runs/plateau/dapo_seed0/checkpoints/last.ckpt --out runs/plateau/headroom_seed0.json

One JSON line with the counts, `--out` (optional) keeps every problem's id, its screen's
correct count and, for the failed ones, the samples it took to the first correct one (null:
none in `--samples`). Last line

    RESULT problems=... screen_solved=... failed=... headroom=... headroom_of_failed=... samples=... tokens=...

headroom = failed problems solved at least once in `--samples`; headroom_of_failed = headroom /
failed. Near zero: the policy's failures are beyond its own sampling, and trees built from its
own steps will not find what 256 samples do not.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from flywheel.run.flags import StrictParser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def draw(problems: list, limit: int | None, seed: int) -> list:
    """A seeded sample of `limit` problems in split order (all when limit is None or larger)."""
    if limit is None or limit >= len(problems):
        return list(problems)
    keep = sorted(random.Random(seed).sample(range(len(problems)), limit))
    return [problems[i] for i in keep]


def correct_counts(results) -> list[int]:
    return [sum(t.verdict.correct for t in r.trajectories) for r in results]


def first_solve(outcomes: list[list[bool]], budget: int) -> int | None:
    """Samples drawn until the first correct one (1-based) over a problem's chunks, None if none
    among the first `budget`.

    >>> first_solve([[False, False], [False, True]], 8), first_solve([[False] * 4], 8), first_solve([[False, True]], 1)
    (4, None, None)
    """
    flat = [c for chunk in outcomes for c in chunk][:budget]
    return flat.index(True) + 1 if True in flat else None


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", required=True, help="the recipe, then overlays (as for fit)")
    parser.add_argument("--policy", help="a policy name, HF folder or fit .ckpt (default: the config's)")
    parser.add_argument("--split", default="train", help="the problems' split (never the comparison's held-out one)")
    parser.add_argument("--pool", action="store_true", help="the problems fit trains on (`--data.problems.*`, "
                        "`--data.task.*` of the config) instead of --split / --numbers")
    parser.add_argument("--numbers", type=int, help="Countdown: only problems with this many numbers")
    parser.add_argument("--limit", type=int, default=512, help="problems, a seeded sample of the split (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the problem sample's and the samples' seed")
    parser.add_argument("--screen", type=int, default=8, help="flat samples per problem in the screen")
    parser.add_argument("--samples", type=int, default=256,
                        help="flat samples per failed problem, at most (0: the screen only, e.g. to record which "
                             "problems a policy fails, for tools/compare.py's newly solved count)")
    parser.add_argument("--chunk", type=int, default=32, help="samples drawn at a time for the failed problems")
    parser.add_argument("--out", type=Path, help="write every problem's record here (JSON)")
    args, overrides = parser.parse_known_args()
    if min(args.screen, args.chunk) < 1 or min(args.samples, args.limit) < 0:
        raise SystemExit("--screen and --chunk must be >= 1, --samples and --limit >= 0")

    import torch

    from data_modules.rollout import search_problems as make_search_problems
    from flywheel.search.flat import flat_rollouts
    from tools.bench_explore import load_problems
    from tools.policy_setup import load

    setup = load(args.config, overrides, args.policy)
    if args.pool:
        problems = list(setup.dm.train_pool().values())
    else:
        selection = argparse.Namespace(problems=None, split=args.split, numbers=args.numbers, limit=None, offset=0)
        problems = load_problems(setup.task, selection)
    problems = draw(problems, args.limit or None, args.seed)
    prompts = make_search_problems(setup.tokenizer, setup.task, problems)
    tokens = 0

    def sample(subset: list[int], n: int, salt: int) -> list[list[bool]]:
        nonlocal tokens
        config = replace(setup.config, seed=args.seed * 1_000_003 + salt)  # fresh samples for every chunk
        with torch.no_grad():
            results = flat_rollouts([prompts[i] for i in subset], setup.generator, n=n, step=setup.task.step,
                                    decode=setup.decode, config=config, eos_token_ids=setup.eos,
                                    max_concurrent_problems=max(1, setup.dm.batching.max_concurrent_trees // 4))
        tokens += sum(r.stats.generated_tokens for r in results)
        return [[t.verdict.correct for t in r.trajectories] for r in results]

    start = time.perf_counter()
    screen = [sum(o) for o in sample(list(range(len(problems))), args.screen, salt=0)]
    failed = [i for i, c in enumerate(screen) if c == 0]
    outcomes: dict[int, list[list[bool]]] = {i: [] for i in failed}
    open_ = list(failed)
    drawn, chunk = 0, 1
    while open_ and drawn < args.samples:
        n = min(args.chunk, args.samples - drawn)
        for i, o in zip(open_, sample(open_, n, salt=chunk)):
            outcomes[i].append(o)
        drawn, chunk = drawn + n, chunk + 1
        open_ = [i for i in open_ if not any(outcomes[i][-1])]
        print(f"{drawn} samples: {len(failed) - len(open_)} of {len(failed)} failed problems solved",
              file=sys.stderr, flush=True)
    solved_after = {i: first_solve(outcomes[i], args.samples) for i in failed}
    headroom = sum(v is not None for v in solved_after.values())
    summary = {
        "policy": args.policy or setup.module.hparams.get("policy"), "split": "pool" if args.pool else args.split,
        "numbers": args.numbers,
        "problems": len(problems), "screen": args.screen, "screen_solved": len(problems) - len(failed),
        "failed": len(failed), "samples": args.samples, "headroom": headroom,
        "headroom_of_failed": headroom / len(failed) if failed else 0.0,
        "tokens": tokens, "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(summary), flush=True)
    if args.out is not None:
        from flywheel.io import atomic_write_json

        records = [{"id": p.id, "screen_correct": screen[i], "first_solve": solved_after.get(i)}
                   for i, p in enumerate(problems)]
        atomic_write_json(args.out, {**summary, "records": records})
    print(f"RESULT problems={len(problems)} screen_solved={summary['screen_solved']} failed={len(failed)} "
          f"headroom={headroom} headroom_of_failed={summary['headroom_of_failed']:.4f} samples={args.samples} "
          f"tokens={tokens}")


if __name__ == "__main__":
    main()
