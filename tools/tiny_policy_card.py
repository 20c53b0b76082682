"""The tiny policy's evaluation and model card (tools/make_tiny_policy.py): the held-out
splits sampled at T = 1.0 through the run's one evaluator (flywheel.reporting.evaluation) with the card's
per-problem seeds, and the README.md written from those measurements.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from flywheel.io import file_sha256
from flywheel.reporting.evaluation import EvalConfig, evaluate_sharded
from flywheel.generation.hf import HFGenerator
from flywheel.tasks import Problem, Task
from flywheel.tasks.chain import ChainTask
from flywheel.tasks.chain_data import failure_profile
from tiny_policy_sft import Recipe

EVAL_SPLITS = ("test", "test_hard")
"""The held-out splits the card measures (both tasks ship these two)."""

ROLES = {
    "tiny-countdown": ("The default policy of flywheel", ""),
    "tiny-countdown-h3": (
        "The vLLM twin of flywheel's default policy",
        "\nThe default policy's recipe with 3 attention heads of 32 dimensions instead of 4 of 24 (same\n"
        "parameter count): vLLM's CPU attention kernels need a head size of at least 32, so this is\n"
        "the policy of conf/quickstart_vllm.yaml.\n",
    ),
    "tiny-chain": ("flywheel's chain-arithmetic policy", ""),
}
"""What each shipped policy folder is for, by folder name (the model card's first line)."""


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
    failures: dict | None = None
    """Chains only (`chain_failures`): how the failed samples went wrong, line by line."""


def evaluate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task,
    problems: list[Problem], recipe: Recipe, split_seed: int,
) -> SplitScore:
    """Sample `eval_samples` completions per problem (seeded per problem) and grade them with
    the run's one evaluator (flywheel.reporting.evaluation), in one generator call. The task's response
    budget is the length cap (`eval_max_new_tokens`)."""
    start = time.perf_counter()
    n = recipe.eval_samples
    config = EvalConfig(samples=n, temperature=recipe.eval_temperature, problems_per_batch=max(len(problems), 1))
    seeds = {p.id: split_seed * 1_000_003 + i for i, p in enumerate(problems)}  # the card's seeds since it shipped
    generator = HFGenerator(model, tokenizer, max_batch_size=512)
    result = evaluate_sharded(generator, tokenizer, task, problems, config, request_seed=lambda p: seeds[p.id])
    ks = sorted({k for k in (1, 2, 4, 8, n) if k <= n})
    failures = chain_failures(generator, tokenizer, task, problems, recipe, seeds) if isinstance(task, ChainTask) else None
    return SplitScore(
        problems=len(problems),
        samples_per_problem=n,
        pass_at_1=sum(c / n for c in result.correct) / len(result.correct),
        pass_at_k={k: result.pass_at(k) for k in ks},
        reasons=dict(result.reasons),
        mean_completion_tokens=result.generated_tokens / (n * len(problems)),
        seconds=time.perf_counter() - start,
        failures=failures,
    )


def chain_failures(generator: HFGenerator, tokenizer: PreTrainedTokenizerFast, task: ChainTask, problems: list,
                   recipe: Recipe, seeds: dict[str, int]) -> dict:
    """The card's samples again (the same per-problem seeds, so the same responses), each failed
    one read line by line (flywheel.tasks.chain_data.line_errors): how many failures are ONE wrong
    line in an otherwise correct, complete chain, how many hold several, how many are not a
    complete chain at all, and the position of the first wrong line, absolute and as a share of
    the chain's length (in fifths)."""
    from chain_failures import sample_failures

    _, _, failures = sample_failures(generator, tokenizer, task, problems, recipe.eval_samples,
                                     recipe.eval_temperature, [seeds[p.id] for p in problems])
    profile = failure_profile(failures)
    return {"failed": profile.failed, "one_wrong_line": profile.one_wrong_line,
            "several_wrong_lines": profile.several_wrong_lines, "not_a_complete_chain": profile.not_a_complete_chain,
            "first_wrong_line": profile.first_wrong_line, "first_wrong_fifth": list(profile.first_wrong_fifth)}


TASK_TEXT = {
    "countdown": {
        "traces": "Countdown solver traces",
        "example": "5 9 8|67\n9*8=72\n72-5=67\n<answer>(9*8)-5</answer>",
        "grading": "`flywheel.rewards.countdown.verify` (answer uses each given number exactly once and equals the\ntarget)",
        "splits": "test.jsonl: 3 numbers in 1..13, random reachable target in 1..99. test_hard.jsonl: 4 numbers,\n"
                  "the least frequent target of 10,000 random reductions (the hard set). Both are held out from\n"
                  "the train split by number multiset. Low test_hard scores are expected.",
        "data": "solver traces (`flywheel.tasks.countdown_data.iter_solutions`, positive-integer\n"
                "  intermediates) of the {train_problems} problems of `flywheel/assets/countdown/train.jsonl` only\n"
                "  (4000 3-number + 4000 4-number hard problems), up to {max_solutions} distinct traces per problem\n"
                "  ({train_traces} in all); each visit of a problem picks one of its traces at random.",
    },
    "chain": {
        "traces": "chain-arithmetic solver traces",
        "example": "37 +48 -19 *3\n37+48=85\n85-19=66\n66*3=198\n<answer>198</answer>",
        "grading": "`flywheel.rewards.chain.verify` (the last answer equals the chain's value; the step lines are\nnot graded)",
        "splits": "test.jsonl: 500 chains of 2-8 operations, test_hard.jsonl: 500 of 9-12 (longer than any\n"
                  "training chain); values in 0..99, + and - by 2..49, * by 2..9. Both are held out from the\n"
                  "train split chain by chain (tools/make_chain_splits.py).",
        "data": "the solver trace (`flywheel.tasks.chain_data.format_completion`) of each of the\n"
                "  {train_problems} chains of `flywheel/assets/chain/train.jsonl` only (2-8 operations, equally\n"
                "  many of each length), one per chain ({train_traces} in all).",
    },
}
"""What the card says of each task the tiny policies learn."""


