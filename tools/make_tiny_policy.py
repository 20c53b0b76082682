"""Build the embedded default policy (flywheel/assets/policies/tiny-countdown/), deterministically.

    python tools/make_tiny_policy.py                        # rewrites the shipped policy
    python tools/make_tiny_policy.py --out /tmp/p --steps 200 --seed 1   # a variant elsewhere
    python tools/make_tiny_policy.py --out flywheel/assets/policies/tiny-countdown-h3 --num_heads 3   # the vLLM one
    python tools/make_tiny_policy.py --out /tmp/p --hold_out val.jsonl   # SFT never sees val.jsonl's number multisets
    python tools/make_tiny_policy.py --task chain --steps 1200 --eval_max_new_tokens 192   # tiny-chain (its card's command)
    python tools/make_tiny_policy.py --task mastermind --steps 600   # tiny-mastermind (likewise)

A character tokenizer and a small Llama built from config (flywheel.policies.tiny), trained by SFT on
solver traces of the TRAIN split only ("5 9 8|67\\n" -> "9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>"
then EOS), with the loss on the completion and EOS, never on the prompt. It is deliberately
UNDERTRAINED: a correct-only SFT base that solves some held-out problems but far from all
gains the most from RL (shared/notes/tiny-countdown-rl.md: 300 steps -> ~15% Pass@1, 800 ->
~36%), and Pass@8 well above Pass@1 leaves the search something to find.

The recipe is tools/tiny_policy_sft.py, whose traces and training loop are `flywheel sft`'s own
(flywheel.sft, float32 and padded rows), the evaluation and the model card tools/tiny_policy_card.py. The tool then samples the held-out splits with HFGenerator at T = 1.0, grades with the
Countdown verifier and writes the model card (README.md) and eval_results.json from those
measurements, so the shipped folder is reproducible by this one command. `--task mastermind`
learns whole episodes of a noisy Mastermind solver instead (tools/tiny_policy_sft.py) and its
card plays whole episodes of the val and test secrets (`mastermind_score`): win rate, mean
turns and how the lost episodes failed. Weights depend only
on the arguments (seeded init, seeded data order, fixed thread count); the wall time does not.
"""

from __future__ import annotations

import json
import logging
import random
import os
import platform
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the two halves beside this script
from tiny_policy_card import EVAL_SPLITS, SplitScore, evaluate, model_card, sha256  # noqa: E402
from tiny_policy_sft import Recipe, episode_traces, problem_traces, solver_episodes, train_sft  # noqa: E402

from flywheel.assets import asset_path  # noqa: E402
from flywheel.generation.hf import HFGenerator  # noqa: E402
from flywheel.reporting.problem_view import decoder, eos_ids, search_problems  # noqa: E402
from flywheel.search.config import SearchConfig  # noqa: E402
from flywheel.search.flat import flat_rollouts  # noqa: E402
from flywheel.tasks import Problem  # noqa: E402
from flywheel.tasks.chain import ChainTask  # noqa: E402
from flywheel.tasks.countdown import CountdownTask  # noqa: E402
from flywheel.tasks.mastermind import MastermindProblem, MastermindTask  # noqa: E402
from flywheel.tasks.mastermind_data import FAILURE_KINDS, NoisySolver, failure_kind, play  # noqa: E402
from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402

__all__ = ["Recipe", "evaluate", "main", "mastermind_score"]
log = logging.getLogger("make_tiny_policy")


def save_policy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out: Path, recipe: Recipe
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gen = model.generation_config
    gen.do_sample = True
    gen.temperature = recipe.eval_temperature
    gen.max_new_tokens = recipe.eval_max_new_tokens
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


TASKS = {"countdown": (CountdownTask, "tiny-countdown"), "chain": (ChainTask, "tiny-chain"),
         "mastermind": (MastermindTask, "tiny-mastermind")}
"""--task: the task whose train split the policy learns, and the shipped folder it writes by default."""
TASK_SPLITS = {"mastermind": ("val", "test")}
"""The held-out splits a task's card measures when not the Countdown and chain cards' `EVAL_SPLITS`."""


