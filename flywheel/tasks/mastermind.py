"""Mastermind as an environment task: find a hidden code from the feedback on each guess.

The prompt states the rules; the policy writes one guess per line and the environment answers
each (flywheel.rewards.mastermind), by default with a mark per digit (Wordle's rule: G right
place, Y elsewhere in the code, . not in it), so an episode reads, for the secret 3512 (the
"lowest" player below):

    Guess the code: 4 digits 1-6. ...      <- the prompt
    1111                                   <- action 1
    ..G.                                   <- observation 1
    2212
    ..GG
    3312
    G.GG
    3412
    G.GG
    3512
    GGGG                                   <- a win: done, reward +1

`feedback="pegs"` answers with the classic game's counts instead ("1B 2W": right digit right
place, right digit wrong place). A guess that is not exactly a code ("12", "1237", "abcd") is
answered "invalid" and uses its turn; the episode goes on. The last allowed turn ends the
episode lost ("out_of_turns") unless it wins. Unlike a single-answer task, a state after a bad
guess is recoverable: the feedback is still true, so a tree that branches on guess lines can
resample a wasted or inconsistent guess and still win within the limit.

Why `max_turns` is 8 by default: the consistent players (flywheel.tasks.mastermind_data) guess a
code that fits all the feedback so far, drawn at random ("random") or the smallest ("lowest",
the player tiny-mastermind imitates); with mistakes (`noise`: the share of guesses that are a
random code, or for a quarter of them a malformed line), over all 1296 secrets of 4 digits 1-6,
seed 0 (`mastermind_data.measure` with a task of max_turns 20; 25 s for a rule's rows on 2 cores):

    marks: win rate (mean turns)     max_turns 6      7               8               10
    random, noiseless                1.0000 (3.71)    1.0000 (3.71)   1.0000 (3.71)   1.0000 (3.71)
    lowest, noiseless                1.0000 (5.24)    1.0000 (5.24)   1.0000 (5.24)   1.0000 (5.24)
    lowest, noise 0.2                0.8241 (5.09)    0.9421 (5.27)   0.9807 (5.33)   0.9985 (5.35)
    lowest, noise 0.3                0.7631 (5.15)    0.9074 (5.39)   0.9653 (5.48)   0.9977 (5.52)
    lowest, noise 0.6                0.5409 (5.32)    0.6960 (5.78)   0.7924 (6.08)   0.9128 (6.42)
    random codes (noise 1)           0.0031 (5.99)    0.0039 (6.99)   0.0039 (7.98)   0.0062 (9.97)

    pegs: win rate (mean turns)      max_turns 6      7               8               10
    random, noiseless                0.9900 (4.60)    1.0000 (4.61)   1.0000 (4.61)   1.0000 (4.61)
    random, noise 0.2                0.8688 (4.98)    0.9645 (5.11)   0.9946 (5.14)   0.9992 (5.15)
    random, noise 0.4                0.6968 (5.31)    0.8488 (5.62)   0.9367 (5.77)   0.9884 (5.86)
    random, noise 0.6                0.4367 (5.59)    0.6103 (6.15)   0.7446 (6.54)   0.9012 (6.96)
    random codes (noise 1)           0.0054 (5.99)    0.0062 (6.98)   0.0062 (7.97)   0.0077 (9.96)

A player that uses every feedback needs at most 6 turns under marks (the lowest player's
longest game; 7 under pegs), so 8 leaves a wasted guess or two recoverable, while a policy
that wastes several loses often and one that ignores the feedback nearly always.

Problem rows (jsonl) have `id` (string) and `answer`: the secret as text ("3512") or as an
integer (3512). tools/make_mastermind_splits.py writes the shipped splits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

from flywheel.assets import asset_path
from flywheel.rewards.mastermind import MAX_DIGITS, Code, Feedback, code_text, feedback, marks, parse_code
from flywheel.tasks.base import FileSplits, Problem, StepSpec, problem_id
from flywheel.tasks.columns import MissingColumn
from flywheel.tasks.environment import EnvironmentTask, Turn

__all__ = [
    "FEEDBACK_RULES", "INVALID_OBSERVATION", "REASONS", "SHIPPED_SPLITS", "FeedbackRule", "MastermindProblem",
    "MastermindTask", "observation_text", "read_observation",
]

SHIPPED_SPLITS = {"train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl"}
"""Split name -> file under flywheel/assets/mastermind/ (disjoint secrets)."""
REASONS = ("win", "out_of_turns")
"""The reasons of a done turn."""
INVALID_OBSERVATION = "invalid\n"
"""The answer to a guess that is not a code of the task's length and digits."""
RULES = "Guess the code: {length} digits 1-{digits}. One guess per line; {legend}\n"
"""The prompt: the rules, with the feedback rule's legend."""

_OBSERVATION = re.compile(r"([0-9])B ([0-9])W\n")
_MARKS = re.compile(r"[GY.]{1,8}\n")


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


def marks_text(earned: str) -> str:
    """The observation of a valid guess under the marks rule: its marks on one line.

    >>> marks_text("G.Y.")
    'G.Y.\\n'
    """
    return earned + "\n"


def read_marks(text: str) -> str | None:
    """The marks an observation states; None for `INVALID_OBSERVATION`; ValueError for any
    other text.

    >>> read_marks("G.Y.\\n"), read_marks("invalid\\n")
    ('G.Y.', None)
    """
    if text == INVALID_OBSERVATION:
        return None
    if _MARKS.fullmatch(text) is None:
        raise ValueError(f"{text!r:.40} is not a Mastermind observation of marks ('G.Y.\\n' or {INVALID_OBSERVATION!r})")
    return text[:-1]


