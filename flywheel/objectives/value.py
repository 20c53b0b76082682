"""The value head's objective and baseline (the seed's Countdown MCTS, rest-mcts-and-countdown.md §B):

    L_value = mean over states s_t of (V(s_t) - r)^2
    A_t     = r - sg(V_old(s_t))          every token of step t carries its step's A_t

s_t is the state a step starts from (the prompt and every earlier step): the states the search
values as nodes. `values` are laid out like the log-probs, [B, T] with position t describing
target token t+1, so V(s_t) of a step is read at the position of the step's first token.
"""

from __future__ import annotations

import torch


def step_starts(step_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the response positions that open a step (the first token of each step).

    >>> step_starts(torch.tensor([[-1, 0, 0, 1, -1]]), torch.tensor([[0, 1, 1, 1, 0]])).tolist()
    [[False, True, False, True, False]]
    """
    valid = mask.bool()
    previous_valid = torch.nn.functional.pad(valid[:, :-1], (1, 0), value=False)
    previous_step = torch.nn.functional.pad(step_ids[:, :-1], (1, 0), value=-1)
    return valid & (~previous_valid | (step_ids != previous_step))


def step_start_values(values: torch.Tensor, step_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T]: at every response token, V(s_t) of the state its step started from (0 off the response).

    >>> v = torch.tensor([[9.0, 0.1, 0.2, 0.3, 9.0]])
    >>> step_start_values(v, torch.tensor([[-1, 0, 0, 1, -1]]), torch.tensor([[0, 1, 1, 1, 0]])).tolist()
    [[0.0, 0.10000000149011612, 0.10000000149011612, 0.30000001192092896, 0.0]]
    """
    starts = step_starts(step_ids, mask)
    positions = torch.arange(values.shape[1], device=values.device).expand_as(values)
    start_pos = torch.where(starts, positions, torch.zeros_like(positions)).cummax(dim=1).values  # [B, T]
    return torch.where(mask.bool(), values.gather(1, start_pos), torch.zeros_like(values))


def value_baseline_advantages(
    values: torch.Tensor, rewards: torch.Tensor, step_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """A_t = r - sg(V_old(s_t)) per response token ([B, T]; 0 off the response).

    Args:
        values: [B, T] V at every position (taken without grad here).
        rewards: [B] each row's terminal reward r.
        step_ids, mask: [B, T] step index and response mask of each target position.
    """
    baseline = step_start_values(values.detach(), step_ids, mask)
    return torch.where(mask.bool(), rewards[:, None] - baseline, torch.zeros_like(baseline))


def value_loss(values: torch.Tensor, rewards: torch.Tensor, step_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over every step-start state of the batch of (V(s_t) - r)^2 (0 when there is none)."""
    starts = step_starts(step_ids, mask)
    if not starts.any():
        return values.sum() * 0.0  # keeps the graph: an all-masked batch still takes its (zero) step
    errors = (values - rewards[:, None]) ** 2
    return errors[starts].mean()
