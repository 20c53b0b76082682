"""Advantage estimators: Tree-GRPO (node score minus the tree's mean final score) and DAPO.

Both subtract the mean FINAL score of a group (the K trajectories of one tree, or the G
samples of one prompt). With `normalize_std` they also divide by the group's
POPULATION std (divide by K, not K - 1; as DeepSearch's code, `std(unbiased=False)`)
plus eps. A group whose final scores are all equal (std 0) is not scaled at all: its
finals already have advantage 0, and dividing its intermediate-step deviations by eps
would blow them up to ~1e6 (the official code does divide by std + eps there).
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import torch

ADV_EPS = 1e-6
"""Added to the group std when advantages are std-normalised (`--data.credit.normalize_std`)."""


def group_baseline(
    final_scores: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    normalize_std: bool = False,
    eps: float = ADV_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's group mean and divisor: A = (score - mean) / divisor.

    Args:
        final_scores: [N] final token score of each trajectory (terminal reward + overlong).
        group_ids: [N] any integer ids; rows with equal ids form a group. None = one group.
    Returns:
        mean [N], divisor [N] (1 when `normalize_std` is off or the group's std is 0, else
        population std + eps).
    """
    if final_scores.dim() != 1:
        raise ValueError(f"final_scores must be 1-D [N], got shape {tuple(final_scores.shape)}")
    if group_ids is None:
        group_ids = torch.zeros_like(final_scores, dtype=torch.long)
    _, inverse = torch.unique(group_ids, return_inverse=True)  # [N] in 0..G-1
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    zeros = final_scores.new_zeros(n_groups)
    count = zeros.index_add(0, inverse, torch.ones_like(final_scores))  # [G]
    mean = zeros.index_add(0, inverse, final_scores) / count  # [G]
    if not normalize_std:
        return mean[inverse], torch.ones_like(final_scores)
    var = zeros.index_add(0, inverse, (final_scores - mean[inverse]) ** 2) / count  # [G]
    std = var.sqrt()
    divisor = torch.where(std > 0, std + eps, torch.ones_like(std))
    return mean[inverse], divisor[inverse]


def tree_grpo_advantages(
    step_scores: Sequence[Sequence[float]],
    final_scores: Sequence[float] | None = None,
    normalize_std: bool = False,
    eps: float = ADV_EPS,
) -> list[list[float]]:
    """Per-step Tree-GRPO advantages of one tree (DeepSearch Eq. 14-15):

        A_j = score(s_j) - mu_t,   mu_t = mean over the tree's K trajectories of their
                                          final token score (terminal reward + overlong)

    Args:
        step_scores: K lists, one per trajectory: the token score of each step
            (the search's q~(s_j) + overlong(t)). Lengths may differ.
        final_scores: [K'] the scores mu_t averages; None = the last step score of each of
            the K trajectories (their terminal). Give it to take the baseline over a
            different set of trajectories than the ones trained on.
    Returns:
        K lists, same lengths as `step_scores`: the advantage of each step, which every
        token of that step carries (`per_token` spreads it).
    """
    if not step_scores or any(len(steps) == 0 for steps in step_scores):
        raise ValueError("step_scores needs at least one trajectory, each with at least one step")
    if final_scores is None:
        final_scores = [steps[-1] for steps in step_scores]
    finals = torch.tensor(list(final_scores), dtype=torch.float64)  # [K]
    mean, divisor = group_baseline(finals, None, normalize_std, eps)
    mu, div = float(mean[0]), float(divisor[0])
    return [[(score - mu) / div for score in steps] for steps in step_scores]


def subtree_advantages(paths: Sequence[Sequence[Hashable]], final_scores: Sequence[float]) -> list[list[float]]:
    """Per-step advantages from every trajectory of a tree (the TreeRL credit rule).

    A node's value V(s) is the mean final score of the trajectories through it; the root's
    V is the mean over all of them. Step j of a trajectory gets

        A_j = ((V(s_j) - V(s_{j-1})) + (V(s_j) - V(root))) / sqrt(L(s_j))

    (s_0 = root): how much the step raised the chance of success over its parent (local)
    and over the whole tree (global), scaled down by the number L(s_j) of trajectories that
    share the step, which would otherwise count it L times in a token-mean loss. A tree whose
    trajectories all score the same gives every step 0: an all-wrong tree pushes nothing up.

    Args:
        paths: one list of node ids per trajectory, root excluded, root to terminal; a node
            shared by several trajectories has the same id in each.
        final_scores: [K] each trajectory's final score (terminal reward + overlong).
    Returns:
        K lists, same lengths as `paths`: the advantage of each step.
    """
    if len(paths) != len(final_scores) or not paths or any(not path for path in paths):
        raise ValueError("subtree_advantages needs one non-empty path per final score")
    total: dict[Hashable, float] = {}
    count: dict[Hashable, int] = {}
    for path, score in zip(paths, final_scores):
        for node in path:
            total[node] = total.get(node, 0.0) + score
            count[node] = count.get(node, 0) + 1
    root = sum(final_scores) / len(final_scores)
    out = []
    for path in paths:
        previous, steps = root, []
        for node in path:
            value = total[node] / count[node]
            steps.append(((value - previous) + (value - root)) / math.sqrt(count[node]))
            previous = value
        out.append(steps)
    return out


