"""DeepSpeed on a CPU machine (marker `deepspeed`; skipped without the deepspeed package): the
CLI checks and completes a DeepSpeed config, a ZeRO-2 fit writes a real checkpoint folder that
tools/export_hf.py turns into the trained Hugging Face model, the sidecar's weight gather
rebuilds ZeRO-3 partitioned parameters exactly, and (with vLLM too) a ZeRO-3 fit syncs its
gathered weights to a vLLM server. Lightning refuses DeepSpeed without CUDA; the fits run
through tests/scripts/deepspeed_cpu.py, which lifts that check for tests only."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from procs import run_group

pytestmark = pytest.mark.deepspeed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "deepspeed_cpu.py"
STRATEGY = "--trainer.strategy=deepspeed_cpu.CPUDeepSpeedStrategy"
SMALL = ["--trainer.max_epochs=2", "--data.batching.problems_per_epoch=8", "--data.batching.mini_batch_problems=4",
         "--data.problems.max_eval_problems=8", "--data.eval.samples=2", "--data.epochs_per_round=1"]


@pytest.fixture(autouse=True)
def _deepspeed():
    pytest.importorskip("deepspeed")


def _fit(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *args, *SMALL,
           f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.callbacks.init_args.dirpath={tmp_path / 'ckpt'}"]
    proc = run_group(cmd, timeout=timeout, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def test_the_cli_checks_the_deepspeed_config_and_sets_the_logging_batch_size(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    from flywheel.__main__ import main
    from flywheel.run.preflight import PreflightError

    base = ["--config", str(ROOT / "conf" / "quickstart.yaml"), STRATEGY, f"--trainer.default_root_dir={tmp_path}"]
    cli = main([*base, f"--trainer.strategy.config={ROOT / 'conf' / 'deepspeed' / 'zero3.json'}"], run=False)
    assert cli.trainer.strategy.config["zero_optimization"]["stage"] == 3
    cli = main([*base, "--trainer.strategy.stage=2"], run=False)  # Lightning's default config, completed
    assert cli.trainer.strategy.config["train_micro_batch_size_per_gpu"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimisation": {"stage": 2}}')
    # Checked before anything runs, and reported as the CLI's one-line error naming the key.
    with pytest.raises(PreflightError, match="unknown key 'zero_optimisation'; did you mean 'zero_optimization'"):
        main([*base, f"--trainer.strategy.config={bad}"], run=False)


def test_zero2_checkpoint_folder_exports_to_the_trained_hf_model(tmp_path):
    saved = tmp_path / "trained.pt"
    _fit(tmp_path, STRATEGY, "--trainer.strategy.stage=2", "--model.optimizer.lr=1e-3",
         env={"FLYWHEEL_TEST_SAVE_POLICY": str(saved)})
    folder = tmp_path / "ckpt" / "last.ckpt"
    assert folder.is_dir() and (folder / "checkpoint").is_dir()  # DeepSpeed's layout, not a file
    out = tmp_path / "exported"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "export_hf.py"), str(folder), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    from flywheel.policies.load import load_policy

    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    trained = torch.load(saved)
    base, _ = load_policy("tiny-countdown")
    assert set(trained) <= set(exported)
    for name, value in trained.items():
        assert torch.equal(exported[name], value), name
    assert any(not torch.equal(v, trained[k]) for k, v in base.state_dict().items()), "the fit trained nothing"


def test_zero3_gather_rebuilds_every_partitioned_parameter(tmp_path):
    out = tmp_path / "gather.pt"
    proc = run_group([sys.executable, str(SCRIPT), "gather", str(out)], timeout=600, cwd=tmp_path,
                     env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = torch.load(out)
    assert result["partitioned"], "ZeRO-3 left the parameters whole: nothing was gathered"
    assert set(result["gathered"]) == set(result["before"])  # the tied LM head included
    for name, value in result["before"].items():
        assert torch.equal(result["gathered"][name], value), name


@pytest.mark.vllm
def test_zero3_fit_syncs_gathered_weights_to_the_sidecar(tmp_path):
    from test_vllm_sidecar import VLLM_PYTHON, _need_vllm

    _need_vllm()
    _fit(tmp_path, "--config", str(ROOT / "conf" / "quickstart_vllm.yaml"), STRATEGY, "--trainer.strategy.stage=3",
         "--data.generator.init_args.access_log=true", "--model.optimizer.lr=1e-3",
         "--data.generator.init_args.weight_transfer=gloo", env={"FLYWHEEL_VLLM_PYTHON": VLLM_PYTHON}, timeout=900)
    text = next(tmp_path.glob("quickstart_vllm/version_*/vllm_server.log")).read_text(errors="replace")
    # Two syncs (after each epoch's 2 steps) streamed over gloo, one layer gathered from the
    # ZeRO-3 shards at a time, each followed by the probe the run would have died on.
    assert len(re.findall(r"POST /finish_weight_update HTTP", text)) == 2
    assert len(re.findall(r"POST /collective_rpc HTTP", text)) == 0


@pytest.mark.vllm
@pytest.mark.realmodel
@pytest.mark.slow
def test_the_gpu_smoke_script_rehearses_on_cpu(tmp_path):
    """tools/gpu_smoke.sh with FLYWHEEL_SMOKE_CPU=1: conf/deepsearch.yaml itself on the real
    SmolLM2-135M-Instruct (ZeRO-2 from conf/deepspeed/zero2.json, the vLLM sidecar, MathTask on
    problem files, hard set, two rounds), the DeepSpeed checkpoint exported and evaluated through
    a vLLM server, with only the CUDA parts swapped and the sizes cut, so the GPU run meets no
    config error of ours. In the real-model group: it needs the converted folder."""
    from flywheel.policies.registry import converted, get_command
    from test_vllm_sidecar import VLLM_PYTHON, _need_vllm

    _need_vllm()
    if converted("smollm2-135m-instruct") is None:
        pytest.skip(f"smollm2-135m-instruct is not converted; run {get_command('smollm2-135m-instruct')}")
    env = dict(os.environ, FLYWHEEL_SMOKE_CPU="1", FLYWHEEL_SMOKE_DIR=str(tmp_path / "smoke"),
               FLYWHEEL_VLLM_PYTHON=VLLM_PYTHON, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = run_group(["bash", str(ROOT / "tools" / "gpu_smoke.sh")], timeout=2400, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "gpu_smoke: policy " + str(converted("smollm2-135m-instruct")) in proc.stdout
    result = dict(item.split("=", 1) for item in proc.stdout.strip().splitlines()[-1].split()[1:])
    assert result["gpu_smoke"] == "ok" and result["cpu_rehearsal"] == "1" and result["rounds"] == "2"
    assert float(result["search_tokens_per_s"]) > 0 and float(result["eval_tokens_per_s"]) > 0
    assert 0 <= float(result["eval_pass1"]) <= 1 and float(result["peak_rss_gb"]) > 0.5  # the 135M model and its optimizer
