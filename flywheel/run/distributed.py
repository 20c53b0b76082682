"""The few collectives flywheel needs, over `torch.distributed` (a no-op in one process).

Library code (the data module's rollouts, the value-model callback, `flywheel eval`) gathers
through here, so none of it imports another's glue to reach a helper.
"""

from __future__ import annotations

from typing import Any

import torch


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a distributed run."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def all_gather(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, in rank order (a list of one outside distributed runs).
    Collective: every rank must call it."""
    _, size = world()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    torch.distributed.all_gather_object(out, obj)
    return out


def all_sum(value: int) -> int:
    """The sum of `value` over the ranks. Collective."""
    return sum(all_gather(value))
