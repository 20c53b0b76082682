"""The environment seam: tasks whose steps are turns.

The policy writes one action (text ended by the task's turn delimiter, `Task.step`); the
environment answers with a `Turn`: an observation appended to the context (prefilled, never
sampled, never trained on), whether the episode is over, and when it is, its reward. An episode
ends when the environment says done, or when the search's turn limit cuts it (an episode cut
without done is "incomplete", as a response cut by the length limit is).

An environment is pure: `respond(problem, actions)` depends only on the problem and every action
so far, so a tree node's state is rebuilt from the actions on its path, a resumed run replays
exactly, and the task is picklable (the grading guard runs `respond` in its worker, bounded in
time and memory on any action: flywheel.tasks.grading). A garbage or illegal action gets the
environment's own answer: an observation with `invalid` set (the episode goes on; counted per
epoch), or a done turn, as the environment declares.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Sequence

from flywheel.rewards import Verdict
from flywheel.tasks.base import Problem, Task


@dataclass(frozen=True)
class Turn:
    """The environment's answer to the last action.

    Attributes:
        observation: text appended after the action (what the policy reads next); it ends
            with whatever separates it from the next action (often a newline).
        done: the episode is over.
        reward: the episode's reward when `done` (+1 a win, -1 a loss by default); unused otherwise.
        correct: a done episode was won (what pass@k and the hard set count).
        reason: a short machine-readable word for a done turn ("win", "out_of_turns",
            "invalid", ...), logged and shown in the tree viewer; the verdict's reason.
        invalid: the action was garbage or illegal (counted per epoch as `search/invalid_actions`).
    """

    observation: str
    done: bool = False
    reward: float = 0.0
    correct: bool = False
    reason: str = ""
    invalid: bool = False

    def verdict(self, answer: str | None) -> Verdict:
        """The episode's verdict, from its last turn (`answer`: the last action's text)."""
        return Verdict(correct=self.correct, reward=float(self.reward), answer=answer, reason=self.reason or "done")


def guard_turn(reason: str) -> Turn:
    """The turn of an action the environment did not answer in time or without failing (the
    grading guard's "timeout" / "error"): the episode ends, lost."""
    return Turn(observation="", done=True, reward=-1.0, correct=False, reason=reason)


class EnvironmentTask(Task):
    """A task whose steps are turns of an environment (the module docstring).

    A subclass sets `step` (its delimiter ends an action; `max_tokens` caps one action),
    `max_turns`, `max_response_tokens` (a whole episode's generated tokens), and writes `prompt`
    (the episode's opening: rules and the first observation), `respond`, `problems` and, for
    problem files, `problem_from_row`.
    """

    max_turns: int
    """Actions in one episode at most; the environment answers the last one with `done`."""

    @abstractmethod
    def respond(self, problem: Problem, actions: Sequence[str]) -> Turn:
        """The answer to `actions[-1]` after every earlier action of the episode (each the
        action's text as generated, its delimiter included). Pure and bounded in time on any
        text; it must answer `done` once `len(actions) == max_turns`."""

    def problem_key(self, problem: Problem) -> str:
        """The prompt and the answer: an environment may hide part of its instance (a secret
        code) from the prompt, so the prompt alone would make every instance one problem."""
        return f"{self.prompt(problem)}\n{problem.answer}"

    def episode(self, problem: Problem, actions: Sequence[str]) -> list[Turn]:
        """Every turn of an episode, replayed: the answers to `actions[:1]`, `actions[:2]`, ...
        up to the first done one."""
        turns = []
        for end in range(1, len(actions) + 1):
            turns.append(self.respond(problem, actions[:end]))
            if turns[-1].done:
                break
        return turns

    def split_actions(self, completion: str) -> list[str]:
        """A transcript of actions only (each ended by the delimiter) as its actions."""
        delimiter = self.step.delimiter
        if delimiter is None:
            raise ValueError(f"{type(self).__name__}.step needs a delimiter: it ends an action")
        pieces = completion.split(delimiter)
        actions = [piece + delimiter for piece in pieces[:-1]]
        if pieces[-1]:
            actions.append(pieces[-1])
        return actions

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        """A transcript of actions (no observations), replayed: the verdict of its last turn; a
        transcript that stops before the episode is done is lost ("unfinished")."""
        actions = self.split_actions(completion)[: self.max_turns]
        turns = self.episode(problem, actions)
        if turns and turns[-1].done:
            return turns[-1].verdict(actions[len(turns) - 1])
        return Verdict(correct=False, reward=-1.0, answer=None, reason="unfinished")
