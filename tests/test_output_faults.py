"""Disks that fail the run (issue 37, item 12): a run folder turned read-only mid-run is named
in one line (before: Lightning's chained "you tried to log -0.5 ..." error), and pre-flight
counts every checkpoint the run keeps at once (before: one, so an 8 MiB folder passed and the
run failed at its first epoch's end with three chained tracebacks). Real tmpfs mounts; needs
root (skipped, saying so, without)."""

import subprocess
from pathlib import Path

import pytest

from flywheel.__main__ import main
from flywheel.io import OutputWriteError
from flywheel.module import PolicyModule
from flywheel.run.preflight import PreflightError

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=2",
        "--data.eval.samples=1", "--data.problems.max_train_problems=8", "--data.save_trees=1", "--data.eval.at_start=false",
        "--data.search.max_expansions_per_tree=4", "--data.search.trajectories_per_tree=2"]


@pytest.fixture
def mount(tmp_path):
    """mount(size) -> a fresh tmpfs folder of that size, unmounted after the test."""
    mounted: list[Path] = []

    def make(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def fit_args(folder: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *TINY, f"--trainer.logger.init_args.save_dir={folder}",
            *extra]


def test_a_run_folder_turned_read_only_mid_run_is_named(mount, monkeypatch):
    folder = mount("64m")
    step = PolicyModule.training_step

    def read_only_from_epoch_1(self, *args, **kwargs):
        if self.trainer.current_epoch == 1:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(PolicyModule, "training_step", read_only_from_epoch_1)
    try:
        with pytest.raises(OutputWriteError) as err:
            main(fit_args(folder, "--trainer.max_epochs=2"))
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
    message = str(err.value)
    assert f"cannot write {folder / 'quickstart' / 'version_0'} (Read-only file system" in message, message
    assert "resume with: python -m flywheel fit" in message and "--ckpt_path last" in message and "\n" not in message
    assert (folder / "quickstart" / "checkpoints" / "last.ckpt").is_file()  # epoch 0's, intact


def test_preflight_counts_every_checkpoint_the_run_keeps(mount):
    folder = mount("8m")  # room for one checkpoint of the tiny policy (5.5 MB), not for three
    with pytest.raises(PreflightError) as err:
        main(fit_args(folder, "--trainer.max_epochs=1"))
    checkpoints = folder / "quickstart" / "checkpoints"
    assert (f"no space left on {checkpoints}: the run's checkpoints (3 at once: top 1, last.ckpt, one being written; "
            in str(err.value)), str(err.value)
    assert "--trainer.callbacks.init_args.save_top_k" in str(err.value)
    assert not list(folder.rglob("*.ckpt")) and not list(folder.rglob("epoch_*.jsonl"))  # nothing ran
