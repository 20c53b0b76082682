"""Problem sources: a task's built-in split, or jsonl/parquet files with `problem` and `answer`.

Bad rows are never dropped silently: by default the first one raises an error naming the
file and line; with `skip_bad_rows=True` they are skipped, counted and logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from flywheel.tasks import Problem, Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedProblems:
    problems: tuple[Problem, ...]
    skipped: int
    """Rows that were malformed and skipped (only ever non-zero with skip_bad_rows=True)."""


def load_problems(
    task: Task,
    files: Sequence[str] | None,
    split: str,
    *,
    skip_bad_rows: bool = False,
    limit: int | None = None,
) -> LoadedProblems:
    """Problems from `files` if given, else the task's built-in `split`. Ids must be unique."""
    if not files:
        problems = task.problems(split)
        return LoadedProblems(tuple(problems[:limit] if limit else problems), 0)
    problems: list[Problem] = []
    skipped = 0
    for file in files:
        for where, row in _rows(Path(file)):
            try:
                if isinstance(row, Exception):
                    raise ValueError(f"{where}: {row}")
                if not isinstance(row, dict):
                    raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
                problems.append(task.problem_from_row(row, where))
            except ValueError as err:
                if not skip_bad_rows:
                    raise ValueError(f"{err} (pass --data.skip_bad_rows=true to skip and count bad rows)") from None
                skipped += 1
                log.warning("skipping bad problem row: %s", err)
            if limit and len(problems) >= limit:
                break
    if skipped:
        log.warning("skipped %d malformed problem rows in %s", skipped, ", ".join(files))
    seen: set[str] = set()
    for problem in problems:
        if problem.id in seen:
            raise ValueError(f"duplicate problem id {problem.id!r} in {', '.join(files)}; ids must be unique")
        seen.add(problem.id)
    if not problems:
        raise ValueError(f"no usable problems in {', '.join(files)}")
    return LoadedProblems(tuple(problems), skipped)


def _rows(path: Path) -> Iterator[tuple[str, object]]:
    """(location, row or the parse error) for every row of a jsonl or parquet file."""
    if not path.is_file():
        raise FileNotFoundError(f"problem file {path} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'flywheel[parquet]' (or pip install pyarrow)") from err
        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield f"{path}:row {i}", row
        return
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"problem file {path}: expected .jsonl or .parquet")
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{i}", json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{path}:{i}", ValueError(f"bad JSON ({err.msg})")
