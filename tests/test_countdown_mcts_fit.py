"""End to end: the seed's Countdown MCTS overlay (conf/countdown_mcts.yaml) fits through the CLI:
one greedy trajectory per tree with the dense reward, the value head scores search nodes,
trains with the policy and is in the checkpoint."""

from pathlib import Path

import pytest
import torch

from flywheel.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_countdown_mcts_fit_trains_the_value_head_and_checkpoints_it(tmp_path):
    cli = main([
        "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(ROOT / "conf" / "countdown_mcts.yaml"),
        "--trainer.max_epochs=1", "--data.batching.problems_per_epoch=8", "--data.batching.mini_batch_problems=4",
        "--data.problems.max_eval_problems=8", "--data.eval.samples=1", "--data.eval.at_start=false",
        "--data.search.agents.count=2", "--data.search.agents.iterations=4", "--data.save_trees=0",
        f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.callbacks.init_args.dirpath={tmp_path / 'ckpt'}",
    ])
    module, dm = cli.model, cli.datamodule
    assert cli.trainer.global_step == 2  # 8 problems in mini-batches of 4
    # The value head started at V = 0 (zero output layer) and was trained.
    assert module.value_head.out.weight.abs().sum() > 0
    assert dm.epoch_metrics["search/valued_nodes"] > 0  # the head valued the search's new nodes
    results = dm.epoch_results
    assert len(results) == 8 and all(len(r.trajectories) <= 1 for r in results)
    assert all(r.stats.expansions <= 1 + 3 * 2 for r in results)
    rewards = [t.reward for r in results for t in r.trajectories]
    assert rewards and all(-1.0 <= x <= 1.0 for x in rewards)
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["state_dict"]
    assert torch.equal(state["value_head.out.weight"], module.value_head.out.weight.detach())
