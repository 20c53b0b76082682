"""The in-process generator sampling in bf16 from a copy of an fp32 policy
(flywheel.generation.precision): the copy follows the live weights, the log-probs are the ones
it sampled with, the live policy is untouched, "auto" decides by size and CPU, and greedy
samples agree with fp32 on most of a fixed prompt set."""

from __future__ import annotations

import logging

import pytest
import torch

from flywheel.generation import precision
from flywheel.generation.backends import HFBackend
from flywheel.generation.base import GenerationRequest, SamplingParams
from flywheel.generation.hf import HFGenerator
from flywheel.generation.precision import SamplingWeights, resolve_dtype
from flywheel.policies.tiny import build_tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")  # fixtures one_thread and tok: conftest.py


@pytest.fixture()
def model(tok):
    return build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1,
                            initializer_range=0.4).train()


def prompts(tok) -> list[tuple[int, ...]]:
    return [tuple(tok(t)["input_ids"]) for t in ("5 9 8|67\n", "1 2|3\n", "12 7 3 9|40\n9*3=27\n", "4 4|16\n")]


def test_the_bf16_sampler_reports_the_log_probs_it_sampled_with(model, tok):
    generator = HFGenerator(model, tok, dtype="bfloat16")
    request = GenerationRequest(prompts(tok)[0], 3, SamplingParams(max_new_tokens=12, top_logprobs=1), seed=4)
    completions = generator.sample([request])[0]
    sampler = generator.weights.copy
    assert sampler is not None and next(sampler.parameters()).dtype == torch.bfloat16
    for c in completions:
        ids = torch.tensor([request.prompt_ids + c.token_ids])
        with torch.no_grad():
            bf16 = sampler(ids).logits[0].float().log_softmax(-1)[len(request.prompt_ids) - 1 : -1]
            fp32 = model(ids).logits[0].float().log_softmax(-1)[len(request.prompt_ids) - 1 : -1]
        chosen = torch.tensor(c.token_ids)[:, None]
        behaviour = torch.tensor(c.logprobs)
        # bf16 with a KV cache against bf16 without: rounding only. The fp32 policy differs more.
        torch.testing.assert_close(behaviour, bf16.gather(1, chosen).squeeze(1), atol=0.05, rtol=0.02)
        assert (behaviour - fp32.gather(1, chosen).squeeze(1)).abs().max() < 0.5


def test_the_copy_follows_every_weight_change_and_the_live_policy_is_untouched(model, tok):
    generator = HFGenerator(model, tok, dtype="bfloat16")
    request = GenerationRequest(prompts(tok)[1], 1, SamplingParams(max_new_tokens=8, temperature=0.0))
    first = generator.sample([request])[0][0]
    assert generator.weights.refreshes == 0
    generator.sample([request])
    assert generator.weights.refreshes == 0, "no weight changed: no copy"
    with torch.no_grad():  # an optimizer step: in place
        for p in model.parameters():
            p.mul_(-1.0)
    second = generator.sample([request])[0][0]
    assert generator.weights.refreshes == 1
    for live, copied in zip(model.parameters(), generator.weights.copy.parameters()):
        assert torch.equal(copied, live.detach().to(torch.bfloat16))
    assert second.token_ids != first.token_ids or second.logprobs != first.logprobs
    assert all(p.dtype == torch.float32 and p.grad is None for p in model.parameters())
    assert model.training, "the live policy's mode is its own"
    assert model.model.rotary_emb.inv_freq.dtype == generator.weights.copy.model.rotary_emb.inv_freq.dtype


def test_a_policy_already_in_the_sampling_dtype_is_sampled_as_it_is(model, tok):
    weights = SamplingWeights(model, torch.float32)
    assert weights.copy is None and weights.current() is model


def test_greedy_bf16_samples_equal_fp32_on_most_prompts(tok):
    from flywheel.policies.load import load_policy
    from flywheel.reporting.problem_view import encode_prompt
    from flywheel.tasks.countdown import CountdownTask

    policy, tokenizer = load_policy("tiny-countdown")
    task = CountdownTask(numbers_count=3)
    requests = [GenerationRequest(tuple(encode_prompt(tokenizer, task, p)), 1,
                                  SamplingParams(max_new_tokens=48, temperature=0.0))
                for p in task.problems("test")[:32]]
    fp32 = HFGenerator(policy, tokenizer, dtype="float32").sample(requests)
    bf16 = HFGenerator(policy, tokenizer, dtype="bfloat16").sample(requests)
    same = sum(a[0].token_ids == b[0].token_ids for a, b in zip(fp32, bf16)) / len(requests)
    gaps = [abs(x - y) for a, b in zip(fp32, bf16) for x, y, s, t in
            zip(a[0].logprobs, b[0].logprobs, a[0].token_ids, b[0].token_ids) if s == t]
    print(f"greedy bf16 = fp32 on {same:.0%} of {len(requests)} prompts; mean |log-prob gap| "
          f"{sum(gaps) / len(gaps):.4f}, max {max(gaps):.4f}")
    assert same >= 0.75  # measured 29 of 32
    assert sum(gaps) / len(gaps) < 0.02


def test_auto_picks_bf16_for_a_real_model_on_a_bf16_cpu_and_says_so(model, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="flywheel.generation.precision")
    assert resolve_dtype(model, "auto") == torch.float32  # tiny: overhead-bound, kept exact
    assert "below" in caplog.text
    monkeypatch.setattr(precision, "BF16_MIN_PARAMETERS", 0)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert resolve_dtype(model, "auto") == torch.bfloat16
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    caplog.clear()
    assert resolve_dtype(model, "auto") == torch.float32
    assert "no native bf16" in caplog.text
    assert resolve_dtype(model.to(torch.bfloat16), "auto") == torch.bfloat16  # the policy's own
    assert resolve_dtype(model, "float32") == torch.float32


def test_a_bad_dtype_is_refused_naming_the_flag(model, tok):
    with pytest.raises(ValueError, match="--data.generator.init_args.dtype"):
        HFBackend(dtype="float16")
    with pytest.raises(ValueError, match="--data.generator.init_args.dtype"):
        HFGenerator(model, tok, dtype="half")


def test_the_dtype_hint_names_the_flag_of_the_running_command(model, tok, caplog):
    """`eval` and `diagnose` set the backend's flag to theirs (`--generator`): the logged hint named
    `fit`'s --data.generator.init_args.dtype, which eval refuses."""
    caplog.set_level(logging.INFO, logger="flywheel.generation.precision")
    HFBackend().build(model, tok)
    assert "(--data.generator.init_args.dtype=float32|bfloat16 to choose)" in caplog.text  # fit's
    caplog.clear()
    backend = HFBackend()
    backend.flag = "--generator"  # as eval_command.run_eval and diagnose.run_diagnose set it
    backend.build(model, tok)
    assert "(--generator.init_args.dtype=float32|bfloat16 to choose)" in caplog.text
    assert "--data.generator" not in caplog.text
    with pytest.raises(ValueError, match=r"^--generator\.init_args\.dtype must be one of"):
        HFGenerator(model, tok, dtype="half", dtype_flag="--generator.init_args.dtype")
