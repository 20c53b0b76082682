"""A fit's wall split (callbacks.wall_time) end to end: a tiny fit writes it into summary.json
per epoch, per round and in total, its parts add up to the wall time, it is in TensorBoard
under compute/wall/, and a resumed run keeps the first part's seconds. Rounds of 2 epochs: the
first part (1 epoch) ends inside round 1, which the resumed part completes."""

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.wall_time import PARTS
from flywheel.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=8",
    "--data.eval.samples=2", "--data.search.expansion_width=4", "--data.search.trajectories_per_tree=4",
    "--data.epochs_per_round=2", "--data.hard_set.enabled=true", "--data.problems.max_train_problems=16",
    "--trainer.enable_progress_bar=false",
]
ROUNDING = 0.01  # 11 parts, each rounded to the millisecond


def fit(run_dir: Path, epochs: int, *extra: str):
    return main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *SMALL, f"--trainer.max_epochs={epochs}",
                 f"--trainer.logger.init_args.save_dir={run_dir}", *extra])


def summary(cli) -> dict:
    return json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())


def assert_adds_up(split: dict) -> None:
    parts = [split[f"{p}_s"] for p in PARTS] + [split["other_s"]]
    assert all(v >= 0 for v in parts), split
    assert sum(parts) == pytest.approx(split["wall_s"], abs=ROUNDING), split
    assert split["search_s"] == pytest.approx(split["search_generator_s"] + split["search_bookkeeping_s"], abs=0.002)
    busy = (split["search_generator_s"] + split["train_s"]) / split["wall_s"]
    assert split["busy_fraction"] == pytest.approx(busy, abs=0.002) and 0 < busy < 1


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("wall")
    cli = fit(run_dir, 1)
    return run_dir, summary(cli), cli.trainer.log_dir


@pytest.mark.slow
def test_a_fit_writes_its_wall_split_per_epoch_round_and_in_total(first):
    _, out, log_dir = first
    split = out["wall_split"]
    (epoch,) = split["epochs"]
    (row,) = out["rounds"]
    assert row["partial"]  # the run stopped inside round 1: its row so far
    for part in (split["total"], epoch, row["wall_split"]):
        assert_adds_up(part)
    # One epoch: the three are the same seconds.
    assert {k: v for k, v in epoch.items() if k != "epoch"} == row["wall_split"] == split["total"]
    total = split["total"]
    # Everything this run does was measured where it happens (the in-process generator's
    # weight push is a no-op, and there is no value model).
    for part in ("search_generator", "search_bookkeeping", "train", "eval", "screening", "checkpoint", "rebuild"):
        assert total[f"{part}_s"] > 0, (part, total)
    assert total["weight_sync_s"] < ROUNDING and total["value_model_s"] == 0
    assert total["search_generator_s"] > total["search_bookkeeping_s"]
    # The base screening and evaluation (and the generator's start) were one-time work, inside
    # the epoch's screening and evaluation seconds: the projected end of the fit leaves them out.
    assert epoch["screening_s"] < epoch["one_time_s"] < epoch["screening_s"] + epoch["eval_s"] + epoch["rebuild_s"]

    ea = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    for key in ("search_generator_s", "train_s", "other_s", "wall_s", "busy_fraction"):
        (point,) = ea.Scalars(f"compute/wall/{key}")
        assert point.step == 0 and point.value == pytest.approx(epoch[key], abs=1e-3)


@pytest.mark.slow
def test_the_wall_split_survives_a_resume(first):
    run_dir, before, _ = first
    resumed = summary(fit(run_dir, 2, "--ckpt_path", "last"))
    split = resumed["wall_split"]
    assert [e["epoch"] for e in split["epochs"]] == [0, 1]
    # Epoch 0 ran in the first process: its search, screening and evaluation come back from
    # the checkpoint (re-measured, they would be 0 in the resumed process).
    (old,) = before["wall_split"]["epochs"]
    for part in ("search_generator", "search_bookkeeping", "train", "eval", "screening", "one_time"):
        assert split["epochs"][0][f"{part}_s"] == old[f"{part}_s"], part
    # The total is the run's, both processes: the sum of its epochs.
    total = split["total"]
    assert_adds_up(total)
    for key in [f"{p}_s" for p in PARTS] + ["other_s", "wall_s"]:
        assert total[key] == pytest.approx(sum(e[key] for e in split["epochs"]), abs=ROUNDING), key
    assert total["search_generator_s"] > old["search_generator_s"]
    # Round 1, completed by the resumed part, replaces its partial row: both epochs, both processes.
    (row,) = resumed["rounds"]
    assert row["round"] == 1 and "partial" not in row
    assert_adds_up(row["wall_split"])
    for key in row["wall_split"]:
        if key.endswith("_s"):
            assert row["wall_split"][key] == pytest.approx(total[key], abs=ROUNDING), key
