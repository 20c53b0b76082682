"""Step expansion, the paper's (deepsearch.md §1-5): an expansion samples n single steps of a
node and adds them all, grading the new terminals (`grow`); one of them (or every one) is backed
up (`back_up`); the next node is the selection rule's choice (§5). The rule is injected
(flywheel.search.rule_table.SELECTION), never named here.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Callable, Sequence

from flywheel.generation.base import Completion, SamplingParams
from flywheel.rewards import Verdict
from flywheel.search.backup import backup_trajectory
from flywheel.search.config import SearchConfig
from flywheel.search.expansion import Decode, SearchProblem, child_ends, distinct_steps, grade_terminal
from flywheel.search.terminal import choose_terminals
from flywheel.search.tree import SearchTree

if TYPE_CHECKING:
    from flywheel.search.live import LiveTree

SelectionRule = Callable[[SearchTree, int, bool, random.Random], int | None]
"""(tree, the node just expanded, whether that expansion added a terminal, the tree's rng) -> the
node to expand next, or None when nothing is left (the tree finishes "exhausted"): a selection
rule with its settings bound (flywheel.search.rule_table.SearchRule.bind). It reads the tree and
never changes it; it may draw from the rng."""


class StepExpansion:
    """The ExpansionMode of step expansion (flywheel.search.live), picking nodes by `select`."""

    def __init__(self, select: SelectionRule) -> None:
        self.select = select

    def sampling_params(self, live: LiveTree, node: int, params: SamplingParams) -> SamplingParams:
        return params  # one step, as the driver asks for it

    def width(self, live: LiveTree, node: int) -> int:
        return live.config.expansion_width

    def grow(self, live: LiveTree, completions: Sequence[Completion], decode: Decode,
             eos_ids: frozenset[int]) -> tuple[list[int], bool, list[int]]:
        cfg, tree, node = live.config, live.tree, live.next_node
        if cfg.merge_duplicate_steps:
            completions = distinct_steps(completions)
        ends, turns = child_ends(tree, node, completions, live.problem, decode, cfg.max_depth, eos_ids)
        terminal = [t for t, _ in ends]
        children = tree.add_children(node, completions, terminal, turns=turns)
        new_terminals: list[int] = []
        new_live: list[int] = []
        for child, is_terminal in zip(children, terminal):
            (new_terminals if is_terminal else new_live).append(child)
        grade_children(tree, node, children, ends, live.problem, decode, cfg, live.graded)
        live.terminals += len(new_terminals)
        if live.first_correct_tokens is None and any(tree.kind[c] == "correct" for c in new_terminals):
            live.first_correct_tokens = live.generated_tokens
        return new_live, bool(new_terminals), new_terminals

    def back_up(self, live: LiveTree, new_terminals: list[int]) -> None:
        if new_terminals:
            back_up_new_terminals(live, new_terminals)

    def next_node(self, live: LiveTree) -> int | None:
        return self.select(live.tree, live.last_expanded, live.produced_terminal, live.rng)

    def counted(self, live: LiveTree) -> int:
        return len(live.trajectories)  # backed-up trajectories


def back_up_new_terminals(live: LiveTree, new_terminals: list[int]) -> None:
    """Back up the chosen new terminals of an expansion (§3-4; all of them with
    `backup_all_terminals`) until the tree holds K trajectories."""
    cfg, tree = live.config, live.tree
    if cfg.terminal_choice == "entropy":
        missing = [t for t in new_terminals if tree.entropies[t] is None]
        if missing:
            raise RuntimeError(
                "search.terminal_choice='entropy' needs per-token entropies, but the generator returned "
                "Completion.entropies=None; use a backend that honours SamplingParams.top_logprobs or set "
                "search.terminal_choice='mean_nll'"
            )
        uncertainty = [tree.trajectory_mean_entropy(t) for t in new_terminals]
    else:
        uncertainty = [tree.trajectory_mean_nll(t) for t in new_terminals]
    chosen = choose_terminals(
        new_terminals,
        [tree.kind[t] or "incomplete" for t in new_terminals],
        uncertainty,
        rule=cfg.terminal_choice,
        rng=live.rng,
        back_up_all=cfg.ablations.backup_all_terminals,
    )
    for terminal in chosen:
        if len(live.trajectories) >= cfg.trajectories_per_tree:
            break
        reward = tree.reward[terminal]
        assert reward is not None
        backup_trajectory(tree, terminal, reward, cfg)
        tree.backup_index[terminal] = len(live.trajectories)
        live.trajectories.append(terminal)


def grade_children(
    tree: SearchTree,
    node: int,
    children: Sequence[int],
    ends: Sequence[tuple[bool, bool]],
    problem: SearchProblem,
    decode: Decode,
    config: SearchConfig,
    graded: dict[tuple[tuple[int, ...], bool], tuple[str, Verdict]],
) -> None:
    """Grade the terminal children of one expansion of `node` (`ends`: their (terminal, EOS)
    flags). Their responses are `node`'s response plus their own step, so the path to the
    root is walked once per expansion, not once per child; siblings that sampled the same
    step (and EOS flag) share one grading: the same text, verdict, kind and reward."""
    base: tuple[int, ...] | None = None
    twins: dict[tuple[tuple[int, ...], bool], int] = {}
    for child, (is_terminal, is_eos) in zip(children, ends):
        if not is_terminal:
            continue
        step = tuple(tree.tokens[child])
        twin = twins.get((step, is_eos))
        if twin is not None:
            tree.texts[child], tree.verdicts[child] = tree.texts[twin], tree.verdicts[twin]
            tree.kind[child], tree.reward[child] = tree.kind[twin], tree.reward[twin]
            continue
        twins[step, is_eos] = child
        if base is None:
            base = tuple(tree.response_ids(node))
        grade_terminal(tree, child, problem, decode, is_eos, config, graded, ids=base + step)