def parse_args(argv: list[str]) -> tuple[Path, Path | None, Recipe, str, tuple[str, ...]]:
    """(out, hold_out, recipe, task name, the card's splits) from the command line."""
    defaults = Recipe()
    parser = StrictParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="countdown",
                        help="the task: countdown (the default policy), chain (tiny-chain, chain arithmetic) or "
                             "mastermind (tiny-mastermind, episodes of an environment)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: the task's shipped policy, flywheel/assets/policies/tiny-<task>)")
    parser.add_argument("--hold_out", type=Path, default=None,
                        help="countdown: a jsonl of Countdown problems: train problems with any of their number multisets "
                             "are left out of SFT (a validation split as new to the policy as the test split's multisets)")
    parser.add_argument("--eval_splits", default=None,
                        help="the held-out splits the card measures, comma-separated (default: the shipped card's, "
                             f"{','.join(EVAL_SPLITS)}, or for mastermind {','.join(TASK_SPLITS['mastermind'])}; "
                             "e.g. val while choosing a recipe, so the test splits are read once)")
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=f"default {value}")
    args = vars(parser.parse_args(argv))
    task, out, hold_out = args.pop("task"), args.pop("out"), args.pop("hold_out")
    given = args.pop("eval_splits")
    splits = TASK_SPLITS.get(task, EVAL_SPLITS) if given is None else tuple(s for s in given.split(",") if s)
    if hold_out is not None and task != "countdown":
        parser.error("--hold_out holds out Countdown number multisets; it applies to --task countdown only")
    return out or asset_path("policies", TASKS[task][1]), hold_out, Recipe(**args), task, splits


def held_out(train: list, hold_out: Path | None) -> list:
    """`train` without the problems whose number multiset occurs in the `hold_out` file."""
    if hold_out is None:
        return train
    held = {tuple(sorted(p.numbers)) for p in CountdownTask(split_files={"held": str(hold_out)}).problems("held")}
    kept = [p for p in train if tuple(sorted(p.numbers)) not in held]
    log.info("held out of SFT: %d train problems sharing one of the %d number multisets of %s", len(train) - len(kept),
             len(held), hold_out)
    return kept


def mastermind_score(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: MastermindTask,
                     problems: list[Problem], recipe: Recipe, split_seed: int) -> SplitScore:
    """The card's `evaluate` (the run's evaluator: `eval_samples` whole episodes of each secret,
    turn by turn, seeded per secret), then the same episodes again through the flat rollouts it
    plays them with (flywheel.reporting.evaluation.episodes: the same seeds, search settings and
    batches, so the same episodes, checked against its verdicts) for what a verdict does not
    keep: each episode's turns and, for a lost one, its `failure_kind`. They go in `failures`."""
    score = evaluate(model, tokenizer, task, problems, recipe, split_seed)
    start = time.perf_counter()
    seeds = [split_seed * 1_000_003 + i for i in range(len(problems))]  # the seeds `evaluate` gives each secret
    search = SearchConfig(max_depth=task.max_turns, temperature=recipe.eval_temperature, top_p=1.0,
                          overlong_penalty=False)
    decode = decoder(tokenizer)
    results = flat_rollouts(search_problems(tokenizer, task, problems), HFGenerator(model, tokenizer, max_batch_size=512),
                            n=recipe.eval_samples, step=task.step, decode=decode, config=search,
                            max_concurrent_problems=max(len(problems), 1), eos_token_ids=eos_ids(tokenizer), seeds=seeds)
    reasons: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    turns, won_turns = [], []
    for problem, result in zip(problems, results, strict=True):
        for trajectory in result.trajectories:
            actions = [decode(step.token_ids) for step in trajectory.steps]
            reasons[trajectory.verdict.reason] += 1
            turns.append(len(actions))
            kind = failure_kind(task, problem, actions)
            if kind is None:
                won_turns.append(len(actions))
            else:
                kinds[kind] += 1
    if dict(reasons) != score.reasons:
        raise AssertionError(f"the flat rollouts replayed other episodes than the evaluator's: {dict(reasons)} "
                             f"!= {score.reasons}")
    if len(won_turns) != reasons["win"]:
        raise AssertionError(f"{len(won_turns)} episodes won by failure_kind, {reasons['win']} by the verdicts")
    profile = {"episodes": len(turns), "won": len(won_turns), "mean_turns": sum(turns) / len(turns),
               "mean_turns_won": sum(won_turns) / max(len(won_turns), 1),
               "failure_kinds": {kind: kinds[kind] for kind in FAILURE_KINDS}}
    return replace(score, failures=profile, seconds=score.seconds + time.perf_counter() - start)


