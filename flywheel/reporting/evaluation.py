"""Held-out evaluation: sample n responses per problem, grade them, report unbiased pass@k.

`evaluate` counts one process's problems; `evaluate_sharded` is the one evaluator of a run:
every rank counts its own shard (no padding, no duplicates) and every rank gets the merged
counts in problem order. `fit`'s held-out evaluation (callbacks.evaluation), `validate` /
`test` (the module's eval step), `flywheel eval` and the tiny policy's card
(tools/make_tiny_policy.py) use it; the hard-set screening uses `evaluate` on its shard.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flywheel.run.distributed import all_gather, world
from flywheel.finite import check_finite_fields
from flywheel.generation.base import GenerationRequest, Generator, SamplingParams
from flywheel.reporting.metrics import pass_at_k
from flywheel.rewards import Verdict
from flywheel.reporting.problem_view import decoder, encode_prompt, eos_ids, search_problems
from flywheel.search.config import SearchConfig
from flywheel.search.driver import derive_seed
from flywheel.search.flat import flat_rollouts
from flywheel.tasks import Problem, Task
from flywheel.tasks.environment import EnvironmentTask
from flywheel.tasks.grading import Grader

log = logging.getLogger(__name__)


def check_sampling(samples: int, temperature: float, top_p: float, problems_per_batch: int, prefix: str) -> None:
    """The evaluation's sampling settings, named by their flags (`prefix` + field: `fit`'s
    `--data.eval.`, the eval command's `--`). Raises ValueError."""
    if samples < 1:
        raise ValueError(f"{prefix}samples={samples}: must be >= 1 (responses per problem)")
    if not 0 <= temperature < math.inf:  # NaN and .inf too
        raise ValueError(f"{prefix}temperature={temperature}: must be a finite number >= 0 (0 = greedy, 1.0 = the "
                         "policy's own distribution)")
    if not 0 < top_p <= 1:
        raise ValueError(f"{prefix}top_p={top_p}: must be in (0, 1]")
    if problems_per_batch < 1:
        raise ValueError(f"{prefix}problems_per_batch={problems_per_batch}: must be >= 1")


@dataclass(frozen=True)
class EvalConfig:
    """How the held-out set is evaluated.

    Args:
        samples: responses sampled per problem (n of the unbiased estimator).
        k: the k of the reported pass@k (default: `samples`); above `samples` it is lowered to
            `samples`, with a warning (pass@k needs k samples per problem); pass@1 is always reported.
        temperature: sampling temperature.
        top_p: nucleus sampling.
        seed: seed of the evaluation samples; the same for every round (common random
            numbers make round-to-round differences less noisy).
        problems_per_batch: problems per generator call.
        at_start: `fit` also evaluates the policy before the first update (the run's
            baseline in summary.json); the rounds' evaluations follow either way.
        every_tokens: `fit` evaluates at a round's end only once at least this many more
            training tokens were generated since its last evaluation (0: every round). The
            run's last round, and a round its token budget cuts short, are always evaluated.
            For runs whose rounds are cheap next to a large held-out set (flat rollouts at a
            large token budget); a skipped round keeps its row in summary.json, without pass@k.
    """

    samples: int = 4
    k: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 1234
    problems_per_batch: int = 256
    at_start: bool = True
    every_tokens: int = 0

    def __post_init__(self) -> None:
        check_finite_fields(self, "data.eval")
        check_sampling(self.samples, self.temperature, self.top_p, self.problems_per_batch, "--data.eval.")
        if self.k is not None and self.k < 1:
            raise ValueError(f"--data.eval.k={self.k} must be >= 1")
        if self.k is not None and self.k > self.samples:  # e.g. a recipe's k = 4 under --data.eval.samples=2
            log.warning("--data.eval.k=%d is above --data.eval.samples=%d: pass@%d is reported instead (pass@k needs k "
                        "samples per problem); raise --data.eval.samples for pass@%d", self.k, self.samples, self.samples, self.k)
        if self.every_tokens < 0:
            raise ValueError(f"--data.eval.every_tokens={self.every_tokens} must be >= 0 (0 = evaluate every round)")

    @property
    def pass_k(self) -> int:
        """The k of the reported pass@k: `k`, at most `samples`."""
        return self.samples if self.k is None else min(self.k, self.samples)


@dataclass(frozen=True)
class EvalResult:
    """Per-problem sample and correct counts, and what producing them cost."""

    problem_ids: tuple[str, ...]
    samples: tuple[int, ...]
    correct: tuple[int, ...]
    generated_tokens: int
    reasons: tuple[tuple[str, int], ...] = ()
    """The verdicts' reasons ("correct", "wrong_value", ...) and their counts, most common first."""

    def pass_at(self, k: int) -> float:
        """Mean unbiased pass@k over the problems (NaN when there are none)."""
        if not self.samples:
            return float("nan")
        return sum(pass_at_k(n, c, k) for n, c in zip(self.samples, self.correct)) / len(self.samples)


