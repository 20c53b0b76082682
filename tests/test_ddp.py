"""Two CPU processes (DDP, gloo) run a short fit: problems are sharded (each rank searches its
own, together the epoch's), the ranks make the same optimizer steps, and the held-out metric
covers every problem."""

import json
import os
import sys
from pathlib import Path

import pytest
from procs import run_group

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.ddp
def test_ddp_two_process_fit(tmp_path):
    record = tmp_path / "record"
    cmd = [
        sys.executable, str(ROOT / "tests" / "scripts" / "record_fit.py"), "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"),
        "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=2", "--data.epochs_per_round=1",
        "--data.batching.problems_per_epoch=6", "--data.batching.mini_batch_problems=2", "--data.problems.max_eval_problems=9",
        "--data.eval.samples=2", "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=2",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", FLYWHEEL_TEST_RECORD=str(record))
    proc = run_group(cmd, timeout=900, cwd=tmp_path, env=env)  # a hang guard
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summaries = list(tmp_path.glob("quickstart/version_*/summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    # 9 held-out problems split 5/4 over the ranks: the synced metric covers all of them.
    assert summary["eval_problems"] == 9
    assert len(summary["rounds"]) == 2

    ranks = [json.loads((record / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    for epoch in (0, 1):
        drawn = [next(e for e in r["epochs"] if e["epoch"] == epoch) for r in ranks]
        assert drawn[0]["all"] == drawn[1]["all"] and len(drawn[0]["all"]) == 6  # the same 6 on both ranks
        mine0, mine1 = drawn[0]["mine"], drawn[1]["mine"]
        # 6 problems over 2 ranks: 3 each, none searched twice, none left out.
        assert len(mine0) == len(mine1) == 3 and not set(mine0) & set(mine1)
        assert sorted(mine0 + mine1) == sorted(drawn[0]["all"])
    # Same optimizer steps on both ranks (else DDP's all-reduce would hang): per epoch
    # ceil(ceil(6 / 2) / 2) = 2 mini-batch slots, over 2 epochs 4 steps.
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 4
    # The problems each rank's rollouts solved are merged over the ranks: one ledger on both,
    # each round's row counting the union (one epoch per round), the file every first solve.
    assert ranks[0]["solved"] == ranks[1]["solved"]
    solved = json.loads((summaries[0].parent / "solved_problems.json").read_text())["problems"]
    assert solved == ranks[0]["solved"]["problems"]
    for epoch, row in zip((0, 1), summary["rounds"]):
        mine = [set(next(e for e in r["epochs"] if e["epoch"] == epoch)["solved"]) for r in ranks]
        assert row["solved_problems"] == len(mine[0] | mine[1])
    assert sum(row["first_solved"] for row in summary["rounds"]) == len(solved)
