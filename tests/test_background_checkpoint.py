"""The background checkpoint writer (flywheel.run.checkpoint.BackgroundCheckpointIO, issue 46 item 5):
a point-in-time snapshot, one write at a time in order, removals after the writes before them, the
previous file kept when a write dies, errors raised on the trainer's thread; and a fit that writes
its checkpoints in the background resumes as one that blocks."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from flywheel.run.checkpoint import AtomicCheckpointIO, BackgroundCheckpointIO

ROOT = Path(__file__).resolve().parents[1]


class SlowIO(BackgroundCheckpointIO):
    """Writes only after `gate` opens, and records what happened in order."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.gate = threading.Event()
        self.events: list[str] = []

    def _submit(self, work):
        def gated():
            self.gate.wait(10)
            work()
            self.events.append("done")
        super()._submit(gated)


def test_the_snapshot_is_taken_at_the_call_and_the_file_appears_after_the_write(tmp_path):
    io = SlowIO()
    weight = torch.zeros(4)
    state = collections.OrderedDict(w=weight)
    state._metadata = {"": {"version": 1}}
    io.save_checkpoint({"state_dict": state, "loops": {"step": [1, 2]}, "epoch": 3}, tmp_path / "a.ckpt")
    weight += 1  # the optimizer steps while the file is being written
    assert not (tmp_path / "a.ckpt").exists()
    io.gate.set()
    io.flush()
    saved = torch.load(tmp_path / "a.ckpt", weights_only=False)
    assert torch.equal(saved["state_dict"]["w"], torch.zeros(4)) and saved["epoch"] == 3
    assert type(saved["state_dict"]) is collections.OrderedDict and saved["state_dict"]._metadata == {"": {"version": 1}}
    assert saved["loops"] == {"step": [1, 2]}
    io.teardown()


def test_two_files_of_one_epoch_share_one_snapshot_and_a_changed_tensor_waits_for_the_writes(tmp_path):
    io = SlowIO()
    weight = torch.zeros(1000)
    io.save_checkpoint({"w": weight}, tmp_path / "epoch=0.ckpt")
    io.save_checkpoint({"w": weight.detach()}, tmp_path / "last.ckpt")  # unchanged: queued without waiting
    assert io.events == [] and len(io._copies) == 1
    weight.add_(1)  # the next epoch's weights: this save must first wait for the two queued writes
    opener = threading.Timer(0.3, io.gate.set)
    opener.start()
    io.save_checkpoint({"w": weight}, tmp_path / "epoch=1.ckpt")
    assert io.events == ["done", "done"]
    io.flush()
    assert torch.equal(torch.load(tmp_path / "last.ckpt")["w"], torch.zeros(1000))
    assert torch.equal(torch.load(tmp_path / "epoch=1.ckpt")["w"], torch.ones(1000))


def test_an_older_checkpoint_is_removed_only_after_the_newer_one_is_written(tmp_path):
    io = SlowIO()
    (tmp_path / "epoch=0.ckpt").write_bytes(b"previous")
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "epoch=1.ckpt")
    io.remove_checkpoint(tmp_path / "epoch=0.ckpt")  # Lightning's order: save the new one, remove the old one
    time.sleep(0.1)
    assert (tmp_path / "epoch=0.ckpt").exists(), "the old file went before the new one was complete"
    io.gate.set()
    io.flush()
    assert not (tmp_path / "epoch=0.ckpt").exists() and (tmp_path / "epoch=1.ckpt").exists()


def test_a_failed_write_keeps_the_previous_file_and_is_raised_on_the_callers_thread(tmp_path):
    heard = []
    io = BackgroundCheckpointIO(on_written=heard.append)
    (tmp_path / "last.ckpt").write_bytes(b"previous")
    io.save_checkpoint({"w": torch.ones(2), "bad": lambda: None}, tmp_path / "last.ckpt")  # a lambda does not pickle
    with pytest.raises(Exception, match="pickle|lambda"):
        io.flush()
    assert (tmp_path / "last.ckpt").read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left
    io.flush()  # raised once
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "last.ckpt")
    io.teardown()
    assert len(heard) == 1 and heard[0] >= 0  # the one finished write was heard, with its seconds
    assert torch.equal(torch.load(tmp_path / "last.ckpt")["w"], torch.ones(2))


KILLED_WRITER = textwrap.dedent("""
    import sys, time, torch
    from flywheel.run import checkpoint
    from flywheel.io import atomic_writer

    def slow_save(obj, fh):  # a large checkpoint: the process is killed halfway through its write
        fh.write(b"partial" * 1000)
        fh.flush()
        print("writing", flush=True)
        time.sleep(60)

    checkpoint.torch.save = slow_save
    io = checkpoint.BackgroundCheckpointIO()
    io.save_checkpoint({"w": torch.ones(3)}, sys.argv[1])
    time.sleep(60)
""")


def test_a_kill_during_a_background_write_keeps_the_previous_checkpoint(tmp_path):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(3)}, target)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert torch.equal(torch.load(target)["w"], torch.zeros(3))  # the previous checkpoint, whole
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(3)}, target)  # the next write clears the dead one's temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_fit_writes_in_the_background_by_default_and_blocking_on_request(tmp_path):
    from flywheel.__main__ import main

    def writer(*extra):
        args = ["--config", str(ROOT / "conf" / "quickstart.yaml"), f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}", *extra]
        return type(main(args, run=False).trainer.strategy.checkpoint_io)

    assert writer() is BackgroundCheckpointIO
    assert writer("--checkpoint_writes=blocking") is AtomicCheckpointIO


def test_a_tensor_without_a_version_is_copied_every_time(tmp_path):
    import torch

    with torch.inference_mode():
        frozen = torch.ones(3)
    io = BackgroundCheckpointIO()
    io.save_checkpoint({"buffer": frozen}, tmp_path / "a.ckpt")
    io.save_checkpoint({"buffer": frozen}, tmp_path / "b.ckpt")
    io.teardown()
    assert torch.equal(torch.load(tmp_path / "b.ckpt")["buffer"], torch.ones(3))
