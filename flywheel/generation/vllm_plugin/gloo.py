"""The gloo engine's wire format, shared by the trainer (sender, rank 0) and the servers'
workers (receivers, ranks 1..): the init and update payloads and the process group.

The group is a `ProcessGroupGloo` of its own over a TCPStore that the trainer hosts, so it
neither needs nor disturbs a default process group on either side (the trainer's DDP group,
the server's tensor-parallel one). Torch and the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes weights travel in (the servers' --dtype)."""


@dataclass
class GlooInitInfo:
    """What a worker needs to join the trainer's group: the trainer's store, the worker's
    first rank (`rank_offset` + its rank inside the server) and the group's size."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 300.0


@dataclass
class GlooUpdateInfo:
    """One sync: every tensor the trainer broadcasts, in order. The worker receives exactly
    these, and loads them only once all have arrived (`gloo_worker`)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"gloo update info: {len(self.names)} names, {len(self.dtype_names)} dtypes, "
                             f"{len(self.shapes)} shapes; one of each per tensor")
        unknown = sorted(set(self.dtype_names) - set(DTYPES))
        if unknown:
            raise ValueError(f"gloo update info: dtypes {unknown} are not among {sorted(DTYPES)}")


def open_group(address: str, port: int, rank: int, world_size: int, timeout_s: float) -> torch.distributed.ProcessGroupGloo:
    """Join (rank 0: host) the transfer group; blocks until all `world_size` ranks have joined
    or `timeout_s` passes."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    timeout = timedelta(seconds=timeout_s)
    store = TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    return ProcessGroupGloo(PrefixStore("flywheel-weights", store), rank, world_size, timeout)


def broadcast(group: torch.distributed.ProcessGroupGloo, tensor: torch.Tensor) -> None:
    """Broadcast `tensor` from rank 0 (the trainer) to every worker of the group, in place."""
    group.broadcast([tensor]).wait()
