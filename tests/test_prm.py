"""The self-rewarding value model in the loop: trained at each round's end from the round's
trees, used to score the next round's search (where it changes which nodes grow),
checkpointed and resumed exactly; its AUC / calibration helpers by hand."""

import json
import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.prm import PRMUpdate
from flywheel.__main__ import main
from flywheel.prm.model import auc, calibration_error

ROOT = Path(__file__).resolve().parents[1]


def test_auc_and_calibration_by_hand():
    assert auc([0.9, 0.8, 0.3, 0.1], [True, True, False, False]) == 1.0
    assert auc([0.1, 0.9], [True, False]) == 0.0
    assert auc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert math.isnan(auc([0.2, 0.4], [True, True]))
    # Two bins: (0.2 -> 0 of 1 correct) and (0.8 -> 1 of 1): |0.2 - 0| / 2 + |0.8 - 1| / 2 = 0.2.
    assert calibration_error([0.2, 0.8], [False, True]) == pytest.approx(0.2)


def fit(run_dir: Path, epochs: int, *extra: str):
    return main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(ROOT / "conf" / "rest_mcts.yaml"),
                 f"--trainer.max_epochs={epochs}", "--data.epochs_per_round=1", "--data.batching.problems_per_epoch=16",
                 "--data.problems.max_eval_problems=8", "--data.eval.samples=2", "--data.search.expansion_width=4",
                 f"--trainer.logger.init_args.save_dir={run_dir}",
                 f"--trainer.callbacks.init_args.dirpath={run_dir / 'checkpoints'}", *extra])


def prm(cli) -> PRMUpdate:
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, PRMUpdate))


@pytest.mark.slow
def test_value_model_trains_each_round_steers_the_next_search_and_resumes(tmp_path):
    whole = fit(tmp_path / "whole", 3)
    ea = EventAccumulator(whole.trainer.log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    for tag in ("round/prm_loss", "round/prm_auc", "round/prm_calibration_error", "round/prm_samples"):
        assert tag in tags, tag
    valued = [p.value for p in ea.Scalars("search/valued_nodes")]
    assert valued[0] == 0 and all(v > 0 for v in valued[1:])  # round 1 searches alone, then scored
    means = [p.value for p in ea.Scalars("search/prm_value_mean")]
    assert len(means) == len(valued) - 1 and all(0 <= m <= 1 for m in means)
    samples = [p.value for p in ea.Scalars("round/prm_samples")]
    assert samples == sorted(samples) and samples[0] > 0  # accumulated over rounds
    # The value model's fits have their own part of the run's wall split (callbacks.wall_time).
    split = json.loads((Path(whole.trainer.log_dir) / "summary.json").read_text())["wall_split"]["total"]
    assert 0 < split["value_model_s"] < split["wall_s"]

    # The trained value model changes the search: the same problems, seeds and policy, searched
    # with and without V(s) in the selection scores, grow different trees.
    dm = whole.datamodule
    problems = [p for p in dm.train_pool().values() if p.id not in dm.curriculum.buffer][:8]  # searched, not mixed
    assert dm.value_fn is not None and dm.search.prm_weight > 0
    tokenizer = whole.model.tokenizer
    dm.start_generator(whole.model.policy, tokenizer)  # fit's end released it
    guided = dm.rollouts(problems, tokenizer, epoch=11, rank=0).results
    value_fn = dm.value_fn
    dm.use_value_model(None)
    plain = dm.rollouts(problems, tokenizer, epoch=11, rank=0).results
    dm.use_value_model(value_fn)
    assert all(r.searched for r in guided + plain) and len(guided) == len(plain) == 8

    def grown(result):  # the expanded nodes' prefixes, in the order they were created
        return [tuple(result.tree.tokens[n]) for n in range(len(result.tree.tokens))]

    assert any(grown(a) != grown(b) for a, b in zip(guided, plain)), "V(s) changed no tree"
    assert any(v == v for r in guided for v in r.tree.prm_value) and all(v != v for r in plain for v in r.tree.prm_value)

    fit(tmp_path / "parts", 2)
    resumed = fit(tmp_path / "parts", 3, "--ckpt_path", "last")
    a, b = prm(whole), prm(resumed)
    assert b.samples == a.samples and b.heldout == a.heldout
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name
