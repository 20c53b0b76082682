"""`VLLMGenerator`: the Generator seam over a sidecar's servers, one HTTP request per
GenerationRequest, sent concurrently so one search round fills the servers' batches.

Requests are token-id prompts to `/v1/completions` (n samples, stop strings / token ids,
sampled-token log-probs, top-k log-probs for entropies, per-request seeds). With several
servers the requests of one tree all go to the same server (`GenerationRequest.affinity`), so
its prefix cache holds the tree's shared prefixes, and the trees are spread evenly.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from itertools import count
from typing import Iterator, Sequence

from flywheel.generation.base import Completion, GenerationRequest, GenerationStats
from flywheel.generation.vllm.client import SidecarError
from flywheel.generation.vllm.server import Server


DISTINCT_REFUSAL = (
    "--data.search.distinct_children=true needs first tokens drawn without replacement, which the vLLM "
    "server's /v1/completions cannot do; use the in-process generator (--data.generator=HFBackend) or set "
    "--data.search.distinct_children=false"
)


def route(servers: Sequence[Server], requests: Sequence[GenerationRequest], round_robin: Iterator[int]) -> list[Server]:
    """The server of each request: by affinity (one tree, one server), else round-robin."""
    n = len(servers)
    return [servers[(r.affinity if r.affinity is not None else next(round_robin)) % n] for r in requests]


def prefix_cache_counters(servers: Sequence[Server]) -> tuple[float, float] | None:
    """(queries, hits) of all the servers' prefix caches together, in tokens."""
    counters = [c for c in (s.prefix_cache_counters() for s in servers) if c is not None]
    if not counters:
        return None
    return sum(q for q, _ in counters), sum(h for _, h in counters)


class VLLMGenerator:
    """Samples from `servers` (see the module docstring), `max_concurrency` requests in flight.

    Args:
        servers: the sidecar's servers (all of them serve the same weights).
        model_name: the served model to ask for (the base, or the LoRA adapter).
        eos_token_ids: tokens whose stop is an end of sequence.
        send_seeds: pass each request's seed to the server.
        max_concurrency: requests in flight at once, over all servers.
    """

    def __init__(self, servers: Sequence[Server], model_name: str, eos_token_ids: Sequence[int], send_seeds: bool,
                 max_concurrency: int) -> None:
        self.servers = list(servers)
        self.model_name = model_name
        self.eos_token_ids = frozenset(eos_token_ids)
        self.send_seeds = send_seeds
        self._stats = GenerationStats()
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency)
        self._round_robin = count()
        self._posts_counted: int | None = None

    @property
    def stats(self) -> GenerationStats:
        """Cumulative accounting. The servers' prefix-cache counters come from their /metrics
        pages, fetched when the stats are read and this process has sent requests since the
        last fetch (samples, syncs, probes: what moves the counters); a read with no traffic
        in between reuses the last numbers instead of another round of HTTP calls."""
        posts = sum(s.posts for s in self.servers)
        if posts != self._posts_counted:
            counters = prefix_cache_counters(self.servers)
            if counters is not None:
                self._posts_counted = posts
                queries, hits = counters
                self._stats.extra["server_prefix_cache_queries"] = queries
                self._stats.extra["server_prefix_cache_hits"] = hits
                self._stats.cached_prompt_tokens = int(hits)
                self._stats.prefill_tokens = int(max(queries - hits, 0))
        return self._stats

    def sample(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if any(r.params.distinct_first_token for r in requests):
            raise ValueError(DISTINCT_REFUSAL)
        start = time.perf_counter()
        stats = self._stats
        futures = [self._pool.submit(self._one, r, s) for r, s in zip(requests, route(self.servers, requests, self._round_robin))]
        for done in as_completed(futures):  # a listening bar moves per finished request
            if done.exception() is None:
                stats.tick(sum(len(c.token_ids) for c in done.result()), len(done.result()))
        results = [f.result() for f in futures]
        stats.calls += 1
        stats.requests += len(requests)
        stats.prompt_tokens += sum(len(r.prompt_ids) * r.n for r in requests)
        stats.generated_tokens += sum(len(c.token_ids) for cs in results for c in cs)
        stats.seconds += time.perf_counter() - start
        return results

    def _one(self, request: GenerationRequest, server: Server) -> list[Completion]:
        p = request.params
        payload = {
            "model": self.model_name,
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
        if request.seed is not None and self.send_seeds:
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
