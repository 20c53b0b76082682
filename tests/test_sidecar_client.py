"""The vLLM sidecar's client rules, unit-tested without a vLLM server: a stand-in HTTP server
(the standard library's) answers what the test scripts. Bounded retries and the 4xx rule,
the mapping of vLLM's finish / stop reasons, entropies from top-k log-probs, the /metrics
prefix-cache counters, and a rank-0 failure raised on every rank (launch, weight sync and
probe are collective). The real-server tests are tests/test_vllm_sidecar.py (marker `vllm`)."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation.vllm import Server, SidecarError, VLLMSidecar


class StandIn:
    """An HTTP server on 127.0.0.1 answering each path from a script: a list of (status, body)
    served in order, the last one repeated; unscripted paths answer 200 with an empty body."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[int, object]]] = {"/health": [(200, "")]}
        self.seen: list[tuple[str, str, object]] = []  # (method, path, JSON payload)
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with stand_in.lock:
                    stand_in.seen.append((method, self.path, json.loads(raw) if raw else None))
                    answers = stand_in.script.get(self.path, [(200, "")])
                    status, body = answers.pop(0) if len(answers) > 1 else answers[0]
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def posts(self, path: str) -> list[object]:
        return [payload for method, p, payload in self.seen if method == "POST" and p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def dead_url() -> str:
    probe = StandIn()
    probe.close()  # nothing listens on its port any more
    return probe.url


# ---- retries and the 4xx rule -------------------------------------------------------------

def test_a_failed_request_is_retried_until_it_succeeds(stand_in):
    stand_in.script["/x"] = [(500, "boom"), (503, "busy"), (200, {"ok": 1})]
    assert Server(stand_in.url, max_retries=3).post("/x", {"a": 1}) == {"ok": 1}
    assert stand_in.posts("/x") == [{"a": 1}] * 3


def test_retries_are_bounded_and_the_error_names_the_request(stand_in):
    stand_in.script["/x"] = [(500, "boom")]
    with pytest.raises(SidecarError, match=r"/x failed 2 times"):
        Server(stand_in.url, max_retries=2).post("/x", None)
    assert len(stand_in.posts("/x")) == 2


def test_a_request_the_server_refuses_4xx_fails_at_once_with_its_reason(stand_in):
    stand_in.script["/v1/completions"] = [(400, "This model's maximum context length is 512 tokens"), (200, {})]
    with pytest.raises(SidecarError, match=r"refused /v1/completions \(400\).*maximum context length is 512"):
        Server(stand_in.url, max_retries=3).post("/v1/completions", {"prompt": [1]})
    assert len(stand_in.posts("/v1/completions")) == 1  # not retried


# ---- /metrics -----------------------------------------------------------------------------

METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="policy"} 120.0
vllm:prefix_cache_queries_total{engine="1",model_name="policy"} 30.0
vllm:prefix_cache_queries_created{engine="0",model_name="policy"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
vllm:prefix_cache_hits_total{engine="0",model_name="policy"} 48.0
vllm:prefix_cache_hits_total{engine="1",model_name="policy"} 12.0
vllm:num_requests_running{engine="0",model_name="policy"} 3.0
"""


def test_prefix_cache_counters_sum_every_engine_and_skip_other_series(stand_in):
    stand_in.script["/metrics"] = [(200, METRICS)]
    # queries 120 + 30 = 150, hits 48 + 12 = 60; the *_created series is a timestamp, not a count.
    assert Server(stand_in.url).prefix_cache_counters() == (150.0, 60.0)


def test_prefix_cache_counters_of_several_servers_add_up_and_missing_ones_are_none(stand_in):
    other = StandIn()
    try:
        stand_in.script["/metrics"] = [(200, METRICS)]
        other.script["/metrics"] = [(200, "vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 4\n")]
        sidecar = VLLMSidecar(url=[stand_in.url, other.url])
        sidecar.servers = [Server(u) for u in sidecar.urls]
        assert sidecar.prefix_cache_counters() == (160.0, 64.0)
        other.script["/metrics"] = [(200, "vllm:num_requests_running 1\n")]  # no prefix-cache series
        assert Server(other.url).prefix_cache_counters() is None
        assert sidecar.prefix_cache_counters() == (150.0, 60.0)  # the server without counters adds nothing
    finally:
        other.close()
    assert Server(dead_url()).prefix_cache_counters() is None


# ---- completions: finish reasons and entropies ----------------------------------------------

EOS = 2
TOKENIZER = SimpleNamespace(eos_token_id=EOS)


def choice(index, ids, finish, stop_reason=None, logprobs=None, top=None):
    logprobs = logprobs if logprobs is not None else [-0.5] * len(ids)
    lp = {"token_logprobs": logprobs}
    if top is not None:
        lp["top_logprobs"] = top
    return {"index": index, "token_ids": ids, "finish_reason": finish, "stop_reason": stop_reason, "logprobs": lp}


def attached(stand_in, **kwargs):
    sidecar = VLLMSidecar(url=stand_in.url, **kwargs)
    return sidecar, sidecar.build(object(), TOKENIZER)  # attached, no LoRA: nothing is staged


def test_finish_reasons_map_to_the_generator_contract(stand_in):
    # Choices come back out of order; vLLM's stop_reason is None for EOS, the stop string, or
    # the stop token id that ended the sample.
    stand_in.script["/v1/completions"] = [(200, {"choices": [
        choice(1, [5, 6], "length"),  # hit max_tokens
        choice(0, [5, EOS], "stop"),  # EOS: stop_reason None
        choice(2, [5, 10], "stop", "\n"),  # a stop string
        choice(3, [5, EOS], "stop", EOS),  # a stop token id that is the EOS id
        choice(4, [5, 7], "stop", 7),  # a stop token id that is not EOS
    ]})]
    _, generator = attached(stand_in, send_seeds=False)
    params = SamplingParams(max_new_tokens=2, stop_strings=("\n",), stop_token_ids=(7,))
    [completions] = generator.sample([GenerationRequest((1, 3), n=5, params=params, seed=11)])
    assert [c.finish_reason for c in completions] == ["eos", "length", "stop", "eos", "stop"]
    assert completions[1].token_ids == (5, 6) and completions[1].logprobs == (-0.5, -0.5)
    assert completions[0].entropies is None  # not asked for
    [payload] = stand_in.posts("/v1/completions")
    assert payload["prompt"] == [1, 3] and payload["n"] == 5 and payload["max_tokens"] == 2
    assert payload["stop"] == ["\n"] and payload["stop_token_ids"] == [7]
    assert payload["logprobs"] == 1  # the sampled token's log-prob is always asked for
    assert "seed" not in payload  # send_seeds off
    assert generator.stats.generated_tokens == 10 and generator.stats.prompt_tokens == 2 * 5


def test_entropies_come_from_the_renormalised_top_k(stand_in):
    half, quarter, fifth = math.log(0.5), math.log(0.25), math.log(0.2)
    top = [
        {"5": half, "6": quarter, "8": quarter},  # the whole mass: 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2
        {"6": fifth, "9": fifth},  # mass 0.4, renormalised to 1/2, 1/2: ln 2
        None,  # no top-k for this position: unknown
    ]
    stand_in.script["/v1/completions"] = [(200, {"choices": [choice(0, [5, 6, 7], "length", top=top)]})]
    _, generator = attached(stand_in, send_seeds=True)
    params = SamplingParams(max_new_tokens=3, top_logprobs=3)
    [[c]] = generator.sample([GenerationRequest((1,), n=1, params=params, seed=2**31 + 5)])
    assert c.entropies[0] == pytest.approx(1.5 * math.log(2))
    assert c.entropies[1] == pytest.approx(math.log(2))
    assert math.isnan(c.entropies[2])
    [payload] = stand_in.posts("/v1/completions")
    assert payload["logprobs"] == 3 and payload["seed"] == 5  # seeds are folded into vLLM's 31 bits


def test_malformed_answers_are_errors_not_silent_data(stand_in):
    _, generator = attached(stand_in)
    request = GenerationRequest((1,), n=2, params=SamplingParams(max_new_tokens=2))
    stand_in.script["/v1/completions"] = [(200, {"choices": [choice(0, [5], "length")]})]
    with pytest.raises(SidecarError, match="n=2 samples, it returned 1"):
        generator.sample([request])
    stand_in.script["/v1/completions"] = [(200, {"choices": [choice(0, [5, 6], "length", logprobs=[-1.0]),
                                                             choice(1, [5], "length")]})]
    with pytest.raises(SidecarError, match="2 tokens but 1 log-probs"):
        generator.sample([request])
    stand_in.script["/v1/completions"] = [(200, {"choices": [choice(0, [5], "length", logprobs=[None]),
                                                             choice(1, [5], "length")]})]
    [[first, _]] = generator.sample([request])
    assert math.isnan(first.logprobs[0])  # a log-prob the server left out is unknown, not 0


# ---- a rank-0 failure reaches every rank ----------------------------------------------------

class ThreadRanks:
    """Two ranks as two threads: broadcast hands rank `src`'s object to both."""

    def __init__(self) -> None:
        self.gate = threading.Barrier(2, timeout=60)
        self.slot = None

    def rank(self, r: int):
        ranks = self

        class Rank:
            global_rank = r
            world_size = 2

            def broadcast(self, obj, src=0):
                if r == src:
                    ranks.slot = obj
                ranks.gate.wait()
                out = ranks.slot
                ranks.gate.wait()
                return out

            def barrier(self, name=None):
                ranks.gate.wait()

        return Rank()


def on_both_ranks(fn) -> list[BaseException | object]:
    ranks = ThreadRanks()

    def call(r):
        try:
            return fn(r, ranks.rank(r))
        except Exception as err:  # noqa: BLE001 - the outcome of each rank is what is tested
            return err

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(call, (0, 1)))


