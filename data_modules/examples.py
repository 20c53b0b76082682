"""Turning finished searches into training rows, and rows into padded mini-batches.

One row per trajectory: the prompt, the response, and per response token its advantage,
its behaviour log-prob and its step index. Tree-GRPO (the default) gives every token of
step j the advantage q~(s_j) + overlong - mu_tree; flat rollouts carry the terminal reward
on every step, which makes the same formula DAPO (deepsearch.md §6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from flywheel.objectives import per_token, tree_grpo_advantages
from flywheel.search.outputs import TreeResult

Weighting = Literal["advantage", "best_of_n"]


@dataclass(frozen=True)
class TrainingRow:
    """One trajectory ready for the objective."""

    problem_id: str
    group: int
    """Index of its tree (or flat group) within the epoch."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    advantages: tuple[float, ...]
    """[len(response_ids)] per-token advantage."""
    behaviour_logprobs: tuple[float, ...]
    """[len(response_ids)] the generator's log-probs (NaN replaced by 0)."""
    step_ids: tuple[int, ...]
    """[len(response_ids)] index of the step each token belongs to."""
    reward: float


def rows_from_result(result: TreeResult, group: int, weighting: Weighting = "advantage", normalize_std: bool = False) -> list[TrainingRow]:
    """Training rows of one tree (or one flat group).

    weighting "advantage": Tree-GRPO / DAPO advantages (node score minus the group's mean
    final score). "best_of_n": rejection-sampling fine-tuning, the best-of-N baseline: the
    correct trajectories only, each token with advantage +1 (none when nothing is correct).
    """
    trajectories = result.trajectories
    if not trajectories:
        return []
    if weighting == "best_of_n":
        chosen = [t for t in trajectories if t.verdict.correct]
        step_advantages = [[1.0] * len(t.steps) for t in chosen]
    else:
        chosen = list(trajectories)
        step_scores = [[step.q_soft + t.overlong_penalty for step in t.steps] for t in chosen]
        # The terminal step's q_soft is its reward, so a row's last score is its final score.
        step_advantages = tree_grpo_advantages(step_scores, normalize_std=normalize_std)
    rows = []
    for trajectory, advantages in zip(chosen, step_advantages):
        lengths = trajectory.step_lengths
        rows.append(
            TrainingRow(
                problem_id=result.problem_id,
                group=group,
                prompt_ids=result.prompt_ids,
                response_ids=trajectory.response_ids,
                advantages=tuple(per_token(advantages, lengths)),
                behaviour_logprobs=tuple(0.0 if math.isnan(x) else x for x in trajectory.response_logprobs),
                step_ids=tuple(j for j, n in enumerate(lengths) for _ in range(n)),
                reward=trajectory.reward,
            )
        )
    return rows


def collate(rows: Sequence[TrainingRow], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors; per-token fields are aligned with the NEXT-token targets.

    Returns input_ids / attention_mask [B, L] and loss_mask / advantages /
    behaviour_logprobs / step_ids [B, L-1], where position t describes token t+1; plus
    group_ids and rewards [B].
    """
    if not rows:
        raise ValueError("cannot collate an empty mini-batch")
    length = max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    b = len(rows)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length - 1), dtype=torch.bool)
    advantages = torch.zeros((b, length - 1), dtype=torch.float32)
    behaviour = torch.zeros((b, length - 1), dtype=torch.float32)
    step_ids = torch.full((b, length - 1), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        input_ids[i, : p + r] = torch.tensor(row.prompt_ids + row.response_ids)
        attention_mask[i, : p + r] = 1
        span = slice(p - 1, p - 1 + r)  # targets p .. p+r-1 are predicted at positions p-1 ..
        loss_mask[i, span] = True
        advantages[i, span] = torch.tensor(row.advantages)
        behaviour[i, span] = torch.tensor(row.behaviour_logprobs)
        step_ids[i, span] = torch.tensor(row.step_ids)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "advantages": advantages,
        "behaviour_logprobs": behaviour,
        "step_ids": step_ids,
        "group_ids": torch.tensor([r.group for r in rows], dtype=torch.long),
        "rewards": torch.tensor([r.reward for r in rows], dtype=torch.float32),
    }


def empty_batch(pad_id: int) -> dict[str, torch.Tensor]:
    """A one-row batch with no response token: loss 0, zero gradients. Keeps the number of
    optimizer steps equal on every rank when a rank has nothing to train on in a slot."""
    return {
        "input_ids": torch.full((1, 2), pad_id, dtype=torch.long),
        "attention_mask": torch.ones((1, 2), dtype=torch.long),
        "loss_mask": torch.zeros((1, 1), dtype=torch.bool),
        "advantages": torch.zeros((1, 1)),
        "behaviour_logprobs": torch.zeros((1, 1)),
        "old_logprobs": torch.zeros((1, 1)),
        "step_ids": torch.full((1, 1), -1, dtype=torch.long),
        "group_ids": torch.zeros(1, dtype=torch.long),
        "rewards": torch.zeros(1),
    }
