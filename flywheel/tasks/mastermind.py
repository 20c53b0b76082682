"""Mastermind as an environment task: find a hidden code from the feedback on each guess.

The prompt states the rules; the policy writes one guess per line and the environment answers
each with its pegs (flywheel.rewards.mastermind), so an episode reads, for the secret 3512:

    Guess the code: 4 digits 1-6. ...      <- the prompt
    1122                                   <- action 1
    1B 1W                                  <- observation 1
    1314
    1B 1W
    3512
    4B 0W                                  <- a win: done, reward +1

A guess that is not exactly a code ("12", "1237", "abcd") is answered "invalid" and uses its
turn; the episode goes on. The last allowed turn ends the episode lost ("out_of_turns") unless
it wins. Unlike a single-answer task, a state after a bad guess is recoverable: the feedback is
still true, so a tree that branches on guess lines can resample a wasted or inconsistent guess
and still win within the limit.

Why `max_turns` is 8 by default: the consistent-random player (it guesses a code drawn
uniformly from those that fit all the feedback so far; flywheel.tasks.mastermind_data), and
the same player with mistakes (`noise`: the share of guesses that are a random code, or for a
quarter of them a malformed line), over all 1296 secrets of 4 digits 1-6, seed 0
(`mastermind_data.measure` with a task of max_turns 20; 27 s for all five rows on 2 busy cores):

    win rate (mean turns)    max_turns 6      7               8               10
    noiseless                0.9900 (4.60)    1.0000 (4.61)   1.0000 (4.61)   1.0000 (4.61)
    noise 0.2                0.8688 (4.98)    0.9645 (5.11)   0.9946 (5.14)   0.9992 (5.15)
    noise 0.4                0.6968 (5.31)    0.8488 (5.62)   0.9367 (5.77)   0.9884 (5.86)
    noise 0.6                0.4367 (5.59)    0.6103 (6.15)   0.7446 (6.54)   0.9012 (6.96)
    random codes (noise 1)   0.0054 (5.99)    0.0062 (6.98)   0.0062 (7.97)   0.0077 (9.96)

The noiseless player's longest game is 7 turns (at 6 it loses 13 of 1296, just under 99%;
seed 1 gives the same win rates). At 8 it always wins with one turn to spare, so one wasted guess
is recoverable, while a policy that wastes several loses often (a quarter of the games at
noise 0.6) and one that ignores the feedback nearly always.

Problem rows (jsonl) have `id` (string) and `answer`: the secret as text ("3512") or as an
integer (3512). tools/make_mastermind_splits.py writes the shipped splits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from flywheel.assets import asset_path
from flywheel.rewards.mastermind import MAX_DIGITS, Code, Feedback, code_text, feedback, parse_code
from flywheel.tasks.base import Problem, StepSpec, problem_id, read_split_file
from flywheel.tasks.columns import MissingColumn
from flywheel.tasks.environment import EnvironmentTask, Turn

__all__ = [
    "INVALID_OBSERVATION", "REASONS", "SHIPPED_SPLITS", "MastermindProblem", "MastermindTask", "observation_text",
    "read_observation",
]

SHIPPED_SPLITS = {"train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl"}
"""Split name -> file under flywheel/assets/mastermind/ (disjoint secrets)."""
REASONS = ("win", "out_of_turns")
"""The reasons of a done turn."""
INVALID_OBSERVATION = "invalid\n"
"""The answer to a guess that is not a code of the task's length and digits."""
RULES = ("Guess the code: {length} digits 1-{digits}. One guess per line; each is answered "
         "B (right digit, right place) and W (right digit, wrong place).\n")

_OBSERVATION = re.compile(r"([0-9])B ([0-9])W\n")


@dataclass(frozen=True)
class MastermindProblem(Problem):
    """A hidden code; `answer` is its text ("3512"). `question` is empty: the prompt shows only
    the task's rules, never the secret. Build one with `MastermindProblem.create`."""

    @classmethod
    def create(cls, problem_id: str, code: Code) -> MastermindProblem:
        return cls(id=problem_id, question="", answer=code_text(code))


def observation_text(earned: Feedback) -> str:
    """The observation of a valid guess.

    >>> observation_text(Feedback(black=1, white=2))
    '1B 2W\\n'
    """
    return f"{earned.black}B {earned.white}W\n"


def read_observation(text: str) -> Feedback | None:
    """The feedback an observation states; None for `INVALID_OBSERVATION`. Any other text is
    not an observation of this task (ValueError).

    >>> read_observation("1B 2W\\n"), read_observation("invalid\\n")
    (Feedback(black=1, white=2), None)
    """
    if text == INVALID_OBSERVATION:
        return None
    found = _OBSERVATION.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r:.40} is not a Mastermind observation ('1B 2W\\n' or {INVALID_OBSERVATION!r})")
    return Feedback(black=int(found.group(1)), white=int(found.group(2)))