def solver_record(task: MastermindTask, problems: list[Problem], episodes: list[list[list[str]]]) -> dict:
    """The SFT data's own record: episodes, wins, mean turns and the lost ones' failure kinds."""
    kinds: Counter[str] = Counter()
    played = [(problem, actions) for problem, group in zip(problems, episodes) for actions in group]
    for problem, actions in played:
        kinds[failure_kind(task, problem, actions)] += 1
    return {"episodes": len(played), "won": kinds.pop(None, 0),
            "mean_turns": sum(len(actions) for _, actions in played) / len(played),
            "failure_kinds": {kind: kinds[kind] for kind in FAILURE_KINDS}}


MASTERMIND_STEPS = """How many steps: chosen on val only (100 val secrets x 8 episodes), from snapshots of one
600-step run of this recipe: win rate (pass@1) 0.044 after 200 steps (pass@8 0.25), 0.198 after
400 (0.81), 0.289 after 600 (0.95). 600 is inside the 0.2-0.5 a deliberately weak policy should
win, with pass@8 far above it. (The same recipe with the consistent-random player and the
classic pegs stayed at 0.006 after 1200 steps: its loss never left the level of uniform digits.)"""
"""How the shipped tiny-mastermind's SFT length was chosen (the val sweep), for its card."""

KIND_TEXT = {
    "invalid_guess": "an invalid guess (a line that is not a code of 4 digits 1-6)",
    "inconsistent_guess": "a guess inconsistent with the feedback before it (a repeat included)",
    "out_of_turns": "out of turns, every guess well-formed and consistent",
    "unfinished": "unfinished (the policy ended the episode itself)",
}
"""The card's words for each `failure_kind`, in their order of precedence."""


def example_episode(secret: tuple[int, ...] = (3, 5, 1, 2)) -> str:
    """The card's example: the prompt and the noiseless lowest player's game for `secret`, guess
    and answer lines as the policy reads them."""
    task = MastermindTask()
    problem = MastermindProblem.create("example", secret)
    actions = play(task, problem, NoisySolver(pick="lowest"), random.Random(0))
    lines = [task.prompt(problem)] + [a + t.observation for a, t in zip(actions, task.episode(problem, actions))]
    return "".join(lines).rstrip("\n")


def mastermind_card(name: str, command: str, recipe: Recipe, summary: dict, scores: dict[str, SplitScore]) -> str:
    """The README.md of a Mastermind policy folder, written from this run's measurements."""
    n = recipe.eval_samples
    rows, reasons, kinds = [], [], []
    for split, s in scores.items():
        f = s.failures
        ks = " / ".join(f"{100 * v:.1f}%" for k, v in s.pass_at_k.items() if k > 1)
        rows.append(f"| {split}.jsonl | {s.problems} | {n} | **{100 * s.pass_at_1:.1f}%** | **{100 * s.pass_at_k[n]:.1f}%** "
                    f"| {ks} | {f['mean_turns']:.2f} | {f['mean_turns_won']:.2f} | {s.mean_completion_tokens:.1f} |")
        reasons.append(f"- {split}: " + ", ".join(f"{r} {100 * c / f['episodes']:.1f}%" for r, c in s.reasons.items()))
        lost = f["episodes"] - f["won"]
        kinds.append(f"- {split}: {lost} lost episodes: " + ", ".join(
            f"**{100 * c / max(lost, 1):.1f}%** {KIND_TEXT[k]}" for k, c in f["failure_kinds"].items()) + ".")
    k_header = " / ".join(f"Pass@{k}" for k in next(iter(scores.values())).pass_at_k if k > 1)
    data = summary["solver"]
    data_lost = data["episodes"] - data["won"]
    data_kinds = ", ".join(f"{k} {100 * c / max(data_lost, 1):.1f}%" for k, c in data["failure_kinds"].items())
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [flywheel, mastermind, tiny, sft]
---

# {name}

flywheel's Mastermind policy (`--model.policy={name}`, with `flywheel.tasks.mastermind.MastermindTask`):
a {summary['parameters']:,}-parameter Llama-style causal LM with a character tokenizer, trained by SFT on
whole episodes of a noisy Mastermind solver. It is **deliberately weak**: at temperature 1.0 it
wins some held-out games within the 8 turns but far from all, and it loses by mistakes of both
kinds (a line that is not a code, a guess that ignores earlier feedback; a player consistent
throughout never runs out of the 8 turns: it wins within 6), so RL (flat GRPO or a tree that
branches on guess lines) has room to improve it on a CPU.

