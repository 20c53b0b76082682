"""What a finished search hands to training: trajectories with per-step values, and a JSON dump.

Values are read after the tree is complete (deepsearch.md §6: "after the tree is
complete"), not at the time each trajectory was backed up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from flywheel.rewards import Verdict
from flywheel.search.config import SearchConfig
from flywheel.search.tree import SearchTree
from flywheel.search.values import overlong_penalty, soft_clip

TreeStatus = Literal["complete", "solved", "expansion_cap", "exhausted"]
"""complete: K trajectories backed up. solved: stopped early, a correct answer found and
`search.stop_when_solved` trajectories backed up. expansion_cap: the tree hit max_expansions_per_tree
first and carries fewer than K. exhausted: nothing was left to expand (every leaf terminal)
before K; also fewer than K."""

JSON_FORMAT = "flywheel.search.tree/v1"


@dataclass(frozen=True)
class StepRecord:
    """One step (node) of a trajectory, with its values at the end of the search."""

    node_id: int
    depth: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Behaviour log-probs of `token_ids`, as the generator returned them (may hold NaN)."""
    q: float
    """Accumulated value q(s) (a sum, §4)."""
    q_soft: float
    """q~(s) = tanh(q / eps_q) * q_max for an intermediate step; the terminal reward for the
    terminal step (§6). A flat rollout's steps are never backed up (q = 0): its group is credited
    by outcome (DAPO: `ROLLOUTS["flat"]` in flywheel.objectives.credit), which reads no q~."""
    visits: int
    finish_reason: str
    observation_ids: tuple[int, ...] = ()
    """An environment's answer after the step (prefilled, never trained on); empty outside
    environments."""


@dataclass(frozen=True)
class Trajectory:
    """A backed-up root-to-terminal path: the unit of training data (K per tree)."""

    terminal_id: int
    backup_index: int
    """Order in which it was backed up within its tree (0 = first); -1 for a terminal that was
    not backed up but is trained on (`--data.search.ablations.train_all_terminals`)."""
    steps: tuple[StepRecord, ...]
    kind: str
    """"correct" | "incorrect" | "incomplete" (§2)."""
    reward: float
    """Terminal reward q(s_end) (Eq. 4)."""
    overlong_penalty: float
    """DAPO overlong penalty of the whole response (§2), 0 when off; added to every token score."""
    verdict: Verdict
    response_text: str
    """decode(response_ids): what the verifier graded."""

    @property
    def response_ids(self) -> tuple[int, ...]:
        """Every token after the prompt: each step, and in an episode the observation after it."""
        return tuple(t for step in self.steps for t in step.token_ids + step.observation_ids)

    @property
    def response_logprobs(self) -> tuple[float, ...]:
        """The behaviour log-prob of each token of `response_ids` (NaN on observations)."""
        nan = float("nan")
        return tuple(lp for step in self.steps for lp in step.logprobs + (nan,) * len(step.observation_ids))

    @property
    def step_lengths(self) -> tuple[int, ...]:
        """Tokens of each step in `response_ids` (its observation counted with it)."""
        return tuple(len(step.token_ids) + len(step.observation_ids) for step in self.steps)

    @property
    def loss_mask(self) -> tuple[bool, ...]:
        """Which tokens of `response_ids` the policy generated (and is trained on): empty when
        every one is (no observations)."""
        if not any(step.observation_ids for step in self.steps):
            return ()
        return tuple(m for step in self.steps
                     for m in (True,) * len(step.token_ids) + (False,) * len(step.observation_ids))

    @property
    def final_score(self) -> float:
        """The final token's score, reward + overlong: what the tree mean mu_t averages (§6)."""
        return self.reward + self.overlong_penalty


@dataclass(frozen=True)
class TreeStats:
    """Per-tree accounting (logged under search/)."""

    expansions: int
    """Generator requests made for this tree (iterations; the paper's Table 3 ~189)."""
    nodes: int
    generated_tokens: int
    max_depth: int
    """Depth of the deepest node."""
    terminals: int
    """Terminal nodes created (graded), backed up or not."""
    rounds: int
    """Driver rounds the tree was live."""
    wall_seconds: float
    """From joining the batch to finishing (includes waiting on shared generator calls)."""
    tokens_to_first_correct: int | None = None
    """Tokens generated for this tree until its first correct terminal appeared (None: never)."""
    reused_tokens: int = 0
    """Of `generated_tokens`, those of the responses sampled before the tree that it started
    from (`SearchProblem.first_rollouts`, `--data.batching.flat_first`); the DriverStats of the
    sampling that made them counts them, the tree's driver does not."""


