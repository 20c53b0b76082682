"""What the command line and the docs tell a user: the program's name, every subcommand's whole
description, the task classes `--task` knows, one-line refusals of a bad choice or of a class's
setting given without its class, and paths cited in the docs and the help that exist."""

from __future__ import annotations

import inspect
import pkgutil
import re
from importlib import import_module
from pathlib import Path

import pytest

import flywheel.tasks
from flywheel.__main__ import COMMANDS, USAGE, _dispatch, main
from flywheel.generation.backends import GeneratorBackend, HFBackend
from flywheel.run.cli import SUBCOMMAND_HELP, SUBCOMMANDS
from flywheel.run.command_line import function_cli, implied_classes, parse_error_line
from flywheel.run.preflight import PreflightError
from flywheel.tasks import Task

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "conf" / "quickstart.yaml")


def help_text(args: list[str], capsys, monkeypatch) -> str:
    """`python -m flywheel ARGS` with --help's output unwrapped (one option per line)."""
    monkeypatch.setenv("COLUMNS", "100000")
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code in (0, None)
    return capsys.readouterr().out


# ---------------------------------------------------------------------- the program and its subcommands
def test_help_names_the_program_as_it_is_run_and_describes_each_subcommand_whole(capsys, monkeypatch):
    top = help_text(["--help"], capsys, monkeypatch)
    assert "usage: python -m flywheel [-c CONFIG] {fit,validate,test}" in top and "__main__.py" not in top
    for name, description in SUBCOMMAND_HELP.items():  # Lightning's were cut mid-sentence ("never run on your")
        assert re.search(rf"^\s+{name}\s+{re.escape(description)}$", top, re.MULTILINE), name
    assert tuple(SUBCOMMAND_HELP) == SUBCOMMANDS
    assert help_text(["test", "--help"], capsys, monkeypatch).startswith("usage: python -m flywheel [options] test")
    for command in ("eval", "diagnose", "tree", "report", "get-policy"):
        assert help_text([command, "--help"], capsys, monkeypatch).startswith(f"usage: python -m flywheel {command} ")


def test_the_readme_and_the_usage_name_every_subcommand():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"python -m flywheel --help\s+# subcommands: (.*)", readme).group(1)
    assert [c.strip() for c in listed.split(",")] == [*SUBCOMMANDS, *COMMANDS]
    dispatch = inspect.getsource(_dispatch)
    for command in COMMANDS:
        assert f"{command}: " in USAGE and f'argv[:1] == ["{command}"]' in dispatch, command


def test_task_lists_every_task_class_the_package_defines(capsys, monkeypatch):
    """jsonargparse lists the Task subclasses imported when the parser is built: flywheel.tasks
    imports each one, so `--task` names them all (ChainTask was missing)."""
    defined = set()
    for module in pkgutil.iter_modules(flywheel.tasks.__path__):
        found = import_module(f"flywheel.tasks.{module.name}")
        defined |= {c for _, c in inspect.getmembers(found, inspect.isclass)
                    if issubclass(c, Task) and not inspect.isabstract(c) and c.__module__ == found.__name__}
    assert {c.__name__ for c in defined} >= {"ChainTask", "CountdownTask", "MathTask"}
    assert all(getattr(flywheel.tasks, c.__name__, None) is c for c in defined)
    listed = re.search(r"--task TASK .*known subclasses: ([^)]*)\)", help_text(["eval", "--help"], capsys, monkeypatch))
    named = {name.rsplit(".", 1)[-1] for name in listed.group(1).split(", ")}
    assert {c.__name__ for c in defined} <= named  # a test's own task (tests/trap_task.py) may be listed too


# ---------------------------------------------------------------------- one-line refusals
def test_a_literal_choice_is_refused_with_its_choices_and_the_closest_one():
    with pytest.raises(PreflightError) as err:
        main(["fit", "--config", QUICK, "--data.search.backup=constrain"])
    assert str(err.value).startswith("--data.search.backup=constrain: must be one of constrained, vanilla; "
                                     "did you mean constrained? (`python -m flywheel fit --help` lists every option)")
    with pytest.raises(PreflightError) as err:  # inside a class's settings
        main(["fit", "--config", QUICK, "--data.task.init_args.each_number=at_most"])
    assert str(err.value).startswith("--data.task.init_args.each_number=at_most: must be one of exactly_once, "
                                     "at_most_once; did you mean at_most_once?")
    with pytest.raises(PreflightError, match=r"^--columns.system_turn=nope: must be one of refuse, drop \("):
        main(["eval", "--policy", "tiny-countdown", "--columns.system_turn=nope"])  # nothing close: no guess


