"""The rules a search runs by, looked up once by their config names (mctx-style: a rule is an
injected function; no tree branches on a rule's name).

    SELECTION_RULES[config.selection]   step expansion: the node to expand next (§5)
    AGENT_RULES[config.selection]       several agents per tree and round: one agent's descent
    FORK_RULES[config.fork_rule]        rollout expansion: where the next rollouts start
    FORK_CUTS[config.fork_rule]         rollout expansion: where a new rollout is cut besides its steps
    EXPANSION_MODES[config.expansion]   how an expansion grows a tree, with its rule resolved

SearchConfig accepts exactly the names registered here, so a new rule is a function with its
kind's signature (`SelectionRule`, `AgentDescent`, `ForkSelection`) registered under a new
name: one file and its test (docs/search.md; tests/test_search_rules_injected.py registers one
from the test alone). Choosing it from the command line also needs its name in the config's
Literal (flywheel/search/config.py), which is what the CLI's type check reads.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from flywheel.search.agents import agent_descend
from flywheel.search.config import SearchConfig
from flywheel.search.live import ExpansionMode
from flywheel.search.live_agents import AgentDescent
from flywheel.search.entropy_forks import cut_at_entropy, fork_entropy
from flywheel.search.rollout import ForkCut, ForkSelection, RolloutExpansion, fork_random, fork_root, fork_uct
from flywheel.search.selection import descend_puct, descend_uct, local_uct_select, select_frontier
from flywheel.search.step_expansion import SelectionRule, StepExpansion
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
    return agent_descend(tree, pending, config.puct_c, config.virtual_loss)


SELECTION_RULES: dict[str, SelectionRule] = {"frontier": frontier, "vanilla_uct": vanilla_uct, "puct": puct}
AGENT_RULES: dict[str, AgentDescent] = {"puct_agents": puct_agent}
FORK_RULES: dict[str, ForkSelection] = {"uct": fork_uct, "random": fork_random, "root": fork_root,
                                        "entropy": fork_entropy}
FORK_CUTS: dict[str, ForkCut] = {"entropy": cut_at_entropy}
"""Fork rules that also cut every new rollout at fork points of their own (inside steps too)."""

EndsStep = Callable[[Sequence[int]], bool]


def step_mode(config: SearchConfig, step: StepSpec, ends_step: EndsStep) -> StepExpansion:
    """n steps of a node per expansion, the next node by the selection rule (§1, §5)."""
    return StepExpansion(SELECTION_RULES[config.selection])


def rollout_mode(config: SearchConfig, step: StepSpec, ends_step: EndsStep) -> RolloutExpansion:
    """n whole continuations of a node per expansion, the next node by the fork rule."""
    return RolloutExpansion(FORK_RULES[config.fork_rule], step, ends_step, FORK_CUTS.get(config.fork_rule))


EXPANSION_MODES: dict[str, Callable[[SearchConfig, StepSpec, EndsStep], ExpansionMode]] = {
    "step": step_mode,
    "rollout": rollout_mode,
}
"""config.expansion -> the ExpansionMode of a LiveTree, built once per driver (`ends_step`: does
a step end with its last token; rollout expansion cuts continuations into steps with it)."""
