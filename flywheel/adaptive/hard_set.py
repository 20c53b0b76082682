"""The hard set: the problems the policy still fails, re-measured every flywheel round.

deepsearch.md §7 (paper Eq. 8-9):
    D_hard(0)   = {x : Pass1@K(x, pi_0) < delta}
    D_hard(i+1) = {x in D_hard(i) : Pass1@K(x, pi_i) < delta}
with K = 4, delta = 25%, screening samples at temperature 0.6, top_p 0.95. Pass1@K is the
success RATE over K samples, not "any of K". The released data keeps 0% and 25%, i.e.
`<=` delta: `comparison="le"` reproduces it, `"lt"` (the paper) is the default.

Eq. 9 only ever shrinks the set. `rescreen="all"` (conf/deepsearch_plateau.yaml) instead
re-measures the training pool every round (flywheel.adaptive.rescreen picks which problems):
    D_hard(i+1) = {x in S_i : Pass1@K(x, pi_i) < delta}
with S_i the round's screened problems, so a problem the policy forgot comes back.

Pure data: the caller measures the rates (e.g. `flywheel.reporting.evaluation.evaluate` with
`EvalConfig(samples=k, temperature=..., top_p=...)`, then `pass1_rates`) and hands them in.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

from flywheel.adaptive.state_checks import is_int, is_rate, stored_config
from flywheel.finite import check_finite_fields

Comparison = Literal["lt", "le"]
Rescreen = Literal["hard", "all"]

FORMAT = "flywheel.adaptive.hard_set/v1"


def pass1_at_k(correct: int, samples: int) -> float:
    """Pass1@K of one problem (Eq. 8): the success rate correct / samples over K samples.

    >>> pass1_at_k(1, 4)
    0.25
    >>> pass1_at_k(0, 4), pass1_at_k(4, 4)
    (0.0, 1.0)
    """
    if samples < 1:
        raise ValueError(f"Pass1@K needs at least one sample, got samples={samples}")
    if not 0 <= correct <= samples:
        raise ValueError(f"need 0 <= correct <= samples, got correct={correct}, samples={samples}")
    return correct / samples


def is_hard(rate: float, delta: float = 0.25, comparison: Comparison = "lt") -> bool:
    """True when a problem with success rate `rate` belongs to the hard set (Eq. 8-9).

    "lt": rate < delta (paper); "le": rate <= delta (the released data keeps 0% and 25%).

    >>> is_hard(0.25), is_hard(0.25, comparison="le"), is_hard(0.0)
    (False, True, True)
    """
    if comparison == "lt":
        return rate < delta
    if comparison == "le":
        return rate <= delta
    raise ValueError(f"comparison={comparison!r}: choose 'lt' (paper) or 'le' (released data)")


def pass1_rates(problem_ids: Sequence[str], samples: Sequence[int], correct: Sequence[int]) -> dict[str, float]:
    """Per-problem Pass1@K from per-problem counts (e.g. an `EvalResult`'s fields).

    An id listed several times (shards gathered from several ranks) has its counts summed
    before dividing, so the rate is over all its samples.

    >>> pass1_rates(["a", "b", "a"], [4, 4, 4], [1, 0, 2])
    {'a': 0.375, 'b': 0.0}
    """
    if not len(problem_ids) == len(samples) == len(correct):
        raise ValueError(
            f"problem_ids, samples and correct must have one entry per problem, got lengths "
            f"{len(problem_ids)}, {len(samples)}, {len(correct)}"
        )
    totals: dict[str, list[int]] = {}
    for pid, n, c in zip(problem_ids, samples, correct):
        if not 0 <= c <= n:
            raise ValueError(f"problem {pid!r}: need 0 <= correct <= samples, got correct={c}, samples={n}")
        total = totals.setdefault(pid, [0, 0])
        total[0] += c
        total[1] += n
    return {pid: pass1_at_k(c, n) for pid, (c, n) in totals.items()}


@dataclass(frozen=True)
class HardSetConfig:
    """Which problems are trained on: those the policy solves in fewer than delta of K tries.

    Args:
        k: K, screening samples per problem for Pass1@K (paper: 4).
        delta: a problem is hard while its Pass1@K is below delta (paper: 0.25).
        comparison: "lt" = rate < delta (paper); "le" = rate <= delta (the released data
            keeps 0% and 25% with K = 4).
        temperature: sampling temperature of the screening samples (paper: 0.6).
        top_p: nucleus sampling of the screening samples (paper: 0.95).
        enabled: keep a hard set; off = every problem stays in training every round (and
            nothing is screened: `rescreen` and `screen_problems` are then unused).
        rescreen: what a round's end re-measures. "hard" (paper Eq. 9): the hard set only, so
            it only shrinks. "all": the training pool (or a sample of `screen_problems` of it),
            and the next hard set is every screened problem below delta, so a problem the
            policy forgot comes back (conf/deepsearch_plateau.yaml). Each screened problem
            costs K samples.
        screen_problems: with rescreen="all", how many training problems each screening
            (D_hard(0) and every round's end) measures: a seeded random sample, new every round,
            plus the replay buffer's pending candidates (the paper rule needs their post-round
            rate). None = the whole pool (4,000 4-number Countdown problems: 16,000 samples a
            round at K = 4).
    """

    k: int = 4
    delta: float = 0.25
    comparison: Comparison = "lt"
    temperature: float = 0.6
    top_p: float = 0.95
    enabled: bool = True
    rescreen: Rescreen = "hard"
    screen_problems: int | None = None

    def __post_init__(self) -> None:
        check_finite_fields(self, "data.hard_set")
        if not is_int(self.k, 1):
            raise ValueError(f"--data.hard_set.k must be an integer >= 1 (screening samples per problem), got {self.k!r}")
        if not 0.0 < self.delta <= 1.0:
            raise ValueError(f"--data.hard_set.delta must be in (0, 1] (a success rate), got {self.delta}")
        if self.comparison not in ("lt", "le"):
            raise ValueError(
                f"--data.hard_set.comparison={self.comparison!r}: choose 'lt' (paper) or 'le' (released data)"
            )
        if not self.temperature >= 0.0:
            raise ValueError(f"--data.hard_set.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--data.hard_set.top_p must be in (0, 1], got {self.top_p}")
        if self.rescreen not in ("hard", "all"):
            raise ValueError(
                f"--data.hard_set.rescreen={self.rescreen!r}: choose 'hard' (re-measure the hard set only, "
                "paper Eq. 9) or 'all' (re-measure the training pool every round)"
            )
        if self.screen_problems is not None:
            if not is_int(self.screen_problems, 1):
                raise ValueError(
                    f"--data.hard_set.screen_problems must be an integer >= 1, or null to screen the whole pool; "
                    f"got {self.screen_problems!r}"
                )
            if self.rescreen != "all":
                raise ValueError(
                    f"--data.hard_set.screen_problems={self.screen_problems} samples the pool that "
                    "--data.hard_set.rescreen=all re-measures; with rescreen='hard' a round re-measures the hard "
                    "set itself: set --data.hard_set.rescreen=all, or leave screen_problems out (null)"
                )

    def is_hard(self, rate: float) -> bool:
        return is_hard(rate, self.delta, self.comparison)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HardSet:
    """The current hard set D_hard(round) and the size of every earlier one.

    Immutable: `refresh` returns the next round's set. `ids` keep the order in which the
    problems were first given, so sharding and sampling from it are reproducible.
    """

    ids: tuple[str, ...]
    round: int
    """0 after `initial`, +1 per `refresh`."""
    history: tuple[int, ...]
    """Sizes |D_hard(0)|, ..., |D_hard(round)|, last = len(ids); non-increasing under
    rescreen="hard" (Eq. 9)."""
    config: HardSetConfig = field(default_factory=HardSetConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", tuple(self.ids))
        object.__setattr__(self, "history", tuple(self.history))
        if not is_int(self.round, 0):
            raise ValueError(f"hard set 'round' must be an integer >= 0, got {self.round!r}")
        if len(set(self.ids)) != len(self.ids):
            raise ValueError(f"hard set ids must be distinct; repeated: {_repeated(self.ids)}")
        if len(self.history) != self.round + 1:
            raise ValueError(f"hard set history must hold round + 1 = {self.round + 1} sizes, got {len(self.history)}")
        if self.history[-1] != len(self.ids):
            raise ValueError(f"hard set history ends with {self.history[-1]} but the set holds {len(self.ids)} ids")
        if self.config.rescreen == "hard" and any(b > a for a, b in zip(self.history, self.history[1:])):
            raise ValueError(
                f"hard set history must be non-increasing under --data.hard_set.rescreen=hard (a refresh never adds "
                f"problems), got {list(self.history)}; a run that re-screened the pool resumes with "
                "--data.hard_set.rescreen=all"
            )

    @classmethod
    def initial(
        cls, problem_ids: Iterable[str], rates: Mapping[str, float], config: HardSetConfig = HardSetConfig()
    ) -> HardSet:
        """D_hard(0): the problems of `problem_ids` whose rate under pi_0 is hard (Eq. 8).

        A problem without a rate in `rates` stays (it is dropped only on evidence that it is
        easy); rates of ids not in `problem_ids` are ignored; repeated ids count once. With
        `config.enabled` False every problem stays.
        """
        ids = tuple(dict.fromkeys(problem_ids))
        kept = _keep(ids, rates, config)
        return cls(ids=kept, round=0, history=(len(kept),), config=config)

    def refresh(self, rates: Mapping[str, float]) -> HardSet:
        """D_hard(round + 1) = {x in D_hard(round) : rate(x) hard} (Eq. 9).

        Only ids already in the set can stay: a rate for an id outside it is ignored. An id
        without a rate stays. With `config.enabled` False the set is unchanged (round + 1).
        """
        kept = _keep(self.ids, rates, self.config)
        return HardSet(ids=kept, round=self.round + 1, history=self.history + (len(kept),), config=self.config)

    def rescreen(self, screened: Iterable[str], rates: Mapping[str, float]) -> HardSet:
        """D_hard(round + 1) = {x in screened : rate(x) hard} (`rescreen="all"`), in the order
        of `screened` (the pool's): the set can grow again. A screened id without a rate stays
        only if it is in the set now (dropped or added only on evidence); ids not screened
        leave. With `config.enabled` False the set is unchanged (round + 1).

        >>> hard = HardSet.initial(["a", "b"], {"a": 0.0, "b": 0.0})
        >>> hard.rescreen(["a", "b", "c", "d"], {"a": 0.5, "c": 0.0, "d": 0.25}).ids  # b: no rate, stays
        ('b', 'c')
        """
        if not self.config.enabled:
            return self.refresh({})
        kept = [pid for pid in _keep(tuple(dict.fromkeys(screened)), rates, self.config)
                if pid in rates or pid in self]
        return HardSet(ids=tuple(kept), round=self.round + 1, history=self.history + (len(kept),), config=self.config)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, problem_id: object) -> bool:
        return problem_id in self._members

    @functools.cached_property
    def _members(self) -> frozenset[str]:
        return frozenset(self.ids)

    # ------------------------------------------------------------------ checkpoint
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (format "flywheel.adaptive.hard_set/v1") for the checkpoint."""
        return {
            "format": FORMAT,
            "round": self.round,
            "history": list(self.history),
            "ids": list(self.ids),
            "config": self.config.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], config: HardSetConfig | None = None) -> HardSet:
        """Rebuild from `to_dict`. `config` (the resumed run's flags) wins over the stored one,
        so a changed `--data.hard_set.delta` applies from the next refresh on."""
        if not isinstance(data, Mapping):
            raise ValueError(f"hard set state must be a dict, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ValueError(f"hard set state has format {data.get('format')!r}, expected {FORMAT!r}")
        for key in ("round", "history", "ids"):
            if key not in data:
                raise ValueError(f"hard set state is missing {key!r}")
        history = data["history"]
        if not isinstance(history, list) or not all(is_int(n, 0) for n in history):
            raise ValueError(f"hard set state: 'history' must be a list of integers >= 0, got {history!r}")
        ids = data["ids"]
        if not isinstance(ids, list):
            raise ValueError(f"hard set state: 'ids' must be a list of problem ids, got {type(ids).__name__}")
        for i, pid in enumerate(ids):
            if not isinstance(pid, str):
                raise ValueError(f"hard set state: ids[{i}] must be a string problem id, got {pid!r}")
        if config is None:
            config = stored_config(data, HardSetConfig, "hard set state")
        try:
            return cls(ids=tuple(ids), round=data["round"], history=tuple(history), config=config)
        except ValueError as err:
            raise ValueError(f"hard set state is inconsistent: {err}") from None


def _keep(ids: Sequence[str], rates: Mapping[str, float], config: HardSetConfig) -> tuple[str, ...]:
    if not config.enabled:
        return tuple(ids)
    kept = []
    for pid in ids:
        rate = rates.get(pid)
        if rate is None:
            kept.append(pid)
            continue
        if not is_rate(rate):
            raise ValueError(f"problem {pid!r}: Pass1@K rate must be a number in [0, 1], got {rate!r}")
        if config.is_hard(rate):
            kept.append(pid)
    return tuple(kept)


def _repeated(ids: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    return sorted({pid for pid in ids if pid in seen or seen.add(pid)})
