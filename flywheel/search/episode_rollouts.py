"""Rollout expansion over an environment's turns: the rollout tree for episodes.

Rollout expansion (flywheel.search.rollout) samples each continuation of a fork node whole, in
one generator call. An episode cannot be sampled so: after each action the environment answers,
and the next action is sampled after that answer. So here a rollout is played turn by turn:
an expansion starts n rollouts at the node the fork rule chose, and every round each unfinished
rollout asks for its next action (rollouts standing at the same node share one request of as
many samples), the environment answers, and the rollout moves to the new node, until the
environment says done or the turn limit ends it. Then the trajectory is graded and backed up as
a rollout expansion's is, and once all n are finished the fork rule picks the next node. Every
other rollout-tree rule holds: K counts rollouts, identical actions from one node are one node
(`merge_duplicate_steps`), `stop_when_solved` and `max_expansions_per_tree` (counting forks) stop
the tree.

Forks are at turn boundaries only: cutting inside an action (fork rule "entropy") and starting
from flat samples (`flat_first`) need whole responses and are refused for episodes.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence

from flywheel.generation.base import Completion, GenerationRequest, SamplingParams
from flywheel.search.config import SearchConfig
from flywheel.search.expansion import Decode, SearchProblem, child_ends, derive_seed
from flywheel.search.live import LiveTree
from flywheel.search.rollout import back_up_rollout, grade_rollout, same_child

if TYPE_CHECKING:
    from flywheel.search.rollout import RolloutExpansion


class EpisodeRolloutTree(LiveTree):
    """A rollout-expansion tree whose rollouts are episodes, played a turn a round (the module
    docstring). `cursors`: the node each unfinished rollout of the current expansion stands at."""

    def __init__(self, index: int, problem: SearchProblem, config: SearchConfig, mode: RolloutExpansion) -> None:
        if mode.cut is not None:
            raise ValueError(f"problem {problem.id!r} is an environment's episode: its rollouts fork at turns, not "
                             f"inside an action; --data.search.fork_rule={config.fork_rule} cuts whole responses "
                             "(use uct, random or root)")
        super().__init__(index, problem, config, mode)
        self.cursors: list[int] = []
        self._asked: list[tuple[int, int]] = []
        self._calls = 0

    def requests(self, params: SamplingParams) -> list[GenerationRequest]:
        """One request per node an unfinished rollout stands at, n = the rollouts there; a new
        expansion's n rollouts all start at the fork node (one request of n samples)."""
        if self.status is not None:
            return []
        if not self.cursors:
            self.cursors = [self.next_node] * self.mode.width(self, self.next_node)
        self._asked = sorted(Counter(self.cursors).items())
        out = []
        for node, n in self._asked:
            out.append(GenerationRequest(prompt_ids=self.tree.prefix_ids(node), n=n, params=params,
                                         seed=derive_seed(self.config.seed, self.index, self._calls),
                                         affinity=self.index))
            self._calls += 1
        return out

    def grow(self, outputs: Sequence[Sequence[Completion]], decode: Decode, eos_ids: frozenset[int]) -> None:
        """Each rollout's next action becomes a node below the one it stood at, with the
        environment's answer; a finished episode is graded (`back_up` backs it up)."""
        if self.status is not None:
            return
        if len(outputs) != len(self._asked):
            raise RuntimeError(f"{len(outputs)} outputs for {len(self._asked)} requests")
        cursors: list[int] = []
        self.new_live, self.produced_terminal, self._graded = [], False, []
        for (node, _), completions in zip(self._asked, outputs):
            self.generated_tokens += sum(len(c.token_ids) for c in completions)
            cursors += self._advance(node, completions, decode, eos_ids)
        self.cursors = cursors
        self.rounds += 1

    def back_up(self) -> None:
        """Back up the episodes that finished this round. The expansion ends when every rollout
        has finished; only then may the tree stop."""
        if self.status is not None:
            return
        for leaf, fresh in self._graded:
            back_up_rollout(self, leaf, fresh)
        if not self.cursors:
            self.tree.expanded[self.next_node] += 1
            self.expansions += 1
            self.last_expanded = self.next_node
            self._check_stop()

    def _advance(self, node: int, completions: Sequence[Completion], decode: Decode,
                 eos_ids: frozenset[int]) -> list[int]:
        """Hang each completion below `node` (an existing identical child is reused with
        `merge_duplicate_steps`); returns the nodes of the rollouts that go on."""
        cfg, tree = self.config, self.tree
        ends, turns = child_ends(tree, node, completions, self.problem, decode, cfg.max_depth, eos_ids)
        assert turns is not None
        going_on = []
        for completion, (terminal, eos), turn in zip(completions, ends, turns):
            child = same_child(tree, node, completion.token_ids) if cfg.merge_duplicate_steps else None
            fresh = child is None
            if fresh:
                (child,) = tree.add_children(node, [completion], [terminal], extend=True, turns=[turn])
                if not terminal:
                    self.new_live.append(child)
            if not terminal:
                going_on.append(child)
                continue
            self.produced_terminal = True
            grade_rollout(self, child, fresh, eos, decode)
            self._graded.append((child, fresh))
        return going_on

    def select(self) -> None:
        """While rollouts are in flight the expansion goes on; after it, the fork rule's node."""
        if not self.cursors:
            super().select()
