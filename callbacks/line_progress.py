"""Lightning's progress bar off a terminal: its tqdm (or rich) bar writes carriage-return frames
to stdout, which a file or a CI log keeps as one growing line. `LineProgressBar` logs a plain
line at most every 30 s instead (flywheel.reporting.bars.LineBar); the CLI wiring puts it in
place of Lightning's bar when stdout is not a terminal (flywheel.run.cli.lines_off_a_terminal).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import lightning as L
from lightning.pytorch.callbacks.progress import ProgressBar

from flywheel.reporting.bars import LineBar


class LineProgressBar(ProgressBar):
    """The training, validation and test loops' progress as log lines, on rank 0: batches done,
    mean rate, time left (once known) and the metrics Lightning's bar shows."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.enabled = True
        self.bar: LineBar | None = None

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def _open(self, desc: str, total: float) -> None:
        self._close()
        if self.enabled:
            self.bar = LineBar(int(total) if total != float("inf") else None, desc, "batch", self.clock)

    def _advance(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bar is not None:
            self.bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            self.bar.update(1)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._open(f"epoch {trainer.current_epoch} {self.train_description.lower()}", self.total_train_batches)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._advance(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._open(self.validation_description.lower(), _all(trainer.num_val_batches))

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._advance(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._open(self.test_description.lower(), _all(trainer.num_test_batches))

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._advance(trainer, pl_module)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()


def _all(batches: list[int | float] | int | float) -> int | float:
    """The batches of every loader (Lightning keeps one count per loader)."""
    return sum(batches) if isinstance(batches, list) else batches
