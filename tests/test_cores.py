"""The CPU cores of launched vLLM servers and the trainer (flywheel.generation.vllm.cores, issue 46
item 6): hand-worked plans, the setting's errors, the server's environment and the watchdog
holding the server's process group on its cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flywheel.generation.vllm.cores import CORES_ENV, CorePlan, parse_cores, plan
from flywheel.generation.vllm.server import WATCHDOG


def test_core_ids_parse_as_lists_and_ranges():
    assert parse_cores("1") == (1,)
    assert parse_cores("2-3") == (2, 3)
    assert parse_cores("0,4-5,4") == (0, 4, 5)  # each once
    for bad in ("", "a", "3-1", "-1", "1,,2"):
        with pytest.raises(ValueError, match="cpu_cores=.*give 'auto', 'shared', or core ids"):
            parse_cores(bad)


def test_auto_splits_the_cores_only_when_the_search_runs_beside_the_training():
    # 2 cores, one server, searching ahead: one core each (2 threads would otherwise ask for 4 cores).
    split = plan("auto", [0, 1], replicas=1, beside_training=True)
    assert (split.trainer, split.servers) == ((0,), ((1,),))
    # Taking turns (no search ahead): both keep every core.
    assert plan("auto", [0, 1], 1, beside_training=False) == CorePlan(None, None, plan("auto", [0, 1], 1, False).why)
    # One core, or no more cores than servers: nothing to split, and the log says so.
    assert plan("auto", [3], 1, True).servers is None and "cannot be split" in plan("auto", [3], 1, True).why
    assert plan("auto", [0, 1], 2, True).servers is None
    # 16 cores, 2 replicas: half to the servers (4 each), half to the trainer.
    wide = plan("auto", range(16), 2, True)
    assert wide.trainer == tuple(range(8)) and wide.servers == (tuple(range(8, 12)), tuple(range(12, 16)))
    # 5 cores, 2 replicas: 2 to the servers (one each), 3 to the trainer.
    odd = plan("auto", range(5), 2, True)
    assert odd.trainer == (0, 1, 2) and odd.servers == ((3,), (4,))
    assert plan("shared", [0, 1], 1, True).servers is None


def test_explicit_cores_go_to_the_servers_and_the_trainer_keeps_the_rest():
    given = plan("1-3", [0, 1, 2, 3], replicas=2, beside_training=False)
    assert given.trainer == (0,) and given.servers == ((1, 2), (3,))
    assert plan("0-1", [0, 1], 1, False).trainer is None  # none left: the trainer keeps its own
    with pytest.raises(ValueError, match="names core\\(s\\) 7, which this process cannot use"):
        plan("1,7", [0, 1], 1, False)
    with pytest.raises(ValueError, match="gives 1 core\\(s\\) to 2 servers"):
        plan("1", [0, 1], 2, False)


def test_a_launched_server_gets_its_cores_in_its_environment(tmp_path):
    from flywheel.generation.vllm.sidecar import VLLMSidecar

    sidecar = VLLMSidecar(log_dir=str(tmp_path), replicas=2, cpu_cores="1-2", token="x" * 32)
    sidecar.core_plan = plan("1-2", [0, 1, 2], 2, False)
    envs = [sidecar._server(None, i).env for i in range(2)]
    assert [(e[CORES_ENV], e["VLLM_CPU_OMP_THREADS_BIND"]) for e in envs] == [("1", "1"), ("2", "2")]
    sidecar.core_plan = plan("shared", [0, 1, 2], 2, True)
    assert CORES_ENV not in sidecar._server(None, 0).env
    with pytest.raises(ValueError, match="cpu_cores='x'"):
        VLLMSidecar(cpu_cores="x")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_the_watchdog_holds_the_server_on_its_cores():
    core = min(os.sched_getaffinity(0))
    child = "import os; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([sys.executable, "-c", WATCHDOG, str(os.getpid()), sys.executable, "-c", child],
                         env={**os.environ, CORES_ENV: str(core)}, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"[{core}]", out.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_pinning_the_trainer_is_undone_when_the_sidecar_closes(monkeypatch):
    import torch

    from flywheel.generation.vllm import sidecar as module

    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    side = module.VLLMSidecar(cpu_cores="auto", token="x" * 32)
    side.beside_training = True
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    monkeypatch.setattr(module, "available_cores", lambda: tuple(sorted(cores)[:2]))  # as if 2 cores
    side._place()
    assert os.sched_getaffinity(0) == {min(cores)} and torch.get_num_threads() == 1
    side.close()
    assert os.sched_getaffinity(0) == cores and torch.get_num_threads() == threads
