"""Replay buffer of cached correct solutions, which the mixed rollout uses (deepsearch.md §7).
Which problems are registered is the rule of flywheel.adaptive.replay_rule (`ReplayConfig`,
`qualifies`: the paper's post-round Pass1@K < delta, or the official code's search rate).

- A buffered problem gets a mixed rollout instead of a search: n = 8 direct samples, the first
  min(#cached, 8) replaced by cached correct responses (`flywheel.adaptive.mixed`).

Choices made here (the paper leaves them open):
- First found is kept: registering a problem already in the buffer does nothing; later
  solutions are not appended (the cache stays what first solved the problem).
- Within one registration, solutions with identical token ids count once, and the first
  `max_solutions_per_problem` (in the order given) are kept.
- The buffer follows the hard set: a problem that leaves the hard set (solved, Pass1@K >=
  delta) is no longer trained on, so `retain(hard_set.ids)` drops it. This matches the
  paper's Table 6, where cached + unsolved = |D_hard| every round. Being buffered does not
  by itself remove a problem from training: it keeps getting mixed rollouts while hard.
- Bounded size (`max_problems`): "oldest" evicts the problem registered earliest
  (registration order, not round) to make room; "refuse" registers nothing new while full.

The paper rule needs a rate measured after the search's round was trained on, so the buffer
can hold a search's correct responses as PENDING (`observe`) until `settle(rates)` hands in
the round's Pass1@K; under the code rule `observe` registers at once. Flow per round:
    buffer.observe(id, correct_trajectories, round=r, search_trajectories=K)   # each search
    hard = hard.refresh(rates); buffer.settle(rates); buffer.retain(hard.ids)  # round end
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flywheel.adaptive.state_checks import is_int, stored_config
from flywheel.adaptive.replay_rule import ReplayConfig, qualifies

log = logging.getLogger(__name__)

FORMAT = "flywheel.adaptive.replay/v1"


class Response(Protocol):
    """Anything with a response's token ids and text (a search `Trajectory`, a
    `CachedSolution`); `reward` and `loss_mask` attributes are copied when present."""

    @property
    def response_ids(self) -> Sequence[int]: ...

    @property
    def response_text(self) -> str: ...


@dataclass(frozen=True)
class CachedSolution:
    """One cached correct response of a buffered problem."""

    problem_id: str
    response_ids: tuple[int, ...]
    response_text: str
    round: int
    """The flywheel round whose search found it."""
    reward: float | None = None
    """Its outcome reward when it was found (None if not kept)."""
    loss_mask: tuple[bool, ...] = ()
    """Which of `response_ids` the policy wrote (an episode's observations are not trained on);
    empty: every one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "response_ids", tuple(self.response_ids))
        object.__setattr__(self, "loss_mask", tuple(self.loss_mask))
        if self.loss_mask and (len(self.loss_mask) != len(self.response_ids)
                               or not all(isinstance(m, bool) for m in self.loss_mask)):
            raise ValueError(f"problem {self.problem_id!r}: loss_mask must be one boolean per response token")
        if not isinstance(self.problem_id, str):
            raise ValueError(f"problem_id must be a string, got {self.problem_id!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.response_ids):
            raise ValueError(f"problem {self.problem_id!r}: response_ids must be integers")
        if not isinstance(self.response_text, str):
            raise ValueError(f"problem {self.problem_id!r}: response_text must be a string")
        if not is_int(self.round, 0):
            raise ValueError(f"problem {self.problem_id!r}: round must be an integer >= 0, got {self.round!r}")
        reward = self.reward
        finite = isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)
        if reward is not None and not finite:
            raise ValueError(f"problem {self.problem_id!r}: reward must be a finite number or None, got {reward!r}")

    @classmethod
    def of(cls, problem_id: str, response: Response, round: int) -> CachedSolution:
        """Cache a response-like record (e.g. a correct `Trajectory`) of `problem_id`."""
        reward = getattr(response, "reward", None)
        reward = None if reward is None else float(reward)
        return cls(problem_id, tuple(response.response_ids), response.response_text, round, reward,
                   tuple(getattr(response, "loss_mask", ())))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "response_ids": list(self.response_ids),
            "response_text": self.response_text,
            "round": self.round,
            "reward": self.reward,
        }
        if self.loss_mask:
            out["loss_mask"] = list(self.loss_mask)
        return out


