"""Which node to expand next: local UCT, global frontier selection, UCT / pUCT from the root.

deepsearch.md §5 (the paper's local UCT and frontier priority score; the spec gives them
no equation numbers, so the docstrings cite the section) and rest-mcts-and-countdown.md
§B (pUCT with sequence-level priors). Scores are pure
functions of numbers; the `select_*` / `descend_*` functions read a SearchTree and never
change it. Ties always go to the lowest node id, so a search is reproducible.

Each rule reads only its own settings, a small frozen dataclass (`UctSettings`,
`FrontierSettings`, `PuctSettings`, `ForkSettings`), built from the command line's flags where
the rule is registered (flywheel.search.rules) and bound to the rule once per search.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Sequence

from flywheel.search.tree import ROOT, SearchTree


@dataclass(frozen=True)
class UctSettings:
    """Local UCT (§5): `lam` (--data.search.uct_lambda), `value_weight` of a value model's V(s)
    (--data.search.prm_weight; 0 = off), and `sampling` "argmax" (paper) or "softmax" (the code's
    option, --data.search.ablations.uct_sampling)."""

    lam: float = 2.0
    value_weight: float = 0.0
    sampling: str = "argmax"


@dataclass(frozen=True)
class FrontierSettings:
    """The frontier score F(s) = lambda1 * tanh(Q(parent)) + lambda2 * H(s) + lambda3 * D(depth)
    (§5, --data.search.frontier_lambda1..3), D by `depth_bonus` over `max_depth` d_T, plus
    `value_weight` * V(s); `local`: the UCT the frontier rule dives by until a terminal appears."""

    lambda1: float = 0.4
    lambda2: float = 0.0
    lambda3: float = 0.01
    depth_bonus: str = "sqrt"
    max_depth: int = 64
    value_weight: float = 0.0
    local: UctSettings = field(default_factory=UctSettings)


@dataclass(frozen=True)
class PuctSettings:
    """pUCT with sequence-level priors: `c` (--data.search.puct_c) and `value_weight` * V(s)."""

    c: float = 0.5
    value_weight: float = 0.0


@dataclass(frozen=True)
class ForkSettings:
    """Which nodes a rollout may start from (every fork rule's candidates): non-terminal, above
    `max_depth`, with fewer than `max_children` children (0 = no cap)."""

    max_depth: int = 64
    max_children: int = 0


def uct_score(q_mean: float, parent_visits: int, visits: int, lam: float) -> float:
    """UCT of a child (§5): Q(c) + lambda * sqrt(ln N(parent) / N(c)); bonus 0 when a count is 0.

    >>> round(uct_score(0.5, 4, 2, 2.0), 4)  # 0.5 + 2 * sqrt(ln 4 / 2)
    2.1651
    >>> uct_score(0.0, 0, 1, 2.0), uct_score(0.3, 5, 0, 2.0)
    (0.0, 0.3)
    """
    if parent_visits <= 0 or visits <= 0:
        return q_mean
    return q_mean + lam * math.sqrt(math.log(parent_visits) / visits)


def _pick(scores: Sequence[float], sampling: str, rng: random.Random) -> int:
    """Index of the argmax (first on ties), or a sample from softmax(scores) (the code's option)."""
    if sampling == "argmax" or len(scores) == 1:
        best = 0
        for i in range(1, len(scores)):
            if scores[i] > scores[best]:
                best = i
        return best
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    return rng.choices(range(len(scores)), weights=weights)[0]


def local_uct_select(tree: SearchTree, node: int, settings: UctSettings, rng: random.Random) -> int | None:
    """The child of `node` to expand next by UCT among siblings (§5); None if every child is dead.

    Terminal children (and expanded children with nothing left below) are never chosen.
    """
    dead = tree.dead
    candidates = [c for c in tree.children[node] if not dead[c]]
    if not candidates:
        return None
    parent_visits, lam, weight = tree.visits[node], settings.lam, settings.value_weight
    if weight:
        scores = [uct_score(tree.mean_q(c), parent_visits, tree.visits[c], lam) + prm_term(tree, c, weight)
                  for c in candidates]
    else:  # prm_term is 0.0 for every child
        scores = [uct_score(tree.mean_q(c), parent_visits, tree.visits[c], lam) + 0.0 for c in candidates]
    return candidates[_pick(scores, settings.sampling, rng)]


def prm_term(tree: SearchTree, node: int, weight: float) -> float:
    """weight * V(node) when a value model scored the node, else 0."""
    value = tree.prm_value[node]
    return weight * value if weight and value == value else 0.0


def depth_bonus(depth: int, max_depth: int, kind: str) -> float:
    """D(d) of the frontier score (§5): "sqrt" = sqrt(d / d_T) (paper), "linear" = d, "log" = log(d + 1).

    >>> depth_bonus(16, 64, "sqrt"), depth_bonus(3, 64, "linear"), round(depth_bonus(3, 64, "log"), 4)
    (0.5, 3.0, 1.3863)
    """
    if kind == "sqrt":
        return math.sqrt(depth / max_depth)
    if kind == "linear":
        return float(depth)
    if kind == "log":
        return math.log(depth + 1)
    raise ValueError(f"depth_bonus must be 'sqrt', 'linear' or 'log', got {kind!r}")


def frontier_score(parent_q_mean: float, uncertainty: float, depth: int, settings: FrontierSettings) -> float:
    """F(s) = lambda1 * tanh(Q(parent(s))) + lambda2 * H(s) + lambda3 * D(depth(s)) (§5).

    H(s) is the mean NLL of the node's own step (the code's proxy); a NaN H adds nothing.

    >>> round(frontier_score(0.5, 0.0, 16, FrontierSettings(max_depth=64)), 6)  # 0.4 * tanh(0.5) + 0.01 * sqrt(16 / 64)
    0.189847
    """
    score = settings.lambda1 * math.tanh(parent_q_mean)
    if settings.lambda2 and uncertainty == uncertainty:
        score += settings.lambda2 * uncertainty
    return score + settings.lambda3 * depth_bonus(depth, settings.max_depth, settings.depth_bonus)


def select_frontier(tree: SearchTree, settings: FrontierSettings) -> int | None:
    """argmax of F(s) over the frontier F = {non-terminal, childless, depth < d_T} (§5); None if F is empty.

    Siblings share Q(parent) and depth, so with lambda2 = 0 one score per parent is enough
    (cost O(|F| / n)); ties go to the lowest node id.
    """
    best_score = -math.inf
    best = -1
    per_node = settings.lambda2 != 0.0 or settings.value_weight != 0.0
    for parent, kids in tree.frontier.items():
        q_parent = tree.mean_q(parent)
        depth = tree.depth[parent] + 1
        if per_node:
            for kid in kids:
                score = (frontier_score(q_parent, tree.step_mean_nll(kid), depth, settings)
                         + prm_term(tree, kid, settings.value_weight))
                if score > best_score or (score == best_score and kid < best):
                    best_score, best = score, kid
        else:
            kid = kids[0]  # ascending ids: the lowest of the tied siblings
            score = frontier_score(q_parent, math.nan, depth, settings)
            if score > best_score or (score == best_score and kid < best):
                best_score, best = score, kid
    return best if best >= 0 else None


def descend_uct(tree: SearchTree, settings: UctSettings, rng: random.Random) -> int | None:
    """"Vanilla UCT" (Table 3 baseline): from the root, follow local UCT down to a leaf; None if the tree is dead."""
    if tree.dead[ROOT]:
        return None
    node = ROOT
    while tree.children[node]:
        child = local_uct_select(tree, node, settings, rng)
        if child is None:  # unreachable while dead flags are kept, but never loop forever
            return None
        node = child
    return node


def sequence_priors(logprob_sums: Sequence[float]) -> list[float]:
    """P(c) = softmax over siblings of their steps' summed log-probs (the Countdown reference).

    A NaN sum counts as -inf (prior 0); if every sibling is -inf the prior is uniform.

    >>> [round(p, 4) for p in sequence_priors([0.0, math.log(3.0)])]
    [0.25, 0.75]
    """
    clean = [s if s == s else -math.inf for s in logprob_sums]
    top = max(clean)
    if top == -math.inf:
        return [1.0 / len(clean)] * len(clean)
    weights = [math.exp(s - top) for s in clean]
    total = sum(weights)
    return [w / total for w in weights]


def puct_score(q_mean: float, prior: float, parent_visits: int, visits: int, c: float) -> float:
    """pUCT: Q(c) + c * P(c) * sqrt(N(parent)) / (1 + N(c)).

    sqrt(max(N(parent), 1)): the root has N = 0 until its first backup, and the prior
    should still order its children.

    >>> puct_score(0.0, 0.5, 4, 1, 0.5)  # 0.5 * 0.5 * 2 / 2
    0.25
    """
    return q_mean + c * prior * math.sqrt(max(parent_visits, 1)) / (1 + visits)


def descend_puct(tree: SearchTree, settings: PuctSettings) -> int | None:
    """From the root, follow argmax pUCT among live children down to a leaf; None if the tree is dead."""
    if tree.dead[ROOT]:
        return None
    node = ROOT
    while tree.children[node]:
        kids = tree.children[node]
        priors = sequence_priors([tree.step_logprob_sum[k] for k in kids])
        parent_visits = tree.visits[node]
        best, best_score = -1, -math.inf
        for kid, prior in zip(kids, priors):
            if tree.dead[kid]:
                continue
            score = puct_score(tree.mean_q(kid), prior, parent_visits, tree.visits[kid], settings.c)
            score += prm_term(tree, kid, settings.value_weight)
            if score > best_score:
                best, best_score = kid, score
        if best < 0:
            return None
        node = best
    return node


def fork_candidates(tree: SearchTree, settings: ForkSettings) -> list[int]:
    """Nodes a rollout may start from: non-terminal, above max depth, with fewer than
    `settings.max_children` children (0 = no cap)."""
    cap = settings.max_children
    return [
        v for v in range(len(tree))
        if not tree.terminal[v] and tree.depth[v] < settings.max_depth and (not cap or len(tree.children[v]) < cap)
    ]
