"""The one registration mechanism of every rule family: a `Table` of rules by name.

    flywheel.search.rule_table   SELECTION, FORK, EXPANSION   --data.search.selection, .fork_rule, .expansion
    flywheel.objectives.credit   RULES, ROLLOUTS              --data.credit.advantage, --data.rollout
    flywheel.objectives.losses   LOSSES                       --model.objective.loss_type

A rule is any object with a `name` and a one-line `summary`; `TABLE.register(rule)` adds it. Settings hold a rule's name
as a plain string and check it against the table when they are built (`TABLE.check`), never
against a list frozen at import, so a rule registered by a user's own module is accepted by the
command line as a built-in one is. Such a module is imported before the command line is read
by `--plugins my_rules` or by an installed package's `flywheel.plugins` entry point
(flywheel.run.plugins).

A leaf: it imports nothing of flywheel, so the search and the objectives, which must not import
each other, both build their tables from it.
"""

from __future__ import annotations

import sys
from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    """What a table holds: a rule with its name and a one-line summary (for --help and messages)."""

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str: ...


R = TypeVar("R", bound=Named)


class Table(dict[str, R], Generic[R]):
    """The rules of one family by name, in registration order; the first is the default.

    A dict, so a test may add an entry for its own duration (`monkeypatch.setitem`) without
    `register`; such an entry is valid everywhere but is not one of the library's own
    (`library_names`).
    """

    def __init__(self, flag: str) -> None:
        super().__init__()
        self.flag = flag
        """The command-line flag that names a rule of this table, e.g. "--data.search.selection"."""
        self.origin: dict[str, str] = {}
        """The module that registered each rule (`library_names` reads it)."""
        FAMILIES[flag] = self

    def register(self, rule: R) -> R:
        """Add `rule` under its name (refused if the name is taken); returns it."""
        if rule.name in self:
            raise ValueError(f"a {self.flag} rule named {rule.name!r} is registered already")
        self[rule.name] = rule
        self.origin[rule.name] = sys._getframe(1).f_globals.get("__name__", "")
        return rule

    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def library_names(self) -> tuple[str, ...]:
        """The rules flywheel itself registered (what a test of every built-in rule runs); a rule
        from a plugin or a test is valid but not one of them."""
        return tuple(name for name in self if self.origin.get(name, "").split(".")[0] == "flywheel")

    def check(self, name: str) -> R:
        """The rule called `name`, or the one-line refusal naming the flag and the choices."""
        rule = self.get(name)
        if rule is None:
            raise ValueError(f"{self.flag} must be one of {self.names()}, got {name!r}; pick one of those, or "
                             "register a rule of your own under that name (--plugins, docs/running.md)")
        return rule


FAMILIES: dict[str, Table] = {}
"""Every rule table by its flag, filled as the tables are made (the importing of flywheel.search
and flywheel.objectives makes them all)."""
