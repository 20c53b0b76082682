"""Searching the next epoch while this one trains (`--data.async_search.max_staleness=1`,
data_modules/search_ahead.py): the hand-off of a search ahead to its epoch, abandoning it
(a stop) and the resume rule (its problems are searched again, never half-used), the
staleness accounting on hand-worked versions, the settings it refuses, and fits with a
generator that has weights of its own (tests/copy_backend.py, in-process): rows one sync
behind after the first epoch, one push per epoch, a Ctrl-C mid-overlap resumed with every
epoch's trees trained exactly once. The same through the vLLM sidecar:
tests/test_vllm_sidecar.py."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from data_modules.curriculum import Curriculum
from data_modules.resume import data_state, restore_data_state
from data_modules.search_ahead import SearchAhead, Searched, refusal, staleness
from data_modules.settings import AsyncSearchConfig
from flywheel.adaptive import HardSetConfig, ReplayConfig

ROOT = Path(__file__).resolve().parents[1]
ON = AsyncSearchConfig(max_staleness=1)


def problems(*ids):
    return [SimpleNamespace(id=i) for i in ids]


# ---------------------------------------------------------------------- the hand-off
def test_a_search_ahead_is_handed_to_its_epoch_once():
    ahead = SearchAhead()
    rounds = []

    def search(advance):
        for done in (1, 2):
            advance(done)
            rounds.append(done)
        return "rollouts of epoch 3"

    ahead.launch(3, problems("a", "b"), version=8, pushes=2, search=search)
    assert ahead.running and ahead.drawn == {3: ("a", "b")} and ahead.holds(3) and not ahead.holds(4)
    assert ahead.state() == {"drawn": [{"epoch": 3, "problems": ["a", "b"]}]}  # what a checkpoint written now holds
    assert ahead.finish() >= 0.0 and not ahead.running  # the epoch's end waits for it
    assert ahead.holds(3) and ahead.finished(3).rollouts == "rollouts of epoch 3" and ahead.redo(3) is None
    taken = ahead.take(3)
    assert (taken.epoch, [p.id for p in taken.problems], taken.rollouts, taken.version, taken.pushes) == (
        3, ["a", "b"], "rollouts of epoch 3", 8, 2)
    assert rounds == [1, 2] and taken.seconds >= 0
    assert ahead.drawn == {} and ahead.state() is None and not ahead.holds(3)  # trained on: nothing left to redo
    assert ahead.take(4) is None and ahead.redo(4) is None  # nothing started for epoch 4
    with pytest.raises(RuntimeError, match="already in flight"):
        ahead.launch(4, problems("c"), 9, 3, search=lambda advance: threading.Event().wait(0.5))
        ahead.launch(5, problems("d"), 9, 3, search=search)
    ahead.close()


def test_the_next_search_starts_while_the_finished_one_waits_for_its_epoch():
    """An epoch's end: the search of epoch 4 (finished) waits for its loader while epoch 5's
    starts; the checkpoint written now holds both draws; epoch 4's loader takes its search
    without waiting for epoch 5's."""
    ahead = SearchAhead()
    release = threading.Event()
    ahead.launch(4, problems("a"), 1, 1, search=lambda advance: "rollouts of 4")
    ahead.finish()
    ahead.launch(5, problems("b", "c"), 2, 2, search=lambda advance: release.wait(10) and "rollouts of 5")
    assert ahead.state() == {"drawn": [{"epoch": 4, "problems": ["a"]}, {"epoch": 5, "problems": ["b", "c"]}]}
    assert ahead.take(4).rollouts == "rollouts of 4" and ahead.running  # epoch 5's search goes on
    assert ahead.state() == {"drawn": [{"epoch": 5, "problems": ["b", "c"]}]}
    release.set()
    assert ahead.take(5).rollouts == "rollouts of 5" and ahead.state() is None  # its own epoch waits for it
    ahead.launch(6, problems("d"), 3, 3, search=lambda advance: "rollouts of 6")
    ahead.finish()
    ahead.close()  # the run ends: a finished search no epoch took is dropped
    assert ahead.take(6) is None and ahead.redo(6) == ("d",)


