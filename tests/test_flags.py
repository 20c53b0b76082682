"""Strict flags (flywheel.run.flags): no command takes an abbreviated or misspelt flag as
another one, and an unknown flag's one-line error names the flag it most likely meant, in
`fit`, `eval`, `diagnose`, `tree`, `get-policy` and the tools."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.__main__ import main
from flywheel.run.flags import StrictParser, closest, suggestion, unknown_flags
from flywheel.run.preflight import PreflightError

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "conf" / "quickstart.yaml")


def test_the_closest_flag_is_the_one_abbreviated_else_the_nearest_spelling():
    known = ["--trainer.max_epochs", "--trainer.max_steps", "--samples", "--seed"]
    assert closest("--trainer.max_epoch", known) == "--trainer.max_epochs"
    assert closest("--smaples", known) == "--samples"
    assert closest("--sed", known) == "--seed"
    assert closest("--data.nothing_like_it", known) is None
    assert unknown_flags("unrecognized arguments: --a=1 2 --b") == ["--a", "--b"]
    assert suggestion("unrecognized arguments: --smaples 2", known) == "; did you mean --samples?"
    assert suggestion("unrecognized arguments: --smaples 2 --sed=1", known) == \
        "; did you mean --smaples -> --samples, --sed -> --seed?"
    assert suggestion("unrecognized arguments: --zzz", known) == ""


def test_an_argparse_parser_refuses_abbreviations_with_the_closest_flag(capsys):
    parser = StrictParser(prog="tool")
    parser.add_argument("--max_problems", type=int, default=1)
    assert parser.parse_args(["--max_problems=3"]).max_problems == 3
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--max_prob=3"])  # plain argparse takes it as --max_problems=3
    assert stop.value.code == 2
    assert "unrecognized arguments: --max_prob=3; did you mean --max_problems?" in capsys.readouterr().err


def test_fit_refuses_an_abbreviated_flag_and_names_the_whole_one():
    with pytest.raises(PreflightError) as err:
        main(["fit", "--config", QUICK, "--trainer.max_epoch=2"])  # refused while parsing: nothing runs
    assert "unrecognized arguments: --trainer.max_epoch=2; did you mean --trainer.max_epochs?" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("command", "wrong", "meant"), [
    (["eval", "--policy", "tiny-countdown"], "--smaples", "--samples"),
    (["diagnose", "--policy", "tiny-countdown"], "--max_problem", "--max_problems"),
])
def test_eval_and_diagnose_refuse_an_abbreviated_or_misspelt_flag(command, wrong, meant):
    with pytest.raises(PreflightError) as err:
        main([*command, wrong, "2"])
    assert f"did you mean {meant}?" in str(err.value) and f"python -m flywheel {command[0]} --help" in str(err.value)


@pytest.mark.parametrize(("command", "meant"), [
    (["tree", "runs", "--epo", "1"], "--epoch"),
    (["get-policy", "smollm2-135m-instruct", "--forc"], "--force"),
])
def test_tree_and_get_policy_refuse_an_abbreviated_flag(command, meant, capsys):
    with pytest.raises(SystemExit) as stop:
        main(command)
    assert stop.value.code == 2 and f"did you mean {meant}?" in capsys.readouterr().err


def test_a_tool_refuses_an_abbreviated_flag():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "make_chain_splits.py"), "--ou", "x"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "did you mean --out?" in done.stderr, done.stderr


def test_no_parser_of_the_project_allows_abbreviations():
    """Every argparse parser is a StrictParser (a plain ArgumentParser would take prefixes again)."""
    plain = []
    for folder in ("flywheel", "data_modules", "callbacks", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "ArgumentParser":
                    plain.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert plain == []


def test_the_command_lists_only_the_subcommands_that_do_something(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "{fit,validate,test}" in out and "predict" not in out
    with pytest.raises(PreflightError, match="invalid choice"):
        main(["predict", "--config", QUICK])


def test_report_redraws_a_runs_report_from_its_summary(tmp_path):
    summary = {"base_eval_pass1": 0.2, "base_eval_passk": 0.4, "k": 4, "samples": 4, "temperature": 1.0,
               "eval_problems": 10, "rounds": [
                   {"round": 1, "epoch": 0, "eval_pass1": 0.3, "eval_passk": 0.5, "k": 4, "hard_set_size": None,
                    "cached": 2, "generated_tokens": 1000},
                   {"round": 2, "epoch": 1, "eval_pass1": 0.35, "eval_passk": 0.55, "k": 4, "hard_set_size": None,
                    "cached": 3, "generated_tokens": 2000}]}
    run = tmp_path / "quickstart" / "version_0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    md, png = main(["report", str(tmp_path / "quickstart")])  # the newest summary.json below the folder
    assert md == run / "report.md" and png.read_bytes()[:4] == b"\x89PNG"
    assert "| 2 | 1 | 0.3500 |" in md.read_text()
    with pytest.raises(PreflightError, match="no summary.json"):
        main(["report", str(tmp_path / "empty")])
