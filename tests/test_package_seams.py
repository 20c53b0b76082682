"""The package's seams stay narrow: no module imports another flywheel module's private
(underscore) name. A helper that a second file needs is part of its module's interface and
gets a public name; `from flywheel.x import _y` hides that seam."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flywheel", "data_modules", "callbacks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_from(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module an import reads, resolving `from .x import y` against the importer."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(text: str, importer: str, is_package: bool = False) -> list[str]:
    """`module: name` for every private name the module `importer` (source `text`) imports from
    another first-party module."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = imported_from(node, importer, is_package)
        if source.split(".")[0] not in PACKAGES or source == importer:
            continue
        found += [f"{source}: {alias.name}" for alias in node.names
                  if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def sources() -> list[Path]:
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    return files


def test_the_scan_sees_a_private_import():
    """The check itself: absolute and relative imports of a private name are caught; dunders,
    public names, third-party modules and a module's own names are not."""
    text = ("from flywheel.generation.decoding import _REASONS, ACTIVE\n"
            "from .base import Completion, _x\n"
            "from ..search.tree import _y\n"
            "from flywheel.generation.base import __all__\n"
            "from torch import _C\n"
            "from flywheel.generation.hf import _Row\n")
    assert private_imports(text, "flywheel.generation.hf") == [
        "flywheel.generation.decoding: _REASONS", "flywheel.generation.base: _x", "flywheel.search.tree: _y"]
    assert private_imports("from .decoding import _REASONS\n", "flywheel.generation", is_package=True) == [
        "flywheel.generation.decoding: _REASONS"]


@pytest.mark.parametrize("package", ["flywheel/generation", "flywheel/search"])
def test_the_search_and_generation_packages_are_scanned(package):
    assert any(p.relative_to(ROOT).as_posix().startswith(package + "/") for p in sources())


def test_no_module_imports_a_private_name_of_another():
    offenders = {}
    for path in sources():
        found = private_imports(path.read_text(), module_name(path), path.name == "__init__.py")
        if found:
            offenders[path.relative_to(ROOT).as_posix()] = found
    assert offenders == {}, "give these names a public name in their module: " + repr(offenders)
