"""`VLLMSidecar`: the Generator seam on vLLM servers, launched and supervised by the trainer.

The servers run as child processes on 127.0.0.1 (free ports), log into the run folder,
and are stopped with their whole process groups when the trainer closes the backend or
exits. Or attach to running servers with `url`. Requests are token-id prompts to
`/v1/completions` (n samples, stop strings / token ids, sampled-token log-probs, top-k
log-probs for entropies, per-request seeds), sent concurrently so one search round fills
the servers' batches; prefix caching is on. With several servers (`replicas`, or several
URLs) the requests of one tree all go to the same server (`GenerationRequest.affinity`), so
its prefix cache holds the tree's shared prefixes, and the trees are spread evenly.

Weights are synced after each epoch's updates: the policy is written as safetensors to a
staging folder (gathered parameter by parameter from DeepSpeed ZeRO-3 shards when the
model is partitioned), then every server does pause -> reload_weights -> reset the prefix
cache -> resume (shared/notes/vllm-cpu.md §4), and a probe compares each server's log-probs
with the trainer's. With a LoRA policy only the adapter is written, and loaded in place.

In a distributed run (DDP, DeepSpeed) rank 0 launches the servers and pushes the weights;
every rank sends its own search traffic to them. Launch, sync and probe are collective: the
other ranks take part in the ZeRO-3 gather and the probe's forward pass, and raise the same
error as rank 0 when it fails, instead of waiting forever.

A request that fails (connection refused, timeout, server error) is retried a bounded number
of times; a launched server that died is restarted on its port first, and a server another
rank launched is waited for (bounded). Then the run stops with the error.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from flywheel.generation.backends import Collective, GeneratorBackend, SingleProcess
from flywheel.generation.base import Completion, GenerationRequest, GenerationStats
from flywheel.objectives import token_logprobs

log = logging.getLogger(__name__)

SERVED_NAME = "policy"
ADAPTER_NAME = "policy-lora"
PYTHON_ENV = "FLYWHEEL_VLLM_PYTHON"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for --max-lora-rank."""


WATCHDOG = """
import os, signal, subprocess, sys, time
trainer = int(sys.argv[1])
server = subprocess.Popen(sys.argv[2:])
while server.poll() is None:
    if os.getppid() != trainer:  # orphaned: the trainer died without stopping us
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)
    time.sleep(1.0)
sys.exit(server.returncode)
"""
"""Runs the vLLM server as its child (same interpreter) and stops the server's whole process
group once the trainer that launched it is gone."""


