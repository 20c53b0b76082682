"""The weight-transfer path's trainer side without a server (the server tests are
tests/test_vllm_transfer.py, marker `vllm`): the setting, the launch flag, the weight stream
(what it announces is what it sends, one decoder layer gathered at a time, in the servers'
dtype), the gloo group's wire, and the GPU engines' refusal without vLLM in the trainer."""

from __future__ import annotations

import threading

import pytest
import torch

from flywheel.generation.vllm import VLLMSidecar
from flywheel.generation.vllm import transfer
from flywheel.generation.vllm.client import SidecarError
from flywheel.generation.vllm_plugin import gloo
from flywheel.policies.load import load_policy


def test_the_setting_is_checked_and_defaults_to_the_disk_without_cuda():
    with pytest.raises(ValueError, match="weight_transfer=rdma: choose one of"):
        VLLMSidecar(weight_transfer="rdma")
    assert VLLMSidecar().weight_transfer == ("ipc" if torch.cuda.is_available() else "disk")
    assert VLLMSidecar(url="http://gpu-node:8000").weight_transfer == ("nccl" if torch.cuda.is_available() else "disk")
    with pytest.raises(ValueError, match="cannot travel"):
        transfer.WeightTransfer("gloo", "float64", None, 10.0)


def test_a_launched_server_gets_the_engine_in_its_weight_transfer_config():
    sidecar = VLLMSidecar(weight_transfer="gloo")
    sidecar.staging = "/weights"
    cmd = sidecar._command(8000)
    assert cmd[cmd.index("--weight-transfer-config") + 1] == '{"backend": "gloo"}'
    assert "--weight-transfer-config" not in VLLMSidecar(weight_transfer="disk")._command(8000)


def test_layer_key_names_the_decoder_layer():
    assert transfer.layer_key("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert transfer.layer_key("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert transfer.layer_key("model.embed_tokens.weight") is None and transfer.layer_key("lm_head.weight") is None


def test_the_stream_sends_what_it_announces_one_layer_gathered_at_a_time(monkeypatch):
    model, _ = load_policy("tiny-countdown-h3")
    runs = []
    real = transfer.gathered

    def recording(tensors):
        runs.append(len(tensors))
        return real(tensors)

    monkeypatch.setattr(transfer, "gathered", recording)
    source = transfer.StreamedWeights(model, torch.bfloat16, "cpu")
    meta = source.metadata()
    assert runs == []  # announcing gathers nothing
    sent = list(source)
    state = model.state_dict()
    assert [(n, t.dtype, tuple(t.shape)) for n, t in sent] == [(m.name, m.dtype, m.shape) for m in meta]
    assert [n for n, _ in sent] == list(state)  # the tied head too: vLLM's reload does not re-tie it
    assert all(torch.equal(t, state[n].to(torch.bfloat16)) for n, t in sent)
    layers = {transfer.layer_key(n) for n in state} - {None}
    # One gather per decoder layer, one for the embeddings before them and one for the norm
    # and head after them: never the whole model at once.
    assert len(runs) == len(layers) + 2 and max(runs) < len(state)
    assert [n for n, _ in source] == [n for n, _ in sent]  # a fresh pass each time


def test_the_gloo_group_broadcasts_from_the_trainer_to_every_worker():
    """Rank 0 hosts the group (the trainer), ranks 1 and 2 join it (two servers' workers)."""
    from flywheel.generation.vllm.server import free_port

    port, got, groups = free_port(), {}, {}

    def join(rank: int) -> None:
        groups[rank] = gloo.open_group("127.0.0.1", port, rank, 3, 30.0)
        tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3) if rank == 0 else torch.zeros(2, 3)
        gloo.broadcast(groups[rank], tensor)
        got[rank] = tensor

    threads = [threading.Thread(target=join, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(torch.equal(got[r], torch.arange(6.0).reshape(2, 3)) for r in range(3))


def test_the_update_info_must_name_each_tensor_once_in_a_known_dtype():
    with pytest.raises(ValueError, match="one of each per tensor"):
        gloo.GlooUpdateInfo(["a", "b"], ["float32"], [[1], [2]])
    with pytest.raises(ValueError, match="float64"):
        gloo.GlooUpdateInfo(["a"], ["float64"], [[1]])


def test_the_gpu_engines_need_vllm_in_the_trainer_and_say_so():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is importable here: the GPU engines are built by vLLM's factory")
    info = transfer.GlooTrainerInitInfo("127.0.0.1", 1, 2, rank=0)
    info_nccl = type("NCCLInfo", (), {"backend": "nccl"})()
    with pytest.raises(SidecarError, match="pip install vllm"):
        transfer.trainer_engine(info_nccl, transfer.SyncClient([], [], 1.0), None)
    assert info.is_sender and not transfer.GlooTrainerInitInfo("127.0.0.1", 1, 2, rank=1).is_sender


def test_the_servers_reach_the_trainer_on_loopback_only_when_all_are_local():
    assert transfer.transfer_address(["http://127.0.0.1:8000", "http://localhost:8001"]) == "127.0.0.1"
    try:
        address = transfer.transfer_address(["http://127.0.0.1:8000", "http://10.1.2.3:8000"])
    except SidecarError as err:  # a machine with no route off itself
        assert "transfer_address" in str(err)
    else:
        assert address != "127.0.0.1" and all(part.isdigit() for part in address.split("."))


def test_on_gpus_the_default_is_ipc_beside_the_trainer_and_nccl_elsewhere(monkeypatch):
    from flywheel.generation.vllm.sidecar import default_transfer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_transfer(attached=False, replica_devices=None) == "ipc"  # launched on the trainer's GPU
    assert default_transfer(attached=False, replica_devices=["1", "2"]) == "nccl"
    assert default_transfer(attached=True, replica_devices=None) == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_transfer(attached=False, replica_devices=None) == "disk"
