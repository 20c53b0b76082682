"""ProblemPool: the run's training and held-out problems, read once from `--data.problems.*`.

The training pool is a seeded subset when `max_train_problems` is set (the hard set is
screened from it), taken after the training problems that are held-out problems are dropped
(`drop_eval_overlap`; otherwise they and repeats within the pool are counted in a warning);
the held-out problems are the first `max_eval_problems`. flywheel.run.preflight
sets `row_check` and reads both before the first search, so a bad file fails early. With
`stream`, the training files are a litdata stream instead (data_modules.streaming): `draw`
takes each epoch's problems from it, and its position is part of the checkpoint.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Callable

from data_modules.settings import ProblemsConfig
from flywheel.tasks import Problem, Task
from flywheel.tasks.overlap import find_overlap, first_few, normalise
from flywheel.tasks.sources import load_problems

log = logging.getLogger(__name__)


def held_out_columns(cfg: ProblemsConfig) -> dict[str, Any]:
    """`load_problems`' column arguments for the held-out files."""
    if cfg.eval_columns is None:
        return {"columns": cfg.columns}
    return {"columns": cfg.eval_columns, "columns_flag": "eval_columns"}


class ProblemPool:
    """The problems of one run.

    Args:
        task: reads the files (or its built-in splits) and checks each row.
        config: files, splits, limits (`--data.problems.*`).
        seed: seed of the training subset (`--data.seed`).
    """

    def __init__(self, task: Task, config: ProblemsConfig, seed: int) -> None:
        self.task, self.config, self.seed = task, config, seed
        self.row_check: Callable[[Problem], None] | None = None
        """Raises ValueError for a problem row the policy cannot take (set by flywheel.run.preflight)."""
        self.skipped_rows = 0
        """Malformed training rows skipped (`--data.problems.skip_bad_rows`)."""
        self._train: dict[str, Problem] | None = None
        self._held_out: tuple[Problem, ...] | None = None
        self._stream = None
        self._directory: Path | None = None
        self._stream_position: dict[str, int] | None = None

    def train(self) -> dict[str, Problem]:
        """Training problems by id (a seeded subset when `max_train_problems` is set). With
        `stream`: the files are optimized (every row checked, once) and this is the
        problems drawn so far."""
        if self._train is None and self.config.stream:
            self._stream_directory()
            self._train = {}
        if self._train is None:
            cfg = self.config
            loaded = load_problems(self.task, cfg.train_files, cfg.train_split, skip_bad_rows=cfg.skip_bad_rows,
                                   check=self.row_check, columns=cfg.columns)
            problems = self._without_overlap(list(loaded.problems))
            if cfg.max_train_problems is not None and len(problems) > cfg.max_train_problems:
                problems = random.Random(f"{self.seed}:subset").sample(problems, cfg.max_train_problems)
            self._train = {p.id: p for p in problems}
            self.skipped_rows = loaded.skipped
        return self._train

    def held_out(self) -> tuple[Problem, ...]:
        """The held-out problems, in file order."""
        if self._held_out is None:
            cfg = self.config
            self._held_out = load_problems(self.task, cfg.eval_files, cfg.eval_split, skip_bad_rows=cfg.skip_bad_rows,
                                           limit=cfg.max_eval_problems, check=self.row_check,
                                           **held_out_columns(cfg)).problems
        return self._held_out

    def _without_overlap(self, problems: list[Problem]) -> list[Problem]:
        """`problems` less those that are held-out problems when `drop_eval_overlap`; repeats
        and leaks are logged with their first ids (flywheel.tasks.overlap)."""
        cfg = self.config
        overlap = find_overlap(problems, self.held_out(), self.task.problem_key)
        train = f"--data.problems.train_files={cfg.train_files}" if cfg.train_files else f"--data.problems.train_split={cfg.train_split}"
        held = f"--data.problems.eval_files={cfg.eval_files}" if cfg.eval_files else f"--data.problems.eval_split={cfg.eval_split}"
        if overlap.repeats:
            log.warning("%d training problems (%s) repeat an earlier one's text (%s): they are trained on as often as "
                        "they appear", len(overlap.repeats), train,
                        first_few([f"{a} = {b}" for a, b in overlap.repeats]).replace("'", ""))
        if overlap.leaks and cfg.drop_eval_overlap:
            leaked = set(overlap.leaks)
            log.info("dropped %d training problems that are held-out problems (%s; --data.problems.drop_eval_overlap): "
                     "%s", len(leaked), held, first_few(overlap.leaks))
            return [p for p in problems if p.id not in leaked]
        if overlap.leaks:
            log.warning("%d training problems (%s) are held-out problems (%s): held-out pass@k will measure memory, "
                        "not generalisation; drop them with --data.problems.drop_eval_overlap=true, or train on other "
                        "problems. First: %s", len(overlap.leaks), train, held, first_few(overlap.leaks))
        return problems

    # ------------------------------------------------------------------ stream
    def draw(self, count: int, rank: int, world: int) -> list[Problem]:
        """Rank `rank`'s share of the next `count` problems of the stream (`count` over all
        ranks, split as `problems[rank::world]` would split them); every rank draws from
        its own shard, so no problem is drawn twice in a pass."""
        if self._stream is None:
            from data_modules.streaming import StreamingProblems

            self._stream = StreamingProblems(self.task, self._stream_directory(), self.seed, rank, world)
            if self._stream_position is not None:
                self._stream.load_state_dict(self._stream_position)
        problems = self._stream.take(len(range(rank, count, world)))
        self.train().update((p.id, p) for p in problems)
        return problems

    def stream_position(self) -> dict[str, int] | None:
        """The stream's position (pass, drawn in it), the same on every rank; None without a stream."""
        if self._stream is not None:
            return self._stream.state_dict()
        return self._stream_position

    def load_stream_position(self, position: dict[str, Any] | None) -> None:
        """Continue the stream from `position` (from `stream_position`)."""
        self._stream_position = {k: int(v) for k, v in position.items()} if position is not None else None
        if self._stream is not None and position is not None:
            self._stream.load_state_dict(self._stream_position)

    def _stream_directory(self) -> Path:
        from data_modules.streaming import optimize_files

        if self._directory is None:
            cfg = self.config
            self._directory = optimize_files(self.task, cfg.train_files, Path(cfg.cache_folder), cfg.skip_bad_rows,
                                             columns=cfg.columns, exclude=self._held_out_texts())
        return self._directory

    def _held_out_texts(self) -> frozenset[str]:
        """The held-out problems' normalised keys (`Task.problem_key`), kept out of a stream when `drop_eval_overlap`."""
        if not self.config.drop_eval_overlap:
            return frozenset()
        return frozenset(normalise(self.task.problem_key(p)) for p in self.held_out())
