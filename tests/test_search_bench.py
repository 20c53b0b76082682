"""tools/bench_search.py keeps working (a tiny run of part (a) and the RESULT line)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench_search.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_search", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scripted_run_reports_costs():
    bench = load_bench()
    row = bench.scripted_run(trees=3, concurrency=2, eos_prob=0.3, step_tokens=8)
    assert row["trees"] == 3 and row["complete"] == 3
    assert row["expansions"] >= 3 and row["us_per_expansion"] > 0 and row["frontier_us"] >= 0


def test_result_line_is_last(monkeypatch, capsys):
    bench = load_bench()
    monkeypatch.setattr(bench, "part_a", lambda quick: {"us_per_expansion_1": 12.5, "big_tree_nodes": 1500.0})
    assert bench.main(["--skip-hf"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "RESULT us_per_expansion_1=12.5 big_tree_nodes=1500 overhead_pct=nan"