@dataclass(frozen=True)
class TreeResult:
    """One problem's finished search (or flat rollouts): its trajectories and the whole tree."""

    index: int
    """Position of the problem in the input iterable."""
    problem_id: str
    prompt_ids: tuple[int, ...]
    trajectories: tuple[Trajectory, ...]
    status: TreeStatus
    stats: TreeStats
    config: SearchConfig
    tree: SearchTree = field(repr=False, compare=False)
    """The finished tree itself (read-only by convention), for the JSON dump and debugging."""
    mode: Literal["search", "flat"] = "search"
    """"search" = DeepSearch MCTS; "flat" = independent rollouts (DAPO / best-of-N baselines)."""

    @property
    def searched(self) -> bool:
        """Was this a tree search (not a flat group of independent rollouts)?"""
        return self.mode == "search"

    @property
    def complete(self) -> bool:
        """True when the tree stopped by its rule (K trajectories, or solved early); False when
        it ran out of budget or of nodes first (see status)."""
        return self.status in ("complete", "solved")

    def to_json(self, decode: Callable[[Sequence[int]], str] | None = None, *, logprobs: bool = True) -> dict[str, Any]:
        """The whole tree as plain JSON data (format "flywheel.search.tree/v1"), for the viewer."""
        return tree_to_json(self, decode=decode, logprobs=logprobs)


def node_soft_value(tree: SearchTree, node: int, config: SearchConfig) -> float:
    """q~ of one node: a terminal keeps its reward; otherwise tanh(q / eps_q) * q_max (§6)."""
    reward = tree.reward[node]
    if reward is not None:
        return reward
    return soft_clip(tree.value[node], config.soft_clip_eps, config.soft_clip_qmax)


def step_record(tree: SearchTree, node: int, config: SearchConfig) -> StepRecord:
    """The record of one node of a finished tree."""
    return StepRecord(
        node_id=node,
        depth=tree.depth[node],
        token_ids=tree.tokens[node],
        logprobs=tree.logprobs[node],
        q=tree.value[node],
        q_soft=node_soft_value(tree, node, config),
        visits=tree.visits[node],
        finish_reason=tree.finish[node] or "",
        observation_ids=tree.observation[node],
    )


def build_trajectory(
    tree: SearchTree,
    terminal: int,
    config: SearchConfig,
    shared_steps: dict[int, StepRecord] | None = None,
) -> Trajectory:
    """Read one backed-up trajectory out of a finished tree. `shared_steps` (node id -> its
    record) lets the trajectories of one finished tree share the records of their common
    prefix instead of building them once per trajectory (the tree no longer changes)."""
    steps = tuple(
        step_record(tree, node, config)
        if shared_steps is None
        else shared_steps.get(node) or shared_steps.setdefault(node, step_record(tree, node, config))
        for node in tree.path(terminal)[1:]
    )
    penalty = 0.0
    if config.overlong_penalty:
        length = tree.path_length[terminal]
        penalty = overlong_penalty(length, config.overlong_max_tokens, config.overlong_buffer_tokens)
    reward = tree.reward[terminal]
    kind = tree.kind[terminal]
    assert reward is not None and kind is not None, f"terminal {terminal} was never graded"
    return Trajectory(
        terminal_id=terminal,
        backup_index=tree.backup_index[terminal],
        steps=steps,
        kind=kind,
        reward=reward,
        overlong_penalty=penalty,
        verdict=tree.verdicts[terminal],
        response_text=tree.texts[terminal],
    )


def _num(x: float | None) -> float | None:
    """JSON has no NaN/inf: write them as null."""
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return x


_CONTEXT_TOKENS = 4
"""Tokens of the path before a step decoded with it: a character spans at most 4 UTF-8 bytes,
so at most 4 byte-level tokens."""


