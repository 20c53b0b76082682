"""Where the generated tokens went: tree search, flat sampling, Pass1@K screening (issue 32).

DeepSearch's claim is about allocation: tree tokens only on the problems the policy fails,
flat (mixed) rollouts for those with a cached solution. An epoch's rollout counts its split
(data_modules.rollout: the search driver's tokens are tree tokens, those of flat rollouts and
of the direct samples of mixed rollouts flat tokens; cached solutions cost none), and the
`TokenLedger` adds epochs and screenings up per run and per flywheel round for TensorBoard
(`search/tree_tokens`, ...) and summary.json. Plain data, no Lightning; the counts handed in
are already summed over the ranks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

FORMAT = "flywheel.token_split/v1"


@dataclass(frozen=True)
class TokenSplit:
    """Generated tokens by kind."""

    tree: int = 0
    """Tokens of tree searches (`--data.rollout=search`, the problems without cached solutions)."""
    flat: int = 0
    """Tokens of flat samples: flat / best-of-N rollouts and the direct samples of mixed rollouts."""
    screening: int = 0
    """Tokens of Pass1@K screening samples (the hard set and its refreshes); not training data."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise ValueError(f"token split: {name!r} must be an integer >= 0, got {value!r}")

    def __add__(self, other: TokenSplit) -> TokenSplit:
        return TokenSplit(self.tree + other.tree, self.flat + other.flat, self.screening + other.screening)

    @property
    def tree_fraction(self) -> float | None:
        """tree / (tree + flat): the share of training generation spent in trees (None: none spent).

        >>> TokenSplit(tree=300, flat=100, screening=50).tree_fraction
        0.75
        """
        spent = self.tree + self.flat
        return self.tree / spent if spent else None

    def epoch_metrics(self) -> dict[str, float]:
        """An epoch's split as TensorBoard scalars (the fraction only when tokens were generated)."""
        metrics = {"search/tree_tokens": float(self.tree), "search/flat_tokens": float(self.flat)}
        if self.tree_fraction is not None:
            metrics["search/tree_token_fraction"] = self.tree_fraction
        return metrics

    def round_facts(self) -> dict[str, float | int | None]:
        """A round's split for its summary.json row."""
        return {"tree_tokens": self.tree, "flat_tokens": self.flat, "tree_token_fraction": self.tree_fraction,
                "screening_tokens": self.screening}


class TokenLedger:
    """The run's token split in total and for the current flywheel round.

    `add(split, round)` counts `split` for round `round` (the curriculum's rounds completed);
    the first count of a new round starts its split from zero, so until then `this_round` is
    the round that just ended (what its summary row reports).
    """

    def __init__(self) -> None:
        self.total = TokenSplit()
        self.this_round = TokenSplit()
        self.round = 0
        """The round `this_round` counts."""

    def add(self, split: TokenSplit, round: int) -> None:
        if round != self.round:
            self.this_round, self.round = TokenSplit(), round
        self.total += split
        self.this_round += split

    def state_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "round": self.round, "total": asdict(self.total), "this_round": asdict(self.this_round)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()`; raises ValueError on a malformed one (nothing restored)."""
        if not isinstance(state, Mapping) or state.get("format") != FORMAT:
            raise ValueError(f"token split state must be a dict with format {FORMAT!r}, got {state!r}")
        try:
            total, this_round = TokenSplit(**state["total"]), TokenSplit(**state["this_round"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"token split state is malformed: {err}") from None
        round_ = state.get("round")
        if not (isinstance(round_, int) and not isinstance(round_, bool) and round_ >= 0):
            raise ValueError(f"token split state: 'round' must be an integer >= 0, got {round_!r}")
        self.total, self.this_round, self.round = total, this_round, round_
