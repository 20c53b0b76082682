"""ReST-MCTS* self-training: the per-problem path weights and the weighted log-likelihood with
its KL to a frozen reference, by hand; the data module's weighting of a tree's rows."""

from __future__ import annotations

import math

import pytest
import torch

from flywheel.objectives import ObjectiveConfig, path_weights, self_training_loss
from flywheel.objectives.credit import TrainingRow
from flywheel.objectives.self_training import PathWeighting, weight_paths


def test_path_weights_softmax_per_problem_by_hand():
    """Problem 0: scores 1, 1, -1 at temperature 1: exp = e, e, 1/e; sum 2e + 1/e = 5.804443;
    n_kept = 3, so w = 3e / 5.804443 = 1.404932 (twice) and 3 / e / 5.804443 = 0.190136;
    they average 1. Problem 1: equal scores 0.5, 0.5 -> 1, 1 (plain fine-tuning)."""
    w = path_weights(torch.tensor([1.0, 1.0, -1.0, 0.5, 0.5], dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1]))
    assert w.tolist() == pytest.approx([1.404932, 1.404932, 0.190136, 1.0, 1.0], abs=1e-6)
    assert w[:3].mean().item() == pytest.approx(1.0)


def test_path_weights_hard_filter_and_temperature_by_hand():
    """Problem 0: values 0.9, 0.3, 0.1, threshold 0.2 keeps the first two; temperature 0.5:
    logits 1.8, 0.6, exp ratio e^1.2 = 3.320117; softmax 3.320117 / 4.320117 = 0.768525 and
    1 / 4.320117 = 0.231475; times n_kept = 2: 1.537050, 0.462950; the filtered path 0.
    Problem 1: nothing kept -> 0 (a tree without a usable path trains nothing)."""
    scores = torch.tensor([0.9, 0.3, 0.1, 0.1], dtype=torch.float64)
    w = path_weights(scores, torch.tensor([0, 0, 0, 1]), temperature=0.5, keep=scores >= 0.2)
    assert w.tolist() == pytest.approx([1.537050, 0.462950, 0.0, 0.0], abs=1e-6)
    # The outcome with the correct-only filter is ReST-MCTS*'s official data: SFT on correct leaves.
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0])
    assert path_weights(rewards, None, 1.0, rewards > 0).tolist() == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="temperature"):
        path_weights(scores, temperature=0.0)


def test_self_training_loss_and_gradient_by_hand():
    """Row 0: p = 0.5, 0.25 with path weight 2; row 1: p = 0.8 with weight 0.5 (one pad).
    Token mean over 3 tokens: nll = -2 ln 0.5 = 1.386294, -2 ln 0.25 = 2.772589,
    -0.5 ln 0.8 = 0.111572; sum 4.270455 / 3 = 1.423485. dL/dlogp = -w / 3.
    Reference p_ref = 0.25, 0.25, 0.4: d = ln(p_ref / p) = -ln 2, 0, -ln 2;
    k3 = e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147, 0, 0.193147; mean 0.128765;
    loss = 1.423485 + 0.1 * 0.128765 = 1.436361. d k3 / dlogp = 1 - e^d = 0.5, 0, 0.5, times
    0.1 / 3 = 0.016667: gradients -0.666667 + 0.016667 = -0.65, -0.666667, -0.15."""
    mask = torch.tensor([[True, True], [True, False]])
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.8, 1.0]])).requires_grad_()
    weights = torch.tensor([[2.0, 2.0], [0.5, 0.0]])
    loss, stats = self_training_loss(logp, weights, mask)
    assert loss.item() == pytest.approx(1.423485, abs=1e-6)
    assert stats["weight_mean"].item() == pytest.approx(1.5)  # (2 + 2 + 0.5) / 3
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-2 / 3, -2 / 3, -0.5 / 3, 0.0], abs=1e-6)

    logp.grad = None
    ref = torch.log(torch.tensor([[0.25, 0.25], [0.4, 0.3]]))
    loss, stats = self_training_loss(logp, weights, mask, ref, kl_coef=0.1, kl_estimator="k3")
    assert stats["kl_ref"].item() == pytest.approx(0.128765, abs=1e-6)
    assert loss.item() == pytest.approx(1.436361, abs=1e-6)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.65, -2 / 3, -0.15, 0.0], abs=1e-6)


def test_self_training_loss_rejects_a_kl_without_reference_and_the_config_names_it():
    lp = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="ref_logprobs"):
        self_training_loss(lp, lp, torch.ones(1, 1), None, kl_coef=0.1)
    assert ObjectiveConfig(loss_type="self_training", kl_reference="round").kl_reference == "round"
    with pytest.raises(ValueError, match="kl_reference"):
        ObjectiveConfig(kl_reference="initial")


def _row(problem: str, reward: float, correct: bool, n: int = 2) -> TrainingRow:
    return TrainingRow(problem, 0, (1, 2), tuple(range(3, 3 + n)), (0.0,) * n, (math.nan,) * n, (0,) * n, reward, correct)


