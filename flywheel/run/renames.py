"""Renamed settings: the one table of old flag names and their new homes, applied by the
command line before parsing, to command-line flags and to the YAML files of `--config`
alike, with a one-line warning naming the new flag.

The data module's settings were flat (`--data.advantage`, `--data.mini_batch_problems`, ...)
and are now grouped in sections (`--data.credit.*`, `--data.batching.*`, `--data.problems.*`);
the held-out evaluation's `--eval.at_start` joined the other evaluation settings under
`--data.eval.*`. A run's config file or command line from before keeps working. A section
that was removed (`REMOVED`) is dropped from a config file with a warning when it is empty,
and refused, naming it, when it holds a setting.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import yaml

log = logging.getLogger("flywheel.run.renames")

RENAMED: dict[str, str] = {
    **{f"data.{name}": f"data.problems.{name}" for name in (
        "train_files", "train_split", "max_train_problems", "eval_files", "eval_split", "max_eval_problems",
        "skip_bad_rows")},
    **{f"data.{name}": f"data.batching.{name}" for name in (
        "problems_per_epoch", "mini_batch_problems", "max_concurrent_trees", "flat_samples")},
    **{f"data.{name}": f"data.credit.{name}" for name in (
        "advantage", "normalize_std", "drop_uniform_groups", "degenerate_filter", "path_weights")},
    "eval.at_start": "data.eval.at_start",
}
"""Old dotted key -> new dotted key (a key names a setting or a whole section)."""

REMOVED: dict[str, str] = {
    "hard_set_refresh": "the hard-set refresh has no settings of its own: the round protocol runs it at every "
                        "round's end (--data.epochs_per_round), by the rule of --data.hard_set.*",
}
"""Top-level sections that no longer exist -> why."""


def renamed(key: str) -> str | None:
    """The new name of dotted `key` (or of the section it lies in), None when it was not renamed."""
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return None


def _warn(old: str, new: str, where: str) -> None:
    log.warning("%s: --%s was renamed --%s; use the new name (the old one will stop working)", where, old, new)


def rename_flags(argv: list[str]) -> list[str]:
    """`argv` with every renamed `--old.key[=value]` written with its new name, and every
    `--config FILE` whose YAML uses an old name replaced by the translated YAML."""
    out: list[str] = []
    config_next = False
    for arg in argv:
        if arg.startswith("--") and arg[2:].split("=", 1)[0].split(".", 1)[0] in REMOVED:
            _refuse(f"--{arg[2:].split('=', 1)[0]}:", "the command line")
        if config_next:
            out.append(rename_config_file(arg))
            config_next = False
            continue
        if arg == "--config":
            config_next = True
        elif arg.startswith("--config="):
            arg = "--config=" + rename_config_file(arg.split("=", 1)[1])
        elif arg.startswith("--") and (new := renamed(arg[2:].split("=", 1)[0])) is not None:
            old = arg[2:].split("=", 1)[0]
            _warn(old, new, "command line")
            arg = "--" + new + arg[2 + len(old):]
        out.append(arg)
    return out


def rename_config_file(path: str) -> str:
    """`path` itself when its YAML uses no old name (or cannot be read: the command line
    reports that), else the translated YAML as text (jsonargparse's `--config` takes either)."""
    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return path
    if not isinstance(config, dict):
        return path
    translated, moves = rename_config(config)
    for old, new in moves:
        _warn(old, new, path)
    removed = [key for key in REMOVED if key in translated]
    for key in removed:
        if translated.pop(key) not in (None, {}):
            _refuse(f"`{key}:` holds settings, but", path)
        log.warning("%s: the `%s:` section was removed (%s); delete it", path, key, REMOVED[key])
    return yaml.safe_dump(translated, sort_keys=False) if moves or removed else path


def _refuse(what: str, where: str) -> None:
    from flywheel.run.errors import PreflightError

    section = next(key for key in REMOVED if key in what)
    raise PreflightError(f"{where}: {what} the `{section}` section was removed ({REMOVED[section]}); delete it")


def rename_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A nested config with every old key moved to its new place (merged into a section that
    is already there; a value given under both names keeps the new name's), and the moves made."""
    out = _copy(config)
    moves = []
    for old, new in RENAMED.items():
        parent, leaf = _lookup(out, old.split(".")[:-1]), old.split(".")[-1]
        if parent is None or leaf not in parent:
            continue
        value = parent.pop(leaf)
        if not parent:
            _drop_empty(out, old.split(".")[:-1])
        *path, last = new.split(".")
        target = out
        for key in path:
            target = target.setdefault(key, {})
        if isinstance(value, dict) and isinstance(target.get(last), dict):
            target[last] = {**value, **target[last]}
        else:
            target.setdefault(last, value)
        moves.append((old, new))
    return out, moves


def rename_settings(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Flattened settings (`{"--data.advantage": "node"}`, flywheel.run.settings) with the new
    names: a checkpoint written before a rename compares with today's settings."""
    out = {}
    for key, value in flat.items():
        new = renamed(key[2:]) if key.startswith("--") else None
        out["--" + new if new else key] = value
    return out


def _copy(value: Any) -> Any:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def _lookup(config: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return config if isinstance(config, dict) else None


def _drop_empty(config: dict[str, Any], path: list[str]) -> None:
    """Remove the emptied section at `path` (a section of only old keys, e.g. `eval:`)."""
    parent = _lookup(config, path[:-1])
    if parent is not None and parent.get(path[-1]) == {}:
        del parent[path[-1]]
