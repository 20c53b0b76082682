"""The Task seam: prompt format, step definition, answer format, verifier, problem source."""

from __future__ import annotations

import json
import math
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Mapping

from flywheel.rewards import Verdict
from flywheel.tasks.columns import MissingColumn


@dataclass(frozen=True)
class Problem:
    """One problem. `question` is what the prompt shows; `answer` is the gold answer text.

    Problem rows have `problem` and `answer` columns and an optional `id`, or columns mapped to
    them (flywheel.tasks.columns); a task may read extra columns of its own in
    `Task.problem_from_row`.
    """

    id: str
    question: str
    answer: str


@dataclass(frozen=True)
class StepSpec:
    """What one search step is (deepsearch.md §1).

    delimiter None: a fixed chunk of exactly `max_tokens` tokens (the paper's 256).
    delimiter set (e.g. "\\n"): text up to and including the delimiter, capped at
    `max_tokens` tokens.
    """

    max_tokens: int
    delimiter: str | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"a step needs max_tokens >= 1, got {self.max_tokens}")
        if self.delimiter == "":
            raise ValueError("delimiter must be None (fixed chunks) or a non-empty string")


class Task(ABC):
    """A reasoning task: how to prompt, how a step ends, how to grade a completion."""

    step: StepSpec
    max_response_tokens: int
    """Token budget of one whole response (flat sampling and evaluation)."""

    @abstractmethod
    def prompt(self, problem: Problem) -> str:
        """The prompt text for `problem` (before tokenisation; BOS is the tokenizer's job)."""

    chat_template: bool = False
    """Whether the prompt is a user turn of the tokenizer's chat template (when it has one;
    `flywheel.reporting.evaluation.encode_prompt`), or plain text."""

    system_prompt: str | None = None
    """The chat's system turn with `chat_template` (None: the template's default)."""

    answer_rules: tuple[str, ...] = ()
    """The names of the rules the task's verifier reads an answer by (a verdict's reason
    "<outcome>:<rule>"); the search logs the share of each as `reward/answer_rule/<rule>`."""

    @abstractmethod
    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        """Grade `completion` (the generated text only, never the prompt) against `problem`.
        `truncated`: the response was cut by the length limit (it never emitted EOS); a task
        may grade such a response by stricter rules."""

    def problem_key(self, problem: Problem) -> str:
        """What two copies of one problem share (flywheel.tasks.overlap compares it normalised):
        the prompt, which holds the whole problem for a task that shows it."""
        return self.prompt(problem)

    @abstractmethod
    def problems(self, split: str) -> list[Problem]:
        """The task's built-in problems of `split` ("train", "test", ...)."""

    def problem_from_row(self, row: Mapping[str, Any], where: str) -> Problem:
        """Build a Problem from one row of a problem file; `where` ("file.jsonl:12") is for errors.

        The row is already in this shape (flywheel.tasks.columns maps a publisher's columns to
        it): `problem` text, `answer` text or number (`answer_text`), optional `id` (text or integer)."""
        for key in ("problem", "answer"):
            if key not in row:
                raise MissingColumn(key, key, sorted(map(str, row)))
        question = row["problem"]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: column 'problem' must be a non-empty string, got {question!r:.80}")
        answer = answer_text(row["answer"], where)
        return Problem(id=problem_id(row.get("id"), where), question=question, answer=answer)


class FileSplits:
    """A task whose splits are problem files: `split_files` (name -> path) and the problems of
    each, read once (`read_split_file`) and kept. A task mixes it in before `Task`, calls
    `init_splits` from its constructor and sets `split_label` (its name in errors); it may
    override `keep_problem` (a setting that narrows every split, e.g. Countdown's
    numbers_count)."""

    split_label = "task"
    split_files: dict[str, Path]

    def init_splits(self, shipped: Mapping[str, Path], given: Mapping[str, str] | None) -> None:
        """The shipped split files, with the user's `split_files` added or replacing them."""
        self.split_files = {**shipped, **{name: Path(file) for name, file in (given or {}).items()}}
        self._loaded: dict[str, tuple[Problem, ...]] = {}

    def keep_problem(self, problem: Problem) -> bool:
        """Whether a split's problem belongs to this task's settings (all of them by default)."""
        return True

    def problems(self, split: str) -> list[Problem]:
        if split not in self.split_files:
            raise ValueError(f"unknown {self.split_label} split {split!r}; known: {sorted(self.split_files)}. "
                             "Add one with split_files={name: path.jsonl}.")
        if split not in self._loaded:
            problems = read_split_file(self, self.split_files[split], self.split_label)  # type: ignore[arg-type]
            self._loaded[split] = tuple(p for p in problems if self.keep_problem(p))
        return list(self._loaded[split])


def check_prompt_template(template: str, fields: tuple[str, ...]) -> None:
    """Refuse a prompt template that is not a format string of exactly `fields`.

    >>> check_prompt_template("{numbers} -> {target}", ("numbers", "target"))
    >>> check_prompt_template("{numbers}", ("numbers", "target"))
    Traceback (most recent call last):
    ...
    ValueError: prompt_template must use exactly the fields {numbers} and {target}, got ['numbers'] in '{numbers}'
    """
    try:
        found = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as err:
        raise ValueError(f"prompt_template {template!r} is not a valid format string: {err}") from None
    if found != set(fields):
        wanted = " and ".join("{" + name + "}" for name in fields)
        raise ValueError(f"prompt_template must use exactly the fields {wanted}, got {sorted(found)} in {template!r}")


def read_split_file(task: Task, path: Path, label: str) -> list[Problem]:
    """The problems of a task's split file: one JSON object a line (blank lines skipped), each
    made by `task.problem_from_row`; a line that is not one is refused with its `file:line`.
    `label` names the task in the missing-file error ("chain", "mastermind", ...)."""
    if not path.is_file():
        raise FileNotFoundError(f"{label} split file {path} does not exist")
    problems = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
            problems.append(task.problem_from_row(row, where))
    return problems


def answer_text(value: Any, where: str) -> str:
    """A gold answer as text: a string as it is, an integer or a finite float canonically
    (`42`, `0.5`; a float with an integer value as the integer, so `42.0` and `42` are one
    answer). A boolean or a null is refused: neither is a math answer, and `True` would
    otherwise read as `1`.

    >>> answer_text(42, "f:1"), answer_text(42.0, "f:1"), answer_text(0.5, "f:1"), answer_text(" 7 ", "f:1")
    ('42', '42', '0.5', ' 7 ')
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: the answer is {value!r}, not a string or a number; fix the row or its "
                         "answer column (--data.problems.columns.answer)")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: the answer is {value!r}, not a finite number")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{where}: the answer is {value!r}, not a finite number")
        return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: column 'answer' must be a non-empty string or a number, got {value!r:.80}")
    return value


def problem_id(value: Any, where: str) -> str:
    """A row's id: its text or integer, or `where` when the row has none."""
    if value is None:
        return where
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{where}: the id {value!r:.80} must be a non-empty string or an integer")
    return str(value)
