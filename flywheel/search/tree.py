"""SearchTree: one problem's search tree, stored as flat per-node lists indexed by node id.

Node 0 is the root (the prompt, depth 0); every other node is one reasoning step, a span
of generated token ids; in an environment's episode (flywheel.tasks.environment) a step is one
action, followed by the environment's observation (prefilled tokens the next step continues).
A node stores only its own step; the prefix it continues is rebuilt by walking parents (no
full-prefix copy per node). Per node we keep what the rules need in O(1): visit count N,
accumulated value q (a SUM, deepsearch.md §4), and running sums along the path from the root
(NLL, entropy, response length) so that a terminal's trajectory statistics cost nothing to read.

The tree does no search logic beyond the structural bookkeeping of §1 (a new non-terminal
child starts with N = 1) and two derived sets the selection rules read:
- the frontier: non-terminal nodes without children (§5's F), grouped by parent;
- dead nodes: terminal, or expanded with every child dead (nothing left to expand below).

Three fields are written by one rule family only and still live here: `mid_step` (the entropy
fork's cuts; the structure reads it for depth, a prefix's open step and merging), `fork_points`
(where those cuts were: rules keep no state, one object serving every tree, and the tree's dump
shows them) and `prm_value` (a value model's score: an input of every selection and fork rule
and of the agents' backup, not of one rule).
"""

from __future__ import annotations

import math
from typing import Sequence

from flywheel.generation.base import Completion
from flywheel.rewards import Verdict
from flywheel.tasks.environment import Turn

ROOT = 0


def _finite_sum(values: Sequence[float]) -> tuple[float, int]:
    """Sum and count of the non-NaN entries (NaN log-probs are skipped, see terminal.py)."""
    total = sum(values, 0.0)
    if total == total:  # not NaN: the fast path
        return total, len(values)
    kept = [v for v in values if v == v]
    return sum(kept, 0.0), len(kept)