def test_an_abandoned_search_is_not_kept_and_its_problems_are_searched_again():
    ahead = SearchAhead()
    started = threading.Event()

    def endless(advance):
        started.set()
        while True:
            advance(0)
            threading.Event().wait(0.01)

    ahead.launch(2, problems("p", "q"), version=4, pushes=1, search=endless)
    started.wait(10)
    ahead.finish(abandon=True)  # the run stops at this epoch's end
    assert not ahead.running and ahead.take(2) is None  # never half-used
    assert ahead.redo(2) == ("p", "q") and ahead.redo(3) is None
    ahead.done(3)  # another epoch's: still pending
    assert ahead.redo(2) == ("p", "q")
    ahead.done(2)  # the epoch searched them in place
    assert ahead.redo(2) is None


def test_a_stop_request_abandons_the_search_at_its_next_round():
    asks = iter([False, False, True])
    ahead = SearchAhead()
    rounds = []

    def search(advance):
        for done in range(10):
            advance(done)  # raises data_modules.search_ahead.Abandoned when asked to stop
            rounds.append(done)
        return "never"

    ahead.launch(1, problems("x"), 0, 0, search=search, stop=lambda: next(asks))
    ahead.finish()
    assert rounds == [0, 1] and ahead.take(1) is None and ahead.redo(1) == ("x",)


def test_a_failed_search_fails_the_run_at_the_wait_unless_the_run_stops_there():
    def broken(advance):
        raise ConnectionError("the server went away")

    ahead = SearchAhead()
    ahead.launch(1, problems("x"), 0, 0, search=broken)
    with pytest.raises(ConnectionError, match="went away"):
        ahead.finish()
    ahead = SearchAhead()
    ahead.launch(1, problems("x"), 0, 0, search=broken)
    ahead.finish(abandon=True)  # stopping anyway: its problems are searched again on resume
    assert ahead.redo(1) == ("x",)


# ---------------------------------------------------------------------- staleness
def test_staleness_on_hand_worked_versions():
    """Two optimizer steps per epoch, one push at each epoch's end (version = global step):
    epoch 0 searches in place at step 0; its loader starts epoch 1's search on the weights of
    step 0 (no push yet); epoch 0's end pushes step 2 (push 1); epoch 1 trains from step 2 on
    rows of step 0: 1 sync, 2 steps old. Epoch 1's loader starts epoch 2's search on step 2
    (after push 1); epoch 1's end pushes step 4 (push 2): epoch 2's rows are again 1 sync and
    2 steps old, and at epoch 2's second optimizer step (global step 5) 3 steps old."""
    def searched(epoch, version, pushes):
        return Searched(epoch, (), None, 0.0, version, pushes)

    assert staleness(searched(0, version=0, pushes=0), pushes_now=0, step_now=0) == (0, 0)
    assert staleness(searched(1, version=0, pushes=0), pushes_now=1, step_now=2) == (1, 2)
    assert staleness(searched(2, version=2, pushes=1), pushes_now=2, step_now=4) == (1, 2)
    assert 5 - searched(2, 2, 1).version == 3  # the per-batch compute/staleness_steps
    # An epoch without an optimizer step pushes nothing: the weights did not move, no lag.
    assert staleness(searched(3, version=4, pushes=2), pushes_now=2, step_now=4) == (0, 0)
    # A resumed run searches in place with the resumed weights: no lag.
    assert staleness(searched(2, version=4, pushes=0), pushes_now=0, step_now=4) == (0, 0)


