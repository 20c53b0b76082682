"""`--budget.max_tokens` (callbacks/budget.py), on which every equal-budget comparison rests: a
run stops at the end of the first epoch whose training rollouts reach the budget (so within
one epoch of it), and the count is the training rollouts' alone: hard-set screening and
held-out evaluation generate tokens that it does not include."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.budget import GenerationBudget
from flywheel.reporting.evaluation import EvalConfig
from flywheel.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


def epochs_until_stop(budget: GenerationBudget, per_epoch: list[int], screening: int = 0) -> int:
    """Epochs a run makes when its epochs generate `per_epoch` training tokens."""
    dm = SimpleNamespace(generated_tokens=0, screening_tokens=screening)
    budget.connect(dm)  # the data module's port, as the CLI connects it
    trainer = SimpleNamespace(should_stop=False)
    for epoch, tokens in enumerate(per_epoch, start=1):
        dm.generated_tokens += tokens
        budget.on_train_epoch_end(trainer, None)
        if trainer.should_stop:
            return epoch
    return len(per_epoch)


def test_the_run_stops_after_the_first_epoch_that_reaches_the_budget():
    # 400 tokens per epoch, budget 1000: 400, 800 (under), 1200 (reached) -> 3 epochs, 200 over.
    assert epochs_until_stop(GenerationBudget(1000), [400] * 10) == 3
    assert epochs_until_stop(GenerationBudget(800), [400] * 10) == 2  # exactly reached: stop
    assert epochs_until_stop(GenerationBudget(801), [400] * 10) == 3
    assert epochs_until_stop(GenerationBudget(None), [400] * 10) == 10  # no budget
    # Screening tokens are not training tokens: a huge screening count does not stop the run.
    assert epochs_until_stop(GenerationBudget(1000), [400] * 10, screening=10**9) == 3


def test_a_budget_below_one_token_is_refused_with_the_flag_named():
    with pytest.raises(ValueError, match="--budget.max_tokens must be >= 1"):
        GenerationBudget(0)


@pytest.mark.slow
def test_a_fit_stops_on_its_budget_counting_training_rollouts_only(tmp_path):
    cli = main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--trainer.max_epochs=5",
                "--data.batching.problems_per_epoch=8", "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=8",
                "--data.eval.samples=2", "--data.search.expansion_width=4", "--data.search.trajectories_per_tree=4",
                "--data.epochs_per_round=1", "--data.hard_set.enabled=true", "--data.problems.max_train_problems=16",
                "--budget.max_tokens=1", f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    dm, trainer = cli.datamodule, cli.trainer
    # Any epoch reaches a budget of 1 token: one epoch of the 5, with its optimizer steps made.
    assert trainer.current_epoch == 1 and trainer.global_step > 0
    ea = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    epoch_tokens = [p.value for p in ea.Scalars("compute/epoch_generated_tokens")]
    assert len(epoch_tokens) == 1 and epoch_tokens[0] > 0
    # The count is the epoch's rollouts alone, although the base policy screened the hard set
    # (and re-measured it at the round's end) and the held-out set was evaluated twice.
    assert dm.generated_tokens == epoch_tokens[0]
    assert dm.screening_tokens > 0
    assert [p.step for p in ea.Scalars("round/eval_pass@1")] == [0, 1]


@pytest.mark.slow
def test_a_budget_that_ends_the_run_inside_a_round_still_evaluates_it_and_a_resume_completes_the_round(tmp_path):
    # Rounds of 3 epochs; a budget of 1 token ends the run after epoch 1, inside round 1.
    args = ["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--trainer.max_epochs=3",
            "--data.rollout=flat", "--data.batching.flat_samples=2", "--data.batching.problems_per_epoch=4",
            "--data.batching.mini_batch_problems=4",
            "--data.problems.max_eval_problems=4", "--data.eval.samples=2", "--data.epochs_per_round=3",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"]
    cli = main([*args, "--budget.max_tokens=1"])
    assert cli.trainer.current_epoch == 1
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    (row,) = summary["rounds"]
    assert row["round"] == 1 and row["epoch"] == 0 and row["partial"] is True
    assert row["generated_tokens"] == cli.datamodule.generated_tokens > 0
    # The partial row's solved problems are in solved_problems.json, written with it (all first solves: round 1).
    solved = json.loads((Path(cli.trainer.log_dir) / "solved_problems.json").read_text())["problems"]
    assert row["first_solved"] == row["solved_problems"] == len(solved)
    # Resumed without the budget, the run finishes round 1, whose evaluation replaces the partial one.
    resumed = main([*args, "--ckpt_path", "last"])
    assert resumed.trainer.current_epoch == 3
    summary = json.loads((Path(resumed.trainer.log_dir) / "summary.json").read_text())
    (row,) = summary["rounds"]
    assert row["round"] == 1 and row["epoch"] == 2 and "partial" not in row
    # The round's count went on from the checkpoint: the partial round's first solves are kept as they were.
    whole = json.loads((Path(resumed.trainer.log_dir) / "solved_problems.json").read_text())["problems"]
    assert row["first_solved"] == row["solved_problems"] == len(whole) >= len(solved)
    assert {i: whole[i] for i in solved} == solved
    assert summary["base_eval_pass1"] is not None


@pytest.mark.slow
def test_eval_every_tokens_skips_rounds_but_never_the_runs_last(tmp_path):
    # Rounds of 1 epoch, 3 epochs; a spacing no run reaches: rounds 1 and 2 keep their rows
    # without pass@k, the last round is evaluated, and TensorBoard has the base and round 3.
    cli = main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--trainer.max_epochs=3",
                "--data.rollout=flat", "--data.batching.flat_samples=2", "--data.batching.problems_per_epoch=4",
                "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=4", "--data.eval.samples=2",
                "--data.epochs_per_round=1", "--data.eval.every_tokens=1000000000",
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    summary = json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2, 3]
    assert [r["eval_pass1"] is None for r in summary["rounds"]] == [True, True, False]
    assert summary["rounds"][0]["generated_tokens"] > 0 and summary["base_eval_pass1"] is not None
    ea = EventAccumulator(cli.trainer.log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    assert [p.step for p in ea.Scalars("round/eval_pass@1")] == [0, 3]
    with pytest.raises(ValueError, match="--data.eval.every_tokens=-1 must be >= 0"):
        EvalConfig(every_tokens=-1)
