"""The tiny policies' SFT recipe (tools/make_tiny_policy.py): the settings that determine their
weights, the solver traces of the TRAIN split they learn from, and the training loop.

Countdown traces look like "5 9 8|67\\n" -> "9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>" then EOS,
chain traces like "37 +48 -19\\n" -> "37+48=85\\n85-19=66\\n<answer>66</answer>" then EOS; the loss
is on the completion and EOS, never on the prompt. A Mastermind trace is a whole episode of the
noisy solver (flywheel.tasks.mastermind_data.NoisySolver) as the search builds its context: the
prompt, then each guess line followed by the environment's observation ("1122\\n" "1B 1W\\n"
"3512\\n" "4B 0W\\n"); the loss is on the guesses only, never on the prompt or an observation,
and there is no EOS (the environment ends an episode; one the policy ends with EOS is lost,
flywheel.search.expansion.grade_episode). Weights depend only on the Recipe (seeded init,
seeded data order and episodes, fixed thread count).
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from flywheel.reporting.problem_view import encode_prompt
from flywheel.tasks import Problem, Task
from flywheel.tasks.chain import ChainProblem
from flywheel.tasks.chain_data import format_completion as chain_completion
from flywheel.tasks.countdown import CountdownProblem
from flywheel.tasks.countdown_data import format_completion, iter_solutions
from flywheel.tasks.mastermind import MastermindTask
from flywheel.tasks.mastermind_data import PICKS, NoisySolver, play

log = logging.getLogger("make_tiny_policy")


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
            routes and its samples stay diverse (Pass@k > Pass@1). Mastermind: the noisy
            solver's episodes played per train secret (not necessarily distinct).
        solver_noise: Mastermind only: the share of the solver's guesses that are mistakes
            (`NoisySolver.noise`: a random code, or for a quarter of them a malformed line),
            so the policy's failures come in every kind (mastermind_data.failure_kind) and
            its episodes show play going on after a wasted guess.
        solver_pick: Mastermind only: which code the solver picks among those that fit the
            feedback (`NoisySolver.pick`): "lowest" (deterministic play the tiny model learns:
            val pass@1 0.20 after 400 steps) or "random" (the consistent-random player; 1200
            steps of it left val pass@1 at 0.006, under the pegs rule).
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
    solver_noise: float = 0.3
    solver_pick: str = "lowest"
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
        if not 0.0 <= self.solver_noise <= 1.0:
            raise ValueError(f"--solver_noise is the share of the Mastermind solver's guesses that are mistakes, "
                             f"a probability in [0, 1]; got {self.solver_noise}")
        if self.solver_pick not in PICKS:
            raise ValueError(f"--solver_pick must be one of {', '.join(PICKS)}, got {self.solver_pick!r}")


# -- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """One SFT sequence: BOS + prompt + completion (+ EOS); the loss starts at `prompt_len`.

    `loss_mask` (one flag per token after the prompt) keeps the loss off the tokens it marks
    False, an environment's observations; empty: every token after the prompt is trained."""

    input_ids: tuple[int, ...]
    prompt_len: int
    loss_mask: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if self.loss_mask and len(self.loss_mask) != len(self.input_ids) - self.prompt_len:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} flags for the "
                             f"{len(self.input_ids) - self.prompt_len} tokens after the prompt")


def solutions(problem: Problem, max_solutions: int) -> list[str]:
    """Up to `max_solutions` distinct solver traces of `problem` (a chain has exactly one)."""
    if isinstance(problem, ChainProblem):
        return [chain_completion(problem.start, problem.ops)]
    if isinstance(problem, CountdownProblem):
        out = []
        for steps in iter_solutions(problem.numbers, problem.target):
            if len(out) == max_solutions:
                break
            out.append(format_completion(problem.numbers, steps))
        return out
    raise TypeError(f"no solver traces for a {type(problem).__name__}; the tiny policies learn Countdown or chains")


def problem_traces(
    task: Task,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    max_solutions: int,
) -> list[list[Trace]]:
    """Per problem, up to `max_solutions` tokenized solver traces, each checked by the task's verifier."""
    out = []
    for problem in problems:
        prompt_ids = tokenizer(task.prompt(problem))["input_ids"]  # BOS + prompt
        traces = []
        for completion in solutions(problem, max_solutions):
            if not task.score(problem, completion).correct:
                raise AssertionError(f"{problem.id}: solver trace {completion!r} fails the verifier")
            ids = prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"]
            traces.append(Trace(tuple(ids + [tokenizer.eos_token_id]), len(prompt_ids)))
        if not traces:
            raise AssertionError(f"{problem.id}: no positive-integer solution (the train split has none such)")
        out.append(traces)
    return out