# ---------------------------------------------------------------------- the resume rule
def test_the_checkpoint_holds_the_problems_drawn_ahead_never_the_search():
    curriculum = Curriculum(HardSetConfig(enabled=False), ReplayConfig(), 1, 0)
    curriculum.start(["a", "b", "c"], {})
    drawn = {"drawn": [{"epoch": 4, "problems": ["b", "c"]}, {"epoch": 5, "problems": ["a"]}]}
    state = data_state(curriculum, 10, 0, None, drawn)
    assert state["search_ahead"] == drawn
    assert "search_ahead" not in data_state(curriculum, 10, 0)  # off: the state is as before the switch
    ahead = SearchAhead()
    restore_data_state(state, Curriculum(HardSetConfig(enabled=False), ReplayConfig(), 1, 0), "x.ckpt", ahead)
    assert ahead.redo(4) == ("b", "c") and ahead.redo(5) == ("a",) and not ahead.running
    older = {**state, "search_ahead": {"epoch": 4, "problems": ["b", "c"]}}  # one draw: a checkpoint from before two
    restore_data_state(older, Curriculum(HardSetConfig(enabled=False), ReplayConfig(), 1, 0), "x.ckpt", ahead)
    assert ahead.drawn == {4: ("b", "c")}
    bad = {**state, "search_ahead": {"drawn": [{"epoch": 4, "problems": "bc"}]}}
    kept = SearchAhead()
    with pytest.raises(ValueError, match="x.ckpt is malformed.*nothing was restored"):
        restore_data_state(bad, Curriculum(HardSetConfig(enabled=False), ReplayConfig(), 1, 0), "x.ckpt", kept)
    assert kept.drawn == {}
    restore_data_state(data_state(curriculum, 1, 0), Curriculum(HardSetConfig(enabled=False), ReplayConfig(), 1, 0),
                       "y.ckpt", ahead)
    assert ahead.drawn == {}  # a checkpoint without it: nothing drawn ahead


# ---------------------------------------------------------------------- refusals
GOOD = dict(own_weights=True, world_size=1, old_logprobs="recompute_tis", loss_type="ppo", stream=False,
            value_head_search=False)


@pytest.mark.parametrize("change, says", [
    ({"own_weights": False}, "needs a generator with weights of its own.*VLLMSidecar"),
    ({"world_size": 2}, "one process only.*--trainer.devices=1"),
    ({"stream": True}, "--data.problems.stream=false"),
    ({"value_head_search": True}, "puct_agents.*value_coef=0"),
    ({"old_logprobs": "recompute"}, "--model.old_logprobs=recompute_tis.*the lag goes uncorrected"),
    ({"old_logprobs": "behaviour"}, "--model.old_logprobs=recompute_tis.*stale generator"),
])
def test_what_the_search_ahead_refuses(change, says):
    message = refusal(ON, **{**GOOD, **change})
    assert message.startswith("--data.async_search.max_staleness=1 ") and "\n" not in message
    assert re.search(says, message), message
    assert refusal(AsyncSearchConfig(), **{**GOOD, **change}) is None  # off: nothing to refuse


def test_what_the_search_ahead_accepts():
    assert refusal(ON, **GOOD) is None
    # ReST-MCTS*'s self-training loss has no importance ratio: the lag needs no correction.
    assert refusal(ON, **{**GOOD, "old_logprobs": "recompute", "loss_type": "self_training"}) is None
    with pytest.raises(ValueError, match="must be 0 \\(off\\) or 1"):
        AsyncSearchConfig(max_staleness=2)


def test_the_in_process_generator_is_refused_before_any_work_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "flywheel", "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"),
         "--data.async_search.max_staleness=1", "--model.old_logprobs=recompute_tis",
         f"--trainer.logger.init_args.save_dir={tmp_path}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("flywheel: error: --data.async_search.max_staleness=1 searches the next epoch"), last
    assert "in-process generator" in last and "Traceback" not in proc.stderr
    assert "epoch 0" not in proc.stderr  # refused before the first search