def gigpo_advantages(states: Sequence[Sequence[Hashable]], final_scores: Sequence[float], *, gamma: float,
                     step_weight: float, normalize_std: bool = False, eps: float = ADV_EPS) -> list[list[float]]:
    """Per-step GiGPO advantages of one group of episodes (Feng et al. 2025, verl-agent): the
    episode's advantage plus `step_weight` times the step's advantage among the steps taken from
    the same environment state anywhere in the group (an "anchor state"):

        A_j = (R - mean R) / d  +  w * (G_j - mean_{same state} G) / d_state,   G_j = gamma^(T - 1 - j) R

    R is the episode's final score, T its steps, G_j the discounted return from step j (the
    reward comes at the end); d, d_state are 1, or the std (+ eps) with `normalize_std` (the
    paper normalizes by it). A state reached once gives its step 0: no comparison to make.

    Args:
        states: one list per episode: the key of the state each step was taken from (equal
            keys = the same state; in a deterministic environment, the same actions so far).
        final_scores: [K] each episode's final score.

    >>> [[round(a, 4) for a in steps] for steps in gigpo_advantages(
    ...     [["start", "1"], ["start", "1"], ["start"]], [1.0, -1.0, -1.0], gamma=0.5, step_weight=1.0)]
    [[2.1667, 2.3333], [-0.8333, -1.6667], [-1.3333]]
    """
    if len(states) != len(final_scores) or not states or any(not steps for steps in states):
        raise ValueError("gigpo_advantages needs one non-empty list of states per final score")
    finals = torch.tensor(list(final_scores), dtype=torch.float64)
    mean, divisor = group_baseline(finals, None, normalize_std, eps)
    episode = ((finals - mean) / divisor).tolist()
    returns = [[gamma ** (len(steps) - 1 - j) * score for j in range(len(steps))]
               for steps, score in zip(states, final_scores)]
    anchors: dict[Hashable, list[float]] = {}
    for steps, gains in zip(states, returns):
        for state, gain in zip(steps, gains):
            anchors.setdefault(state, []).append(gain)
    baseline = {}
    for state, gains in anchors.items():
        m, d = group_baseline(torch.tensor(gains, dtype=torch.float64), None, normalize_std, eps)
        baseline[state] = (float(m[0]), float(d[0]))
    return [[a + step_weight * (gain - baseline[state][0]) / baseline[state][1] for state, gain in zip(steps, gains)]
            for a, steps, gains in zip(episode, states, returns)]

def pass_at_k_advantages(correct: Sequence[bool], k: int, normalize_std: bool) -> list[float]:
    """Pass@k training's analytic group advantages (Chen et al. 2025, arXiv 2508.10751), on
    the +-1 reward scale of the other rules, one value per response.

    The group's reward is pass@k: over the C(n, k) subsets of k of its n responses, 1 when a
    subset holds a correct one. With c correct, its mean is R = 1 - C(n-c, k) / C(n, k); a
    correct response's advantage is 1 - R (every subset holding it passes), an incorrect one's
    1 - R - C(n-c-1, k-1) / C(n-1, k-1) (the share of its subsets that fail), both doubled for
    the +-1 scale, so k = 1 is exactly outcome credit (r - mean). A group whose every
    k-subset passes (n - c < k) or fails (c = 0) gets 0. With `normalize_std` both are
    divided by the std of the subsets' rewards, 2 sqrt(R (1 - R)) (the paper's form).
    k is capped at n - 1, the largest k at which a group holding a correct response can still
    have a failing subset (at k >= n no response of any group would get a signal); a single
    response gets 0.

    >>> [round(a, 4) for a in pass_at_k_advantages([True, False, False, False], 2, False)]
    [1.0, -0.3333, -0.3333, -0.3333]
    >>> pass_at_k_advantages([True, False], 1, False) == [1.0, -1.0]
    True
    >>> pass_at_k_advantages([True, False], 4, False) == [1.0, -1.0]  # k capped at n - 1 = 1
    True
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    n, c = len(correct), sum(bool(x) for x in correct)
    k = min(k, n - 1)
    if k < 1 or c == 0 or n - c < k:
        return [0.0] * n
    mean = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    right = 2.0 * (1.0 - mean)
    wrong = 2.0 * (1.0 - mean - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1))
    scale = 2.0 * math.sqrt(mean * (1.0 - mean)) + ADV_EPS if normalize_std else 1.0
    return [(right if ok else wrong) / scale for ok in correct]


def per_token(step_values: Sequence[float], step_lengths: Sequence[int]) -> list[float]:
    """Spread one value per step over that step's tokens.

    Args:
        step_values: [S] one value per step (e.g. its advantage).
        step_lengths: [S] token count of each step.
    Returns:
        [sum(step_lengths)].
    """
    if len(step_values) != len(step_lengths):
        raise ValueError(
            f"{len(step_values)} step values but {len(step_lengths)} step lengths; give one "
            "length per step"
        )
    return [value for value, n in zip(step_values, step_lengths) for _ in range(n)]
