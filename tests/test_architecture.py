"""The layering the docs describe (docs/architecture.md), checked from the source: no import
circles, counting imports inside functions and under `if TYPE_CHECKING` (a lazy import hides a
circle, it does not remove one), and the edges that must never exist: the pure core (search,
objectives, rewards) imports no Lightning, no HTTP and none of the glue; objectives and
generation stay out of each other's way and out of search's."""

from __future__ import annotations

import ast
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_package_seams import PACKAGES, imported_from, module_name

ROOT = Path(__file__).resolve().parents[1]


def sources() -> dict[str, Path]:
    """Every first-party module by its dotted name."""
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imports_of(text: str, importer: str, is_package: bool, known: set[str] | frozenset = frozenset()) -> set[str]:
    """Every module `importer` imports anywhere in its source: top level, inside functions,
    under TYPE_CHECKING. `from package import name` counts as an import of the submodule
    `package.name` where that is a module in `known`, else of `package` itself."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = imported_from(node, importer, is_package)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
    return found


def import_graph() -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports."""
    modules = sources()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        edges = imports_of(path.read_text(), name, path.name == "__init__.py", known)
        graph[name] = {e for e in edges if e in known and e != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_scan_sees_lazy_type_only_and_relative_imports():
    text = ("from typing import TYPE_CHECKING\n"
            "import flywheel.io\n"
            "if TYPE_CHECKING:\n    from flywheel.search.outputs import SearchResult\n"
            "def f():\n    from .tree import Node\n    from flywheel.search import tree\n")
    known = {"flywheel.io", "flywheel.search", "flywheel.search.outputs", "flywheel.search.tree"}
    assert imports_of(text, "flywheel.search.driver", False, known) >= {
        "flywheel.io", "flywheel.search.outputs", "flywheel.search.tree"}
    assert "flywheel.search" not in imports_of(text, "flywheel.search.driver", False, known)


def test_the_circle_finder_finds_a_circle_and_only_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set()}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    found = [sorted(c) for c in circles(import_graph())]
    assert found == [], "import circles (each needs one module split or one edge removed): " + repr(found)


def _reaches(graph: dict[str, set[str]], module: str, prefixes: tuple[str, ...]) -> list[str]:
    """The direct imports of `module` (first-party and third-party) that start with one of `prefixes`."""
    return sorted(e for e in graph[module] if any(e == p or e.startswith(p + ".") for p in prefixes))


def _all_imports() -> dict[str, set[str]]:
    modules = sources()
    return {name: imports_of(path.read_text(), name, path.name == "__init__.py", set(modules))
            for name, path in modules.items()}


GLUE = ("data_modules", "callbacks", "flywheel.run", "flywheel.module", "flywheel.reporting", "flywheel.__main__")
FRAMEWORKS = ("lightning", "pytorch_lightning", "urllib", "http", "requests", "aiohttp", "fastapi", "httpx")
NEVER = {
    # package: the imports it must never make (directly; anywhere in its source)
    "flywheel.search": GLUE + FRAMEWORKS + ("flywheel.objectives",),
    "flywheel.objectives": GLUE + FRAMEWORKS + ("flywheel.search", "flywheel.generation"),
    "flywheel.rewards": GLUE + FRAMEWORKS,
    "flywheel.generation": GLUE + ("flywheel.objectives", "flywheel.search"),
    "flywheel.sft": FRAMEWORKS + ("data_modules", "callbacks", "flywheel.module"),  # a plain loop, no Lightning
}


def test_the_verifiers_import_no_other_flywheel_package():
    """A verifier is text in, verdict out: flywheel.rewards stands alone."""
    graph = _all_imports()
    outside = {m: sorted(e for e in graph[m] if e.split(".")[0] in PACKAGES and not e.startswith("flywheel.rewards"))
               for m in graph if m.startswith("flywheel.rewards")}
    assert {m: e for m, e in outside.items() if e} == {}


@pytest.mark.parametrize("package", sorted(NEVER))
def test_a_package_never_makes_the_imports_its_layer_forbids(package):
    graph = _all_imports()
    broken = {m: _reaches(graph, m, NEVER[package]) for m in graph if m == package or m.startswith(package + ".")}
    assert {m: e for m, e in broken.items() if e} == {}


def rule_tables() -> dict:
    """Every rule table by its flag (flywheel.tables.FAMILIES), made by importing the modules that fill them."""
    import importlib

    from flywheel.tables import FAMILIES

    for module in ("flywheel.search", "flywheel.objectives.credit", "flywheel.objectives.losses"):
        importlib.import_module(module)
    return FAMILIES


