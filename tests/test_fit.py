"""End to end: a short `fit` through the CLI on the tiny policy trains, logs and summarises."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel.__main__ import main
from flywheel.policies.load import load_policy

ROOT = Path(__file__).resolve().parents[1]

SMALL = [
    "--trainer.max_epochs=2",
    "--data.batching.problems_per_epoch=8",
    "--data.batching.mini_batch_problems=4",
    "--data.problems.max_eval_problems=16",
    "--data.eval.samples=2",
    "--data.search.expansion_width=4",
    "--data.search.trajectories_per_tree=4",
    "--data.epochs_per_round=1",
    "--data.hard_set.enabled=true",
    "--data.problems.max_train_problems=48",
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
    dm = cli.datamodule
    # The comparisons below mean something only if the flywheel turned: the screened hard set
    # (history[0], out of the 48 problems) shrank at a refresh. (The replay buffer stays empty
    # in 2 short epochs; tests/test_resume.py runs one that fills it.)
    hard_set = dm.curriculum.hard
    assert hard_set.history[0] <= 48 and sizes[-1] < hard_set.history[0], hard_set.history
    assert summary["rounds"][-1]["cached"] == len(dm.curriculum.buffer)

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

    # --data.save_trees (default 2): each epoch's first 2 trees, as the viewer reads them.
    trees = Path(log_dir) / "trees"
    assert sorted(p.name for p in trees.iterdir()) == ["epoch_0000.jsonl", "epoch_0001.jsonl"]
    for path in trees.iterdir():
        saved = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(saved) == 2
        for tree in saved:
            assert tree["format"] == "flywheel.search.tree/v1" and tree["problem_id"] in dm.train_pool()
            assert tree["mode"] == "search" and tree["trajectories"] and "text" in tree["nodes"][1]


@pytest.mark.slow
@pytest.mark.parametrize("overlay, rollout", [("dapo.yaml", "flat"), ("best_of_n.yaml", "best_of_n")])
def test_flat_baselines_fit(tmp_path, overlay, rollout):
    cli = run_fit(tmp_path, "--trainer.max_epochs=1", "--data.batching.flat_samples=4", "--data.save_trees=0",
                  "--data.hard_set.enabled=false", overlay=overlay)
    dm = cli.datamodule
    assert dm.rollout == rollout and cli.trainer.current_epoch == 1
    # 8 problems in mini-batches of 4: 2 optimizer steps, and the weights moved.
    assert cli.trainer.global_step == 2
    base, _ = load_policy("tiny-countdown")
    trained = cli.model.policy.state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in base.state_dict().items())
    assert (Path(cli.trainer.log_dir) / "summary.json").is_file()
    assert not (Path(cli.trainer.log_dir) / "trees").exists()  # --data.save_trees=0
    # The rollouts are flat groups of 4 samples, not trees.
    problems = list(dm.train_pool().values())[:16]
    dm.start_generator(cli.model.policy, cli.model.tokenizer)  # fit's end released it
    out = dm.rollouts(problems, cli.model.tokenizer, epoch=5, rank=0)
    rows, results = out.rows, out.results
    assert all(r.mode == "flat" and len(r.trajectories) == 4 for r in results)
    correct = [sum(t.verdict.correct for t in r.trajectories) for r in results]
    assert 0 < sum(correct) < 4 * len(results), "want both right and wrong samples to check the rule"
    for problem_rows, result, n_correct in zip(rows, results, correct):
        if rollout == "best_of_n":  # rejection sampling: the correct samples only, advantage +1
            assert len(problem_rows) == n_correct
            assert all(r.reward == 1.0 and set(r.advantages) == {1.0} for r in problem_rows)
        else:  # DAPO: every sample (none is degenerate here), reward minus the group mean
            finals = [t.final_score for t in result.trajectories]
            mean = sum(finals) / len(finals)
            assert [r.advantages[0] for r in problem_rows] == pytest.approx([f - mean for f in finals])


def test_an_epoch_with_nothing_to_train_on_skips_its_step_and_the_fit_goes_on(tmp_path, caplog):
    """Every tree unsolved (one step, no answer) and uniform groups dropped: no epoch has a
    training row. Each still ends its round, without an optimizer step (the weights stay the
    shipped policy's), instead of Lightning ending the fit at an empty loader."""
    caplog.set_level("WARNING", logger="data_modules.search")
    cli = run_fit(tmp_path, "--data.search.max_depth=1", "--data.search.max_expansions_per_tree=4",
                  "--data.credit.drop_uniform_groups=true", "--data.hard_set.enabled=false",
                  "--model.optimizer.weight_decay=0.1")  # a zero-gradient AdamW step would still decay the weights
    assert cli.trainer.current_epoch == 2
    assert "epoch 0: nothing to train on" in caplog.text and "epoch 1: nothing to train on" in caplog.text
    base, _ = load_policy("tiny-countdown")
    trained = cli.model.policy.state_dict()
    assert all(torch.equal(value, trained[name]) for name, value in base.state_dict().items())
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2]


@pytest.mark.slow
def test_drop_uniform_groups_leaves_out_trees_with_one_outcome(tmp_path):
    cli = run_fit(tmp_path, "--trainer.max_epochs=1", "--data.credit.drop_uniform_groups=true", "--data.hard_set.enabled=false")
    dm = cli.datamodule
    problems = list(dm.train_pool().values())[:24]
    dm.start_generator(cli.model.policy, cli.model.tokenizer)  # fit's end released it
    out = dm.rollouts(problems, cli.model.tokenizer, epoch=7, rank=0)
    rows, results = out.rows, out.results
    uniform = [len({t.final_score for t in r.trajectories}) == 1 for r in results]
    assert any(uniform) and not all(uniform), "want both kinds of tree to check the rule"
    for problem_rows, result, is_uniform in zip(rows, results, uniform):
        assert (problem_rows == []) == is_uniform, result.problem_id
    assert out.uniform_groups == sum(uniform)

    dm.credit = replace(dm.credit, drop_uniform_groups=False)
    out = dm.rollouts(problems, cli.model.tokenizer, epoch=7, rank=0)
    assert all(out.rows) and out.uniform_groups == 0


def test_a_bf16_mixed_fit_with_tree_packing_trains(tmp_path):
    """--trainer.precision=bf16-mixed on CPU (autocast to bf16, fp32 weights and optimizer) through
    the packed tree attention: the epoch trains and its loss is finite."""
    cli = main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--trainer.max_epochs=1",
                "--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4",
                "--data.problems.max_eval_problems=4", "--data.eval.samples=1", "--data.eval.at_start=false",
                "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=2", "--model.packing=true",
                "--trainer.precision=bf16-mixed", f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    assert str(cli.trainer.precision) == "bf16-mixed" and cli.trainer.global_step > 0
    losses = [s.value for s in scalars(cli.trainer.log_dir)["train/loss"]]
    assert losses and all(math.isfinite(v) for v in losses)
    assert next(cli.model.policy.parameters()).dtype == torch.float32  # the weights stay fp32
