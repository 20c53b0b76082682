"""The shipped default policy (flywheel/assets/policies/tiny-countdown), built by
tools/make_tiny_policy.py. Nothing here retrains it: these check the committed folder, that
its card describes these weights, and measure the weights against the card's score."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from flywheel.assets import asset_path
from flywheel.generation import GenerationRequest, SamplingParams
from flywheel.generation.hf import HFGenerator
from flywheel.policies.load import load_policy
from flywheel.rewards.countdown import verify
from flywheel.tasks.countdown import CountdownTask

FOLDER = asset_path("policies", "tiny-countdown")
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "README.md", "eval_results.json")


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny-countdown")


@pytest.fixture(scope="module")
def results():
    return json.loads((FOLDER / "eval_results.json").read_text(encoding="utf-8"))


def test_folder_is_complete_and_small():
    for name in FILES:
        assert (FOLDER / name).is_file(), name
    size = sum(f.stat().st_size for f in FOLDER.rglob("*") if f.is_file())
    assert size <= 20 * 2**20, f"{size / 2**20:.1f} MiB"


def test_loads_with_transformers_and_vocab_matches_tokenizer():
    model = AutoModelForCausalLM.from_pretrained(FOLDER)
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    # Otherwise a generator could sample ids the tokenizer cannot decode (vllm-cpu.md §2).
    assert model.config.vocab_size == len(tokenizer) == 100
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    assert model.config.eos_token_id == model.generation_config.eos_token_id == tokenizer.eos_token_id
    trace = "5 9 8|67\n9*8=72\n<answer>(9*8)-5</answer>"
    assert tokenizer.decode(tokenizer(trace)["input_ids"], skip_special_tokens=True) == trace


def test_load_policy_by_builtin_name(policy):
    model, tokenizer = policy
    assert model.config.vocab_size == len(tokenizer)
    assert model.dtype == torch.float32


def test_card_states_how_it_was_made_and_its_scores(results):
    card = (FOLDER / "README.md").read_text(encoding="utf-8")
    assert "python tools/make_tiny_policy.py" in card
    assert results["command"] in card
    for split in ("test", "test_hard"):
        score = results["eval"][split]
        n = score["samples_per_problem"]
        # The card's table row shows the measured Pass@1 and Pass@n of this split.
        row = next(line for line in card.splitlines() if line.startswith(f"| {split}.jsonl |"))
        assert f"**{100 * score['pass_at_1']:.1f}%**" in row
        assert f"**{100 * score['pass_at_k'][str(n)]:.1f}%**" in row
    assert re.search(r"Pass@1 \| Pass@8", card)
    assert f"{results['summary']['parameters']:,} parameters" in card


def test_shipped_scores_are_in_the_intended_band(results):
    """Weak but not hopeless on test.jsonl, and sampling more finds more (issue requirements)."""
    test = results["eval"]["test"]
    assert test["problems"] == 600 and test["samples_per_problem"] == 8
    assert 0.05 <= test["pass_at_1"] <= 0.40
    assert test["pass_at_k"]["8"] >= test["pass_at_1"] + 0.15


def test_the_card_describes_these_weights(results):
    import hashlib

    digest = hashlib.sha256((FOLDER / "model.safetensors").read_bytes()).hexdigest()
    assert digest == results["summary"]["safetensors_sha256"]
    model = AutoModelForCausalLM.from_pretrained(FOLDER)
    assert sum(p.numel() for p in model.parameters()) == results["summary"]["parameters"]


def test_shipped_weights_score_what_the_card_says_within_sampling_error(policy, results):
    """Measure the shipped weights: 200 test problems x 2 samples at T = 1.0 (the card's
    temperature and length cap). The mean of per-problem pass rates has a standard error of at
    most sqrt(p (1 - p) / 200); the card's p = 0.184 gives 0.027, so 4 standard errors allow
    0.110 either way: a broken or swapped model (pass@1 near 0) fails, sampling noise does not."""
    model, tokenizer = policy
    card = results["eval"]["test"]["pass_at_1"]
    task = CountdownTask()
    problems = task.problems("test")[:200]
    params = SamplingParams(max_new_tokens=results["recipe"]["eval_max_new_tokens"],
                            temperature=results["recipe"]["eval_temperature"])
    requests = [GenerationRequest(tuple(tokenizer(task.prompt(p))["input_ids"]), 2, params, seed=i)
                for i, p in enumerate(problems)]
    completions = HFGenerator(model, tokenizer).sample(requests)
    correct = [
        verify(p.numbers, p.target, tokenizer.decode(c.token_ids, skip_special_tokens=True)).correct
        for p, samples in zip(problems, completions) for c in samples
    ]
    measured = sum(correct) / len(correct)
    tolerance = 4 * (card * (1 - card) / len(problems)) ** 0.5
    assert abs(measured - card) <= tolerance, f"measured pass@1 {measured:.3f}, card {card:.3f} +- {tolerance:.3f}"
    # A trained policy ends its answers with EOS rather than running to the length cap.
    ends = [c.finish_reason for samples in completions for c in samples]
    assert ends.count("eos") / len(ends) > 0.9


def test_the_card_is_measured_by_the_run_s_evaluator_with_the_card_s_seeds(policy, results):
    """tools/make_tiny_policy.py grades through flywheel.reporting.evaluation (the evaluator of fit, eval
    and validate) yet keeps the per-problem seeds the shipped card was measured with: on 40
    test problems it counts what sampling those seeds directly counts. (The whole card,
    1,100 problems x 8 samples, reproduces eval_results.json exactly: the make_tiny_policy
    evaluate on the shipped weights, a few minutes on 2 cores.)"""
    import sys
    from collections import Counter
    from dataclasses import replace as with_fields
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from make_tiny_policy import Recipe, evaluate

    model, tokenizer = policy
    recipe = with_fields(Recipe(**results["recipe"]), eval_samples=4)
    task = CountdownTask(max_response_tokens=recipe.eval_max_new_tokens)
    problems = task.problems("test")[:40]
    with torch.no_grad():
        card = evaluate(model, tokenizer, task, problems, recipe, split_seed=0)
        params = SamplingParams(max_new_tokens=recipe.eval_max_new_tokens, temperature=recipe.eval_temperature)
        requests = [GenerationRequest(tuple(tokenizer(task.prompt(p))["input_ids"]), 4, params, seed=i)
                    for i, p in enumerate(problems)]
        completions = HFGenerator(model, tokenizer, max_batch_size=512).sample(requests)
    verdicts = [[verify(p.numbers, p.target, tokenizer.decode(c.token_ids, skip_special_tokens=True)) for c in samples]
                for p, samples in zip(problems, completions)]
    assert card.pass_at_1 == sum(sum(v.correct for v in vs) / 4 for vs in verdicts) / len(problems)
    assert card.reasons == dict(Counter(v.reason for vs in verdicts for v in vs))
    assert card.mean_completion_tokens == sum(len(c.token_ids) for s in completions for c in s) / (4 * len(problems))


def test_hold_out_leaves_a_validation_split_s_multisets_out_of_sft(tmp_path):
    """`--hold_out FILE` drops every train problem sharing a number multiset with FILE's
    problems (in any order), and nothing else."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from make_tiny_policy import held_out, parse_args

    train = CountdownTask().problems("train")
    held = tmp_path / "val.jsonl"
    held.write_text(json.dumps({"id": "v", "numbers": [13, 1, 6], "target": 8}) + "\n")  # train-00003's [6, 1, 13]
    kept = held_out(train, held)
    dropped = [p for p in train if sorted(p.numbers) == [1, 6, 13]]
    assert dropped and len(kept) == len(train) - len(dropped)
    assert all(sorted(p.numbers) != [1, 6, 13] for p in kept)
    assert held_out(train, None) is train
    out, hold_out, recipe, task, splits = parse_args(["--out", str(tmp_path / "p"), "--hold_out", str(held), "--steps", "300"])
    assert (hold_out, recipe.steps, task, splits) == (held, 300, "countdown", ("test", "test_hard"))
