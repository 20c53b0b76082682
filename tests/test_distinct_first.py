"""Distinct first tokens (SamplingParams.distinct_first_token, flywheel/generation/distinct_first.py):
Gumbel-top-k worked by hand, on the in-process HFGenerator with a tiny random Llama, and the
vLLM sidecar's refusal (search.distinct_children)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation.distinct_first import distinct_first_tokens, first_token_keys, gumbel_noise
from flywheel.generation.hf import HFGenerator
from flywheel.policies.tiny import build_tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


def rows_of(n: int, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, request: int = 0):
    params = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p, distinct_first_token=True)
    return [SimpleNamespace(request=request, sample=j, n=n, params=params, noise_seed=seed) for j in range(n)]


def first_tokens(logits: torch.Tensor, rows) -> list[int]:
    t = torch.tensor([r.params.temperature for r in rows])
    p = torch.tensor([r.params.top_p for r in rows])
    return distinct_first_tokens(rows, logits.repeat(len(rows), 1), t, p).tolist()


def test_greedy_rows_take_the_most_likely_tokens_in_order():
    logits = torch.tensor([0.0, 2.0, 1.0, 3.0])
    assert first_tokens(logits, rows_of(3, temperature=0.0)) == [3, 1, 2]


def test_the_nucleus_bounds_the_distinct_tokens_and_the_rest_sample_as_usual():
    # p = [0.5, 0.3, 0.15, 0.05]; top_p 0.7: the nucleus is {0, 1} (0.5 < 0.7, 0.8 >= 0.7).
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    keys = first_token_keys(logits, 1.0, 0.7, torch.zeros(4))
    assert keys.tolist()[:2] == pytest.approx([math.log(0.5), math.log(0.3)]) and keys[2:].tolist() == [-math.inf] * 2
    for seed in range(20):
        picks = first_tokens(logits, rows_of(3, top_p=0.7, seed=seed))
        assert sorted(picks[:2]) == [0, 1] and picks[2] == -1  # the third row draws its own (-1: not forced)


def test_gumbel_top_2_draws_without_replacement():
    """p = [0.6, 0.3, 0.1]. The first key's token is an ordinary draw: P(0) = 0.6. The second is
    the second draw without replacement: P(second = 2) = 0.6 * 0.1 / 0.4 + 0.3 * 0.1 / 0.7
    = 0.15 + 0.04286 = 0.19286. 4000 seeds: standard errors 0.008 and 0.006."""
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    trials = 4000
    firsts, seconds = [0, 0, 0], [0, 0, 0]
    for seed in range(trials):
        order = (logits + gumbel_noise(3, seed)).argsort(descending=True).tolist()
        firsts[order[0]] += 1
        seconds[order[1]] += 1
    assert firsts[0] / trials == pytest.approx(0.6, abs=0.03)
    assert seconds[2] / trials == pytest.approx(0.19286, abs=0.025)
    assert seconds[0] / trials == pytest.approx(0.3 * 0.6 / 0.7 + 0.1 * 0.6 / 0.9, abs=0.03)  # 0.3238


def test_rows_of_other_requests_are_left_alone():
    logits = torch.tensor([0.0, 2.0, 1.0, 3.0])
    plain = SimpleNamespace(request=1, sample=0, n=1, params=SamplingParams(max_new_tokens=1), noise_seed=0)
    rows = rows_of(2, temperature=0.0) + [plain]
    t, p = torch.tensor([0.0, 0.0, 1.0]), torch.ones(3)
    assert distinct_first_tokens(rows, logits.repeat(3, 1), t, p).tolist() == [3, 1, -1]
    assert distinct_first_tokens([plain], logits[None], t[:1], p[:1]) is None


# ----------------------------------------------------------------------- on the HF generator
@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1,
                            initializer_range=0.4)


def test_hf_generator_samples_distinct_first_tokens_with_the_policys_logprobs(model, tok):
    prompt = tuple(tok("3 5 7 -> 15\n")["input_ids"])
    gen = HFGenerator(model, tok, prefix_cache_mb=0)

    def sample(distinct: bool):
        sp = SamplingParams(max_new_tokens=6, distinct_first_token=distinct, top_logprobs=1)
        return gen.sample([GenerationRequest(prompt, 8, sp, seed=3)])[0]

    plain, distinct = sample(False), sample(True)
    assert len({c.token_ids[0] for c in plain}) < 8  # this peaked policy repeats first tokens when sampled freely
    assert len({c.token_ids[0] for c in distinct}) == 8
    assert [c.token_ids for c in sample(True)] == [c.token_ids for c in distinct]  # seeded: the same again
    with torch.no_grad():
        logp = model(torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)  # [V]
    for comp in distinct:  # the recorded log-prob is the policy's, not the without-replacement draw's
        assert comp.logprobs[0] == pytest.approx(float(logp[comp.token_ids[0]]), abs=1e-4)
        assert comp.entropies[0] == pytest.approx(float(-(logp.exp() * logp).sum()), abs=1e-4)
    greedy = gen.sample([GenerationRequest(prompt, 3, SamplingParams(max_new_tokens=2, temperature=0.0,
                                                                        distinct_first_token=True))])[0]
    assert [c.token_ids[0] for c in greedy] == logp.argsort(descending=True)[:3].tolist()


def test_a_distinct_request_is_never_split_between_chunks(model, tok):
    gen = HFGenerator(model, tok, max_batch_size=4, prefix_cache_mb=0)
    sp = SamplingParams(max_new_tokens=2)
    requests = [GenerationRequest((1, 5), 2, sp, seed=0),
                GenerationRequest((1, 6), 3, SamplingParams(max_new_tokens=2, distinct_first_token=True), seed=1),
                GenerationRequest((1, 7), 5, sp, seed=2)]
    rows = gen._rows(requests)
    chunks = gen._chunks(rows, list(range(len(rows))))
    # 2 plain rows, then the 3 distinct ones would straddle: a new chunk; the 5 plain split at 4.
    assert [[(r.request, r.sample) for r in chunk] for chunk in chunks] == [
        [(0, 0), (0, 1)], [(1, 0), (1, 1), (1, 2), (2, 0)], [(2, 1), (2, 2), (2, 3), (2, 4)]]
    assert all(len({c.token_ids[0] for c in comps}) == len(comps) for comps in gen.sample(requests)[1:2])


# ----------------------------------------------------------------------- the vLLM sidecar refuses
def test_the_vllm_sidecar_refuses_distinct_children():
    from data_modules.search import SearchDataModule
    from flywheel.generation.vllm import VLLMGenerator, VLLMSidecar
    from flywheel.search import SearchConfig

    with pytest.raises(ValueError, match=r"--data.search.distinct_children=true: VLLMSidecar cannot .*"
                                         r"--data.search.distinct_children=false"):
        SearchDataModule(generator=VLLMSidecar(), search=SearchConfig(distinct_children=True))
    SearchDataModule(generator=VLLMSidecar(), search=SearchConfig())  # off: fine
    client = VLLMGenerator([], "m", [], send_seeds=True, max_concurrency=1)
    request = GenerationRequest((1,), 2, SamplingParams(max_new_tokens=2, distinct_first_token=True))
    with pytest.raises(ValueError, match="distinct_children"):
        client.sample([request])
    client.close()
