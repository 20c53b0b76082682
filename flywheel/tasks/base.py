"""The Task seam: prompt format, step definition, answer format, verifier, problem source."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping

from flywheel.rewards import Verdict


@dataclass(frozen=True)
class Problem:
    """One problem. `question` is what the prompt shows; `answer` is the gold answer text.

    Problem files (jsonl/parquet) have `problem` and `answer` columns and an optional `id`;
    a task may read extra columns of its own in `Task.problem_from_row`.
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

    answer_rules: tuple[str, ...] = ()
    """The names of the rules the task's verifier reads an answer by (a verdict's reason
    "<outcome>:<rule>"); the search logs the share of each as `reward/answer_rule/<rule>`."""

    @abstractmethod
    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        """Grade `completion` (the generated text only, never the prompt) against `problem`.
        `truncated`: the response was cut by the length limit (it never emitted EOS); a task
        may grade such a response by stricter rules."""

    @abstractmethod
    def problems(self, split: str) -> list[Problem]:
        """The task's built-in problems of `split` ("train", "test", ...)."""

    def problem_from_row(self, row: Mapping[str, Any], where: str) -> Problem:
        """Build a Problem from one row of a problem file; `where` ("file.jsonl:12") is for errors."""
        for key in ("problem", "answer"):
            value = row.get(key)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}: column {key!r} must be a non-empty string, got {value!r}")
        row_id = row.get("id", where)
        return Problem(id=str(row_id), question=row["problem"], answer=row["answer"])
