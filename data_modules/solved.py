"""Which training problems the run's own rollouts solved, and when: newly solved problems per
token, for comparing runs.

A problem is solved in an epoch when a response generated for it that epoch is correct: any
correct terminal of its tree (backed up or not, trained or not), of its flat group or
`flat_first` samples, or of the direct samples of its mixed rollout. The cached solutions a
mixed rollout replays were generated in an earlier epoch and do not count (they are not in
the epoch's results: data_modules.rollout), nor do Pass1@K screening samples (not training
rollouts). The `SolvedLedger` keeps each problem's first solve (the curriculum's round then,
0-based, in the file the summary row's 1-based round, and the run's training tokens at the end of that epoch, summary.json's
`generated_tokens`) and the problems solved in the current round, for the round's summary row
(`solved_problems`, `first_solved`) and `<log_dir>/solved_problems.json`. Plain data, no
Lightning; the ids handed in are already merged over the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from flywheel.search.outputs import TreeResult

FORMAT = "flywheel.solved/v1"


def solved_ids(results: Iterable[TreeResult]) -> frozenset[str]:
    """The problems among `results` (an epoch's trees and flat groups) with a correct graded
    terminal. The tree's verdicts, not the trajectories: a correct terminal that was not backed
    up is not among them."""
    return frozenset(r.problem_id for r in results if any(v.correct for v in r.tree.verdicts.values()))


@dataclass(frozen=True)
class FirstSolve:
    """When the run first solved a problem."""

    round: int
    """The curriculum's round (rounds completed before it; summary.json's row `round + 1`)."""
    tokens: int
    """The run's training tokens at the end of that epoch (summary.json's `generated_tokens`)."""

    def __post_init__(self) -> None:
        for name, value in (("round", self.round), ("tokens", self.tokens)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise ValueError(f"solved problems: {name!r} must be an integer >= 0, got {value!r}")


class SolvedLedger:
    """The run's solved training problems: each one's first solve, and this round's set.

    `add(ids, round, tokens)` counts an epoch of round `round`; the first count of a new round
    starts its set empty, so until then `this_round` is the round that just ended (what its
    summary row reports), as in data_modules.token_split's `TokenLedger`.
    """

    def __init__(self) -> None:
        self.first: dict[str, FirstSolve] = {}
        """Problem id -> its first solve, in the order they were first solved."""
        self.this_round: set[str] = set()
        self.round = 0
        """The round `this_round` counts."""

    def add(self, ids: Iterable[str], round: int, tokens: int) -> None:
        if round != self.round:
            self.this_round, self.round = set(), round
        ids = sorted(set(ids))  # the same order on every rank and every rerun
        for problem_id in ids:
            self.first.setdefault(problem_id, FirstSolve(round, tokens))
        self.this_round.update(ids)

    def round_facts(self) -> dict[str, int]:
        """The round's summary row: problems solved in it, and those of them solved for the first time."""
        return {"solved_problems": len(self.this_round),
                "first_solved": sum(self.first[i].round == self.round for i in self.this_round)}

    def _problems(self, offset: int) -> dict[str, dict[str, int]]:
        return {i: {"round": s.round + offset, "tokens": s.tokens} for i, s in self.first.items()}

    def to_json(self) -> dict[str, Any]:
        """solved_problems.json: every problem solved so far, with its first solve; "round" is the
        summary.json row's round (1-based) of the epoch that first solved it."""
        return {"format": FORMAT, "problems": self._problems(offset=1)}

    def state_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "problems": self._problems(offset=0), "round": self.round,
                "this_round": sorted(self.this_round)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()`; raises ValueError on a malformed one (nothing restored)."""
        if not isinstance(state, Mapping) or state.get("format") != FORMAT:
            raise ValueError(f"solved problems state must be a dict with format {FORMAT!r}, got {state!r}")
        try:
            first = {i: FirstSolve(s["round"], s["tokens"]) for i, s in state["problems"].items()}
            round_, this_round = state["round"], set(state["this_round"])
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"solved problems state is malformed: {err!r}") from None
        if not (isinstance(round_, int) and not isinstance(round_, bool) and round_ >= 0):
            raise ValueError(f"solved problems state: 'round' must be an integer >= 0, got {round_!r}")
        if not all(isinstance(i, str) for i in first.keys() | this_round):
            raise ValueError("solved problems state: problem ids must be strings")
        if not this_round <= first.keys():
            raise ValueError(f"solved problems state: {sorted(this_round - first.keys())} solved in round {round_} "
                             "but without a first solve")
        if any(s.round > round_ for s in first.values()):
            raise ValueError(f"solved problems state: a first solve after the ledger's round {round_}")
        self.first, self.this_round, self.round = first, this_round, round_
