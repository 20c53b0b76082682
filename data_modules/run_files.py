"""What the data module writes into the run folder, atomically: the hard set and the replay
buffer (`<log_dir>/flywheel_state/`, rewritten after every epoch and round) and each epoch's
first trees for the viewer (`<log_dir>/trees/epoch_NNNN.jsonl`, `python -m flywheel tree`).
Restoring a run reads the checkpoint, not these files: they are for people and tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from flywheel.adaptive import HardSet, ReplayBuffer
from flywheel.io import atomic_write_bytes, atomic_write_json
from flywheel.search.outputs import TreeResult


def write_state(log_dir: str | Path, hard: HardSet | None, buffer: ReplayBuffer) -> None:
    """`hard_set.json` (once screened) and `replay_buffer.json` under `<log_dir>/flywheel_state`."""
    folder = Path(log_dir) / "flywheel_state"
    if hard is not None:
        atomic_write_json(folder / "hard_set.json", hard.to_dict())
    atomic_write_json(folder / "replay_buffer.json", buffer.to_dict())


def write_trees(log_dir: str | Path, epoch: int, results: Sequence[TreeResult], decode: Callable, count: int,
                seen: Callable | None = None) -> None:
    """The first `count` trees of an epoch as JSON lines (nothing when `count` is 0 or there
    are none). `seen` decodes a prompt as the policy saw it (special tokens kept): `prompt_seen`."""
    if not count or not results:
        return
    lines = [json.dumps({**r.to_json(decode, logprobs=False), **({"prompt_seen": seen(r.prompt_ids)} if seen else {})})
             for r in results[:count]]
    atomic_write_bytes(Path(log_dir) / "trees" / f"epoch_{epoch:04d}.jsonl", ("\n".join(lines) + "\n").encode())


def write_run_files(trainer: Any, hard: HardSet | None, buffer: ReplayBuffer,
                    trees: tuple[int, Sequence[TreeResult], Callable, int, Callable] | None = None) -> None:
    """On rank 0 of a run with a log folder: the state files, and with `trees` = (epoch,
    results, decode, count, seen) that epoch's trees (write_trees). Every rank must call it (the log folder is
    a collective under DDP)."""
    log_dir = trainer.log_dir if trainer is not None else None
    if trainer is None or not trainer.is_global_zero or not log_dir:
        return
    write_state(log_dir, hard, buffer)
    if trees is not None:
        write_trees(log_dir, *trees)