class SearchTree:
    """Flat storage of one search tree. Node ids are creation order, root = 0."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self.prompt_ids: tuple[int, ...] = tuple(prompt_ids)
        # Structure.
        self.parent: list[int] = [-1]
        self.children: list[tuple[int, ...]] = [()]
        """Tuples, set once at expansion (tuples of ints are untracked by the cyclic GC)."""
        self.depth: list[int] = [0]
        """Reasoning steps from the root to the node's end. A `mid_step` node ends inside a step,
        so it has its parent's depth and the node completing that step counts it."""
        self.mid_step: list[bool] = [False]
        """The node ends inside a step: a rollout cut before a high-entropy token (fork_rule
        "entropy"); its children continue the same step."""
        self.fork_points: dict[int, float] = {}
        """Rollout fork_rule "entropy": node -> entropy of the token that followed it in a rollout,
        for the nodes a rollout was cut at (the highest such entropy when several were)."""
        # Statistics (§4): N and q (a sum); Q = q / N is derived.
        self.visits: list[int] = [0]
        self.value: list[float] = [0.0]
        self.prm_value: list[float] = [math.nan]
        """A value model's score of the node (NaN = not scored)."""
        # The step itself.
        self.tokens: list[tuple[int, ...]] = [()]
        """The node's own generated tokens (its step, or its action)."""
        self.observation: list[tuple[int, ...]] = [()]
        """An environment's answer to the node's action, as token ids after its step: prefilled,
        never sampled or trained on; empty outside environments."""
        self.logprobs: list[tuple[float, ...]] = [()]
        self.entropies: list[tuple[float, ...] | None] = [None]
        self.finish: list[str | None] = [None]
        # Per-step sums of finite log-probs, and running sums along the path from the root.
        self.step_logprob_sum: list[float] = [0.0]
        self.step_logprob_count: list[int] = [0]
        self.path_nll_sum: list[float] = [0.0]
        self.path_nll_count: list[int] = [0]
        self.path_entropy_sum: list[float] = [0.0]
        self.path_entropy_count: list[int] = [0]
        self.path_length: list[int] = [0]
        # Terminals: kind ("correct" | "incorrect" | "incomplete") and reward once graded,
        # backup_index = order among backed-up trajectories (-1 = not backed up).
        self.terminal: list[bool] = [False]
        self.kind: list[str | None] = [None]
        self.reward: list[float | None] = [None]
        self.backup_index: list[int] = [-1]
        self.expanded: list[int] = [0]
        """Generator requests made for this node (1 for a step-mode expansion; a rollout-mode
        node is expanded once per fork from it; 0 for steps that came inside a rollout)."""
        self.turns: dict[int, Turn] = {}
        """An environment's answer to each node's action (nodes of an episode only)."""
        self.verdicts: dict[int, Verdict] = {}
        self.texts: dict[int, str] = {}
        """Graded terminals: the decoded response text the verifier saw."""
        # Derived sets for selection.
        self.dead: list[bool] = [False]
        self.live_children: list[int] = [0]
        self.frontier: dict[int, list[int]] = {}
        """parent id -> its children that are in F (non-terminal, no children), ids ascending."""

    def __len__(self) -> int:
        return len(self.parent)

    # ----------------------------------------------------------------------------- growth
    def add_children(
        self,
        node: int,
        completions: Sequence[Completion],
        terminal: Sequence[bool],
        *,
        initial_visit: bool = True,
        extend: bool = False,
        mid_step: Sequence[bool] | None = None,
        turns: Sequence[tuple[Turn, tuple[int, ...]]] | None = None,
    ) -> list[int]:
        """Attach one child per completion under the leaf `node`; return the new ids.

        `terminal[i]` says whether child i ends its trajectory (EOS or max depth, §1).
        With `initial_visit`, a new non-terminal child starts with N = 1 and no value (§1);
        terminal children start at N = 0 and get their visit from the backup (§4).
        `extend`: `node` may already have children (rollout expansion forks from inner
        nodes); the new ones are added after them. `mid_step[i]`: child i ends inside a step
        (it keeps `node`'s depth; see `depth`); None = every child ends its step. `turns[i]`:
        the environment's answer to child i's action and its observation's token ids.
        """
        k = len(completions)
        self._check_expansion(node, k, terminal, extend, mid_step)
        first = len(self.parent)
        new_ids = list(range(first, first + k))
        self._append_shared(node, k, terminal, mid_step)
        live = self._append_steps(node, new_ids, completions, terminal, initial_visit)
        self._attach(node, new_ids, live)
        if turns is not None:
            if len(turns) != k:
                raise ValueError(f"{k} completions but {len(turns)} environment turns")
            for child, (turn, observation) in zip(new_ids, turns):
                self.turns[child] = turn
                self.observation[child] = tuple(observation)
        return new_ids

    def _check_expansion(self, node: int, k: int, terminal: Sequence[bool], extend: bool,
                         mid_step: Sequence[bool] | None) -> None:
        if self.children[node] and not extend:
            raise ValueError(f"node {node} is already expanded; only leaves are expanded")
        if self.terminal[node]:
            raise ValueError(f"node {node} is terminal and cannot be expanded")
        if len(terminal) != k:
            raise ValueError(f"{k} completions but {len(terminal)} terminal flags")
        if mid_step is not None:
            if len(mid_step) != k:
                raise ValueError(f"{k} completions but {len(mid_step)} mid_step flags")
            if any(m and t for m, t in zip(mid_step, terminal)):
                raise ValueError("a terminal child ends its trajectory, so it cannot end inside a step")

    def _append_shared(self, node: int, k: int, terminal: Sequence[bool], mid_step: Sequence[bool] | None) -> None:
        """The fields every new child of `node` starts with the same value (or a flag): one
        extend each (this runs for every expansion of every live tree, issue 18)."""
        self.parent.extend([node] * k)
        self.children.extend([()] * k)
        self.observation.extend([()] * k)
        if mid_step is None:
            self.depth.extend([self.depth[node] + 1] * k)
            self.mid_step.extend([False] * k)
        else:
            self.depth.extend(self.depth[node] + (not m) for m in mid_step)
            self.mid_step.extend(mid_step)
        self.value.extend([0.0] * k)
        self.prm_value.extend([math.nan] * k)
        self.kind.extend([None] * k)
        self.reward.extend([None] * k)
        self.backup_index.extend([-1] * k)
        self.expanded.extend([0] * k)
        self.live_children.extend([0] * k)
        self.terminal.extend(terminal)
        self.dead.extend(terminal)

    def _append_steps(self, node: int, new_ids: Sequence[int], completions: Sequence[Completion],
                      terminal: Sequence[bool], initial_visit: bool) -> list[int]:
        """Each child's own fields: its step, its visits, its log-prob and entropy sums and the
        running sums from the root. Returns the non-terminal (live) children."""
        nll, nll_n = self.path_nll_sum[node], self.path_nll_count[node]
        ent_sum, ent_n = self.path_entropy_sum[node], self.path_entropy_count[node]
        length = self.path_length[node]
        live: list[int] = []
        for child, completion, is_terminal in zip(new_ids, completions, terminal):
            logprobs = completion.logprobs
            lp_sum, lp_count = sum(logprobs, 0.0), len(logprobs)
            if lp_sum != lp_sum:  # a NaN among them: _finite_sum skips it (the common case needs no call)
                lp_sum, lp_count = _finite_sum(logprobs)
            ent = completion.entropies
            e_sum, e_count = _finite_sum(ent) if ent is not None else (0.0, 0)
            self.visits.append(1 if (initial_visit and not is_terminal) else 0)
            self.tokens.append(completion.token_ids)
            self.logprobs.append(logprobs)
            self.entropies.append(ent)
            self.finish.append(completion.finish_reason)
            self.step_logprob_sum.append(lp_sum)
            self.step_logprob_count.append(lp_count)
            self.path_nll_sum.append(nll - lp_sum)
            self.path_nll_count.append(nll_n + lp_count)
            self.path_entropy_sum.append(ent_sum + e_sum)
            self.path_entropy_count.append(ent_n + e_count)
            self.path_length.append(length + len(completion.token_ids))
            if not is_terminal:
                live.append(child)
        return live

    def _attach(self, node: int, new_ids: Sequence[int], live: Sequence[int]) -> None:
        """`node` gains the children; the frontier F loses `node` and gains its live children;
        a node whose only children are terminal is dead, one that gains a live child lives."""
        had_children = bool(self.children[node])
        self.children[node] = self.children[node] + tuple(new_ids)
        self.live_children[node] += len(live)
        siblings = self.frontier.get(self.parent[node])
        if siblings is not None and node in siblings:
            siblings.remove(node)
            if not siblings:
                del self.frontier[self.parent[node]]
        if live:
            self.frontier.setdefault(node, []).extend(live)
            if self.dead[node]:
                self._mark_live(node)
        elif not had_children:
            self._mark_dead(node)

    def _mark_live(self, node: int) -> None:
        """`node` (dead until now) gained a live child: it and its dead ancestors live again."""
        while node >= 0 and self.dead[node]:
            self.dead[node] = False
            parent = self.parent[node]
            if parent >= 0:
                self.live_children[parent] += 1
            node = parent

    def _mark_dead(self, node: int) -> None:
        """`node` has nothing left to expand below it; propagate to ancestors whose children all died."""
        while node >= 0 and not self.dead[node]:
            self.dead[node] = True
            parent = self.parent[node]
            if parent < 0:
                return
            self.live_children[parent] -= 1
            if self.live_children[parent] > 0:
                return
            node = parent

    # ---------------------------------------------------------------------------- reading
    def path(self, node: int) -> list[int]:
        """Node ids from the root to `node`, both included."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parent[node]
        out.reverse()
        return out

    def response_ids(self, node: int) -> list[int]:
        """The generated token ids from the root to `node` (the prompt and observations excluded)."""
        out: list[int] = []
        for step in self.path(node)[1:]:
            out.extend(self.tokens[step])
        return out

    def context_ids(self, node: int) -> list[int]:
        """Everything after the prompt up to `node`: each step and the observation after it."""
        out: list[int] = []
        for step in self.path(node)[1:]:
            out.extend(self.tokens[step])
            out.extend(self.observation[step])
        return out

    def prefix_ids(self, node: int) -> tuple[int, ...]:
        """Prompt + response up to `node` (with any observation after it): what the generator
        continues to expand `node`."""
        return self.prompt_ids + tuple(self.context_ids(node))

    def mean_q(self, node: int) -> float:
        """Q(s) = q(s) / N(s), 0 for an unvisited node (used only for selection, §5)."""
        n = self.visits[node]
        return self.value[node] / n if n else 0.0

    def step_mean_nll(self, node: int) -> float:
        """Mean NLL of the node's own step (the code's H(s) for the frontier's lambda2 term)."""
        count = self.step_logprob_count[node]
        return -self.step_logprob_sum[node] / count if count else math.nan

    def trajectory_mean_nll(self, node: int) -> float:
        """Mean NLL over every finite sampled-token log-prob from the root to `node`; +inf if none."""
        count = self.path_nll_count[node]
        return self.path_nll_sum[node] / count if count else math.inf

    def trajectory_mean_entropy(self, node: int) -> float:
        """Mean per-token entropy from the root to `node`; +inf if the generator gave none."""
        count = self.path_entropy_count[node]
        return self.path_entropy_sum[node] / count if count else math.inf
