"""Which CPU cores launched vLLM servers and the trainer run on, when both share one CPU machine.

A search running beside the training (`--data.async_search`) keeps the server and the trainer
busy at once: with every core each (vLLM's OpenMP threads and torch's intra-op threads), they ask
for twice the cores there are, and both slow down (issue 46: two processes of 2 threads on 2
cores). `plan` splits this process's cores instead: the servers get one part (each replica an
equal share, its OpenMP threads bound there through VLLM_CPU_OMP_THREADS_BIND and its whole
process group held there by the sidecar's watchdog), and the trainer keeps the rest (its
affinity and torch's intra-op threads). `plan` is pure; the sidecar applies it (`pin_this_process`,
the servers' environment).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

SETTING = "--data.generator.init_args.cpu_cores"
CORES_ENV = "FLYWHEEL_SERVER_CORES"
"""The launched server's cores (comma-separated ids), which the sidecar's watchdog applies to the
server's whole process group."""
AUTO, SHARED = "auto", "shared"


@dataclass(frozen=True)
class CorePlan:
    """Cores of the trainer and of each launched server; `why` says how they were chosen (logged)."""

    trainer: tuple[int, ...] | None
    """The trainer's cores (None: left as they are)."""
    servers: tuple[tuple[int, ...], ...] | None
    """Each server's cores (None: every server inherits the trainer's)."""
    why: str


def parse_cores(spec: str) -> tuple[int, ...]:
    """'1', '2-3', '0,4-5' -> the core ids, in order, each once. Raises ValueError naming the setting."""
    cores: list[int] = []
    try:
        for part in spec.split(","):
            first, _, last = part.strip().partition("-")
            span = range(int(first), int(last or first) + 1)
            if not span or int(first) < 0:
                raise ValueError(part)
            cores += [c for c in span if c not in cores]
    except ValueError:
        raise ValueError(f"{SETTING}={spec!r}: give '{AUTO}', '{SHARED}', or core ids such as '1', '2-3' or "
                         "'0,4-5'") from None
    return tuple(cores)


def cores_text(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores)


def check_setting(spec: str) -> None:
    if spec not in (AUTO, SHARED):
        parse_cores(spec)


def plan(spec: str, available: Sequence[int], replicas: int, beside_training: bool) -> CorePlan:
    """Where `replicas` launched servers and the trainer run, from `spec` (`check_setting`) and
    this process's `available` cores. 'auto' splits them only when the servers search while the
    trainer trains (`beside_training`): half (rounded down) to the servers, shared evenly, the rest
    to the trainer; 'shared' and too few cores leave everything where it is; explicit ids go to
    the servers and the trainer keeps the other available cores."""
    available = tuple(sorted(set(available)))
    if spec == SHARED:
        return CorePlan(None, None, f"{SETTING}={SHARED}: the servers and the trainer share every core")
    if spec == AUTO:
        if not beside_training:
            return CorePlan(None, None, "the servers and the trainer take turns (no search ahead): both use every core")
        given = available[len(available) - max(replicas, len(available) // 2):] if len(available) > replicas else ()
        if not given:
            return CorePlan(None, None, f"{len(available)} core(s) cannot be split between the trainer and "
                                        f"{replicas} server(s): they share them (slower while both compute)")
        chosen = "auto: the search runs beside the training, so the cores are split"
    else:
        given = parse_cores(spec)
        missing = [c for c in given if c not in available]
        if missing:
            raise ValueError(f"{SETTING}={spec!r} names core(s) {cores_text(missing)}, which this process cannot use "
                             f"(it may use {cores_text(available)})")
        if len(given) < replicas:
            raise ValueError(f"{SETTING}={spec!r} gives {len(given)} core(s) to {replicas} servers: at least one each")
        chosen = f"{SETTING}={spec}"
    trainer = tuple(c for c in available if c not in given) or None
    share, extra = divmod(len(given), replicas)
    servers, start = [], 0
    for index in range(replicas):
        size = share + (index < extra)
        servers.append(tuple(given[start : start + size]))
        start += size
    return CorePlan(trainer, tuple(servers),
                    f"{chosen}: trainer on core(s) {cores_text(trainer) if trainer else 'all (none left)'}, "
                    + ", ".join(f"server {i} on {cores_text(s)}" for i, s in enumerate(servers)))


def available_cores() -> tuple[int, ...]:
    """The cores this process may run on."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return tuple(range(os.cpu_count() or 1))


def pin_this_process(cores: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Run this process (every thread) on `cores`, with as many torch intra-op threads.
    Returns what it had before, for `unpin`."""
    import torch

    before = (available_cores(), torch.get_num_threads())
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(len(cores))
    return before


def unpin(before: tuple[tuple[int, ...], int]) -> None:
    """Undo `pin_this_process` (its return value)."""
    import torch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(before[0]))
    torch.set_num_threads(before[1])
