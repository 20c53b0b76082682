"""The per-step work of the in-process generator's decode loop (flywheel.generation.decode_loop):
sampling each row's token, the stop rules (EOS, stop tokens, stop strings, the length
limit), tested for a whole batch at once, and the record of what each row produced."""

from __future__ import annotations

from typing import Any

import torch

from flywheel.generation.base import Completion, FinishReason

ACTIVE, EOS, STOP, LENGTH = 0, 1, 2, 3
"""A row's finish code after a step ([B] long tensors): still decoding, or why it ended."""
_REASONS: dict[int, FinishReason] = {EOS: "eos", STOP: "stop", LENGTH: "length"}


def sample_tokens(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """Pick one token per row by inverse-CDF sampling with per-row settings.

    logits [B, V] raw fp32; temperature [B] (0 = greedy argmax); top_p [B] in (0, 1];
    uniforms [B] in [0, 1). Returns token ids [B]. Temperature is applied before top-p
    (the vLLM / HF order); nucleus = the fewest most-likely tokens whose mass reaches
    top_p (the most likely token is always kept). A row's token depends only on its own
    logits, settings and uniform, never on the other rows of the batch.
    """
    sampled = temperature > 0
    full = (sampled & (top_p >= 1)).nonzero().squeeze(1)
    nucleus = (sampled & (top_p < 1)).nonzero().squeeze(1)
    # Over a real vocabulary (49k-152k) every pass over [B, V] counts: the argmax only for
    # greedy rows, no row gather or division when every row samples at temperature 1.
    greedy = (~sampled).nonzero().squeeze(1)
    tokens = torch.zeros(len(logits), dtype=torch.long, device=logits.device)
    if greedy.numel():
        tokens[greedy] = logits[greedy].argmax(dim=-1)  # argmax returns the first maximal index
    if full.numel():
        every = full.numel() == len(logits)
        scaled = logits if every else logits[full]
        if not bool((temperature[full] == 1).all()):
            scaled = scaled / temperature[full, None]
        probs = torch.softmax(scaled, dim=-1)  # [b, V]
        cdf = probs.cumsum(dim=-1)
        target = uniforms[full, None] * cdf[:, -1:]
        # right=True: the first index whose cdf exceeds the target has positive mass.
        picked = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=logits.shape[-1] - 1)
        if every:
            tokens = picked
        else:
            tokens[full] = picked
    if nucleus.numel():
        probs = torch.softmax(logits[nucleus] / temperature[nucleus, None], dim=-1)
        tokens[nucleus] = _nucleus_tokens(probs, top_p[nucleus], uniforms[nucleus])
    return tokens


NUCLEUS_CANDIDATES = 256
"""Most likely tokens among which the nucleus is looked for first (`_nucleus_tokens`)."""


def _nucleus_tokens(probs: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF picks [b] within each row's nucleus, probs [b, V] in the order of a stable
    descending sort (ties by index). Sorting a real vocabulary (49k-152k) every step costs
    more than the model's own output layer, so the nucleus is first sought among the
    `NUCLEUS_CANDIDATES` most likely tokens, put in that same order: a row whose nucleus ends
    on a value above the last candidate's has exactly the full sort's nucleus there; the
    other rows (a flat distribution) are sorted whole."""
    tokens = torch.empty(len(probs), dtype=torch.long, device=probs.device)
    rest = torch.ones(len(probs), dtype=torch.bool, device=probs.device)
    if probs.shape[-1] > NUCLEUS_CANDIDATES:
        values, index = probs.topk(NUCLEUS_CANDIDATES, dim=-1)  # [b, k], descending; ties in any order
        index, by_index = index.sort(dim=-1)
        values, order = values.gather(1, by_index).sort(dim=-1, descending=True, stable=True)
        index = index.gather(1, order)  # value descending, ties by index: the full sort's first k
        kept = (values.cumsum(dim=-1) - values) < top_p[:, None]  # a prefix of each row
        last = values.gather(1, (kept.sum(-1, keepdim=True) - 1)).squeeze(1)
        exact = last > values[:, -1]  # every token as likely as the last kept one is a candidate
        if bool(exact.any()):
            tokens[exact] = _pick(values[exact], index[exact], kept[exact], uniforms[exact])
        rest = ~exact
    if bool(rest.any()):
        values, index = probs[rest].sort(dim=-1, descending=True, stable=True)  # [r, V]
        kept = (values.cumsum(dim=-1) - values) < top_p[rest, None]
        tokens[rest] = _pick(values, index, kept, uniforms[rest])
    return tokens


def _pick(values: torch.Tensor, index: torch.Tensor, kept: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token [r] where each row's uniform falls in the CDF of its kept sorted values [r, n]."""
    cdf = values.masked_fill(~kept, 0.0).cumsum(dim=-1)
    rank = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True).clamp(max=values.shape[-1] - 1)
    return index.gather(1, rank).squeeze(1)


