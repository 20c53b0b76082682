"""Continuous batching for the in-process generator (`HFGenerator.continuous()`).

`HFGenerator.sample` decodes a call's rows together until the last one finishes: in a tree
search, whose steps are short and of uneven length, the batch empties fast and its last
tokens are decoded a few rows at a time (on the quickstart's search the mean decode batch was
216 rows of 512). Here requests are submitted as tickets and join the running batch whenever
enough of its rows have finished: `step()` decodes until at least `compact_fraction` of the
batch has finished and a ticket is complete, drops the finished rows (their completions go to
their tickets) and returns the complete tickets; requests submitted meanwhile are prefilled
(prefix cache included) and merged into the batch at the next `step()`, their KV left-padded
to the batch's width.

Each sample draws its token from its own request's uniforms exactly as in `sample`, so a
seeded request gets the same samples up to float noise from a different batch composition
(the same caveat as `sample` across calls). flywheel.search.lockstep's continuous mode drives it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from flywheel.generation.base import Completion, GenerationRequest
from flywheel.generation.decoding import _ACTIVE, _LENGTH, _STOP, _Record, _StopRules
from flywheel.generation.hf import sample_tokens

if TYPE_CHECKING:
    from flywheel.generation.hf import HFGenerator, _Row


class ContinuousBatch:
    """One running decode batch of an HFGenerator that requests join as its rows finish."""

    def __init__(self, generator: HFGenerator) -> None:
        self.gen = generator
        self.device = generator.model.device
        self.vocab = generator.model.config.get_text_config().vocab_size
        self.pending: list[tuple[int, _Row]] = []
        self.outputs: dict[int, list[Completion | None]] = {}
        self.next_ticket = 0
        self.rows: list[_Row] = []
        self.tickets: list[int] = []

    @property
    def busy(self) -> bool:
        """Rows are decoding or waiting to join."""
        return bool(self.rows or self.pending)

    def submit(self, requests: Sequence[GenerationRequest]) -> list[int]:
        """Queue requests; returns one ticket per request (its completions come back from `step`)."""
        self.gen._validate(requests)
        base = self.next_ticket
        self.next_ticket += len(requests)
        for i, request in enumerate(requests):
            self.outputs[base + i] = [None] * request.n
        self.pending += [(base + row.request, row) for row in self.gen._rows(requests)]
        stats = self.gen.stats
        stats.requests += len(requests)
        stats.prompt_tokens += sum(len(r.prompt_ids) * r.n for r in requests)
        return list(range(base, base + len(requests)))

    def step(self) -> list[tuple[int, list[Completion]]]:
        """Admit the queued rows (up to `max_batch_size` in the batch), decode until some tickets
        are complete, and return them with their completions in sample order."""
        start = time.perf_counter()
        model = self.gen.model
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with torch.no_grad():
                if self.gen.prefix_cache is not None:
                    self.gen.prefix_cache.follow_weights(model)
                self._admit()
                done = self._decode() if self.rows else []
        finally:
            for module, training in modes:
                module.training = training
        stats = self.gen.stats
        stats.calls += 1
        stats.generated_tokens += sum(len(c.token_ids) for _, comps in done for c in comps)
        stats.seconds += time.perf_counter() - start
        return done

    # -- the batch ---------------------------------------------------------------------------

    def _admit(self) -> None:
        room = self.gen.max_batch_size - len(self.rows)
        if not self.pending or room <= 0:
            return
        admitted, self.pending = self.pending[:room], self.pending[room:]
        # Identical prompts side by side: one prefill each (as in `sample`).
        admitted.sort(key=lambda item: (len(item[1].prompt), item[1].prompt, item[0]))
        rows = [row for _, row in admitted]
        cache, logits, mask = self.gen._prefill(rows)
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            raise ValueError(
                "continuous batching needs a plain DynamicCache (every layer full attention); this model's cache "
                "has other layer kinds: search with the lock-step loop (continuous=False)"
            )
        fresh = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        if self.rows:
            self._merge(cache, logits, mask)
            carry, steps = torch.arange(len(self.rows), device=self.device), torch.cat([self.steps, fresh])
        else:
            self.cache, self.logits, self.mask = cache, logits, mask
            carry, steps = None, fresh
        self.rows += rows
        self.tickets += [ticket for ticket, _ in admitted]
        self._rebuild(steps, carry)

    def _merge(self, cache, logits, mask) -> None:
        """Append new rows (their prefill) to the running batch, both left-padded to one width."""
        width = max(self.mask.shape[1], mask.shape[1])

        def pad(x: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            missing = width - x.shape[-dim_from_end]
            return F.pad(x, [0, 0] * (dim_from_end - 1) + [missing, 0]) if missing else x

        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([pad(old.keys, 2), pad(new.keys, 2)])
            old.values = torch.cat([pad(old.values, 2), pad(new.values, 2)])
        self.mask = torch.cat([pad(self.mask, 1), pad(mask, 1)])
        self.logits = torch.cat([self.logits, logits])

    def _rebuild(self, steps: torch.Tensor, carry: torch.Tensor | None) -> None:
        """Per-row state of the batch in `self.rows` order; the first len(carry) rows continue
        old record rows `carry` (what they produced so far is copied)."""
        rows, device = self.rows, self.device
        horizon = max(r.params.max_new_tokens for r in rows)
        record = _Record(rows, horizon, device)
        if carry is not None:
            old = self.record
            width = min(old.tokens.shape[1], horizon)
            record.tokens[: len(carry), :width] = old.tokens[carry, :width]
            record.logprobs[: len(carry), :width] = old.logprobs[carry, :width]
            if record.entropies is not None and old.entropies is not None:
                record.entropies[: len(carry), :width] = old.entropies[carry, :width]
        self.record = record
        self.steps = steps
        self.active = torch.ones(len(rows), dtype=torch.bool, device=device)
        self.prompt_len = torch.tensor([len(r.prompt) for r in rows], device=device)
        self.temperature = torch.tensor([r.params.temperature for r in rows], device=device)
        self.top_p = torch.tensor([r.params.top_p for r in rows], device=device)
        uniforms = torch.zeros(len(rows), horizon)  # [B, T]
        for k, r in enumerate(rows):
            uniforms[k, : r.params.max_new_tokens] = r.uniforms
        self.uniforms = uniforms.to(device)
        self.rules = _StopRules(rows, self.gen.eos_token_ids, self.vocab, self.gen._stop_matcher, device)

    def _drop(self, keep: torch.Tensor) -> None:
        """Keep only the batch positions `keep` (the rows still decoding)."""
        idx = keep.tolist()
        self.rows = [self.rows[i] for i in idx]
        self.tickets = [self.tickets[i] for i in idx]
        if not idx:
            return
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        # Leading columns that are padding for every row left: drop them.
        first = int(self.mask.any(0).long().argmax())
        if first:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        self._rebuild(self.steps[keep], keep)

    def _decode(self) -> list[tuple[int, list[Completion]]]:
        """Decode until some tickets are complete and at least `compact_fraction` of the batch
        finished; drop the finished rows, feed the others their last token, return the tickets."""
        gen, device = self.gen, self.device
        done: list[tuple[int, list[Completion]]] = []
        while True:
            slots = torch.arange(len(self.rows), device=device)
            steps, record, active = self.steps, self.record, self.active
            new = sample_tokens(self.logits, self.temperature, self.top_p, self.uniforms[slots, steps])  # [B]
            record.add(steps, slots, active, new, self.logits)
            reason = self.rules.check(steps, slots, active, new, record.tokens, gen.tokenizer)  # [B]
            record.finish(steps, slots, reason)
            if gen.prefix_cache is not None:
                self._keep_kv(reason)
            active = active & (reason == _ACTIVE)
            self.active = active
            finished = (~active).nonzero().squeeze(1).tolist()
            dropped = len(finished) >= max(1.0, gen.compact_fraction * len(self.rows))
            if dropped:
                done += self._deliver(finished)
                keep = active.nonzero().squeeze(1)
                new = new[keep]
                self._drop(keep)
                if not self.rows:
                    return done
            # Feed the sampled tokens [B, 1] at position prompt + step; rows that finished
            # (fewer than the compaction threshold) ride along masked, as in `sample`.
            positions = (self.prompt_len + self.steps)[:, None]
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
            self.logits = gen._forward(new[:, None], self.mask, positions, self.cache, last_only=False)
            _bump(gen, "decode_row_steps", len(self.rows))
            self.steps = self.steps + self.active.long()
            if done:
                return done
            if dropped:
                self._admit()  # rows that did not fit before take the freed places

    def _deliver(self, finished: list[int]) -> list[tuple[int, list[Completion]]]:
        """File the finished rows' completions under their tickets; return the complete tickets."""
        complete = []
        for b, completion in zip(finished, self.record.completions(self.rows, finished)):
            ticket, row = self.tickets[b], self.rows[b]
            samples = self.outputs[ticket]
            samples[row.sample] = completion
            if all(c is not None for c in samples):
                complete.append((ticket, self.outputs.pop(ticket)))
        return complete

    def _keep_kv(self, reason: torch.Tensor) -> None:
        """As `HFGenerator._keep_kv`: the KV of rows that stopped without EOS, prompt + fed tokens."""
        ended = ((reason == _STOP) | (reason == _LENGTH)).nonzero().squeeze(1).tolist()
        for b in ended:
            row = self.rows[b]
            t = int(self.steps[b])
            columns = self.mask[b].nonzero().squeeze(1)
            key = row.prompt + tuple(self.record.tokens[b, :t].tolist())
            kv = [(layer.keys[b].index_select(1, columns), layer.values[b].index_select(1, columns))
                  for layer in self.cache.layers]
            self.gen.prefix_cache.put(key, kv)


def _bump(gen, key: str, value: float) -> None:
    gen.stats.extra[key] = gen.stats.extra.get(key, 0.0) + float(value)
