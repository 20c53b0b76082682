"""A user's own rules, loaded before the command line is read: `--plugins my_rules` imports the
module `my_rules` (several: `--plugins a,b` or the flag twice), and every installed package's
`flywheel.plugins` entry point is imported on every start. Such a module registers rules in the
tables (flywheel.tables: a selection or fork rule, an expansion mode, a credit rule, a rollout
kind, a loss), which the command line then accepts as it accepts the library's own.

A run that names a plugin's rule needs the plugin again to resume (its saved settings name the
rule): give the same `--plugins`, or install it as an entry point.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import entry_points

from flywheel.run.errors import PreflightError

FLAG = "--plugins"
ENTRY_POINT_GROUP = "flywheel.plugins"


def plugin_modules(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the modules `--plugins` names, in order; argv without the flag and its values)."""
    modules: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == FLAG:
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                raise PreflightError(f"{FLAG} needs the module(s) to import: {FLAG} my_rules (a my_rules.py in the "
                                     f"current folder, or any importable module), or {FLAG} a,b")
            value, i = argv[i + 1], i + 2
        elif arg.startswith(FLAG + "="):
            value, i = arg[len(FLAG) + 1:], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        modules += [name.strip() for name in value.split(",") if name.strip()]
    return modules, rest


def load_plugins(argv: list[str]) -> list[str]:
    """Import the installed `flywheel.plugins` entry points, then the modules `--plugins` names;
    returns argv without the flag. A module that cannot be imported is one line naming it."""
    modules, rest = plugin_modules(argv)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as err:  # a broken plugin is named, not a traceback from inside importlib
            raise PreflightError(f"the installed plugin {entry.name!r} ({entry.value}, entry point group "
                                 f"{ENTRY_POINT_GROUP}) failed to load: {type(err).__name__}: {err}") from err
    if modules and os.getcwd() not in sys.path and "" not in sys.path:  # the `flywheel` script, not `python -m`
        sys.path.append(os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:
            raise PreflightError(f"{FLAG} {name}: the module could not be imported ({type(err).__name__}: {err}); "
                                 "name an importable module (a file my_rules.py in the current folder is "
                                 f"`{FLAG} my_rules`)") from err
    return rest
