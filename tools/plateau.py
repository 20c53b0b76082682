"""Has a flat-RL run reached a plateau? Its held-out pass@1 over the last part of its tokens.

    python tools/plateau.py runs/plateau                 # every finished run of a compare.py folder
    python tools/plateau.py runs/plateau --window 0.3

A run has plateaued when its held-out pass@1 (mean@16 in tools/compare.py) rises by less than
one standard error over the last `--window` of its training tokens. The rise is read from a
least-squares line through the evaluations inside the window (and the last one before it, its
start; at least 3 evaluations), so that one noisy evaluation does not decide; the standard error is that of one
evaluation's sampling noise on its fixed problems, sqrt(p (1 - p) / (problems x samples)), an
upper bound of sqrt(sum_i p_i (1 - p_i) / samples) / problems (equal when every problem has the
same rate). Per run one line; the last line

    RESULT runs=... plateaued=... rise_mean=... se_mean=... pass1_last_mean=... tokens_mean=...
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from flywheel.run.flags import StrictParser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def window_points(rounds: list[dict], window: float) -> list[tuple[int, float]]:
    """(tokens, pass@1) of the evaluated rounds in the last `window` of the run's tokens, with the
    last evaluation before the window as its start.

    >>> rows = [{"generated_tokens": t, "eval_pass1": p} for t, p in [(1, .1), (4, .2), (7, .3), (9, None), (10, .35)]]
    >>> window_points(rows, 0.3)
    [(4, 0.2), (7, 0.3), (10, 0.35)]
    """
    points = [(r["generated_tokens"], r["eval_pass1"]) for r in rounds if r.get("eval_pass1") is not None]
    if not points:
        return []
    start = points[-1][0] * (1 - window)
    inside = [p for p in points if p[0] >= start]
    before = [p for p in points if p[0] < start]
    return before[-1:] + inside


def rise(points: list[tuple[int, float]]) -> float | None:
    """The least-squares line's rise over the points' token span (None with fewer than 2 points).

    >>> round(rise([(0, 0.1), (1, 0.3), (2, 0.2)]), 6)  # slope 0.05 per token x 2 tokens
    0.1
    """
    if len(points) < 2:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope * (xs[-1] - xs[0])


def sampling_se(p: float, problems: int, samples: int) -> float:
    """One evaluation's standard error on fixed problems (upper bound, see the module doc).

    >>> round(sampling_se(0.12, 500, 16), 5)
    0.00363
    """
    return math.sqrt(p * (1 - p) / (problems * samples))


MIN_POINTS = 3
"""Evaluations a verdict needs in the window (its start included): two are one noisy difference."""


def verdict(rounds: list[dict], window: float, problems: int, samples: int) -> dict:
    points = window_points(rounds, window)
    up = rise(points) if len(points) >= MIN_POINTS else None
    last = points[-1][1] if points else None
    se = sampling_se(last, problems, samples) if last is not None else None
    return {"tokens": points[-1][0] if points else 0, "pass1_last": last, "points": len(points), "rise": up, "se": se,
            "plateaued": None if up is None else up < se}


def main() -> None:
    from tools.compare import latest_summary

    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="a tools/compare.py --out folder")
    parser.add_argument("--window", type=float, default=0.3, help="the last fraction of the tokens read")
    parser.add_argument("--problems", type=int, default=500, help="held-out problems per evaluation (test_hard: 500)")
    parser.add_argument("--samples", type=int, default=16, help="samples per problem per evaluation")
    args = parser.parse_args()
    if not 0 < args.window < 1:
        raise SystemExit(f"--window must be in (0, 1), got {args.window}")
    folders = sorted(p.parent.parent for p in args.runs.glob("*/version_*/summary.json"))
    if not folders:
        raise SystemExit(f"no runs with a summary.json under {args.runs}")
    found = []
    for folder in dict.fromkeys(folders):
        v = verdict(latest_summary(folder).get("rounds", []), args.window, args.problems, args.samples)
        found.append(v)
        rise_text = "-" if v["rise"] is None else f"{v['rise']:+.4f}"
        print(f"{folder.name}: {v['tokens']:,} tokens, pass@1 {v['pass1_last']}, rise over the last {args.window:.0%} "
              f"{rise_text} ({v['points']} evaluations) vs SE {v['se'] or 0:.4f}: "
              f"{ {None: 'too few evaluations', True: 'plateaued', False: 'still rising'}[v['plateaued']] }")
    judged = [v for v in found if v["rise"] is not None]
    mean = lambda key: statistics.mean(v[key] for v in judged) if judged else float("nan")  # noqa: E731
    print(f"RESULT runs={len(found)} plateaued={sum(bool(v['plateaued']) for v in found)} rise_mean={mean('rise'):.4f} "
          f"se_mean={mean('se'):.4f} pass1_last_mean={mean('pass1_last'):.4f} tokens_mean={mean('tokens'):.0f}")


if __name__ == "__main__":
    main()
