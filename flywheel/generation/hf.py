"""`HFGenerator`: the Generator seam on an in-process transformers model (the CPU default).

The model is the trainer's own module (shared, never copied), so the generator always
samples from the current weights and needs no weight sync; with `dtype="bfloat16"` (the
"auto" default of the in-process backend for a real model on a CPU with native bf16) it
samples from a bf16 copy that follows those weights (flywheel.generation.precision). Decoding is a hand-written
KV-cache loop (`flywheel.generation.decode_loop`) rather than `model.generate`, for three reasons:
  * prefix reuse: each distinct prompt is prefilled once and its cache is replicated for
    its n samples; with `prefix_cache_mb`, the KV of every unfinished completion (a search
    node) is kept across calls, so expanding that node next round computes only the new
    tokens (`stats.prefill_tokens` vs `stats.prompt_tokens` shows the saving);
  * per-row sampling parameters, stop rules and seeds inside one batch;
  * the records the objective needs: raw log-probs and entropies of every sampled token.
The KV cache of a chunk is `flywheel.generation.kv_cache.BlockCache`: contiguous buffers that
grow a block of columns at a time and drop finished rows by moving only the rows they must.
Decode passes of Llama and Qwen2 models run as plain torch calls
(`flywheel.generation.lean_decode`): the model's own logits without transformers' per-call
machinery; other models decode through `model(...)`. In float32 on CPU those passes keep each
prompt's KV once instead of copying it to its n rows, and attend with a small C kernel that
reads only the columns each row sees (`flywheel.generation.prefix_attention`; the decode
loop's `SharedPromptKV`); where the kernel cannot be built, the prompts are replicated to
their rows (`ReplicatedKV`) and SDPA attends.

Conventions (the Completion contract of `flywheel.generation.base`):
  * EOS is kept: a completion that ends with "eos" has the EOS id as its last token, with
    its log-prob, so the trainer scores exactly the tokens the policy emitted and the
    search can treat the node as terminal. Stop tokens ("stop") are kept the same way.
  * `logprobs[i] = log_softmax(raw_logits)[token_ids[i]]` in fp32: temperature 1, no top-p
    truncation (the behaviour log-prob of the importance ratio), even for greedy rows.
  * `entropies[i]` (when `params.top_logprobs > 0`) is the Shannon entropy, in nats, of
    the same raw distribution, from the full logits. It equals the entropy of the
    distribution the token was drawn from at the DeepSearch settings (T = 1, top_p = 1),
    stays informative for greedy rows (where the drawn-from distribution is a point mass),
    and matches what the vLLM backend can compute from raw top-k log-probs.
  * Stop strings are matched in the decoded continuation (never the prompt). The token
    that completes a stop string ends the completion and is kept (it holds the stop text),
    so the text may run past the stop string when that token's text does.
  * Sampling noise: every sample gets its uniforms drawn up front from a CPU
    `torch.Generator` (the request's `seed`, or the generator-level stream advanced every
    call when `seed` is None) and picks its token by inverse CDF. A seeded request's
    samples therefore depend only on its own seed, prompt and params (up to float noise
    from batch composition), and identical calls give identical outputs. Two requests
    with the same prompt and seed get the same samples: give siblings distinct seeds.
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from flywheel.generation import prefix_attention
from flywheel.generation.decode_loop import ReplicatedKV, SharedPromptKV, decode_rows
from flywheel.generation.decoding import StopRules, StopStrings
from flywheel.generation.kv_cache import block_cache, uses_block_cache
from flywheel.generation.lean_decode import SUPPORTED, lean_decoder
from flywheel.generation.precision import SamplingWeights, resolve_dtype
from flywheel.generation.prefix_cache import PrefixCache, left_padded
from flywheel.generation.base import (
    PREFIX_CACHE_MB,
    Completion,
    GenerationRequest,
    GenerationStats,
    SamplingParams,
)

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class _Row:
    """One sample to decode: which request and sample it is, and its sampling noise."""

    request: int
    sample: int
    prompt: tuple[int, ...]
    params: SamplingParams
    uniforms: torch.Tensor  # [params.max_new_tokens], CPU
    n: int = 1
    """The request's sample count (`params.distinct_first_token` ranks its rows' first tokens)."""
    noise_seed: int = 0
    """Seed of the request's Gumbel noise over the first token (`distinct_first_token` only)."""



