"""Entropy forks (`search.fork_rule="entropy"`): TreeRL's EPTree (arXiv 2506.11902, §3.1) in
rollout expansion. Every new rollout is cut, besides at its step boundaries, just before its
N highest-entropy tokens (N = `entropy_forks_per_chain`), and the node that ends before such a
token becomes a fork point; the next fork is the untried fork point whose token had the highest
entropy, so its continuations resample exactly the token the policy was least sure of.

Why cuts at insertion (and not splitting a node when a fork is chosen there): the tree stays a
trie of token spans built once, so node ids, backed-up statistics, graded terminals and the
trajectories already recorded never move; credit rules and the trainer's packing read a cut
node as one more span of its path (TreeRL credits exactly these segments). A cut that falls
inside a step makes a `mid_step` node: it ends inside the step, so it keeps its parent's depth
and does not count towards max_depth; the piece completing the step counts it. A fork from it
continues the open step: the step's token cap and delimiter see the tokens already in it
(`open_step`), and the request asks for that many tokens fewer.

Steps that repeat existing nodes (`merge_duplicate_steps`) are not cut: an existing node is never
split, and its tokens were considered when it was made. Pure: no model, no torch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Sequence

from flywheel.generation.base import Completion
from flywheel.search.selection import ForkSettings
from flywheel.search.tree import ROOT, SearchTree


def top_entropy_positions(entropies: Sequence[float], count: int, lo: int, hi: int) -> list[int]:
    """The `count` positions in [lo, hi) with the highest entropies, ascending; NaN never, ties to
    the earlier position.

    >>> top_entropy_positions([0.9, 0.1, 0.5, float("nan"), 0.5, 0.2], 2, 1, 6)
    [2, 4]
    """
    ranked = sorted((-entropies[i], i) for i in range(lo, hi) if entropies[i] == entropies[i])
    return sorted(i for _, i in ranked[:count])


def open_step(tree: SearchTree, node: int) -> tuple[int, ...]:
    """The tokens of the step `node` ends inside (its own and those of the mid-step nodes above it
    in that step); () for a node that ends its step."""
    out: list[int] = []
    while tree.mid_step[node]:
        out[:0] = tree.tokens[node]
        node = tree.parent[node]
    return tuple(out)


@dataclass(frozen=True)
class EntropyForkSettings:
    """fork_rule "entropy": the candidates (`open`) and N, the cuts of each new rollout
    (`per_chain`, --data.search.rollout.entropy_forks_per_chain; TreeRL's released script: 2)."""

    open: ForkSettings = field(default_factory=ForkSettings)
    per_chain: int = 2


def cut_at_entropy(
    settings: EntropyForkSettings, pieces: Sequence[Completion], first_new: int
) -> tuple[list[Completion], list[bool], dict[int, float]]:
    """Cut the steps `pieces` of one rollout just before its top-N entropy tokens among the
    pieces from `first_new` on (the earlier ones repeat existing nodes) and after its first token.

    Returns the pieces after the cuts, whether each ends inside a step, and the fork points as
    {index of the piece that starts at a cut token: that token's entropy}: the node ending just
    before that piece is the fork point (a cut at a step boundary adds no piece). A piece cut
    off before the token ends inside a step and finishes with "length" (cut without its
    delimiter), like a step cut at its cap.

    >>> steps = [Completion((5, 6, 4), (-1.0,) * 3, "stop", (0.1, 0.9, 0.2)),
    ...          Completion((7, 1), (-1.0,) * 2, "eos", (0.8, 0.3))]
    >>> cut, mid, forks = cut_at_entropy(EntropyForkSettings(per_chain=2), steps, 0)
    >>> [p.token_ids for p in cut], mid, forks
    ([(5,), (6, 4), (7, 1)], [True, False, False], {1: 0.9, 2: 0.8})
    """
    if any(p.entropies is None for p in pieces[first_new:]):
        raise RuntimeError(
            "search.fork_rule='entropy' needs per-token entropies, but the generator returned Completion.entropies=None; "
            "use a backend that honours SamplingParams.top_logprobs or set --data.search.fork_rule=uct"
        )
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + len(piece.token_ids))
    entropies = [h for piece in pieces[first_new:] for h in piece.entropies]  # type: ignore[union-attr]
    base = starts[first_new]
    cuts = {base + i for i in top_entropy_positions(entropies, settings.per_chain, max(1 - base, 0),
                                                     len(entropies))}
    out: list[Completion] = []
    mid: list[bool] = []
    forks: dict[int, float] = {}
    for j, piece in enumerate(pieces):
        inner = sorted(p - starts[j] for p in cuts if starts[j] <= p < starts[j + 1])
        at = 0
        for k in inner:
            if k:  # a cut inside the piece: its head ends inside the step
                out.append(_span(piece, at, k, "length"))
                mid.append(True)
                at = k
            forks[len(out)] = piece.entropies[k]  # type: ignore[index]
        out.append(_span(piece, at, len(piece.token_ids), piece.finish_reason))
        mid.append(False)
    return out, mid, forks


def _span(piece: Completion, start: int, end: int, reason: str) -> Completion:
    ents = piece.entropies[start:end] if piece.entropies is not None else None
    return Completion(piece.token_ids[start:end], piece.logprobs[start:end], reason, ents)  # type: ignore[arg-type]


def record_fork_points(tree: SearchTree, path: Sequence[int], start: int, forks: dict[int, float]) -> None:
    """Mark the fork points of one inserted rollout: the node before each cut piece (`path[i]` is
    the node of piece i, `start` the node the rollout continued). The highest entropy wins."""
    for i, entropy in forks.items():
        node = path[i - 1] if i else start
        if entropy > tree.fork_points.get(node, -math.inf):
            tree.fork_points[node] = entropy


def fork_entropy(settings: EntropyForkSettings, tree: SearchTree, rng: random.Random) -> int | None:
    """fork_rule "entropy": the fork point never forked from whose token had the highest entropy
    (ties to the lowest id), among the nodes a rollout may start from (`fork_candidates`' test);
    the root when none is left (fresh rollouts bring new fork points); None when the root is
    no candidate either."""
    cap, max_depth = settings.open.max_children, settings.open.max_depth
    best, best_entropy = None, -math.inf
    for v, entropy in tree.fork_points.items():
        if tree.expanded[v] or tree.terminal[v] or tree.depth[v] >= max_depth:
            continue
        if cap and len(tree.children[v]) >= cap:
            continue
        if entropy > best_entropy or (entropy == best_entropy and best is not None and v < best):
            best, best_entropy = v, entropy
    if best is not None:
        return best
    if cap and len(tree.children[ROOT]) >= cap:
        return None
    return ROOT
