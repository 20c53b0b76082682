"""Countdown problems: a seeded generator, an exhaustive solver, and the trace format.

Generation and the solver work with POSITIVE INTEGER intermediates only: a - b only when
a > b, a / b only when b divides a. That keeps every trace line short and clean
("9*8=72") and matches the tiny-policy recipe (shared/notes/tiny-countdown-rl.md). The
verifier is more permissive (any rational route counts), so a generated problem is always
solvable and the solver may only miss routes through fractions, zero or negatives.

A random full reduction follows the Countdown reference generator (at2005/llm-mcts,
rest-mcts-and-countdown.md §B): pick two of the remaining numbers in random order and a
random operator, retry when the move is illegal (a - b with a <= b, a * b or a / b with a
factor 1, inexact division), until one number is left. Its exact outcome distribution is
computed by dynamic programming (`reduction_distribution`), so "10,000 random reductions"
is a multinomial draw from it: the same law as simulating them, at a fraction of the cost.

Targets:
- "random": the value of one random full reduction, kept if it lies in the target range.
- "hard": the least frequent value (in the target range) of `reductions` random full
  reductions, ties broken at random: the hardest reachable target (§B).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Mapping, Sequence

__all__ = [
    "GenerationConfig",
    "Step",
    "apply_step",
    "format_completion",
    "format_step",
    "generate_problems",
    "iter_solutions",
    "least_frequent",
    "reduction_distribution",
    "sample_reductions",
    "solution_expression",
    "solve",
]

Step = tuple[int, str, int, int]
"""(a, op, b, result): one trace line "a op b = result", e.g. (9, "*", 8, 72) -> "9*8=72"."""

Multiset = tuple[int, ...]
"""Numbers sorted ascending: what held-out splits are disjoint by."""


@dataclass(frozen=True)
class GenerationConfig:
    """How to draw problems. Numbers are uniform in [low, high], drawn with replacement.

    Attributes:
        count: how many numbers a problem has (>= 2).
        low: smallest number (>= 1; intermediates stay positive integers).
        high: largest number.
        mode: "random" (one random reduction) or "hard" (least frequent of `reductions`).
        target_min: smallest target kept.
        target_max: largest target kept; None for no upper bound.
        reductions: random full reductions per problem in "hard" mode (§B: 10,000).
    """

    count: int = 3
    low: int = 1
    high: int = 13
    mode: Literal["random", "hard"] = "random"
    target_min: int = 1
    target_max: int | None = 99
    reductions: int = 10_000

    def __post_init__(self) -> None:
        if self.count < 2:
            raise ValueError(f"count must be >= 2 numbers, got {self.count}")
        if not 1 <= self.low <= self.high:
            raise ValueError(f"need 1 <= low <= high, got low={self.low}, high={self.high}")
        if self.mode not in ("random", "hard"):
            raise ValueError(f"mode must be 'random' or 'hard', got {self.mode!r}")
        if self.target_max is not None and self.target_max < self.target_min:
            raise ValueError(f"empty target range [{self.target_min}, {self.target_max}]")
        if self.reductions < 1:
            raise ValueError(f"reductions must be >= 1, got {self.reductions}")

    def in_range(self, value: int) -> bool:
        return value >= self.target_min and (self.target_max is None or value <= self.target_max)


def _generator_results(a: int, b: int) -> list[int]:
    """Values of the legal reference moves on the ordered pair (a, b)."""
    results = [a + b]
    if a > b:
        results.append(a - b)
    if a > 1 and b > 1:
        results.append(a * b)
    if b > 1 and a % b == 0:
        results.append(a // b)
    return results


def reduction_distribution(numbers: Sequence[int]) -> dict[int, float]:
    """Exact probability of each final value of one random full reduction of `numbers`.

    Each step is uniform over the legal (ordered pair, operator) moves, which is what
    retrying illegal uniform draws amounts to. Keys come out sorted, so sampling from the
    result is deterministic for a seeded rng.

    >>> reduction_distribution([2, 3])  # 2+3, 3+2, 3-2, 2*3, 3*2: five legal moves
    {1: 0.2, 5: 0.4, 6: 0.4}
    """
    memo: dict[Multiset, dict[int, float]] = {}

    def outcomes(values: Multiset) -> dict[int, float]:
        if len(values) == 1:
            return {values[0]: 1.0}
        if values in memo:
            return memo[values]
        children: list[Multiset] = []
        for i, a in enumerate(values):
            for j, b in enumerate(values):
                if i != j:
                    rest = tuple(v for k, v in enumerate(values) if k not in (i, j))
                    children += [tuple(sorted(rest + (r,))) for r in _generator_results(a, b)]
        total: dict[int, float] = {}
        for child in children:
            for value, p in outcomes(child).items():
                total[value] = total.get(value, 0.0) + p / len(children)
        memo[values] = total
        return total

    return dict(sorted(outcomes(tuple(sorted(numbers))).items()))


def sample_reductions(distribution: Mapping[int, float], k: int, rng: random.Random) -> Counter[int]:
    """How often each value comes out of `k` random full reductions (a multinomial draw)."""
    return Counter(rng.choices(list(distribution), weights=list(distribution.values()), k=k))


def least_frequent(counts: Mapping[int, int], rng: random.Random) -> int:
    """A value seen the fewest times in `counts` (ties broken by `rng`): the §B hard target.

    >>> least_frequent({24: 40, 7: 1, 30: 2}, random.Random(0))
    7
    """
    if not counts:
        raise ValueError("no values to choose from")
    fewest = min(counts.values())
    return rng.choice(sorted(value for value, n in counts.items() if n == fewest))


def _draw_target(
    distribution: Mapping[int, float], config: GenerationConfig, rng: random.Random
) -> int | None:
    """The target for a problem whose reductions follow `distribution`; None to redraw."""
    if config.mode == "random":
        value = rng.choices(list(distribution), weights=list(distribution.values()))[0]
        return value if config.in_range(value) else None
    counts = sample_reductions(distribution, config.reductions, rng)
    counts = Counter({value: n for value, n in counts.items() if config.in_range(value)})
    return least_frequent(counts, rng) if counts else None


def generate_problems(
    n: int,
    *,
    seed: int,
    config: GenerationConfig = GenerationConfig(),
    keep: Callable[[Multiset], bool] | None = None,
    max_attempts: int | None = None,
) -> list[tuple[tuple[int, ...], int]]:
    """`n` distinct (numbers, target) problems; the same seed and config give the same list.

    Numbers keep their drawn order (the policy sees varied orders). Problems are distinct
    by (multiset, target). `keep(multiset)` restricts the number multisets, which is how
    held-out splits stay disjoint. Raises RuntimeError when `max_attempts` draws (default
    200 * n) do not yield `n` distinct problems: the config or `keep` is too narrow.
    """
    rng = random.Random(seed)
    attempts = max_attempts if max_attempts is not None else 200 * n
    problems: list[tuple[tuple[int, ...], int]] = []
    seen: set[tuple[Multiset, int]] = set()
    distributions: dict[Multiset, dict[int, float]] = {}  # a multiset recurs many times
    for _ in range(attempts):
        if len(problems) == n:
            break
        numbers = tuple(rng.randint(config.low, config.high) for _ in range(config.count))
        multiset = tuple(sorted(numbers))
        if keep is not None and not keep(multiset):
            continue
        if multiset not in distributions:
            distributions[multiset] = reduction_distribution(multiset)
        target = _draw_target(distributions[multiset], config, rng)
        if target is None or (multiset, target) in seen:
            continue
        seen.add((multiset, target))
        problems.append((numbers, target))
    if len(problems) < n:
        raise RuntimeError(
            f"only {len(problems)} of {n} distinct problems after {attempts} draws; "
            "widen the number or target range, or ask for fewer problems"
        )
    return problems


def apply_step(a: int, op: str, b: int) -> int | None:
    """a op b under the positive-integer rule (a - b needs a > b, a / b exact), else None."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a > b else None
    if op == "/":
        return a // b if b > 0 and a % b == 0 else None
    raise ValueError(f"op must be one of + - * /, got {op!r}")


