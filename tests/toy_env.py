"""A two-turn guessing environment for hand-worked tests of episodes (flywheel.tasks.environment):
the secret is one digit 1-4 (the problem's answer); an action is a digit and a newline; the
environment answers "hi" (the secret is higher), "lo" (lower) or "ok" (a win, done), "?" for
an action that is not one digit 1-4 (invalid, the episode goes on); the second action ends the
episode. `hang` / `fail` make `respond` sleep for 10 minutes / raise on an action "9" (the grading
guard's tests). Text is one character a token: `encode`, `decode` (id 1 = EOS, no text), and
`CharTokenizer` for what needs a tokenizer."""

from __future__ import annotations

import time
from typing import Sequence

from flywheel.tasks.base import Problem, StepSpec
from flywheel.tasks.environment import EnvironmentTask, Turn

EOS = 1


def encode(text: str) -> tuple[int, ...]:
    return tuple(ord(c) for c in text)


def decode(ids: Sequence[int]) -> str:
    return "".join(chr(i) for i in ids if i != EOS)


class CharTokenizer:
    """This text as a tokenizer: one character a token, EOS id 1, no chat template."""

    eos_token_id = EOS
    chat_template = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": list(encode(text))}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(encode(text))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return decode(ids)


class GuessTask(EnvironmentTask):
    step = StepSpec(max_tokens=4, delimiter="\n")
    max_turns = 2
    max_response_tokens = 16

    def __init__(self, trap: str = "") -> None:
        self.trap = trap

    def prompt(self, problem: Problem) -> str:
        return "G:"

    def problems(self, split: str) -> list[Problem]:
        return [Problem(f"s{d}", "", str(d)) for d in range(1, 5)]

    def respond(self, problem: Problem, actions: Sequence[str]) -> Turn:
        guess = actions[-1].strip()
        if guess == "9" and self.trap == "hang":
            time.sleep(600)
        if guess == "9" and self.trap == "fail":
            raise RuntimeError("the environment broke")
        last = len(actions) >= self.max_turns
        if guess not in ("1", "2", "3", "4"):
            if last:
                return Turn("?\n", done=True, reward=-1.0, reason="out_of_turns", invalid=True)
            return Turn("?\n", invalid=True)
        if guess == problem.answer:
            return Turn("ok\n", done=True, reward=1.0, correct=True, reason="win")
        hint = "hi\n" if problem.answer > guess else "lo\n"
        if last:
            return Turn(hint, done=True, reward=-1.0, reason="out_of_turns")
        return Turn(hint)
