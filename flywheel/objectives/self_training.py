"""ReST-MCTS* self-training of the policy on its search trees, as pure tensor functions.

The fourth stage of a ReST-MCTS* round (shared/specs/rest-mcts-and-countdown.md §A, and the
seed's close reading of the paper, §2.4 and §3.4): every root-to-terminal path of a problem's
tree is weighted by its (estimated) reward, and the policy maximises the weighted
log-likelihood of the paths, with a KL penalty that keeps it near a frozen reference so a few
rounds do not collapse it into one pattern:

    L = -sum_i sum_t w_i * log pi_theta(y_it) / N  +  kl_coef * KL(pi_theta || pi_ref)

`path_weights` turns the paths' scores (the verified outcome, or the value model's V of the
whole path) into w_i, normalised per problem; `weight_paths` puts them on a problem's training
rows (`--data.credit.path_weights`, `PathWeighting`); `self_training_loss` is L. The
hard-filter variant (the official code's SFT on correct leaves, optionally those the value
model scores >= 0.2) is the same loss with the weights of the paths under a threshold set to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Sequence

import torch

from flywheel.finite import check_finite_fields
from flywheel.objectives.aggregation import aggregate, masked_mean
from flywheel.objectives.config import ObjectiveConfig
from flywheel.objectives.kl import kl_per_token
from flywheel.prm import ValueFn

if TYPE_CHECKING:
    from flywheel.objectives.paths import TrainingRow

_D = ObjectiveConfig


@dataclass(frozen=True)
class PathWeighting:
    """How `--data.credit.advantage=self_training` weights each path of a problem's tree:
    w_i = n_kept * softmax(score_i / temperature) over the problem's kept paths, 0 for the others.

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


def path_weights(
    scores: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-path weights of reward-weighted self-training, normalised per problem.

    Within each group (one problem's paths), over the kept paths only:

        w_i = n_kept * softmax_i(score_i / temperature)

    so a problem's kept weights average 1 (equal scores give plain fine-tuning, weight 1 per
    path, whatever the number of paths), a higher-scoring path gets exp(delta / temperature)
    times the weight of a lower one, and a path that is not kept gets 0. A group with no
    kept path gets all zeros (ReST-MCTS* emits nothing for a tree without a usable path).

    Args:
        scores: [N] one score per path (its reward, or the value model's estimate).
        group_ids: [N] problem of each path; None = one problem.
        temperature: > 0; small = close to training on each problem's best paths only.
        keep: [N] bool, the hard filter (e.g. correct, or score >= threshold); None = all.
    Returns:
        [N] weights >= 0.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [N], got shape {tuple(scores.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if group_ids is None:
        group_ids = torch.zeros_like(scores, dtype=torch.long)
    if keep is None:
        keep = torch.ones_like(scores, dtype=torch.bool)
    if group_ids.shape != scores.shape or keep.shape != scores.shape:
        raise ValueError(
            f"scores {tuple(scores.shape)}, group_ids {tuple(group_ids.shape)} and keep "
            f"{tuple(keep.shape)} must share one [N] shape"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)  # [N] in 0..G-1
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    logits = torch.where(keep, scores / temperature, torch.full_like(scores, -torch.inf))  # [N]
    # Per-group max for a stable exp; a group with nothing kept has max -inf, replaced by 0.
    group_max = scores.new_full((n_groups,), -torch.inf).scatter_reduce(0, inverse, logits, "amax")  # [G]
    group_max = torch.where(torch.isfinite(group_max), group_max, torch.zeros_like(group_max))
    exp = torch.where(keep, torch.exp(logits - group_max[inverse]), torch.zeros_like(scores))  # [N]
    total = scores.new_zeros(n_groups).index_add(0, inverse, exp)  # [G]
    kept = scores.new_zeros(n_groups).index_add(0, inverse, keep.to(scores.dtype))  # [G]
    return torch.where(keep, exp * kept[inverse] / total[inverse].clamp(min=1e-30), torch.zeros_like(scores))


def self_training_loss(
    logprobs: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = _D.kl_coef,
    kl_estimator: str = _D.kl_estimator,
    aggregation: str = _D.aggregation,
    step_ids: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-weighted negative log-likelihood plus kl_coef * KL to a frozen reference.

    Per token: nll = -w * log pi_theta (w, the path weight on every token of its path, is a
    constant); kl = `kl_per_token` (ref_logprobs - logprobs under `kl_estimator`); both
    `aggregate`d alike. The KL is taken on every response token of the batch, weighted or
    not, so it also holds the paths the weights leave out near the reference.

    Args:
        logprobs: [B, T] log pi_theta(token), with grad.
        weights: [B, T] each token's path weight (`path_weights` spread over its tokens).
        mask: [B, T] 1/True on response tokens.
        ref_logprobs: [B, T] log pi_ref, or None for no KL term (then kl_coef must be 0).
        kl_coef, kl_estimator, aggregation: see `ObjectiveConfig`.
        step_ids, denominator: passed to `aggregate`.
    Returns:
        loss [] and detached stats: weighted_nll, weight_mean (token mean of w) and, with a
        reference, kl_ref (the aggregated KL before kl_coef).
    """
    if not (logprobs.shape == weights.shape == mask.shape):
        raise ValueError(
            "logprobs, weights and mask must share one [B, T] shape, got "
            f"{tuple(logprobs.shape)}, {tuple(weights.shape)}, {tuple(mask.shape)}"
        )
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (the frozen reference's log-probs)")
    valid = mask.bool()
    zeros = torch.zeros_like(logprobs)
    w = torch.where(valid, weights, zeros).detach()  # [B, T]
    nll = -w * torch.where(valid, logprobs, zeros)  # [B, T]; torch.where: no NaN from -inf pads
    weighted_nll = aggregate(nll, valid, aggregation, step_ids, denominator)
    loss = weighted_nll
    stats = {"weighted_nll": weighted_nll.detach(), "weight_mean": masked_mean(w, valid)}
    if ref_logprobs is not None:
        kl = aggregate(kl_per_token(logprobs, ref_logprobs, valid, kl_estimator), valid, aggregation, step_ids, denominator)
        loss = loss + kl_coef * kl
        stats["kl_ref"] = kl.detach()
    return loss, stats


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
