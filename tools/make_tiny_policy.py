"""Build the embedded default policy (flywheel/assets/policies/tiny-countdown/), deterministically.

    python tools/make_tiny_policy.py                        # rewrites the shipped policy
    python tools/make_tiny_policy.py --out /tmp/p --steps 200 --seed 1   # a variant elsewhere
    python tools/make_tiny_policy.py --out flywheel/assets/policies/tiny-countdown-h3 --num_heads 3   # the vLLM one
    python tools/make_tiny_policy.py --out /tmp/p --hold_out val.jsonl   # SFT never sees val.jsonl's number multisets
    python tools/make_tiny_policy.py --task chain --steps 300 --eval_max_new_tokens 192   # tiny-chain (its card has the exact command)

A character tokenizer and a small Llama built from config (flywheel.policies.tiny), trained by SFT on
solver traces of the TRAIN split only ("5 9 8|67\\n" -> "9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>"
then EOS), with the loss on the completion and EOS, never on the prompt. It is deliberately
UNDERTRAINED: a correct-only SFT base that solves some held-out problems but far from all
gains the most from RL (shared/notes/tiny-countdown-rl.md: 300 steps -> ~15% Pass@1, 800 ->
~36%), and Pass@8 well above Pass@1 leaves the search something to find.

The recipe and its training loop are tools/tiny_policy_sft.py, the evaluation and the model
card tools/tiny_policy_card.py. The tool then samples the held-out splits with HFGenerator at T = 1.0, grades with the
Countdown verifier and writes the model card (README.md) and eval_results.json from those
measurements, so the shipped folder is reproducible by this one command. Weights depend only
on the arguments (seeded init, seeded data order, fixed thread count); the wall time does not.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the two halves beside this script
from tiny_policy_card import EVAL_SPLITS, evaluate, model_card, sha256  # noqa: E402
from tiny_policy_sft import Recipe, problem_traces, train_sft  # noqa: E402

from flywheel.assets import asset_path  # noqa: E402
from flywheel.tasks.chain import ChainTask  # noqa: E402
from flywheel.tasks.countdown import CountdownTask  # noqa: E402
from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402
from flywheel.run.flags import StrictParser  # noqa: E402

__all__ = ["Recipe", "evaluate", "main"]
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


TASKS = {"countdown": (CountdownTask, "tiny-countdown"), "chain": (ChainTask, "tiny-chain")}
"""--task: the task whose train split the policy learns, and the shipped folder it writes by default."""


def parse_args(argv: list[str]) -> tuple[Path, Path | None, Recipe, str, tuple[str, ...]]:
    """(out, hold_out, recipe, task name, the card's splits) from the command line."""
    defaults = Recipe()
    parser = StrictParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="countdown",
                        help="the task: countdown (the default policy) or chain (tiny-chain, chain arithmetic)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: the task's shipped policy, flywheel/assets/policies/tiny-<task>)")
    parser.add_argument("--hold_out", type=Path, default=None,
                        help="countdown: a jsonl of Countdown problems: train problems with any of their number multisets "
                             "are left out of SFT (a validation split as new to the policy as the test split's multisets)")
    parser.add_argument("--eval_splits", default=",".join(EVAL_SPLITS),
                        help="the held-out splits the card measures, comma-separated (default: the shipped card's; "
                             "e.g. val while choosing a recipe, so the test splits are read once)")
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=f"default {value}")
    args = vars(parser.parse_args(argv))
    task, out, hold_out = args.pop("task"), args.pop("out"), args.pop("hold_out")
    splits = tuple(s for s in args.pop("eval_splits").split(",") if s)
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
    for index, split in enumerate(eval_splits):
        problems = task.problems(split)
        scores[split] = evaluate(model, tokenizer, task, problems, recipe, split_seed=recipe.seed * 10 + index)
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
    (out / "README.md").write_text(model_card(out.name, command, recipe, summary, scores, task_name), encoding="utf-8")
    results = {"command": command, "task": task_name, "recipe": asdict(recipe), "summary": summary,
               "eval": {split: asdict(s) for split, s in scores.items()}}
    (out / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log.info("wrote %s (%.2f MB) in %.0f s", out, size / 1e6, summary["wall_seconds"])


if __name__ == "__main__":
    main()
