"""`--ckpt_path last` continues a run: round counter, hard set, replay buffer, token count,
solved problems and the per-round summary come back, and the result equals an uninterrupted run, also after the
run was SIGKILLed during a search (an environment's episodes in flight too), an optimizer step or a
checkpoint write. A damaged checkpoint fails with its path and the way out."""

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel.__main__ import main
from flywheel.run.checkpoint import CheckpointReadError
from procs import run_group

ROOT = Path(__file__).resolve().parents[1]
CRASH = ROOT / "tests" / "scripts" / "crash_fit.py"
SMALL = [
    "--data.batching.problems_per_epoch=8", "--data.problems.max_eval_problems=16", "--data.epochs_per_round=1",
    "--data.hard_set.enabled=true", "--data.problems.max_train_problems=48", "--data.eval.samples=2",
    "--data.replay.rule=code",  # caches solutions within 3 short epochs, so the buffer has state to restore
]
EPOCHS = 3


def fit_args(run_dir: Path, epochs: int, *extra: str) -> list[str]:
    return ["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *SMALL, f"--trainer.max_epochs={epochs}",
            f"--trainer.logger.init_args.save_dir={run_dir}",
            f"--trainer.callbacks.init_args.dirpath={run_dir / 'checkpoints'}", *extra]


def fit(run_dir: Path, epochs: int, *extra: str):
    return main(fit_args(run_dir, epochs, *extra))


def summary(cli) -> dict:
    return json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())


def solved_file(cli) -> dict:
    return json.loads((Path(cli.trainer.log_dir) / "solved_problems.json").read_text())


def assert_same_run(resumed, whole) -> None:
    a, b = whole.datamodule.curriculum, resumed.datamodule.curriculum
    # The comparison means something only if there was state to restore: the hard set shrank
    # at a refresh and the replay buffer holds solutions.
    assert a.hard.history[-1] < a.hard.history[0], a.hard.history
    assert len(a.buffer) > 0
    assert b.round == EPOCHS and resumed.trainer.global_step == whole.trainer.global_step
    assert b.hard.ids == a.hard.ids and b.hard.history == a.hard.history
    assert b.buffer.to_dict() == a.buffer.to_dict()
    assert resumed.datamodule.generated_tokens == whole.datamodule.generated_tokens
    assert b.solved.state_dict() == a.solved.state_dict() and a.solved.first  # each problem's first solve
    assert solved_file(resumed) == solved_file(whole) == a.solved.to_json()
    assert [r["round"] for r in summary(resumed)["rounds"]] == list(range(1, EPOCHS + 1))
    def rounds(cli):  # wall times and the part's config file differ between runs; everything else must not
        return [{k: v for k, v in r.items() if k not in ("wall_seconds", "wall_split", "config")} for r in summary(cli)["rounds"]]

    assert rounds(resumed) == rounds(whole)
    walls = [r["wall_seconds"] for r in summary(resumed)["rounds"]]
    assert walls == sorted(walls) and walls[0] > 0  # cumulative over the killed and the resumed part


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("whole"), EPOCHS)


@pytest.mark.slow
def test_resume_continues_and_matches_an_uninterrupted_run(tmp_path, whole):
    first = fit(tmp_path, EPOCHS - 1)
    resumed = fit(tmp_path, EPOCHS, "--ckpt_path", "last")
    assert_same_run(resumed, whole)

    # One run is one TensorBoard run: the resumed part logs on in the same version folder.
    assert resumed.trainer.log_dir == first.trainer.log_dir
    assert [p.name for p in (tmp_path / "quickstart").iterdir()] == ["version_0"]
    ea = EventAccumulator(resumed.trainer.log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    assert [p.step for p in ea.Scalars("round/eval_pass@1")] == list(range(EPOCHS + 1))


@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    [
        "search:1",  # trees in flight in the 2nd epoch
        "optimizer:2",  # the 2nd epoch's only step, after backward, before the update
        "checkpoint:4",  # 2 saves per epoch (epoch file, last.ckpt): the 2nd epoch's last.ckpt, half written
    ],
)
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, whole, point):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    crashed = run_group([sys.executable, str(CRASH), point, *fit_args(tmp_path, EPOCHS)], timeout=600, env=env)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert "crash_fit: SIGKILL" in crashed.stderr
    checkpoints = tmp_path / "checkpoints"
    if point.startswith("checkpoint"):
        assert list(checkpoints.glob(".last.ckpt.*.tmp")), "the killed write left its temporary file"

    assert_same_run(fit(tmp_path, EPOCHS, "--ckpt_path", "last"), whole)
    assert not list(checkpoints.glob("*.tmp")), "temporaries of killed writes are swept by the next save"


