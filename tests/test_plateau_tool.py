"""tools/plateau.py: the plateau verdict by hand (window, least-squares rise, sampling SE), its
doctests, and the command over a compare.py-shaped folder of hand-written summaries."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tools.headroom
import tools.plateau
import tools.ship_policies
from tools.plateau import verdict

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", [tools.plateau, tools.headroom, tools.ship_policies])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def rounds(points):
    return [{"round": i + 1, "generated_tokens": t, "eval_pass1": p} for i, (t, p) in enumerate(points)]


def test_a_flat_tail_is_a_plateau_and_a_rising_one_is_not():
    # window 0.3 of 10M: from 7M; the start is the 6M evaluation. Points (6, .2), (8, .2), (10, .2): rise 0
    flat = verdict(rounds([(2e6, .1), (6e6, .2), (8e6, .2), (10e6, .2)]), 0.3, 500, 16)
    assert flat["points"] == 3 and flat["rise"] == pytest.approx(0.0) and flat["plateaued"] is True
    assert flat["se"] == pytest.approx((0.2 * 0.8 / 8000) ** 0.5)
    # (6, .2), (8, .21), (10, .22): slope 0.005 per M over 4M = 0.02 > SE 0.0046
    rising = verdict(rounds([(2e6, .1), (6e6, .2), (8e6, .21), (10e6, .22)]), 0.3, 500, 16)
    assert rising["rise"] == pytest.approx(0.02) and rising["plateaued"] is False
    # two evaluations in the window are too few to judge
    short = verdict(rounds([(6e6, .2), (10e6, .2)]), 0.3, 500, 16)
    assert short["rise"] is None and short["plateaued"] is None


def test_the_command_reads_every_run_of_a_comparison(tmp_path):
    for name, tail in (("dapo_seed0", .2), ("dapo_seed1", .3)):
        folder = tmp_path / name / "version_0"
        folder.mkdir(parents=True)
        summary = {"rounds": rounds([(6e6, .2), (8e6, .2), (10e6, tail)])}
        (folder / "summary.json").write_text(json.dumps(summary))
    proc = subprocess.run([sys.executable, "tools/plateau.py", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "dapo_seed0" in lines[0] and "plateaued" in lines[0] and "still rising" in lines[1]
    assert lines[-1].startswith("RESULT runs=2 plateaued=1 rise_mean=0.0500 ")