class SidecarError(RuntimeError):
    """A vLLM server could not be started, reached, or kept in step with the trainer."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str, payload: dict | None, timeout: float) -> Any:
    data = json.dumps(payload).encode() if payload is not None else b""
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError:  # some endpoints answer plain text (e.g. load_lora_adapter)
        return body.decode(errors="replace")


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


class Server:
    """One vLLM server: launched by this process (restartable on its port) or attached to by URL.

    Args:
        url: the server's base URL when attaching; None = launch with `command`.
        command: builds the launch command line for a port.
        env: environment of the launched server.
        log_path: where the launched server's output goes.
        startup_timeout: seconds to wait for /health (also: for a server another process restarts).
        request_timeout: seconds before one request counts as failed.
        max_retries: attempts per request.
        after_start: called with the server once a (re)launch is healthy (e.g. load an adapter).
    """

    def __init__(self, url: str | None, command=None, env: dict | None = None, log_path: Path | None = None,
                 startup_timeout: float = 300.0, request_timeout: float = 300.0, max_retries: int = 3,
                 after_start=None) -> None:
        self.url = url.rstrip("/") if url else None
        self.command = command
        self.env = env
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.after_start = after_start
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.restarts = 0
        self._lock = threading.RLock()  # a restart's after_start posts, and may retry

    @property
    def launched(self) -> bool:
        return self.command is not None

    def launch(self) -> None:
        self.port = self.port or free_port()  # a restart keeps the port: other ranks hold the URL
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting a vLLM server on %s (log: %s)", self.url, self.log_path)
        command = self.command(self.port)
        # The server runs under a watchdog in a process group of its own: stopping the group
        # stops everything, and a trainer that dies without closing (SIGKILL, OOM) takes it along.
        command = [command[0], "-c", WATCHDOG, str(os.getpid()), *command]
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise SidecarError(f"the vLLM server at {self.url} exited with code {self.process.returncode} while "
                                   f"starting; see {self.log_path}")
            try:
                _get(f"{self.url}/health", timeout=5)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(1.0)
        raise SidecarError(f"the vLLM server at {self.url} was not healthy after {self.startup_timeout:.0f} s"
                           + (f"; see {self.log_path}" if self.log_path else ""))

    def stop(self) -> None:
        """Stop a launched server and every process of its group; none may outlive it."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # the engine and worker processes share the server's group
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if process.poll() is None:
            process.wait(timeout=30)

    def post(self, path: str, payload: dict | None) -> Any:
        """POST with bounded retries. Before a retry a launched server that died is restarted
        (once for all the requests that failed together); a server launched elsewhere is
        waited for. A 4xx answer is the request's fault and is not retried."""
        last: Exception | None = None
        for attempt in range(self.max_retries):
            seen_restarts = self.restarts
            try:
                return _post(f"{self.url}{path}", payload, timeout=self.request_timeout)
            except urllib.error.HTTPError as err:
                if 400 <= err.code < 500:
                    detail = err.read().decode(errors="replace")[:500]
                    raise SidecarError(f"the vLLM server at {self.url} refused {path} ({err.code}): {detail}") from err
                last = err
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
                last = err
            log.warning("vLLM request %s%s failed (attempt %d/%d): %s", self.url, path, attempt + 1, self.max_retries, last)
            if attempt + 1 == self.max_retries:
                break
            with self._lock:
                if self.restarts == seen_restarts:
                    if self.process is not None and self.process.poll() is not None:
                        self._restart()
                    elif not self.launched:
                        self.wait_healthy()
            if self.restarts == seen_restarts:
                time.sleep(min(2.0**attempt, 10.0))
        raise SidecarError(f"vLLM request {self.url}{path} failed {self.max_retries} times: {last}")

    def _restart(self) -> None:
        self.restarts += 1
        log.warning("restarting the vLLM server on %s (restart %d)", self.url, self.restarts)
        self.stop()
        self.launch()
        self.wait_healthy()
        if self.after_start is not None:
            self.after_start(self)

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """(queries, hits) of the server's prefix cache, in tokens, from /metrics."""
        try:
            text = _get(f"{self.url}/metrics", timeout=10).decode()
        except (urllib.error.URLError, OSError):
            return None
        values: dict[str, float] = {}
        for line in text.splitlines():
            for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                if line.startswith(name):
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        if len(values) < 2:
            return None
        return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