@pytest.mark.slow
@pytest.mark.parametrize(
    "point, steps_saved",
    [
        ("term-search:1", 1),  # mid-search of the 2nd epoch: abandoned, saved as after epoch 1
        ("term-optimizer:2", 2),  # in the 2nd epoch's step: the epoch finishes, then saved
    ],
)
def test_sigterm_stops_at_a_safe_point_and_resumes_to_the_same_run(tmp_path, whole, point, steps_saved):
    # Before: the search ran to its end, one step ran, nothing was saved, and the exit status was 0.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    stopped = run_group([sys.executable, str(CRASH), point, *fit_args(tmp_path, EPOCHS)], timeout=600, env=env)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "crash_fit: SIGTERM" in stopped.stderr
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert f"checkpoint written: {last}" in stopped.stderr and "--ckpt_path last" in stopped.stderr
    assert torch.load(last, weights_only=False)["global_step"] == steps_saved
    if point.startswith("term-search"):
        assert "abandoning this epoch's search" in stopped.stderr
        assert "epoch 1:" not in stopped.stderr  # the 2nd epoch's search did not run to its end

    assert_same_run(fit(tmp_path, EPOCHS, "--ckpt_path", "last"), whole)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_checkpoint_names_the_file_and_the_way_out(tmp_path, damage):
    fit(tmp_path, 2)
    last = tmp_path / "checkpoints" / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 3] if damage == "truncated" else b"not a checkpoint\n" * 50)
    with pytest.raises(CheckpointReadError) as err:
        fit(tmp_path, 3, "--ckpt_path", "last")
    message = str(err.value)
    assert str(last) in message
    others = [p for p in (tmp_path / "checkpoints").glob("*.ckpt") if p != last]
    assert others and f"--ckpt_path {others[0]}" in message
    assert "without --ckpt_path" in message


@pytest.mark.slow
def test_malformed_search_state_in_a_checkpoint_is_not_silently_dropped(tmp_path):
    fit(tmp_path, 2)
    last = tmp_path / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=False)
    del ckpt["SearchDataModule"]["replay_buffer"]
    torch.save(ckpt, last)
    with pytest.raises(ValueError, match="malformed") as err:
        fit(tmp_path, 3, "--ckpt_path", "last")
    assert str(last) in str(err.value) and "--ckpt_path" in str(err.value)


ENVIRONMENT = [  # Mastermind episodes (docs/environments.md) in small step trees
    "--data.task=flywheel.tasks.mastermind.MastermindTask", "--data.problems.eval_split=val",
    "--data.batching.problems_per_epoch=8", "--data.batching.mini_batch_problems=8", "--data.problems.max_eval_problems=4",
    "--data.epochs_per_round=1", "--data.eval.samples=2", "--data.eval.at_start=false", "--data.search.max_depth=8",
    "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=4", "--data.search.max_expansions_per_tree=8",
]


def environment_fit_args(run_dir: Path, epochs: int, *extra: str) -> list[str]:
    return ["fit", "--config", str(ROOT / "conf" / "chain.yaml"), *ENVIRONMENT, f"--trainer.max_epochs={epochs}",
            f"--trainer.logger.init_args.save_dir={run_dir}",
            f"--trainer.callbacks.init_args.dirpath={run_dir / 'checkpoints'}", *extra]


@pytest.mark.slow
def test_an_environments_fit_killed_with_episodes_in_flight_resumes_to_the_same_run(tmp_path):
    # SIGKILLed at the 3rd generator call of the 2nd epoch's search (episodes half played), then
    # resumed: the same optimizer steps, tokens, per-round results and final weights as a run
    # never interrupted (the environment is replayed from each node's actions; nothing of the
    # killed epoch's episodes is kept).
    whole = main(environment_fit_args(tmp_path / "whole", EPOCHS))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    crashed = run_group([sys.executable, str(CRASH), "search:1", *environment_fit_args(tmp_path / "part", EPOCHS)],
                        timeout=600, env=env)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    resumed = main(environment_fit_args(tmp_path / "part", EPOCHS, "--ckpt_path", "last"))
    assert resumed.trainer.global_step == whole.trainer.global_step > 0
    assert resumed.datamodule.generated_tokens == whole.datamodule.generated_tokens

    def rounds(cli):
        return [{k: v for k, v in r.items() if k not in ("wall_seconds", "wall_split", "config")} for r in summary(cli)["rounds"]]

    assert rounds(resumed) == rounds(whole) and len(rounds(whole)) == EPOCHS
    weights = whole.model.policy.state_dict()
    assert all(torch.equal(weights[k], v) for k, v in resumed.model.policy.state_dict().items())