def iter_solutions(numbers: Sequence[int], target: int) -> Iterator[list[Step]]:
    """Every positive-integer solution using each number exactly once, in a fixed order.

    Exhaustive depth-first search over unordered pairs (larger operand first); multisets
    already shown to be dead ends are remembered for the rest of the search.
    """
    dead: set[Multiset] = set()

    def search(values: Multiset) -> Iterator[list[Step]]:
        if len(values) == 1:
            if values[0] == target:
                yield []
            return
        if values in dead:
            return
        found = False
        tried: set[tuple[int, int]] = set()
        for i in range(len(values)):
            for j in range(i + 1, len(values)):
                b, a = values[i], values[j]  # sorted ascending, so a >= b
                if (a, b) in tried:
                    continue
                tried.add((a, b))
                rest = values[:i] + values[i + 1 : j] + values[j + 1 :]
                for op in "+-*/":
                    result = apply_step(a, op, b)
                    if result is None:
                        continue
                    for tail in search(tuple(sorted(rest + (result,)))):
                        found = True
                        yield [(a, op, b, result), *tail]
        if not found:
            dead.add(values)

    yield from search(tuple(sorted(numbers)))


def solve(numbers: Sequence[int], target: int) -> list[Step] | None:
    """One solution as steps (a, op, b, result), or None if no positive-integer route exists.

    >>> solve([5, 9, 8], 67)
    [(9, '*', 8, 72), (72, '-', 5, 67)]
    >>> solve([1, 1, 1], 50) is None
    True
    """
    return next(iter_solutions(numbers, target), None)


