"""HFGenerator (flywheel/generation/hf.py) on a tiny random Llama.

The key check: the log-probs the generator reports equal a teacher-forced forward pass of
the same model over prompt + completion, so the objective's importance ratio starts at 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from flywheel.generation import Completion, GenerationRequest, Generator, SamplingParams
from flywheel.generation.decoding import StopStrings, sample_tokens
from flywheel.generation.hf import HFGenerator
from flywheel.policies.tiny import build_tiny_llama


pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


@pytest.fixture(scope="module")
def model(tok):
    # initializer_range 0.4: a peaked, varied random policy (at 0.02 greedy repeats "\n").
    return build_tiny_llama(
        tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1,
        initializer_range=0.4,
    )


def encode(tok, text: str) -> tuple[int, ...]:
    return tuple(tok(text)["input_ids"])


def teacher_forced(model, prompt: tuple[int, ...], completion: Completion):
    """Raw log-probs of the completion tokens and entropies at their positions: [T], [T]."""
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logp = model(ids).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]  # [T, V]
    chosen = logp.gather(1, torch.tensor(completion.token_ids)[:, None]).squeeze(1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


def greedy(gen, prompt, max_new_tokens=24, **params) -> Completion:
    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **params)
    return gen.sample([GenerationRequest(prompt, 1, sp)])[0][0]


def test_is_a_generator(model, tok):
    assert isinstance(HFGenerator(model, tok), Generator)


# -- the pure sampler, worked by hand ------------------------------------------------------


def test_sample_tokens_inverse_cdf():
    # p = [0.5, 0.3, 0.2] -> cdf [0.5, 0.8, 1.0]
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(4, 1)
    u = torch.tensor([0.0, 0.49, 0.6, 0.85])
    ones = torch.ones(4)
    assert sample_tokens(logits, ones, ones, u).tolist() == [0, 0, 1, 2]
    # T = 0: argmax whatever the uniform.
    assert sample_tokens(logits, torch.zeros(4), ones, u).tolist() == [0, 0, 0, 0]
    # T = 2: p ∝ sqrt(p) = [0.707, 0.548, 0.447] / 1.702 = [0.415, 0.322, 0.263];
    # u = 0.42 falls past the first bucket (it was token 0 at T = 1).
    hot = sample_tokens(logits[:1], torch.tensor([2.0]), ones[:1], torch.tensor([0.42]))
    assert hot.tolist() == [1]


def test_sample_tokens_nucleus():
    # p = [0.2, 0.5, 0.3]; sorted: token 1 (0.5), token 2 (0.3), token 0 (0.2).
    # top_p 0.7: mass before each sorted token is [0, 0.5, 0.8] -> keep tokens 1 and 2,
    # cdf [0.5, 0.8] of total 0.8: u = 0.5 -> 0.4 -> token 1; u = 0.9 -> 0.72 -> token 2;
    # token 0 is never drawn, even at u -> 1.
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))  # unsorted on purpose
    u = torch.tensor([0.5, 0.9, 0.9999])
    got = sample_tokens(logits.repeat(3, 1), torch.ones(3), torch.full((3,), 0.7), u)
    assert got.tolist() == [1, 2, 2]
    # top_p tiny keeps only the most likely token.
    got = sample_tokens(logits.repeat(3, 1), torch.ones(3), torch.full((3,), 1e-6), u)
    assert got.tolist() == [1, 1, 1]


def test_nucleus_among_the_most_likely_tokens_picks_what_the_whole_sort_picks(monkeypatch):
    """A vocabulary larger than NUCLEUS_CANDIDATES: peaked rows (nucleus among the candidates),
    flat rows (sorted whole), ties at the top and at the candidates' edge, mixed temperatures
    and top_p; every pick equals the one a whole-vocabulary stable sort gives."""
    import flywheel.generation.decoding as decoding

    gen = torch.Generator().manual_seed(0)
    rows, vocab = 96, 3000
    logits = torch.randn(rows, vocab, generator=gen) * torch.linspace(0.2, 12.0, rows)[:, None]
    logits[0, :8] = 40.0                          # eight tied favourites
    logits[1, :] = 0.0                            # all tied: the nucleus is every token
    logits[2, 300:] = -50.0                       # 300 tied tokens: the 256 candidates cut the tie
    temperature = torch.rand(rows, generator=gen) + 0.3
    top_p = torch.rand(rows, generator=gen) * 0.9 + 0.05
    for _ in range(4):
        u = torch.rand(rows, generator=gen)
        fast = sample_tokens(logits, temperature, top_p, u)
        monkeypatch.setattr(decoding, "NUCLEUS_CANDIDATES", vocab + 1)  # the whole-sort path only
        whole = sample_tokens(logits, temperature, top_p, u)
        monkeypatch.undo()
        assert torch.equal(fast, whole)


# -- log-probs and entropies against teacher forcing ---------------------------------------


@pytest.mark.parametrize("compact_fraction", [0.0, 0.25, 2.0])
def test_logprobs_and_entropies_equal_teacher_forcing(model, tok, compact_fraction):
    gen = HFGenerator(model, tok, compact_fraction=compact_fraction)
    prompts = [encode(tok, t) for t in ("5 9 8|67\n", "1 2|3\n", "12 7 3 9|40\n9*3=27\n")]
    # Stop on a few frequent characters so rows finish at different steps (exercises
    # masking and compaction); temperature 1.3 and top_p 0.9 must not change the log-probs.
    stops = tuple(tok.convert_tokens_to_ids(list("0123456789")))
    reqs = [
        GenerationRequest(prompts[0], 3, SamplingParams(max_new_tokens=16, top_logprobs=5), seed=1),
        GenerationRequest(
            prompts[1], 2,
            SamplingParams(max_new_tokens=12, stop_token_ids=stops, top_logprobs=1), seed=2,
        ),
        GenerationRequest(
            prompts[2], 2,
            SamplingParams(max_new_tokens=10, temperature=1.3, top_p=0.9, top_logprobs=1), seed=3,
        ),
    ]
    out = gen.sample(reqs)
    lengths = set()
    for req, completions in zip(reqs, out):
        assert len(completions) == req.n
        for c in completions:
            lengths.add(len(c.token_ids))
            chosen, entropy = teacher_forced(model, req.prompt_ids, c)
            # fp32 noise only (cached vs full attention sum in different orders): logits of
            # this peaked model reach ~±20, so allow 1e-5 relative on top of 1e-5 absolute.
            # A position, mask or cache bug moves log-probs by 1e-2 or more.
            torch.testing.assert_close(torch.tensor(c.logprobs), chosen, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(torch.tensor(c.entropies), entropy, atol=1e-5, rtol=1e-5)
    assert len(lengths) > 1, "rows should finish at different steps"
    for c in out[1]:  # the rows that stop on digits: a digit ends them, and only at the end
        assert not set(c.token_ids[:-1]) & set(stops)
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in stops)
        assert c.finish_reason == "stop" or len(c.token_ids) == 12


def test_left_padding_equals_running_alone(model, tok):
    gen = HFGenerator(model, tok)
    sp = SamplingParams(max_new_tokens=12)
    reqs = [
        GenerationRequest(encode(tok, "7|7\n"), 2, sp, seed=5),
        GenerationRequest(encode(tok, "13 11 2 9|99\n13*9=117\n"), 2, sp, seed=6),
    ]
    together = gen.sample(reqs)
    for req, batch_out in zip(reqs, together):
        alone = gen.sample([req])[0]
        for a, b in zip(alone, batch_out):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5
            )


def test_chunking_keeps_results(model, tok):
    sp = SamplingParams(max_new_tokens=8)
    reqs = [
        GenerationRequest(encode(tok, f"{i} {i + 1}|{i * 3}\n"), 3, sp, seed=i) for i in range(4)
    ]
    big = HFGenerator(model, tok, max_batch_size=64)
    small = HFGenerator(model, tok, max_batch_size=2)
    out_big, out_small = big.sample(reqs), small.sample(reqs)
    def ids(out):
        return [[c.token_ids for c in cs] for cs in out]

    assert ids(out_big) == ids(out_small)
    # 12 samples in chunks of 2: each prompt is split over 2 chunks, so it is prefilled twice.
    prompt_len = [len(r.prompt_ids) for r in reqs]
    assert big.stats.prefill_tokens == sum(prompt_len)
    assert small.stats.prefill_tokens == 2 * sum(prompt_len)


# -- stop rules ------------------------------------------------------------------------------


def first_index(seq, item) -> int:
    return list(seq).index(item)


def test_finish_reasons(model, tok):
    gen = HFGenerator(model, tok)
    prompt = encode(tok, "3 5 7|15\n")
    free = greedy(gen, prompt, max_new_tokens=24)
    assert free.finish_reason == "length" and len(free.token_ids) == 24
    # Pick a token that first appears mid-way and make it the stop token, then the EOS.
    k = next(i for i in range(3, 24) if free.token_ids[i] not in free.token_ids[:i])
    target = free.token_ids[k]

    stopped = greedy(gen, prompt, stop_token_ids=(target,))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: k + 1]  # the stop token is kept
    assert stopped.logprobs == pytest.approx(free.logprobs[: k + 1], abs=1e-6)

    eos_gen = HFGenerator(model, tok, eos_token_id=target)
    ended = greedy(eos_gen, prompt)
    assert ended.finish_reason == "eos"
    assert ended.token_ids == free.token_ids[: k + 1]  # EOS kept, with its log-prob
    # EOS wins over a stop token that is the same id.
    assert greedy(eos_gen, prompt, stop_token_ids=(target,)).finish_reason == "eos"


def test_stop_strings(model, tok):
    gen = HFGenerator(model, tok)
    prompt = encode(tok, "6 6 6|18\n")  # greedy: 24 plain characters
    free = greedy(gen, prompt, max_new_tokens=24)
    text = tok.decode(free.token_ids)
    assert len(text) == 24  # one character per token
    # A 2-character stop string first completed at character `end` (exclusive).
    stop = next(text[i : i + 2] for i in range(4, 22) if text[i : i + 2] not in text[: i + 1])
    end = text.index(stop) + 2
    got = greedy(gen, prompt, stop_strings=(stop,))
    assert got.finish_reason == "stop"
    assert got.token_ids == free.token_ids[:end]
    assert tok.decode(got.token_ids).endswith(stop)
    # A stop string completed by the very last allowed token is still "stop".
    got = greedy(gen, prompt, max_new_tokens=end, stop_strings=(stop,))
    assert got.finish_reason == "stop" and len(got.token_ids) == end
    # Never matched: runs to the length limit.
    assert greedy(gen, prompt, stop_strings=("no such text",)).finish_reason == "length"


def test_stop_string_matcher(tok):
    matcher = StopStrings(tok, ("</answer>", "\n"), vocab_size=len(tok))
    # Only tokens holding a stop string's last character (">" or "\n") need a decode;
    # specials such as "<eos>" are skipped when decoding, so they never do.
    candidates = set(tok.convert_ids_to_tokens(matcher.candidate.nonzero().squeeze(1).tolist()))
    assert candidates == {">", "\n"}
    # The newline token holds a whole stop string: it stops without a decode.
    assert tok.convert_ids_to_tokens(matcher.certain.nonzero().squeeze(1).tolist()) == ["\n"]
    ids = list(tok.encode("(1+2)</answer>", add_special_tokens=False))
    assert matcher.hit(tok, ids[-matcher.window :])
    assert not matcher.hit(tok, ids[-matcher.window : -1])


def test_stop_string_matcher_multi_character_tokens():
    # A BPE-like vocabulary: a stop string can span tokens or end inside one.
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = ["<pad>", "<bos>", "<eos>", "<unk>", "a", "ab", "c\n", "\n\n", "x"]
    vocab = {t: i for i, t in enumerate(pieces)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    bpe = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    newline = StopStrings(bpe, ("\n",), vocab_size=len(vocab))
    assert newline.candidate.nonzero().squeeze(1).tolist() == [vocab["c\n"], vocab["\n\n"]]
    assert newline.hit(bpe, [vocab["ab"], vocab["c\n"]])  # "\n" inside the last token
    assert newline.certain.nonzero().squeeze(1).tolist() == [vocab["c\n"], vocab["\n\n"]]
    spanning = StopStrings(bpe, ("bc",), vocab_size=len(vocab))
    assert spanning.candidate[vocab["c\n"]] and not spanning.candidate[vocab["ab"]]
    assert not spanning.certain.any()  # "bc" is in no single token: every candidate is decoded
    assert spanning.hit(bpe, [vocab["x"], vocab["ab"], vocab["c\n"]])  # "ab" + "c\n" holds "bc"
    assert not spanning.hit(bpe, [vocab["ab"], vocab["x"], vocab["c\n"]])


# -- sampling settings -------------------------------------------------------------------------


def test_greedy_is_argmax(model, tok):
    gen = HFGenerator(model, tok)
    prompt = encode(tok, "3 5 7|15\n")
    c = greedy(gen, prompt, max_new_tokens=16)
    ids = torch.tensor([prompt + c.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    assert c.token_ids == tuple(logits.argmax(-1).tolist())


def test_tiny_top_p_is_argmax(model, tok):
    gen = HFGenerator(model, tok)
    prompt = encode(tok, "3 5 7|15\n")
    expected = greedy(gen, prompt, max_new_tokens=16).token_ids
    sp = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=1e-6)
    for c in gen.sample([GenerationRequest(prompt, 4, sp, seed=9)])[0]:
        assert c.token_ids == expected


def test_mixed_params_in_one_call(model, tok):
    gen = HFGenerator(model, tok)
    prompt = encode(tok, "3 5 7|15\n")
    expected = greedy(gen, prompt, max_new_tokens=10).token_ids
    hot = GenerationRequest(prompt, 4, SamplingParams(max_new_tokens=10, temperature=2.0), seed=1)
    cold = GenerationRequest(prompt, 2, SamplingParams(max_new_tokens=10, temperature=0.0))
    out = gen.sample([hot, cold])
    assert all(c.token_ids == expected for c in out[1])
    assert any(c.token_ids != expected for c in out[0])
    assert all(c.entropies is None for cs in out for c in cs)  # top_logprobs = 0


# -- n, order, seeds ---------------------------------------------------------------------------


def test_n_samples_and_order(model, tok):
    gen = HFGenerator(model, tok)
    prompts = [encode(tok, "99|1\n"), encode(tok, "1|1\n"), encode(tok, "50 50|100\n")]
    sp = SamplingParams(max_new_tokens=6)
    reqs = [GenerationRequest(p, n, sp, seed=s) for p, n, s in zip(prompts, (3, 1, 2), (0, 1, 2))]
    out = gen.sample(reqs)
    assert [len(cs) for cs in out] == [3, 1, 2]
    # Each request's result is what it yields on its own (order preserved, not mixed up).
    for req, cs in zip(reqs, out):
        assert [c.token_ids for c in gen.sample([req])[0]] == [c.token_ids for c in cs]
    assert len({c.token_ids for c in out[0]}) == 3  # distinct samples of one prefix


def test_seeded_determinism(model, tok):
    sp = SamplingParams(max_new_tokens=10)
    reqs = [GenerationRequest(encode(tok, "8 3|11\n"), 4, sp, seed=123)]
    a = HFGenerator(model, tok).sample(reqs)
    b = HFGenerator(model, tok, seed=77).sample(reqs)
    assert a == b  # frozen dataclasses: tokens, log-probs and reasons all equal
    other = HFGenerator(model, tok).sample([GenerationRequest(reqs[0].prompt_ids, 4, sp, seed=124)])
    assert other != a


def test_unseeded_requests_use_the_generator_stream(model, tok):
    req = [GenerationRequest(encode(tok, "8 3|11\n"), 4, SamplingParams(max_new_tokens=10))]
    g1, g2 = HFGenerator(model, tok, seed=5), HFGenerator(model, tok, seed=5)
    first, second = g1.sample(req), g1.sample(req)
    assert first != second  # the stream advances per call
    assert g2.sample(req) == first and g2.sample(req) == second
    # The stream position survives a checkpoint.
    state = g1.state_dict()
    third = g1.sample(req)
    g2.load_state_dict(state)
    assert g2.sample(req) == third


# -- accounting and side effects ---------------------------------------------------------------


def test_stats(model, tok):
    gen = HFGenerator(model, tok)
    p1, p2 = encode(tok, "5 9 8|67\n"), encode(tok, "1 2|3\n")  # 10 and 7 tokens
    sp = SamplingParams(max_new_tokens=5)
    # p1 appears in two requests: it is prefilled once for all 4 + 2 samples.
    reqs = [
        GenerationRequest(p1, 4, sp, seed=0),
        GenerationRequest(p2, 3, sp, seed=1),
        GenerationRequest(p1, 2, sp, seed=2),
    ]
    out = gen.sample(reqs)
    s = gen.stats
    assert (s.calls, s.requests) == (1, 3)
    assert s.prompt_tokens == 10 * 4 + 7 * 3 + 10 * 2 == 81
    assert s.prefill_tokens == 10 + 7
    assert s.cached_prompt_tokens == 81 - 17
    assert s.generated_tokens == sum(len(c.token_ids) for cs in out for c in cs)
    assert s.seconds > 0
    gen.sample(reqs[:1])
    assert (gen.stats.calls, gen.stats.requests, gen.stats.prefill_tokens) == (2, 4, 27)


def test_decode_pass_counters(model, tok):
    # Never compacted: finished rows ride along, so every pass has both rows.
    gen = HFGenerator(model, tok, compact_fraction=2.0)
    short, long = encode(tok, "1 2|3\n"), encode(tok, "5 9 8|67\n")  # 7 and 10 tokens
    sp = SamplingParams(max_new_tokens=5)
    out = gen.sample([GenerationRequest(short, 1, sp, seed=0), GenerationRequest(long, 1, sp, seed=1)])
    passes = max(len(c.token_ids) for cs in out for c in cs) - 1  # the prefill gave the first token
    assert passes > 1
    extra = gen.stats.extra
    assert extra["decode_passes"] == passes and extra["decode_row_steps"] == 2 * passes
    # Pass t (from 0) attends to prompt + t + 1 columns: 10 + t + 1 in the padded cache for
    # both rows; 7 + t + 1 of the short row's are real.
    assert extra["decode_kv_columns"] == sum(2 * (11 + t) for t in range(passes))
    assert extra["decode_real_columns"] == sum(8 + t + 11 + t for t in range(passes))


def test_training_mode_restored_and_no_grad(model, tok):
    gen = HFGenerator(model, tok)
    req = [GenerationRequest(encode(tok, "1|1\n"), 2, SamplingParams(max_new_tokens=4), seed=0)]
    model.train()
    model.model.layers[0].eval()  # a part the trainer keeps frozen stays in eval
    try:
        out = gen.sample(req)
        assert model.training and model.model.layers[1].training
        assert not model.model.layers[0].training
        assert all(math.isfinite(lp) for c in out[0] for lp in c.logprobs)
    finally:
        model.eval()
    gen.sample(req)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


def test_validation(model, tok):
    gen = HFGenerator(model, tok)
    too_long = SamplingParams(max_new_tokens=model.config.max_position_embeddings)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        gen.sample([GenerationRequest(encode(tok, "1|1\n"), 1, too_long)])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gen.sample([GenerationRequest((1, 100), 1, SamplingParams(max_new_tokens=2))])
    with pytest.raises(ValueError, match="max_batch_size"):
        HFGenerator(model, tok, max_batch_size=0)
    assert gen.sample([]) == []


def test_from_pretrained(model, tok, tmp_path):
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = HFGenerator.from_pretrained(str(tmp_path), max_batch_size=8)
    assert loaded.max_batch_size == 8 and loaded.eos_token_ids == (tok.eos_token_id,)
    req = [GenerationRequest(encode(tok, "2 2|4\n"), 2, SamplingParams(max_new_tokens=6), seed=3)]
    (a, b), (c, d) = loaded.sample(req)[0], HFGenerator(model, tok).sample(req)[0]
    assert (a.token_ids, b.token_ids) == (c.token_ids, d.token_ids)
    assert a.logprobs == pytest.approx(c.logprobs, abs=1e-5)


def test_qwen2_family(tok):
    qwen = build_tiny_llama(
        tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, family="qwen2",
        initializer_range=0.4,
    )
    gen = HFGenerator(qwen, tok)
    prompt = encode(tok, "5 5|25\n")
    c = gen.sample([GenerationRequest(prompt, 3, SamplingParams(max_new_tokens=8), seed=0)])[0][1]
    chosen, _ = teacher_forced(qwen, prompt, c)
    torch.testing.assert_close(torch.tensor(c.logprobs), chosen, atol=1e-5, rtol=1e-5)


def test_prefix_cache_reuses_nodes_across_calls_and_follows_the_weights(one_thread):
    import functools

    from flywheel.reporting.problem_view import encode_prompt
    from flywheel.policies.load import load_policy
    from flywheel.search import SearchConfig, SearchDriver, SearchProblem
    from flywheel.tasks.countdown import CountdownTask

    policy, ptok = load_policy("tiny-countdown")
    task = CountdownTask()
    problems = task.problems("test")[:8]
    searches = [SearchProblem(encode_prompt(ptok, task, p), functools.partial(task.score, p), p.id) for p in problems]
    config = SearchConfig(max_depth=8, expansion_width=4, trajectories_per_tree=4, max_expansions_per_tree=32)
    decode = functools.partial(ptok.decode, skip_special_tokens=True)

    def search(generator):
        driver = SearchDriver(generator, config, step=task.step, decode=decode, eos_token_ids=[ptok.eos_token_id])
        return driver.run(searches)

    plain = HFGenerator(policy, ptok, seed=0, prefix_cache_mb=0)
    cached = HFGenerator(policy, ptok, seed=0, prefix_cache_mb=16)
    a, b = search(plain), search(cached)
    for x, y in zip(a, b):  # the same trees: the cache changes what is computed, not what is sampled
        assert [t.response_ids for t in x.trajectories] == [t.response_ids for t in y.trajectories]
        for tx, ty in zip(x.trajectories, y.trajectories):
            assert max(abs(p - q) for p, q in zip(tx.response_logprobs, ty.response_logprobs)) < 1e-4
    assert plain.stats.prompt_tokens == cached.stats.prompt_tokens
    assert cached.stats.prefill_tokens < plain.stats.prefill_tokens / 3
    assert cached.stats.extra["prefix_cache_hit_tokens"] > 0
    assert 0 < cached.prefix_cache.bytes <= 16 * 2**20

    # A weight update empties the cache: stale KV would give wrong log-probs. Change the
    # weights for real, then expand a node whose prefix the cache holds: the log-probs must be
    # the new weights' (teacher-forced), and measurably not the old ones'.
    import copy

    old_policy = copy.deepcopy(policy)
    first = a[0].trajectories[0]
    node_prefix = searches[0].prompt_ids + first.steps[0].token_ids  # a searched node: cached
    with torch.no_grad():
        for name, weight in policy.named_parameters():
            if "layers.0." in name and weight.dim() == 2:  # the first layer: every cached K/V changes
                weight.mul_(1.5)
    request = [GenerationRequest(node_prefix, n=2, params=SamplingParams(max_new_tokens=6), seed=1)]
    fresh = cached.sample(request)[0]
    gaps = []
    for completion in fresh:
        now, _ = teacher_forced(policy, node_prefix, completion)
        before, _ = teacher_forced(old_policy, node_prefix, completion)
        torch.testing.assert_close(torch.tensor(completion.logprobs), now, atol=1e-4, rtol=1e-4)
        gaps.append((now - before).abs().max().item())
    assert max(gaps) > 1e-2  # the change is visible in the log-probs, so the check above can fail
    assert cached.prefix_cache.weights == tuple(p._version for p in policy.parameters())
    assert len(cached.prefix_cache.entries) <= 2  # only this call's two samples; the rest was dropped

    # Bounded: a tiny budget never holds more than it allows.
    small = HFGenerator(policy, ptok, seed=0, prefix_cache_mb=0.01)
    search(small)
    assert small.prefix_cache.bytes <= 0.01 * 2**20


def test_passes_with_under_half_the_row_budget_busy_are_counted(model, tok):
    """8 rows, none ended by EOS (an id greedy decoding never picks stands in for it): 6 stop
    after 2 tokens, 2 after 10. Budget min(512, 8) = 8. Passes t = 0..8 run (the 10th token is
    sampled from pass 8's logits); from t = 1 on 2 rows are busy, under 4: 8 sparse passes."""
    gen = HFGenerator(model, tok, eos_token_id=[tok.vocab_size - 1])
    greedy = {"temperature": 0.0}
    gen.sample([GenerationRequest((1, 5, 6), 6, SamplingParams(max_new_tokens=2, **greedy), seed=0),
                GenerationRequest((1, 5, 7), 2, SamplingParams(max_new_tokens=10, **greedy), seed=1)])
    assert (gen.stats.extra["decode_passes"], gen.stats.extra["decode_sparse_passes"]) == (9, 8)
