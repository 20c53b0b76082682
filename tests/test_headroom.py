"""tools/headroom.py: the problem sample and the first-solve count by hand, and a tiny real run
whose RESULT line agrees with the per-problem records it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tools.headroom import draw, first_solve

ROOT = Path(__file__).resolve().parents[1]


def test_draw_is_a_seeded_sample_in_split_order():
    pool = list("abcdefghij")
    picked = draw(pool, 4, seed=3)
    assert len(picked) == 4 and picked == sorted(picked)  # split order kept
    assert draw(pool, 4, seed=3) == picked  # the same seed, the same problems
    assert draw(pool, None, seed=3) == pool and draw(pool, 20, seed=3) == pool


def test_first_solve_counts_samples_across_chunks_within_the_budget():
    assert first_solve([[False, False, False], [True, True]], 8) == 4
    assert first_solve([[True]], 8) == 1
    assert first_solve([[False, False], [False, True]], 3) is None  # the 4th sample is past the budget
    assert first_solve([], 8) is None


def test_headroom_end_to_end_agrees_with_its_records(tmp_path):
    out = tmp_path / "headroom.json"
    cmd = [sys.executable, "tools/headroom.py", "--config", "conf/quickstart.yaml", "--config", "conf/dapo.yaml",
           "--numbers", "4", "--limit", "12", "--screen", "2", "--samples", "6", "--chunk", "4", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = dict(kv.split("=") for kv in proc.stdout.strip().splitlines()[-1].split()[1:])
    record = json.loads(out.read_text())
    rows = record["records"]
    assert len(rows) == 12 == int(result["problems"]) and len({r["id"] for r in rows}) == 12
    failed = [r for r in rows if r["screen_correct"] == 0]
    assert int(result["failed"]) == len(failed) == record["failed"]
    assert int(result["screen_solved"]) == 12 - len(failed)
    solved = [r for r in failed if r["first_solve"] is not None]
    assert int(result["headroom"]) == len(solved) and all(1 <= r["first_solve"] <= 6 for r in solved)
    assert all(r["first_solve"] is None for r in rows if r["screen_correct"] > 0)  # only failed ones resampled
    assert int(result["tokens"]) > 0 and 0 < len(failed) < 12  # the base fails some 4-number problems, not all
