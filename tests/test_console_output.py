"""What a run prints to a log: each Lightning line once (it came twice, `INFO: GPU available...`
and the timestamped copy), Lightning's progress bar as plain lines off a terminal (its
carriage-return frames made one growing line of a log), and no "Checkpoint directory ... exists
and is not empty" warning on every intended resume."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from callbacks.line_progress import LineProgressBar
from flywheel.run.cli import lines_off_a_terminal
from flywheel.run.preflight import say_what_the_checkpoint_folders_hold

ROOT = Path(__file__).resolve().parents[1]


def test_a_cli_run_prints_each_lightning_line_once_and_no_carriage_returns(tmp_path):
    # The trainer is built (Lightning logs the devices), then the preflight refuses the missing
    # checkpoint: a few seconds, no search.
    run = subprocess.run(
        [sys.executable, "-m", "flywheel", "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"),
         f"--trainer.logger.init_args.save_dir={tmp_path}", "--ckpt_path", str(tmp_path / "none.ckpt")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.count("GPU available:") == 1, run.stderr
    assert run.stderr.count("Seed set to 0") == 1, run.stderr
    assert "lightning.pytorch.utilities.rank_zero: GPU available:" in run.stderr  # the project's format, with the time
    assert "\r" not in run.stderr and "Loading weights" not in run.stderr  # transformers' bar is off in a log


class StepClock:
    """Each reading 20 s after the one before."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 20.0
        return self.t


def test_off_a_terminal_lightnings_bar_is_plain_lines(tmp_path, caplog, capsys):
    trainer = L.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path)
    lines_off_a_terminal(trainer, terminal=True)
    assert not isinstance(trainer.progress_bar_callback, LineProgressBar)  # a terminal keeps Lightning's bar
    lines_off_a_terminal(trainer, terminal=False)
    bar = trainer.progress_bar_callback
    assert isinstance(bar, LineProgressBar)
    bar.clock = StepClock()
    caplog.set_level(logging.INFO, logger="flywheel.reporting.bars")
    trainer.fit(BoringModel())
    # Readings: the epoch's start 20; batches 40 (20 s in: no line), 60 (40 s: a line), 80 (20 s
    # after it: none), 100 (40 s: a line); the close 120, 100 s after the start: 4 / 100 a second.
    lines = [r.getMessage() for r in caplog.records if r.name == "flywheel.reporting.bars"]
    assert [line.split(";")[0] for line in lines] == [
        "epoch 0 training: 2/4 (50%) after 40 s, 0.05 batch/s, about 40 s left",
        "epoch 0 training: 4/4 (100%) after 1 min 20 s, 0.05 batch/s, about 0 s left",
        "epoch 0 training: 4/4 in 1 min 40 s, 0.04 batch/s",
    ]
    assert "\r" not in capsys.readouterr().out


def test_a_resume_is_not_warned_of_its_own_checkpoints_and_other_files_are_named(tmp_path, caplog):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "last.ckpt").write_bytes(b"")
    callback = ModelCheckpoint(dirpath=folder)
    trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False, enable_model_summary=False)

    def lightnings_warnings(resolved: str | None) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            say_what_the_checkpoint_folders_hold(trainer, resolved)
            callback.setup(trainer, BoringModel(), "fit")
        return [str(w.message) for w in seen if "exists and is not empty" in str(w.message)]

    caplog.set_level(logging.WARNING, logger="flywheel.run.preflight")
    assert lightnings_warnings(str(folder / "last.ckpt")) == []  # resumed from this folder: silent
    (folder / "last.ckpt").unlink()
    (folder / "notes.txt").write_text("mine")
    assert lightnings_warnings(None) == []  # a fresh run: one line of ours instead of Lightning's
    assert [r.getMessage() for r in caplog.records if r.name == "flywheel.run.preflight"] == [
        f"checkpoint folder {folder} holds files of no run (notes.txt); this run writes its checkpoints beside them"]