@contextmanager
def tables_kept():
    """The rule tables restored as they were on entering (a test's or a plugin's rules removed,
    and the plugin module forgotten) when the block ends."""
    import sys

    tables = rule_tables()
    saved = {flag: (dict(table), dict(table.origin)) for flag, table in tables.items()}
    try:
        yield tables
    finally:
        sys.modules.pop("plugin_rules", None)
        for flag, (rules, origin) in saved.items():
            tables[flag].clear()
            tables[flag].update(rules)
            tables[flag].origin = origin


@contextmanager
def plugin_rules_loaded():
    """The tables with tests/plugin_rules.py's rules registered (one of every family, as
    `--plugins plugin_rules` loads them), restored to the library's own afterwards."""
    from flywheel.run.plugins import load_plugins

    with tables_kept() as tables:
        load_plugins(["--plugins", "plugin_rules"])
        yield tables


CREDIT_TABLE = r"(?m)^\| `([a-z_]+)`(?: \(default\))? \|"
"""A row of docs/credit.md's table of the credit rules."""


def documented_rules(tables: dict) -> list[tuple[str, str, str]]:
    """(file, flag, name) for every rule the docs and the README name: each `--flag=name` (or
    `--flag=a|b`) of a rule family's flag, and each row of docs/credit.md's table."""
    import re

    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for flag in tables:
            for value in re.findall(re.escape(flag) + r"=([a-z_|]+)", text):
                found += [(path.name, flag, name) for name in value.split("|") if name]
        if path.name == "credit.md":
            found += [(path.name, "--data.credit.advantage", name) for name in re.findall(CREDIT_TABLE, text)]
    return found


def test_every_rule_the_docs_name_is_registered():
    """No doc names a rule its table lacks (a renamed or deleted rule leaves no stale name), but
    no doc has to list a family's rules either: `--help` lists them from the tables, so a new
    rule is its function, its registration and its test. The docs' example plugin rule is
    tests/plugin_rules.py's."""
    with plugin_rules_loaded() as tables:
        named = documented_rules(tables)
        assert {flag for _, flag, _ in named} == set(tables)  # the scan sees every family
        assert [(doc, flag, name) for doc, flag, name in named if name not in tables[flag]] == []


def callback_scans(text: str) -> int:
    """How often a source reads a trainer's callback list: `<...>trainer.callbacks` or
    `getattr(<...>trainer, "callbacks", ...)`."""
    def is_trainer(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id.endswith("trainer")) or (
            isinstance(node, ast.Attribute) and node.attr.endswith("trainer"))

    count = 0
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr == "callbacks" and is_trainer(node.value):
            count += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and is_trainer(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and node.args[1].value == "callbacks"):
            count += 1
    return count


def test_the_callback_scan_finder_sees_both_spellings_and_not_a_flag():
    assert callback_scans("x = [c for c in trainer.callbacks]\ny = getattr(self.trainer, 'callbacks', None)\n") == 2
    assert callback_scans("flag = '--trainer.callbacks.init_args.dirpath'\n") == 0


SCANS_ALLOWED = {
    "flywheel.run.cli": "the wiring: it builds the callbacks and hands each part its peers",
    "callbacks.evaluation": "reads Lightning's own SaveConfigCallback for the config file's name",
    "flywheel.run.preemption": "a stop the Preemption callback deferred is the trainer's state, like Lightning's "
                               "received_sigterm, read by the search-ahead thread",
}


def test_no_part_finds_a_peer_by_scanning_the_trainer_s_callbacks():
    """The wiring (flywheel.run.cli) hands every part what it needs (the port, the run summary,
    the wall clock, the budget); a part that searches `trainer.callbacks` for a peer hides that seam."""
    readers = sorted(name for name, path in sources().items() if callback_scans(path.read_text()) and name not in SCANS_ALLOWED)
    assert readers == [], readers


LONG = 60
"""Code lines (the docstring not counted) a library function may have without saying why."""


def long_functions_without_a_reason() -> list[str]:
    found = []
    for name, path in sources().items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = node.body[0]
            doc = first if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str) else None
            code = node.end_lineno - node.lineno + 1 - (doc.end_lineno - doc.lineno + 1 if doc else 0)
            # the line after the docstring, or (none) the comment lines before the first statement
            top = [lines[doc.end_lineno]] if doc else lines[node.lineno - 1:node.body[0].lineno - 1]
            reason = any(line.strip().startswith("# Long: ") for line in top)
            if code > LONG and not reason:
                found.append(f"{name}.{node.name} ({code} lines)")
    return found


def test_every_long_function_says_why_at_its_top():
    """A function of more than LONG code lines is split into named steps, or says at its top
    (`# Long: ...`, right after its docstring) why it is one piece."""
    assert long_functions_without_a_reason() == []


def test_the_root_holds_only_the_entry_point_the_module_and_pure_utilities():
    loose = sorted(p.name for p in (ROOT / "flywheel").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "finite.py", "io.py", "logprobs.py", "module.py", "ports.py",
                     "tables.py"]