def test_a_class_setting_alone_configures_the_command_s_default_class():
    """`--generator.init_args.dtype=bfloat16` in eval was jsonargparse's NestedArg message: the
    in-process backend is what eval's generator None stands for, so its settings alone set it."""
    assert implied_classes(["--generator.init_args.dtype=bfloat16"], ["generator", "task"]) == [
        "--generator=flywheel.generation.backends.HFBackend", "--generator.init_args.dtype=bfloat16"]
    for given in (["--generator=HFBackend", "--generator.dtype=bfloat16"], ["--generator.help", "HFBackend"],
                  ["--generator.class_path=HFBackend", "--generator.init_args.dtype=bfloat16"]):
        assert implied_classes(given, ["generator"]) == given
    assert implied_classes(["--generator.dtype=bfloat16"], ["task"]) == ["--generator.dtype=bfloat16"]

    def command(generator: GeneratorBackend | None = None) -> GeneratorBackend | None:
        return generator

    backend = function_cli(command, ["--generator.init_args.dtype=bfloat16"], "eval")
    assert isinstance(backend, HFBackend) and backend.dtype == "bfloat16"
    assert function_cli(command, ["--generator.dtype=float32"], "eval").dtype == "float32"
    with pytest.raises(PreflightError, match=r"^--generator.init_args.dtype=bf16: must be one of auto, float32, "
                                             r"bfloat16 \(`python -m flywheel eval --help`"):
        main(["eval", "--policy", "tiny-countdown", "--generator.init_args.dtype=bf16"])


def test_a_class_setting_with_no_class_to_set_it_on_says_which_flag_names_one():
    message = ("Parser key \"generator\":\n  Does not validate against any of the Union subtypes\n"
               "  Subtypes: [<class 'flywheel.generation.backends.GeneratorBackend'>, <class 'NoneType'>]\n  Errors:\n"
               "    - Expected an instantiatable class, but flywheel.generation.backends.GeneratorBackend is abstract\n"
               "    - Expected a <class 'NoneType'>\n  Given value type: <class 'jsonargparse._util.NestedArg'>\n"
               "  Given value: NestedArg(key='dtype', val='bfloat16')")
    assert parse_error_line(message, "eval") == (
        "--generator.init_args.dtype=bfloat16: --generator names no class to set 'dtype' on; give it first, "
        "--generator=CLASS (a subclass of GeneratorBackend), then --generator.init_args.dtype=... "
        "(`python -m flywheel eval --help` lists every option)")


# ---------------------------------------------------------------------- paths the docs and the help cite
TOP = {"callbacks", "conf", "data_modules", "docs", "flywheel", "results", "shared", "tests", "tools"}
"""A cited path starting with one of these is a file of the repository (shared/ is not one: the
team's notes are not shipped, so a citation of them is broken for every reader)."""
CITED = re.compile(r"(?<![\w/.<{-])((?:[\w.-]+/)+[\w.-]*[\w/]|[\w-]+\.md)(?![\w/*{<]|\.\*)")
OUTPUTS = {"report.md"}
"""Names of files a run writes, not files of the repository."""


def broken_citations(text: str, folder: Path) -> list[str]:
    """The repository paths and .md pages `text` cites (relative to `folder` or the repository's
    root) that do not exist. A pattern (`dapo_seed<s>/`, `epoch_NNNN.jsonl`, `x.*`) is no citation."""
    missing = []
    for match in CITED.finditer(text):
        path = match.group(1)
        if "/" in path and path.split("/", 1)[0] not in TOP or path in OUTPUTS or "NNNN" in path:
            continue
        if not any((base / path).exists() for base in (folder, ROOT, ROOT / "docs")):
            missing.append(path)
    return missing


def test_the_citation_check_finds_a_path_that_is_not_there(tmp_path):
    text = ("see docs/running.md, tools/compare.py and shared/notes/x.md, deepsearch.md §7, runs/quickstart/, "
            "results/plateau/dapo_seed<s>/last.ckpt, trees/epoch_NNNN.jsonl, results/x/y.*, report.md and running.md")
    assert broken_citations(text, ROOT / "docs") == ["shared/notes/x.md", "deepsearch.md"]


def test_every_path_the_docs_and_the_help_cite_exists(capsys, monkeypatch):
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").rglob("README.md")),
             *sorted((ROOT / "flywheel" / "assets").rglob("README.md"))]
    missing = [f"{page.relative_to(ROOT)}: {path}" for page in pages
               for path in broken_citations(page.read_text(encoding="utf-8"), page.parent)]
    for command in (["--help"], ["fit", "--help"], ["eval", "--help"], ["diagnose", "--help"], ["tree", "--help"],
                    ["report", "--help"]):
        missing += [f"{' '.join(command)}: {path}" for path in
                    broken_citations(help_text(command, capsys, monkeypatch), ROOT)]
    assert not missing, missing


def test_the_suite_s_size_is_stated_in_one_place():
    """The README states the default suite's size and time; docs/testing.md refers to it (the
    two had drifted apart: 1,100 tests in 9 minutes against 1,480 in 11)."""
    stated = {page.name: re.findall(r"about [\d,]+ tests", page.read_text(encoding="utf-8"))
              for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    assert {name: found for name, found in stated.items() if found} == {"README.md": stated["README.md"]}
    assert len(stated["README.md"]) == 1
    assert "(../README.md#tests)" in (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