def step_text(tree: SearchTree, node: int, decode: Callable[[Sequence[int]], str]) -> str:
    """The text of `node`'s step as it reads in its path, not decoded alone: a character that
    a byte-level BPE splits between two steps (an emoji, a CJK character) shows whole in the
    step that completes it instead of as U+FFFD in both, and a SentencePiece step keeps its
    leading space. Joined along a path, the steps' texts give the path's text."""
    before: list[int] = []
    parent = tree.parent[node]
    while parent > 0 and len(before) < _CONTEXT_TOKENS:
        before[:0] = tree.tokens[parent] + tree.observation[parent]
        parent = tree.parent[parent]
    before = before[-_CONTEXT_TOKENS:]
    head = decode(before).rstrip("\ufffd")  # a partial character at its end is completed by this step
    whole = decode(before + list(tree.tokens[node]))
    text = whole[len(head):] if whole.startswith(head) else decode(tree.tokens[node])
    return text.rstrip("\ufffd") if tree.children[node] else text  # a child completes it


def tree_to_json(
    result: TreeResult, decode: Callable[[Sequence[int]], str] | None = None, *, logprobs: bool = True
) -> dict[str, Any]:
    """Dump a finished tree: every node (structure, N, q, Q, q~, step tokens, terminal info) and
    the trajectories as node-id paths. NaN and inf become null. `decode` adds each step's text."""
    # Long: one key per field of a node and of the tree, in the dumped format's order; splitting would scatter the format
    tree, config = result.tree, result.config
    nodes = []
    for node in range(len(tree)):
        verdict = tree.verdicts.get(node)
        entry: dict[str, Any] = {
            "id": node,
            "parent": tree.parent[node] if node else None,
            "depth": tree.depth[node],
            "children": list(tree.children[node]),
            "visits": tree.visits[node],
            "q": tree.value[node],
            "Q": tree.mean_q(node),
            "q_soft": node_soft_value(tree, node, config) if node else None,
            "terminal": tree.terminal[node],
            "kind": tree.kind[node],
            "reward": tree.reward[node],
            "backup_index": tree.backup_index[node] if tree.backup_index[node] >= 0 else None,
            "finish_reason": tree.finish[node],
            "token_ids": list(tree.tokens[node]),
            "mean_nll": _num(tree.step_mean_nll(node)) if node else None,
            "prm_value": _num(tree.prm_value[node]),
        }
        if logprobs:
            entry["logprobs"] = [_num(lp) for lp in tree.logprobs[node]]
        if decode is not None and node:
            entry["text"] = step_text(tree, node, decode)
        if node in tree.turns:  # an environment's answer to the node's action
            turn = tree.turns[node]
            entry["observation_ids"] = list(tree.observation[node])
            entry["turn"] = {"observation": turn.observation, "done": turn.done, "invalid": turn.invalid,
                             "reason": turn.reason}
        if verdict is not None:
            entry["verdict"] = {
                "correct": verdict.correct,
                "reward": verdict.reward,
                "answer": verdict.answer,
                "reason": verdict.reason,
            }
        nodes.append(entry)
    return {
        "format": JSON_FORMAT,
        "index": result.index,
        "problem_id": result.problem_id,
        "mode": result.mode,
        "status": result.status,
        "prompt_ids": list(result.prompt_ids),
        "prompt_text": decode(result.prompt_ids) if decode is not None else None,
        "config": config.to_dict(),
        "stats": {
            "expansions": result.stats.expansions,
            "nodes": result.stats.nodes,
            "generated_tokens": result.stats.generated_tokens,
            "max_depth": result.stats.max_depth,
            "terminals": result.stats.terminals,
            "rounds": result.stats.rounds,
            "wall_seconds": result.stats.wall_seconds,
            "tokens_to_first_correct": result.stats.tokens_to_first_correct,
        },
        "nodes": nodes,
        "trajectories": [
            {
                "terminal_id": t.terminal_id,
                "backup_index": t.backup_index,
                "node_ids": [s.node_id for s in t.steps],
                "kind": t.kind,
                "reward": t.reward,
                "overlong_penalty": t.overlong_penalty,
                "final_score": t.final_score,
                "response_text": t.response_text,
            }
            for t in result.trajectories
        ],
    }
