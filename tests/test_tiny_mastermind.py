"""The shipped Mastermind policy (flywheel/assets/policies/tiny-mastermind), built by
`python tools/make_tiny_policy.py --task mastermind ...` (the exact command is in its card), and
the SFT examples it learned from. Nothing here retrains it: these check that an SFT episode is
the search's context with the loss on the guesses only (worked by hand), that the committed
folder is what its card describes, and play a few val episodes through flywheel's evaluation."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from flywheel.assets import asset_path
from flywheel.generation.base import Completion
from flywheel.policies.load import load_policy
from flywheel.policies.tiny import build_char_tokenizer
from flywheel.reporting.problem_view import decoder, eos_ids, search_problems
from flywheel.search.config import SearchConfig
from flywheel.search.flat import flat_rollouts
from scripted import ScriptedGenerator
from flywheel.tasks.mastermind import FEEDBACK_RULES, RULES, MastermindProblem, MastermindTask
from flywheel.tasks.mastermind_data import FAILURE_KINDS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_tiny_policy import mastermind_score  # noqa: E402
from tiny_policy_sft import Recipe, episode_trace, sft_batches, solver_episodes  # noqa: E402

FOLDER = asset_path("policies", "tiny-mastermind")
TASK = MastermindTask()
SECRET = MastermindProblem.create("s3512", (3, 5, 1, 2))
# Secret 3512 under marks: 1122's first 1 is in the code elsewhere (Y; the secret has one 1, so the
# second is .), its last 2 in place (G); 1314's 1 in place, its 3 elsewhere; 3512 wins.
ACTIONS = ["1122\n", "1314\n", "3512\n"]
OBSERVATIONS = ["Y..G\n", ".YG.\n", "GGGG\n"]
EPISODE = "".join(a + o for a, o in zip(ACTIONS, OBSERVATIONS))


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny-mastermind")


@pytest.fixture(scope="module")
def results():
    return json.loads((FOLDER / "eval_results.json").read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------ SFT examples
def test_an_sft_episode_trains_on_the_guesses_only_by_hand():
    tokenizer = build_char_tokenizer()
    trace = episode_trace(TASK, tokenizer, SECRET, ACTIONS)
    prompt = RULES.format(length=4, digits=6, legend=FEEDBACK_RULES["marks"].legend)
    assert trace.prompt_len == 1 + len(prompt)  # <bos>, then one token a character
    assert tokenizer.decode(trace.input_ids) == "<bos>" + prompt + EPISODE
    assert tokenizer.eos_token_id not in trace.input_ids  # the environment ends the episode, not EOS
    # Each guess is 5 tokens (4 digits and the newline), each observation 5 ("Y..G\n").
    guess, observation = [True] * 5, [False] * 5
    assert list(trace.loss_mask) == guess + observation + guess + observation + guess + observation
    # The batch's labels: -100 on the prompt and the observations; the guesses' own ids elsewhere.
    recipe = Recipe(steps=1, batch_size=1, warmup_steps=0)
    ids, mask, labels = next(sft_batches([[trace]], recipe, tokenizer.pad_token_id))
    assert ids[0].tolist() == list(trace.input_ids) and mask[0].all()
    trained = labels[0][labels[0] != -100].tolist()
    assert tokenizer.decode(trained) == "1122\n1314\n3512\n"
    assert (labels[0, : trace.prompt_len] == -100).all()


def test_an_sft_episode_is_the_context_the_search_builds():
    """The same episode played through the flat rollouts (the evaluation's and the fit's), a
    scripted generator writing the three guesses: the trajectory's prompt and response ids are
    the SFT sequence token for token, and its loss mask (observations never trained) is the
    trace's. The script is keyed by the exact prefixes, so each guess follows its observation."""
    tokenizer = build_char_tokenizer()
    trace = episode_trace(TASK, tokenizer, SECRET, ACTIONS)
    (problem,) = search_problems(tokenizer, TASK, [SECRET])
    script, prefix = {}, problem.prompt_ids
    for action, observation in zip(ACTIONS, OBSERVATIONS):
        ids = tuple(tokenizer(action, add_special_tokens=False)["input_ids"])
        script[prefix] = [Completion(ids, (-0.5,) * len(ids), "stop")]
        prefix = prefix + ids + tuple(tokenizer(observation, add_special_tokens=False)["input_ids"])
    (result,) = flat_rollouts([problem], ScriptedGenerator(script), n=1, step=TASK.step, decode=decoder(tokenizer),
                              config=SearchConfig(max_depth=TASK.max_turns, overlong_penalty=False),
                              eos_token_ids=eos_ids(tokenizer))
    (trajectory,) = result.trajectories
    assert trajectory.verdict.reason == "win" and trajectory.verdict.correct
    assert problem.prompt_ids + trajectory.response_ids == trace.input_ids
    assert trajectory.loss_mask == trace.loss_mask


