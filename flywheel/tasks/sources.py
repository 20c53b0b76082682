"""Problem sources: a task's built-in split, or jsonl/parquet files and Hugging Face datasets
(flywheel.tasks.hf_datasets) whose rows have `problem` and `answer`, or columns mapped to them
(flywheel.tasks.columns: `--data.problems.columns.*`).

Bad rows are never dropped silently: by default the first one raises an error naming the
file and line; with `skip_bad_rows=True` they are skipped, counted and logged. A bad row is
one that does not parse, lacks a column, is longer than `MAX_ROW_BYTES`, or fails the
caller's `check` (the fit and eval commands check that each prompt fits the policy's context).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Sequence

from flywheel.tasks import Problem, Task
from flywheel.tasks import hf_datasets
from flywheel.tasks.columns import Columns, MissingColumn, map_row

log = logging.getLogger(__name__)

MAX_ROW_BYTES = 1 << 20
"""A problem row longer than this (1 MiB) is refused as it is read: no prompt that long fits
a policy's context, and tokenizing and searching it would cost memory out of all proportion."""


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
    check: Callable[[Problem], None] | None = None,
    columns: Columns = Columns(),
    flags: str = "--data.problems.",
    columns_flag: str = "columns",
) -> LoadedProblems:
    """Problems from `files` if given, else the task's built-in `split`. Ids must be unique.
    `limit` takes the first that many problems over all `files` together, in order (how many
    came from each file is logged).

    `check(problem)` raises ValueError for a row the caller cannot use (its message is put
    after the row's `file:line`); such rows are bad rows like malformed ones. `columns` maps
    the files' columns to the task's row. `flags` is the command's prefix of these settings
    (`--data.problems.` for fit, `--` for eval and diagnose) and `columns_flag` the name of
    `columns` after it, for the error messages."""
    if limit is not None and limit < 1:
        raise ValueError(f"the problem limit must be >= 1 or None (all problems), got {limit}")
    if not files:
        problems = task.problems(split)
        return LoadedProblems(tuple(problems[:limit] if limit else problems), 0)
    check_no_file_twice(files)
    problems: list[Problem] = []
    skipped = 0
    taken: dict[str, int] = {}  # problems per file, in order
    for file in files:
        if limit and len(problems) >= limit:  # the limit is over all files together
            break
        taken[file] = 0
        for _, _, problem in checked_rows(task, file, skip_bad_rows=skip_bad_rows, check=check,
                                                  columns=columns, flags=flags, columns_flag=columns_flag):
            if problem is None:
                skipped += 1
            else:
                problems.append(problem)
                taken[file] += 1
            if limit and len(problems) >= limit:
                break
    if limit and len(files) > 1:
        log.info("the first %d problems of %d files: %s", len(problems), len(files),
                 ", ".join(f"{taken[f]} from {f}" if f in taken else f"none from {f}" for f in files))
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


def check_no_file_twice(files: Sequence[str]) -> None:
    """A list that names one file twice (`[a.jsonl, ./a.jsonl]`, or through a link) would count
    its problems twice: ValueError naming the file and both places in the list (before: "duplicate
    problem id ..." blamed the ids)."""
    first: dict[Path, int] = {}
    for place, file in enumerate(files, start=1):
        real = Path(file).expanduser().resolve()
        if real in first:
            raise ValueError(f"the list names {file} twice (entries {first[real]} and {place} are the same file "
                             f"{real}): its problems would count twice; list it once")
        first[real] = place


