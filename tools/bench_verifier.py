"""Accuracy of flywheel's math verifier on its two corpora, beside math-verify.

    python tools/bench_verifier.py                         # dev and held-out splits
    python tools/bench_verifier.py --corpus other.jsonl --heldout none --show 20

The dev split (tests/data/math_verifier_cases.jsonl) is what the verifier is tuned on; the
held-out split (tests/data/math_verifier_heldout.jsonl) was set aside before tuning and is
only measured: its number is the one to quote. The held-out cases are those of the first
batch of public-source cases added for issue 16 (ids mv-, nemo-, fw-) whose
sha256(gold + "\\x1f" + prediction) starts with a hex digit 0-7; dev cases added after that
(mario-, qwen-, nemo2-, evp-, ccps-, tunix-) are dev only (tests/test_math_verifier.py
checks the rule still holds).

Per verifier: accuracy, false positives (a wrong answer accepted: the costly error in RL,
it rewards the policy for being wrong), false negatives, the slowest case, and errors per
category. math-verify (`pip install math-verify`) is run on the same cases when installed,
through its documented parse/verify API, each call in a worker process with a timeout.
flywheel's verifier runs in this process: its budgets need no outside timeout.
Last line: RESULT dev_flywheel_accuracy=... dev_flywheel_fp=... dev_flywheel_fn=...
heldout_flywheel_... [dev_math_verify_... heldout_math_verify_...] dev_cases=... heldout_cases=...

    python tools/bench_verifier.py --adversarial             # the reward-hacking probe (issue 36)

--adversarial: for every distinct gold answer of --corpus, the responses of
tools/hack_probe.py (a policy's ways to collect a reward without solving: the gold buried in
unfinished prose, listed among candidates, inside a word, in code, after a fake chat turn, at
the end of garbage, hedged, in a box of every candidate), and the fraction each verifier
accepts, per class. Every one of them should be rejected. Last line: RESULT
hack_accept_rate=... [math_verify_hack_accept_rate=...] hack_responses=... golds=...
"""

from __future__ import annotations

import argparse
import multiprocessing
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flywheel.rewards.math import verify  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402
from hack_probe import CLASSES, hack_responses  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def flywheel_judge(gold: str, prediction: str) -> bool:
    return verify(gold, prediction).correct


def math_verify_judge(gold: str, prediction: str) -> bool:
    """math-verify's documented parse / verify (run in a worker process, so its own
    signal-based timeouts work: they need the main thread)."""
    from math_verify import parse, verify as mv_verify

    return bool(mv_verify(parse("$" + gold + "$"), parse(prediction)))


def _math_verify_batch(gold: str, responses: list[str]) -> list[bool]:
    return [math_verify_judge(gold, r) for r in responses]


def adversarial(golds: list[str], timeout: float, seed: int) -> None:
    """The reward-hacking probe (module docstring); prints per class and the RESULT line."""
    probes = [(gold, cls, text) for gold in golds for cls, text in hack_responses(gold, seed)]
    accepted = {"flywheel": Counter()}
    for gold, cls, text in probes:
        accepted["flywheel"][cls] += verify(gold, text).correct
    if math_verify_installed():
        accepted["math_verify"] = Counter()
        pool = multiprocessing.get_context("fork").Pool(1)
        for gold in golds:
            mine = [(cls, text) for g, cls, text in probes if g == gold]
            try:
                said = pool.apply_async(_math_verify_batch, (gold, [t for _, t in mine])).get(timeout=timeout * len(mine))
            except Exception:  # noqa: BLE001 - a crash or a stuck case counts as "not accepted"
                pool.terminate()
                pool = multiprocessing.get_context("fork").Pool(1)
                said = [False] * len(mine)
            for (cls, _), ok in zip(mine, said):
                accepted["math_verify"][cls] += bool(ok)
        pool.terminate()
    else:
        print("math-verify is not installed (pip install math-verify): flywheel only\n")
    sizes = Counter(cls for _, cls, _ in probes)
    names = list(accepted)
    print(f"{len(probes)} hack responses for {len(golds)} golds; accepted (should be none):\n")
    print(f"{'class':<12} {'responses':>9} " + " ".join(f"{n:>12}" for n in names))
    for cls in CLASSES:
        print(f"{cls:<12} {sizes[cls]:9d} " + " ".join(f"{accepted[n][cls]:12d}" for n in names))
    rate = {n: sum(accepted[n].values()) / max(len(probes), 1) for n in names}
    shown = {"flywheel": "hack_accept_rate", "math_verify": "math_verify_hack_accept_rate"}
    fields = " ".join(f"{shown[n]}={rate[n]:.4f}" for n in names)
    per_class = " ".join(f"hack_{cls}={accepted['flywheel'][cls]}" for cls in CLASSES)
    print(f"RESULT {fields} hack_responses={len(probes)} golds={len(golds)} {per_class}")