def test_a_launch_that_fails_on_rank_0_is_raised_on_every_rank():
    url = dead_url()
    outcomes = on_both_ranks(lambda r, dist: VLLMSidecar(url=url, startup_timeout=1).build(object(), TOKENIZER, dist))
    zero, one = outcomes
    assert isinstance(zero, SidecarError) and f"{url} was not healthy after 1 s" in str(zero)
    assert isinstance(one, SidecarError) and str(one) == f"rank 0 could not start the vLLM servers: {zero}"


@pytest.fixture(scope="module")
def tiny():
    from flywheel.policies.load import load_policy

    return load_policy("tiny-countdown")


def test_a_weight_sync_or_probe_that_fails_on_rank_0_is_raised_on_every_rank(stand_in, tmp_path, tiny):
    model, tok = tiny

    def sync(r, dist):
        sidecar = VLLMSidecar(url=stand_in.url, staging_dir=str(tmp_path / "staging"), max_retries=1)
        sidecar.build(model, tok, dist)
        sidecar.sync_weights(model, version=3)

    # The reload is refused on rank 0 (which alone talks to the server for a sync).
    stand_in.script["/pause?mode=wait"] = [(400, "paused already")]
    zero, one = on_both_ranks(sync)
    assert isinstance(zero, SidecarError) and "refused /pause?mode=wait (400): paused already" in str(zero)
    assert isinstance(one, SidecarError) and str(one) == f"weight sync failed on rank 0: {zero}"
    assert len(stand_in.posts("/pause?mode=wait")) == 1  # rank 1 never posted

    # The reload succeeds but the probe's request is refused: every rank raises the probe's error.
    stand_in.script["/pause?mode=wait"] = [(200, "")]
    stand_in.script["/v1/completions"] = [(400, "bad probe")]
    zero, one = on_both_ranks(sync)
    for err in (zero, one):
        assert isinstance(err, SidecarError) and str(err).startswith("the probe after weight sync 3 failed")
        assert "bad probe" in str(err)
    assert (tmp_path / "staging" / "model.safetensors").is_file()  # rank 0 staged the weights

    # The probe's answer is not the trainer's policy: every rank compares the broadcast answer.
    stand_in.script["/v1/completions"] = [(200, {"choices": [choice(0, [5, 6], "length", logprobs=[0.0, 0.0])]})]
    zero, one = on_both_ranks(sync)
    for err in (zero, one):
        assert isinstance(err, SidecarError) and "differ from the trainer's" in str(err), err


def test_every_request_failing_beside_a_failed_restart_reports_its_cause(tmp_path):
    """A launched server dies and cannot come back (its relaunch exits with code 3): the request
    that restarts it fails with that cause, and so do the requests that failed at the same time
    (they do not retry on and end with their own connection errors)."""
    import sys

    server = Server(None, command=lambda port: [sys.executable, "-c", "import sys; sys.exit(3)"],
                    log_path=tmp_path / "server.log", startup_timeout=30, max_retries=3)
    server.launch()
    server.process.wait()  # it died
    gate = threading.Barrier(4)

    def post(_):
        gate.wait()
        try:
            server.post("/v1/completions", {"prompt": [1]})
        except SidecarError as err:
            return str(err)
        return "answered"

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(post, range(4)))
    assert all("exited with code 3 while starting" in o for o in outcomes), outcomes
    server.stop()
    assert isinstance(server.restart_failure, SidecarError) and server.restarts >= 1
