"""Backup of one terminal reward along its path: time decay + constrained update.

deepsearch.md §4 (paper Eq. 3 and Eq. 5). The path is root (index 0) ... terminal (index
l = its depth); every node on it, root and terminal included, gets N += 1 and its q
updated with the weight gamma(i, l).
"""

from __future__ import annotations

from flywheel.search.config import SearchConfig
from flywheel.search.tree import SearchTree


def time_decay_weight(index: int, length: int, gamma_min: float, rule: str = "paper") -> float:
    """gamma(i, l), Eq. 3: how much of the terminal reward reaches the node at index i of l.

    "paper": max(i / l, gamma_min). "code": max((i + 1) / (l + 1), gamma_min), which the
    official code uses to avoid a zero weight at the root. Both give the terminal (i = l)
    gamma = 1, so the terminal's value is exactly its reward.

    >>> time_decay_weight(0, 2, 0.1), time_decay_weight(1, 2, 0.1), time_decay_weight(2, 2, 0.1)
    (0.1, 0.5, 1.0)
    >>> time_decay_weight(0, 2, 0.1, "code")
    0.3333333333333333
    """
    if rule == "paper":
        return max(index / length, gamma_min)
    if rule == "code":
        return max((index + 1) / (length + 1), gamma_min)
    raise ValueError(f"gamma rule must be 'paper' or 'code', got {rule!r}")


def constrained_update(q_old: float, reward: float, gamma: float) -> float:
    """Eq. 5: a node that ever lay on a correct path never goes negative.

    same sign (q_old * r >= 0): q_old + gamma * r
    r > 0, q_old < 0:           gamma * r   (a correct path overwrites a negative value)
    r < 0, q_old > 0:           q_old       (a later failure cannot undo a success)

    >>> constrained_update(-0.1, 1.0, 0.1), constrained_update(0.5, -1.0, 0.5)
    (0.1, 0.5)
    """
    if q_old * reward >= 0:
        return q_old + gamma * reward
    if reward > 0:
        return gamma * reward
    return q_old


def vanilla_update(q_old: float, reward: float, gamma: float) -> float:
    """The Table 4 row 1 ablation: same sign -> add; else max(q_old + gamma * r, 0).

    >>> vanilla_update(-0.5, 1.0, 0.5), vanilla_update(0.5, -1.0, 0.5)
    (0.0, 0.0)
    """
    if q_old * reward >= 0:
        return q_old + gamma * reward
    return max(q_old + gamma * reward, 0.0)


def backup_trajectory(tree: SearchTree, terminal: int, reward: float, config: SearchConfig) -> None:
    """Back `reward` up from `terminal` to the root: N += 1 and q <- update(q, r, gamma(i, l)) (Eq. 3, 5)."""
    update = constrained_update if config.backup == "constrained" else vanilla_update
    gamma_min, rule = config.gamma_min, config.gamma_rule
    depth, visits, value, parent = tree.depth, tree.visits, tree.value, tree.parent
    length = depth[terminal]
    node = terminal
    while node >= 0:
        visits[node] += 1
        value[node] = update(value[node], reward, time_decay_weight(depth[node], length, gamma_min, rule))
        node = parent[node]