def failures_text(scores: dict[str, SplitScore]) -> str:
    """The chain card's section on how the failed samples went wrong (empty for Countdown)."""
    parts = []
    for split, s in scores.items():
        f = s.failures
        if not f:
            continue
        share = lambda c: f"{100 * c / max(f['failed'], 1):.1f}%"  # noqa: E731
        first = ", ".join(f"{line}: {share(c)}" for line, c in f["first_wrong_line"].items())
        fifths = " / ".join(share(c) for c in f["first_wrong_fifth"])
        parts.append(f"- {split}: {f['failed']} failed samples: **{share(f['one_wrong_line'])} are one wrong line in an "
                     f"otherwise correct, complete chain**, {share(f['several_wrong_lines'])} hold several wrong lines, "
                     f"{share(f['not_a_complete_chain'])} are not a complete chain (a line missing or added, no answer, "
                     f"an answer that is not the last line's result). First wrong line: {first}. By fifth of the "
                     f"chain's length (first to last): {fifths}.")
    if not parts:
        return ""
    return ("\nHow the failed samples went wrong (the card's samples read line by line against their chain,\n"
            "`flywheel.tasks.chain_data.line_errors`: a line is wrong when it does not apply the chain's\n"
            "operation at its position to the previous line's stated result correctly):\n" + "\n".join(parts) + "\n")


def model_card(name: str, command: str, recipe: Recipe, summary: dict, scores: dict[str, SplitScore],
               kind: str = "countdown") -> str:
    """The README.md of the policy folder, written from this run's measurements."""
    text = TASK_TEXT[kind]
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
tags: [flywheel, {kind}, tiny, sft]
---

# {name}

{ROLES.get(name, ("A variant of flywheel's default policy", ""))[0]} (`--model.policy={name}`): a {summary['parameters']:,}-parameter
Llama-style causal LM with a character tokenizer, trained by SFT on {text['traces']}.
It is **deliberately weak**: it solves some held-out problems at temperature 1.0 but far from
all, so RL (flat GRPO or tree search) has room to improve it on a CPU in minutes.
{ROLES.get(name, ("", ""))[1]}
Prompt and completion (the tokenizer adds `<bos>`; the completion ends with `<eos>`):

```
{text['example']}
```

## Measured (this run)

Temperature {recipe.eval_temperature}, top_p 1.0, at most {recipe.eval_max_new_tokens} new tokens, stop at EOS; sampled with
`flywheel.generation.hf.HFGenerator` (per-problem seeds), graded with
{text['grading']}. {n} samples per problem over **all** problems of each split; unbiased estimator
(pass@1 = mean c/n; pass@{n} with n = {n} = fraction of problems with any correct sample).

| split | problems | samples/problem | Pass@1 | Pass@{n} | {k_header} | mean completion tokens |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{text['splits']}

Verdicts of all samples:
{reasons}
{failures_text(scores)}
## How it was made

```
{command}
```

- Seed {recipe.seed} (model init, data order, evaluation samples); `torch.set_num_threads({recipe.threads})`.
  Weights are deterministic given the arguments; `model.safetensors` sha256 of this run:
  `{summary['safetensors_sha256']}`.
- Data: {text['data'].format(train_problems=summary['train_problems'], max_solutions=recipe.max_solutions,
                            train_traces=summary['train_traces'])} Every
  trace passes the verifier. Loss on the completion tokens and EOS only, not on the prompt.
- Tokenizer: `flywheel.policies.tiny.build_char_tokenizer()`, one token per character,
  {summary['vocab_size']} tokens (`<pad>`, `<bos>`, `<eos>`, `<unk>`, newline, printable ASCII);
  `vocab_size == len(tokenizer)`.
- Model: `flywheel.policies.tiny.build_tiny_llama` — LlamaForCausalLM, hidden {recipe.hidden_size}, {recipe.num_layers} layers,
  {recipe.num_heads} heads, MLP {recipe.intermediate_size}, tied embeddings, fp32, **{summary['parameters']:,} parameters**.
- SFT: {recipe.steps} steps, batch {recipe.batch_size}, AdamW (weight decay {recipe.weight_decay}), peak lr {recipe.lr:g},
  {recipe.warmup_steps} warmup steps then cosine to {recipe.min_lr_ratio:g} x lr, grad clip {recipe.grad_clip:g}.
  Loss {summary['first_loss']:.3f} at step 1, mean {summary['last_loss']:.3f} over the last 20 steps.
- Wall time: {summary['wall_seconds']:.0f} s in all (SFT {summary['sft_seconds']:.0f} s, median
  {summary['median_step_seconds']:.2f} s per step; evaluation of both splits {summary['eval_seconds']:.0f} s) on
  {recipe.threads} CPU threads ({summary['machine']}). When other jobs share the cores the total includes
  waiting for them; {recipe.steps} x the median step is about {recipe.steps * summary['median_step_seconds']:.0f} s of SFT.
  torch {torch.__version__}, transformers {transformers.__version__}.

Why an undertrained SFT base of correct solutions only: it gains the most from RL, as the RL runs
on this policy in flywheel's docs/results.md show.
"""


def sha256(path: Path) -> str:
    return file_sha256(path)
