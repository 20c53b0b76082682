"""The search's rule tables: every rule a `--data.search.*` flag names, by that name, with what
it needs declared on it. A leaf: it imports nothing of the search, so SearchConfig checks its
names here and the rules (which read SearchConfig) register themselves without a circle.

    SELECTION[config.selection]   step expansion: the node to expand next (§5), or, for a rule
                                  with `agents`, one agent's descent per round
    FORK[config.fork_rule]        rollout expansion: where the next rollouts start (and, with
                                  `cut`, where a new rollout is cut besides its steps)
    EXPANSION[config.expansion]   how an expansion grows a tree

The built-in rules are registered by flywheel.search.rules, which `flywheel.search` imports, so
the tables are full whenever anything of the package is. A new rule is one `register` call
(docs/search.md); the command line, SearchConfig's check and the docs read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class SearchRule:
    """One rule of a table. `run` has the signature of its table's kind: step_expansion.SelectionRule,
    live_agents.AgentDescent (a selection rule with `agents`), rollout.ForkSelection,
    rules.ExpansionModeBuilder."""

    name: str
    run: Callable[..., Any]
    summary: str = ""
    """One line for messages and docs."""
    agents: bool = False
    """Selection: several agents descend one tree per round (AgentDescent); one trajectory per tree."""
    needs_entropy: bool = False
    """The generator must return per-token entropies (`--data.search.entropy_top_k` >= 1)."""
    cut: Callable[..., Any] | None = None
    """Fork: also cuts every new rollout at fork points of its own (inside steps too)."""
    expansion: str | None = None
    """The expansion mode the rule works under (None: any)."""
    whole_rollouts: bool = False
    """Expansion: samples whole continuations (to EOS or max depth) that later rollouts fork from."""
    uses_value_head: bool = False
    """Selection: the policy's own value head scores the tree's nodes when the policy has one."""


class RuleTable(dict[str, SearchRule]):
    """The rules of one family, by name, in registration order (a dict: tests patch entries)."""

    def __init__(self, flag: str):
        super().__init__()
        self.flag = flag

    def register(self, rule: SearchRule) -> SearchRule:
        if rule.name in self:
            raise ValueError(f"a {self.flag} rule named {rule.name!r} is registered already")
        self[rule.name] = rule
        return rule

    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def check(self, name: str) -> SearchRule:
        """The rule called `name`, or the one-line refusal naming the flag and the choices."""
        rule = self.get(name)
        if rule is None:
            raise ValueError(f"--data.search.{self.flag} must be one of {self.names()}, got {name!r}; pick one of those")
        return rule


SELECTION = RuleTable("selection")
FORK = RuleTable("fork_rule")
EXPANSION = RuleTable("expansion")

TABLES: dict[str, RuleTable] = {table.flag: table for table in (SELECTION, FORK, EXPANSION)}
"""Every search rule family by the SearchConfig field that names its rule."""
