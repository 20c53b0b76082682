"""Column mapping: a problem row in its publisher's shape -> the `problem` / `answer` / `id`
row a task reads (flywheel.tasks.base.Task.problem_from_row).

A mapped column is a top-level name (`question`) or a dotted path into nested fields
(`reward_model.ground_truth`). The problem column may hold a chat: a list of
`{"role", "content"}` messages (verl's and TRL's `prompt` / `messages`). Its one user turn is the
problem. An assistant turn is refused (the problem must be the question alone); a system turn
is refused unless `system_turn="drop"`, which drops it so that the task's own
`system_prompt` (or the chat template's default) is the one the policy sees. A prompt is never
silently changed.

Pure: no I/O. `map_row` raises `MissingColumn` (a ValueError) for a mapped column the row
lacks; the caller adds the file, the row and the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

ROLES = ("problem", "answer", "id")


class MissingColumn(ValueError):
    """A row lacks the column that `role` ("problem", "answer", "id") is read from.

    `present`: the columns the row has, or the fields of `inside` (the nested field a dotted
    path stopped at)."""

    def __init__(self, role: str, column: str, present: list[str], inside: str | None = None) -> None:
        self.role, self.column, self.present, self.inside = role, column, present, inside
        super().__init__(f"no column {column!r}; {self.has()}")

    def has(self) -> str:
        owner = f"column {self.inside!r}" if self.inside else "the row"
        return f"{owner} has: {', '.join(self.present) or 'nothing'}"


@dataclass(frozen=True)
class Columns:
    """Where a problem row's problem, answer and id are (`--data.problems.columns.*`).

    Args:
        problem: column of the problem text, or of a chat (a list of `{role, content}`
            messages whose user turn is the problem); a dotted path reaches a nested field.
        answer: column of the gold answer (text, or an integer / float written canonically);
            a dotted path reaches a nested field (`reward_model.ground_truth`).
        id: column of the problem's id (text or integer); None: the row's `file:line`. The
            default `id` falls back to `file:line` when a row has no `id`.
        system_turn: a system turn in a chat problem column: "refuse" it (default: the row is
            bad and named) or "drop" it (the task's `system_prompt` applies instead).
    """

    problem: str = "problem"
    answer: str = "answer"
    id: str | None = "id"
    system_turn: Literal["refuse", "drop"] = "refuse"

    def __post_init__(self) -> None:
        for role in ROLES:
            path = getattr(self, role)
            if path is None and role == "id":
                continue
            if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
                raise ValueError(f"--data.problems.columns.{role}={path!r}: give a column name or a dotted path "
                                 "like reward_model.ground_truth")
        if self.system_turn not in ("refuse", "drop"):
            raise ValueError(f"--data.problems.columns.system_turn={self.system_turn!r}: choose 'refuse' or 'drop'")

    @property
    def mapped(self) -> bool:
        """Whether any column differs from the plain `problem` / `answer` / `id` shape."""
        return (self.problem, self.answer, self.id) != ("problem", "answer", "id")


def map_row(row: Mapping[str, Any], columns: Columns) -> dict[str, Any]:
    """`row` with `problem`, `answer` and `id` read from their mapped columns (every other column
    kept, for tasks that read their own). A column mapped to itself that the row lacks stays
    absent (the task then names what it needs); a column mapped elsewhere must exist.

    >>> map_row({"question": "1+1?", "reward_model": {"ground_truth": 2}},
    ...         Columns(problem="question", answer="reward_model.ground_truth"))["answer"]
    2
    """
    out = dict(row)
    for role in ROLES:
        path = getattr(columns, role)
        if path is None:
            out.pop(role, None)
            continue
        if path == role and role not in row:
            continue
        out[role] = lookup(row, path, role)
    if isinstance(out.get("problem"), (list, tuple)):
        out["problem"] = user_turn(out["problem"], columns.system_turn)
    return out


def lookup(row: Mapping[str, Any], path: str, role: str) -> Any:
    """The value at `path`: a top-level column of that exact name, else a dotted path."""
    if path in row:
        return row[path]
    value: Any = row
    walked: list[str] = []
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            present = sorted(map(str, value)) if isinstance(value, Mapping) else [f"no fields (a {type(value).__name__})"]
            raise MissingColumn(role, path, present, ".".join(walked) or None)
        value = value[part]
        walked.append(part)
    return value


def user_turn(chat: list | tuple, system_turn: str) -> str:
    """The problem of a chat: the content of its one user turn (module docstring for the rule)."""
    users: list[str] = []
    for i, message in enumerate(chat):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise ValueError(f"chat message {i} must be {{'role': str, 'content': str}}, got {message!r:.80}")
        role = message["role"]
        if role == "user":
            users.append(message["content"])
        elif role == "system":
            if system_turn != "drop":
                raise ValueError(f"the chat has a system turn ({message['content']!r:.60}); drop it with "
                                 "--data.problems.columns.system_turn=drop (set the task's system_prompt to keep "
                                 "one: --data.task.init_args.system_prompt=...)")
        else:
            raise ValueError(f"the chat has a {role!r} turn; a problem is the user's question alone")
    if len(users) != 1:
        raise ValueError(f"the chat has {len(users)} user turns; a problem is exactly one user turn")
    return users[0]
