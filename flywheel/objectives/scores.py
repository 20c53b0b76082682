"""Token scores of a trajectory: soft-clipped node values and the overlong penalty.

The search hands back plain floats (one raw q per step node), the trainer works on
tensors; each function here takes either and has one implementation.
"""

from __future__ import annotations

import math
from typing import Sequence, TypeVar

import torch

from flywheel.objectives.config import ObjectiveConfig

_D = ObjectiveConfig
Number = TypeVar("Number", float, torch.Tensor)


def soft_clip(q: Number, eps_q: float = _D.eps_q, q_max: float = _D.q_max) -> Number:
    """q~ = tanh(q / eps_q) * q_max (DeepSearch Eq. 13).

    q is a node's accumulated value (a SUM over backups, so unbounded); the soft clip
    keeps it in (-q_max, q_max) while keeping its order and a non-zero slope.

    Args:
        q: a float, or a tensor of any shape.
    Returns:
        Same type and shape as `q`.
    """
    tanh = torch.tanh if isinstance(q, torch.Tensor) else math.tanh
    return tanh(q / eps_q) * q_max


def node_score(
    q: Number, terminal: bool | torch.Tensor, eps_q: float = _D.eps_q, q_max: float = _D.q_max
) -> Number:
    """A node's score for Tree-GRPO: soft_clip(q) for intermediate nodes, q itself for a terminal.

    A terminal's value is exactly its reward (+1 / -1, paper Eq. 4), and the paper keeps
    it unclipped (tanh(1) = 0.76 would understate a correct answer).

    Args:
        q: a float, or a tensor [...].
        terminal: a bool, or a bool tensor broadcastable to `q`.
    """
    if isinstance(q, torch.Tensor):
        terminal = torch.as_tensor(terminal, device=q.device)
        return torch.where(terminal, q, soft_clip(q, eps_q, q_max))
    return q if terminal else soft_clip(q, eps_q, q_max)


def overlong_penalty(
    length: Number, max_len: int = _D.overlong_max_len, buffer: int = _D.overlong_buffer
) -> Number:
    """DAPO soft overlong penalty, as DeepSearch's code applies it:

        overlong(L) = min(-(L - (L_max - L_buf)) / L_buf, 0)

    0 up to L_max - L_buf tokens, then linear to -1 at L_max (defaults: 0 until 12288,
    -0.5 at 14336, -1 at 16384). The formula is followed as written: past L_max it keeps
    falling (-2 at 20480) rather than stopping at -1 as in the DAPO paper; generation caps
    responses at L_max, so in practice the value stays in [-1, 0].

    Args:
        length: response length in tokens, a number or a tensor [...].
    Returns:
        A float (for a number) or a float tensor of the same shape.
    """
    if isinstance(length, torch.Tensor):
        return (-(length.float() - (max_len - buffer)) / buffer).clamp(max=0.0)
    return min(-(length - (max_len - buffer)) / buffer, 0.0)


def trajectory_step_scores(
    step_values: Sequence[float], response_len: int, config: ObjectiveConfig = ObjectiveConfig()
) -> list[float]:
    """Per-step token scores of one trajectory (DeepSearch §3.3 and §2 overlong).

    Args:
        step_values: the raw q(s_j) of each step node on the path, root excluded, in order;
            the last one is the terminal, whose value is its reward. A mixed-rollout
            (replay-buffer or direct) sample is one "step" holding its outcome reward, so
            every token gets that scalar.
        response_len: the trajectory's response length in tokens, for the overlong penalty.
    Returns:
        [len(step_values)]: node_score(q_j) + overlong(response_len), the score every token
        of step j carries.
    """
    if not step_values:
        raise ValueError("step_values is empty: a trajectory has at least its terminal step")
    overlong = (
        overlong_penalty(response_len, config.overlong_max_len, config.overlong_buffer)
        if config.use_overlong_penalty
        else 0.0
    )
    last = len(step_values) - 1
    return [
        node_score(q, j == last, config.eps_q, config.q_max) + overlong
        for j, q in enumerate(step_values)
    ]
