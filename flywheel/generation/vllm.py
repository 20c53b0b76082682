"""`VLLMSidecar`: the Generator seam on a vLLM server, launched and supervised by the trainer.

The server runs as a child process on 127.0.0.1 (a free port), logs into the run folder,
and is stopped with its whole process group when the trainer closes the backend or exits.
Or attach to a running server with `url`. Requests are token-id prompts to
`/v1/completions` (n samples, stop strings / token ids, sampled-token log-probs, top-k
log-probs for entropies, per-request seeds), sent concurrently so one search round fills
the server's batch; prefix caching is on. Weights are synced after each epoch: the policy is
written as safetensors to a staging folder, then pause -> reload_weights -> reset the prefix
cache -> resume (shared/notes/vllm-cpu.md §4), and a probe compares the server's log-probs
with the trainer's. A request that fails (connection refused, timeout, server error) is
retried a bounded number of times, restarting a launched server that died; then the run
stops with the error.
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
from pathlib import Path
from typing import Any, Sequence

import torch

from flywheel.generation.backends import GeneratorBackend
from flywheel.generation.base import Completion, GenerationRequest, GenerationStats

log = logging.getLogger(__name__)

SERVED_NAME = "policy"


class SidecarError(RuntimeError):
    """The vLLM server could not be started, reached, or kept in step with the trainer."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str, payload: dict | None, timeout: float) -> Any:
    data = json.dumps(payload).encode() if payload is not None else b""
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    return json.loads(body) if body.strip() else None


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


