"""SIGTERM (a cluster scheduler's preemption, `timeout`, `kill`) and SIGINT (Ctrl-C): stop at
the next safe point, write a resumable `last.ckpt`, say how to resume, and exit with status
143 (128 + SIGTERM) or 130 (128 + SIGINT). A second Ctrl-C stops at once, saving nothing new
(exit 130): the run's newest checkpoint resumes it.

Built on Lightning's own handling (lightning.pytorch.trainer.connectors.signal_connector,
Lightning 2.6): its SIGTERM handler only sets `trainer.received_sigterm`, and the fit loop
then raises `SIGTERMException` (a SystemExit without a code: the process exits 0) after the
current training batch or at an epoch's end, saving nothing. An epoch's search runs inside
`train_dataloader`, where Lightning never looks, so the whole search ran first (issue 22).

The safe points are the boundaries between epochs, where a checkpoint restores the run
exactly:
* during an epoch's search (and the base screening, and flat rollouts) the data module calls
  `stop_point` after every search round; the search is abandoned, the data module's state
  put back as it was at the epoch's start, and the resumed run redoes that epoch's search;
* during the epoch's optimizer steps the stop waits for the epoch's end (the epoch's
  training data exists only in memory, and its few steps are cheap next to a search): the
  steps and the end-of-epoch work (round evaluation, hard-set refresh) finish first. A search
  of the next epoch running beside them (`--data.async_search`) stops at its next search
  round (`stop_requested`) and is not kept: the checkpoint holds its problems, and the resumed
  run searches them again.
Then `Preemption.on_exception` writes `last.ckpt` through the run's CheckpointIO (atomically)
and logs the command that resumes; `flywheel fit` exits 143.

Ctrl-C used to raise KeyboardInterrupt wherever it landed: Lightning then exits 1 without a
checkpoint, and ignores SIGINT from then on, so a second Ctrl-C killed the process (-2)
(issue 37). `Preemption` handles SIGINT during `fit` like SIGTERM (it sets the flag Lightning's
SIGTERM handler sets), and puts the previous handler back when the fit ends.
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger("flywheel.run.preemption")

EXIT_CODE = 143
"""Exit status of a run stopped by SIGTERM (128 + 15, what a shell reports for the signal)."""
EXIT_CODES = {"SIGTERM": EXIT_CODE, "SIGINT": 130}
"""Exit status per stopping signal (128 + its number)."""


def between_epochs(trainer: Any) -> bool:
    """No epoch is under way: every started epoch is completed, so a checkpoint written now
    resumes exactly (inside `train_dataloader`, before the next epoch is counted as begun)."""
    progress = trainer.fit_loop.epoch_progress.current
    return progress.ready == progress.completed


def stop_point(trainer: Any) -> None:
    """Called between search rounds: raise SIGTERMException if a SIGTERM asked `fit` to stop
    and no epoch is under way (so not from the end-of-round screening)."""
    if trainer is None or not getattr(trainer, "received_sigterm", False):
        return
    if trainer.state.fn == "fit" and between_epochs(trainer):
        log.info("stopping: abandoning this epoch's search (it is redone on resume)")
        raise SIGTERMException()


def stop_requested(trainer: Any) -> bool:
    """A SIGTERM or Ctrl-C asked `fit` to stop, now or (`Preemption` deferred it) at the epoch's
    end. A search running beside the epoch's training (data_modules.search_ahead) checks it
    after every search round, and is abandoned: its epoch is searched again on resume."""
    if trainer is None:
        return False
    return bool(getattr(trainer, "received_sigterm", False)) or any(
        isinstance(c, Preemption) and c.deferred for c in getattr(trainer, "callbacks", None) or ())


def last_checkpoint_path(trainer: Any) -> Path:
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath) / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
    return Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"


def resume_command(argv: list[str]) -> str:
    """The command line that resumes: the same arguments with `--ckpt_path last`."""
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--ckpt_path":
            skip = True
            continue
        if arg.startswith("--ckpt_path="):
            continue
        args.append(arg)
    return shlex.join(["python", "-m", "flywheel", *args, "--ckpt_path", "last"])


class Preemption(Callback):
    """Defers a SIGTERM that arrives during an epoch's optimizer steps to the epoch's end,
    and writes the resumable checkpoint when the run stops (see the module docstring).

    Args:
        argv: the command line of the run, for the resume hint (default: sys.argv[1:]).
    """

    def __init__(self, argv: list[str] | None = None) -> None:
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.deferred = False
        self.saved: Path | None = None
        self.signal = "SIGTERM"
        """The signal that stopped the run (SIGINT after a Ctrl-C)."""
        self._trainer: Any = None
        self._previous_sigint: Any = None

    # ------------------------------------------------------------------ Ctrl-C
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        self._trainer = trainer
        self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        connector = self._trainer._signal_connector
        if self.signal == "SIGINT":  # the second Ctrl-C: stop now (Lightning's teardown still runs)
            log.warning("second Ctrl-C: stopping at once, without a new checkpoint; resume from the run's newest "
                        "checkpoint: %s", resume_command(self.argv))
            raise SystemExit(EXIT_CODES["SIGINT"])
        self.signal = "SIGINT"
        connector.received_sigterm = True  # the safe-point machinery SIGTERM uses
        log.warning("Ctrl-C: stopping at the next safe point and writing last.ckpt (Ctrl-C again to stop at once, "
                    "without saving)")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._restore_sigint()

    def _restore_sigint(self) -> None:
        if self._previous_sigint is None:
            return
        signal.signal(signal.SIGINT, self._previous_sigint)
        # Lightning's signal connector recorded every handler after `setup`, ours among them,
        # and puts them back at its teardown, which comes after this.
        recorded = getattr(self._trainer._signal_connector, "_original_handlers", {})
        if signal.SIGINT in recorded:
            recorded[signal.SIGINT] = self._previous_sigint
        self._previous_sigint = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        connector = trainer._signal_connector
        if connector.received_sigterm and not self.deferred:
            # Lightning would raise after this batch, mid-epoch, where no checkpoint resumes exactly.
            connector.received_sigterm = False
            self.deferred = True
            log.info("stopping: finishing this epoch's optimizer steps and end-of-epoch work, then saving")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.deferred:  # Lightning raises SIGTERMException once the epoch is completed
            trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore_sigint()  # Lightning calls no teardown hook after an exception
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        exception.code = EXIT_CODES[self.signal]  # `flywheel fit` exits with it
        epoch = trainer.fit_loop.epoch_progress.current.completed
        if not between_epochs(trainer):
            log.error("stopped by %s inside epoch %d, where no checkpoint resumes exactly; nothing was saved. "
                      "Resume from the run's newest checkpoint: %s", self.signal, epoch, resume_command(self.argv))
            return
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        flush = getattr(trainer.strategy.checkpoint_io, "flush", None)
        if flush is not None:  # a background writer (flywheel.run.checkpoint): the file is complete before the exit
            flush()
        self.saved = path
        log.warning("stopped by %s after %d completed epochs (global step %d); checkpoint written: %s. "
                    "Resume with: %s", self.signal, epoch, trainer.global_step, path, resume_command(self.argv))
