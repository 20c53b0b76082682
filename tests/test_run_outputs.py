"""A small run through the CLI leaves exactly what it says (issue 37, items 1-4): before, each
of these ran to exit 0 and left a wrong result without a word: `last.ckpt` that was not the
run's last state, a NaN setting that collapsed the search to greedy, more held-out problems
than asked for, and a run whose trained policy was never evaluated."""

import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from data_modules.search import SearchDataModule
from flywheel.__main__ import main
from flywheel.run.preflight import PreflightError

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "conf" / "quickstart.yaml")
TINY = ["--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4", "--data.eval.samples=1",
        "--data.problems.max_train_problems=8", "--data.save_trees=1", "--data.eval.at_start=false",
        "--data.search.max_expansions_per_tree=4", "--data.search.trajectories_per_tree=2"]


def held_out_files(folder: Path) -> list[Path]:
    """Two held-out files of 3 Countdown problems each."""
    rows = (ROOT / "flywheel" / "assets" / "countdown" / "test.jsonl").read_text().splitlines()[:6]
    files = [folder / "held_a.jsonl", folder / "held_b.jsonl"]
    for i, file in enumerate(files):
        file.write_text("\n".join(rows[3 * i: 3 * i + 3]) + "\n")
    return files


def test_a_stopped_and_resumed_run_ends_with_its_own_last_checkpoint_and_evaluates_what_it_trained(
        tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    a, b = held_out_files(tmp_path)
    args = ["fit", "--config", QUICK, *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--data.problems.eval_files=[{a},{b}]", "--data.problems.max_eval_problems=2",
            "--data.epochs_per_round=2", "--trainer.max_epochs=1"]
    checkpoints = tmp_path / "quickstart" / "checkpoints"

    # Item 2: a NaN from YAML is refused before anything runs (before: greedy search, 4 rows not 32).
    overlay = tmp_path / "nan.yaml"
    overlay.write_text("data:\n  search:\n    temperature: .nan\n")
    with pytest.raises(PreflightError, match=r"--data.search.temperature=nan: not a finite number"):
        main(args[:3] + ["--config", str(overlay)] + args[3:])
    assert not checkpoints.exists()

    # Item 1: SIGTERM during epoch 0's search (a scheduler's preemption): stopped, last.ckpt written.
    rollouts = SearchDataModule.rollouts

    def preempted(self, *a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return rollouts(self, *a, **k)

    with monkeypatch.context() as patch:
        patch.setattr(SearchDataModule, "rollouts", preempted)
        with pytest.raises(SystemExit) as stopped:
            main(args)
    assert stopped.value.code == 143
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["global_step"] == 0

    resumed = main(args + ["--ckpt_path", "last"])
    # Before: last.ckpt stayed the stopped run's file and the resumed run's went to last-v1.ckpt.
    assert sorted(p.name for p in checkpoints.iterdir()) == ["epoch=0-step=1.ckpt", "last.ckpt"]
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["global_step"] == resumed.trainer.global_step == 1

    # Items 3 and 4: the run ends inside its 2-epoch round, and its policy is evaluated (before:
    # rounds []) on exactly 2 held-out problems, both from the first file (before: 3, one extra
    # from each further file).
    summary = json.loads((Path(resumed.trainer.log_dir) / "summary.json").read_text())
    assert summary["eval_problems"] == 2
    assert [(r["round"], r["epoch"], r.get("partial")) for r in summary["rounds"]] == [(1, 0, True)]
    assert summary["rounds"][0]["eval_pass1"] is not None
    assert [p.id for p in resumed.datamodule.eval_problems()] == [json.loads(line)["id"] for line in a.read_text().splitlines()[:2]]
    assert f"the first 2 problems of 2 files: 2 from {a}, none from {b}" in caplog.text

    # Item 1: an unrelated second run into the same folder is refused, not versioned as last-v1.ckpt;
    # the error names the settings that differ from the run there.
    other = args + ["--data.search.trajectories_per_tree=3"]
    with pytest.raises(PreflightError, match=rf"checkpoint folder {checkpoints} already holds checkpoints .*"
                                             r"run with other settings \(--data.search.trajectories_per_tree: 2 -> 3\).*"
                                             r"Resume that run with --ckpt_path last, or write elsewhere"):
        main(other)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["epoch=0-step=1.ckpt", "last.ckpt"]

    # The same command run again (README's quickstart, twice) is not an error: it resumes its
    # finished run, which has nothing left to train, and leaves its checkpoints as they were.
    before = {p.name: p.stat().st_mtime_ns for p in checkpoints.iterdir()}
    again = main(args)
    assert again.trainer.global_step == 1 and again.trainer.ckpt_path == str(checkpoints / "last.ckpt")
    assert "holds a run of this same command (the same settings): resuming it from last.ckpt; it had finished its " \
           "1 epochs, so there is nothing left to train" in caplog.text
    assert {p.name: p.stat().st_mtime_ns for p in checkpoints.iterdir()} == before


def test_a_second_fit_into_a_folder_in_use_is_refused_and_a_killed_fit_leaves_no_lock(tmp_path):
    """Two fits into one run folder at once (before: both wrote last.ckpt there, the folder's last
    checkpoint whichever wrote last). Another process holds the folder as a running fit does; the
    fit started beside it is refused before it writes anything; once that process is SIGKILLed
    the folder is free again."""
    import subprocess
    import sys
    import time

    from flywheel.run.folder_lock import hold_folder, lock_file

    checkpoints = tmp_path / "quickstart" / "checkpoints"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from flywheel.run.folder_lock import "
         "hold_folder; h = hold_folder(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)", str(checkpoints)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        args = ["fit", "--config", QUICK, *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.max_epochs=1"]
        with pytest.raises(PreflightError, match=rf"checkpoint folder {checkpoints} is in use by another fit \(pid "
                                                 rf"{holder.pid}, started .*\): two runs in one folder would overwrite"):
            main(args)
        assert not checkpoints.exists() and not list((tmp_path / "quickstart").glob("version_*/summary.json"))
    finally:
        holder.kill()
        holder.wait(timeout=30)
    time.sleep(0.1)
    hold_folder(checkpoints).close()  # the kernel released the killed process's lock: no stale lock to clear
    assert lock_file(checkpoints).exists()
