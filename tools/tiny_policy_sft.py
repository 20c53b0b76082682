"""The tiny policies' SFT recipe (tools/make_tiny_policy.py): the settings that determine their
weights, and thin callers of `flywheel sft`'s pieces (flywheel.sft) for the traces of the TRAIN
split they learn from and the training loop.

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

import logging
import time
from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerFast

import flywheel.sft.loop as sft_loop
import flywheel.sft.traces as sft_traces
from flywheel.sft.loop import SftSettings, SftState
from flywheel.sft.train import train
from flywheel.sft.traces import Trace, episode_trace, episode_traces, solutions, solver_traces
from flywheel.tasks import Problem, Task
from flywheel.tasks.mastermind import MastermindTask
from flywheel.tasks.mastermind_data import PICKS

__all__ = ["Recipe", "Trace", "episode_trace", "episode_traces", "problem_traces", "sft_batches", "solutions",
           "solver_episodes", "train_sft"]
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
        steps, batch_size, lr, warmup_steps, min_lr_ratio, weight_decay, grad_clip: the SFT
            loop's settings, as flywheel.sft.SftSettings documents them (`sft_settings`).
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
        self.sft_settings()  # its checks
        if self.eval_samples < 1:
            raise ValueError(f"--eval_samples must be >= 1, got {self.eval_samples}")
        if not 0.0 <= self.solver_noise <= 1.0:
            raise ValueError(f"--solver_noise is the share of the Mastermind solver's guesses that are mistakes, "
                             f"a probability in [0, 1]; got {self.solver_noise}")
        if self.solver_pick not in PICKS:
            raise ValueError(f"--solver_pick must be one of {', '.join(PICKS)}, got {self.solver_pick!r}")

    def sft_settings(self) -> SftSettings:
        """The loop's settings (flywheel.sft.SftSettings): fp32, padded rows, as the shipped weights were trained."""
        return SftSettings(seed=self.seed, steps=self.steps, batch_size=self.batch_size, lr=self.lr,
                           warmup_steps=self.warmup_steps, min_lr_ratio=self.min_lr_ratio,
                           weight_decay=self.weight_decay, grad_clip=self.grad_clip, precision="float32")


def problem_traces(task: Task, tokenizer: PreTrainedTokenizerFast, problems: list[Problem],
                   max_solutions: int) -> list[list[Trace]]:
    """Per problem, up to `max_solutions` tokenized solver traces, each checked by the task's verifier."""
    return solver_traces(task, tokenizer, problems, max_solutions)


def solver_episodes(task: MastermindTask, problems: list[Problem], recipe: Recipe) -> list[list[list[str]]]:
    """Per secret, `recipe.max_solutions` episodes of the noisy solver (flywheel.sft.traces.solver_episodes)."""
    return sft_traces.solver_episodes(task, problems, recipe.max_solutions, recipe.solver_noise, recipe.solver_pick,
                                      recipe.seed)


def sft_batches(traces: list[list[Trace]], recipe: Recipe, pad_id: int):
    """The recipe's (input_ids, attention_mask, labels) batches (flywheel.sft.loop.sft_batches)."""
    return sft_loop.sft_batches(traces, recipe.sft_settings(), pad_id)


def train_sft(model: PreTrainedModel, traces: list[list[Trace]], recipe: Recipe, pad_id: int
              ) -> tuple[list[float], list[float]]:
    """Run the recipe's SFT steps in place (flywheel.sft.train); returns the loss and the seconds of every step."""
    settings = recipe.sft_settings()
    start = time.perf_counter()

    def said(state: SftState) -> None:
        step = state.step - 1
        if step % 50 == 0 or state.step == settings.steps:
            log.info("sft step %d/%d loss %.4f lr %.2e (%.0f s)", state.step, settings.steps, state.losses[-1],
                     sft_loop.lr_at(step, settings), time.perf_counter() - start)

    state = train(model, traces, settings, pad_id, on_step=said)
    return state.losses, state.seconds
