"""The search's built-in rules, registered once in the rule tables (flywheel.search.rule_table)
under their config names (mctx-style: a rule is a function with its own settings bound and
injected; no tree branches on a rule's name).

    SELECTION[config.selection]   step expansion: the node to expand next (§5); `agents`: one
                                  agent's descent per round (several agents per tree)
    FORK[config.fork_rule]        rollout expansion: where the next rollouts start (`cut`: where
                                  a new rollout is cut besides its steps)
    EXPANSION[config.expansion]   how an expansion grows a tree, its rule bound

A rule reads only its own settings, a small frozen dataclass (selection.UctSettings,
FrontierSettings, PuctSettings, ForkSettings, ...); the `*_settings` functions below are the one
place that reads them off SearchConfig's flags, and `SearchRule.bind` passes them to the rule once
per search. A new rule is a function with its kind's signature (`SelectionRule`, `AgentDescent`,
`ForkSelection`, `ExpansionModeBuilder`: SearchRule says where each is), after its settings if it
has any, registered under a new name with `SearchRule`: one registration, which SearchConfig, the
command line and the docs read (docs/search.md; tests/test_search_rules_injected.py registers one
from the test alone).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from flywheel.search.agents import AgentPuctSettings, agent_descend
from flywheel.search.config import SearchConfig
from flywheel.search.entropy_forks import EntropyForkSettings, cut_at_entropy, fork_entropy
from flywheel.search.live import ExpansionMode
from flywheel.search.rollout import RolloutExpansion, UctForkSettings, fork_random, fork_root, fork_uct
from flywheel.search.rule_table import EXPANSION, FORK, SELECTION, SearchRule
from flywheel.search.selection import (
    ForkSettings,
    FrontierSettings,
    PuctSettings,
    UctSettings,
    descend_puct,
    descend_uct,
    local_uct_select,
    select_frontier,
)
from flywheel.search.step_expansion import StepExpansion
from flywheel.search.tree import SearchTree
from flywheel.tasks.base import StepSpec


def uct_settings(config: SearchConfig) -> UctSettings:
    return UctSettings(config.uct_lambda, config.prm_weight, config.ablations.uct_sampling)


def frontier_settings(config: SearchConfig) -> FrontierSettings:
    return FrontierSettings(config.frontier_lambda1, config.frontier_lambda2, config.frontier_lambda3,
                            config.ablations.depth_bonus, config.max_depth, config.prm_weight, uct_settings(config))


def puct_settings(config: SearchConfig) -> PuctSettings:
    return PuctSettings(config.puct_c, config.prm_weight)


def agent_settings(config: SearchConfig) -> AgentPuctSettings:
    return AgentPuctSettings(config.puct_c, config.agents.virtual_loss)


def fork_settings(config: SearchConfig) -> ForkSettings:
    return ForkSettings(config.max_depth, config.rollout.max_children)


def uct_fork_settings(config: SearchConfig) -> UctForkSettings:
    return UctForkSettings(fork_settings(config), uct_settings(config))


def entropy_fork_settings(config: SearchConfig) -> EntropyForkSettings:
    return EntropyForkSettings(fork_settings(config), config.rollout.entropy_forks_per_chain)


def frontier(settings: FrontierSettings, tree: SearchTree, expanded: int, produced_terminal: bool,
             rng: random.Random) -> int | None:
    """The paper's default (§5): local UCT among the children of the node just expanded while
    expansions produce no terminal, the global frontier score after one does."""
    if not produced_terminal:
        child = local_uct_select(tree, expanded, settings.local, rng)
        if child is not None:
            return child
    return select_frontier(tree, settings)


def vanilla_uct(settings: UctSettings, tree: SearchTree, expanded: int, produced_terminal: bool,
                rng: random.Random) -> int | None:
    """Table 3's baseline: local UCT while no terminal appears, then UCT again from the root."""
    if not produced_terminal:
        child = local_uct_select(tree, expanded, settings, rng)
        if child is not None:
            return child
    return descend_uct(tree, settings, rng)


def puct(settings: PuctSettings, tree: SearchTree, expanded: int, produced_terminal: bool,
         rng: random.Random) -> int | None:
    """The Countdown reference: from the root by pUCT with sequence-level priors, every time."""
    return descend_puct(tree, settings)


def puct_agent(settings: AgentPuctSettings, tree: SearchTree, pending: Sequence[int]) -> int | None:
    """The seed's Countdown MCTS (rest-mcts-and-countdown.md §B): pUCT with virtual loss."""
    return agent_descend(tree, pending, settings.c, settings.virtual_loss)


SELECTION.register(SearchRule("frontier", frontier, "local UCT until a terminal, then the global frontier score (§5)",
                              settings=frontier_settings))
SELECTION.register(SearchRule("vanilla_uct", vanilla_uct, "local UCT until a terminal, then UCT from the root (Table 3)",
                              settings=uct_settings))
SELECTION.register(SearchRule("puct", puct, "pUCT from the root with sequence-level priors", settings=puct_settings))
SELECTION.register(SearchRule("puct_agents", puct_agent, "agents sharing one pUCT tree with virtual loss",
                              settings=agent_settings, agents=True, expansion="step", uses_value_head=True))
FORK.register(SearchRule("uct", fork_uct, "argmax of Q + UCT bonus (+ value) over the open nodes",
                         settings=uct_fork_settings))
FORK.register(SearchRule("random", fork_random, "uniform over the open nodes", settings=fork_settings))
FORK.register(SearchRule("root", fork_root, "always the root: flat sampling with the tree's stopping rules",
                         settings=fork_settings))
FORK.register(SearchRule("entropy", fork_entropy, "TreeRL's EPTree: the untried highest-entropy cut",
                         settings=entropy_fork_settings, needs_entropy=True, cut=cut_at_entropy))

EndsStep = Callable[[Sequence[int]], bool]


def step_mode(config: SearchConfig, step: StepSpec, ends_step: EndsStep) -> StepExpansion:
    """n steps of a node per expansion, the next node by the selection rule (§1, §5)."""
    return StepExpansion(SELECTION[config.selection].bind(config))


def rollout_mode(config: SearchConfig, step: StepSpec, ends_step: EndsStep) -> RolloutExpansion:
    """n whole continuations of a node per expansion, the next node by the fork rule."""
    fork = FORK[config.fork_rule]
    return RolloutExpansion(fork.bind(config), step, ends_step, fork.bind_cut(config))


ExpansionModeBuilder = Callable[[SearchConfig, StepSpec, EndsStep], ExpansionMode]
"""config, the task's step, `ends_step` (does a step end with its last token; rollout expansion
cuts continuations into steps with it) -> the ExpansionMode of a LiveTree, built once per driver,
with its rules bound."""

EXPANSION.register(SearchRule("step", step_mode, "n single steps of a leaf per expansion (§1, the paper)"))
EXPANSION.register(SearchRule("rollout", rollout_mode, "n whole continuations of any open node per expansion",
                              whole_rollouts=True))
