"""A task's problems as the generator and the search see them: the prompt's token ids
(`encode_prompt`), the text of token ids (`decoder`), the EOS ids, and each problem as a
`SearchProblem` with its grading and, for an environment's task, the environment's answers as
observation token ids (`search_problems`). The fit's rollouts, the evaluation and the tools share them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flywheel.search.expansion import SearchProblem
from flywheel.tasks import Problem, Task
from flywheel.tasks.environment import EnvironmentTask, Turn
from flywheel.tasks.grading import Grader


def encode_prompt(tokenizer: Any, task: Task, problem: Problem) -> tuple[int, ...]:
    """The prompt's token ids: the user turn of the tokenizer's chat template (with the
    generation prompt; after the task's `system_prompt` when it sets one) when the task asks
    for it and the tokenizer has one, else the plain text (the tokenizer adds BOS / its own
    special tokens)."""
    text = task.prompt(problem)
    if task.chat_template and getattr(tokenizer, "chat_template", None):
        system = task.system_prompt
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return tuple(int(i) for i in ids)
    return tuple(tokenizer(text)["input_ids"])


def decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    """token ids -> text, exactly `tokenizer.decode(ids, skip_special_tokens=True)`. A fast
    tokenizer that does no space clean-up is decoded by its Rust backend directly, the same
    text without transformers' Python wrapper around it (which was ~15% of the search's
    bookkeeping: the search decodes every step it grades)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", None) is False:
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True)


def eos_ids(tokenizer: Any) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def search_problems(tokenizer: Any, task: Task, problems: Sequence[Problem],
                    grader: Grader | None = None) -> list[SearchProblem]:
    """The search's view of `problems`: prompt ids and the grading of a response, by `grader`
    (the run's grading guard, flywheel.tasks.grading) or else `task.score` unguarded; for an
    environment's task (flywheel.tasks.environment) also its answers to each action, guarded the same way."""
    score = grader.score if grader is not None else task.score
    if not isinstance(task, EnvironmentTask):
        return [SearchProblem(prompt_ids=encode_prompt(tokenizer, task, p), score=functools.partial(score, p), id=p.id)
                for p in problems]
    respond = grader.respond if grader is not None else task.respond
    encode = functools.lru_cache(maxsize=4096)(lambda text: tuple(tokenizer.encode(text, add_special_tokens=False)))
    return [SearchProblem(prompt_ids=encode_prompt(tokenizer, task, p), score=functools.partial(score, p), id=p.id,
                          respond=Observations(functools.partial(respond, p), encode))
            for p in problems]


@dataclass(frozen=True)
class Observations:
    """An episode's `SearchProblem.respond`: the environment's answer to its actions so far
    (`respond`, usually the grading guard's) and its observation as token ids (`encode`)."""

    respond: Callable[[tuple[str, ...]], Turn]
    encode: Callable[[str], tuple[int, ...]]

    def __call__(self, actions: tuple[str, ...]) -> tuple[Turn, tuple[int, ...]]:
        turn = self.respond(actions)
        return turn, self.encode(turn.observation)