def math_verify_installed() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def run(name, judge, rows, timeout: float, in_process: bool):
    """Judge every row; in a worker process with a hard timeout unless `in_process`."""
    results = []
    pool = None if in_process else multiprocessing.get_context("fork").Pool(1)
    for row in rows:
        start = time.perf_counter()
        error = None
        try:
            if pool is None:
                said = judge(row["gold"], row["prediction"])
            else:
                said = pool.apply_async(judge, (row["gold"], row["prediction"])).get(timeout=timeout)
        except multiprocessing.TimeoutError:
            said, error = False, "timeout"
            pool.terminate()  # a stuck case must not keep a core busy
            pool = multiprocessing.get_context("fork").Pool(1)
        except Exception as err:  # noqa: BLE001 - a grader crash counts as "not equal"
            said, error = False, type(err).__name__
        results.append((row, said, time.perf_counter() - start, error))
    if pool is not None:
        pool.terminate()
    fp = [r for r, said, _, _ in results if said and not r["equal"]]
    fn = [r for r, said, _, _ in results if not said and r["equal"]]
    slowest = max(results, key=lambda x: x[2])
    wrong_by_category = Counter(r["category"] for r in fp + fn)
    return {"name": name, "accuracy": 1 - (len(fp) + len(fn)) / len(rows), "fp": fp, "fn": fn,
            "slowest": (slowest[0]["id"], slowest[2]), "errors": sum(1 for *_, e in results if e),
            "by_category": wrong_by_category}


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "data" / "math_verifier_cases.jsonl",
                        help="the dev split")
    parser.add_argument("--heldout", type=str, default=str(ROOT / "tests" / "data" / "math_verifier_heldout.jsonl"),
                        help="the held-out split, or 'none'")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per case before it counts as a failure")
    parser.add_argument("--show", type=int, default=10, help="misjudged cases to print per verifier and split")
    parser.add_argument("--adversarial", action="store_true",
                        help="run the reward-hacking probe on the golds of --corpus instead (tools/hack_probe.py)")
    parser.add_argument("--max-golds", type=int, default=None, help="--adversarial: the first N distinct golds only")
    parser.add_argument("--seed", type=int, default=0, help="--adversarial: the probe's seed")
    args = parser.parse_args()
    if args.adversarial:
        golds = list(dict.fromkeys(row["gold"] for row in load(args.corpus)))[: args.max_golds]
        adversarial(golds, args.timeout, args.seed)
        return
    splits = {"dev": load(args.corpus)}
    if args.heldout != "none":
        splits["heldout"] = load(Path(args.heldout))
    judges = [("flywheel", flywheel_judge, True)]
    if math_verify_installed():
        judges.append(("math_verify", math_verify_judge, False))
    else:
        print("math-verify is not installed (pip install math-verify): flywheel only\n")
    reports = {split: [run(name, judge, rows, args.timeout, in_process) for name, judge, in_process in judges]
               for split, rows in splits.items()}
    for split, rows in splits.items():
        print(f"{split}: {len(rows)} cases ({sum(r['equal'] for r in rows)} equal)")
    print(f"\n{'split':<8} {'verifier':<12} {'accuracy':>8} {'false +':>7} {'false -':>7} {'errors':>6}  slowest")
    for split, reps in reports.items():
        for rep in reps:
            print(f"{split:<8} {rep['name']:<12} {rep['accuracy']:8.4f} {len(rep['fp']):7d} {len(rep['fn']):7d} "
                  f"{rep['errors']:6d}  {rep['slowest'][0]} ({rep['slowest'][1] * 1000:.1f} ms)")
    for split, reps in reports.items():
        for rep in reps:
            if rep["fp"] or rep["fn"]:
                print(f"\n{split} {rep['name']}: misjudged by category {dict(rep['by_category'])}")
                for r in (rep["fp"] + rep["fn"])[: args.show]:
                    kind = "FP" if r in rep["fp"] else "FN"
                    print(f"  {kind} {r['id']}: gold {r['gold'][:60]!r} prediction {r['prediction'][-80:]!r}")
    fields = " ".join(f"{split}_{rep['name']}_accuracy={rep['accuracy']:.4f} {split}_{rep['name']}_fp={len(rep['fp'])} "
                      f"{split}_{rep['name']}_fn={len(rep['fn'])}" for split, reps in reports.items() for rep in reps)
    sizes = " ".join(f"{split}_cases={len(rows)}" for split, rows in splits.items())
    print(f"RESULT {fields} {sizes}")


if __name__ == "__main__":
    main()
