"""The Generator seam: batched sampling of continuations from token-id prefixes.

Every backend (in-process transformers, the vLLM sidecar) implements `Generator.sample`.
The search and the data module only ever see these records, never a model or a socket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, Sequence, runtime_checkable

FinishReason = Literal["eos", "stop", "length"]
"""Why a completion ended: it emitted EOS ("eos"), it produced a stop token or stop string
("stop", e.g. the step delimiter; the stop text is included in the completion), or it hit
`max_new_tokens` ("length")."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Defaults are the DeepSearch expansion settings (T = 1.0, top_p = 1.0)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    top_logprobs: int = 0
    """Also return, per sampled token, the entropy of the sampling distribution computed
    from this many top log-probs (0 = off; backends with full logits use all of them)."""
    distinct_first_token: bool = False
    """The request's n samples start with n different tokens: the first token is drawn
    without replacement (Gumbel-top-k over the first token's distribution after temperature
    and top-p; Kool et al. 2019), the rest as usual. Where that distribution has fewer than n
    tokens, the samples past them draw their first token with replacement. `logprobs` stay
    the policy's (see Completion): the n first tokens together are not n independent draws
    from it, a bias the trainer does not correct (docs/search.md, "Distinct children").
    Backends that cannot sample this way refuse the request."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.temperature < math.inf:  # NaN fails too (issue 37)
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class GenerationRequest:
    """Sample `n` continuations of one prefix.

    `affinity` groups requests that share a long prefix (the nodes of one tree): a backend
    with several servers sends a group to one of them, so that server's prefix cache holds
    the shared part. None = no preference.
    """

    prompt_ids: tuple[int, ...]
    n: int
    params: SamplingParams
    seed: int | None = None
    affinity: int | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty (a prompt starts with at least BOS)")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")


@dataclass(frozen=True)
class Completion:
    """One sampled continuation.

    `logprobs[i]` is the behaviour policy's log-probability of `token_ids[i]` under the
    untempered distribution (temperature 1, no top-p truncation), which is what the
    objective's importance ratio needs. `entropies[i]`, when requested, is the Shannon
    entropy of the distribution the token was drawn from.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    entropies: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError("logprobs must have one entry per token")
        if self.entropies is not None and len(self.entropies) != len(self.token_ids):
            raise ValueError("entropies must have one entry per token")


@dataclass
class GenerationStats:
    """Compute accounting, cumulative over a generator's life (logged under compute/)."""

    requests: int = 0
    calls: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    """Prompt tokens as submitted (naive prefill count: every sample re-reads its prefix)."""
    prefill_tokens: int = 0
    """Prompt tokens actually computed (after prefix sharing / caching)."""
    cached_prompt_tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    live: Callable[[int, int], None] | None = field(default=None, repr=False, compare=False)
    """Set by a progress bar for the length of its work: the backend calls it during `sample`
    with (tokens generated, samples finished) since its last call, per decode step in process,
    per finished request from a server; a long call moves its bar before it returns."""

    def tick(self, tokens: int, finished: int) -> None:
        """Report progress to `live`, if a bar listens."""
        if self.live is not None:
            self.live(tokens, finished)

    def add(self, **counts: float) -> None:
        """Add to the backend's own counters in `extra` (e.g. decode_passes=3)."""
        for key, value in counts.items():
            self.extra[key] = self.extra.get(key, 0.0) + float(value)

    def as_dict(self) -> dict[str, float]:
        out = {
            "requests": float(self.requests),
            "calls": float(self.calls),
            "generated_tokens": float(self.generated_tokens),
            "prompt_tokens": float(self.prompt_tokens),
            "prefill_tokens": float(self.prefill_tokens),
            "cached_prompt_tokens": float(self.cached_prompt_tokens),
            "seconds": self.seconds,
        }
        out.update(self.extra)
        return out


PREFIX_CACHE_MB = 256.0
"""Default memory of an in-process generator's prefix KV cache, in MB: the one default of
`HFGenerator(prefix_cache_mb=...)` and `--data.generator.init_args.prefix_cache_mb`."""

SamplingDtype = Literal["auto", "float32", "bfloat16"]
SAMPLING_DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16")
"""What an in-process generator may sample in (`--data.generator.init_args.dtype`;
flywheel.generation.precision decides "auto")."""


@runtime_checkable
class Generator(Protocol):
    """Batched sampling. `sample(requests)[i]` holds `requests[i].n` completions, in order.

    One call should carry as much work as possible: the search driver puts every pending
    expansion of every live tree into a single call.
    """

    stats: GenerationStats

    def sample(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]: ...