class ReplayBuffer:
    """Cached correct solutions per problem, in registration order (see the module docstring
    for the rules and the choices).

    >>> buffer = ReplayBuffer(ReplayConfig(rule="code"))
    >>> buffer.observe("x", [CachedSolution("x", (5, 6), "5+6", 0)], round=0, search_trajectories=8)  # 1/8 <= 0.25
    True
    >>> buffer.observe("y", [CachedSolution("y", (7,), "7", 0)] * 3, round=0, search_trajectories=8)  # 3/8 > 0.25
    False
    >>> buffer.problem_ids, [s.response_text for s in buffer.solutions("x")]
    (('x',), ['5+6'])
    """

    def __init__(self, config: ReplayConfig = ReplayConfig()) -> None:
        self.config = config
        self._problems: dict[str, tuple[CachedSolution, ...]] = {}  # insertion order = registration order
        self._pending: dict[str, tuple[CachedSolution, ...]] = {}
        self.evicted = 0
        """Problems evicted to make room, over the run (for logs)."""

    # ------------------------------------------------------------------ queries
    def __contains__(self, problem_id: object) -> bool:
        return problem_id in self._problems

    def __len__(self) -> int:
        """Number of buffered problems."""
        return len(self._problems)

    def __iter__(self) -> Iterator[str]:
        """Buffered problem ids, earliest registered first."""
        return iter(tuple(self._problems))

    @property
    def problem_ids(self) -> tuple[str, ...]:
        return tuple(self._problems)

    @property
    def pending(self) -> tuple[str, ...]:
        """Problems held by `observe` under the paper rule, waiting for `settle`."""
        return tuple(self._pending)

    @property
    def num_solutions(self) -> int:
        return sum(len(s) for s in self._problems.values())

    def solutions(self, problem_id: str) -> tuple[CachedSolution, ...]:
        """The cached solutions of `problem_id`, in the order registered; () when not buffered."""
        return self._problems.get(problem_id, ())

    # ------------------------------------------------------------------ updates
    def register(
        self,
        problem_id: str,
        correct_responses: Sequence[Response],
        *,
        round: int,
        search_trajectories: int | None = None,
        post_rate: float | None = None,
    ) -> bool:
        """Apply the registration rule to one problem's search; True when it was added.

        `correct_responses`: every correct response of the search (its count is the rule's
        `correct`). `search_trajectories`: the search's trajectory count (code rule).
        `post_rate`: Pass1@K after the round's training (paper rule). A problem already
        buffered is left as it is (first found is kept). Responses are cached with `round`,
        except `CachedSolution`s of this problem, which keep their own.
        """
        if not self.config.enabled or problem_id in self._problems:
            return False
        if not qualifies(self.config, correct=len(correct_responses), trajectories=search_trajectories, post_rate=post_rate):
            return False
        cached = self._cap(problem_id, correct_responses, round)
        if self.config.max_problems is not None and len(self._problems) >= self.config.max_problems:
            if self.config.eviction == "refuse":
                return False
            oldest = next(iter(self._problems))
            del self._problems[oldest]
            self.evicted += 1
        self._problems[problem_id] = cached
        self._pending.pop(problem_id, None)
        return True

    def observe(
        self, problem_id: str, correct_responses: Sequence[Response], *, round: int, search_trajectories: int
    ) -> bool:
        """Report one finished search. code rule: `register` now. paper rule: hold the
        correct responses as pending until `settle` brings the post-round rate (a problem
        searched twice before settling keeps its earliest responses first, up to the cap).
        Returns True when the problem was registered now."""
        if not self.config.enabled or problem_id in self._problems:
            return False
        if self.config.rule == "code":
            return self.register(problem_id, correct_responses, round=round, search_trajectories=search_trajectories)
        if search_trajectories < 1 or len(correct_responses) > search_trajectories:
            raise ValueError(
                f"problem {problem_id!r}: {len(correct_responses)} correct responses of {search_trajectories} trajectories"
            )
        if correct_responses:
            held = self._pending.get(problem_id, ())
            self._pending[problem_id] = self._cap(problem_id, [*held, *correct_responses], round)
        return False

    def settle(self, rates: Mapping[str, float]) -> tuple[str, ...]:
        """Paper rule at a round's end: register each pending problem whose post-round Pass1@K
        in `rates` is < delta, then forget every pending problem (one without a rate is
        dropped: a candidate lives for one round). Returns the ids registered, in order."""
        pending, self._pending = self._pending, {}
        registered = []
        for problem_id, held in pending.items():
            rate = rates.get(problem_id)
            if rate is not None and self.register(problem_id, held, round=held[0].round, post_rate=rate):
                registered.append(problem_id)
        return tuple(registered)

    def remove(self, problem_id: str) -> bool:
        """Drop a problem (and any pending responses of it); True when it was buffered."""
        self._pending.pop(problem_id, None)
        return self._problems.pop(problem_id, None) is not None

    def retain(self, problem_ids: Iterable[str]) -> tuple[str, ...]:
        """Keep only the buffered (and pending) problems in `problem_ids` (the hard set);
        returns the buffered ids removed, in registration order."""
        keep = set(problem_ids)
        self._pending = {pid: held for pid, held in self._pending.items() if pid in keep}
        removed = tuple(pid for pid in self._problems if pid not in keep)
        for pid in removed:
            del self._problems[pid]
        return removed

    def _cap(self, problem_id: str, responses: Sequence[Response], round: int) -> tuple[CachedSolution, ...]:
        """Distinct (by token ids) responses in the order given, at most the cap."""
        out: dict[tuple[int, ...], CachedSolution] = {}
        for response in responses:
            if len(out) >= self.config.max_solutions_per_problem:
                break
            if not (isinstance(response, CachedSolution) and response.problem_id == problem_id):
                response = CachedSolution.of(problem_id, response, round)
            out.setdefault(response.response_ids, response)
        return tuple(out.values())

    # ------------------------------------------------------------------ checkpoint
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (format "flywheel.adaptive.replay/v1"), for the checkpoint and for
        `flywheel.io.atomic_write_json` in the run directory."""
        return {
            "format": FORMAT,
            "config": self.config.to_dict(),
            "evicted": self.evicted,
            "problems": [_entry(pid, sols) for pid, sols in self._problems.items()],
            "pending": [_entry(pid, sols) for pid, sols in self._pending.items()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], config: ReplayConfig | None = None) -> ReplayBuffer:
        """Rebuild from `to_dict`. `config` (the resumed run's flags) wins over the stored one;
        when its bounds are tighter than the stored buffer, the buffer is trimmed by the same
        rules (solutions past the cap dropped; problems evicted oldest first, or newest first
        under "refuse") with a warning."""
        if not isinstance(data, Mapping):
            raise ValueError(f"replay buffer state must be a dict, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ValueError(f"replay buffer state has format {data.get('format')!r}, expected {FORMAT!r}")
        for key in ("problems", "pending"):
            if not isinstance(data.get(key), list):
                raise ValueError(f"replay buffer state: {key!r} must be a list, got {type(data.get(key)).__name__}")
        evicted = data.get("evicted", 0)
        if not is_int(evicted, 0):
            raise ValueError(f"replay buffer state: 'evicted' must be an integer >= 0, got {evicted!r}")
        if config is None:
            config = stored_config(data, ReplayConfig, "replay buffer state")
        buffer = cls(config)
        buffer.evicted = evicted
        problems = _entries(data["problems"], "problems")
        pending = _entries(data["pending"], "pending")
        cap, trimmed = config.max_solutions_per_problem, 0
        for pid, sols in problems:
            trimmed += max(len(sols) - cap, 0)
            buffer._problems[pid] = sols[:cap]
        for pid, sols in pending:
            buffer._pending[pid] = sols[:cap]
        if config.max_problems is not None and len(buffer._problems) > config.max_problems:
            excess = len(buffer._problems) - config.max_problems
            ids = list(buffer._problems)
            for pid in ids[:excess] if config.eviction == "oldest" else ids[-excess:]:
                del buffer._problems[pid]
            buffer.evicted += excess
            log.warning(
                "replay buffer: %d problems stored, --data.replay.max_problems=%d: dropped %d",
                len(ids), config.max_problems, excess,
            )
        if trimmed:
            log.warning("replay buffer: dropped %d solutions past --data.replay.max_solutions_per_problem=%d", trimmed, cap)
        return buffer


def _entry(problem_id: str, solutions: Sequence[CachedSolution]) -> dict[str, Any]:
    return {"problem_id": problem_id, "solutions": [s.to_dict() for s in solutions]}


def _entries(items: list[Any], key: str) -> list[tuple[str, tuple[CachedSolution, ...]]]:
    """Parse and check a list of {"problem_id", "solutions"}; errors name the entry and problem."""
    out: dict[str, tuple[CachedSolution, ...]] = {}
    for i, item in enumerate(items):
        where = f"replay buffer state: {key}[{i}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where} must be a dict with 'problem_id' and 'solutions', got {type(item).__name__}")
        pid = item.get("problem_id")
        if not isinstance(pid, str):
            raise ValueError(f"{where}: 'problem_id' must be a string, got {pid!r}")
        where = f"{where} (problem {pid!r})"
        if pid in out:
            raise ValueError(f"{where}: problem listed twice")
        sols = item.get("solutions")
        if not isinstance(sols, list) or not sols:
            raise ValueError(f"{where}: 'solutions' must be a non-empty list")
        parsed = []
        for j, sol in enumerate(sols):
            if not isinstance(sol, Mapping):
                raise ValueError(f"{where}: solutions[{j}] must be a dict, got {type(sol).__name__}")
            ids = sol.get("response_ids")
            if not isinstance(ids, list):
                raise ValueError(
                    f"{where}: solutions[{j}].response_ids must be a list of integers, got {type(ids).__name__}"
                )
            missing = [k for k in ("response_text", "round") if k not in sol]
            if missing:
                raise ValueError(f"{where}: solutions[{j}] is missing {missing}")
            mask = sol.get("loss_mask", [])
            if not isinstance(mask, list):
                raise ValueError(f"{where}: solutions[{j}].loss_mask must be a list of booleans, got {type(mask).__name__}")
            try:
                parsed.append(CachedSolution(pid, tuple(ids), sol["response_text"], sol["round"], sol.get("reward"),
                                             tuple(mask)))
            except ValueError as err:
                raise ValueError(f"{where}: solutions[{j}]: {err}") from None
        out[pid] = tuple(parsed)
    return list(out.items())