@dataclass(frozen=True)
class FeedbackRule:
    """How a valid guess is answered: `score(secret, guess)` is what it earns (hashable, so a
    player can compare it with an earlier answer), `text` its observation, `read` the inverse
    (None for the invalid answer), `legend` the prompt's sentence about it."""

    score: Callable[[Code, Code], Hashable]
    text: Callable[[Any], str]
    read: Callable[[str], Any]
    legend: str


FEEDBACK_RULES: dict[str, FeedbackRule] = {
    # Wordle's rule: a mark per position. The shipped tiny-mastermind learned this one: the
    # answer to each digit sits at a fixed distance from it, which a 3-layer model reads.
    "marks": FeedbackRule(marks, marks_text, read_marks,
                          "each digit is answered G (right place), Y (in the code, elsewhere) or . (not in the code)."),
    # The classic game: two counts for the whole guess (a tiny model did not learn to use them).
    "pegs": FeedbackRule(feedback, observation_text, read_observation,
                         "each is answered B (right digit, right place) and W (right digit, wrong place)."),
}
"""--data.task.init_args.feedback: name -> rule; the first is the default."""


class MastermindTask(FileSplits, EnvironmentTask):
    """Mastermind: guess a hidden code of `code_length` digits 1..`digits` within `max_turns`.

    One action is one guess line ("1122\\n"); each is answered by the feedback rule ("G.Y.\\n"
    under marks, "1B 2W\\n" under pegs), or "invalid\\n" for a line that is not a code (it uses
    its turn). A win is reward +1 (reason "win"); the last turn without a win is reward -1
    (reason "out_of_turns").

    Args:
        split_files: split files to add or replace, as {"split name": "path.jsonl"}, merged
            over the shipped splits of 4-digit 1-6 codes: "train" (896 secrets), "val" and
            "test" (200 each; no secret in two splits).
        code_length: digits in a code (1-8).
        digits: each digit is 1..`digits` (1-9).
        feedback: how a guess is answered, a name of `FEEDBACK_RULES`: "marks" (Wordle's
            rule, a mark per position; the default, the rule tiny-mastermind plays) or "pegs"
            (the classic black and white counts).
        max_turns: guesses in one episode at most; a player that uses every feedback wins
            every 4-digit 1-6 game within 7 (pegs) or 6 (marks), so 8 leaves one or two wasted
            guesses recoverable (the module docstring's measurements).
        max_step_tokens: most tokens in one guess line: 5 characters with its newline, one
            token each for the character-level tiny policies; 16 leaves room for a subword
            tokenizer's pieces, and cuts a runaway line early.
        max_response_tokens: most tokens a whole episode generates (its guesses, not the
            observations); None: `max_turns * max_step_tokens`, as many as the turns can use.
    """

    split_label = "mastermind"
    chat_template = False

    def __init__(
        self,
        split_files: dict[str, str] | None = None,
        code_length: int = 4,
        digits: int = 6,
        feedback: str = "marks",
        max_turns: int = 8,
        max_step_tokens: int = 16,
        max_response_tokens: int | None = None,
    ) -> None:
        if not 1 <= code_length <= 8:
            raise ValueError(f"code_length must be 1-8 digits, got {code_length}")
        if not 1 <= digits <= MAX_DIGITS:
            raise ValueError(f"digits must be 1-{MAX_DIGITS} (each digit one character), got {digits}")
        if feedback not in FEEDBACK_RULES:
            raise ValueError(f"unknown feedback rule {feedback!r}; known: {', '.join(FEEDBACK_RULES)}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_response_tokens is not None and max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1 or None (max_turns * max_step_tokens), "
                             f"got {max_response_tokens}")
        self.code_length = code_length
        self.digits = digits
        self.feedback = feedback
        self.rule = FEEDBACK_RULES[feedback]
        self.max_turns = max_turns
        self.step = StepSpec(max_tokens=max_step_tokens, delimiter="\n")
        self.max_response_tokens = max_turns * max_step_tokens if max_response_tokens is None else max_response_tokens
        self.init_splits({name: asset_path("mastermind", file) for name, file in SHIPPED_SPLITS.items()}, split_files)

    def prompt(self, problem: Problem) -> str:
        return RULES.format(length=self.code_length, digits=self.digits, legend=self.rule.legend)

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

    def read_feedback(self, observation: str) -> Hashable | None:
        """What an observation of this task says a guess earned (as `rule.score` gives it); None
        for the invalid answer."""
        return self.rule.read(observation)

    def respond(self, problem: Problem, actions: Sequence[str]) -> Turn:
        """The feedback on the last guess; a win or the last turn ends the episode. Only the last
        action matters: feedback depends on the guess alone, and an episode ends at its win."""
        if not 1 <= len(actions) <= self.max_turns:
            raise ValueError(f"an episode has 1 to {self.max_turns} actions (max_turns), got {len(actions)}")
        last_turn = len(actions) == self.max_turns
        guess = self.read_guess(actions[-1])
        if guess is None:
            return _unless_last(Turn(INVALID_OBSERVATION, invalid=True), last_turn)
        secret = self.secret(problem)
        observation = self.rule.text(self.rule.score(secret, guess))
        if guess == secret:
            return Turn(observation, done=True, reward=1.0, correct=True, reason="win")
        return _unless_last(Turn(observation), last_turn)

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