def format_step(step: Step) -> str:
    """One trace line without its newline: (9, "*", 8, 72) -> "9*8=72"."""
    a, op, b, result = step
    return f"{a}{op}{b}={result}"


def solution_expression(numbers: Sequence[int], steps: Sequence[Step]) -> str:
    """The answer expression the steps build, each compound operand in parentheses.

    Operands are taken from the pool of unused values, the most recent first; equal values
    are interchangeable, so any choice gives the same value and the same literals.
    Raises ValueError if a step is wrong, uses a value that is not available, or numbers
    are left over.

    >>> solution_expression([5, 9, 8], [(9, "*", 8, 72), (72, "-", 5, 67)])
    '(9*8)-5'
    """
    pool: list[tuple[int, str]] = [(n, str(n)) for n in numbers]

    def take(value: int) -> str:
        for k in range(len(pool) - 1, -1, -1):
            if pool[k][0] == value:
                text = pool.pop(k)[1]
                return text if text.isdigit() else f"({text})"
        raise ValueError(f"step uses {value}, which is not available")

    for a, op, b, result in steps:
        if apply_step(a, op, b) != result:
            raise ValueError(f"step {format_step((a, op, b, result))} is not valid arithmetic here")
        left, right = take(a), take(b)
        pool.append((result, f"{left}{op}{right}"))
    if len(pool) != 1:
        raise ValueError(f"steps leave {len(pool)} values, expected 1: {[v for v, _ in pool]}")
    return pool[0][1]


def format_completion(numbers: Sequence[int], steps: Sequence[Step]) -> str:
    """The completion the policy is trained to write: one step per line, then the answer.

    EOS follows in token space, not in the text.

    >>> format_completion([5, 9, 8], [(9, "*", 8, 72), (72, "-", 5, 67)])
    '9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>'
    """
    lines = [format_step(step) for step in steps]
    lines.append(f"<answer>{solution_expression(numbers, steps)}</answer>")
    return "\n".join(lines)
