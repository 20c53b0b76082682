"""Deterministic fake Generators for tests and benchmarks (no model, near-zero cost).

- `ScriptedGenerator`: returns exactly the completions scripted for each prefix; for
  hand-worked trees.
- `HashGenerator`: derives every completion from a hash of (request seed, sample index),
  picking from precomputed pools, so thousands of expansions cost almost nothing. It uses
  a tiny vocabulary with a matching `toy_decode` and `toy_score`:
  id 0 = BOS, 1 = EOS, 2 = a correct answer "C", 3 = a wrong answer "W",
  4 = newline (the step delimiter), 5.. = filler "x".
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from flywheel.generation.base import Completion, GenerationRequest, GenerationStats
from flywheel.rewards import Verdict

BOS, EOS, CORRECT, WRONG, NEWLINE, FILLER = 0, 1, 2, 3, 4, 5
_CHARS = {BOS: "", EOS: "", CORRECT: "C", WRONG: "W", NEWLINE: "\n"}


_TABLE = bytes(ord(_CHARS.get(i, "x") or "x") for i in range(256))


def toy_decode(ids: Sequence[int]) -> str:
    """Text of the toy vocabulary: C / W answers, newlines, x for filler, nothing for BOS/EOS."""
    try:  # fast path (benchmarks decode long responses): every id < 256
        return bytes(ids).translate(_TABLE, b"\x00\x01").decode("ascii")
    except ValueError:
        return "".join(_CHARS.get(t, "x") for t in ids)


def toy_score(text: str, truncated: bool = False) -> Verdict:
    """The last answer letter decides: C correct (+1), W wrong (-1), none = no answer (-1);
    the same whether or not the response was `truncated`."""
    last = max(text.rfind("C"), text.rfind("W"))
    if last < 0:
        return Verdict(correct=False, reward=-1.0, answer=None, reason="no_answer")
    if text[last] == "C":
        return Verdict(correct=True, reward=1.0, answer="C", reason="correct")
    return Verdict(correct=False, reward=-1.0, answer="W", reason="wrong_value")


def _account(stats: GenerationStats, requests: Sequence[GenerationRequest], out: list[list[Completion]]) -> None:
    stats.calls += 1
    stats.requests += len(requests)
    for request, comps in zip(requests, out):
        stats.prompt_tokens += len(request.prompt_ids) * request.n
        stats.generated_tokens += sum(len(c.token_ids) for c in comps)


class ScriptedGenerator:
    """Returns `script[prompt_ids][:n]` for each request; records every call.

    A missing prefix raises KeyError naming it, so a test fails loudly when the search asks
    for an expansion the script did not foresee.
    """

    def __init__(self, script: Mapping[tuple[int, ...], Sequence[Completion]]) -> None:
        self.script = {tuple(k): list(v) for k, v in script.items()}
        self.calls: list[list[GenerationRequest]] = []
        self.stats = GenerationStats()

    def sample(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        self.calls.append(list(requests))
        out = []
        for request in requests:
            if request.prompt_ids not in self.script:
                raise KeyError(f"no scripted completions for prefix {request.prompt_ids}")
            comps = self.script[request.prompt_ids]
            if len(comps) < request.n:
                raise KeyError(f"prefix {request.prompt_ids}: {len(comps)} scripted completions, {request.n} requested")
            out.append(list(comps[: request.n]))
        _account(self.stats, requests, out)
        return out


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class HashGenerator:
    """Pseudo-random completions that are a pure function of (request seed or prefix, sample index).

    Each sample ends with EOS with probability `eos_prob` (then its last content token is
    CORRECT with probability `correct_prob`, else WRONG); otherwise it is a full step: a
    fixed chunk of max_new_tokens filler tokens ("length"), or, when the request has stop
    strings, filler up to a NEWLINE ("stop") of random length <= max_new_tokens. Log-probs
    are drawn from [-3, 0); `nan_prob` replaces a whole step's log-probs by NaN.
    Completions come from precomputed pools, so a call costs about a microsecond per sample.
    """

    def __init__(
        self,
        eos_prob: float = 0.1,
        correct_prob: float = 0.3,
        *,
        pool_size: int = 64,
        nan_prob: float = 0.0,
        salt: int = 0,
    ) -> None:
        self.eos_prob = eos_prob
        self.correct_prob = correct_prob
        self.pool_size = pool_size
        self.nan_prob = nan_prob
        self.salt = salt
        self.stats = GenerationStats()
        self._pools: dict[tuple[int, bool, bool], list[Completion]] = {}

    def _pool(self, max_tokens: int, delimited: bool, entropies: bool) -> list[Completion]:
        key = (max_tokens, delimited, entropies)
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        pool = []
        for i in range(self.pool_size):
            h = _mix64(self.salt * 7919 + i)
            length = max_tokens if not delimited else 1 + h % max_tokens
            tokens = [FILLER + (h >> (k % 48)) % 3 for k in range(length)]
            finish = "length"
            if delimited and length < max_tokens or (delimited and h & 1):
                tokens[-1] = NEWLINE
                finish = "stop"
            logprobs = tuple(-3.0 * (_mix64(h + k) % 1000) / 1000.0 for k in range(length))
            ent = tuple(-lp for lp in logprobs) if entropies else None
            pool.append(Completion(tuple(tokens), logprobs, finish, ent))  # type: ignore[arg-type]
        self._pools[key] = pool
        return pool

    def _sample(self, request: GenerationRequest, j: int) -> Completion:
        params = request.params
        base = request.seed if request.seed is not None else hash(request.prompt_ids)
        h = _mix64(_mix64(base * 1_000_003 + self.salt) + j)
        pool = self._pool(params.max_new_tokens, bool(params.stop_strings), params.top_logprobs > 0)
        comp = pool[(h >> 20) % len(pool)]
        u_eos = (h & 0xFFFF) / 65536.0
        u_nan = ((h >> 52) & 0xFFF) / 4096.0
        if u_eos < self.eos_prob:
            answer = CORRECT if ((h >> 36) & 0xFFFF) / 65536.0 < self.correct_prob else WRONG
            body = comp.token_ids[: max(params.max_new_tokens - 2, 0)]
            tokens = (*body, answer, EOS)[-params.max_new_tokens :]
            logprobs = comp.logprobs[: len(tokens) - 2] + (-0.5, -0.1)
            logprobs = logprobs[-len(tokens) :]
            ent = tuple(-lp for lp in logprobs) if comp.entropies is not None else None
            comp = Completion(tuple(tokens), tuple(logprobs), "eos", ent)
        if u_nan < self.nan_prob:
            comp = Completion(comp.token_ids, (math.nan,) * len(comp.token_ids), comp.finish_reason, comp.entropies)
        return comp

    def sample(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        out = [[self._sample(r, j) for j in range(r.n)] for r in requests]
        _account(self.stats, requests, out)
        return out
