"""Build the embedded default policy (flywheel/assets/policies/tiny-countdown/), deterministically.

    python tools/make_tiny_policy.py                        # rewrites the shipped policy
    python tools/make_tiny_policy.py --out /tmp/p --steps 200 --seed 1   # a variant elsewhere
    python tools/make_tiny_policy.py --out flywheel/assets/policies/tiny-countdown-h3 --num_heads 3   # the vLLM one

A character tokenizer and a small Llama built from config (flywheel.tiny), trained by SFT on
solver traces of the TRAIN split only ("5 9 8|67\\n" -> "9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>"
then EOS), with the loss on the completion and EOS, never on the prompt. It is deliberately
UNDERTRAINED: a correct-only SFT base that solves some held-out problems but far from all
gains the most from RL (shared/notes/tiny-countdown-rl.md: 300 steps -> ~15% Pass@1, 800 ->
~36%), and Pass@8 well above Pass@1 leaves the search something to find.

The tool then samples the held-out splits with HFGenerator at T = 1.0, grades with the
Countdown verifier and writes the model card (README.md) and eval_results.json from those
measurements, so the shipped folder is reproducible by this one command. Weights depend only
on the arguments (seeded init, seeded data order, fixed thread count); the wall time does not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from flywheel.assets import asset_path
from flywheel.evaluation import EvalConfig, evaluate_sharded
from flywheel.generation.hf import HFGenerator
from flywheel.rewards.countdown import verify
from flywheel.tasks.countdown import CountdownProblem, CountdownTask
from flywheel.tasks.countdown_data import format_completion, iter_solutions
from flywheel.tiny import build_char_tokenizer, build_tiny_llama

log = logging.getLogger("make_tiny_policy")

EVAL_SPLITS = ("test", "test_hard")

ROLES = {
    "tiny-countdown": ("The default policy of flywheel", ""),
    "tiny-countdown-h3": (
        "The vLLM twin of flywheel's default policy",
        "\nThe default policy's recipe with 3 attention heads of 32 dimensions instead of 4 of 24 (same\n"
        "parameter count): vLLM's CPU attention kernels need a head size of at least 32, so this is\n"
        "the policy of conf/quickstart_vllm.yaml.\n",
    ),
}
"""What each shipped policy folder is for, by folder name (the model card's first line)."""


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the shipped weights and their evaluation. Defaults = shipped.

    Attributes:
        seed: seeds the model init, the data order and the evaluation samples.
        hidden_size: model width (tiny-countdown-rl.md: 96 / 3 layers is the largest that
            trains fast enough on 2 cores).
        num_layers: decoder layers.
        num_heads: attention heads.
        intermediate_size: MLP width.
        steps: SFT optimizer steps; the only cap on training (a wall-clock cap would make
            the weights depend on machine load).
        batch_size: traces per step.
        lr: peak AdamW learning rate.
        warmup_steps: linear warmup, then cosine decay to `min_lr_ratio * lr`.
        min_lr_ratio: floor of the cosine schedule as a fraction of `lr`.
        weight_decay: AdamW weight decay.
        grad_clip: max gradient norm.
        max_solutions: most distinct solver traces kept per train problem; each time a
            problem is drawn one of them is picked at random, so the policy sees several
            routes and its samples stay diverse (Pass@k > Pass@1).
        threads: torch CPU threads (fixed, for speed and float-level reproducibility).
        eval_samples: samples per held-out problem (pass@k is reported for k <= this).
        eval_max_new_tokens: cap on a whole sampled completion.
        eval_temperature: sampling temperature of the evaluation.
    """

    seed: int = 0
    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 384
    steps: int = 500
    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_solutions: int = 16
    threads: int = 2
    eval_samples: int = 8
    eval_max_new_tokens: int = 128
    eval_temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"--steps and --batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"--warmup_steps must be in [0, --steps), got {self.warmup_steps} with --steps {self.steps}"
            )
        if self.eval_samples < 1:
            raise ValueError(f"--eval_samples must be >= 1, got {self.eval_samples}")


# -- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """One SFT sequence: BOS + prompt + completion + EOS; the loss starts at `prompt_len`."""

    input_ids: tuple[int, ...]
    prompt_len: int


def problem_traces(
    task: CountdownTask,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[CountdownProblem],
    max_solutions: int,
) -> list[list[Trace]]:
    """Per problem, up to `max_solutions` tokenized solver traces, each checked by the verifier."""
    out = []
    for problem in problems:
        prompt_ids = tokenizer(task.prompt(problem))["input_ids"]  # BOS + prompt
        traces = []
        for k, steps in enumerate(iter_solutions(problem.numbers, problem.target)):
            if k == max_solutions:
                break
            completion = format_completion(problem.numbers, steps)
            if not verify(problem.numbers, problem.target, completion).correct:
                raise AssertionError(f"{problem.id}: solver trace {completion!r} fails the verifier")
            ids = prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"]
            traces.append(Trace(tuple(ids + [tokenizer.eos_token_id]), len(prompt_ids)))
        if not traces:
            raise AssertionError(f"{problem.id}: no positive-integer solution (the train split has none such)")
        out.append(traces)
    return out


def sft_batches(traces: list[list[Trace]], recipe: Recipe, pad_id: int):
    """Yield `recipe.steps` (input_ids, attention_mask, labels) batches, each [B, T], right-padded.

    Problems are visited in seeded random epochs; each visit picks one of the problem's
    traces at random. Labels are -100 on the prompt and the padding (loss on completion + EOS).
    """
    rng = torch.Generator().manual_seed(recipe.seed)
    order: list[int] = []
    for _ in range(recipe.steps):
        while len(order) < recipe.batch_size:
            order += torch.randperm(len(traces), generator=rng).tolist()
        picked, order = order[: recipe.batch_size], order[recipe.batch_size :]
        choice = torch.randint(0, 1 << 30, (len(picked),), generator=rng).tolist()
        batch = [traces[p][c % len(traces[p])] for p, c in zip(picked, choice)]
        width = max(len(t.input_ids) for t in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for row, t in enumerate(batch):
            n = len(t.input_ids)
            ids[row, :n] = torch.tensor(t.input_ids)
            mask[row, :n] = 1
            labels[row, t.prompt_len : n] = ids[row, t.prompt_len : n]
        yield ids, mask, labels


# -- training --------------------------------------------------------------------------------


def lr_at(step: int, recipe: Recipe) -> float:
    """Linear warmup over `warmup_steps`, then cosine from `lr` down to `min_lr_ratio * lr`."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    floor = recipe.min_lr_ratio
    return recipe.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_sft(
    model: PreTrainedModel, traces: list[list[Trace]], recipe: Recipe, pad_id: int
) -> tuple[list[float], list[float]]:
    """Run the SFT steps in place; returns the loss and the seconds of every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    model.train()
    losses, seconds = [], []
    start = last = time.perf_counter()
    for step, (ids, mask, labels) in enumerate(sft_batches(traces, recipe, pad_id)):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - last)
        last = time.perf_counter()
        if step % 50 == 0 or step == recipe.steps - 1:
            log.info("sft step %d/%d loss %.4f lr %.2e (%.0f s)", step + 1, recipe.steps, losses[-1],
                     lr_at(step, recipe), time.perf_counter() - start)
    model.eval()
    return losses, seconds


# -- evaluation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitScore:
    """Held-out results of one split: unbiased pass@k over problems, and failure reasons."""

    problems: int
    samples_per_problem: int
    pass_at_1: float
    pass_at_k: dict[int, float]
    reasons: dict[str, int]
    mean_completion_tokens: float
    seconds: float


def evaluate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: CountdownTask,
    problems: list[CountdownProblem], recipe: Recipe, split_seed: int,
) -> SplitScore:
    """Sample `eval_samples` completions per problem (seeded per problem) and grade them with
    the run's one evaluator (flywheel.evaluation), in one generator call. The task's response
    budget is the length cap (`eval_max_new_tokens`)."""
    start = time.perf_counter()
    n = recipe.eval_samples
    config = EvalConfig(samples=n, temperature=recipe.eval_temperature, problems_per_batch=max(len(problems), 1))
    seeds = {p.id: split_seed * 1_000_003 + i for i, p in enumerate(problems)}  # the card's seeds since it shipped
    generator = HFGenerator(model, tokenizer, max_batch_size=512)
    result = evaluate_sharded(generator, tokenizer, task, problems, config, request_seed=lambda p: seeds[p.id])
    ks = sorted({k for k in (1, 2, 4, 8, n) if k <= n})
    return SplitScore(
        problems=len(problems),
        samples_per_problem=n,
        pass_at_1=sum(c / n for c in result.correct) / len(result.correct),
        pass_at_k={k: result.pass_at(k) for k in ks},
        reasons=dict(result.reasons),
        mean_completion_tokens=result.generated_tokens / (n * len(problems)),
        seconds=time.perf_counter() - start,
    )


# -- output ----------------------------------------------------------------------------------


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


def model_card(name: str, command: str, recipe: Recipe, summary: dict, scores: dict[str, SplitScore]) -> str:
    """The README.md of the policy folder, written from this run's measurements."""
    rows = []
    for split, s in scores.items():
        ks = " / ".join(f"{100 * v:.1f}%" for k, v in s.pass_at_k.items() if k > 1)
        rows.append(
            f"| {split}.jsonl | {s.problems} | {s.samples_per_problem} | **{100 * s.pass_at_1:.1f}%** | "
            f"**{100 * s.pass_at_k[s.samples_per_problem]:.1f}%** | {ks} | {s.mean_completion_tokens:.1f} |"
        )
    k_header = " / ".join(f"Pass@{k}" for k in next(iter(scores.values())).pass_at_k if k > 1)
    n = recipe.eval_samples
    reasons = "\n".join(
        f"- {split}: " + ", ".join(f"{r} {100 * c / (s.problems * n):.1f}%" for r, c in s.reasons.items())
        for split, s in scores.items()
    )
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [flywheel, countdown, tiny, sft]
---

# {name}

{ROLES.get(name, ("A variant of flywheel's default policy", ""))[0]} (`--model.policy={name}`): a {summary['parameters']:,}-parameter
Llama-style causal LM with a character tokenizer, trained by SFT on Countdown solver traces.
It is **deliberately weak**: it solves some held-out problems at temperature 1.0 but far from
all, so RL (flat GRPO or tree search) has room to improve it on a CPU in minutes.
{ROLES.get(name, ("", ""))[1]}
Prompt and completion (the tokenizer adds `<bos>`; the completion ends with `<eos>`):

```
5 9 8|67
9*8=72
72-5=67
<answer>(9*8)-5</answer>
```

## Measured (this run)

Temperature {recipe.eval_temperature}, top_p 1.0, at most {recipe.eval_max_new_tokens} new tokens, stop at EOS; sampled with
`flywheel.generation.hf.HFGenerator` (per-problem seeds), graded with
`flywheel.rewards.countdown.verify` (answer uses each given number exactly once and equals the
target). {n} samples per problem over **all** problems of each split; unbiased estimator
(pass@1 = mean c/n; pass@{n} with n = {n} = fraction of problems with any correct sample).

| split | problems | samples/problem | Pass@1 | Pass@{n} | {k_header} | mean completion tokens |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

test.jsonl: 3 numbers in 1..13, random reachable target in 1..99. test_hard.jsonl: 4 numbers,
the least frequent target of 10,000 random reductions (the hard set). Both are held out from
the train split by number multiset. Low test_hard scores are expected.

Verdicts of all samples:
{reasons}

## How it was made

```
{command}
```

- Seed {recipe.seed} (model init, data order, evaluation samples); `torch.set_num_threads({recipe.threads})`.
  Weights are deterministic given the arguments; `model.safetensors` sha256 of this run:
  `{summary['safetensors_sha256']}`.
- Data: solver traces (`flywheel.tasks.countdown_data.iter_solutions`, positive-integer
  intermediates) of the {summary['train_problems']} problems of `flywheel/assets/countdown/train.jsonl` only
  (4000 3-number + 4000 4-number hard problems), up to {recipe.max_solutions} distinct traces per problem
  ({summary['train_traces']} in all); each visit of a problem picks one of its traces at random. Every
  trace passes the verifier. Loss on the completion tokens and EOS only, not on the prompt.
- Tokenizer: `flywheel.tiny.build_char_tokenizer()`, one token per character,
  {summary['vocab_size']} tokens (`<pad>`, `<bos>`, `<eos>`, `<unk>`, newline, printable ASCII);
  `vocab_size == len(tokenizer)`.
- Model: `flywheel.tiny.build_tiny_llama` — LlamaForCausalLM, hidden {recipe.hidden_size}, {recipe.num_layers} layers,
  {recipe.num_heads} heads, MLP {recipe.intermediate_size}, tied embeddings, fp32, **{summary['parameters']:,} parameters**.
- SFT: {recipe.steps} steps, batch {recipe.batch_size}, AdamW (weight decay {recipe.weight_decay}), peak lr {recipe.lr:g},
  {recipe.warmup_steps} warmup steps then cosine to {recipe.min_lr_ratio:g} x lr, grad clip {recipe.grad_clip:g}.
  Loss {summary['first_loss']:.3f} at step 1, mean {summary['last_loss']:.3f} over the last 20 steps.
- Wall time: {summary['wall_seconds']:.0f} s in all (SFT {summary['sft_seconds']:.0f} s, median
  {summary['median_step_seconds']:.2f} s per step; evaluation of both splits {summary['eval_seconds']:.0f} s) on
  {recipe.threads} CPU threads ({summary['machine']}). When other jobs share the cores the total includes
  waiting for them; {recipe.steps} x the median step is about {recipe.steps * summary['median_step_seconds']:.0f} s of SFT.
  torch {torch.__version__}, transformers {transformers.__version__}.

Recipe and its measurements: shared/notes/tiny-countdown-rl.md (an undertrained correct-only
SFT base gains the most from RL).
"""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_args(argv: list[str]) -> tuple[Path, Recipe]:
    defaults = Recipe()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = asset_path("policies", "tiny-countdown")
    parser.add_argument("--out", type=Path, default=default_out, help="output folder")
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=f"default {value}")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    return out, Recipe(**args)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    out, recipe = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    start = time.perf_counter()
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)

    task = CountdownTask(max_response_tokens=recipe.eval_max_new_tokens)
    tokenizer = build_char_tokenizer()
    train = task.problems("train")
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
    for index, split in enumerate(EVAL_SPLITS):
        problems = task.problems(split)
        scores[split] = evaluate(model, tokenizer, task, problems, recipe, split_seed=recipe.seed * 10 + index)
        s = scores[split]
        log.info("%s: pass@1 %.3f pass@%d %.3f (%d problems x %d, %.0f s) %s", split, s.pass_at_1,
                 s.samples_per_problem, s.pass_at_k[s.samples_per_problem], s.problems, s.samples_per_problem,
                 s.seconds, s.reasons)

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
    (out / "README.md").write_text(model_card(out.name, command, recipe, summary, scores), encoding="utf-8")
    results = {"command": command, "recipe": asdict(recipe), "summary": summary,
               "eval": {split: asdict(s) for split, s in scores.items()}}
    (out / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log.info("wrote %s (%.2f MB) in %.0f s", out, size / 1e6, summary["wall_seconds"])


if __name__ == "__main__":
    main()
