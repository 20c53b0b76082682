"""tools/bench_search.py keeps working (a tiny run of part (a) and the RESULT line)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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
    assert bench.main(["--skip-hf", "--skip-growth"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "RESULT us_per_expansion_1=12.5 big_tree_nodes=1500 overhead_pct=nan"


def test_growth_run_reads_full_rounds_only():
    bench = load_bench()
    row = bench.growth_run(live=3, depth=4, trees=6)
    # Every full round expands exactly `live` trees; the ramp-down rounds are left out.
    assert row["rounds"] >= 1 and row["expansions"] == 3 * row["rounds"]
    # A request's prefix is the 3-token prompt plus up to d_T - 1 = 3 steps of 16 tokens: 3 to 51 tokens,
    # more than the prompt on average (the root is expanded once per tree, its children after).
    assert 3 < row["prefix_tokens"] <= 51
    assert 0 < row["us_per_expansion"] < row["total_us_per_expansion"]


def test_growth_ratios_are_last_over_first(monkeypatch):
    bench = load_bench()
    # Bookkeeping us/exp 10 at 16 live and 30 at 256 live (x3); by depth 40 -> 20 (x0.5) while the
    # prefix grows 29 -> 232 tokens (x8); totals add 5 us/exp: 15 -> 35 (x2.333), 45 -> 25 (x0.5556).
    rows = {(16, 16): (10.0, 60.0), (64, 16): (20.0, 60.0), (256, 16): (30.0, 60.0),
            (16, 4): (40.0, 29.0), (16, 64): (20.0, 232.0)}

    def fake(live, depth, trees):
        us, prefix = rows[(live, depth)]
        return {"live": live, "trees": trees, "depth": depth, "expansions": 1, "rounds": 1, "prefix_tokens": prefix,
                "us_per_expansion": us, "total_us_per_expansion": us + 5.0}

    monkeypatch.setattr(bench, "growth_run", fake)
    out = bench.part_c(quick=True)
    assert out["growth_per_expansion_16_to_256"] == 3.0
    assert abs(out["growth_total_per_expansion_16_to_256"] - 35 / 15) < 1e-12
    assert out["growth_per_expansion_d4_to_d64"] == 0.5 and out["growth_prefix_tokens_d4_to_d64"] == 8.0
    assert abs(out["growth_total_per_expansion_d4_to_d64"] - 25 / 45) < 1e-12


def test_bad_wide_width_fails_before_any_part_runs(monkeypatch, capsys):
    bench = load_bench()
    monkeypatch.setattr(bench, "part_a", lambda quick: pytest.fail("part (a) ran before the arguments were checked"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--wide-hidden", "100"])
    assert exit_info.value.code == 2
    assert "--wide-hidden must be a multiple of 64 (64-dim heads), got 100" in capsys.readouterr().err