def checked_rows(
    task: Task,
    file: str,
    *,
    skip_bad_rows: bool = False,
    check: Callable[[Problem], None] | None = None,
    columns: Columns = Columns(),
    flags: str = "--data.problems.",
    columns_flag: str = "columns",
) -> Iterator[tuple[str, object, Problem | None]]:
    """(location, row, problem) for every row of `file`, its columns mapped by `columns` (the
    row yielded is the mapped one), parsed by the task and passed through `check`. A bad row
    raises ValueError naming its location and the flag that skips it, or with `skip_bad_rows`
    is logged and yielded with problem None."""
    for where, row in _rows(file):
        try:
            if isinstance(row, Exception):
                raise ValueError(f"{where}: {row}")
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
            as_read = row
            try:
                row = map_columns(as_read, columns, where)
                problem = task.problem_from_row(row, where)
            except MissingColumn as err:
                if err.inside is None:  # the task saw the mapped row (`problem` read from `question`): the file's own
                    err.present = sorted(map(str, as_read))
                role = f"{flags}{columns_flag}.{err.role}"
                raise ValueError(f"{where}: no column {err.column!r} ({role}); {err.has()}; "
                                 f"map one with {role}=COLUMN") from None
            if check is not None:
                try:
                    check(problem)
                except ValueError as err:
                    raise ValueError(f"{where}: {err}") from None
        except ValueError as err:
            message = command_flags(str(err), flags, columns_flag)
            if not skip_bad_rows:
                raise ValueError(f"{message} (pass {flags}skip_bad_rows=true to skip and count bad rows)") from None
            log.warning("skipping bad problem row: %s", message)
            yield where, row, None
            continue
        yield where, row, problem


def map_columns(row: dict, columns: Columns, where: str) -> dict:
    """`columns.map_row` with the row's location put before a value error (a chat it refuses)."""
    try:
        return map_row(row, columns)
    except MissingColumn:
        raise
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def command_flags(message: str, flags: str, columns_flag: str = "columns") -> str:
    """`message` with fit's flags spelled as the command spells them: `--data.problems.columns.`
    is `columns_flag`'s, and under `flags="--"` (eval, diagnose) `--data.problems.X` is `--X`
    and `--data.task.` is `--task.`."""
    message = message.replace("--data.problems.columns.", f"--data.problems.{columns_flag}.")
    if flags == "--data.problems.":
        return message
    return message.replace("--data.problems.", flags).replace("--data.task.", "--task.")


def _rows(source: str) -> Iterator[tuple[str, object]]:
    """(location, row or the parse error) for every row of a jsonl or parquet file or a
    Hugging Face dataset (flywheel.tasks.hf_datasets)."""
    if hf_datasets.is_hf_source(source):
        for where, row in hf_datasets.rows(source):
            yield where, ValueError(_too_long()) if len(json.dumps(row, default=str)) > MAX_ROW_BYTES else row
        return
    path = Path(source)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".parquet"))
        raise ValueError(f"problem file {path} is a folder, not a file; "
                         + (f"pass the files in it (e.g. [{', '.join(str(path / n) for n in inside[:3])}])"
                            if inside else "it holds no .jsonl or .parquet files")
                         + " (a Dataset.save_to_disk folder, with its state.json, is read as a dataset)")
    if not path.is_file():
        raise FileNotFoundError(f"problem file {path} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'flywheel[parquet]' (or pip install pyarrow)") from err
        try:
            rows = pq.read_table(path).to_pylist()
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"problem file {path} cannot be read as parquet ({type(err).__name__}: {detail})") from None
        for i, row in enumerate(rows, start=1):
            if len(json.dumps(row, default=str)) > MAX_ROW_BYTES:
                yield f"{path}:row {i}", ValueError(_too_long())
            else:
                yield f"{path}:row {i}", row
        return
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"problem file {path}: expected .jsonl or .parquet")
    with path.open("rb") as fh:
        for i, raw in enumerate(_bounded_lines(fh, MAX_ROW_BYTES), start=1):
            if raw is None:
                yield f"{path}:{i}", ValueError(_too_long())
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield f"{path}:{i}", ValueError(f"not UTF-8 text ({err.reason} at byte {err.start})")
                continue
            if not line.strip():
                continue
            try:
                yield f"{path}:{i}", json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{path}:{i}", ValueError(f"bad JSON ({err.msg})")


def _bounded_lines(fh: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """The lines of a binary file, each read at most `limit` + 1 bytes at a time: a line longer
    than `limit` bytes is skipped in chunks and yielded as None, so a 400 MB single-line file
    costs a few MiB of memory, not the line's size three times over (issue 37)."""
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        if len(raw) <= limit:
            yield raw
            continue
        while not raw.endswith(b"\n"):
            raw = fh.readline(limit + 1)
            if not raw:
                break
        yield None


def _too_long() -> str:
    return f"row longer than {MAX_ROW_BYTES} bytes, the limit of one problem row (no prompt that long fits a policy)"
