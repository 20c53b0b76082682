"""ProblemPool: the run's training and held-out problems, read once from `--data.problems.*`.

The training pool is a seeded subset when `max_train_problems` is set (the hard set is
screened from it); the held-out problems are the first `max_eval_problems`. flywheel.preflight
sets `row_check` and reads both before the first search, so a bad file fails early.
"""

from __future__ import annotations

import random
from typing import Callable

from data_modules.settings import ProblemsConfig
from flywheel.tasks import Problem, Task
from flywheel.tasks.sources import load_problems

SKIP_FLAG = "--data.problems.skip_bad_rows"


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
        """Raises ValueError for a problem row the policy cannot take (set by flywheel.preflight)."""
        self.skipped_rows = 0
        """Malformed training rows skipped (`--data.problems.skip_bad_rows`)."""
        self._train: dict[str, Problem] | None = None
        self._held_out: tuple[Problem, ...] | None = None

    def train(self) -> dict[str, Problem]:
        """Training problems by id (a seeded subset when `max_train_problems` is set)."""
        if self._train is None:
            cfg = self.config
            loaded = load_problems(self.task, cfg.train_files, cfg.train_split, skip_bad_rows=cfg.skip_bad_rows,
                                   check=self.row_check, skip_flag=SKIP_FLAG)
            problems = list(loaded.problems)
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
                                           skip_flag=SKIP_FLAG).problems
        return self._held_out