class VLLMGenerator:
    """Samples from the sidecar's servers (see the module docstring); one HTTP request per
    GenerationRequest, `max_concurrency` in flight."""

    def __init__(self, sidecar: VLLMSidecar, eos_token_ids: Sequence[int]) -> None:
        self.sidecar = sidecar
        self.eos_token_ids = frozenset(eos_token_ids)
        self._stats = GenerationStats()
        self._pool = ThreadPoolExecutor(max_workers=sidecar.max_concurrency)

    @property
    def stats(self) -> GenerationStats:
        """Cumulative accounting. The servers' prefix-cache counters come from their /metrics
        pages, fetched here when the stats are read, not after every search round."""
        counters = self.sidecar.prefix_cache_counters()
        if counters is not None:
            queries, hits = counters
            self._stats.extra["server_prefix_cache_queries"] = queries
            self._stats.extra["server_prefix_cache_hits"] = hits
            self._stats.cached_prompt_tokens = int(hits)
            self._stats.prefill_tokens = int(max(queries - hits, 0))
        return self._stats

    def sample(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        start = time.perf_counter()
        results = list(self._pool.map(self._one, requests, self.sidecar.route(requests)))
        stats = self._stats
        stats.calls += 1
        stats.requests += len(requests)
        stats.prompt_tokens += sum(len(r.prompt_ids) * r.n for r in requests)
        stats.generated_tokens += sum(len(c.token_ids) for cs in results for c in cs)
        stats.seconds += time.perf_counter() - start
        return results

    def _one(self, request: GenerationRequest, server: Server) -> list[Completion]:
        p = request.params
        payload = {
            "model": self.sidecar.model_name,
            "prompt": list(request.prompt_ids),
            "n": request.n,
            "max_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "logprobs": max(1, p.top_logprobs),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }
        if p.stop_strings:
            payload["stop"] = list(p.stop_strings)
        if p.stop_token_ids:
            payload["stop_token_ids"] = list(p.stop_token_ids)
        if request.seed is not None and self.sidecar.send_seeds:
            payload["seed"] = int(request.seed) % (2**31)
        body = server.post("/v1/completions", payload)
        choices = sorted(body["choices"], key=lambda c: c["index"])
        if len(choices) != request.n:
            raise SidecarError(f"asked {server.url} for n={request.n} samples, it returned {len(choices)}")
        return [self._completion(c, p.top_logprobs) for c in choices]

    def _completion(self, choice: dict, top_k: int) -> Completion:
        ids = tuple(int(t) for t in choice["token_ids"])
        lp = choice.get("logprobs") or {}
        logprobs = tuple(float(x) if x is not None else math.nan for x in (lp.get("token_logprobs") or []))
        if len(logprobs) != len(ids):
            raise SidecarError(f"{len(ids)} tokens but {len(logprobs)} log-probs in the server's answer")
        stop_reason = choice.get("stop_reason")
        if choice.get("finish_reason") == "length":
            reason = "length"
        elif stop_reason is None or (ids and ids[-1] in self.eos_token_ids and stop_reason == ids[-1]):
            reason = "eos"  # EOS, or a stop token id that is an EOS id
        else:
            reason = "stop"
        entropies = None
        if top_k > 0:
            entropies = tuple(_entropy(step) for step in (lp.get("top_logprobs") or []))
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=reason, entropies=entropies)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _entropy(top: dict | None) -> float:
    """Entropy (nats) of the top-k distribution renormalised: a lower bound on the truth."""
    if not top:
        return math.nan
    logps = [float(v) for v in top.values()]
    mass = sum(math.exp(v) for v in logps)
    return -sum(math.exp(v) / mass * (v - math.log(mass)) for v in logps)


class VLLMSidecar(GeneratorBackend):
    """vLLM servers beside the trainer (CPU: the `vllm-cpu` package; GPU: `vllm`).

    Args:
        url: attach to these running servers (one URL or a list, e.g.
            "http://127.0.0.1:8000") instead of launching; the weights are still pushed to
            them, so they must run with VLLM_SERVER_DEV_MODE=1 (and
            VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 --enable-lora for a LoRA policy).
        replicas: servers to launch (one per GPU group: see `replica_devices`); the search
            traffic is spread over them, one tree per server, and every sync reaches all.
        replica_devices: CUDA_VISIBLE_DEVICES of each launched server (e.g. ["0,1", "2,3"]
            with extra_args ["--tensor-parallel-size", "2"]); None = inherit.
        python: the interpreter with vLLM installed (default: $FLYWHEEL_VLLM_PYTHON, else this one).
        dtype: weights dtype on the servers ("float32" matches the trainer's CPU log-probs).
        max_model_len: context length of the servers.
        max_num_seqs: sequences one server decodes together.
        kv_cache_gb: KV cache memory per server on CPU (VLLM_CPU_KVCACHE_SPACE).
        extra_args: more server flags (e.g. ["--gpu-memory-utilization", "0.4"]).
        startup_timeout: seconds to wait for /health.
        request_timeout: seconds before one request counts as failed.
        max_retries: attempts per request; a launched server that died is restarted first.
        max_concurrency: requests in flight at once, over all servers.
        logprob_tolerance: largest |server - trainer| log-prob allowed by the probe after a sync.
        log_dir: where the servers' logs go (vllm_server.log, vllm_server_1.log, ...; default:
            the run's log folder).
        send_seeds: pass each request's seed to the server (reproducible samples). Default:
            on with CUDA, off on CPU, where vllm-cpu 0.32 crashes its worker ("CPU Generator
            does not use offset") once many seeded requests share a batch.
        staging_dir: the folder the weights are written to for the servers to load (default: a
            temporary folder); servers on another machine must see it (a shared filesystem).
        block_size: KV-cache block size, the prefix cache's granularity (only whole blocks are
            reused). None: 32 on CPU, where vLLM's own default of 128 leaves every prefix under
            128 tokens uncached (measured: a 50-token prompt sent 3 times, 0 hits at 128, 64 at
            32; 16 crashes vllm-cpu's worker); vLLM's default on GPU.
        access_log: log every HTTP request in the server log (one line per search request:
            megabytes per epoch on a GPU run; off by default).

    When the policy carries LoRA adapters (`--model.lora.rank`), the servers launch with LoRA
    enabled on the frozen base, sample through the adapter, and each sync loads only the
    adapter, in place (`/v1/load_lora_adapter`).
    """

    def __init__(
        self,
        url: str | list[str] | None = None,
        replicas: int = 1,
        replica_devices: list[str] | None = None,
        python: str | None = None,
        dtype: str = "float32",
        max_model_len: int = 512,
        max_num_seqs: int = 256,
        kv_cache_gb: float = 1.0,
        extra_args: list[str] | None = None,
        startup_timeout: float = 300.0,
        request_timeout: float = 300.0,
        max_retries: int = 3,
        max_concurrency: int = 64,
        logprob_tolerance: float = 1e-3,
        log_dir: str | None = None,
        send_seeds: bool | None = None,
        staging_dir: str | None = None,
        block_size: int | None = None,
        access_log: bool = False,
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url or [])
        self.attached = bool(self.urls)
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if replica_devices is not None and len(replica_devices) != replicas:
            raise ValueError(f"replica_devices names {len(replica_devices)} device groups for {replicas} replicas")
        self.replicas = replicas
        self.replica_devices = replica_devices
        self.python = python or os.environ.get(PYTHON_ENV) or sys.executable
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_gb = kv_cache_gb
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.logprob_tolerance = logprob_tolerance
        self.log_dir = Path(log_dir) if log_dir else None
        self.send_seeds = torch.cuda.is_available() if send_seeds is None else send_seeds
        self.access_log = access_log
        self.block_size = block_size if block_size is not None else (None if torch.cuda.is_available() else 32)
        self.lora_rank = 0  # the policy's, set by build()
        self.servers: list[Server] = []
        self.staging: Path | None = Path(staging_dir) if staging_dir else None
        self.weight_version = 0
        self.dist: Collective = SingleProcess()
        self._generator: VLLMGenerator | None = None
        self._tokenizer = None
        self._round_robin = count()

    @property
    def model_name(self) -> str:
        return ADAPTER_NAME if self.lora_rank else SERVED_NAME

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.servers)

    @property
    def process(self) -> subprocess.Popen | None:
        """The first launched server's process (None when attached or stopped)."""
        return self.servers[0].process if self.servers else None

    # ------------------------------------------------------------------ lifecycle
    def build(self, model: Any, tokenizer: Any, dist: Collective | None = None) -> VLLMGenerator:
        """Launch (rank 0) or reach the servers; every rank gets their URLs. Collective."""
        self.dist = dist or SingleProcess()
        self._tokenizer = tokenizer
        self.lora_rank = int(model.peft_config["default"].r) if hasattr(model, "peft_config") else 0
        if not self.attached:
            self._stage(model, adapter=False)
        if self.lora_rank:
            self._stage(model, adapter=True)
        urls, error = None, None
        if self.dist.global_rank == 0:
            try:
                self.servers = self._start_servers()
                urls = [s.url for s in self.servers]
            except Exception as err:  # every rank must hear of it, or they wait forever
                error = _describe(err)
        urls, error = self.dist.broadcast((urls, error), src=0)
        if error is not None:
            self.close()
            raise SidecarError(error if self.dist.global_rank == 0 else f"rank 0 could not start the vLLM servers: {error}")
        if self.dist.global_rank != 0:
            self.servers = [self._server(u) for u in urls]
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self._generator = VLLMGenerator(self, eos)
        return self._generator

    def _server(self, url: str | None, index: int = 0) -> Server:
        command = env = log_path = None
        if url is None:
            command = self._command
            env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
                   "VLLM_CPU_KVCACHE_SPACE": str(max(1, int(self.kv_cache_gb)))}
            if self.lora_rank:
                env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
            if self.replica_devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = self.replica_devices[index]
            folder = self.log_dir or self.run_dir or Path(tempfile.mkdtemp(prefix="flywheel-vllm-log-"))
            log_path = folder / ("vllm_server.log" if index == 0 else f"vllm_server_{index}.log")
        after_start = self._load_adapter if self.lora_rank else None
        return Server(url, command, env, log_path, self.startup_timeout, self.request_timeout, self.max_retries, after_start)

    def _command(self, port: int) -> list[str]:
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.staging),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
            "--max-logprobs", "20", "--enable-prefix-caching", "--seed", "0",
        ]
        if self.lora_rank:
            cap = min((r for r in VLLM_LORA_RANKS if r >= self.lora_rank), default=self.lora_rank)
            cmd += ["--enable-lora", "--max-lora-rank", str(cap), "--max-loras", "1"]
        if self.block_size is not None:
            cmd += ["--block-size", str(self.block_size)]
        if not self.access_log:
            cmd.append("--disable-uvicorn-access-log")
        if not torch.cuda.is_available():
            cmd.append("--enforce-eager")
        return cmd + self.extra_args  # last: a flag given here wins over ours

    def _start_servers(self) -> list[Server]:
        if self.attached:
            servers = [self._server(u) for u in self.urls]
        else:
            servers = [self._server(None, i) for i in range(self.replicas)]
            atexit.register(self.close)
            self.servers = servers  # stopped by close() even if a later one fails to start
            for server in servers:
                server.launch()

        def ready(server: Server) -> None:
            server.wait_healthy()
            if server.after_start is not None:
                server.after_start(server)

        with ThreadPoolExecutor(max_workers=len(servers)) as pool:  # they start in parallel
            list(pool.map(ready, servers))
        return servers

    def close(self) -> None:
        """Stop the launched servers (their whole process groups) and the request threads."""
        if self._generator is not None:
            self._generator.close()
        for server in self.servers:
            server.stop()

    # ------------------------------------------------------------------ requests
    def route(self, requests: Sequence[GenerationRequest]) -> list[Server]:
        """The server of each request: by affinity (one tree, one server), else round-robin."""
        n = len(self.servers)
        return [self.servers[(r.affinity if r.affinity is not None else next(self._round_robin)) % n] for r in requests]

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """(queries, hits) of all the servers' prefix caches together, in tokens."""
        counters = [c for c in (s.prefix_cache_counters() for s in self.servers) if c is not None]
        if not counters:
            return None
        return sum(q for q, _ in counters), sum(h for _, h in counters)

    def _fan_out(self, fn) -> list[Any]:
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            return list(pool.map(fn, self.servers))

    # ------------------------------------------------------------------ weights
    def sync_weights(self, model: Any, version: int) -> None:
        """Push `model`'s weights to every server, then check their log-probs against the
        trainer's. Collective: every rank calls it together."""
        self._stage(model, adapter=bool(self.lora_rank))
        error = None
        if self.dist.global_rank == 0:
            try:
                self._fan_out(lambda s: self._reload(s, version))
            except Exception as err:
                error = _describe(err)
        error = self.dist.broadcast(error, src=0)
        if error is not None:
            raise SidecarError(error if self.dist.global_rank == 0 else f"weight sync failed on rank 0: {error}")
        self.weight_version = version
        self.probe(model)

    def _stage(self, model: Any, adapter: bool) -> None:
        """Rank 0 writes the weights to the staging folder, atomically: the model folder a
        server launches from (config, tokenizer, weights; with LoRA the frozen base), or the
        LoRA adapter folder. With ZeRO-3 every rank helps gather them."""
        state = dict(_full_state(model, rank=self.dist.global_rank, adapter_only=adapter))
        if self.dist.global_rank != 0:
            return
        if self.staging is None:
            self.staging = Path(tempfile.mkdtemp(prefix="flywheel-vllm-weights-"))
        self.staging.mkdir(parents=True, exist_ok=True)
        from safetensors.torch import save_file

        if adapter:
            target = self.staging / "adapter" / "adapter_model.safetensors"
            target.parent.mkdir(parents=True, exist_ok=True)
            model.peft_config["default"].save_pretrained(str(target.parent))
        else:
            target = self.staging / "model.safetensors"
            if not (self.staging / "config.json").is_file():
                base = model.get_base_model() if self.lora_rank else model
                base.config.save_pretrained(self.staging)
                if getattr(base, "generation_config", None) is not None:
                    base.generation_config.save_pretrained(self.staging)
                self._tokenizer.save_pretrained(self.staging)
        tmp = target.with_suffix(".tmp")
        save_file(state, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, target)

    def _reload(self, server: Server, version: int) -> None:
        if self.lora_rank:
            self._load_adapter(server)
        else:
            server.post("/pause?mode=wait", None)
            try:
                server.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(self.staging)}})
                server.post("/reset_prefix_cache", None)
            finally:
                server.post("/resume", None)
        try:
            server.post("/update_weight_version", {"new_version": str(version)})
        except SidecarError:
            pass  # servers without the endpoint: the trainer's stamp is the record

    def _load_adapter(self, server: Server) -> None:
        server.post("/v1/load_lora_adapter",
                    {"lora_name": ADAPTER_NAME, "lora_path": str(self.staging / "adapter"), "load_inplace": True})
        server.post("/reset_prefix_cache", None)

    @torch.no_grad()
    def probe(self, model: Any, prompt: Sequence[int] | None = None, tokens: int = 8) -> float:
        """Greedy-sample a few tokens on every server and compare their log-probs with the
        trainer's; raise SidecarError when they differ by more than `logprob_tolerance`.
        Collective: rank 0 asks the servers, every rank runs the forward pass (ZeRO-3
        forward passes are collective)."""
        if prompt is None:
            prompt = self._tokenizer("1 2 3|6\n")["input_ids"]
        payload = {"model": self.model_name, "prompt": list(prompt), "max_tokens": tokens, "temperature": 0.0,
                   "logprobs": 1, "return_token_ids": True, "skip_special_tokens": False}
        answers, error = None, None
        if self.dist.global_rank == 0:
            try:
                choices = self._fan_out(lambda s: s.post("/v1/completions", payload)["choices"][0])
                answers = [([int(t) for t in c["token_ids"]], [float(x) for x in c["logprobs"]["token_logprobs"]])
                           for c in choices]
            except Exception as err:
                error = _describe(err)
        answers, error = self.dist.broadcast((answers, error), src=0)
        if error is not None:
            raise SidecarError(f"the probe after weight sync {self.weight_version} failed: {error}")
        was_training = model.training
        model.eval()
        gaps = []
        try:
            for ids, served in answers:
                sequence = torch.tensor([list(prompt) + ids], device=_device(model))
                logits = model(input_ids=sequence).logits[:, len(prompt) - 1 : -1]
                trainer = token_logprobs(logits, sequence[:, len(prompt):])[0].tolist()
                gaps.append(max((abs(a - b) for a, b in zip(served, trainer)), default=0.0))
        finally:
            model.train(was_training)
        worst = max(range(len(gaps)), key=gaps.__getitem__)
        if gaps[worst] > self.logprob_tolerance:
            raise SidecarError(
                f"after weight sync {self.weight_version} the log-probs of the vLLM server at {self.servers[worst].url} differ from the "
                f"trainer's by {gaps[worst]:.2e} (tolerance {self.logprob_tolerance:g}): it is not sampling from the "
                "trained policy"
            )
        return gaps[worst]


