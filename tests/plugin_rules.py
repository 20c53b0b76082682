"""A user's module of rules, one of every family, as `--plugins plugin_rules` loads it
(tests/test_plugins.py): registered from outside the library, through the tables alone."""

from __future__ import annotations

from flywheel.objectives.credit import RULES, ROLLOUTS, CreditRule, RolloutKind, node_credit
from flywheel.objectives.losses import LOSSES, LossRule
from flywheel.search.rule_table import EXPANSION, FORK, SELECTION, SearchRule
from flywheel.search.rules import step_mode


def breadth_first(tree, expanded, produced_terminal, rng):
    """The lowest-id node neither terminal nor expanded: the tree grows level by level."""
    return next((v for v in range(len(tree)) if not tree.terminal[v] and not tree.children[v]), None)


def newest(tree, rng):
    """The newest node that is not terminal: rollouts fork from the deepest point reached last."""
    return next((v for v in reversed(range(len(tree))) if not tree.terminal[v]), None)


def halved_node(group, normalize_std):
    """Tree-GRPO's node credit at half strength."""
    return [[a / 2 for a in steps] for steps in node_credit(group, normalize_std)]


def reinforce(ratio, adv, logprobs, clip_low, clip_high, dual_clip):
    """-A log pi: REINFORCE, no ratio and no clip."""
    return -adv * logprobs


SELECTION.register(SearchRule("breadth_first", breadth_first, "level by level"))
FORK.register(SearchRule("newest", newest, "the newest open node"))
EXPANSION.register(SearchRule("single_step", step_mode, "the step expansion under another name"))
RULES.register(CreditRule("halved_node", "node credit at half strength", halved_node,
                          frozenset({"normalize_std", "degenerate_filter"})))
ROLLOUTS.register(RolloutKind("flat_outcome", searches=False, credit="outcome",
                              summary="independent samples, credited by outcome"))
LOSSES.register(LossRule("reinforce", "REINFORCE: -A log pi", reinforce))