def episode_trace(task: MastermindTask, tokenizer: PreTrainedTokenizerFast, problem: Problem,
                  actions: list[str]) -> Trace:
    """The episode of `actions` as the search's context holds it: the prompt's ids
    (`encode_prompt`: BOS + prompt), then each action's ids and its observation's, each text
    encoded on its own without special tokens (flywheel.reporting.problem_view.search_problems),
    so the token boundaries are the search's. Loss on the actions only; no EOS."""
    ids = list(encode_prompt(tokenizer, task, problem))
    prompt_len = len(ids)
    mask: list[bool] = []
    turns = task.episode(problem, actions)
    if len(turns) != len(actions) or not turns[-1].done:
        raise ValueError(f"{problem.id}: {len(actions)} actions are not one whole episode ({len(turns)} turns)")
    for action, turn in zip(actions, turns):
        for text, trained in ((action, True), (turn.observation, False)):
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [trained] * len(piece)
    return Trace(tuple(ids), prompt_len, tuple(mask))


def solver_episodes(task: MastermindTask, problems: list[Problem], recipe: Recipe) -> list[list[list[str]]]:
    """Per secret, the actions of `recipe.max_solutions` episodes of the noisy solver (noise
    `recipe.solver_noise`), secret i's from `random.Random(recipe.seed * 1_000_003 + i)`. Won and
    lost episodes alike: the policy learns the solver's play turn by turn, mistakes and the play
    after them included."""
    solver = NoisySolver(noise=recipe.solver_noise, pick=recipe.solver_pick)
    out = []
    for index, problem in enumerate(problems):
        rng = random.Random(recipe.seed * 1_000_003 + index)
        out.append([play(task, problem, solver, rng) for _ in range(recipe.max_solutions)])
    return out


def episode_traces(task: MastermindTask, tokenizer: PreTrainedTokenizerFast, problems: list[Problem],
                   episodes: list[list[list[str]]]) -> list[list[Trace]]:
    """Per problem, its episodes (`solver_episodes`) as SFT traces (`episode_trace`)."""
    return [[episode_trace(task, tokenizer, problem, actions) for actions in played]
            for problem, played in zip(problems, episodes, strict=True)]


def sft_batches(traces: list[list[Trace]], recipe: Recipe, pad_id: int):
    """Yield `recipe.steps` (input_ids, attention_mask, labels) batches, each [B, T], right-padded.

    Problems are visited in seeded random epochs; each visit picks one of the problem's
    traces at random. Labels are -100 on the prompt, on the tokens a trace's `loss_mask` marks
    False (observations) and on the padding (loss on completion + EOS, or on the actions).
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
            if t.loss_mask:
                labels[row, t.prompt_len : n][~torch.tensor(t.loss_mask)] = -100
        yield ids, mask, labels


# -- training --------------------------------------------------------------------------------


def lr_at(step: int, recipe: Recipe) -> float:
    """Linear warmup over `warmup_steps`, then cosine from `lr` down to `min_lr_ratio * lr`."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    floor = recipe.min_lr_ratio
    return recipe.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def shared_prompt(traces: list[list[Trace]]) -> int:
    """The length of the prompt every trace starts with (Mastermind's rules: the prompt shows
    no secret), or 0 when the prompts differ (Countdown, chains)."""
    prompts = {t.input_ids[: t.prompt_len] for group in traces for t in group}
    return len(next(iter(prompts))) if len(prompts) == 1 else 0


def shared_prompt_loss(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                       prompt_len: int) -> torch.Tensor:
    """The SFT loss of a batch whose rows all start with the same `prompt_len` tokens: the prompt
    runs once (row 0) and its keys and values are broadcast to every row, so a Mastermind batch
    costs its ~60 episode tokens a row instead of ~190 (the rules are 131). The same mean token
    cross-entropy as `model(..., labels=labels).loss`, up to float rounding; the gradient
    through the broadcast sums over the rows as the full batch's would.

    ids, mask, labels: [B, T]; labels are -100 on the whole prompt."""
    from transformers import DynamicCache

    batch = ids.shape[0]
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.24 renamed it
    head = model(input_ids=ids[:1, :prompt_len], use_cache=True)
    filled = getattr(head, kwarg)
    broadcast = DynamicCache(ddp_cache_data=[(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1))
                                             for layer in filled.layers])
    tail = model(input_ids=ids[:, prompt_len:], attention_mask=mask, use_cache=True, **{kwarg: broadcast})
    # Position t's logits predict token t + 1: the prompt's last predicts the first episode token.
    logits = torch.cat([head.logits[:, -1:].expand(batch, -1, -1), tail.logits[:, :-1]], dim=1)  # [B, T - P, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), labels[:, prompt_len:].flatten(), ignore_index=-100)


def train_sft(
    model: PreTrainedModel, traces: list[list[Trace]], recipe: Recipe, pad_id: int
) -> tuple[list[float], list[float]]:
    """Run the SFT steps in place; returns the loss and the seconds of every step. When every
    trace starts with the same prompt it runs once a batch (`shared_prompt_loss`)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    model.train()
    prompt_len = shared_prompt(traces)
    losses, seconds = [], []
    start = last = time.perf_counter()
    for step, (ids, mask, labels) in enumerate(sft_batches(traces, recipe, pad_id)):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        if prompt_len:
            loss = shared_prompt_loss(model, ids, mask, labels, prompt_len)
        else:
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
