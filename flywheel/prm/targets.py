"""ReST-MCTS* value targets of every node of a finished search tree (spec §A).

For the partial solution p_k = [s_1..s_k] ending at node k (v_0 = 0 at the root):

    w_k = (1 - v_{k-1}) / (m_k + 1) * (1 - 2 r_k)
    v_k = max(v_{k-1} + w_k, 0)

r_k = 0 when node k can still reach a correct answer in the tree (the "hard estimate" is
1: it is a correct terminal or has one below it), else 1. m_k = the fewest remaining steps
from node k to a correct terminal in the tree: 0 at a correct terminal, min over children
+ 1 above it; a node with no correct terminal below inherits m from its nearest ancestor
that has one. On a correct K-step path v_k = k / K; v stays in [0, 1].

Pure: works on parent pointers and terminal verdicts; no model, no tree class.
"""

from __future__ import annotations

import math
from typing import Sequence


def remaining_steps(parent: Sequence[int], correct: Sequence[bool]) -> list[float]:
    """m of every node: fewest steps down to a correct terminal (inf when none below).

    Args:
        parent: parent id of each node, -1 for the root (node 0); every parent id is
            smaller than its child's (creation order).
        correct: whether each node is a correct terminal.
    """
    m = [0.0 if ok else math.inf for ok in correct]
    for node in range(len(parent) - 1, 0, -1):  # children before parents
        up = parent[node]
        m[up] = min(m[up], m[node] + 1)
    return m


def value_targets(parent: Sequence[int], correct: Sequence[bool]) -> list[float] | None:
    """v_k of every node (the root's is 0), or None when the tree has no correct terminal
    (such trees give no PRM samples).

    Returns:
        [len(parent)] targets in [0, 1].
    """
    if len(parent) != len(correct):
        raise ValueError(f"{len(parent)} parents but {len(correct)} verdicts")
    if not any(correct):
        return None
    m = remaining_steps(parent, correct)
    reachable = [not math.isinf(x) for x in m]  # hard estimate 1 <=> r = 0
    m_eff = list(m)
    v = [0.0] * len(parent)
    for node in range(1, len(parent)):
        up = parent[node]
        if up >= node:
            raise ValueError(f"node {node} has parent {up}: parents must come before children")
        if math.isinf(m_eff[node]):
            m_eff[node] = m_eff[up]  # inherit from the nearest ancestor with a finite distance
        r = 0.0 if reachable[node] else 1.0
        w = (1.0 - v[up]) / (m_eff[node] + 1.0) * (1.0 - 2.0 * r)
        v[node] = max(v[up] + w, 0.0)
    return v


def tree_samples(tree) -> list[tuple[tuple[int, ...], float, bool]]:
    """(prompt + partial response ids, v_k, can reach a correct answer) for every non-root
    node of a finished `flywheel.search.SearchTree`; [] when nothing in it is correct."""
    n = len(tree.parent)
    correct = [tree.kind[i] == "correct" for i in range(n)]
    values = value_targets(tree.parent, correct)
    if values is None:
        return []
    m = remaining_steps(tree.parent, correct)
    return [(tree.prefix_ids(i), values[i], not math.isinf(m[i])) for i in range(1, n)]
