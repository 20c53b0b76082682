"""Ctrl-C (SIGINT) stops `fit` like SIGTERM does: at the next safe point, with `last.ckpt`
and the command that resumes, exit status 130; a second Ctrl-C stops at once (issue 37,
item 11). Before, Ctrl-C during a search exited 1 with no checkpoint and no hint, and a
second one killed the process (-2)."""

import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from data_modules.search import SearchDataModule
from flywheel.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=2",
        "--data.eval.samples=1", "--data.problems.max_train_problems=8", "--data.save_trees=1", "--data.eval.at_start=false",
        "--data.search.max_expansions_per_tree=4", "--data.search.trajectories_per_tree=2", "--trainer.max_epochs=2"]


def fit_interrupted(run_dir: Path, presses: int, monkeypatch) -> SystemExit:
    """`fit` with `presses` Ctrl-C (SIGINT to this process) as epoch 0's search starts."""
    rollouts = SearchDataModule.rollouts

    def interrupted(self, *args, **kwargs):
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
        return rollouts(self, *args, **kwargs)

    before = signal.getsignal(signal.SIGINT)
    with monkeypatch.context() as patch:
        patch.setattr(SearchDataModule, "rollouts", interrupted)
        with pytest.raises(SystemExit) as stopped:
            main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *TINY,
                  f"--trainer.logger.init_args.save_dir={run_dir}"])
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C is Python's again after the fit
    return stopped.value


def test_ctrl_c_stops_at_a_safe_point_with_a_checkpoint_and_the_resume_command(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    stopped = fit_interrupted(tmp_path, 1, monkeypatch)
    assert stopped.code == 130
    last = tmp_path / "quickstart" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 0  # epoch 0's search abandoned, redone on resume
    assert "Ctrl-C: stopping at the next safe point" in caplog.text
    assert f"stopped by SIGINT after 0 completed epochs (global step 0); checkpoint written: {last}" in caplog.text
    assert "Resume with: python -m flywheel fit" in caplog.text and "--ckpt_path last" in caplog.text


def test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path, monkeypatch, caplog):
    stopped = fit_interrupted(tmp_path, 2, monkeypatch)
    assert stopped.code == 130
    assert not (tmp_path / "quickstart" / "checkpoints" / "last.ckpt").exists()
    assert "second Ctrl-C: stopping at once, without a new checkpoint" in caplog.text
