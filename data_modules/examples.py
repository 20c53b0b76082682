"""Turning finished searches into training rows, and rows into padded mini-batches.

One row per trajectory: the prompt, the response, and per response token its advantage,
its behaviour log-prob and its step index. Tree-GRPO (the default) gives every token of
step j the advantage q~(s_j) + overlong - mu_tree; flat rollouts carry the terminal reward
on every step, which makes the same formula DAPO (deepsearch.md §6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Literal, Sequence

import torch

from flywheel.adaptive import CachedSolution, mixed_rollout
from flywheel.finite import check_finite_fields
from flywheel.objectives import dapo_advantages, path_weights, per_token, subtree_advantages, tree_grpo_advantages
from flywheel.search.outputs import Trajectory, TreeResult

Weighting = Literal["node", "outcome", "subtree", "best_of_n", "self_training"]
ValueFn = Callable[[list[tuple[int, ...]]], Sequence[float]]


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
    """[len(response_ids)] the generator's log-probs; NaN where unknown (a cached solution,
    or a backend that gave none): the data module fills those with the trainer's own."""
    step_ids: tuple[int, ...]
    """[len(response_ids)] index of the step each token belongs to."""
    reward: float
    correct: bool = False
    """Verified correct (a cached solution is)."""


@dataclass(frozen=True)
class PathWeighting:
    """How `--data.credit.advantage=self_training` weights each path of a problem's tree (ReST-MCTS*
    self-training, `flywheel.objectives.self_training`): w_i = n_kept * softmax(score_i /
    temperature) over the problem's kept paths, 0 for the others.

    Args:
        source: a path's score: "outcome" = its verified reward; "value" = the value model's
            V(prompt + whole path) (PRMUpdate's, in [0, 1]). Until the first value model is
            fitted (the first round), "value" scores by the outcome.
        temperature: softmax temperature of the per-problem normalisation (the seed's 1.0);
            smaller concentrates a problem's weight on its best-scored paths.
        correct_only: keep the verified-correct paths only (ReST-MCTS*'s policy data: correct
            leaves); a problem with none trains nothing.
        threshold: the hard filter: leave out paths scored below it (the official code keeps
            correct leaves the value model scores >= 0.2); None = no threshold.
    """

    source: Literal["outcome", "value"] = "value"
    temperature: float = 1.0
    correct_only: bool = True
    threshold: float | None = None

    def __post_init__(self) -> None:
        check_finite_fields(self, "data.credit.path_weights")
        if self.source not in ("outcome", "value"):
            raise ValueError(f"--data.credit.path_weights.source={self.source!r}: choose 'value' (the value model's "
                             "estimate of each path) or 'outcome' (its verified reward)")
        if not self.temperature > 0:
            raise ValueError(f"--data.credit.path_weights.temperature must be > 0, got {self.temperature}; "
                             "1.0 is the seed's reward temperature")


