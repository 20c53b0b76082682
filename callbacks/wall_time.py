"""WallTime: where a fit's wall time goes (issue 35), per epoch in TensorBoard and per round and
in total in summary.json, kept across resumes.

The split (its parts add up to the wall time; flywheel.reporting.wall_split counts each second once):
  search_generator    the generator's own seconds inside the epoch's rollouts (GenerationStats.seconds)
  search_bookkeeping  the rest of the rollouts: selection, grading, backup, credit (data module)
  train               training batches (forward, backward, optimizer: this callback's batch
                      hooks) and the forward passes that score pi_old as the loader is built
  eval                held-out evaluation (HeldOutEval.run_eval)
  screening           Pass1@K screening: the hard set, its refresh, a stream's draws (Screening.rates)
  weight_sync         pushing the weights to the generator (RoundProtocol.sync_weights)
  value_model         fitting the ReST-MCTS* value model (PRMUpdate.end_round)
  checkpoint          checkpoint saves (the trainer's save_checkpoint, every caller)
  rebuild             the rest of building an epoch's data loader: starting the generator,
                      batching, run files, the epoch's metrics (SearchDataModule.train_dataloader)
  other               the wall time minus all of the above (Lightning's loops and logging, ...)
with search_s = generator + bookkeeping and busy_fraction = (search_generator + train) / wall;
beside the split, one_time_s: the wall seconds of work done once (`once`: the base evaluation
and screening, the generator's launch), which the projected end of the fit leaves out.

An epoch runs from the start of its data loader's rebuild to the start of the next one (the
first from the fit's start, the last to its end), so the epochs add up to the run and each
holds its own epoch-end work and checkpoint. TensorBoard: `compute/wall/<part>_s` and
`compute/wall/busy_fraction` at step = epoch. summary.json: `wall_split` in every round
(the round's epochs) and at the top level `wall_split.total` and `wall_split.epochs`.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, Iterator

import lightning as L
from lightning.pytorch.callbacks import Callback

from callbacks.round_scalars import log_round_scalars
from callbacks.run_summary import RunSummary
from flywheel.reporting.wall_split import (CHECKPOINT, ONE_TIME, PARTS, REBUILD, SEARCH, SEARCH_GENERATOR, TRAIN,
                                           WallSplit, difference, projected_finish, timed)

__all__ = ["PARTS", "WallTime", "split_of"]

log = logging.getLogger(__name__)



def split_of(totals: dict[str, float]) -> dict[str, float]:
    """A `WallSplit.totals()` (or a difference of two) as reported: `<part>_s` for PARTS, any
    other section and `other` (together: `wall_s`), `search_s`, `busy_fraction`, `one_time_s`
    (inside the parts, not one of them); rounded to ms."""
    seconds = {("search_bookkeeping" if k == SEARCH else k): v for k, v in totals.items()
               if k not in ("wall", "other", ONE_TIME) and not k.startswith("overlapped/")}
    names = [*PARTS, *sorted(set(seconds) - set(PARTS))]
    out = {f"{name}_s": round(seconds.get(name, 0.0), 3) for name in names}
    out["other_s"] = round(totals.get("other", 0.0), 3)
    out["wall_s"] = round(totals.get("wall", 0.0), 3)
    out["search_s"] = round(out["search_generator_s"] + out["search_bookkeeping_s"], 3)
    wall = totals.get("wall", 0.0)
    out["busy_fraction"] = round((seconds.get(SEARCH_GENERATOR, 0.0) + seconds.get(TRAIN, 0.0)) / wall, 4) if wall > 0 else 0.0
    out.update({f"{k}_s": round(v, 3) for k, v in totals.items() if k.startswith("overlapped/")})
    out["one_time_s"] = round(totals.get(ONE_TIME, 0.0), 3)
    return out


class WallTime(Callback):
    """Splits the fit's wall time (above). It is the run's wall clock (flywheel.ports.WallClock),
    handed by the CLI wiring to the data module and the round's callbacks, which time their
    sections through `section`; the data module's `rebuild` marks each epoch's start. This
    callback times the training batches and the checkpoint saves itself and closes the epochs
    and rounds."""

    def __init__(self, summary: RunSummary | None = None, budgeted: bool = False) -> None:
        self.summary = summary
        """Where the rounds' and the run's splits go (the run's one summary, from the CLI wiring;
        None: TensorBoard and the log only)."""
        self.budgeted = budgeted
        """The run has a token budget (--budget.max_tokens) that may end it before max_epochs."""
        self._reset()
        self._timed_save: Callable | None = None
        """The trainer's save_checkpoint, timed (set up for a fit, removed at its teardown)."""
        self._trainer: L.Trainer | None = None
        """The fitting trainer (from setup), whose epoch `rebuild` reads."""

    def _reset(self) -> None:
        self.split = WallSplit()
        self.epochs: list[dict[str, float]] = []
        """The closed epochs' splits, {"epoch": n, **split_of(...)}."""
        self._epoch = 0
        """The epoch being timed (closed when a later one's loader is built)."""
        self._epoch_mark: dict[str, float] = {}
        self._round_mark: dict[str, float] = {}
        """`split.totals()` at the start of the open epoch and of the open round."""

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._reset()
        self._trainer = trainer
        # Lightning has no hook after a checkpoint is written: time the trainer's own save,
        # which every saver calls (ModelCheckpoint, flywheel.run.preemption).
        if "save_checkpoint" not in vars(trainer):
            trainer.save_checkpoint = self._timed_save = timed(self, CHECKPOINT, trainer.save_checkpoint)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._timed_save is not None and vars(trainer).get("save_checkpoint") is self._timed_save:
            del trainer.save_checkpoint
        self._timed_save = self._trainer = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.epochs and self.summary is not None:  # resumed: summary.json's totals come back before the next epoch closes
            self.summary.record_run(trainer, self._run_summary(self.split.totals()))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.split.enter(TRAIN)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.split.exit(TRAIN)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.split.exit_all()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close(trainer)
        total = split_of(self.split.totals())
        log.info("wall split of the run: %s", ", ".join(f"{k} {v}" for k, v in total.items()))

    # ------------------------------------------------------------------ the clock (flywheel.ports.WallClock)
    def section(self, name: str, part: tuple[str, Callable[[], float]] | None = None) -> AbstractContextManager:
        """Count the block's time as section `name` of the split (WallSplit.section)."""
        return self.split.section(name, part)

    @contextmanager
    def rebuild(self) -> Iterator[None]:
        """An epoch's data loader being built: the epoch boundary of the split (closes the
        epoch before, see `next_epoch`), the block counted as `rebuild`."""
        if self._trainer is not None:
            self.next_epoch(self._trainer)
        with self.split.section(REBUILD):
            yield

    def once(self) -> AbstractContextManager:
        """Work the fit does once (WallSplit.once), left out of the epochs' pace."""
        return self.split.once()

    def add_overlapped(self, name: str, seconds: float) -> None:
        """Seconds of work that ran beside this thread (the search ahead), outside the split's sum."""
        self.split.add_overlapped(name, seconds)

    # ------------------------------------------------------------------ epochs and rounds
    def next_epoch(self, trainer: L.Trainer) -> None:
        """An epoch's data loader is being built: close the epoch before it, if it is a later one
        (a resumed run rebuilds the loader of the epoch it stopped in, which stays open)."""
        if trainer.current_epoch > self._epoch:
            self._close(trainer)
            self._epoch = trainer.current_epoch

    def _close(self, trainer: L.Trainer) -> None:
        """Report the open epoch (TensorBoard, summary.json) and, if it ended a round, the round."""
        now = self.split.totals()
        row = {"epoch": self._epoch, **split_of(difference(now, self._epoch_mark))}
        self.epochs = [r for r in self.epochs if r["epoch"] != self._epoch] + [row]  # a resumed epoch again: replaced
        self._epoch_mark = now
        log_round_scalars(trainer, {f"compute/wall/{k}": v for k, v in row.items() if k != "epoch"}, self._epoch)
        # Rows restored from a checkpoint written before one-time work was counted have none.
        one_time = sum(r.get("one_time_s", 0.0) for r in self.epochs)
        if trainer.is_global_zero and (line := projected_finish([r["wall_s"] for r in self.epochs], one_time,
                                                                trainer.max_epochs, time.time())):
            log.info("%s%s", line, " (sooner if --budget.max_tokens runs out)" if self.budgeted else "")
        if self.summary is None:
            return
        for done in [r for r in self.summary.rounds if r["epoch"] == self._epoch]:
            # the round this epoch ended, or its partial row where the run stopped inside it
            self.summary.record(trainer, done["round"], {"wall_split": split_of(difference(now, self._round_mark))})
            if not done.get("partial"):  # a partial round goes on when the run is resumed
                self._round_mark = now
        self.summary.record_run(trainer, self._run_summary(now))

    def _run_summary(self, totals: dict[str, float]) -> dict[str, Any]:
        return {"wall_split": {"total": split_of(totals), "epochs": self.epochs}}

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {"split": self.split.state_dict(), "epochs": self.epochs, "epoch": self._epoch,
                "epoch_mark": self._epoch_mark, "round_mark": self._round_mark}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.split.load_state_dict(state["split"])
        self.epochs = [dict(r) for r in state["epochs"]]
        self._epoch = int(state["epoch"])
        self._epoch_mark, self._round_mark = dict(state["epoch_mark"]), dict(state["round_mark"])
