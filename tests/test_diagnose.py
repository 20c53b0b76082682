"""`python -m flywheel diagnose`: fork_gain of any policy folder on any problem file, within a
token budget, with one line of advice (flywheel.reporting.diagnose)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.__main__ import main
from flywheel.reporting.diagnose import finite_or_text
from flywheel.run.preflight import PreflightError

ROOT = Path(__file__).resolve().parents[1]

SMALL = ["--samples", "2", "--resamples", "1", "--fork_steps", "2", "--bootstrap", "50", "--problems_per_part", "4"]


def test_diagnose_a_builtin_policy_on_its_split(tmp_path, capsys):
    report = main(["diagnose", "--policy", "tiny-countdown", "--split", "train", "--max_problems", "12",
                   "--max_tokens", "100000", "--out", str(tmp_path), *SMALL])
    written = json.loads((tmp_path / "diagnose.json").read_text())
    assert written["recommendation"] == finite_or_text(report["recommendation"])  # inf / nan as text in the file
    assert report["recommendation"]["verdict"] in ("tree", "flat", "cannot_tell")
    pool = report["pool"]
    assert (pool["problems"], pool["samples"]) == (12, 24) and 0 <= pool["failed"] <= 24
    kinds = [line["fork"] for line in report["fork_points"]]
    assert {"step1", "mid", "entropy"} <= set(kinds)
    for line in report["fork_points"]:
        lo, hi = line["gain_ci_widened"]
        assert (lo != lo) or lo <= line["gain_ci95"][0] <= line["gain_ci95"][1] <= hi  # nan, or widened
    out = capsys.readouterr().out
    assert "recommendation: " in out and "fork point" in out and "fresh" in out


def test_the_token_budget_stops_between_parts(tmp_path):
    report = main(["diagnose", "--policy", "tiny-countdown", "--split", "train", "--max_problems", "64",
                   "--max_tokens", "1", "--out", str(tmp_path), *SMALL])
    assert report["pool"]["problems"] == 1  # a first part of one problem, then the budget is spent
    spent = report["pool"]["diagnostic_tokens"]
    report = main(["diagnose", "--policy", "tiny-countdown", "--split", "train", "--max_problems", "64",
                   "--max_tokens", str(3 * spent), "--out", str(tmp_path), *SMALL])
    assert 2 <= report["pool"]["problems"] <= 8  # parts sized to the budget (about 3 problems), not 64


def test_diagnose_a_chain_file_with_the_chain_task(tmp_path):
    rows = [{"id": f"c{i}", "start": 10 + i, "ops": [["+", 5], ["*", 2], ["-", 3]], "answer": (15 + i) * 2 - 3}
            for i in range(6)]
    problems = tmp_path / "chains.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = main(["diagnose", "--policy", "tiny-countdown", "--task", "flywheel.tasks.chain.ChainTask",
                   "--files", str(problems), "--max_depth", "8", "--out", str(tmp_path / "out"), *SMALL])
    assert report["task"] == "ChainTask" and report["pool"]["problems"] == 6 and report["files"] == [str(problems)]


@pytest.mark.parametrize("flags, message", [
    (["--samples", "0"], "--samples=0: must be >= 1"),
    (["--max_tokens", "0"], "--max_tokens=0: must be >= 1"),
    (["--top_p", "1.5"], "--top_p=1.5: must be in (0, 1]"),
    (["--max_depth", "16"], "--max_depth=16: a rollout of 16 steps of up to 40 tokens (640)"),
    (["--files", "/no/such.jsonl"], "/no/such.jsonl does not exist; fix the path in --files"),
])
def test_bad_settings_are_one_line_naming_the_flag(tmp_path, flags, message):
    with pytest.raises(PreflightError) as err:
        main(["diagnose", "--policy", "tiny-countdown", "--out", str(tmp_path), *flags])
    assert message in str(err.value)
    with pytest.raises(PreflightError, match="give --policy"):
        main(["diagnose", "--out", str(tmp_path)])


def test_diagnose_is_a_subcommand_with_help():
    out = subprocess.run([sys.executable, "-m", "flywheel", "--help"], capture_output=True, text=True, check=True).stdout
    assert "diagnose" in out
    sub = subprocess.run([sys.executable, "-m", "flywheel", "diagnose", "--help"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    for option in ("--max_tokens", "--resamples", "--task", "--files"):
        assert option in sub


def test_docstring_examples():
    import doctest

    import flywheel.reporting.diagnose as diagnose

    assert doctest.testmod(diagnose).failed == 0


def test_diagnose_takes_a_fit_overlay_and_the_device_flags(tmp_path, monkeypatch):
    # Before: "Option 'data.task.init_args.gold_format' is not accepted", and no --device.
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in ((2, 3), (7, 8))]
    problems = tmp_path / "gsm.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["diagnose", "--config", str(ROOT / "conf" / "data" / "gsm8k.yaml"), "--policy", "tiny-countdown",
            "--files", str(problems), "--task.init_args.step_tokens=16", "--task.init_args.max_response_tokens=64",
            "--max_depth", "4", "--max_problems", "1", "--out", str(tmp_path / "out"), *SMALL]
    report = main(args + ["--device", "cpu", "--dtype", "auto"])
    assert (report["task"], report["device"], report["dtype"], report["pool"]["problems"]) == ("MathTask", "cpu", "float32", 1)
    assert "#### 5" not in report["first_prompt"] and report["first_prompt"].startswith("What is 2 plus 3? Let's think")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(PreflightError, match="--device=cuda:0: this machine has no CUDA device"):
        main(args + ["--device", "cuda:0"])


def test_diagnose_an_environment_forks_at_its_turns_and_advises(tmp_path):
    """tiny-mastermind on 16 train secrets: the episodes run to the task's 8 turns (no
    --max_depth given), the fork points are the turn boundaries (step1-3 keep 1-3 guesses and
    their answers), mid and entropy, and at this size the advice is to measure more (docs/results.md's
    256-secret run, 1501 failed samples, is the one that said tree)."""
    report = main(["diagnose", "--policy", "tiny-mastermind", "--task", "flywheel.tasks.mastermind.MastermindTask",
                   "--split", "train", "--max_problems", "16", "--samples", "4", "--resamples", "1",
                   "--fork_steps", "3", "--bootstrap", "100", "--out", str(tmp_path)])
    assert report["task"] == "MastermindTask" and report["settings"]["max_depth"] == 8
    assert report["pool"]["problems"] == 16 and report["pool"]["failed"] > 20
    lines = {line["fork"]: line for line in report["fork_points"]}
    assert set(lines) == {"step1", "step2", "step3", "mid", "entropy"}
    assert [round(lines[f"step{j}"]["kept_tokens"]) for j in (1, 2, 3)] == [5, 10, 15]  # 4 digits + newline a guess
    advice = report["recommendation"]
    assert advice["verdict"] == "cannot_tell" and "run with more problems" in advice["text"], advice
