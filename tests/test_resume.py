"""`--ckpt_path last` continues a run: round counter, hard set, replay buffer, token count and
the per-round summary come back, and the result equals an uninterrupted run."""

import json
from pathlib import Path

import pytest

from flywheel.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--data.problems_per_epoch=8", "--data.max_eval_problems=16", "--data.epochs_per_round=1",
    "--data.hard_set.enabled=true", "--data.max_train_problems=48", "--data.eval.samples=2",
]


def fit(run_dir: Path, epochs: int, *extra: str):
    return main(
        ["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *SMALL, f"--trainer.max_epochs={epochs}",
         f"--trainer.logger.init_args.save_dir={run_dir}",
         f"--trainer.callbacks.init_args.dirpath={run_dir / 'checkpoints'}", *extra]
    )


@pytest.mark.slow
def test_resume_continues_and_matches_an_uninterrupted_run(tmp_path):
    whole = fit(tmp_path / "whole", 3)
    fit(tmp_path / "parts", 2)
    resumed = fit(tmp_path / "parts", 3, "--ckpt_path", "last")

    a, b = whole.datamodule, resumed.datamodule
    assert b.round == 3 and resumed.trainer.global_step == whole.trainer.global_step
    assert b.hard.ids == a.hard.ids and b.hard.history == a.hard.history
    assert b.buffer.to_dict() == a.buffer.to_dict()
    assert b.generated_tokens == a.generated_tokens

    summary = json.loads((Path(resumed.trainer.log_dir) / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2, 3]
    whole_summary = json.loads((Path(whole.trainer.log_dir) / "summary.json").read_text())
    assert summary["rounds"] == whole_summary["rounds"]
