"""flywheel.reporting.fork_gain (bench_explore --fork-gain, flywheel diagnose): fork points, the
per-token gain and its bootstrap by hand, and the measurement on a scripted generator with
hand-worked outcomes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.generation.base import Completion
from flywheel.search.config import SearchConfig
from flywheel.search.expansion import SearchProblem
from scripted import EOS, NEWLINE, ScriptedGenerator, toy_decode, toy_score
from flywheel.tasks.base import StepSpec

import flywheel.reporting.fork_gain as fg

ROOT = Path(__file__).resolve().parents[1]
ForkPoint, Tally = fg.ForkPoint, fg.Tally


def test_fork_points_of_one_response_by_hand():
    # Steps of 3, 2 and 3 tokens end at 3, 5, 8. step1 keeps 3 tokens, step2 5 (step3 would keep
    # all 8: no fork); mid keeps 8 // 2 = 4, one step complete; the most uncertain token is at
    # index 1, so entropy keeps 1 token and resamples from inside step 1 (depth 0).
    unsure = [0.1, 2.0, 0.3, 0.0, 0.5, 0.2, 0.1, 0.0]
    assert fg.fork_points([3, 2, 3], unsure, 8) == [
        ForkPoint("step1", 3, 1), ForkPoint("step2", 5, 2), ForkPoint("mid", 4, 1), ForkPoint("entropy", 1, 0)]
    assert [p.kind for p in fg.fork_points([3, 2, 3], unsure, 1)] == ["step1", "mid", "entropy"]  # --fork-steps 1
    # One step: no step fork; mid keeps 2 of 5 tokens (depth 0); without uncertainties no entropy point.
    assert fg.fork_points([5], None, 8) == [ForkPoint("mid", 2, 0)]
    # Ties go to the first token: keep nothing, a fresh sample from the root.
    assert fg.fork_points([2], [0.7, 0.7], 8)[-1] == ForkPoint("entropy", 0, 0)
    assert fg.fork_points([], None, 8) == []
    with pytest.raises(ValueError, match="3 uncertainties for a response of 2 tokens"):
        fg.fork_points([2], [0.1, 0.2, 0.3], 8)


# Two problems, one failed sample each (samples 0 and 1), 2 resamples per arm:
#   fork: problem 0 solves 1 of 2 in 20 tokens after keeping 6 tokens (1 step), problem 1 solves
#         0 of 2 in 10 tokens after keeping 2 (inside its first step)
#   root: each problem solves 1 of 2 in 40 tokens
FORK = [Tally(0, 0, 2, 1, 20, kept=6, kept_steps=1), Tally(1, 1, 2, 0, 10, kept=2, kept_steps=0)]
ROOT_TALLIES = {0: Tally(0, 0, 2, 1, 40), 1: Tally(1, 1, 2, 1, 40)}


def test_gain_per_token_by_hand():
    control = fg.paired_root(FORK, ROOT_TALLIES)
    # fork: 1000 * 1 / 30 = 33.3 solves per ktok; root: 1000 * 2 / 80 = 25; gain 33.3 / 25 = 4/3.
    assert fg.per_ktok(FORK) == pytest.approx(1000 / 30)
    assert fg.per_ktok(control) == pytest.approx(25.0)
    assert fg.gain(FORK, control) == pytest.approx(4 / 3)
    # Only sample 1 forked at this kind: its control is sample 1's root tally alone (25 / ktok).
    assert fg.paired_root(FORK[1:], ROOT_TALLIES) == [ROOT_TALLIES[1]]
    assert fg.ratio(1, 0) == math.inf and math.isnan(fg.ratio(0, 0))


def test_bootstrap_over_problems_by_hand():
    # Drawing 2 of the 2 problems with replacement: {0, 0} w.p. 1/4 (fork 2 / 40 tok = 50, root 25,
    # gain 2), {0, 1} w.p. 1/2 (gain 4/3), {1, 1} w.p. 1/4 (fork 0, gain 0). Gain mean 7/6,
    # SD sqrt(1/4 * 4 + 1/2 * 16/9 - 49/36) = sqrt(19/36) = 0.7265; interval [0, 2]. The fork
    # rate's SD: rates 50 / 33.3 / 0, SD = sqrt(1/4 * 2500 + 1/2 * 1111.1 - 29.17^2) = 18.16.
    # The root rate is 25 in every replicate: SE 0.
    spread = fg.bootstrap(FORK, fg.paired_root(FORK, ROOT_TALLIES), replicates=4000, seed=0)
    assert spread["gain_se"] == pytest.approx(math.sqrt(19 / 36), abs=0.03)
    assert (spread["gain_lo"], spread["gain_hi"]) == (0.0, 2.0)
    assert spread["fork_se"] == pytest.approx(18.16, abs=0.8)
    assert spread["root_se"] == 0.0
    assert fg.bootstrap(FORK, fg.paired_root(FORK, ROOT_TALLIES), replicates=50, seed=3) == \
        fg.bootstrap(FORK, fg.paired_root(FORK, ROOT_TALLIES), replicates=50, seed=3)  # seeded


def test_kind_lines_headline_and_result_line():
    line = fg.kind_line("step1", FORK, ROOT_TALLIES, replicates=200, seed=0)
    assert (line["failed_samples"], line["problems"], line["resamples"]) == (2, 2, 4)
    assert line["solve_rate"] == 0.25 and line["tokens_per_resample"] == 7.5  # 1 of 4, 30 tokens / 4
    assert line["root_solve_rate"] == 0.5 and line["root_tokens_per_resample"] == 20.0
    assert (line["kept_tokens"], line["kept_steps"]) == (4.0, 0.5)  # (6 + 2) / 2 tokens, (1 + 0) / 2 steps
    assert line["gain"] == pytest.approx(4 / 3)
    lines = [line, {**line, "fork": "mid", "gain": math.nan}, {**line, "fork": "entropy", "gain": 0.5}]
    assert fg.headline(lines, "best")["fork"] == "step1"  # nan never wins
    assert fg.headline(lines + [{**line, "fork": "step2", "gain": math.inf}], "best")["fork"] == "step2"
    assert fg.headline(lines, "entropy")["gain"] == 0.5 and fg.headline(lines, "step9") is None
    pool = {"problems": 2, "failed": 2, "solve_rate": 0.5}
    result = fg.result_line(lines, {"solves_per_ktok": 25.0}, lines[0], pool)
    fields = dict(item.split("=", 1) for item in result.split()[1:])
    assert fields["fork_gain"] == "1.333" and fields["fork_point"] == "step1" and fields["gain_mid"] == "nan"
    assert fields["root_solves_per_ktok"] == "25.000" and fields["fork_solves_per_ktok"] == "33.333"
    assert sorted(["mid", "step10", "entropy", "step2"], key=fg.kind_order) == ["step2", "step10", "mid", "entropy"]
    assert fg.FORK_POINT.fullmatch("step3") and not fg.FORK_POINT.fullmatch("step0")


def _completion(ids, entropies=None):
    return Completion(tuple(ids), (-0.5,) * len(ids), "eos" if ids[-1] == EOS else "stop", entropies)


def test_measure_on_a_scripted_generator(capsys):
    # Toy vocabulary (scripted): 5 = "x", 4 = newline, 2 = "C" (correct), 3 = "W".
    # From the root: "xx\nx\nxW" (steps of 3, 2, 3 tokens; most uncertain token at index 1) fails,
    # "C" solves. The pool (2 samples) holds one failed sample; the root resamples give the same
    # two: 1 solve in 8 + 2 = 10 tokens = 100 per ktok.
    failed = _completion([5, 5, 4, 5, 4, 5, 3, EOS], [0.1, 2.0, 0.3, 0.0, 0.5, 0.2, 0.1, 0.0])
    solved = _completion([2, EOS], [0.0, 0.0])
    script = {
        (0,): [failed, solved],
        (0, 5, 5, 4): [_completion([2, EOS]), _completion([3, EOS])],  # step1: 1 solve / 4 tokens = 250
        (0, 5, 5, 4, 5, 4): [_completion([3, EOS])] * 2,  # step2: 0 / 4
        (0, 5, 5, 4, 5): [_completion([4, 2, EOS])] * 2,  # mid: "xx\nx" + "\nC": 2 / 6 = 333.3
        (0, 5): [_completion([2, EOS])] * 2,  # entropy: "x" + "C": 2 / 4 = 500
    }
    setup = fg.ForkSetup([SearchProblem((0,), toy_score, "p0")], ScriptedGenerator(script), SearchConfig(max_depth=8),
                         StepSpec(16, "\n"), lambda piece: piece[-1] == NEWLINE, toy_decode, frozenset({EOS}))
    pool, forks, root = fg.measure(setup, samples=2, resamples=2, max_step_forks=4, seed=0, chunk=3)
    assert (pool["samples"], pool["failed"], pool["solve_rate"], pool["uncertainty"]) == (2, 1, 0.5, "entropy")
    assert pool["diagnostic_tokens"] == 10 + 10 + 4 + 4 + 6 + 4  # pool, root, step1, step2, mid, entropy
    assert root == {0: Tally(0, 0, 2, 1, 10)}
    assert {k: (t.solves, t.tokens, t.kept, t.kept_steps) for k, (t,) in forks.items()} == {
        "step1": (1, 4, 3, 1), "step2": (0, 4, 5, 2), "mid": (2, 6, 4, 1), "entropy": (2, 4, 1, 0)}
    fg.report(pool, forks, root, fork_point="best", replicates=20, seed=0)
    out = capsys.readouterr().out.strip().splitlines()
    gains = {json.loads(line)["fork"]: json.loads(line).get("gain") for line in out[1:-1]}
    assert gains == pytest.approx({"step1": 2.5, "step2": 0.0, "mid": 10 / 3, "entropy": 5.0, "root": None})
    assert out[-1].startswith("RESULT fork_gain=5.000 ") and "fork_point=entropy" in out[-1]


@pytest.mark.parametrize("flags, message", [
    (["--fork-point", "step0"], "--fork-point must be best, step<j> (j >= 1), mid or entropy, got 'step0'"),
    (["--fork-resamples", "0"], "--fork-resamples must be >= 1, got 0"),
])
def test_bad_fork_flags_fail_before_the_policy_loads(flags, message):
    out = subprocess.run([sys.executable, "tools/bench_explore.py", "--config", "conf/quickstart.yaml", "--fork-gain",
                          *flags], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip() == message


def _tallies(problems: int, fork: tuple[int, int], root: tuple[int, int], kinds=("step1", "mid")):
    """`problems` problems with one failed sample each; every kind's fork tally solves fork[0] of 4
    in fork[1] tokens, every root tally root[0] of 4 in root[1] tokens."""
    forks = {k: [Tally(p, p, 4, fork[0], fork[1]) for p in range(problems)] for k in kinds}
    roots = {p: Tally(p, p, 4, root[0], root[1]) for p in range(problems)}
    pool = {"problems": problems, "samples": 8 * problems, "failed": problems, "diagnostic_tokens": 1000}
    return pool, forks, roots


def test_recommend_tree_flat_and_cannot_tell():
    # Forks solve 3 of 4 in 10 tokens, fresh samples 1 of 4 in 40: gain (3/10) / (1/40) = 12 on
    # every problem, so every bootstrap replicate is 12 and the interval is [12, 12]: tree.
    advice, widened = fg.recommend(*_tallies(30, (3, 10), (1, 40)), replicates=200, seed=0)
    assert advice.verdict == "tree" and advice.kind == "step1" and advice.interval == (12.0, 12.0)
    assert widened == {"step1": (12.0, 12.0), "mid": (12.0, 12.0)} and "tree:" in advice.text
    # Forks never solve: gain 0 everywhere, every interval [0, 0]: flat.
    advice, _ = fg.recommend(*_tallies(30, (0, 10), (1, 40)), replicates=200, seed=0)
    assert advice.verdict == "flat" and advice.text.startswith("flat:")
    # Half the problems fork at gain 2 (2 of 4 in 40 tokens), half at gain 0: the pooled gain is 1
    # and its interval spans 1 -> cannot tell.
    pool, forks, roots = _tallies(30, (2, 40), (1, 40))
    forks = {k: [t if t.problem % 2 else Tally(t.problem, t.sample, 4, 0, 40) for t in ts] for k, ts in forks.items()}
    advice, widened = fg.recommend(pool, forks, roots, replicates=400, seed=0)
    assert advice.verdict == "cannot_tell" and "more problems" in advice.text
    assert all(lo < 1 < hi for lo, hi in widened.values())
    # The widened interval (2 kinds: 97.5%) is at least as wide as the plain 95% one.
    plain = fg.bootstrap(forks["step1"], fg.paired_root(forks["step1"], roots), 400, 0)
    assert widened["step1"][0] <= plain["gain_lo"] and widened["step1"][1] >= plain["gain_hi"]


def test_recommend_without_failures_or_solves_cannot_tell():
    pool, forks, roots = _tallies(12, (0, 10), (0, 40))
    advice, widened = fg.recommend(pool, forks, roots, replicates=50, seed=0)
    assert advice.verdict == "cannot_tell" and "no solve in 1000 generated tokens" in advice.text and widened == {}
    advice, _ = fg.recommend({**pool, "failed": 0}, {}, {}, replicates=50, seed=0)
    assert advice.verdict == "cannot_tell" and "none of the 96 pool samples failed" in advice.text
    # Kinds whose failed samples come from fewer than MIN_PROBLEMS problems are not read.
    advice, _ = fg.recommend(*_tallies(fg.MIN_PROBLEMS - 1, (3, 10), (1, 40)), replicates=50, seed=0)
    assert advice.verdict == "cannot_tell" and f"from {fg.MIN_PROBLEMS} problems" in advice.text


def test_measure_within_a_token_budget_matches_one_measure():
    # Two copies of the scripted problem: measured in parts of one problem, the tallies are those
    # of one measurement of both (global problem and sample indices), and a budget below the first
    # part's tokens stops after that part.
    failed = _completion([5, 5, 4, 5, 4, 5, 3, EOS], [0.1, 2.0, 0.3, 0.0, 0.5, 0.2, 0.1, 0.0])
    script = {(0,): [failed, _completion([2, EOS])], (0, 5, 5, 4): [_completion([2, EOS])] * 2,
              (0, 5, 5, 4, 5, 4): [_completion([3, EOS])] * 2, (0, 5, 5, 4, 5): [_completion([3, EOS])] * 2,
              (0, 5): [_completion([2, EOS])] * 2}
    problems = [SearchProblem((0,), toy_score, "p0"), SearchProblem((0,), toy_score, "p1")]
    setup = fg.ForkSetup(problems, ScriptedGenerator(script), SearchConfig(max_depth=8), StepSpec(16, "\n"),
                         lambda piece: piece[-1] == NEWLINE, toy_decode, frozenset({EOS}), chatty=False)
    whole, forks, root = fg.measure(setup, samples=2, resamples=2, max_step_forks=4, seed=0, chunk=8)
    seen = []
    parts, part_forks, part_root = fg.measure_within(setup, samples=2, resamples=2, max_step_forks=4, seed=0, chunk=8,
                                                     max_tokens=None, problems_per_part=1,
                                                     progress=lambda done, tokens: seen.append((done, tokens)))
    assert part_forks == forks and part_root == root and sorted(root) == [0, 1]
    assert (parts["problems"], parts["failed"], parts["solve_rate"]) == (2, 2, 0.5)
    assert parts["diagnostic_tokens"] == whole["diagnostic_tokens"] and seen[-1] == (2, whole["diagnostic_tokens"])
    first, _, _ = fg.measure_within(setup, samples=2, resamples=2, max_step_forks=4, seed=0, chunk=8, max_tokens=1,
                                    problems_per_part=1)
    assert first["problems"] == 1 and 2 * first["diagnostic_tokens"] == whole["diagnostic_tokens"]