class HFGenerator:
    """Batched sampling from a live transformers causal LM (see the module docstring).

    Args:
        model: the policy, shared with the trainer (not copied). Put in eval mode for each
            call and restored to its previous mode afterwards; run under `torch.no_grad`.
        tokenizer: gives the EOS and pad ids and decodes continuations for stop strings.
        max_batch_size: most sequences decoded together; larger calls run in chunks of
            this many samples (identical prompts in a chunk are prefilled once).
        eos_token_id: id(s) that end a completion with reason "eos". Default: the
            tokenizer's EOS plus the model generation config's EOS ids.
        seed: seed of the generator-level RNG stream used by requests with `seed=None`;
            the stream advances with every call.
        compact_fraction: drop finished rows from the batch (and its KV cache) once at
            least this fraction of the rows in it has finished. 0 compacts whenever a row
            finishes; values above 1 never compact (finished rows ride along, masked).
        prefix_cache_mb: memory for KV caches kept across calls (least recently used
            first out): the KV of each completion that stopped without EOS, keyed by its
            tokens, reused by any later prompt that extends it. Dropped whenever the
            model's weights change (an optimizer step). 0 = off. Default `PREFIX_CACHE_MB`,
            which is also `--data.generator.init_args.prefix_cache_mb`'s.
        dtype: what the generator samples in (flywheel.generation.precision): "float32",
            "bfloat16" (a copy of the policy in that dtype, following its weights, when the
            policy has another) or "auto" (bf16 for a real model on a CPU with native bf16).
            Default "float32": the policy's weights as they are, in fp32.
        dtype_flag: the running command's flag of `dtype`, for its messages.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any,
        max_batch_size: int = 512,
        eos_token_id: int | Sequence[int] | None = None,
        seed: int = 0,
        compact_fraction: float = 0.25,
        prefix_cache_mb: float = PREFIX_CACHE_MB,
        dtype: str = "float32",
        dtype_flag: str = "--data.generator.init_args.dtype",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if compact_fraction < 0:
            raise ValueError(f"compact_fraction must be >= 0, got {compact_fraction}")
        self.model = model
        self.weights = SamplingWeights(model, resolve_dtype(model, dtype, dtype_flag))
        self.sampler = model
        """The model this call samples from: `model`, or its copy in the sampling dtype."""
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.compact_fraction = compact_fraction
        self.seed = seed
        self.stats = GenerationStats()
        self._rng = torch.Generator().manual_seed(seed)
        self.eos_token_ids = self._resolve_eos(eos_token_id)
        self.pad_token_id = self._resolve_pad()
        forward_args = inspect.signature(model.forward).parameters
        # transformers 5.24 names the KV-cache argument `cache` (`past_key_values` is
        # deprecated there); older 5.x releases only know `past_key_values`.
        self._cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in forward_args
        self._stop_strings: dict[tuple[str, ...], StopStrings] = {}
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = "auto",
        **kwargs: Any,
    ) -> HFGenerator:
        """Load tokenizer and model from a directory (or hub id); `kwargs` go to `__init__`."""
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        return cls(model, tokenizer, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The generator-level RNG stream (for requests with `seed=None`), for exact resume."""
        return {"rng_state": self._rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.set_state(state["rng_state"])

    # -- configuration helpers -------------------------------------------------------------

    def _resolve_eos(self, override: int | Sequence[int] | None) -> tuple[int, ...]:
        if override is not None:
            ids = [override] if isinstance(override, int) else list(override)
        else:
            ids = [self.tokenizer.eos_token_id]
            gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
            ids += [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        ids = sorted({i for i in ids if i is not None})
        if not ids:
            raise ValueError(
                "no EOS id: the tokenizer has no eos_token and the model's generation config "
                "none either; pass eos_token_id=..."
            )
        return tuple(ids)

    def _resolve_pad(self) -> int:
        # Pad positions are masked out, so any valid id works; prefer the real pad id.
        pad = self.tokenizer.pad_token_id
        return self.eos_token_ids[0] if pad is None else int(pad)

    # -- the seam ----------------------------------------------------------------------------

    def sample(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """`result[i]` holds `requests[i].n` completions of `requests[i].prompt_ids`, in order."""
        start = time.perf_counter()
        self._validate(requests)
        if self.prefix_cache is not None:
            self.prefix_cache.follow_weights(self.model)
        self.sampler = self.weights.current()
        rows = self._rows(requests)
        row_budget = min(self.max_batch_size, len(rows))  # rows this call could decode at once
        # Sorting by prompt puts identical prompts side by side (one prefill for all of
        # them) and similar lengths in the same chunk (little padding).
        order = sorted(range(len(rows)), key=lambda i: (len(rows[i].prompt), rows[i].prompt, i))
        results: list[list[Completion | None]] = [[None] * r.n for r in requests]
        # Restore each submodule's own mode: the trainer may keep some parts in eval.
        modes = [(m, m.training) for m in self.sampler.modules()]
        self.sampler.eval()
        try:
            with torch.no_grad():
                for chunk in self._chunks(rows, order):
                    for row, completion in zip(chunk, self._decode(chunk, row_budget)):
                        results[row.request][row.sample] = completion
        finally:
            for module, training in modes:
                module.training = training
        prompt_tokens = sum(len(r.prompt_ids) * r.n for r in requests)
        self.stats.calls += 1
        self.stats.requests += len(requests)
        self.stats.prompt_tokens += prompt_tokens
        self.stats.generated_tokens += sum(len(c.token_ids) for cs in results for c in cs)
        seconds = time.perf_counter() - start
        self.stats.seconds += seconds
        logger.debug(
            "sampled %d requests / %d rows in %.3f s (%d chunks)",
            len(requests), len(rows), seconds, -(-len(rows) // self.max_batch_size),
        )
        return results  # type: ignore[return-value]  # every slot is filled above

    def _validate(self, requests: Sequence[GenerationRequest]) -> None:
        vocab = self.model.config.get_text_config().vocab_size
        limit = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        for i, r in enumerate(requests):
            bad = [t for t in (*r.prompt_ids, *r.params.stop_token_ids) if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"request {i}: token ids {bad[:5]} outside the vocabulary [0, {vocab})"
                )
            if limit is not None and len(r.prompt_ids) + r.params.max_new_tokens > limit:
                raise ValueError(
                    f"request {i}: prompt ({len(r.prompt_ids)} tokens) + max_new_tokens "
                    f"({r.params.max_new_tokens}) exceeds the model's max_position_embeddings "
                    f"({limit}); lower max_new_tokens or use a model with longer positions"
                )

    def _rows(self, requests: Sequence[GenerationRequest]) -> list[_Row]:
        rows = []
        for i, r in enumerate(requests):
            rng = self._rng if r.seed is None else torch.Generator().manual_seed(r.seed)
            uniforms = torch.rand(r.n, r.params.max_new_tokens, generator=rng)  # [n, T]
            # drawn after the uniforms, so a request without the switch samples as before
            noise_seed = int(torch.randint(2**62, (1,), generator=rng)) if r.params.distinct_first_token else 0
            rows += [_Row(i, j, r.prompt_ids, r.params, uniforms[j], r.n, noise_seed) for j in range(r.n)]
        return rows

    def _chunks(self, rows: list[_Row], order: list[int]) -> list[list[_Row]]:
        """`order`'s rows in chunks of at most `max_batch_size`; a request with
        `distinct_first_token` is not split between two chunks (its rows rank one first-token
        draw, flywheel.generation.distinct_first) unless it alone is larger than a chunk."""
        chunks: list[list[_Row]] = [[]]
        for k, i in enumerate(order):
            row = rows[i]
            starts_group = row.params.distinct_first_token and (k == 0 or rows[order[k - 1]].request != row.request)
            full = len(chunks[-1]) >= self.max_batch_size
            if full or (starts_group and chunks[-1] and len(chunks[-1]) + row.n > self.max_batch_size):
                chunks.append([])
            chunks[-1].append(row)
        return chunks if chunks[0] else []

    def _stop_matcher(self, strings: tuple[str, ...], vocab: int) -> StopStrings:
        if strings not in self._stop_strings:
            self._stop_strings[strings] = StopStrings(self.tokenizer, strings, vocab)
        return self._stop_strings[strings]

    def _forward(self, ids, attention_mask, position_ids, cache, last_only: bool) -> torch.Tensor:
        """One model call; returns fp32 logits of the last position, [B, V]."""
        kwargs = {self._cache_kwarg: cache}
        if last_only and type(self.sampler) in SUPPORTED:
            # The same arithmetic as the model's forward with logits_to_keep=1, but the output
            # layer reads a contiguous copy of the last position: on CPU, `linear` on that
            # strided slice takes 8x longer in fp32 and 800x in bf16 (it expands the weight to
            # every row) than on the copy (576 x 49,152 head, 64 rows: 176 ms and 4.5 s against
            # 22 ms and 6 ms).
            hidden = self.sampler.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                                        use_cache=True, **kwargs).last_hidden_state
            return self.sampler.lm_head(hidden[:, -1].contiguous()).float()
        if last_only and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.sampler(
            input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=True, **kwargs,
        )
        return out.logits[:, -1].float()

    # -- the decoding loop -------------------------------------------------------------------

    def _prefill(self, rows: list[_Row], share: bool = False) -> tuple[Any, ...]:
        """Prefill each distinct prompt of the chunk once, then replicate it to its rows.

        A prompt that extends a sequence in the prefix cache starts from that sequence's KV
        and computes only the rest. Layout per prompt: [pad | cached | pad | new], every
        part left-padded to the chunk's widest, the pads masked out; positions count real
        tokens only, so they are 0..len-1 whatever the padding.

        Returns the cache (batch = rows), the last-position logits [R, V] and the prompt
        attention mask [R, W]; with `share`, the cache and the mask stay one per distinct
        prompt ([U, ...], [U, W]) and each row's prompt [R] comes fourth.
        """
        device = self.sampler.device
        unique: dict[tuple[int, ...], int] = {}
        row_prompt = torch.tensor([unique.setdefault(r.prompt, len(unique)) for r in rows])
        prompts = list(unique)
        hits = [self.prefix_cache.longest(p) if self.prefix_cache is not None else (0, None) for p in prompts]
        cached_width = max(c for c, _ in hits)
        new_width = max(len(p) - c for p, (c, _) in zip(prompts, hits))
        u = len(prompts)
        ids = torch.full((u, new_width), self.pad_token_id, dtype=torch.long)  # [U, N]
        mask = torch.zeros((u, cached_width + new_width), dtype=torch.long)  # [U, C + N]
        start = torch.zeros(u, dtype=torch.long)
        for i, (prompt, (c, _)) in enumerate(zip(prompts, hits)):
            fresh = prompt[c:]
            ids[i, new_width - len(fresh) :] = torch.tensor(fresh)
            mask[i, cached_width - c : cached_width] = 1
            mask[i, cached_width + new_width - len(fresh) :] = 1
            start[i] = c
        new_mask = mask[:, cached_width:]
        positions = (start[:, None] + new_mask.cumsum(-1) - 1).clamp(min=0)  # pads get any value; masked
        cache = block_cache(self.sampler.config)
        if cached_width:
            for layer, (keys, values) in enumerate(left_padded([kv for _, kv in hits], [c for c, _ in hits], cached_width)):
                cache.update(keys.to(device), values.to(device), layer)
        logits = self._forward(
            ids.to(device), mask.to(device), positions.to(device), cache, last_only=True
        )  # [U, V]
        computed = int(new_mask.sum())
        self.stats.prefill_tokens += computed
        self.stats.cached_prompt_tokens += sum(len(r.prompt) for r in rows) - computed
        self.stats.add(prefill_padded_tokens=ids.numel())
        if cached_width:
            self.stats.add(prefix_cache_hit_tokens=sum(c for c, _ in hits))

        row_prompt = row_prompt.to(device)
        if share:
            return cache, logits[row_prompt], mask.to(device), row_prompt
        cache.batch_select_indices(row_prompt)  # gather with repeats: [U, ...] -> [R, ...]
        return cache, logits[row_prompt], mask.to(device)[row_prompt]

    def _decode(self, rows: list[_Row], row_budget: int) -> list[Completion]:
        """Decode one chunk of rows together (flywheel.generation.decode_loop); returns their
        completions in row order. `row_budget`: the rows the call could decode at once (its
        sparse passes are counted against half of it). The prompts' KV is kept once where the lean pass and the
        prefix-attention kernel serve the model, else replicated to the rows."""
        lean = lean_decoder(self.sampler) if uses_block_cache(self.sampler.config) else None
        if lean is not None and prefix_attention.usable(self.sampler):
            prompt_cache, logits, prompt_mask, row_prompt = self._prefill(rows, share=True)
            kv = SharedPromptKV(prompt_cache, prompt_mask, row_prompt, lean)
        else:
            cache, logits, prompt_mask = self._prefill(rows)
            horizon = max(r.params.max_new_tokens for r in rows)
            kv = ReplicatedKV(cache, prompt_mask, horizon, lean, partial(self._forward, last_only=False))
        vocab = self.model.config.get_text_config().vocab_size
        rules = StopRules(rows, self.eos_token_ids, vocab, self._stop_matcher, self.sampler.device)
        return decode_rows(rows, logits, kv, rules=rules, tokenizer=self.tokenizer, compact_fraction=self.compact_fraction,
                           prefix_cache=self.prefix_cache, stats=self.stats, row_budget=row_budget)