# ---------------------------------------------------------------------- fits (copy_backend.CopyBackend)
TINY = ["--data.generator=copy_backend.CopyBackend", "--data.async_search.max_staleness=1",
        "--model.old_logprobs=recompute_tis", "--data.batching.problems_per_epoch=8",
        "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=4", "--data.eval.samples=1",
        "--data.problems.max_train_problems=32", "--data.save_trees=8", "--data.eval.at_start=false",
        "--data.search.max_expansions_per_tree=8", "--data.search.trajectories_per_tree=4",
        "--data.epochs_per_round=1", "--trainer.enable_progress_bar=false"]


def fit(run_dir: Path, epochs: int, *extra: str):
    from flywheel.__main__ import main

    return main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *TINY, f"--trainer.max_epochs={epochs}",
                 f"--trainer.logger.init_args.save_dir={run_dir}", *extra])


def spy_on_loaders(monkeypatch) -> list[tuple[int, int, list[int], list[int]]]:
    """(epoch, global step, weight versions, staleness) of every batch each loader returns."""
    from data_modules.search import SearchDataModule

    seen = []
    build = SearchDataModule.train_dataloader

    def spied(self):
        loader = build(self)
        for batch in loader.dataset:
            if batch.weight_version is not None:
                seen.append((self.trainer.current_epoch, self.trainer.global_step, batch.weight_version.tolist(),
                             batch.staleness.tolist()))
        return loader

    monkeypatch.setattr(SearchDataModule, "train_dataloader", spied)
    return seen


def trees_of(run: Path, epoch: int) -> list[str]:
    return [json.loads(line)["problem_id"] for line in (run / "trees" / f"epoch_{epoch:04d}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_fit_searching_ahead_trains_rows_one_sync_old_with_one_push_per_epoch(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    seen = spy_on_loaders(monkeypatch)
    saves = []
    from flywheel.run.checkpoint import AtomicCheckpointIO

    save = AtomicCheckpointIO.save_checkpoint
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", lambda self, checkpoint, path, *a: saves.append(
        (Path(path).name, checkpoint["SearchDataModule"].get("search_ahead"))) or save(self, checkpoint, path, *a))
    cli = fit(tmp_path, 3)
    backend, steps = cli.datamodule.backend, cli.trainer.global_step
    ends = backend.syncs  # the version pushed at each epoch's end: its global step
    assert len(ends) == 3 and ends[-1] == steps  # one push per epoch, after the wait
    by_epoch = {}
    for epoch, step, versions, lag in seen:
        by_epoch.setdefault(epoch, set()).update((v, s) for v, s in zip(versions, lag))
    # Epoch 0 searched in place (step 0); epoch 1 ahead with the starting weights, trained
    # after the first push; epoch 2 ahead with the weights pushed at epoch 0's end.
    assert by_epoch == {0: {(0, 0)}, 1: {(0, 1)}, 2: {(ends[0], 1)}}
    run = Path(cli.trainer.log_dir)
    summary = json.loads((run / "summary.json").read_text())
    assert [(r["staleness"], r["staleness_steps"]) for r in summary["rounds"]] == [(0, 0), (1, ends[0]), (1, ends[1] - ends[0])]
    assert summary["wall_split"]["total"]["overlapped/search_ahead_s"] > 0  # searched beside training
    assert cli.datamodule.ahead.drawn == {} and not cli.datamodule.ahead.running  # nothing past the last epoch
    # Epoch 2's search started at epoch 0's end, right after the push: before epoch 0's checkpoint
    # was written and epoch 1's loader built, so epoch 0's checkpoint holds two epochs drawn ahead.
    events = re.findall(r"epoch (\d+): (searching its 8 problems ahead|8 problems)", caplog.text)
    assert events == [("1", "searching its 8 problems ahead"), ("0", "8 problems"),
                      ("2", "searching its 8 problems ahead"), ("1", "8 problems"), ("2", "8 problems")]
    epoch_0 = [drawn for name, drawn in saves if name.startswith("epoch=0")]
    assert [[d["epoch"] for d in drawn["drawn"]] for drawn in epoch_0] == [[1, 2]]