def rows_from_result(
    result: TreeResult,
    group: int,
    weighting: Weighting = "node",
    normalize_std: bool = False,
    drop: Callable[[Trajectory], bool] | None = None,
) -> list[TrainingRow]:
    """Training rows of one tree (or one flat group).

    weighting "node": Tree-GRPO node-level advantages, q~(s_j) + overlong minus the group's
    mean final score (deepsearch.md §6; for a flat group q~ is the terminal reward, which is
    DAPO). "outcome": every token of a trajectory gets its final score minus the group mean
    (the paper's "coarse scores" ablation, Table 4). "subtree": the TreeRL rule over the
    tree's trajectories (`subtree_advantages`: a step's value is the mean final score of
    the trajectories through it, credited against its parent and the root; not divided by
    a std). "best_of_n": rejection-sampling
    fine-tuning, the best-of-N baseline: the correct trajectories only, each token with
    advantage +1 (none when nothing is correct). "self_training": every trajectory, with
    advantage 0 until `weight_paths` gives each row its path weight.
    `drop`: trajectories to leave out of training (e.g. garbled negatives, deepsearch.md §7);
    they still count in the group baseline, which describes the search as it happened.
    """
    trajectories = result.trajectories
    if not trajectories:
        return []
    if weighting == "best_of_n":
        chosen = [t for t in trajectories if t.verdict.correct]
        step_advantages = [[1.0] * len(t.steps) for t in chosen]
    elif weighting == "self_training":
        chosen = list(trajectories)
        step_advantages = [[0.0] * len(t.steps) for t in chosen]
    elif weighting == "subtree":
        chosen = list(trajectories)
        step_advantages = subtree_advantages([[s.node_id for s in t.steps] for t in chosen],
                                             [t.final_score for t in chosen])
    elif weighting == "outcome":
        chosen = list(trajectories)
        step_scores = [[t.final_score] * len(t.steps) for t in chosen]
        step_advantages = tree_grpo_advantages(step_scores, normalize_std=normalize_std)
    else:
        chosen = list(trajectories)
        step_scores = [[step.q_soft + t.overlong_penalty for step in t.steps] for t in chosen]
        # The terminal step's q_soft is its reward, so a row's last score is its final score.
        step_advantages = tree_grpo_advantages(step_scores, normalize_std=normalize_std)
    rows = []
    for trajectory, advantages in zip(chosen, step_advantages):
        if drop is not None and drop(trajectory):
            continue
        lengths = trajectory.step_lengths
        rows.append(
            TrainingRow(
                problem_id=result.problem_id,
                group=group,
                prompt_ids=result.prompt_ids,
                response_ids=trajectory.response_ids,
                advantages=tuple(per_token(advantages, lengths)),
                behaviour_logprobs=trajectory.response_logprobs,
                step_ids=tuple(j for j, n in enumerate(lengths) for _ in range(n)),
                reward=trajectory.reward,
                correct=trajectory.verdict.correct,
            )
        )
    return rows


def mixed_rows(
    problem_id: str,
    prompt_ids: tuple[int, ...],
    cached: Sequence[CachedSolution],
    direct: Sequence[Trajectory],
    group: int,
    n: int,
    normalize_std: bool = False,
    drop: Callable[[Trajectory], bool] | None = None,
) -> list[TrainingRow]:
    """A replay-buffer problem's mixed rollout (deepsearch.md §7): the cached correct
    solutions take the first min(#cached, n) places of the n direct samples; every response
    is scored by its outcome (a cached one is correct: +1), and that scalar minus the
    group mean is the advantage of every one of its tokens (no step values)."""
    items: list[Trajectory | CachedSolution] = mixed_rollout(list(cached), list(direct), n)
    scores = [1.0 if isinstance(item, CachedSolution) else item.final_score for item in items]
    advantages = dapo_advantages(torch.tensor(scores, dtype=torch.float64), normalize_std=normalize_std).tolist()
    rows = []
    for item, score, advantage in zip(items, scores, advantages):
        if isinstance(item, Trajectory) and drop is not None and drop(item):
            continue
        length = len(item.response_ids)
        behaviour = (float("nan"),) * length if isinstance(item, CachedSolution) else item.response_logprobs
        rows.append(
            TrainingRow(
                problem_id=problem_id,
                group=group,
                prompt_ids=prompt_ids,
                response_ids=tuple(item.response_ids),
                advantages=(advantage,) * length,
                behaviour_logprobs=behaviour,
                step_ids=(0,) * length,
                reward=score,
                correct=isinstance(item, CachedSolution) or item.verdict.correct,
            )
        )
    return rows


