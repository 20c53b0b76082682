"""Run `flywheel fit` and SIGKILL it at a chosen point, as a crash or an OOM kill would, or
send it SIGTERM there, as a cluster scheduler preempting the job would.

    python tests/scripts/crash_fit.py POINT:N fit-arguments...

POINT:N is one of
    search:E      the 3rd generator call of epoch E's tree search (trees in flight)
    optimizer:N   the N-th optimizer step, after its forward and backward, before the update
    checkpoint:N  the N-th checkpoint save, with half of the file's bytes written
    train:E       the first training step of epoch E (with --data.async_search, while epoch
                  E+1 is searched ahead)
SIGKILL: the process ends with -SIGKILL; nothing of Python's shutdown runs (no finally, no
atexit). With the prefix `term-` (term-search:E, term-optimizer:N) the process sends itself
SIGTERM at that point and carries on; flywheel decides where to stop (term-train:E too).
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data_modules.search import SearchDataModule  # noqa: E402
from flywheel.__main__ import main  # noqa: E402
from flywheel.run.checkpoint import AtomicCheckpointIO  # noqa: E402
from flywheel.generation.hf import HFGenerator  # noqa: E402
from flywheel.io import atomic_writer  # noqa: E402
from flywheel.module import PolicyModule  # noqa: E402


SIGNAL = signal.SIGKILL


def die(where: str) -> None:
    print(f"crash_fit: {SIGNAL.name} {where}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), SIGNAL)


def arm_search(epoch: int) -> None:
    rollouts, sample = SearchDataModule.rollouts, HFGenerator.sample
    calls = {"armed": False, "n": 0}

    def _rollouts(self, *args, **kwargs):
        calls["armed"] = self.trainer.current_epoch == epoch
        return rollouts(self, *args, **kwargs)

    def _sample(self, requests):
        if calls["armed"]:
            calls["n"] += 1
            if calls["n"] == 3:
                die(f"during the search of epoch {epoch} (generator call 3)")
        return sample(self, requests)

    SearchDataModule.rollouts, HFGenerator.sample = _rollouts, _sample


def arm_optimizer(n: int) -> None:
    step = torch.optim.AdamW.step
    calls = {"n": 0}

    def _step(self, closure=None):
        calls["n"] += 1
        if calls["n"] == n:
            with torch.enable_grad():
                loss = closure()  # forward + backward of this step
            die(f"in optimizer step {n}, before the update")
            return step(self, lambda: loss)
        return step(self, closure)

    torch.optim.AdamW.step = _step


def arm_train(epoch: int) -> None:
    step = PolicyModule.training_step
    done = []

    def _step(self, batch, batch_idx):
        if self.current_epoch == epoch and not done:
            done.append(True)
            die(f"at the first training step of epoch {epoch}")
        return step(self, batch, batch_idx)

    PolicyModule.training_step = _step


def arm_checkpoint(n: int) -> None:
    save = AtomicCheckpointIO.save_checkpoint
    calls = {"n": 0}

    def _save(self, checkpoint, path, storage_options=None):
        calls["n"] += 1
        if calls["n"] == n:
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            data = buffer.getvalue()
            with atomic_writer(path) as fh:
                fh.write(data[: len(data) // 2])
                fh.flush()
                os.fsync(fh.fileno())
                die(f"writing checkpoint {n} ({Path(path).name}), {len(data) // 2} of {len(data)} bytes written")
        return save(self, checkpoint, path, storage_options)

    AtomicCheckpointIO.save_checkpoint = _save


if __name__ == "__main__":
    point, _, value = sys.argv[1].partition(":")
    if point.startswith("term-"):
        point, SIGNAL = point.removeprefix("term-"), signal.SIGTERM
    {"search": arm_search, "optimizer": arm_optimizer, "checkpoint": arm_checkpoint, "train": arm_train}[point](int(value))
    main(sys.argv[2:])
    print("crash_fit: the run ended before the kill point", file=sys.stderr)
    sys.exit(3)
