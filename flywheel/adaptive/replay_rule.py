"""The replay buffer's registration rule: which solved-but-still-hard problems keep their
correct solutions (deepsearch.md §7, paper Eq. 10-12 and the official code).

- Paper rule (default): add (x, its correct trajectories) when the search found a correct
  answer for x but Pass1@K(x) after the round's training is still < delta.
- Code rule: register x when 0 < correct / trajectories of its search <= delta (0.25),
  storing all its correct responses; the first registration is kept.

The buffer that applies it, and what it keeps, is flywheel.adaptive.replay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from flywheel.adaptive.state_checks import is_int, is_rate
from flywheel.finite import check_finite_fields

Rule = Literal["paper", "code"]
Eviction = Literal["oldest", "refuse"]


@dataclass(frozen=True)
class ReplayConfig:
    """Which solved-but-still-hard problems keep their correct solutions for replay.

    Args:
        enabled: keep a replay buffer; off = every problem gets a full search.
        rule: "paper" = register x when its search found a correct answer but Pass1@K(x)
            after the round's training is still < delta; "code" (official code) = register
            x when 0 < correct / trajectories of its search <= delta.
        max_problems: most problems held; None = unbounded (the paper's buffer reached 2,894
            problems by round 4).
        max_solutions_per_problem: most cached solutions per problem (the mixed rollout
            uses at most n = 8).
        eviction: when full, "oldest" = the problem registered earliest leaves to make
            room; "refuse" = nothing new is registered until space frees up.
        delta: threshold of both rules (paper: strict `<` on the post-round rate; code:
            `<=` on the search's correct fraction).
    """

    enabled: bool = True
    rule: Rule = "paper"
    max_problems: int | None = None
    max_solutions_per_problem: int = 8
    eviction: Eviction = "oldest"
    delta: float = 0.25

    def __post_init__(self) -> None:
        check_finite_fields(self, "data.replay")
        if self.rule not in ("paper", "code"):
            raise ValueError(
                f"--data.replay.rule={self.rule!r}: choose 'paper' (post-round Pass1@K < delta) "
                "or 'code' (search correct fraction <= delta)"
            )
        if self.max_problems is not None and not is_int(self.max_problems, 1):
            raise ValueError(
                f"--data.replay.max_problems must be an integer >= 1, or null for no bound; got {self.max_problems!r}"
            )
        if not is_int(self.max_solutions_per_problem, 1):
            raise ValueError(
                f"--data.replay.max_solutions_per_problem must be an integer >= 1, got {self.max_solutions_per_problem!r}"
            )
        if self.eviction not in ("oldest", "refuse"):
            raise ValueError(f"--data.replay.eviction={self.eviction!r}: choose 'oldest' or 'refuse'")
        if not 0.0 < self.delta <= 1.0:
            raise ValueError(f"--data.replay.delta must be in (0, 1] (a success rate), got {self.delta}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def qualifies(
    config: ReplayConfig, *, correct: int, trajectories: int | None = None, post_rate: float | None = None
) -> bool:
    """Whether a problem whose search found `correct` correct of `trajectories` trajectories
    is registered (deepsearch.md §7).

    paper: correct > 0 and post_rate < delta (post_rate = Pass1@K after the round's training).
    code: 0 < correct / trajectories <= delta.

    >>> code = ReplayConfig(rule="code")
    >>> qualifies(code, correct=1, trajectories=8), qualifies(code, correct=3, trajectories=8)
    (True, False)
    >>> paper = ReplayConfig()
    >>> qualifies(paper, correct=1, post_rate=0.25), qualifies(paper, correct=1, post_rate=0.0)
    (False, True)
    """
    if correct < 0:
        raise ValueError(f"correct must be >= 0, got {correct}")
    if config.rule == "code":
        if trajectories is None:
            raise ValueError("--data.replay.rule=code needs the search's trajectory count (trajectories=)")
        if trajectories < 1 or correct > trajectories:
            raise ValueError(
                f"need 0 <= correct <= trajectories and trajectories >= 1, got correct={correct}, trajectories={trajectories}"
            )
        return 0 < correct / trajectories <= config.delta
    if post_rate is None:
        raise ValueError(
            "--data.replay.rule=paper needs the Pass1@K measured after the round (post_rate=); or set --data.replay.rule=code"
        )
    if not is_rate(post_rate):
        raise ValueError(f"post_rate must be a Pass1@K rate in [0, 1], got {post_rate!r}")
    return correct > 0 and post_rate < config.delta
