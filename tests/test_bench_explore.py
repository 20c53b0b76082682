"""tools/bench_explore.py: the flat-sampling estimators by hand, and a tiny end-to-end run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_explore", ROOT / "tools" / "bench_explore.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
spec = importlib.util.spec_from_file_location("flat_first_cases", ROOT / "tests" / "test_flat_first.py")
ff = sys.modules["flat_first_cases"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up there
spec.loader.exec_module(ff)  # the scripted problems a and b (a module object: its tests are not collected here)


def test_solved_and_distinct_estimators_by_hand():
    # 4 samples, 1 correct: a 2-subset misses it with C(3,2)/C(4,2) = 3/6 -> solved 1/2.
    assert bench.solved_at(2, 4, 1) == pytest.approx(0.5)
    assert bench.solved_at(3, 4, 2) == 1.0  # only 2 wrong ones: any 3 hold a correct one
    assert bench.solved_at(4, 4, 0) == 0.0
    # Answers seen 2 and 1 times among 4: in a 2-subset with 1 - C(2,2)/6 = 5/6 and 1/2.
    assert bench.distinct_at(2, 4, [2, 1]) == pytest.approx(5 / 6 + 1 / 2)


def test_flat_curve_and_the_adaptive_control_by_hand():
    # Problem A: 4 samples of 10 tokens, the 2nd correct. Problem B: 4 wrong samples of 20 tokens.
    samples = [[(10, False, "1"), (10, True, "7"), (10, False, "2"), (10, False, "3")],
               [(20, False, "1")] * 4]
    curve = bench.flat_curve(samples)
    assert [c["arm"] for c in curve] == ["flat_n1", "flat_n2", "flat_n3", "flat_n4"]
    # 15 tokens per sample on average; A solved at n with probability n / 4, B never.
    assert curve[1]["tokens_per_problem"] == pytest.approx(30.0)
    assert [c["solved"] for c in curve] == pytest.approx([0.125, 0.25, 0.375, 0.5])
    # Width 2, stop once solved with >= 2 samples, cap K in {2, 4}:
    #   K = 2: A takes samples 1-2 (solved, 20 tokens), B 1-2 (40 tokens) -> 30 tokens, solved 1/2.
    #   K = 4: A stops at 2 (solved); B takes all 4 (80 tokens) -> 50 tokens, solved 1/2.
    adaptive = bench.flat_adaptive_curve(samples, width=2, stop_when_solved=2)
    assert [(c["tokens_per_problem"], c["solved"]) for c in adaptive] == [(30.0, 0.5), (50.0, 0.5)]
    assert bench.interpolate(40.0, [30.0, 50.0], [0.2, 0.6]) == (pytest.approx(0.4), True)
    assert bench.interpolate(15.0, [30.0, 50.0], [0.2, 0.6]) == (pytest.approx(0.1), True)
    assert bench.interpolate(90.0, [30.0, 50.0], [0.2, 0.6]) == (0.6, False)


def test_the_flat_first_arm_counts_flat_groups_and_trees_by_hand():
    """tests/test_flat_first.py's epoch with --data.batching.flat_first=2, as the tree arm reads it:
    problem a is solved by its 2 flat samples ("C", "W": 4 tokens) and keeps them as a flat group;
    b's 2 fail ("x\\n W", "W": 6 tokens) and its tree starts from them, then forks once from node 1
    ("C": 2 tokens of its own). Tree b: parent [-1, 0, 1, 0, 1], expanded [1, 1, 0, 0, 0].
      tokens per problem (4 + 6 + 2) / 2 = 6 = the flat samples' (4 + 6) / 2 = 5 + the tree's 2 / 2 = 1;
      solved 2 / 2 (a by flat, b by the tree); terminals and trained rows (2 + 3) / 2 = 2.5;
      branching: node 1, the one non-root node forked from, has 2 children; the root 2.
      The search's shape is the one tree's: expansions by depth {0: 1, 1: 1} per tree (not per
      problem, which would halve them), 1 expansion (the fork; the flat responses are no request)."""
    from data_modules.rollout import rollout

    problems = [ff.Problem("a", "10", "C"), ff.Problem("b", "11", "C")]
    out = rollout(problems, generator=ff.ScriptedGenerator({**ff.FLAT, **ff.TREE}), task=ff.ToyTask(), tokenizer=ff.ToyTokenizer(),
                  kind="search", search=ff.CONFIG, flat_samples=8, max_concurrent_trees=4, credit=ff.Credit(), flat_first=2)
    arm = bench.tree_arm(out.results, [len(rows) for rows in out.rows])
    assert arm["tokens_per_problem"] == 6.0 and arm["solved"] == 1.0
    assert (arm["terminals_per_problem"], arm["trained_per_problem"]) == (2.5, 2.5)
    assert (arm["mean_branching"], arm["root_branching"], arm["expansions_per_tree"]) == (2.0, 2.0, 1.0)
    assert arm["expansions_by_depth"] == {0: 1.0, 1: 1.0, 2: 0.0} and arm["trees_short"] == 0
    split = bench.flat_first_split(out.results, 2)
    assert split == {"flat_first": 2, "solved_by_flat_first": 0.5, "trees": 1, "solved_by_tree": 0.5,
                     "flat_first_tokens_per_problem": 5.0, "tree_own_tokens_per_problem": 1.0}
    # The same split as the epoch's own token count (data_modules/token_split.py): flat 10, tree 2.
    assert (out.tokens.flat / 2, out.tokens.tree / 2) == (5.0, 1.0)


@pytest.mark.slow
def test_bench_explore_runs_end_to_end(tmp_path):
    """Two training problems, rollout expansion: one JSON line per arm and the RESULT line."""
    cache = tmp_path / "flat.json"
    cmd = [sys.executable, "tools/bench_explore.py", "--config", "conf/quickstart.yaml", "--split", "train",
           "--numbers", "4", "--limit", "2", "--flat-cache", str(cache), "--data.search.expansion=rollout",
           "--data.search.trajectories_per_tree=16", "--data.search.stop_when_solved=8"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    arms = [json.loads(line)["arm"] for line in lines if line.startswith("{")]
    assert arms[:5] == ["tree", "flat_n8", "flat_n16", "flat_n32", "flat_n64"]
    assert "flat_adaptive_k8" in arms
    result = dict(kv.split("=") for kv in lines[-1].removeprefix("RESULT ").split())
    assert {"tree_tokens_per_problem", "tree_solved", "flat_solved_at_equal_tokens", "solve_ratio",
            "mean_branching"} <= set(result)
    assert 0.0 <= float(result["tree_solved"]) <= 1.0
    assert (result["expansion"], result["fork_rule"], result["distinct_children"]) == ("rollout", "uct", "false")
    cached = json.loads(cache.read_text())
    assert len(cached["samples"]) == 2 and all(len(s) == 64 for s in cached["samples"])


@pytest.mark.slow
def test_bench_explore_measures_the_flat_first_arm(tmp_path):
    """--data.batching.flat_first=4 on two training problems (tree arm only): the arm's tokens are
    its flat samples' plus its trees' own, and the RESULT line names the switch."""
    cmd = [sys.executable, "tools/bench_explore.py", "--config", "conf/quickstart.yaml", "--split", "train",
           "--numbers", "4", "--limit", "2", "--skip-flat", "--data.search.expansion=rollout",
           "--data.search.trajectories_per_tree=8", "--data.batching.flat_first=4"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    (tree,) = [json.loads(line) for line in lines if line.startswith("{")]
    assert tree["flat_first"] == 4 and tree["trees"] == round(2 * (1 - tree["solved_by_flat_first"]))
    assert tree["tokens_per_problem"] == pytest.approx(tree["flat_first_tokens_per_problem"]
                                                       + tree["tree_own_tokens_per_problem"])
    # These two problems (seeded): the 4 samples solve the first, the second gets a tree.
    assert tree["trees"] == 1 and tree["flat_first_tokens_per_problem"] > 0 and tree["tree_own_tokens_per_problem"] > 0
    assert tree["solved"] == pytest.approx(tree["solved_by_flat_first"] + tree["solved_by_tree"])
    assert tree["trained_per_problem"] >= 4  # every problem trains on at least its 4 flat samples
    result = dict(kv.split("=") for kv in lines[-1].removeprefix("RESULT ").split())
    assert result["flat_first"] == "4" and float(result["tree_solved"]) == pytest.approx(tree["solved"], abs=1e-4)
