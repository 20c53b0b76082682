"""SFT rows as token sequences: BOS + prompt + response (+ EOS), the loss on the response only.

Three sources, each with the task's own prompt (`encode_prompt`: its chat template when it
asks for one), so SFT and RL see identical prompts:

* a task's solver traces (`solver_traces`): a chain's one worked solution, up to
  `max_solutions` distinct Countdown solutions, each checked by the task's verifier;
* an environment's episodes (`episode_trace`): the prompt, then each action followed by the
  environment's observation, the loss on the actions only and no EOS (the environment ends an
  episode); Mastermind's come from a noisy solver (`solver_episodes`);
* a problem file's worked solutions (`file_traces`): each row read through the same column
  mapping as RL problem files (flywheel.tasks.sources.checked_rows), the response from
  `response_column` (GSM8K's `answer` rationale, MATH's `solution`); a bad row is refused
  with its file:line.

Torch-free; the tokenizer is any Hugging Face tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from flywheel.reporting.problem_view import encode_prompt
from flywheel.tasks import Problem, Task
from flywheel.tasks.chain import ChainProblem
from flywheel.tasks.chain_data import format_completion as chain_completion
from flywheel.tasks.columns import Columns, MissingColumn, lookup
from flywheel.tasks.countdown import CountdownProblem
from flywheel.tasks.countdown_data import format_completion, iter_solutions
from flywheel.tasks.environment import EnvironmentTask


@dataclass(frozen=True)
class Trace:
    """One SFT sequence: BOS + prompt + response (+ EOS); the loss starts at `prompt_len`.

    `loss_mask` (one flag per token after the prompt) keeps the loss off the tokens it marks
    False, an environment's observations; empty: every token after the prompt is trained."""

    input_ids: tuple[int, ...]
    prompt_len: int
    loss_mask: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if self.loss_mask and len(self.loss_mask) != len(self.input_ids) - self.prompt_len:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} flags for the "
                             f"{len(self.input_ids) - self.prompt_len} tokens after the prompt")

    @property
    def trained_tokens(self) -> int:
        """Tokens the loss is on."""
        return sum(self.loss_mask) if self.loss_mask else len(self.input_ids) - self.prompt_len


def response_trace(tokenizer: Any, task: Task, problem: Problem, response: str) -> Trace:
    """The prompt as the search encodes it, then the response's tokens (encoded on their own,
    as a sampled response's are) and EOS."""
    prompt_ids = list(encode_prompt(tokenizer, task, problem))
    ids = prompt_ids + tokenizer(response, add_special_tokens=False)["input_ids"]
    return Trace(tuple(ids + [tokenizer.eos_token_id]), len(prompt_ids))


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
    raise TypeError(f"no solver traces for a {type(problem).__name__}: the solver knows chains and Countdown; "
                    "give worked solutions in a problem file instead (--files with --response_column)")


def solver_traces(task: Task, tokenizer: Any, problems: Sequence[Problem], max_solutions: int) -> list[list[Trace]]:
    """Per problem, up to `max_solutions` tokenized solver traces, each checked by the task's verifier."""
    out = []
    for problem in problems:
        traces = []
        for completion in solutions(problem, max_solutions):
            if not task.score(problem, completion).correct:
                raise AssertionError(f"{problem.id}: solver trace {completion!r} fails the verifier")
            traces.append(response_trace(tokenizer, task, problem, completion))
        if not traces:
            raise AssertionError(f"{problem.id}: no positive-integer solution (the train split has none such)")
        out.append(traces)
    return out


def episode_trace(task: EnvironmentTask, tokenizer: Any, problem: Problem, actions: Sequence[str]) -> Trace:
    """The episode of `actions` as the search's context holds it: the prompt's ids
    (`encode_prompt`), then each action's ids and its observation's, each text encoded on its
    own without special tokens (flywheel.reporting.problem_view.search_problems), so the token
    boundaries are the search's. Loss on the actions only; no EOS."""
    ids = list(encode_prompt(tokenizer, task, problem))
    prompt_len = len(ids)
    mask: list[bool] = []
    turns = task.episode(problem, list(actions))
    if len(turns) != len(actions) or not turns[-1].done:
        raise ValueError(f"{problem.id}: {len(actions)} actions are not one whole episode ({len(turns)} turns)")
    for action, turn in zip(actions, turns):
        for text, trained in ((action, True), (turn.observation, False)):
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [trained] * len(piece)
    return Trace(tuple(ids), prompt_len, tuple(mask))


def solver_episodes(task: EnvironmentTask, problems: Sequence[Problem], per_problem: int, noise: float,
                    pick: str, seed: int) -> list[list[list[str]]]:
    """Per secret, the actions of `per_problem` episodes of Mastermind's noisy solver
    (flywheel.tasks.mastermind_data.NoisySolver: `noise` of its guesses are mistakes, `pick` the
    code it plays among those that fit), secret i's from `random.Random(seed * 1_000_003 + i)`.
    Won and lost episodes alike: the policy learns the solver's play turn by turn, mistakes and
    the play after them included."""
    from flywheel.tasks.mastermind_data import NoisySolver, play

    solver = NoisySolver(noise=noise, pick=pick)
    out = []
    for index, problem in enumerate(problems):
        rng = random.Random(seed * 1_000_003 + index)
        out.append([play(task, problem, solver, rng) for _ in range(per_problem)])
    return out


def episode_traces(task: EnvironmentTask, tokenizer: Any, problems: Sequence[Problem],
                   episodes: Sequence[Sequence[Sequence[str]]]) -> list[list[Trace]]:
    """Per problem, its episodes (`solver_episodes`) as SFT traces (`episode_trace`)."""
    return [[episode_trace(task, tokenizer, problem, actions) for actions in played]
            for problem, played in zip(problems, episodes, strict=True)]


def file_traces(task: Task, tokenizer: Any, file: str, response_column: str, columns: Columns = Columns(),
                skip_bad_rows: bool = False, limit: int | None = None) -> tuple[list[list[Trace]], int]:
    """(one trace per row, the rows skipped) of a problem file whose rows also hold a worked
    solution in `response_column` (a dotted path reaches a nested field). A row without one, or
    with one that is no text, is bad: ValueError naming its file:line, or skipped and counted
    with `skip_bad_rows`."""
    from flywheel.tasks.sources import checked_rows

    out: list[list[Trace]] = []
    skipped = 0
    for where, row, problem in checked_rows(task, file, skip_bad_rows=skip_bad_rows, columns=columns, flags="--"):
        if problem is None:
            skipped += 1
            continue
        try:
            response = lookup(row, response_column, "response")
        except MissingColumn as err:
            response = err
        if not isinstance(response, str) or not response.strip():
            what = f"no column {response_column!r} ({response.has()})" if isinstance(response, MissingColumn) else \
                f"column {response_column!r} holds {type(response).__name__}, not a worked solution's text"
            message = f"{where}: {what}; name the column of the worked solutions with --response_column"
            if not skip_bad_rows:
                raise ValueError(f"{message} (pass --skip_bad_rows=true to skip and count bad rows)")
            skipped += 1
            continue
        out.append([response_trace(tokenizer, task, problem, response)])
        if limit is not None and len(out) == limit:
            break
    return out, skipped
