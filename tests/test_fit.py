"""End to end: a short `fit` through the CLI on the tiny policy trains, logs and summarises."""

import json
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel.__main__ import main
from flywheel.policy import load_policy

ROOT = Path(__file__).resolve().parents[1]

SMALL = [
    "--trainer.max_epochs=2",
    "--data.problems_per_epoch=8",
    "--data.mini_batch_problems=4",
    "--data.max_eval_problems=16",
    "--data.eval.samples=2",
    "--data.search.expansion_width=4",
    "--data.search.trajectories_per_tree=4",
    "--data.epochs_per_round=1",
    "--data.hard_set.enabled=true",
    "--data.max_train_problems=48",
]


def run_fit(tmp_path: Path, *extra: str, overlay: str | None = None):
    overlays = ["--config", str(ROOT / "conf" / overlay)] if overlay else []
    return main(
        ["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *overlays, *SMALL,
         f"--trainer.logger.init_args.save_dir={tmp_path}",
         f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}", *extra]
    )


def scalars(log_dir: str) -> dict[str, list]:
    ea = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: ea.Scalars(tag) for tag in ea.Tags()["scalars"]}


@pytest.mark.slow
def test_two_epoch_fit_trains_logs_and_writes_summary(tmp_path):
    cli = run_fit(tmp_path, "--model.packing=true")
    trainer = cli.trainer
    log_dir = trainer.log_dir

    # The parameters moved away from the shipped policy.
    base, _ = load_policy("tiny-countdown")
    trained = cli.model.policy.state_dict()
    changed = [name for name, value in base.state_dict().items() if not torch.equal(value, trained[name])]
    assert changed, "no parameter changed during fit"
    assert trainer.global_step > 0

    tags = scalars(log_dir)
    for tag in ("train/loss", "train/advantage_mean", "search/depth", "search/iterations_per_tree",
                "search/reward", "search/seconds", "compute/generated_tokens", "compute/prefill_tokens",
                "eval/pass@1", "eval/pass@2", "round/eval_pass@1", "compute/prefix_hit_rate",
                "compute/packed_token_ratio"):
        assert tag in tags, f"{tag} missing from TensorBoard; have {sorted(tags)}"
    tokens = [p.value for p in tags["compute/generated_tokens"]]
    assert tokens == sorted(tokens) and tokens[-1] > 0  # cumulative
    assert [p.step for p in tags["round/eval_pass@1"]] == [0, 1, 2]

    summary = json.loads((Path(log_dir) / "summary.json").read_text())
    assert 0.0 <= summary["base_eval_pass1"] <= 1.0
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    for r in summary["rounds"]:
        assert set(r) >= {"round", "epoch", "eval_pass1", "eval_passk", "k", "hard_set_size", "cached", "generated_tokens"}
        assert r["k"] == 2
        assert 0 <= r["cached"] <= r["hard_set_size"] <= 48
    sizes = [r["hard_set_size"] for r in summary["rounds"]]
    assert sizes == sorted(sizes, reverse=True)  # a refresh never adds problems

    # The hard set and the replay buffer are in the run directory and in the checkpoint.
    state = Path(log_dir) / "flywheel_state"
    hard = json.loads((state / "hard_set.json").read_text())
    assert len(hard["ids"]) == sizes[-1] and hard["round"] == 2
    assert json.loads((state / "replay_buffer.json").read_text())["format"].startswith("flywheel.adaptive.replay")
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    dm_state = ckpt["SearchDataModule"]
    assert dm_state["round"] == 2 and dm_state["hard_set"]["ids"] == hard["ids"]
    assert summary["rounds"][-1]["generated_tokens"] > summary["rounds"][0]["generated_tokens"] > 0

    # The run report: per-round table and plot beside summary.json.
    report = (Path(log_dir) / "report.md").read_text()
    assert "| round | epoch | pass@1 | pass@2 | hard set | cached |" in report
    assert f"| 2 | 1 | {summary['rounds'][1]['eval_pass1']:.4f} |" in report
    png = (Path(log_dir) / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.slow
@pytest.mark.parametrize("overlay", ["dapo.yaml", "best_of_n.yaml"])
def test_flat_baselines_fit(tmp_path, overlay):
    cli = run_fit(tmp_path, "--trainer.max_epochs=1", "--data.flat_samples=4", overlay=overlay)
    assert cli.trainer.current_epoch == 1
    assert (Path(cli.trainer.log_dir) / "summary.json").is_file()


@pytest.mark.slow
def test_drop_uniform_groups_leaves_out_trees_with_one_outcome(tmp_path):
    cli = run_fit(tmp_path, "--trainer.max_epochs=1", "--data.drop_uniform_groups=true", "--data.hard_set.enabled=false")
    dm = cli.datamodule
    problems = list(dm.train_pool().values())[:24]
    rows, results, _ = dm.rollouts(cli.model, problems, epoch=7, rank=0)
    uniform = [len({t.final_score for t in r.trajectories}) == 1 for r in results]
    assert any(uniform) and not all(uniform), "want both kinds of tree to check the rule"
    for problem_rows, result, is_uniform in zip(rows, results, uniform):
        assert (problem_rows == []) == is_uniform, result.problem_id
    assert dm.uniform_groups == sum(uniform)

    dm.drop_uniform_groups = False
    rows, _, _ = dm.rollouts(cli.model, problems, epoch=7, rank=0)
    assert all(rows) and dm.uniform_groups == 0
