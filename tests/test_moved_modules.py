"""The package root holds the entry point, the LightningModule, the data port and two pure utilities; the
modules that moved into packages (issue 34) still import by their old paths until flywheel.moved.REMOVED_IN,
warning, as the very module at the new path (old configs' class paths and pickles resolve)."""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path

import pytest

import flywheel
from flywheel.moved import MOVED

ROOT = Path(flywheel.__file__).parent


def test_the_root_holds_only_the_entry_point_the_module_and_pure_utilities():
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "finite.py", "io.py", "logprobs.py", "module.py", "moved.py", "ports.py"]


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_an_old_path_warns_and_is_the_new_module(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert not ROOT.joinpath(*old.split(".")[1:]).with_suffix(".py").exists()


def test_the_old_paths_go_in_their_stated_release():
    """The shim states when it goes; this fails once the package's version reaches that release,
    so the old paths cannot outlive it unnoticed."""
    from flywheel.moved import REMOVED_IN

    def release(text):
        return tuple(int(part) for part in text.split("."))

    assert release(flywheel.__version__) < release(REMOVED_IN), "remove flywheel/moved.py and its install()"
    assert f"until release {REMOVED_IN}" in (ROOT.parent / "README.md").read_text()


def test_a_pickle_naming_an_old_path_loads():
    from flywheel.reporting.evaluation import EvalConfig

    blob = pickle.dumps(EvalConfig(samples=3), protocol=2)
    old = blob.replace(b"flywheel.reporting.evaluation", b"flywheel.evaluation")
    assert old != blob
    sys.modules.pop("flywheel.evaluation", None)
    with pytest.warns(DeprecationWarning):
        loaded = pickle.loads(old)
    assert loaded == EvalConfig(samples=3)
