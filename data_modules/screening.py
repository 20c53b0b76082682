"""Pass1@K screening (deepsearch.md §7, Eq. 8-9): sample K responses per problem at the
screening temperature, grade them, and gather every rank's rates."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from flywheel.adaptive import HardSetConfig, pass1_rates
from flywheel.distributed import all_gather
from flywheel.evaluation import EvalConfig, evaluate
from flywheel.generation.base import Generator
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
) -> tuple[dict[str, float], int]:
    """(Pass1@K rate of every problem of every rank's shard, tokens this rank generated).
    Collective: every rank calls it with its own shard and gets the same rates."""
    samples = EvalConfig(samples=config.k, temperature=config.temperature, top_p=config.top_p, seed=seed)
    result = evaluate(generator, tokenizer, task, shard, samples, progress=progress)
    gathered = all_gather((result.problem_ids, result.samples, result.correct))
    return pass1_rates(*(sum((list(part[i]) for part in gathered), []) for i in range(3))), result.generated_tokens