def _describe(err: Exception) -> str:
    return str(err) if isinstance(err, SidecarError) else f"{type(err).__name__}: {err}"


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _full_state(model: Any, rank: int, adapter_only: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) of the weights to push, on rank 0 only (other ranks yield nothing but
    take part in the gathers). Every tensor gets its own name and storage: with tied
    embeddings the LM head is written too (vLLM's in-place reload does not re-tie it).

    With LoRA adapters (a PEFT model): `adapter_only` gives the adapter tensors under the
    names of PEFT's adapter files; otherwise the frozen base weights under the base model's
    names, which is what a server loads at launch (it adds the adapter on top)."""
    lora = hasattr(model, "peft_config")
    for name, tensor in model.state_dict(keep_vars=True).items():
        is_adapter = "lora_" in name
        if lora and is_adapter != adapter_only:
            continue
        if lora:
            name = name.replace(".default.", ".") if adapter_only else (
                name.removeprefix("base_model.model.").replace(".base_layer.", "."))
        with _gathered(tensor):
            if rank == 0:
                yield name, tensor.detach().to("cpu").clone().contiguous()


@contextmanager
def _gathered(tensor: torch.Tensor) -> Iterator[None]:
    """A DeepSpeed ZeRO-3 partitioned parameter gathered in full on every rank for the block
    (collective); anything else as it is."""
    if hasattr(tensor, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
            yield
    else:
        yield