def weight_paths(
    per_problem: Sequence[Sequence[TrainingRow]], weighting: PathWeighting, value_fn: ValueFn | None = None
) -> list[list[TrainingRow]]:
    """Self-training rows: each row's advantages become its path weight (`path_weights`,
    normalised per problem; see `PathWeighting`); rows of weight 0 are left out, as the
    weighted log-likelihood gives them nothing to learn. With source "value", one
    `value_fn` call scores every path (prompt + response ids) of every problem.
    """
    rows = [row for problem_rows in per_problem for row in problem_rows]
    if not rows:
        return [[] for _ in per_problem]
    if weighting.source == "value" and value_fn is not None:
        values = list(value_fn([row.prompt_ids + row.response_ids for row in rows]))
        if len(values) != len(rows):
            raise RuntimeError(f"the value model returned {len(values)} values for {len(rows)} paths")
        scores = torch.tensor(values, dtype=torch.float64)
    else:
        scores = torch.tensor([row.reward for row in rows], dtype=torch.float64)
    keep = torch.ones(len(rows), dtype=torch.bool)
    if weighting.correct_only:
        keep &= torch.tensor([row.correct for row in rows])
    if weighting.threshold is not None:
        keep &= scores >= weighting.threshold
    groups = torch.tensor([i for i, problem_rows in enumerate(per_problem) for _ in problem_rows])
    weights = path_weights(scores, groups, weighting.temperature, keep).tolist()
    out: list[list[TrainingRow]] = [[] for _ in per_problem]
    for row, group, weight in zip(rows, groups.tolist(), weights):
        if weight > 0:
            out[group].append(replace(row, advantages=(weight,) * len(row.response_ids)))
    return out


def collate(rows: Sequence[TrainingRow], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors; per-token fields are aligned with the NEXT-token targets.

    Returns input_ids / attention_mask [B, L] and loss_mask / advantages /
    behaviour_logprobs / step_ids [B, L-1], where position t describes token t+1; plus
    group_ids and rewards [B]. behaviour_logprobs is NaN wherever it is unknown (and off the
    response): `fill_behaviour` replaces those with the trainer's log-probs.
    """
    if not rows:
        raise ValueError("cannot collate an empty mini-batch")
    length = max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    b = len(rows)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length - 1), dtype=torch.bool)
    advantages = torch.zeros((b, length - 1), dtype=torch.float32)
    behaviour = torch.full((b, length - 1), float("nan"), dtype=torch.float32)
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


def fill_behaviour(batch: dict[str, torch.Tensor], old_logprobs: torch.Tensor) -> None:
    """Attach pi_old [B, L-1] and use it wherever the generator's log-probs are unknown."""
    batch["old_logprobs"] = old_logprobs
    behaviour = batch["behaviour_logprobs"]
    batch["behaviour_logprobs"] = torch.where(torch.isnan(behaviour), old_logprobs, behaviour)


def mini_batches(
    per_problem: Sequence[Sequence[TrainingRow]],
    *,
    problems_per_rank: int,
    problems_per_batch: int,
    world: int,
    pad_id: int,
    score: Callable[[dict[str, torch.Tensor]], torch.Tensor],
) -> list[dict[str, torch.Tensor]]:
    """An epoch's collated mini-batches, `problems_per_batch` problems each (a problem's rows
    stay together: the group baseline needs them), pi_old filled in by `score` ([B, L-1]
    log-probs of the policy before the epoch's updates).

    Every rank makes the same number of optimizer steps, or DDP's gradient all-reduce would
    hang: with `world` > 1 a slot with nothing to train on becomes an all-masked batch. An
    epoch with nothing to train on at all (every group left out by a filter) is one
    all-masked batch too: an empty loader would end the fit ("No training batches")."""
    slots = math.ceil(problems_per_rank / problems_per_batch)
    batches = []
    for slot in range(slots):
        first = slot * problems_per_batch
        rows = [replace(row, group=group) for group, problem_rows in enumerate(per_problem[first : first + problems_per_batch])
                for row in problem_rows]
        if rows:
            batch = collate(rows, pad_id=pad_id)
            fill_behaviour(batch, score(batch))
        elif world > 1:
            batch = empty_batch(pad_id=pad_id)
        else:
            continue
        batches.append(batch)
    return batches or [empty_batch(pad_id=pad_id)]
