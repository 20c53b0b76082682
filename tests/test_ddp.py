"""Two CPU processes (DDP, gloo) run a short fit: problems are sharded, ranks stay in step."""

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
    cmd = [
        sys.executable, "-m", "flywheel", "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"),
        "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=1", "--data.epochs_per_round=1",
        "--data.problems_per_epoch=6", "--data.mini_batch_problems=2", "--data.max_eval_problems=9",
        "--data.eval.samples=2", "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=2",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = run_group(cmd, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summaries = list(tmp_path.glob("quickstart/version_*/summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    # 9 held-out problems split 5/4 over the ranks: the synced metric covers all of them.
    assert summary["eval_problems"] == 9
    assert len(summary["rounds"]) == 1
