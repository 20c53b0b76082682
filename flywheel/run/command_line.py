"""The command line of `fit|validate|test`, checked before LightningCLI parses it.

LightningCLI (jsonargparse) would accept some command lines that run badly, and reports
others after a usage dump of some 200 lines, or with the YAML text's `<unicode string>` in
place of the file's name (issues 22 and 37). Here every `--config` file (and every YAML file
given as a setting's value) is read first and a problem is one line naming the file and its
line; `-c` is `--config`; and what jsonargparse still refuses becomes one line too
(`parse_error_line`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml

from flywheel.run.flags import option_strings, suggestion
from flywheel.run.errors import PreflightError

LOG_LEVEL_VARIABLE = "FLYWHEEL_LOG_LEVEL"
RECIPE_KEY = "seed_everything"
"""A file that sets this is a whole recipe (conf/quickstart.yaml); a file without it modifies one
(an overlay, conf/dapo.yaml)."""
NESTED_SUFFIXES = (".yaml", ".yml")


def long_config_flags(argv: list[str]) -> list[str]:
    """`argv` with `-c FILE`, `-c=FILE` and `-cFILE` (argparse's short form of `--config`)
    written `--config FILE`, so every check that follows sees one spelling."""
    out: list[str] = []
    for arg in argv:
        if arg == "-c":
            out.append("--config")
        elif arg.startswith("-c") and not arg.startswith("--"):
            out += ["--config", arg[3:] if arg.startswith("-c=") else arg[2:]]
        else:
            out.append(arg)
    return out


def config_files(argv: list[str]) -> list[str]:
    """The `--config` files of `argv` (after `long_config_flags`), in order."""
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"] + [
        a.split("=", 1)[1] for a in argv if a.startswith("--config=")]


def check_log_level(value: str | None) -> str:
    """The logging level of `FLYWHEEL_LOG_LEVEL` (default INFO), or a one-line error."""
    level = (value or "INFO").strip().upper()
    if not isinstance(logging.getLevelName(level), int):
        raise PreflightError(f"{LOG_LEVEL_VARIABLE}={value}: not a logging level; use DEBUG, INFO, WARNING or ERROR")
    return level


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file's contents, or a one-line error naming `what` (the flag), the file and its line."""
    if not path.exists():
        raise PreflightError(f"{what} {path}: no such file")
    if path.is_dir():
        raise PreflightError(f"{what} {path} is a folder; pass a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PreflightError(f"{what} {path}: not a YAML text file (not UTF-8 at byte {err.start})") from None
    except OSError as err:
        raise PreflightError(f"{what} {path}: cannot be read ({err.strerror or err})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise PreflightError(f"{what} {where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None


def _keys(config: Any, prefix: str = "") -> Iterator[str]:
    """The dotted keys of every leaf setting of a nested config."""
    if isinstance(config, dict) and config:
        for key, value in config.items():
            yield from _keys(value, f"{prefix}.{key}" if prefix else str(key))
    elif prefix:
        yield prefix


def _nested_files(value: Any, base: Path) -> Iterator[Path]:
    """YAML files named as a setting's value (jsonargparse loads them as nested configs)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _nested_files(item, base)
    elif isinstance(value, list):
        for item in value:
            yield from _nested_files(item, base)
    elif isinstance(value, str) and value.endswith(NESTED_SUFFIXES):
        for candidate in (Path(value), base / value):
            if candidate.is_file():
                yield candidate
                break


def check_configs(argv: list[str]) -> None:
    """Every `--config` file: a readable, valid, non-empty YAML mapping (else one line naming
    the file and line); YAML files given as values, in them or on the command line, parse; and
    a whole recipe does not come after a file whose settings it would replace."""
    earlier: list[tuple[str, set[str]]] = []
    for name in config_files(argv):
        config = read_yaml(Path(name), "--config")
        if config is None:
            raise PreflightError(f"--config {name}: the file holds no settings (empty, or only comments); "
                                 "remove it from the command line or add settings")
        if not isinstance(config, dict):
            raise PreflightError(f"--config {name}: expected settings (`section: value` lines), got a YAML "
                                 f"{type(config).__name__}")
        for nested in _nested_files(config, Path(name).parent):
            read_yaml(nested, f"{name}: nested config")
        keys = set(_keys(config))
        if RECIPE_KEY in config:
            for before, before_keys in earlier:
                replaced = sorted(before_keys & keys)
                if replaced:
                    raise PreflightError(
                        f"--config {name} is a whole recipe (it sets {RECIPE_KEY}) given after --config {before}, "
                        f"whose settings it replaces ({', '.join(replaced[:3])}{', ...' if len(replaced) > 3 else ''}); "
                        f"overlays go after the recipe they modify: --config {name} --config {before}")
        earlier.append((name, keys))
    flag = None
    for arg in argv:  # `--data.search=s.yaml` or `--data.search s.yaml`
        name, _, value = arg.partition("=") if arg.startswith("--") else (flag, "", arg)
        flag = arg if arg.startswith("--") and "=" not in arg else None
        if name != "--config" and value.endswith(NESTED_SUFFIXES) and Path(value).is_file():
            read_yaml(Path(value), f"{name}: nested config" if name else "nested config")


def parse_error_line(message: str, subcommand: str | None, known: Iterable[str] = ()) -> str:
    """jsonargparse's error (several lines: a Union's subtypes, the YAML parser's marks) as one
    line naming the flag, with the closest of the `known` flags to an unknown one
    (flywheel.run.flags) and where the options are listed."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        lines = ["cannot parse the command line"]
    head = lines[0]
    key = re.match(r'Parser key "([^"]+)":\s*(.*)', head)
    if key:
        flag, rest = f"--{key.group(1)}", [key.group(2)] if key.group(2) else []
        rest += lines[1:]
        given = next((line.split(":", 1)[1].strip() for line in rest if line.startswith("Given value:")), None)
        subtypes = next((line.split(":", 1)[1].strip() for line in rest if line.startswith("Subtypes:")), None)
        why = (f"expected one of {subtypes}" if subtypes else
               "; ".join(line for line in rest if "<unicode string>" not in line and not line.startswith("-"))[:300])
        head = f"{flag}{'=' + given if given is not None else ''}: {why or 'invalid value'}"
    help_command = f"python -m flywheel {subcommand} --help" if subcommand else "python -m flywheel --help"
    return f"{head}{suggestion(message, known)} (`{help_command}` lists every option)"


def function_cli(function: Callable[..., Any], args: list[str], command: str) -> Any:
    """Run `function` with its keyword arguments from `args` as flags (jsonargparse, no
    abbreviations: flywheel.run.flags); a bad command line is one PreflightError line naming
    the flag, the closest known flag to an unknown one, and `python -m flywheel COMMAND --help`."""
    from argparse import ArgumentError

    from jsonargparse import CLI

    strict = {"as_positional": False, "exit_on_error": False, "allow_abbrev": False}
    try:
        return CLI(function, args=args, **strict)
    except ArgumentError as err:  # one line, not jsonargparse's usage dump
        parser = CLI(function, args=[], return_parser=True, **strict)
        raise PreflightError(parse_error_line(str(err), command, option_strings(parser))) from None