An episode as the policy reads it (the tokenizer adds `<bos>`; each guess line is the policy's,
each line of marks the environment's (G right place, Y elsewhere in the code, . not in it); the environment ends the episode, there is no `<eos>`):

```
{example_episode()}
```

## Measured (this run)

Whole episodes played by flywheel's evaluator (`flywheel.reporting.evaluation.evaluate`: turn by
turn, the environment's answer after each guess, as the search builds the context) with
`flywheel.generation.hf.HFGenerator` at temperature {recipe.eval_temperature}, top_p 1.0, at most
{MastermindTask().step.max_tokens} tokens a guess line and {MastermindTask().max_turns} turns; {n} episodes per secret (seeded per
secret) over **all** secrets of each split. Pass@1 is the win rate (mean c/n); pass@{n}, the
share of secrets with any won episode (unbiased estimator). Mean turns count every episode (a
game lost out of turns counts all 8); guess tokens are those the policy wrote per episode.

| split | secrets | episodes/secret | Pass@1 (win rate) | Pass@{n} | {k_header} | mean turns | mean turns of wins | guess tokens per episode |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

val.jsonl and test.jsonl: 200 secrets each of the 1296 codes of 4 digits 1-6, none in another
split (tools/make_mastermind_splits.py); the policy learned from the other 896 (train.jsonl).

Verdicts of all episodes:
{chr(10).join(reasons)}

How the lost episodes failed (`flywheel.tasks.mastermind_data.failure_kind` on each episode's
guesses, read from the same episodes replayed through the flat rollouts that evaluation plays
them with; the first kind that applies, in this order):
{chr(10).join(kinds)}

## How it was made

```
{command}
```

{MASTERMIND_STEPS}

- Seed {recipe.seed} (model init, solver episodes, data order, evaluation samples);
  `torch.set_num_threads({recipe.threads})`. Weights are deterministic given the arguments;
  `model.safetensors` sha256 of this run: `{summary['safetensors_sha256']}`.
- Data: {recipe.max_solutions} episodes of `flywheel.tasks.mastermind_data.NoisySolver(noise={recipe.solver_noise:g}, pick="{recipe.solver_pick}")` (a
  consistent player: the {"smallest code" if recipe.solver_pick == "lowest" else "code drawn at random from those"} that {"fits" if recipe.solver_pick == "lowest" else "fit"} all the feedback so far, or with
  probability {recipe.solver_noise:g} a mistake: a random code, or for a quarter of the mistakes a malformed
  line) against each of the {summary['train_problems']} secrets of `flywheel/assets/mastermind/train.jsonl` only
  ({data['episodes']} episodes, played by `mastermind_data.play`; each visit of a secret picks one of
  its episodes at random). The solver won {100 * data['won'] / data['episodes']:.1f}% of them in {data['mean_turns']:.2f} turns on
  average; its losses: {data_kinds}. Won and lost episodes alike are trained on.
  Why noise {recipe.solver_noise:g}: the mistakes make the policy's failures diverse (it has seen every kind of
  wasted guess) and its episodes show play going on after one, while the solver still wins
  nearly every game (mastermind.py's table, the lowest player: 0.98 at noise 0.2, 0.97 at 0.3,
  within 8 turns), so the data mostly shows how a game is won. Why the lowest code and not a
  random one: a 3-layer model imitating the random player did not learn to use the feedback
  (val win rate 0.006 after 1200 steps, under the classic pegs); the lowest player's guess keeps
  the digits marked G and moves the others on, which it learns.
