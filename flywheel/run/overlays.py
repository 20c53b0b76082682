"""Overlays: config files that modify a recipe (conf/dapo.yaml, conf/data/gsm8k.yaml) rather
than state a whole run (conf/quickstart.yaml sets `seed_everything`; an overlay does not).

Two places they went wrong: given alone, `fit --config conf/dapo.yaml` started a run of the
defaults for everything the overlay leaves out (no seed, 1000 epochs, 32,000 problems
screened); it is refused here, naming the recipes it can follow, as an overlay after its
recipe's replacement is refused (flywheel.run.command_line.check_configs). And `eval` and
`diagnose` refused a fit overlay's `data.*` keys, so a run's problem shape had to be retyped as
`--task.init_args.*` and `--columns.*`; here the settings they share with fit are translated.
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any, Callable

import yaml

from flywheel.run.command_line import RECIPE_KEY, check_configs, config_files, long_config_flags, read_yaml
from flywheel.run.errors import PreflightError

log = logging.getLogger(__name__)

SHARED_WITH_FIT = {"task": ("data", "task"), "columns": ("data", "problems", "columns"), "grading": ("data", "grading")}
"""A command's argument -> where a fit config holds the same setting."""

FIT_SECTIONS = frozenset({RECIPE_KEY, "model", "data", "trainer", "budget", "prm_update", "ckpt_path"})
"""Top-level keys that make a config file one written for `fit` (`eval`'s own files hold `task:`, `samples:`)."""


# ---------------------------------------------------------------------- an overlay given alone
def refuse_an_overlay_alone(argv: list[str]) -> None:
    """`fit --config OVERLAY` with no whole recipe among the `--config` files: one line naming
    the recipes beside the overlay that it can follow, with the command in the right order.
    Run after check_configs (every file is a readable mapping by then)."""
    names = config_files(argv)
    if not names or any(RECIPE_KEY in read_yaml(Path(name), "--config") for name in names):
        return
    first = names[0]
    recipes = recipes_for(first)
    example = next((r for r in recipes if Path(r).name in Path(first).read_text(encoding="utf-8")),
                   recipes[0] if recipes else "RECIPE.yaml")
    overlays = " ".join(f"--config {name}" for name in names)
    which = (f"{'it' if len(names) == 1 else first} can follow {', '.join(recipes)}" if recipes else
             f"a recipe is a file that sets {RECIPE_KEY}, e.g. conf/quickstart.yaml")
    raise PreflightError(
        f"{overlays}: {'an overlay' if len(names) == 1 else 'overlays'} (no {RECIPE_KEY}: "
        f"{'it modifies' if len(names) == 1 else 'they modify'} a recipe), and no recipe is given, so the run would take "
        f"the defaults for the rest (no seed, 1000 epochs, every problem screened); give the recipe first: "
        f"--config {example} {overlays} ({which})")


def recipes_for(overlay: str) -> list[str]:
    """The whole recipes in `overlay`'s folder (or the one above it: conf/data/*.yaml are
    overlays of conf/*.yaml) that it can follow: every one, or where the overlay sets
    `data.task.class_path`, those of the same task (conf/data/*.yaml follow MathTask recipes)."""
    task = task_class(read_yaml(Path(overlay), "--config"))
    folder = Path(overlay).parent
    for place in dict.fromkeys((folder, folder.parent)):
        found = []
        for path in sorted(place.glob("*.yaml")):
            try:
                recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            if isinstance(recipe, dict) and RECIPE_KEY in recipe and task in (None, task_class(recipe)):
                found.append(str(path))
        if found:
            return found
    return []


def task_class(config: Any) -> str | None:
    """The class name of the task a config sets (`data.task.class_path`, or `data.task: NAME`), or None."""
    task = section(config, ("data", "task"))
    path = task.get("class_path") if isinstance(task, dict) else task
    return path.rsplit(".", 1)[-1] if isinstance(path, str) else None


def section(config: Any, keys: tuple[str, ...]) -> Any:
    """`config[keys[0]][keys[1]]...`, or None where a key is missing."""
    for key in keys:
        config = config.get(key) if isinstance(config, dict) else None
    return config


# ---------------------------------------------------------------------- fit configs for eval and diagnose
def fit_config_flags(args: list[str], function: Callable[..., Any], command: str) -> list[str]:
    """`args` of `command` (eval, diagnose) with every `--config FILE` written for fit (a
    recipe or an overlay) replaced, in place, by the command's own flags for the settings it
    shares with fit (SHARED_WITH_FIT: `data.task` -> `--task`, `data.problems.columns` ->
    `--columns`, `data.grading` -> `--grading`); later flags still override them. The
    file's other settings are fit's: one log line names them. Files in the command's own
    shape pass unchanged; a file that does not parse is one line naming it and its line."""
    args = long_config_flags(args)
    check_configs(args)
    args = [part for arg in args for part in (["--config", arg.split("=", 1)[1]] if arg.startswith("--config=") else [arg])]
    shared = {name: keys for name, keys in SHARED_WITH_FIT.items() if name in inspect.signature(function).parameters}
    out: list[str] = []
    i = 0
    while i < len(args):
        config = read_yaml(Path(args[i + 1]), "--config") if args[i] == "--config" and i + 1 < len(args) else None
        if not (isinstance(config, dict) and FIT_SECTIONS & set(config)):
            out.append(args[i])
            i += 1
            continue
        out += shared_flags(config, shared)
        unused = sorted(set(leaf_keys(config)) - {k for keys in shared.values()
                                                  for k in leaf_keys(section(config, keys), ".".join(keys))})
        if unused:
            log.info("--config %s: %s takes %s from it; the rest is fit's and not used here: %s%s", args[i + 1],
                     command, ", ".join(".".join(keys) for keys in shared.values()), ", ".join(unused[:6]),
                     ", ..." if len(unused) > 6 else "")
        i += 2
    return out


def shared_flags(config: dict[str, Any], shared: dict[str, tuple[str, ...]]) -> list[str]:
    """The command's flags for the settings of a fit `config` it shares (`shared`: flag -> keys
    in the config), each section as one JSON value (`--columns={"problem": "question"}`): its
    strings reach the parser exactly (a prompt's leading space, a "\\n" delimiter), and it
    layers on what came before as a config file does (the same task class keeps its other
    init_args, the columns it does not name keep theirs)."""
    flags = []
    for flag, keys in shared.items():
        value = section(config, keys)
        if value is not None:
            flags.append(f"--{flag}={value if isinstance(value, str) else json.dumps(value)}")
    return flags


def leaf_keys(value: Any, prefix: str = "") -> list[str]:
    """The dotted keys of every leaf setting of a nested config."""
    if isinstance(value, dict) and value:
        return [k for key, item in value.items() for k in leaf_keys(item, f"{prefix}.{key}" if prefix else str(key))]
    return [prefix] if prefix else []
