"""The command line of `fit|validate|test`, checked before LightningCLI parses it.

LightningCLI (jsonargparse) would accept some command lines that run badly, and reports
others after a usage dump of some 200 lines, or with the YAML text's `<unicode string>` in
place of the file's name (issues 22 and 37). Here every `--config` file (and every YAML file
given as a setting's value) is read first and a problem is one line naming the file and its
line; `-c` is `--config`; and what jsonargparse still refuses becomes one line too
(`parse_error_line`).
"""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml

from flywheel.run.flags import closest, option_strings, suggestion
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
    line naming the flag, with the closest of the `known` flags to an unknown one, or of the
    choices to a value a Literal refuses (flywheel.run.flags), and where the options are listed."""
    raw = [line for line in str(message).splitlines() if line.strip()]
    head = _refusal(raw) if raw else "cannot parse the command line"
    help_command = f"python -m flywheel {subcommand} --help" if subcommand else "python -m flywheel --help"
    return f"{head}{suggestion(message, known)} (`{help_command}` lists every option)"


_KEY = re.compile(r'Parser key "([^"]+)":\s*(.*)')
_LITERAL = re.compile(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*)")
_NESTED = re.compile(r"Given value: NestedArg\(key='([^']*)', val=(.*)\)$")


def _refusal(raw: list[str], flag: str | None = None) -> str:
    """The one line for jsonargparse's refusal `raw` (its lines, indented as given); `flag`: the
    setting it is about when its first line names only the key inside a class."""
    key = _KEY.match(raw[0].strip())
    if not key:
        return raw[0].strip()
    flag = flag or f"--{key.group(1)}"
    rest = ([key.group(2)] if key.group(2) else []) + raw[1:]
    lines = [line.strip() for line in rest]
    return _nested_setting(flag, rest) or _literal_choice(flag, lines) or _setting_line(flag, lines)


def _literal_choice(flag: str, lines: list[str]) -> str | None:
    """`--x=valeu: must be one of value, other; did you mean value?` for a Literal's refusal."""
    refused = next((m for line in lines if (m := _LITERAL.search(line))), None)
    if refused is None:
        return None
    choices = [c.strip().strip("'\"") for c in refused.group(1).split(",")]
    given = refused.group(2).strip()
    meant = closest(given, choices)
    return f"{flag}={given}: must be one of {', '.join(choices)}" + (f"; did you mean {meant}?" if meant else "")


def _nested_setting(flag: str, rest: list[str]) -> str | None:
    """One line for `--x.init_args.key=value` refused: the class's own refusal of the setting, or,
    with no class to set it on, the flag that names one."""
    nested = next((m for line in rest if (m := _NESTED.search(line.strip()))), None)
    if nested is None:
        return None
    key, value = nested.group(1), nested.group(2).strip().strip("'\"")
    setting = f"{flag}.init_args.{key.removeprefix('init_args.')}"
    at = next((i for i, line in enumerate(rest) if line.strip().startswith("- Problem with given class_path")), None)
    if at is None:
        base = re.search(r"Subtypes: \[<class '([\w.]+)'>", "\n".join(rest))
        kind = f" (a subclass of {base.group(1).rsplit('.', 1)[-1]})" if base else ""
        return (f"{setting}={value}: {flag} names no class to set {key!r} on; give it first, {flag}=CLASS{kind}, "
                f"then {setting}=...")
    owner, depth = rest[at].strip().split("'"), len(rest[at]) - len(rest[at].lstrip())
    inner = list(itertools.takewhile(lambda line: len(line) - len(line.lstrip()) > depth, rest[at + 1:]))
    why = _refusal(inner, setting) if inner else "invalid value"
    return why if why.startswith(setting) else f"{setting}={value}: {why} ({owner[1] if len(owner) > 2 else 'the class'})"


def _setting_line(flag: str, lines: list[str]) -> str:
    """jsonargparse's refusal of `flag`'s value: the Union's subtypes, or its first lines."""
    given = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")), None)
    subtypes = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Subtypes:")), None)
    why = (f"expected one of {subtypes}" if subtypes else
           "; ".join(line for line in lines if "<unicode string>" not in line and not line.startswith("-"))[:300])
    return f"{flag}{'=' + given if given is not None else ''}: {why or 'invalid value'}"


IMPLIED_CLASSES = {
    "generator": "flywheel.generation.backends.HFBackend",
    "task": "flywheel.tasks.countdown.CountdownTask",
}
"""The class a command's parameter of this name stands for when left None (`eval`'s and
`diagnose`'s in-process generator and Countdown task): its settings alone
(`--generator.init_args.dtype=bfloat16`) configure that class."""


def implied_classes(args: list[str], parameters: Iterable[str]) -> list[str]:
    """`args` with `--NAME=CLASS` first for each `IMPLIED_CLASSES` parameter among `parameters`
    that `args` gives settings of (`--NAME.KEY=...`) but no class (`--NAME=...`,
    `--NAME.class_path=...`). First, so a `--config` file that names a class still wins."""
    implied = []
    for name in IMPLIED_CLASSES.keys() & set(parameters):
        flag = f"--{name}"
        names = [a.split("=", 1)[0] for a in args if a.startswith(flag)]
        settings = [n for n in names if n.startswith(flag + ".") and n not in (f"{flag}.help", f"{flag}.class_path")]
        if settings and flag not in names and f"{flag}.class_path" not in names:
            implied.append(f"{flag}={IMPLIED_CLASSES[name]}")
    return [*sorted(implied), *args]


def function_cli(function: Callable[..., Any], args: list[str], command: str) -> Any:
    """Run `function` with its keyword arguments from `args` as flags (jsonargparse, no
    abbreviations: flywheel.run.flags; `IMPLIED_CLASSES`); a bad command line is one PreflightError
    line naming the flag, the closest known flag to an unknown one, and `python -m flywheel COMMAND --help`."""
    import inspect
    from argparse import ArgumentError

    from jsonargparse import CLI

    strict = {"as_positional": False, "exit_on_error": False, "allow_abbrev": False,
              "prog": f"python -m flywheel {command}"}
    args = implied_classes(args, inspect.signature(function).parameters)
    try:
        return CLI(function, args=args, **strict)
    except ArgumentError as err:  # one line, not jsonargparse's usage dump
        parser = CLI(function, args=[], return_parser=True, **strict)
        raise PreflightError(parse_error_line(str(err), command, option_strings(parser))) from None