def evaluate(
    generator: Generator,
    tokenizer: Any,
    task: Task,
    problems: Sequence[Problem],
    config: EvalConfig,
    *,
    progress: Callable[[int], None] | None = None,
    request_seed: Callable[[Problem], int] | None = None,
    grader: Grader | None = None,
) -> EvalResult:
    """Sample `samples` full responses for every problem and grade them with the task
    (through `grader`: the run's grading guard, flywheel.tasks.grading; default the task
    unguarded). An environment's task (flywheel.tasks.environment) plays `samples` episodes
    of each problem instead, turn by turn (`episodes`).

    Request seeds depend on (seed, problem id) only, so evaluating two checkpoints on the
    same problems uses common random numbers (their difference is less noisy), whatever the
    sharding or chunking. `request_seed(problem)` replaces that rule (the tiny policy's card
    keeps the seeds it was measured with).
    """
    params = SamplingParams(max_new_tokens=task.max_response_tokens, temperature=config.temperature, top_p=config.top_p)
    chunk, samples, seed = config.problems_per_batch, config.samples, config.seed
    seed_of = request_seed or (lambda p: derive_seed(seed, zlib.crc32(p.id.encode())))
    score = grader.score if grader is not None else task.score
    correct: list[int] = []
    reasons: Counter[str] = Counter()
    tokens = 0
    for first in range(0, len(problems), chunk):
        part = problems[first : first + chunk]
        if isinstance(task, EnvironmentTask):
            verdicts_of, part_tokens = episodes(generator, tokenizer, task, part, config, [seed_of(p) for p in part], grader)
        else:
            requests = [GenerationRequest(prompt_ids=encode_prompt(tokenizer, task, p), n=samples, params=params,
                                          seed=seed_of(p)) for p in part]
            outputs = generator.sample(requests)
            part_tokens = sum(len(c.token_ids) for completions in outputs for c in completions)
            verdicts_of = [[score(problem, tokenizer.decode(c.token_ids, skip_special_tokens=True),
                                  truncated=c.finish_reason == "length") for c in completions]
                           for problem, completions in zip(part, outputs)]
        tokens += part_tokens
        for verdicts in verdicts_of:
            correct.append(sum(v.correct for v in verdicts))
            reasons.update(v.reason for v in verdicts)
        if progress is not None:
            progress(len(correct))
    return EvalResult(
        problem_ids=tuple(p.id for p in problems),
        samples=tuple(samples for _ in problems),
        correct=tuple(correct),
        generated_tokens=tokens,
        reasons=tuple(reasons.most_common()),
    )


def episodes(generator: Generator, tokenizer: Any, task: EnvironmentTask, problems: Sequence[Problem],
             config: EvalConfig, seeds: Sequence[int], grader: Grader | None) -> tuple[list[list[Verdict]], int]:
    """`config.samples` episodes of each problem, turn by turn (the search's flat rollouts: one
    generator call a turn for every episode still going), each problem's from its own seed:
    the verdicts of each problem's episodes and the tokens the policy generated (the
    observations are prefilled, not counted)."""
    search = SearchConfig(max_depth=task.max_turns, temperature=config.temperature, top_p=config.top_p,
                          overlong_penalty=False)
    results = flat_rollouts(search_problems(tokenizer, task, problems, grader), generator, n=config.samples,
                            step=task.step, decode=decoder(tokenizer), config=search,
                            max_concurrent_problems=max(len(problems), 1), eos_token_ids=eos_ids(tokenizer), seeds=seeds)
    return [[t.verdict for t in r.trajectories] for r in results], sum(r.stats.generated_tokens for r in results)


def shard(problems: Sequence[Problem], rank: int, world_size: int) -> list[Problem]:
    """Every `world_size`-th problem from `rank`: disjoint shards that cover each problem once."""
    return list(problems[rank::world_size])


def merge_shards(problems: Sequence[Problem], parts: Sequence[EvalResult]) -> EvalResult:
    """Reassemble per-rank results in the original problem order."""
    by_id: dict[str, tuple[int, int]] = {}
    tokens = 0
    reasons: Counter[str] = Counter()
    for part in parts:
        tokens += part.generated_tokens
        reasons.update(dict(part.reasons))
        for pid, n, c in zip(part.problem_ids, part.samples, part.correct):
            if pid in by_id:
                raise ValueError(f"problem {pid!r} was evaluated on two ranks")
            by_id[pid] = (n, c)
    missing = [p.id for p in problems if p.id not in by_id]
    if missing:
        raise ValueError(f"{len(missing)} problems were not evaluated (first: {missing[0]!r})")
    return EvalResult(
        problem_ids=tuple(p.id for p in problems),
        samples=tuple(by_id[p.id][0] for p in problems),
        correct=tuple(by_id[p.id][1] for p in problems),
        generated_tokens=tokens,
        reasons=tuple(reasons.most_common()),
    )


def evaluate_sharded(
    generator: Generator,
    tokenizer: Any,
    task: Task,
    problems: Sequence[Problem],
    config: EvalConfig,
    *,
    progress: Callable[[int], None] | None = None,
    request_seed: Callable[[Problem], int] | None = None,
    grader: Grader | None = None,
) -> EvalResult:
    """`evaluate` over every rank: this rank counts `shard(problems, rank, world)`, and every
    rank returns the merged counts of all `problems` (tokens and reasons summed). Collective."""
    rank, size = world()
    part = evaluate(generator, tokenizer, task, shard(problems, rank, size), config, progress=progress,
                    request_seed=request_seed, grader=grader)
    return merge_shards(problems, all_gather(part))
