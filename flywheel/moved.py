"""Import paths of modules that moved into packages keep working until release `REMOVED_IN`:
importing `flywheel.checkpoint` (say) warns and hands back `flywheel.run.checkpoint` itself, so
old imports, old configs' class paths and pickles naming the old path still resolve. In
REMOVED_IN this module, its `install()` in flywheel/__init__.py and the meta-path hook go
(tests/test_moved_modules.py fails once the package's version reaches it)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

REMOVED_IN = "0.2.0"
"""The release that drops the old paths (README, "Layout")."""

MOVED = {
    "flywheel.checkpoint": "flywheel.run.checkpoint",
    "flywheel.command_line": "flywheel.run.command_line",
    "flywheel.deepspeed_config": "flywheel.run.deepspeed_config",
    "flywheel.distributed": "flywheel.run.distributed",
    "flywheel.preemption": "flywheel.run.preemption",
    "flywheel.preflight": "flywheel.run.preflight",
    "flywheel.renames": "flywheel.run.renames",
    "flywheel.run_settings": "flywheel.run.settings",
    "flywheel.policy": "flywheel.policies.load",
    "flywheel.policy_cache": "flywheel.policies.registry",
    "flywheel.policy_check": "flywheel.policies.check",
    "flywheel.tiny": "flywheel.policies.tiny",
    "flywheel.packing": "flywheel.training.packing",
    "flywheel.tree_attention": "flywheel.training.tree_attention",
    "flywheel.value_head": "flywheel.training.value_head",
    "flywheel.evaluation": "flywheel.reporting.evaluation",
    "flywheel.eval_command": "flywheel.reporting.eval_command",
    "flywheel.metrics": "flywheel.reporting.metrics",
    "flywheel.report": "flywheel.reporting.report",
    "flywheel.viewer": "flywheel.reporting.viewer",
    "flywheel.objectives.logprobs": "flywheel.logprobs",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new path (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in release {REMOVED_IN}",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """The module at the new path is already executed."""


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