def test_the_solver_s_episodes_are_seeded_per_secret():
    """Secret i's episodes depend on the recipe's seed and i only; another seed plays others."""
    secrets = TASK.problems("train")[:3]
    recipe = Recipe(max_solutions=2)
    played = solver_episodes(TASK, secrets, recipe)
    assert played == solver_episodes(TASK, secrets, recipe)
    assert [len(group) for group in played] == [2, 2, 2]
    assert all(TASK.episode(p, actions)[-1].done for p, group in zip(secrets, played) for actions in group)
    assert played != solver_episodes(TASK, secrets, Recipe(max_solutions=2, seed=1))
    assert solver_episodes(TASK, secrets[1:], recipe)[0] != played[1]  # seeded by position, as the card says


# ------------------------------------------------------------------------------ the shipped folder
def test_folder_card_and_weights_agree(policy, results):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md",
                 "eval_results.json"):
        assert (FOLDER / name).is_file(), name
    assert hashlib.sha256((FOLDER / "model.safetensors").read_bytes()).hexdigest() == \
        results["summary"]["safetensors_sha256"]
    card = (FOLDER / "README.md").read_text(encoding="utf-8")
    assert results["command"].startswith("python tools/make_tiny_policy.py --task mastermind")
    assert f"```\n{results['command']}\n```" in card
    assert results["task"] == "mastermind"
    recipe = results["recipe"]
    config = json.loads((FOLDER / "config.json").read_text(encoding="utf-8"))
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["intermediate_size"]) == (recipe["hidden_size"], recipe["num_layers"], recipe["num_heads"],
                                             recipe["intermediate_size"])
    model, tokenizer = policy
    assert sum(p.numel() for p in model.parameters()) == results["summary"]["parameters"]
    assert model.config.vocab_size == len(tokenizer) == results["summary"]["vocab_size"]
    assert f"**{results['summary']['parameters']:,} parameters**" in card
    for split in ("val", "test"):
        score = results["eval"][split]
        row = next(line for line in card.splitlines() if line.startswith(f"| {split}.jsonl |"))
        assert f"**{100 * score['pass_at_1']:.1f}%**" in row and f"**{100 * score['pass_at_k']['8']:.1f}%**" in row
        assert f"| {score['failures']['mean_turns']:.2f} |" in row
        lost = score["failures"]["episodes"] - score["failures"]["won"]
        assert sum(score["failures"]["failure_kinds"].values()) == lost
        assert f"- {split}: {lost} lost episodes: **" in card


def test_the_card_s_scores_are_in_the_intended_band(results):
    """The issue's band: val win rate (pass@1) roughly 0.2-0.5, pass@8 well above it, and the lost
    episodes failing by an invalid guess and by a guess inconsistent with the feedback. Not out of
    turns: a player consistent throughout wins within 6 of the 8 turns under marks (mastermind.py's
    table), so a lost episode always holds a mistake; the card reports that share (0) too."""
    val = results["eval"]["val"]
    assert 0.2 <= val["pass_at_1"] <= 0.5
    assert val["pass_at_k"]["8"] >= val["pass_at_1"] + 0.25
    kinds = val["failures"]["failure_kinds"]
    assert set(kinds) == set(FAILURE_KINDS)
    lost = val["failures"]["episodes"] - val["failures"]["won"]
    for kind in ("invalid_guess", "inconsistent_guess"):
        assert kinds[kind] >= 0.02 * lost, (kind, kinds)


def test_the_policy_plays_val_episodes_through_flywheel_s_evaluation(policy, results):
    """24 val secrets x 4 episodes through the card's evaluation (flywheel's evaluator, then the
    same episodes replayed for their turns and failure kinds, checked against its verdicts): the
    win rate is within 4 standard errors of the card's (a swapped or broken model fails; sampling
    noise does not), and the episodes are whole games of 1-8 turns."""
    model, tokenizer = policy
    card = results["eval"]["val"]["pass_at_1"]
    recipe = Recipe(**{**results["recipe"], "eval_samples": 4})
    secrets = TASK.problems("val")[:24]
    with torch.no_grad():
        score = mastermind_score(model, tokenizer, TASK, secrets, recipe, split_seed=recipe.seed * 10)
    episodes = score.failures
    assert episodes["episodes"] == 96 and sum(score.reasons.values()) == 96
    assert episodes["won"] == score.reasons.get("win", 0) == round(score.pass_at_1 * 96)
    assert sum(episodes["failure_kinds"].values()) == 96 - episodes["won"]
    assert 1 <= episodes["mean_turns"] <= TASK.max_turns and 1 <= episodes["mean_turns_won"] <= TASK.max_turns
    tolerance = 4 * (card * (1 - card) / len(secrets)) ** 0.5
    assert abs(score.pass_at_1 - card) <= tolerance, f"val win rate {score.pass_at_1:.3f}, card {card:.3f} +- {tolerance:.3f}"


def test_the_card_s_example_is_the_lowest_player_s_game(results):
    """The card's example episode is played by the tool, not written by hand: the noiseless
    lowest player's game for 3512, which mastermind.py's docstring shows too."""
    from make_tiny_policy import example_episode

    card = (FOLDER / "README.md").read_text(encoding="utf-8")
    episode = example_episode()
    assert f"```\n{episode}\n```" in card
    assert episode.splitlines()[1:] == ["1111", "..G.", "2212", "..GG", "3312", "G.GG", "3412", "G.GG", "3512", "GGGG"]
