"""Chain arithmetic as a flywheel Task: long chains where one local mistake ruins the answer.

A problem is a start integer and operations applied in order; the policy writes one
operation per line, then the answer, e.g. for "37 +48 -19 *3\\n":

    37+48=85
    85-19=66
    66*3=198
    <answer>198</answer>

A search step is one line, so a tree branches on step lines; only the final answer is
graded (flywheel.rewards.chain.verify), so the search has to find the wrong line by itself.
Unlike Countdown, where a failed response is usually dead after its first line (a wrong
choice of the first operation), a chain response usually fails on ONE wrong line in the
middle: resampling from the line before it keeps the good part. The chains, the solver
trace and the line-by-line reading live in flywheel.tasks.chain_data;
tools/make_chain_splits.py writes the shipped splits.

Problem rows (jsonl / parquet) have `id` (string), `start` (int), `ops` (a list of
`[op, operand]` pairs, op one of "+", "-", "*") and `answer` (int, which must be the
chain's value); or `problem` text ("37 +48 -19 *3") and `answer` text ("198").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from flywheel.assets import asset_path
from flywheel.rewards import Verdict
from flywheel.rewards import math as math_verifier
from flywheel.rewards.chain import verify
from flywheel.tasks.base import FileSplits, Problem, StepSpec, Task, check_prompt_template
from flywheel.tasks.chain_data import OPS, chain_values, format_ops

__all__ = ["DEFAULT_PROMPT_TEMPLATE", "MAX_ABS_VALUE", "MAX_OPS", "SHIPPED_SPLITS", "ChainProblem", "ChainTask"]

DEFAULT_PROMPT_TEMPLATE = "{start} {ops}\n"
SHIPPED_SPLITS = {
    "train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl", "test_hard": "test_hard.jsonl",
    "short": "short.jsonl",
}
"""Split name -> file under flywheel/assets/chain/ (disjoint chains; test_hard's are longer, short's
of 1-2 operations, for a pretrained model's diagnostic)."""
ANSWER_FORMATS = ("tags", "math")
MAX_OPS = 64
"""Most operations in one chain a row may hold."""
MAX_ABS_VALUE = 10**9
"""Largest |start|, |operand| and |value| after any operation a row may hold."""

_TEXT_OP = re.compile(r"([-+*])(-?[0-9]{1,10})")
_TEXT_INT = re.compile(r"-?[0-9]{1,10}")


@dataclass(frozen=True)
class ChainProblem(Problem):
    """A chain: `start`, then `ops` applied in order; `answer` (text) is its value.

    `question` is the chain as text ("37 +48 -19 *3"), so a plain Problem with that question
    and answer is the same chain. Build one with `ChainProblem.create`.
    """

    start: int
    ops: tuple[tuple[str, int], ...]

    @classmethod
    def create(cls, problem_id: str, start: int, ops: Sequence[Sequence]) -> ChainProblem:
        ops = tuple((str(op), int(operand)) for op, operand in ops)
        value = chain_values(start, ops)[-1]
        return cls(id=problem_id, question=f"{start} {format_ops(ops)}", answer=str(value), start=start, ops=ops)

    @property
    def value(self) -> int:
        return int(self.answer)


class ChainTask(FileSplits, Task):
    """Chain arithmetic: apply the operations in order to the start value.

    The prompt shows the chain ("37 +48 -19 *3\\n"); the completion is one line per operation
    ("37+48=85") and then `<answer>198</answer>`. Grading reads only the last answer block.
    The search depth d_T is `--data.search.max_depth` (a chain of L operations needs L + 1
    lines: the shipped splits need up to 9, test_hard up to 13).

    Args:
        split_files: split files to add or replace, as {"split name": "path.jsonl"}, merged
            over the shipped splits: "train" (chains of 2-8 operations), "val" and "test"
            (held out, the same lengths), "test_hard" (held out, 9-12 operations) and "short"
            (held out, 1-2 operations: a size a small pretrained model sometimes solves).
        lengths: keep only the built-in chains with one of these operation counts (e.g.
            [3] for short chains); None keeps all.
        prompt_template: the prompt as a str.format template with the fields {start} and
            {ops} ("+48 -19 *3"); BOS is added by the tokenizer, not here.
        chat_template: when the tokenizer has a chat template, the prompt is its user turn
            (true for a pretrained chat model). Off by default: the task's own policies (the
            tiny chain policy and the ones trained from it) read plain prompts and have none.
        system_prompt: the chat's system turn (None: the template's default). Ignored
            without a chat template.
        step_delimiter: text that ends one search step (one trace line); None: fixed chunks of
            `max_step_tokens` tokens (a pretrained model's free-form answer, as MathTask's steps).
        max_step_tokens: most tokens in one step (a line of the shipped chains is at most 9
            characters, the answer line 19).
        max_response_tokens: most tokens in a whole completion.
        answer_format: how the final answer is read: "tags" (the last `<answer>N</answer>`,
            flywheel.rewards.chain; the tiny chain policy's format) or "math" (the math
            verifier's readings of a chat model's answer: `\\boxed{N}`, "the answer is N", a
            last line that is just N; flywheel.rewards.math), with a prompt that asks for it,
            e.g. "... Give the final value within \\boxed{{}}.".
    """

    split_label = "chain"

    def __init__(
        self,
        split_files: dict[str, str] | None = None,
        lengths: list[int] | None = None,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        chat_template: bool = False,
        system_prompt: str | None = None,
        step_delimiter: str | None = "\n",
        max_step_tokens: int = 32,
        max_response_tokens: int = 192,
        answer_format: Literal["tags", "math"] = "tags",
    ) -> None:
        check_prompt_template(prompt_template, ("start", "ops"))
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
        self.answer_format = answer_format
        if max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1, got {max_response_tokens}")
        if lengths is not None and (not lengths or any(not isinstance(n, int) or n < 1 for n in lengths)):
            raise ValueError(f"lengths must be a non-empty list of operation counts >= 1, or None; got {lengths!r}")
        self.lengths = None if lengths is None else tuple(sorted(set(lengths)))
        self.prompt_template = prompt_template
        self.chat_template = chat_template
        self.system_prompt = system_prompt
        self.step = StepSpec(max_tokens=max_step_tokens, delimiter=step_delimiter)
        self.max_response_tokens = max_response_tokens
        self.init_splits({name: asset_path("chain", file) for name, file in SHIPPED_SPLITS.items()}, split_files)

    def prompt(self, problem: Problem) -> str:
        problem = as_chain(problem)
        return self.prompt_template.format(start=problem.start, ops=format_ops(problem.ops))

    @property
    def answer_rules(self) -> tuple[str, ...]:
        return math_verifier.ANSWER_RULES if self.answer_format == "math" else ()

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Verdict:
        """With tags, `truncated` changes nothing (the tags are already the strict format); with
        the math verifier a response cut by the length limit is graded on boxes only."""
        chain = as_chain(problem)
        if self.answer_format == "math":
            return math_verifier.verify(chain.answer, completion, truncated=truncated)
        return verify(chain.value, completion)

    def keep_problem(self, problem: Problem) -> bool:
        """Only chains of the `lengths` operation counts, when set."""
        return self.lengths is None or len(problem.ops) in self.lengths  # type: ignore[attr-defined]

    def problem_from_row(self, row: Mapping[str, Any], where: str) -> ChainProblem:
        if "start" in row or "ops" in row:
            missing = [key for key in ("start", "ops", "answer") if key not in row]
            if missing:
                raise ValueError(f"{where}: a chain row needs `start`, `ops` and `answer`; missing {', '.join(missing)}")
            start = _integer(row["start"], "start", where)
            ops = _ops_from_list(row["ops"], where)
            answer = _integer(row["answer"], "answer", where)
        elif "problem" in row or "answer" in row:
            start, ops = _chain_from_text(row.get("problem"), where)
            text = row.get("answer")
            if not isinstance(text, str) or not _TEXT_INT.fullmatch(text.strip()):
                raise ValueError(f"{where}: `answer` must be the chain's value as text like '198', got {text!r}")
            answer = int(text)
        else:
            raise ValueError(
                f"{where}: a chain row needs `start` (int), `ops` (list of [op, operand]) and `answer` (int), "
                f"or `problem` ('37 +48 -19 *3') and `answer` ('198'); got columns {sorted(row)}"
            )
        values = chain_values(start, ops)
        too_big = next((v for v in values if abs(v) > MAX_ABS_VALUE), None)
        if too_big is not None:
            raise ValueError(f"{where}: the chain reaches {too_big}, beyond the limit |value| <= {MAX_ABS_VALUE}")
        if values[-1] != answer:
            raise ValueError(f"{where}: `answer` {answer} does not match the ops, which give {values[-1]}")
        row_id = row.get("id", where)
        if not isinstance(row_id, (str, int)) or isinstance(row_id, bool):
            raise ValueError(f"{where}: `id` must be a string, got {row_id!r}")
        return ChainProblem.create(str(row_id), start, ops)



def as_chain(problem: Problem) -> ChainProblem:
    """A ChainProblem as is; a plain Problem read from its `question` / `answer` text."""
    if isinstance(problem, ChainProblem):
        return problem
    where = f"problem {problem.id}"
    start, ops = _chain_from_text(problem.question, where)
    chain = ChainProblem.create(problem.id, start, ops)
    if chain.answer != problem.answer.strip():
        raise ValueError(f"{where}: answer {problem.answer!r} does not match the ops, which give {chain.answer}")
    return chain


def _integer(value: object, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: `{name}` must be an integer, got {value!r}")
    if abs(value) > MAX_ABS_VALUE:
        raise ValueError(f"{where}: `{name}` {value} is beyond the limit |value| <= {MAX_ABS_VALUE}")
    return value


def _ops_from_list(value: object, where: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_OPS:
        raise ValueError(f"{where}: `ops` must be a list of 1 to {MAX_OPS} [op, operand] pairs, got {value!r}"[:300])
    ops = []
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"{where}: each of `ops` must be an [op, operand] pair, got {pair!r}"[:300])
        op, operand = pair
        if op not in OPS:
            raise ValueError(f"{where}: unknown operation {op!r} in `ops`; known: {', '.join(OPS)}"[:300])
        ops.append((op, _integer(operand, "ops", where)))
    return tuple(ops)


def _chain_from_text(value: object, where: str) -> tuple[int, tuple[tuple[str, int], ...]]:
    if not isinstance(value, str) or len(value) > 16 * MAX_OPS:
        raise ValueError(f"{where}: `problem` must be a chain as text like '37 +48 -19 *3', got {value!r}"[:300])
    parts = value.split()
    if len(parts) < 2 or not _TEXT_INT.fullmatch(parts[0]) or not all(_TEXT_OP.fullmatch(p) for p in parts[1:]):
        raise ValueError(f"{where}: `problem` must be a chain as text like '37 +48 -19 *3', got {value!r}"[:300])
    ops = tuple((m.group(1), int(m.group(2))) for m in map(_TEXT_OP.fullmatch, parts[1:]))
    return int(parts[0]), _ops_from_list(list(ops), where)