- Each episode is one sequence exactly as the search's context holds it: the prompt's ids
  (`flywheel.reporting.problem_view.encode_prompt`), then every guess and every observation
  encoded on its own with `add_special_tokens=False` (the search's token boundaries). Loss on
  the guess tokens only, never on the prompt or an observation; **no EOS**: the environment ends
  an episode, and one the policy ends with EOS is lost ("ended_by_policy").
- Tokenizer: `flywheel.policies.tiny.build_char_tokenizer()`, one token per character,
  {summary['vocab_size']} tokens; `vocab_size == len(tokenizer)`.
- Model: `flywheel.policies.tiny.build_tiny_llama` — LlamaForCausalLM, hidden {recipe.hidden_size}, {recipe.num_layers} layers,
  {recipe.num_heads} heads, MLP {recipe.intermediate_size}, tied embeddings, fp32, **{summary['parameters']:,} parameters**.
- SFT: {recipe.steps} steps, batch {recipe.batch_size} episodes, AdamW (weight decay {recipe.weight_decay}), peak lr {recipe.lr:g},
  {recipe.warmup_steps} warmup steps then cosine to {recipe.min_lr_ratio:g} x lr, grad clip {recipe.grad_clip:g}.
  Loss {summary['first_loss']:.3f} at step 1, mean {summary['last_loss']:.3f} over the last 20 steps (per guess token).
- Wall time: {summary['wall_seconds']:.0f} s in all (SFT {summary['sft_seconds']:.0f} s, median
  {summary['median_step_seconds']:.2f} s per step; evaluation of {' and '.join(scores)} {summary['eval_seconds']:.0f} s, each split's
  episodes played twice: the evaluator, then the failure kinds) on {recipe.threads} CPU threads
  ({summary['machine']}). torch {torch.__version__}, transformers {transformers.__version__}.
"""


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    out, hold_out, recipe, task_name, eval_splits = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    start = time.perf_counter()
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)

    task = TASKS[task_name][0](max_response_tokens=recipe.eval_max_new_tokens)
    tokenizer = build_char_tokenizer()
    train = held_out(task.problems("train"), hold_out)
    solver = None
    if isinstance(task, MastermindTask):
        episodes = solver_episodes(task, train, recipe)
        solver = solver_record(task, train, episodes)
        log.info("noisy solver (noise %g): %s", recipe.solver_noise, solver)
        traces = episode_traces(task, tokenizer, train, episodes)
    else:
        traces = problem_traces(task, tokenizer, train, recipe.max_solutions)
    model = build_tiny_llama(tokenizer, hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                             num_heads=recipe.num_heads, intermediate_size=recipe.intermediate_size,
                             seed=recipe.seed)
    if model.config.vocab_size != len(tokenizer):
        raise AssertionError(f"vocab_size {model.config.vocab_size} != len(tokenizer) {len(tokenizer)}")
    parameters = sum(p.numel() for p in model.parameters())
    n_traces = sum(map(len, traces))
    log.info("%d train problems, %d traces; model %d parameters", len(train), n_traces, parameters)

    sft_start = time.perf_counter()
    losses, step_seconds = train_sft(model, traces, recipe, tokenizer.pad_token_id)
    sft_seconds = time.perf_counter() - sft_start

    scores = {}
    score = mastermind_score if isinstance(task, MastermindTask) else evaluate
    for index, split in enumerate(eval_splits):
        problems = task.problems(split)
        scores[split] = score(model, tokenizer, task, problems, recipe, split_seed=recipe.seed * 10 + index)
        s = scores[split]
        log.info("%s: pass@1 %.3f pass@%d %.3f (%d problems x %d, %.0f s) %s", split, s.pass_at_1,
                 s.samples_per_problem, s.pass_at_k[s.samples_per_problem], s.problems, s.samples_per_problem,
                 s.seconds, s.reasons)
        if s.failures:
            log.info("%s failures: %s", split, s.failures)

    save_policy(model, tokenizer, out, recipe)
    summary = {
        "parameters": parameters,
        "vocab_size": model.config.vocab_size,
        "train_problems": len(train),
        "train_traces": n_traces,
        **({"solver": solver} if solver is not None else {}),
        "first_loss": losses[0],
        "last_loss": sum(losses[-20:]) / len(losses[-20:]),
        "sft_seconds": sft_seconds,
        "median_step_seconds": statistics.median(step_seconds),
        "eval_seconds": sum(s.seconds for s in scores.values()),
        "wall_seconds": time.perf_counter() - start,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores visible",
        "safetensors_sha256": sha256(out / "model.safetensors"),
    }
    command = " ".join(["python tools/make_tiny_policy.py", *map(shlex.quote, argv)])
    card = (mastermind_card(out.name, command, recipe, summary, scores) if task_name == "mastermind"
            else model_card(out.name, command, recipe, summary, scores, task_name))
    (out / "README.md").write_text(card, encoding="utf-8")
    results = {"command": command, "task": task_name, "recipe": asdict(recipe), "summary": summary,
               "eval": {split: asdict(s) for split, s in scores.items()}}
    (out / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log.info("wrote %s (%.2f MB) in %.0f s", out, size / 1e6, summary["wall_seconds"])


if __name__ == "__main__":
    main()
