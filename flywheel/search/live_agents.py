"""One tree searched by several agents at once (selection "puct_agents", the seed's Countdown
MCTS, rest-mcts-and-countdown.md §B): its state between the driver's rounds.

A round: every agent descends by pUCT (flywheel.search.agents) with virtual loss on the paths
already taken this round. An agent that reaches a terminal backs its reward up at once; one
that reaches an unexpanded leaf asks for K sampled steps of it, and all of the tree's requests
go into the driver's one generator call with every other tree's. When the steps return they
become the leaf's children, terminals are graded, a value model scores the new non-terminal
nodes (one call per round for every tree, in the driver), and the leaf's own value is backed
up along its path while its virtual loss is removed. After `agents.iterations` rounds the
most-visited path to a terminal is the tree's one training trajectory. An agent's descent is
injected (a SELECTION rule with `agents`, flywheel.search.rule_table).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from flywheel.generation.base import Completion, GenerationRequest, SamplingParams
from flywheel.rewards import Verdict
from flywheel.search.agents import add_pending, back_up_value, greedy_terminal, initial_value
from flywheel.search.config import SearchConfig
from flywheel.search.expansion import Decode, SearchProblem, child_ends, derive_seed, distinct_steps
from flywheel.search.live import finished_result
from flywheel.search.outputs import TreeResult, build_trajectory
from flywheel.search.step_expansion import grade_children
from flywheel.search.tree import ROOT, SearchTree

AgentDescent = Callable[[SearchTree, Sequence[int]], int | None]
"""(tree, pending selections per node this round) -> where one agent's descent stops: a terminal
or an unexpanded leaf, or None when nothing is open: a selection rule with `agents`, its settings
bound (flywheel.search.rule_table.SearchRule.bind). Reads the tree, never changes it."""


class AgentTree:
    """One shared tree and its agents' pending selections (the phases of the driver's round, as a
    LiveTree has them: requests, grow, back_up, new_live_children, select, done, result)."""

    def __init__(self, index: int, problem: SearchProblem, config: SearchConfig, descend: AgentDescent) -> None:
        self.index = index
        self.problem = problem
        self.config = config
        self.descend = descend
        self.tree = SearchTree(problem.prompt_ids)
        self.pending: list[int] = [0]
        self.leaves: list[int] = [ROOT]
        """This round's unexpanded leaves, one per agent that reached one (the first round: the root)."""
        add_pending(self.tree, self.pending, ROOT, 1)
        self.expansions = 0
        self.selection_rounds = 1
        """Rounds in which the agents selected (the first: the root); M of them per tree."""
        self.rounds = 0
        self.generated_tokens = 0
        self.terminals = 0
        self.first_correct_tokens: int | None = None
        self.graded: dict[tuple[tuple[int, ...], bool], tuple[str, Verdict]] = {}
        self.trajectories: list[int] = []
        self.status: str | None = None
        self.started = time.perf_counter()
        self._new_live: list[int] = []

    def requests(self, params: SamplingParams) -> list[GenerationRequest]:
        """One request per agent that reached an unexpanded leaf this round; none once finished."""
        if self.status is not None:
            return []
        return [
            GenerationRequest(
                prompt_ids=self.tree.prefix_ids(leaf),
                n=self.config.expansion_width,
                params=params,
                seed=derive_seed(self.config.seed, self.index, self.expansions + i),
                affinity=self.index,
            )
            for i, leaf in enumerate(self.leaves)
        ]

    def grow(self, outputs: Sequence[Sequence[Completion]], decode: Decode, eos_ids: frozenset[int]) -> None:
        """Hang each leaf's sampled steps below it and grade the new terminals; the backup waits
        for the value model (`select`)."""
        if self.status is not None:
            return
        cfg, tree = self.config, self.tree
        self._new_live = []
        for leaf, completions in zip(self.leaves, outputs, strict=True):
            self.generated_tokens += sum(len(c.token_ids) for c in completions)
            self.expansions += 1
            tree.expanded[leaf] += 1
            if cfg.merge_duplicate_steps:
                completions = distinct_steps(completions)
            ends, turns = child_ends(tree, leaf, completions, self.problem, decode, cfg.max_depth, eos_ids)
            children = tree.add_children(leaf, completions, [t for t, _ in ends], initial_visit=False, turns=turns)
            grade_children(tree, leaf, children, ends, self.problem, decode, cfg, self.graded)
            for child, (is_terminal, _) in zip(children, ends):
                if is_terminal:
                    self.terminals += 1
                    if self.first_correct_tokens is None and tree.kind[child] == "correct":
                        self.first_correct_tokens = self.generated_tokens
                else:
                    self._new_live.append(child)
        self.rounds += 1

    def new_live_children(self) -> list[int]:
        """The non-terminal nodes this round added (what a value model scores)."""
        return self._new_live

    def back_up(self) -> None:
        """Nothing yet: an expansion backs up V of the expanded leaf, which the value model gives
        after this phase of the round (the leaves are backed up at the start of `select`)."""

    @property
    def done(self) -> bool:
        return self.status is not None

    def select(self) -> None:
        """Back up this round's expansions, then let the agents select the next round's leaves;
        finish after M rounds, at the expansion cap, or when nothing is left to expand."""
        if self.status is not None:
            return
        tree, cfg = self.tree, self.config
        for leaf in self.leaves:
            add_pending(tree, self.pending, leaf, -1)
            back_up_value(tree, leaf, initial_value(tree, leaf))
        self.pending.extend([0] * (len(tree) - len(self.pending)))
        self.leaves = []
        # A round is one descent per agent (M rounds: the reference's M iterations per worker).
        # Rounds without any expansion (every agent revisited a terminal) cost no tokens: go on
        # selecting until some agent reaches a leaf or the rounds run out.
        while not self.leaves:
            if self.selection_rounds >= cfg.agents.iterations:
                self.status = "complete"
            elif self.expansions >= cfg.max_expansions_per_tree:
                self.status = "expansion_cap"
            if self.status is not None:
                return
            moved = False
            self.selection_rounds += 1
            for _ in range(cfg.agents.count):
                if self.expansions + len(self.leaves) >= cfg.max_expansions_per_tree:
                    break
                node = self.descend(tree, self.pending)
                if node is None:
                    break
                moved = True
                if tree.terminal[node]:
                    back_up_value(tree, node, initial_value(tree, node))
                else:
                    add_pending(tree, self.pending, node, 1)
                    self.leaves.append(node)
            if not moved:
                self.status = "exhausted"
                return

    def result(self) -> TreeResult:
        assert self.status is not None
        tree = self.tree
        terminal = greedy_terminal(tree)
        trajectories = ()
        if terminal is not None:
            tree.backup_index[terminal] = 0
            self.trajectories = [terminal]
            trajectories = (build_trajectory(tree, terminal, self.config),)
        return finished_result(self, trajectories)
