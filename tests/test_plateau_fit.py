"""End to end: conf/deepsearch_plateau.yaml (DeepSearch's allocation, issue 32) fits through the
CLI with tiny settings: every round re-screens a fresh sample of the training pool, the
token split (tree / flat / screening) reaches TensorBoard and every round of summary.json, and
the training problems the run solved reach summary.json and solved_problems.json."""

import json
from pathlib import Path

import pytest
import torch

from data_modules.curriculum import Curriculum
from flywheel.__main__ import main
from tests.test_fit import scalars

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "--trainer.max_epochs=2",
    "--data.epochs_per_round=1",
    "--data.batching.problems_per_epoch=16",  # at least the hard set (12 screened + pending): every hard problem is drawn
    "--data.batching.mini_batch_problems=8",
    "--data.problems.max_train_problems=48",
    "--data.hard_set.screen_problems=12",
    "--data.problems.max_eval_problems=16",
    "--data.eval.samples=2",
    "--data.search.expansion_width=4",
    "--data.search.trajectories_per_tree=4",
    "--data.save_trees=0",
]


@pytest.mark.slow
def test_the_plateau_recipe_rescreens_every_round_and_reports_its_token_split(tmp_path, one_thread):
    # on the step tree with outcome credit, the recipe the plateau runs were built on (tools/compare.py's base):
    # the round-1 counts below (a cached solution) are those of that training
    cli = main(["fit", "--config", str(ROOT / "conf" / "step_tree.yaml"),
                "--config", str(ROOT / "conf" / "deepsearch_plateau.yaml"), *TINY,
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    dm, log_dir = cli.datamodule, Path(cli.trainer.log_dir)
    curriculum = dm.curriculum

    # Re-screening: D_hard(0) was screened from a sample of 12 of the 48 problems; each round's
    # end screened another sample (and the replay buffer's pending candidates), so the hard set
    # now holds problems D_hard(0) never had, which Eq. 9's refresh cannot add.
    summary = json.loads((log_dir / "summary.json").read_text())
    rounds = summary["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    history = curriculum.hard.history
    assert len(history) == 3 and history[0] <= 12
    assert all(r["screening_tokens"] > 0 for r in rounds)  # every round screened
    # D_hard(0) lies in round 0's sample, which a fresh curriculum of the same settings draws again.
    round0 = set(Curriculum(curriculum.hard_set_config, curriculum.replay_config, 1, dm.seed).to_screen(list(dm.train_pool())))
    assert len(round0) == 12 and set(curriculum.hard.ids) - round0, (round0, curriculum.hard.ids)

    # The token split of each round: its tree and flat tokens add up to the round's training
    # tokens (generated_tokens is the run's running total).
    previous = 0
    for r in rounds:
        assert r["tree_tokens"] + r["flat_tokens"] == r["generated_tokens"] - previous
        assert r["tree_tokens"] > 0 and r["tree_token_fraction"] == pytest.approx(
            r["tree_tokens"] / (r["tree_tokens"] + r["flat_tokens"]))
        assert 0 <= r["cached"] <= r["hard_set_size"]
        previous = r["generated_tokens"]
    # Round 1 cached a solution (paper rule: its problem is still below 25%, so it is in the
    # next hard set), and round 2 drew it (16 draws cover the hard set): it got a mixed rollout,
    # whose direct samples are flat tokens, instead of a tree.
    assert rounds[0]["cached"] > 0 and rounds[0]["hard_set_size"] <= 16 and rounds[1]["flat_tokens"] > 0
    assert curriculum.tokens.total.screening == sum(r["screening_tokens"] for r in rounds) == dm.screening_tokens

    # And per epoch in TensorBoard.
    tags = scalars(str(log_dir))
    for tag in ("search/tree_tokens", "search/flat_tokens", "search/tree_token_fraction", "compute/screening_tokens"):
        assert len(tags[tag]) == 2, f"{tag}: {tags.get(tag)}"
    epoch_tokens = [p.value for p in tags["compute/epoch_generated_tokens"]]
    split = [t.value + f.value for t, f in zip(tags["search/tree_tokens"], tags["search/flat_tokens"])]
    assert split == epoch_tokens

    # The run report has the round's tree share.
    report = (log_dir / "report.md").read_text()
    assert "| tree tokens |" in report and f"| {rounds[1]['tree_token_fraction']:.0%} |" in report

    # The training problems solved, per round and in solved_problems.json (data_modules.solved):
    # each problem's first solve is in the file once, with its summary row's round
    # and the run's training tokens at the end of the epoch that solved it.
    solved = json.loads((log_dir / "solved_problems.json").read_text())
    assert solved["format"] == "flywheel.solved/v1" and solved == curriculum.solved.to_json()
    firsts = solved["problems"]
    assert firsts and set(firsts) <= set(dm.train_pool())
    assert sum(r["first_solved"] for r in rounds) == len(firsts)
    for r in rounds:  # one epoch per round, of 16 problems
        new = [s for s in firsts.values() if s["round"] == r["round"]]
        assert r["first_solved"] == len(new) <= r["solved_problems"] <= 16
        assert all(s["tokens"] == r["generated_tokens"] for s in new)
    assert rounds[0]["first_solved"] == rounds[0]["solved_problems"] > 0  # round 1: every solve is a first

    # The checkpoint carries the split and the solved problems, so a resumed run continues its round's count.
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["SearchDataModule"]
    assert state["tokens"] == curriculum.tokens.state_dict()
    assert state["solved"] == curriculum.solved.state_dict()
    print("summary rounds:", json.dumps([{k: r[k] for k in ("round", "hard_set_size", "cached", "generated_tokens",
                                                           "tree_tokens", "flat_tokens", "tree_token_fraction",
                                                           "screening_tokens", "solved_problems", "first_solved")}
                                             for r in rounds]))
    print("hard set history:", history)
