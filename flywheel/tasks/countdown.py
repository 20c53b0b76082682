"""Countdown as a flywheel Task: the CPU demo task that the tiny policy is trained on.

A problem is a few numbers and a target; the policy writes one arithmetic step per line,
then the answer expression, e.g. for "5 9 8|67\\n":

    9*8=72
    72-5=67
    <answer>(9*8)-5</answer>

A search step is one line, so the tree branches on step lines. Only the answer is graded
(flywheel.rewards.countdown.verify); step lines are free text. The generator, solver and
trace format live in flywheel.tasks.countdown_data; tools/make_countdown_splits.py writes
the shipped splits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from flywheel.assets import asset_path
from flywheel.rewards import Verdict
from flywheel.rewards.countdown import EACH_NUMBER_RULES, verify
from flywheel.tasks.base import FileSplits, Problem, StepSpec, Task, check_prompt_template

__all__ = ["DEFAULT_PROMPT_TEMPLATE", "SHIPPED_SPLITS", "CountdownProblem", "CountdownTask"]

DEFAULT_PROMPT_TEMPLATE = "{numbers}|{target}\n"
SHIPPED_SPLITS = {"train": "train.jsonl", "test": "test.jsonl", "test_hard": "test_hard.jsonl"}
"""Split name -> file under flywheel/assets/countdown/ (disjoint by number multiset)."""

_INTEGER = re.compile(r"[0-9]+")
_TARGET = re.compile(r"-?[0-9]+")
_NUMBER_SEPARATOR = re.compile(r"[,\s]+")


@dataclass(frozen=True)
class CountdownProblem(Problem):
    """A Countdown problem: reach `target` from `numbers` with + - * /.

    `question` is the numbers as text ("5 9 8") and `answer` the target ("67"): the same
    encoding as a file row with `problem`/`answer` columns, so such rows round-trip. Build
    one with `CountdownProblem.create`; `numbers` is a tuple, so problems are hashable.
    """

    numbers: tuple[int, ...]
    target: int

    @classmethod
    def create(cls, problem_id: str, numbers: Sequence[int], target: int) -> CountdownProblem:
        numbers = tuple(numbers)
        return cls(
            id=problem_id,
            question=" ".join(str(n) for n in numbers),
            answer=str(target),
            numbers=numbers,
            target=target,
        )


class CountdownTask(FileSplits, Task):
    """Countdown: combine the given numbers with + - * / to reach the target.

    The prompt shows the numbers and the target ("5 9 8|67\\n"); the completion is one step
    per line ("9*8=72") and then `<answer>(9*8)-5</answer>`. Grading reads only the last
    answer block of the completion, never the prompt. The search depth d_T is
    `--data.search.max_depth` (8 suits Countdown's 3 step lines + answer line).

    Args:
        split_files: split files to add or replace, as {"split name": "path.jsonl"}, merged
            over the shipped splits: "train" (3-number and 4-number hard problems), "test"
            (3-number, held out) and "test_hard" (4-number hard, held out); the shipped
            splits share no number multiset. Rows have `numbers` and `target`, or
            `problem` ("5 9 8") and `answer` ("67") text.
        each_number: "exactly_once" (use every given number once) or "at_most_once"
            (the Countdown reference's rule).
        reward: "binary" (+1 correct, -1 otherwise) or "dense" (the reference's shaped
            reward 1 - 2 * min(|target - value| / target, 1); -0.9 for a bad expression,
            -1 for no answer). Correctness is always an exact match.
        prompt_template: the prompt as a str.format template with the fields {numbers}
            (space-separated) and {target}; BOS is added by the tokenizer, not here.
        step_delimiter: text that ends one search step (one trace line).
        max_step_tokens: most tokens in one step. It must fit the answer line, about 32
            characters for 4 numbers up to 13, so 40 leaves slack for a character tokenizer.
        max_response_tokens: most tokens in a whole completion.
        numbers_count: keep only the built-in problems with this many numbers (e.g. 3 to
            train on the distribution of the "test" split); None keeps all.
    """

    split_label = "countdown"

    def __init__(
        self,
        split_files: dict[str, str] | None = None,
        each_number: Literal["exactly_once", "at_most_once"] = "exactly_once",
        reward: Literal["binary", "dense"] = "binary",
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        step_delimiter: str = "\n",
        max_step_tokens: int = 40,
        max_response_tokens: int = 128,
        numbers_count: int | None = None,
    ) -> None:
        if each_number not in EACH_NUMBER_RULES:
            raise ValueError(f"each_number must be one of {EACH_NUMBER_RULES}, got {each_number!r}")
        if reward not in ("binary", "dense"):
            raise ValueError(f"reward must be 'binary' or 'dense', got {reward!r}")
        check_prompt_template(prompt_template, ("numbers", "target"))
        if max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1, got {max_response_tokens}")
        if numbers_count is not None and numbers_count < 2:
            raise ValueError(f"numbers_count must be >= 2 or None, got {numbers_count}")
        self.numbers_count = numbers_count
        self.each_number = each_number
        self.reward = reward
        self.prompt_template = prompt_template
        self.step = StepSpec(max_tokens=max_step_tokens, delimiter=step_delimiter)
        self.max_response_tokens = max_response_tokens
        self.init_splits({name: asset_path("countdown", file) for name, file in SHIPPED_SPLITS.items()}, split_files)

    def prompt(self, problem: Problem) -> str:
        problem = _as_countdown(problem)
        numbers = " ".join(str(n) for n in problem.numbers)
        return self.prompt_template.format(numbers=numbers, target=problem.target)

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        """`truncated` changes nothing: the <answer> tags are already the strict format."""
        problem = _as_countdown(problem)
        return verify(
            problem.numbers,
            problem.target,
            completion,
            each_number=self.each_number,
            dense=self.reward == "dense",
        )

    def keep_problem(self, problem: Problem) -> bool:
        """Only problems of `numbers_count` numbers, when it is set."""
        return self.numbers_count is None or len(problem.numbers) == self.numbers_count  # type: ignore[attr-defined]

    def problem_from_row(self, row: Mapping[str, Any], where: str) -> CountdownProblem:
        if "numbers" in row or "target" in row:
            numbers = _numbers_from_list(row.get("numbers"), where)
            target = row.get("target")
            if not isinstance(target, int) or isinstance(target, bool):
                raise ValueError(f"{where}: `target` must be an integer, got {target!r}")
            _check_same_problem(row, numbers, target, where)
        elif "problem" in row or "answer" in row:
            numbers = _numbers_from_text(row.get("problem"), where)
            target = _integer_from_text(row.get("answer"), where)
        else:
            raise ValueError(
                f"{where}: a countdown row needs `numbers` (list of int) and `target` (int), "
                f"or `problem` ('5 9 8') and `answer` ('67'); got columns {sorted(row)}"
            )
        return CountdownProblem.create(str(row.get("id", where)), numbers, target)



def _as_countdown(problem: Problem) -> CountdownProblem:
    """A CountdownProblem as is; a plain Problem read from its `question`/`answer` text."""
    if isinstance(problem, CountdownProblem):
        return problem
    where = f"problem {problem.id}"
    numbers = _numbers_from_text(problem.question, where)
    return CountdownProblem.create(problem.id, numbers, _integer_from_text(problem.answer, where))


def _check_same_problem(row: Mapping[str, Any], numbers: tuple[int, ...], target: int, where: str) -> None:
    """A row with `numbers`/`target` and also a Countdown `problem`/`answer` pair must state one
    problem twice, not two (issue 37: the text pair was ignored without a word)."""
    if "problem" not in row or "answer" not in row:
        return
    try:
        text_numbers, text_target = _numbers_from_text(row["problem"], where), _integer_from_text(row["answer"], where)
    except ValueError:  # not Countdown text (a description, say): `numbers`/`target` state the problem
        return
    if sorted(text_numbers) != sorted(numbers) or text_target != target:
        raise ValueError(
            f"{where}: `numbers`/`target` ({list(numbers)} -> {target}) and `problem`/`answer` "
            f"({row['problem']!r} -> {row['answer']!r}) state different problems; keep one pair"
        )


def _numbers_from_list(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) < 2:
        raise ValueError(f"{where}: `numbers` must be a list of at least two integers, got {value!r}")
    for n in value:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{where}: `numbers` must be non-negative integers, got {n!r} in {value!r}")
    return tuple(value)


def _numbers_from_text(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, str):
        raise ValueError(f"{where}: `problem` must be the numbers as text like '5 9 8', got {value!r}")
    parts = [part for part in _NUMBER_SEPARATOR.split(value.strip()) if part]
    if len(parts) < 2 or not all(_INTEGER.fullmatch(part) for part in parts):
        raise ValueError(f"{where}: `problem` must be two or more integers like '5 9 8', got {value!r}")
    return tuple(int(part) for part in parts)


def _integer_from_text(value: object, where: str) -> int:
    # A target may be negative (the numbers can be subtracted), as text as well as a number.
    if not isinstance(value, str) or not _TARGET.fullmatch(value.strip()):
        raise ValueError(f"{where}: `answer` must be the target as text like '67' or '-4', got {value!r}")
    return int(value)
