"""The seed's Countdown MCTS rules (rest-mcts-and-countdown.md §B): pUCT with sequence-level
priors over a tree that several agents share with virtual loss, values that start at a value
model's V(s), and the greedy readout of the one training trajectory.

Pure functions over a SearchTree plus one list of pending counts (`pending[node]` = agents
whose selected path runs through `node` and whose expansion has not returned yet); the live
tree (flywheel.search.live_agents) drives them between the driver's rounds. Ties go to the
lowest node id, so a search is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from flywheel.search.selection import puct_score, sequence_priors
from flywheel.search.tree import ROOT, SearchTree


@dataclass(frozen=True)
class AgentPuctSettings:
    """One agent's descent: pUCT's `c` (--data.search.puct_c) and the `virtual_loss` a pending
    selection puts on its path (--data.search.agents.virtual_loss)."""

    c: float = 0.5
    virtual_loss: float = 1.0


def initial_value(tree: SearchTree, node: int) -> float:
    """What a node is worth before any visit: a terminal's reward, else the value model's V(s)
    (the Countdown reference's value head), else 0 when no value model scored it.

    >>> tree = SearchTree([1])
    >>> initial_value(tree, 0)
    0.0
    """
    reward = tree.reward[node]
    if reward is not None:
        return reward
    value = tree.prm_value[node]
    return value if value == value else 0.0


def agent_q(value_sum: float, visits: int, pending: int, virtual_loss: float, init: float) -> float:
    """Q of a node under virtual loss: (W - virtual_loss * pending) / (N + pending); `init` (its
    initial value) while it has neither visits nor pending agents.

    >>> agent_q(1.5, 3, 0, 1.0, 0.2)  # 1.5 / 3
    0.5
    >>> agent_q(1.5, 3, 1, 1.0, 0.2)  # (1.5 - 1) / 4: one agent is on its way through it
    0.125
    >>> agent_q(0.0, 0, 0, 1.0, -0.3)  # unvisited: its value
    -0.3
    """
    n = visits + pending
    if n == 0:
        return init
    return (value_sum - virtual_loss * pending) / n


def open_nodes(tree: SearchTree, pending: Sequence[int]) -> list[bool]:
    """Per node: can an agent still end a descent at or below it? A terminal can (its reward is
    backed up again, as AlphaZero revisits a finished game), an unexpanded leaf can unless another
    agent of the round already took it, an expanded node can if one of its children can. One
    pass from the leaves up (children have larger ids than their parent).

    >>> from flywheel.generation.base import Completion
    >>> tree = SearchTree([1])
    >>> _ = tree.add_children(0, [Completion((2,), (-1.0,), "length")] * 2, [False, False], initial_visit=False)
    >>> open_nodes(tree, [1, 1, 0]), open_nodes(tree, [2, 1, 1])
    ([True, False, True], [False, False, False])
    """
    is_open = [tree.terminal[n] or (not tree.children[n] and not pending[n]) for n in range(len(tree))]
    for node in range(len(tree) - 1, 0, -1):
        if is_open[node]:
            is_open[tree.parent[node]] = True
    return is_open


def agent_child(
    tree: SearchTree, pending: Sequence[int], is_open: Sequence[bool], node: int, c: float, virtual_loss: float
) -> int | None:
    """argmax over the open children of `node` of Q + c * P * sqrt(N(node)) / (1 + N), with
    P = softmax of the siblings' summed step log-probs (over all of them) and N counting pending
    agents; None if no child is open.

    N(node) is at least 1 inside puct_score, so an unvisited parent's children are ordered by
    Q and prior.
    """
    kids = tree.children[node]
    priors = sequence_priors([tree.step_logprob_sum[k] for k in kids])
    parent_visits = tree.visits[node] + pending[node]
    best, best_score = None, -math.inf
    for kid, prior in zip(kids, priors):
        if not is_open[kid]:
            continue
        q = agent_q(tree.value[kid], tree.visits[kid], pending[kid], virtual_loss, initial_value(tree, kid))
        score = puct_score(q, prior, parent_visits, tree.visits[kid] + pending[kid], c)
        if score > best_score:
            best, best_score = kid, score
    return best


def agent_descend(tree: SearchTree, pending: Sequence[int], c: float, virtual_loss: float) -> int | None:
    """One agent's selection: from the root down by `agent_child` to a terminal or an unexpanded
    leaf; None when nothing is open (every leaf taken by other agents of the round)."""
    is_open = open_nodes(tree, pending)
    if not is_open[ROOT]:
        return None
    node = ROOT
    while tree.children[node]:
        child = agent_child(tree, pending, is_open, node, c, virtual_loss)
        assert child is not None  # node is open and expanded, so one of its children is open
        node = child
    return node


def add_pending(tree: SearchTree, pending: list[int], leaf: int, delta: int) -> None:
    """Add `delta` pending agents on every node from the root to `leaf` (virtual loss on, +1;
    off again when the expansion returns, -1)."""
    for node in tree.path(leaf):
        pending[node] += delta
        if pending[node] < 0:
            raise RuntimeError(f"node {node}: more virtual losses removed than added")


def back_up_value(tree: SearchTree, leaf: int, value: float) -> None:
    """AlphaZero backup: every node from the root to `leaf` gains one visit and `value`."""
    for node in tree.path(leaf):
        tree.visits[node] += 1
        tree.value[node] += value


def terminals_below(tree: SearchTree) -> list[bool]:
    """Per node: does its subtree (itself included) hold a graded terminal? One pass from the
    leaves up (children always have larger ids than their parent)."""
    has = [tree.terminal[n] and tree.reward[n] is not None for n in range(len(tree))]
    for node in range(len(tree) - 1, 0, -1):
        if has[node]:
            has[tree.parent[node]] = True
    return has


def greedy_terminal(tree: SearchTree) -> int | None:
    """The readout after M iterations: from the root, follow the most-visited child (ties: higher
    Q = W / N, then lower id) among the children with a terminal below, down to a terminal;
    None when the tree holds no graded terminal.

    >>> from flywheel.generation.base import Completion
    >>> tree = SearchTree([1])
    >>> kids = tree.add_children(0, [Completion((2,), (-1.0,), "length"), Completion((3,), (-1.0,), "eos")],
    ...                          [False, True], initial_visit=False)
    >>> tree.reward[2] = -1.0
    >>> tree.visits[1], tree.visits[2] = 5, 1
    >>> greedy_terminal(tree)  # node 1 is visited more but has no terminal below
    2
    """
    has = terminals_below(tree)
    if not has[ROOT]:
        return None
    node = ROOT
    while not tree.terminal[node]:
        best = None
        for kid in tree.children[node]:
            if not has[kid]:
                continue
            if best is None or (tree.visits[kid], tree.mean_q(kid)) > (tree.visits[best], tree.mean_q(best)):
                best = kid
        assert best is not None  # has[node] is True, so some child has a terminal below
        node = best
    return node