class VLLMGenerator:
    """Samples from a vLLM server (see the module docstring); one HTTP request per
    GenerationRequest, `max_concurrency` in flight."""

    def __init__(self, sidecar: VLLMSidecar, eos_token_ids: Sequence[int]) -> None:
        self.sidecar = sidecar
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stats = GenerationStats()
        self._pool = ThreadPoolExecutor(max_workers=sidecar.max_concurrency)

    def sample(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        start = time.perf_counter()
        results = list(self._pool.map(self._one, requests))
        self.stats.calls += 1
        self.stats.requests += len(requests)
        self.stats.prompt_tokens += sum(len(r.prompt_ids) * r.n for r in requests)
        self.stats.generated_tokens += sum(len(c.token_ids) for cs in results for c in cs)
        self.stats.seconds += time.perf_counter() - start
        self._read_cache_counters()
        return results

    def _one(self, request: GenerationRequest) -> list[Completion]:
        p = request.params
        payload = {
            "model": SERVED_NAME,
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
        body = self.sidecar.request("/v1/completions", payload)
        choices = sorted(body["choices"], key=lambda c: c["index"])
        if len(choices) != request.n:
            raise SidecarError(f"asked for n={request.n} samples, the server returned {len(choices)}")
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

    def _read_cache_counters(self) -> None:
        counters = self.sidecar.prefix_cache_counters()
        if counters is not None:
            queries, hits = counters
            self.stats.extra["server_prefix_cache_queries"] = queries
            self.stats.extra["server_prefix_cache_hits"] = hits
            self.stats.cached_prompt_tokens = int(hits)
            self.stats.prefill_tokens = int(max(queries - hits, 0))

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
    """A vLLM server beside the trainer (CPU: the `vllm-cpu` package; GPU: `vllm`).

    Args:
        url: attach to this running server (e.g. "http://127.0.0.1:8000") instead of launching.
        python: the interpreter with vLLM installed (default: this one).
        dtype: weights dtype on the server ("float32" matches the trainer's CPU log-probs).
        max_model_len: context length of the server.
        max_num_seqs: sequences the server decodes together.
        kv_cache_gb: KV cache memory (CPU: VLLM_CPU_KVCACHE_SPACE).
        extra_args: more server flags (e.g. ["--tensor-parallel-size", "2"]).
        startup_timeout: seconds to wait for /health.
        request_timeout: seconds before one request counts as failed.
        max_retries: attempts per request; a launched server that died is restarted first.
        max_concurrency: requests in flight at once.
        logprob_tolerance: largest |server - trainer| log-prob allowed by the probe after a sync.
        log_dir: where the server's log goes (default: a temporary folder).
        send_seeds: pass each request's seed to the server (reproducible samples). Default:
            on with CUDA, off on CPU, where vllm-cpu 0.32 crashes its worker ("CPU Generator
            does not use offset") once many seeded requests share a batch.
    """

    def __init__(
        self,
        url: str | None = None,
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
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.attached = url is not None
        self.python = python or sys.executable
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
        self.process: subprocess.Popen | None = None
        self.staging: Path | None = None
        self.weight_version = 0
        self.restarts = 0
        self._generator: VLLMGenerator | None = None
        self._tokenizer = None
        self._restart_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def build(self, model: Any, tokenizer: Any) -> VLLMGenerator:
        self._tokenizer = tokenizer
        if not self.attached:
            self.staging = Path(tempfile.mkdtemp(prefix="flywheel-vllm-weights-"))
            model.save_pretrained(self.staging, safe_serialization=True)
            tokenizer.save_pretrained(self.staging)
            self._launch()
        self._wait_healthy()
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self._generator = VLLMGenerator(self, eos)
        return self._generator

    def _launch(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        folder = self.log_dir or Path(tempfile.mkdtemp(prefix="flywheel-vllm-log-"))
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "vllm_server.log"
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.staging),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
            "--max-logprobs", "20", "--enable-prefix-caching", "--seed", "0", *self.extra_args,
        ]
        if not torch.cuda.is_available():
            cmd.append("--enforce-eager")
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
               "VLLM_CPU_KVCACHE_SPACE": str(max(1, int(self.kv_cache_gb)))}
        log.info("starting the vLLM sidecar on %s (log: %s)", self.url, self.log_path)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        atexit.register(self.close)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise SidecarError(f"the vLLM server exited with code {self.process.returncode} while starting; "
                                   f"see {self.log_path}")
            try:
                _get(f"{self.url}/health", timeout=5)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(1.0)
        raise SidecarError(f"the vLLM server at {self.url} was not healthy after {self.startup_timeout:.0f} s"
                           + (f"; see {self.log_path}" if self.process else ""))

    def close(self) -> None:
        """Stop the launched server (its whole process group) and the request threads."""
        if self._generator is not None:
            self._generator.close()
        self._stop_process()

    def _stop_process(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        # The server's engine and worker processes share its process group: none may outlive it.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if process.poll() is None:
            process.wait(timeout=30)

    def _restart(self) -> None:
        if self.attached:
            raise SidecarError(f"the vLLM server at {self.url} is unreachable and was not started by flywheel")
        self.restarts += 1
        log.warning("restarting the vLLM sidecar (restart %d)", self.restarts)
        self._stop_process()
        self._launch()
        self._wait_healthy()

    # ------------------------------------------------------------------ requests
    def request(self, path: str, payload: dict | None) -> Any:
        """POST with bounded retries; a launched server that died is restarted in between."""
        last: Exception | None = None
        for attempt in range(self.max_retries):
            seen_restarts = self.restarts
            try:
                return _post(f"{self.url}{path}", payload, timeout=self.request_timeout)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
                last = err
                log.warning("vLLM request %s failed (attempt %d/%d): %s", path, attempt + 1, self.max_retries, err)
                with self._restart_lock:  # concurrent requests fail together; restart once
                    died = self.process is not None and self.process.poll() is not None
                    if died and self.restarts == seen_restarts:
                        self._restart()
                if self.restarts == seen_restarts:
                    time.sleep(min(2.0**attempt, 10.0))
        raise SidecarError(f"vLLM request {path} failed {self.max_retries} times: {last}")

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """(queries, hits) of the server's prefix cache, in tokens, from /metrics."""
        try:
            text = _get(f"{self.url}/metrics", timeout=10).decode()
        except (urllib.error.URLError, OSError):
            return None
        values = {}
        for line in text.splitlines():
            for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                if line.startswith(name):
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        if len(values) < 2:
            return None
        return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]

    # ------------------------------------------------------------------ weights
    def sync_weights(self, model: Any, version: int) -> None:
        """Push `model`'s weights to the server, then check its log-probs against the trainer's."""
        if self.staging is None:
            self.staging = Path(tempfile.mkdtemp(prefix="flywheel-vllm-weights-"))
        from safetensors.torch import save_file

        # Every tensor under its own name and storage: with tied embeddings the LM head must be
        # written too (vLLM's in-place reload does not re-tie it, and would keep the old head).
        state = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
        tmp = self.staging / "model.safetensors.tmp"
        save_file(state, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, self.staging / "model.safetensors")
        self.request("/pause?mode=wait", None)
        try:
            self.request("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(self.staging)}})
            self.request("/reset_prefix_cache", None)
        finally:
            self.request("/resume", None)
        self.weight_version = version
        self.probe(model)

    @torch.no_grad()
    def probe(self, model: Any, prompt: Sequence[int] | None = None, tokens: int = 8) -> float:
        """Greedy-sample a few tokens on the server and compare their log-probs with the
        trainer's; raise SidecarError when they differ by more than `logprob_tolerance`."""
        if prompt is None:
            prompt = self._tokenizer("1 2 3|6\n")["input_ids"]
        payload = {"model": SERVED_NAME, "prompt": list(prompt), "max_tokens": tokens, "temperature": 0.0,
                   "logprobs": 1, "return_token_ids": True, "skip_special_tokens": False}
        choice = self.request("/v1/completions", payload)["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        served = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        sequence = torch.tensor([list(prompt) + ids], device=next(model.parameters()).device)
        was_training = model.training
        model.eval()
        logits = model(input_ids=sequence).logits[0, len(prompt) - 1 : -1].float()
        model.train(was_training)
        trainer = logits.log_softmax(-1).gather(1, sequence[0, len(prompt):, None]).squeeze(1).tolist()
        gap = max((abs(a - b) for a, b in zip(served, trainer)), default=0.0)
        if gap > self.logprob_tolerance:
            raise SidecarError(
                f"after weight sync {self.weight_version} the server's log-probs differ from the trainer's by {gap:.2e} "
                f"(tolerance {self.logprob_tolerance:g}): the server is not sampling from the trained policy"
            )
        return gap
