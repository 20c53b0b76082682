"""Pass1@K screening (deepsearch.md §7, Eq. 8-9): sample K responses per problem at the
screening temperature, grade them, and gather every rank's rates (`screen`); and the
problems it selects for an epoch and at a round's end (`Screening`), which problems it
measures being the curriculum's call (`Curriculum.to_screen`: the hard set, or with
`--data.hard_set.rescreen=all` the pool)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from data_modules.curriculum import Curriculum, RoundChange
from data_modules.pool import ProblemPool
from data_modules.progress import progress
from data_modules.token_split import TokenSplit
from flywheel.adaptive import HardSetConfig, pass1_rates
from flywheel.run.distributed import all_gather, all_sum
from flywheel.reporting.evaluation import EvalConfig, evaluate
from flywheel.generation.base import Generator
from flywheel.ports import WallClock
from flywheel.reporting.wall_split import SCREENING, UNTIMED
from flywheel.tasks.grading import Grader
from flywheel.tasks import Problem, Task


def screen(
    shard: Sequence[Problem],
    *,
    generator: Generator,
    tokenizer: Any,
    task: Task,
    config: HardSetConfig,
    seed: int,
    progress: Callable[[int], None] | None = None,
    grader: Grader | None = None,
) -> tuple[dict[str, float], int]:
    """(Pass1@K rate of every problem of every rank's shard, tokens this rank generated), the
    responses graded by `grader` (the run's grading guard; default the task unguarded).
    Collective: every rank calls it with its own shard and gets the same rates."""
    samples = EvalConfig(samples=config.k, temperature=config.temperature, top_p=config.top_p, seed=seed)
    result = evaluate(generator, tokenizer, task, shard, samples, progress=progress, grader=grader)
    gathered = all_gather((result.problem_ids, result.samples, result.correct))
    return pass1_rates(*(sum((list(part[i]) for part in gathered), []) for i in range(3))), result.generated_tokens


class Screening:
    """The Pass1@K screening of one run and the problems it selects: the base policy's hard
    set (Eq. 8) and each round's refresh (Eq. 9) over the training pool, or with a problem
    stream (`--data.problems.stream`) each epoch's draw. Counts the tokens it generates.

    Every method is collective: every rank calls it with the same `trainer` (ranks, progress,
    SIGTERM stop points), `generator` and `tokenizer`, and the run's wall clock `wall` (the
    screening's section of the wall split).
    """

    def __init__(self, pool: ProblemPool, curriculum: Curriculum, task: Task,
                 grader: Grader | None = None) -> None:
        self.pool, self.curriculum, self.task, self.grader = pool, curriculum, task, grader
        self.tokens = 0
        """Tokens generated for screening over the run, all ranks (checkpointed by the data module)."""

    def rates(self, shard: Sequence[Problem], label: str, *, trainer: Any, generator: Generator,
              tokenizer: Any, wall: WallClock = UNTIMED) -> dict[str, float]:
        """Pass1@K of every rank's `shard` (each rank its own), the same on every rank."""
        cfg = self.curriculum.hard_set_config
        with progress(len(shard), f"screen {label}", trainer, show=trainer.is_global_zero, generator=generator,
                      samples=cfg.k) as advance, \
                wall.section(SCREENING):
            rates, tokens = screen(shard, generator=generator, tokenizer=tokenizer, task=self.task, config=cfg,
                                   seed=self.curriculum.screening_seed(), progress=advance, grader=self.grader)
        tokens = all_sum(tokens)  # every rank's: the same count on every rank, so any rank's checkpoint holds the run's
        self.tokens += tokens
        self.curriculum.count_tokens(TokenSplit(screening=tokens))
        return rates

    def of_ids(self, ids: Sequence[str], label: str, **run: Any) -> dict[str, float]:
        """Pass1@K of training problems `ids` (the same on every rank; each screens its share)."""
        trainer, pool = run["trainer"], self.pool.train()
        return self.rates([pool[i] for i in ids[trainer.global_rank :: trainer.world_size]], label, **run)

    def start(self, **run: Any) -> None:
        """D_hard(0), once: screen the training pool (or with rescreen=all and
        `screen_problems`, a sample of it) with the policy as it starts (Eq. 8)."""
        curriculum = self.curriculum
        if not curriculum.started:
            ids = list(self.pool.train())
            if not curriculum.hard_set_config.enabled:
                curriculum.start(ids, {})
                return
            ids = curriculum.to_screen(ids)
            curriculum.start(ids, self.of_ids(ids, "base", **run))

    def draw(self, count: int, **run: Any) -> list[Problem]:
        """This rank's share of a file stream's next `count` problems, screened with the
        current policy and the hard ones kept when the hard set is on (Eq. 8 on the draw)."""
        trainer, curriculum = run["trainer"], self.curriculum
        if not curriculum.started:
            curriculum.start_streaming()
        drawn = self.pool.draw(count, trainer.global_rank, trainer.world_size)
        if not curriculum.hard_set_config.enabled:
            return drawn
        rates = self.rates(drawn, "draw", **run)
        return [p for p in drawn if curriculum.hard_set_config.is_hard(rates[p.id])]

    def end_round(self, **run: Any) -> RoundChange:
        """Re-measure the hard set with the trained policy and shrink it (Eq. 9), or with
        rescreen=all re-measure the pool (or a sample) and take its hard problems; settle the
        replay buffer's candidates against the same rates."""
        curriculum = self.curriculum
        if curriculum.hard is None:
            raise RuntimeError("a round ended before the first epoch screened the hard set")
        if not curriculum.hard_set_config.enabled:
            return curriculum.end_round({})
        ids = curriculum.to_screen(list(self.pool.train()))
        return curriculum.end_round(self.of_ids(ids, f"round {curriculum.round + 1}", **run), ids)