def row_settings(rows: list, horizon: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: temperature [B], top_p [B] and its sampling noise [B, horizon] (zeros past the
    row's own max_new_tokens)."""
    temperature = torch.tensor([r.params.temperature for r in rows], device=device)
    top_p = torch.tensor([r.params.top_p for r in rows], device=device)
    uniforms = torch.zeros(len(rows), horizon)
    for k, r in enumerate(rows):
        uniforms[k, : r.params.max_new_tokens] = r.uniforms
    return temperature, top_p, uniforms.to(device)


def decode_step(t: int, logits, temperature, top_p, uniforms, slots, active, record, rules, tokenizer, forced=None):
    """Step t of a decode loop: every row samples its token, which is recorded and tested
    against the stop rules. Returns the tokens [B] and each row's finish code [B].
    `forced` [B]: a token chosen beforehand where >= 0 (distinct first tokens, at t = 0)."""
    new = sample_tokens(logits, temperature, top_p, uniforms[:, t])
    if forced is not None:
        new = torch.where(forced >= 0, forced, new)
    record.add(t, slots, active, new, logits)
    reason = rules.check(t, slots, active, new, record.tokens, tokenizer)
    record.finish(t, slots, reason)
    return new, reason


def compaction_due(active: torch.Tensor, fraction: float) -> bool:
    """Whether enough rows of the batch have finished to drop them (`compact_fraction`)."""
    done = len(active) - int(active.sum())
    return bool(done) and done >= fraction * len(active)


class StopStrings:
    """Detects stop strings in a row's continuation by decoding a short tail of tokens.

    Decoding every row every step would dominate on a tiny model, so a per-vocabulary
    prefilter marks the tokens that can complete a stop string: those whose text, as it
    appears mid-sequence (decoded after a reference token, so SentencePiece keeps its
    leading space), holds a stop string's last character, or is empty, or is a partial
    UTF-8 byte. For a character tokenizer and stop "\\n" only the newline token qualifies.
    """

    def __init__(self, tokenizer: Any, strings: tuple[str, ...], vocab_size: int) -> None:
        if any(not s for s in strings):
            raise ValueError("stop_strings must not contain the empty string")
        self.strings = strings
        longest = max(len(s) for s in strings)
        # Each token contributes >= 1 character in practice; the margin covers tokens that
        # decode to nothing (skipped specials, partial bytes).
        self.window = 2 * longest + 2
        self.candidate = torch.ones(vocab_size, dtype=torch.bool)  # [V]
        # Tokens whose own mid-sequence text holds a whole stop string: a hit without decoding
        # whenever the token is not the continuation's first (a first token decodes alone,
        # where SentencePiece drops its leading space).
        self.certain = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
        ref = tokenizer.encode("a", add_special_tokens=False)
        if len(ref) != 1:
            return  # unusual tokenizer: no prefilter, every token is checked
        known = min(vocab_size, len(tokenizer))
        prefix = _decode_text(tokenizer, ref)
        texts = tokenizer.batch_decode(
            [ref + [i] for i in range(known)], skip_special_tokens=True,
            clean_up_tokenization_spaces=False,
        )
        special = set(tokenizer.all_special_ids)
        last_chars = {s[-1] for s in strings}

        # Each token's mid-sequence text; None when the reference does not survive decoding
        # (the token's own text is then unknown).
        pieces = [t[len(prefix) :] if t.startswith(prefix) else None for t in texts]

        def may_complete(i: int, piece: str | None) -> bool:
            if i in special:
                return False  # skipped when decoding, so it never completes a stop string
            return piece is None or not piece or "\ufffd" in piece or any(c in piece for c in last_chars)

        def completes(i: int, piece: str | None) -> bool:
            return i not in special and piece is not None and "\ufffd" not in piece and any(s in piece for s in strings)

        self.candidate[:known] = torch.tensor([may_complete(i, p) for i, p in enumerate(pieces)])
        self.certain[:known] = torch.tensor([completes(i, p) for i, p in enumerate(pieces)])

    def hit(self, tokenizer: Any, tail_ids: list[int]) -> bool:
        text = _decode_text(tokenizer, tail_ids)
        return any(s in text for s in self.strings)


def _decode_text(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


class StopRules:
    """The stop tests of one chunk, vectorised over the batch.

    Priority when several hold at once: EOS, then a stop token or stop string, then the
    length limit (a stop string completed by the last allowed token is "stop").
    """

    def __init__(
        self, rows: list, eos_ids: tuple[int, ...], vocab: int, matcher, device
    ) -> None:
        self.eos = torch.zeros(vocab, dtype=torch.bool)  # [V]
        self.eos[list(eos_ids)] = True
        # Rows share a few distinct stop settings: masks per setting, a group index per row.
        id_sets = sorted({r.params.stop_token_ids for r in rows})
        self.stop_ids = torch.zeros(len(id_sets), vocab, dtype=torch.bool)  # [G, V]
        for g, ids in enumerate(id_sets):
            self.stop_ids[g, list(ids)] = True
        self.id_group = torch.tensor([id_sets.index(r.params.stop_token_ids) for r in rows])
        # Group 0: rows without stop strings, which never need a decode.
        string_sets = [()] + sorted({r.params.stop_strings for r in rows} - {()})
        self.matchers = [None] + [matcher(strings, vocab) for strings in string_sets[1:]]
        self.string_candidate = torch.stack(
            [torch.zeros(vocab, dtype=torch.bool)] + [m.candidate for m in self.matchers[1:]]
        )  # [S + 1, V]
        self.string_certain = torch.stack(
            [torch.zeros(vocab, dtype=torch.bool)] + [m.certain for m in self.matchers[1:]]
        )  # [S + 1, V]
        self.string_group = torch.tensor([string_sets.index(r.params.stop_strings) for r in rows])
        self.has_strings = len(string_sets) > 1
        self.max_new = torch.tensor([r.params.max_new_tokens for r in rows])
        for name in ("eos", "stop_ids", "id_group", "string_candidate", "string_certain", "string_group", "max_new"):
            setattr(self, name, getattr(self, name).to(device))

    def check(self, t, slots, active, new, tokens, tokenizer) -> torch.Tensor:
        """Finish code per batch position after step t ([B]; ACTIVE = goes on)."""
        is_eos = self.eos[new] & active
        is_stop = self.stop_ids[self.id_group[slots], new] & active & ~is_eos
        if self.has_strings:
            group = self.string_group[slots]
            check = self.string_candidate[group, new] & active & ~is_eos & ~is_stop
            if t > 0:
                certain = self.string_certain[group, new] & check
                is_stop |= certain
                check &= ~certain
            for b in check.nonzero().squeeze(1).tolist():
                matcher = self.matchers[int(group[b])]
                tail = tokens[int(slots[b]), max(0, t + 1 - matcher.window) : t + 1].tolist()
                if matcher.hit(tokenizer, tail):
                    is_stop[b] = True
        is_length = (self.max_new[slots] <= t + 1) & active
        reason = torch.full_like(new, ACTIVE)
        reason[is_length] = LENGTH
        reason[is_stop] = STOP
        reason[is_eos] = EOS
        return reason


class DecodeRecord:
    """What a chunk produced, indexed by row: tokens, log-probs, entropies [R, T]."""

    def __init__(self, rows: list, horizon: int, device) -> None:
        n = len(rows)
        self.tokens = torch.zeros(n, horizon, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(n, horizon, device=device)
        want_entropy = any(r.params.top_logprobs > 0 for r in rows)
        self.entropies = torch.zeros(n, horizon, device=device) if want_entropy else None
        self.length = torch.zeros(n, dtype=torch.long, device=device)
        self.reason = torch.full((n,), ACTIVE, dtype=torch.long, device=device)

    def add(self, t: int, slots, active, new, logits) -> None:
        """Store step t's tokens [B] with their raw log-probs (and entropies) from logits [B, V]."""
        live = slots[active]
        log_z = torch.logsumexp(logits, dim=-1)  # [B]
        self.tokens[live, t] = new[active]
        self.logprobs[live, t] = (logits.gather(1, new[:, None]).squeeze(1) - log_z)[active]
        if self.entropies is not None:
            expected_logit = (torch.softmax(logits, dim=-1) * logits).sum(-1)  # E_p[logit]
            self.entropies[live, t] = (log_z - expected_logit)[active]  # H = log Z - E_p[logit]

    def finish(self, t: int, slots, reason) -> None:
        done = reason != ACTIVE
        self.length[slots[done]] = t + 1
        self.reason[slots[done]] = reason[done]

    def completions(self, rows: list) -> list[Completion]:
        # One conversion to Python lists per tensor, then slicing: per-row tensor slices
        # cost more than the rows' short completions.
        tokens, logprobs = self.tokens.tolist(), self.logprobs.tolist()
        entropies = self.entropies.tolist() if self.entropies is not None else None
        out = []
        for k, (row, n, why) in enumerate(zip(rows, self.length.tolist(), self.reason.tolist())):
            ent = None
            if row.params.top_logprobs > 0 and entropies is not None:
                ent = tuple(entropies[k][:n])
            out.append(
                Completion(
                    token_ids=tuple(tokens[k][:n]),
                    logprobs=tuple(logprobs[k][:n]),
                    finish_reason=_REASONS[why],
                    entropies=ent,
                )
            )
        return out
