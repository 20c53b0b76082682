"""Rollout expansion: every expansion samples whole continuations, and the tree forks from
the steps of the trajectories it already has.

The paper's expansion (deepsearch.md §1) samples n single STEPS of a node and adds them
all; most of those siblings are never expanded, so on short-step tasks the tree pays for
many partial lines that never reach an answer. With `search.expansion="rollout"` each of
the n samples runs to EOS (or max depth) and is cut into steps after the fact, so every
generated token ends in a graded terminal, and later expansions fork from a step on an
existing path: the shared prefix is never generated again. This is how the tree-RL
follow-ups to DeepSearch grow their trees (TreeRL's entropy-guided forks, SPO-tree's
segment trees): whole rollouts, branch points chosen among their steps.

Pure functions over SearchTree and Completion records, and `RolloutExpansion`, the
ExpansionMode of a LiveTree (flywheel.search.live) that uses them; the fork rule is injected
(flywheel.search.rule_table.FORK).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

from flywheel.generation.base import Completion, SamplingParams
from flywheel.search.backup import backup_trajectory
from flywheel.search.entropy_forks import open_step, record_fork_points
from flywheel.search.expansion import Decode, emitted_eos, grade_terminal, rollout_sampling_params
from flywheel.search.selection import ForkSettings, UctSettings, fork_candidates, prm_term, uct_score
from flywheel.search.terminal import is_terminal_step
from flywheel.search.tree import ROOT, SearchTree
from flywheel.tasks.base import StepSpec

if TYPE_CHECKING:
    from flywheel.search.live import LiveTree

ForkSelection = Callable[[SearchTree, random.Random], int | None]
"""(tree, the tree's rng) -> the node the next rollouts start from, or None when nothing is left
to fork from: a fork rule with its settings bound (flywheel.search.rule_table.SearchRule.bind).
It reads the tree and never changes it; it may draw from the rng."""


def split_steps(
    completion: Completion, step: StepSpec, ends_step: Callable[[Sequence[int]], bool], max_steps: int,
    open_step: tuple[int, ...] = (),
) -> list[Completion]:
    """Cut a whole continuation into at most `max_steps` steps, as the step rule would have
    sampled them: after the token that completes the delimiter (`ends_step(piece)` is asked
    of the step's tokens so far, as a stop string is matched in a step's text: a BPE
    tokenizer may spell "\n\n" as two "\n" tokens) or after `step.max_tokens` tokens.
    Tokens past the `max_steps`-th step are dropped (that step sits at max depth). Every
    piece but the last finishes with "stop" ("length" when cut at the cap); the last keeps
    the completion's own finish reason. `open_step`: the tokens of the step the continuation
    starts inside (a fork from a mid-step node, flywheel.search.entropy_forks): the first
    piece completes that step, its cap and delimiter counting them.

    >>> c = Completion((1, 9, 2, 9, 3), (-0.1,) * 5, "eos")
    >>> [p.token_ids for p in split_steps(c, StepSpec(8, "\\n"), lambda piece: piece[-1] == 9, 8)]
    [(1, 9), (2, 9), (3,)]
    >>> [(p.token_ids, p.finish_reason) for p in split_steps(c, StepSpec(8, "\\n"), lambda piece: piece[-1] == 9, 2)]
    [((1, 9), 'stop'), ((2, 9), 'stop')]
    """
    ids, lps, ents = completion.token_ids, completion.logprobs, completion.entropies
    pieces: list[Completion] = []
    start, carried = 0, len(open_step)
    for i in range(len(ids)):
        length = i + 1 - start + carried
        delimited = False
        if step.delimiter is not None:  # no slicing per token for fixed chunks
            delimited = ends_step(open_step + ids[start : i + 1] if carried else ids[start : i + 1])
        if not delimited and length < step.max_tokens:
            continue
        last = i + 1 == len(ids)
        reason = completion.finish_reason if last else ("stop" if delimited else "length")
        pieces.append(_piece(ids, lps, ents, start, i + 1, reason))
        start, carried = i + 1, 0
        if len(pieces) == max_steps:
            return pieces
    if start < len(ids) or not pieces:
        pieces.append(_piece(ids, lps, ents, start, len(ids), completion.finish_reason))
    return pieces


def _piece(ids, lps, ents, start: int, end: int, reason: str) -> Completion:
    return Completion(ids[start:end], lps[start:end], reason, ents[start:end] if ents is not None else None)  # type: ignore[arg-type]


def insert_path(
    tree: SearchTree, node: int, pieces: Sequence[Completion], terminal_last: bool, merge: bool,
    mid_step: Sequence[bool] | None = None, path: list[int] | None = None,
) -> tuple[int, list[int]]:
    """Hang the steps `pieces` below `node` as one path; return (its last node, the new nodes).

    With `merge`, a step identical to an existing child of the node it continues is that
    child (the trie of sampled trajectories: a repeated prefix is stored once). The last
    node is terminal iff `terminal_last`; a path that repeats an existing one to its end
    returns the existing last node and creates nothing. `mid_step[j]`: piece j ends inside a
    step (SearchTree.mid_step; None = none does). `path` receives the node of every piece.
    """
    new: list[int] = []
    for j, piece in enumerate(pieces):
        is_last = j + 1 == len(pieces)
        mid = mid_step is not None and mid_step[j]
        twin = _twin(tree, node, piece, is_last and terminal_last, mid) if merge else None
        if twin is not None:
            node = twin
        else:
            (node,) = tree.add_children(node, [piece], [is_last and terminal_last], extend=True,
                                        mid_step=None if mid_step is None else [mid])
            new.append(node)
        if path is not None:
            path.append(node)
    return node, new


def repeated_steps(tree: SearchTree, node: int, pieces: Sequence[Completion], terminal_last: bool) -> int:
    """How many leading `pieces` `insert_path` with `merge` would find in the tree already."""
    for j, piece in enumerate(pieces):
        node = _twin(tree, node, piece, j + 1 == len(pieces) and terminal_last, False)  # type: ignore[assignment]
        if node is None:
            return j
    return len(pieces)


def _twin(tree: SearchTree, node: int, piece: Completion, terminal: bool, mid: bool) -> int | None:
    """The child of `node` that `piece` repeats: the same tokens, terminal and mid-step flags."""
    twin = same_child(tree, node, piece.token_ids)
    if twin is None or tree.terminal[twin] != terminal or tree.mid_step[twin] != mid:
        return None
    return twin


def same_child(tree: SearchTree, node: int, token_ids: tuple[int, ...]) -> int | None:
    """The child of `node` whose step is `token_ids`; None when it has none."""
    for child in tree.children[node]:
        if tree.tokens[child] == token_ids:
            return child
    return None


@dataclass(frozen=True)
class UctForkSettings:
    """fork_rule "uct": the candidates (`open`) and the UCT over them (`uct`: lambda and the value
    model's weight; its sampling is not used, the fork is an argmax)."""

    open: ForkSettings
    uct: UctSettings


def fork_uct(settings: UctForkSettings, tree: SearchTree, rng: random.Random) -> int | None:
    """fork_rule "uct": argmax over the candidates of Q(s) + lambda * sqrt(ln N(root) / N(s))
    (+ value_weight * V(s)): nodes with good outcomes below, and rarely tried ones; ties to the
    lowest id. None: nothing left to fork from."""
    candidates = fork_candidates(tree, settings.open)
    if not candidates:
        return None
    total, lam, weight = tree.visits[ROOT], settings.uct.lam, settings.uct.value_weight
    best, best_score = -1, -math.inf
    for v in candidates:
        score = uct_score(tree.mean_q(v), total, tree.visits[v], lam) + prm_term(tree, v, weight)
        if score > best_score:
            best, best_score = v, score
    return best


def fork_random(settings: ForkSettings, tree: SearchTree, rng: random.Random) -> int | None:
    """fork_rule "random": uniform over the candidates."""
    candidates = fork_candidates(tree, settings)
    if not candidates:
        return None
    return candidates[rng.randrange(len(candidates))]


def fork_root(settings: ForkSettings, tree: SearchTree, rng: random.Random) -> int | None:
    """fork_rule "root": the root while it is a candidate (flat sampling under the tree's
    stopping rules: the control arm)."""
    candidates = fork_candidates(tree, settings)
    return ROOT if candidates and candidates[0] == ROOT else None


def grade_rollout(live: LiveTree, leaf: int, fresh: bool, eos: bool, decode: Decode) -> None:
    """A rollout reached the terminal `leaf`: a `fresh` one (a new node) is graded; a repeat of an
    existing trajectory keeps its grade."""
    tree = live.tree
    if fresh:
        grade_terminal(tree, leaf, live.problem, decode, eos, live.config, live.graded)
        live.terminals += 1
        if live.first_correct_tokens is None and tree.kind[leaf] == "correct":
            live.first_correct_tokens = live.generated_tokens


def back_up_rollout(live: LiveTree, leaf: int, fresh: bool) -> None:
    """Back up a graded rollout's reward (a repeat of a trajectory again); it counts as a rollout
    (K counts rollouts, so a policy that keeps writing one answer cannot keep a tree alive), and
    a fresh one becomes a trajectory."""
    tree = live.tree
    reward = tree.reward[leaf]
    assert reward is not None
    backup_trajectory(tree, leaf, reward, live.config)
    live.rollouts += 1
    if fresh:
        tree.backup_index[leaf] = len(live.trajectories)
        live.trajectories.append(leaf)


ForkCut = Callable[[Sequence[Completion], int], tuple[list[Completion], list[bool], dict[int, float]]]
"""(a rollout's steps, how many of them repeat existing nodes) -> the pieces cut further
(inside steps too), whether each ends inside a step, and {piece index: score} for the pieces whose
preceding node becomes a fork point (flywheel.search.entropy_forks.cut_at_entropy)."""


class RolloutExpansion:
    """The ExpansionMode of rollout expansion: each expansion hangs n whole continuations of the
    chosen node below it as paths of steps and grades their terminals (`grow`), then backs every
    one up (`back_up`); the next node is `fork`'s choice. K counts rollouts (a repeat of a trajectory too), so a policy
    that keeps writing one wrong answer cannot keep a tree alive. `cut` (fork_rule "entropy")
    also cuts each rollout at its fork points."""

    def __init__(self, fork: ForkSelection, step: StepSpec, ends_step: Callable[[Sequence[int]], bool],
                 cut: ForkCut | None = None) -> None:
        self.fork = fork
        self.step = step
        self.ends_step = ends_step
        self.cut = cut

    def width(self, live: LiveTree, node: int) -> int:
        cfg = live.config
        return cfg.rollout.fork_width if cfg.rollout.fork_width and node != ROOT else cfg.expansion_width

    def sampling_params(self, live: LiveTree, node: int, params: SamplingParams) -> SamplingParams:
        cfg, tree = live.config, live.tree
        out = rollout_sampling_params(self.step, cfg, tree.depth[node], len(open_step(tree, node)))
        return replace(out, distinct_first_token=True) if cfg.distinct_children else out

    def grow(self, live: LiveTree, completions: Sequence[Completion], decode: Decode,
             eos_ids: frozenset[int]) -> tuple[list[int], bool, list[tuple[int, bool]]]:
        cfg, tree, node = live.config, live.tree, live.next_node
        new_live: list[int] = []
        ended: list[tuple[int, bool]] = []
        carried = open_step(tree, node)
        for completion in completions:
            pieces = split_steps(completion, self.step, self.ends_step, cfg.max_depth - tree.depth[node], carried)
            eos = emitted_eos(pieces[-1], eos_ids)  # False when the cut at max depth dropped the end
            last_depth = tree.depth[node] + len(pieces)  # steps: a cut inside a step below adds none
            terminal = is_terminal_step("eos" if eos else pieces[-1].finish_reason, last_depth, cfg.max_depth)
            mid: list[bool] | None = None
            if self.cut is not None:
                repeated = repeated_steps(tree, node, pieces, terminal) if cfg.merge_duplicate_steps else 0
                pieces, mid, forks = self.cut(pieces, repeated)
            path: list[int] = []
            leaf, new = insert_path(tree, node, pieces, terminal, cfg.merge_duplicate_steps, mid, path)
            if mid is not None:
                record_fork_points(tree, path, node, forks)
            new_live.extend(v for v in new if not tree.terminal[v])
            if not tree.terminal[leaf]:
                continue
            grade_rollout(live, leaf, leaf in new, eos, decode)
            ended.append((leaf, leaf in new))
        return new_live, True, ended

    def back_up(self, live: LiveTree, ended: list[tuple[int, bool]]) -> None:
        for leaf, fresh in ended:
            back_up_rollout(live, leaf, fresh)

    def next_node(self, live: LiveTree) -> int | None:
        return self.fork(live.tree, live.rng)

    def counted(self, live: LiveTree) -> int:
        return live.rollouts