def test_weight_paths_from_the_value_model_or_the_outcome():
    """Problem a: three paths, two correct; problem b: one wrong path.
    Value source, correct only, temperature 1: V = 0.9, 0.4 (the wrong path's 0.7 is left
    out) -> 2 * softmax(0.9, 0.4) = 2 * e^0.5 / (e^0.5 + 1) = 1.244918 and 0.755082.
    Outcome source, no filter: problem a's rewards 1, 1, -1 -> 1.404932, 1.404932, 0.190136
    (the first test's numbers); problem b's single path gets 1."""
    rows = [[_row("a", 1.0, True), _row("a", 1.0, True), _row("a", -1.0, False)], [_row("b", -1.0, False)]]
    asked = []

    def value_fn(prefixes):
        asked.append(prefixes)
        return [0.9, 0.4, 0.7, 0.2]

    out = weight_paths(rows, PathWeighting(source="value", correct_only=True), value_fn)
    assert len(asked) == 1 and asked[0][0] == (1, 2, 3, 4)  # prompt + response, one call for all
    assert [len(r) for r in out] == [2, 0]  # weight-0 rows are left out
    assert [r.advantages for r in out[0]] == [pytest.approx((1.244918,) * 2, abs=1e-6), pytest.approx((0.755082,) * 2, abs=1e-6)]

    out = weight_paths(rows, PathWeighting(source="outcome", correct_only=False))
    assert [r.advantages[0] for r in out[0]] == pytest.approx([1.404932, 1.404932, 0.190136], abs=1e-6)
    assert out[1][0].advantages == (1.0, 1.0)
    # No value model yet (the first round): "value" scores by the outcome.
    assert weight_paths(rows, PathWeighting(source="value", correct_only=False))[0][2].advantages[0] == pytest.approx(0.190136, abs=1e-6)
    # The hard filter on the value model's score: 0.4 < 0.5 leaves only the first path.
    out = weight_paths(rows, PathWeighting(source="value", threshold=0.5), value_fn)
    assert [r.advantages[0] for r in out[0]] == [1.0] and out[1] == []
    with pytest.raises(ValueError, match="--data.credit.path_weights.source"):
        PathWeighting(source="reward")


@pytest.mark.slow
def test_rest_mcts_recipe_runs_the_whole_loop_and_reports_every_round(tmp_path):
    """`fit --config conf/quickstart.yaml --config conf/rest_mcts.yaml` with a tiny budget: two
    rounds of value-guided search, value-model refit and self-training; every round's held-out
    pass@k and value-model AUC in summary.json and TensorBoard."""
    import json
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flywheel.__main__ import main
    from flywheel.policies.load import load_policy

    root = Path(__file__).resolve().parents[1]
    cli = main(["fit", "--config", str(root / "conf" / "quickstart.yaml"), "--config", str(root / "conf" / "rest_mcts.yaml"),
                "--trainer.max_epochs=2", "--data.epochs_per_round=1", "--data.batching.problems_per_epoch=16",
                "--data.problems.max_eval_problems=8", "--data.eval.samples=2", "--data.search.expansion_width=4",
                "--prm_update.heldout_every=2", f"--trainer.logger.init_args.save_dir={tmp_path}",
                "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]"])
    log_dir = cli.trainer.log_dir
    summary = json.loads((Path(log_dir) / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    for r in summary["rounds"]:
        assert 0.0 <= r["eval_pass1"] <= r["eval_passk"] <= 1.0
        assert 0.0 <= r["prm_auc"] <= 1.0 and r["prm_samples"] > 0, r
    ea = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    assert [p.step for p in ea.Scalars("round/prm_auc")] == [1, 2]
    assert [p.step for p in ea.Scalars("round/eval_pass@1")] == [0, 1, 2]
    assert [p.value for p in ea.Scalars("round/prm_auc")] == pytest.approx([r["prm_auc"] for r in summary["rounds"]])
    # The self-training objective trained: path weights (never negative, weight-0 rows left
    # out), the weighted NLL and the KL to the round's start.
    assert min(p.value for p in ea.Scalars("train/advantage_min")) > 0
    assert "train/weighted_nll" in ea.Tags()["scalars"] and "train/kl_ref" in ea.Tags()["scalars"]
    assert all(v == 0 for v in [p.value for p in ea.Scalars("search/valued_nodes")][:1])  # round 1: no value model yet
    assert all(p.value > 0 for p in ea.Scalars("search/valued_nodes")[1:])
    # kl_reference=round: the reference is the policy at round 2's start, no longer the base.
    base, _ = load_policy("tiny-countdown")
    ref = cli.model.reference.state_dict()
    assert any(not torch.equal(v, ref[k]) for k, v in base.state_dict().items())

    # The next round's rows: correct paths only, weighted by the value model's V(prompt + path),
    # each problem's weights averaging 1.
    dm, model = cli.datamodule, cli.model
    problems = [p for p in dm.train_pool().values() if p.id not in dm.curriculum.buffer][:16]
    dm.start_generator(model.policy, model.tokenizer)  # fit's end released it
    per_problem = dm.rollouts(problems, model.tokenizer, epoch=7, rank=0).rows
    trained = [rows for rows in per_problem if rows]
    assert trained and all(row.correct for rows in trained for row in rows)
    for rows in trained:
        assert sum(row.advantages[0] for row in rows) / len(rows) == pytest.approx(1.0)
    assert any(len({round(row.advantages[0], 9) for row in rows}) > 1 for rows in trained), "V(s) weighted nothing"


def test_report_shows_the_value_model_auc_per_round_only_when_there_is_one():
    from flywheel.reporting.report import report_markdown

    rounds = [{"round": 1, "epoch": 4, "eval_pass1": 0.1, "eval_passk": 0.3, "prm_auc": 0.6789},
              {"round": 2, "epoch": 9, "eval_pass1": 0.2, "eval_passk": 0.4, "prm_auc": None}]
    text = report_markdown({"k": 8, "base_eval_pass1": 0.05, "base_eval_passk": 0.2, "rounds": rounds})
    assert "value-model AUC |" in text and "| 0.679 |" in text and text.count(" - |") >= 2  # base and the null round
    plain = report_markdown({"k": 8, "rounds": [{k: v for k, v in r.items() if k != "prm_auc"} for r in rounds]})
    assert "AUC" not in plain
