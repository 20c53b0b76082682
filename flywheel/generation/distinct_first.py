"""Distinct first tokens (`SamplingParams.distinct_first_token`): the n samples of one request
start with n different tokens, drawn without replacement by Gumbel-top-k.

Adding independent Gumbel(0, 1) noise to each token's log-probability and taking the k largest
keys gives k draws without replacement from the distribution, in the order sequential sampling
without replacement would make them (Kool, van Hoof and Welling 2019, "Stochastic Beams and Where
to Find Them", §2); the first of them is an ordinary sample. Sample j of a request takes the
(j+1)-th largest key, so its rows agree on the n tokens wherever they are decoded. The
distribution is the one the row would sample from: temperature applied, then the top-p nucleus
(tokens outside it get no key); a greedy row (temperature 0) takes its n most likely tokens. Past
the nucleus's size, the remaining samples draw their first token as usual (with replacement).

What is recorded is unchanged: the log-prob and entropy of the chosen token under the raw policy
(`DecodeRecord`), which is what the trainer's importance ratio reads. The n first tokens together
are not n independent draws from that policy: unlikely first tokens are over-represented. An
unbiased estimate would weight sample y by p(y) / (1 - exp(-exp(log p(y) - kappa))), kappa the
(n+1)-th largest key (priority sampling, Kool et al. §4); the trainer does not apply it.
"""

from __future__ import annotations

import torch


def gumbel_noise(vocab: int, seed: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [V] from a CPU generator seeded with `seed` (the same on any device)."""
    u = torch.rand(vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return -torch.log(-torch.log(u.clamp(min=1e-300))).float()


def first_token_keys(logits: torch.Tensor, temperature: float, top_p: float, noise: torch.Tensor) -> torch.Tensor:
    """Perturbed keys [V] of one row's first token: log-softmax(logits / T) + noise over the top-p
    nucleus, -inf outside it; the raw logits (no noise) when T = 0 (greedy: the most likely first).

    >>> keys = first_token_keys(torch.tensor([0.0, 0.0, -30.0]), 1.0, 0.5, torch.zeros(3))
    >>> [round(k, 4) for k in keys.tolist()]  # the nucleus of top_p 0.5 is token 0 alone
    [-0.6931, -inf, -inf]
    """
    if temperature == 0:
        return logits.float()
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [V]
    keys = logp + noise.to(logits.device)
    if top_p < 1:
        values, index = logp.exp().sort(descending=True, stable=True)
        kept = (values.cumsum(-1) - values) < top_p  # the most likely token is always kept
        outside = torch.ones_like(keys, dtype=torch.bool)
        outside[index[kept]] = False
        keys = keys.masked_fill(outside, -torch.inf)
    return keys


def distinct_first_tokens(rows: list, logits: torch.Tensor, temperature: torch.Tensor,
                          top_p: torch.Tensor) -> torch.Tensor | None:
    """The first token [R] of each row that asks for a distinct one (-1 for the others, which
    sample as usual), or None when no row asks. `rows[b]` has `request`, `sample` (its index
    j among the request's `n`), `n`, `params` and `noise_seed`; logits [R, V] are the rows' first-token
    logits (the rows of one request share one prompt, so one row's stand for all)."""
    groups: dict[int, list[int]] = {}
    for b, row in enumerate(rows):
        if row.params.distinct_first_token:
            groups.setdefault(row.request, []).append(b)
    if not groups:
        return None
    forced = torch.full((len(rows),), -1, dtype=torch.long, device=logits.device)
    for positions in groups.values():
        first = positions[0]
        row = rows[first]
        noise = gumbel_noise(logits.shape[-1], row.noise_seed)
        keys = first_token_keys(logits[first], float(temperature[first]), float(top_p[first]), noise)
        values, order = keys.sort(descending=True, stable=True)  # ties by token id, on any backend
        values, order = values[: row.n].tolist(), order[: row.n].tolist()
        for b in positions:
            j = rows[b].sample
            if j < len(order) and values[j] > -torch.inf:
                forced[b] = order[j]
    return forced
