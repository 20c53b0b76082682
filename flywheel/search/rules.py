"""The search's built-in rules, registered once in the rule tables (flywheel.search.rule_table)
under their config names (mctx-style: a rule is an injected function; no tree branches on a
rule's name).

    SELECTION[config.selection]   step expansion: the node to expand next (§5); `agents`: one
                                  agent's descent per round (several agents per tree)
    FORK[config.fork_rule]        rollout expansion: where the next rollouts start (`cut`: where
                                  a new rollout is cut besides its steps)
    EXPANSION[config.expansion]   how an expansion grows a tree, its rule resolved

A new rule is a function with its kind's signature (`SelectionRule`, `AgentDescent`,
`ForkSelection`, `ExpansionModeBuilder`: SearchRule says where each is) registered under a new
name with `SearchRule` and what it needs: one registration, which SearchConfig, the command
line and the docs read (docs/search.md; tests/test_search_rules_injected.py registers one from
the test alone).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from flywheel.search.agents import agent_descend
from flywheel.search.config import SearchConfig
from flywheel.search.live import ExpansionMode
from flywheel.search.entropy_forks import cut_at_entropy, fork_entropy
from flywheel.search.rollout import RolloutExpansion, fork_random, fork_root, fork_uct
from flywheel.search.rule_table import EXPANSION, FORK, SELECTION, SearchRule
from flywheel.search.selection import descend_puct, descend_uct, local_uct_select, select_frontier
from flywheel.search.step_expansion import StepExpansion
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec


def frontier(tree: SearchTree, expanded: int, produced_terminal: bool, config: SearchConfig,
             rng: random.Random) -> int | None:
    """The paper's default (§5): local UCT among the children of the node just expanded while
    expansions produce no terminal, the global frontier score after one does."""
    if not produced_terminal:
        child = local_uct_select(tree, expanded, config, rng)
        if child is not None:
            return child
    return select_frontier(tree, config)


def vanilla_uct(tree: SearchTree, expanded: int, produced_terminal: bool, config: SearchConfig,
                rng: random.Random) -> int | None:
    """Table 3's baseline: local UCT while no terminal appears, then UCT again from the root."""
    if not produced_terminal:
        child = local_uct_select(tree, expanded, config, rng)
        if child is not None:
            return child
    return descend_uct(tree, config, rng)


def puct(tree: SearchTree, expanded: int, produced_terminal: bool, config: SearchConfig,
         rng: random.Random) -> int | None:
    """The Countdown reference: from the root by pUCT with sequence-level priors, every time."""
    return descend_puct(tree, config)


def puct_agent(tree: SearchTree, pending: Sequence[int], config: SearchConfig) -> int | None:
    """The seed's Countdown MCTS (rest-mcts-and-countdown.md §B): pUCT with virtual loss."""
    return agent_descend(tree, pending, config.puct_c, config.agents.virtual_loss)


SELECTION.register(SearchRule("frontier", frontier, "local UCT until a terminal, then the global frontier score (§5)"))
SELECTION.register(SearchRule("vanilla_uct", vanilla_uct, "local UCT until a terminal, then UCT from the root (Table 3)"))
SELECTION.register(SearchRule("puct", puct, "pUCT from the root with sequence-level priors"))
SELECTION.register(SearchRule("puct_agents", puct_agent, "agents sharing one pUCT tree with virtual loss",
                              agents=True, expansion="step", uses_value_head=True))
FORK.register(SearchRule("uct", fork_uct, "argmax of Q + UCT bonus (+ value) over the open nodes"))
FORK.register(SearchRule("random", fork_random, "uniform over the open nodes"))
FORK.register(SearchRule("root", fork_root, "always the root: flat sampling with the tree's stopping rules"))
FORK.register(SearchRule("entropy", fork_entropy, "TreeRL's EPTree: the untried highest-entropy cut",
                         needs_entropy=True, cut=cut_at_entropy))

EndsStep = Callable[[Sequence[int]], bool]


def step_mode(config: SearchConfig, step: StepSpec, ends_step: EndsStep) -> StepExpansion:
    """n steps of a node per expansion, the next node by the selection rule (§1, §5)."""
    return StepExpansion(SELECTION[config.selection].run)


def rollout_mode(config: SearchConfig, step: StepSpec, ends_step: EndsStep) -> RolloutExpansion:
    """n whole continuations of a node per expansion, the next node by the fork rule."""
    fork = FORK[config.fork_rule]
    return RolloutExpansion(fork.run, step, ends_step, fork.cut)


ExpansionModeBuilder = Callable[[SearchConfig, StepSpec, EndsStep], ExpansionMode]
"""config, the task's step, `ends_step` (does a step end with its last token; rollout expansion
cuts continuations into steps with it) -> the ExpansionMode of a LiveTree, built once per driver."""

EXPANSION.register(SearchRule("step", step_mode, "n single steps of a leaf per expansion (§1, the paper)"))
EXPANSION.register(SearchRule("rollout", rollout_mode, "n whole continuations of any open node per expansion",
                              whole_rollouts=True))
