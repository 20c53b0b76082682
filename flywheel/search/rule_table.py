"""The search's rule tables: every rule a `--data.search.*` flag names, by that name, with what
it needs declared on it. A leaf of the search: it imports nothing of it, so SearchConfig checks its names here and the
rules (which read SearchConfig) register themselves without a circle. The tables are
flywheel.tables.Table, the one registration mechanism of every rule family.

    SELECTION[config.selection]   step expansion: the node to expand next (§5), or, for a rule
                                  with `agents`, one agent's descent per round
    FORK[config.fork_rule]        rollout expansion: where the next rollouts start (and, with
                                  `cut`, where a new rollout is cut besides its steps)
    EXPANSION[config.expansion]   how an expansion grows a tree

The built-in rules are registered by flywheel.search.rules, which `flywheel.search` imports, so
the tables are full whenever anything of the package is. A new rule is one `register` call
(docs/running.md, "A rule of your own"); the command line, SearchConfig's check and the docs read
the same table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from flywheel.tables import Table


@dataclass(frozen=True)
class SearchRule:
    """One rule of a table. `run`, its settings bound (`bind`), has the signature of its table's
    kind: step_expansion.SelectionRule, live_agents.AgentDescent (a selection rule with `agents`),
    rollout.ForkSelection; an expansion's `run` is a rules.ExpansionModeBuilder, which binds the
    rules it grows the tree by."""

    name: str
    run: Callable[..., Any]
    summary: str = ""
    """One line for messages and docs."""
    settings: Callable[[Any], Any] | None = None
    """SearchConfig -> the rule's own settings (a small frozen dataclass), passed to `run` (and
    `cut`) as their first argument; None: the rule takes none."""
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

    def bind(self, config: Any) -> Callable[..., Any]:
        """`run` with the rule's settings, read from the SearchConfig `config`, bound once (mctx binds
        its policies' hyperparameters the same way): what a tree calls every round."""
        return self.run if self.settings is None else functools.partial(self.run, self.settings(config))

    def bind_cut(self, config: Any) -> Callable[..., Any] | None:
        """`cut` with the same settings as `run` bound; None for a rule that does not cut."""
        if self.cut is None or self.settings is None:
            return self.cut
        return functools.partial(self.cut, self.settings(config))


SELECTION: Table[SearchRule] = Table("--data.search.selection")
FORK: Table[SearchRule] = Table("--data.search.fork_rule")
EXPANSION: Table[SearchRule] = Table("--data.search.expansion")

TABLES: dict[str, Table[SearchRule]] = {"selection": SELECTION, "fork_rule": FORK, "expansion": EXPANSION}
"""Every search rule family by the SearchConfig field that names its rule."""