class MastermindTask(EnvironmentTask):
    """Mastermind: guess a hidden code of `code_length` digits 1..`digits` within `max_turns`.

    One action is one guess line ("1122\\n"); each is answered "<black>B <white>W\\n", or
    "invalid\\n" for a line that is not a code (it uses its turn). A win is reward +1 (reason
    "win"); the last turn without a win is reward -1 (reason "out_of_turns").

    Args:
        split_files: split files to add or replace, as {"split name": "path.jsonl"}, merged
            over the shipped splits of 4-digit 1-6 codes: "train" (896 secrets), "val" and
            "test" (200 each; no secret in two splits).
        code_length: digits in a code (1-8).
        digits: each digit is 1..`digits` (1-9).
        max_turns: guesses in one episode at most; a player that uses every feedback wins
            every 4-digit 1-6 game within 7, so 8 leaves one wasted guess recoverable (the
            module docstring's measurements).
        max_step_tokens: most tokens in one guess line: 5 characters with its newline, one
            token each for the character-level tiny policies; 16 leaves room for a subword
            tokenizer's pieces, and cuts a runaway line early.
        max_response_tokens: most tokens a whole episode generates (its guesses, not the
            observations); None: `max_turns * max_step_tokens`, as many as the turns can use.
    """

    chat_template = False

    def __init__(
        self,
        split_files: dict[str, str] | None = None,
        code_length: int = 4,
        digits: int = 6,
        max_turns: int = 8,
        max_step_tokens: int = 16,
        max_response_tokens: int | None = None,
    ) -> None:
        if not 1 <= code_length <= 8:
            raise ValueError(f"code_length must be 1-8 digits, got {code_length}")
        if not 1 <= digits <= MAX_DIGITS:
            raise ValueError(f"digits must be 1-{MAX_DIGITS} (each digit one character), got {digits}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_response_tokens is not None and max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1 or None (max_turns * max_step_tokens), "
                             f"got {max_response_tokens}")
        self.code_length = code_length
        self.digits = digits
        self.max_turns = max_turns
        self.step = StepSpec(max_tokens=max_step_tokens, delimiter="\n")
        self.max_response_tokens = max_turns * max_step_tokens if max_response_tokens is None else max_response_tokens
        self.split_files: dict[str, Path] = {
            name: asset_path("mastermind", file) for name, file in SHIPPED_SPLITS.items()}
        self.split_files.update({name: Path(file) for name, file in (split_files or {}).items()})
        self._loaded: dict[str, tuple[MastermindProblem, ...]] = {}

    def prompt(self, problem: Problem) -> str:
        return RULES.format(length=self.code_length, digits=self.digits)

    def read_guess(self, action: str) -> Code | None:
        """The code an action spells, its one trailing delimiter aside; None when it is not a code."""
        text = action[:-1] if action.endswith("\n") else action
        return parse_code(text, self.code_length, self.digits)

    def secret(self, problem: Problem) -> Code:
        """The problem's hidden code (ValueError when its answer is not a code of this task)."""
        code = parse_code(problem.answer, self.code_length, self.digits)
        if code is None:
            raise ValueError(f"problem {problem.id}: the secret {problem.answer!r:.40} is not a code of "
                             f"{self.code_length} digits 1-{self.digits}")
        return code

    def respond(self, problem: Problem, actions: Sequence[str]) -> Turn:
        """The pegs of the last guess; a win or the last turn ends the episode. Only the last
        action matters: feedback depends on the guess alone, and an episode ends at its win."""
        if not 1 <= len(actions) <= self.max_turns:
            raise ValueError(f"an episode has 1 to {self.max_turns} actions (max_turns), got {len(actions)}")
        last_turn = len(actions) == self.max_turns
        guess = self.read_guess(actions[-1])
        if guess is None:
            return _unless_last(Turn(INVALID_OBSERVATION, invalid=True), last_turn)
        earned = feedback(self.secret(problem), guess)
        if earned.black == self.code_length:
            return Turn(observation_text(earned), done=True, reward=1.0, correct=True, reason="win")
        return _unless_last(Turn(observation_text(earned)), last_turn)

    def problems(self, split: str) -> list[MastermindProblem]:
        if split not in self.split_files:
            raise ValueError(f"unknown mastermind split {split!r}; known: {sorted(self.split_files)}. "
                             "Add one with split_files={name: path.jsonl}.")
        if split not in self._loaded:
            self._loaded[split] = tuple(read_split_file(self, self.split_files[split], "mastermind"))
        return list(self._loaded[split])

    def problem_from_row(self, row: Mapping[str, Any], where: str) -> MastermindProblem:
        """A row `{"id": "train-0001", "answer": "3512"}`; the answer may be an integer (3512)."""
        if "answer" not in row:
            raise MissingColumn("answer", "answer", sorted(map(str, row)))
        value = row["answer"]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"{where}: `answer` must be the secret code as text ('3512') or an integer, "
                             f"got {value!r:.80}")
        code = parse_code(str(value), self.code_length, self.digits)
        if code is None:
            raise ValueError(f"{where}: `answer` {value!r:.80} is not a secret code of {self.code_length} digits "
                             f"each 1-{self.digits} (the task's code_length and digits)")
        return MastermindProblem.create(problem_id(row.get("id"), where), code)



def _unless_last(turn: Turn, last_turn: bool) -> Turn:
    """`turn` as it is, or, on the episode's last turn, done and lost ("out_of_turns")."""
    if not last_turn:
        return turn
    return Turn(turn.observation, done=True, reward=-1.0, correct=False, reason="out_of_turns", invalid=turn.invalid)