@pytest.mark.slow
def test_a_resume_from_an_epoch_end_holding_two_draws_searches_both_again_in_order(tmp_path, monkeypatch, caplog):
    """A kill after epoch 0's checkpoint (epoch 1's search finished, epoch 2's in flight): the
    resumed run searches epoch 1's problems in place, then epoch 2's ahead, each drawn once."""
    from flywheel.run.checkpoint import AtomicCheckpointIO

    save = AtomicCheckpointIO.save_checkpoint
    kept = tmp_path / "epoch_0_end.ckpt"

    def save_and_keep(self, checkpoint, path, *a):
        save(self, checkpoint, path, *a)
        if Path(path).name.startswith("epoch=0"):
            save(self, checkpoint, kept)

    with monkeypatch.context() as patch:
        patch.setattr(AtomicCheckpointIO, "save_checkpoint", save_and_keep)
        fit(tmp_path / "first", 3)
    drawn = torch.load(kept, weights_only=False)["SearchDataModule"]["search_ahead"]["drawn"]
    assert [d["epoch"] for d in drawn] == [1, 2]
    caplog.set_level(logging.INFO)
    resumed = fit(tmp_path / "second", 3, "--ckpt_path", str(kept))
    assert re.findall(r"epoch (\d+): (searching its 8 problems \w+|8 problems)", caplog.text) == [
        ("1", "searching its 8 problems drawn"), ("2", "searching its 8 problems drawn"),
        ("2", "searching its 8 problems ahead"), ("1", "8 problems"), ("2", "8 problems")]
    run = Path(resumed.trainer.log_dir)
    assert [trees_of(run, 1), trees_of(run, 2)] == [d["problems"] for d in drawn]
    assert resumed.datamodule.ahead.drawn == {}


@pytest.mark.slow
def test_ctrl_c_mid_overlap_resumes_with_every_epoch_trained_exactly_once(tmp_path, monkeypatch, caplog):
    """Ctrl-C during epoch 1's steps, while epoch 2 is searched ahead: the epoch finishes, the
    search ahead is abandoned, last.ckpt holds epoch 2's problems; the resumed run searches
    exactly those, once, with its own weights (staleness 0), and trains on them."""
    from flywheel.module import PolicyModule

    caplog.set_level(logging.INFO)
    step = PolicyModule.training_step
    pressed = []

    def press_in_epoch_1(self, batch, batch_idx):
        if self.current_epoch == 1 and not pressed:
            pressed.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, batch, batch_idx)

    with monkeypatch.context() as patch:
        patch.setattr(PolicyModule, "training_step", press_in_epoch_1)
        with pytest.raises(SystemExit) as stopped:
            fit(tmp_path, 3)
    assert stopped.value.code == 130
    last = tmp_path / "quickstart" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=False)
    (drawn,) = saved["SearchDataModule"]["search_ahead"]["drawn"]
    assert drawn["epoch"] == 2 and len(drawn["problems"]) == 8
    first = re.findall(r"epoch (\d+): 8 problems", caplog.text)
    assert first == ["0", "1"]
    caplog.clear()

    seen = spy_on_loaders(monkeypatch)
    resumed = fit(tmp_path, 3, "--ckpt_path", "last")
    assert re.findall(r"epoch (\d+): 8 problems", caplog.text) == ["2"]  # only the epoch left, once
    assert "epoch 2: searching its 8 problems drawn before (that search was not kept)" in caplog.text
    run = Path(resumed.trainer.log_dir)
    assert trees_of(run, 2) == drawn["problems"]  # the problems drawn ahead, searched and trained
    assert {(v, s) for _, _, versions, lag in seen for v, s in zip(versions, lag)} == {(saved["global_step"], 0)}
    assert resumed.trainer.global_step > saved["global_step"]
    assert resumed.datamodule.ahead.drawn == {}
    summary = json.loads((run / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2, 3] and summary["rounds"][-1]["staleness"] == 0
