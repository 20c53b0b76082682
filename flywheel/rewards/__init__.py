"""Verifiers: pure, bounded-time functions from (problem, completion text) to a Verdict.

Model output is untrusted input: no verifier calls eval(), and every one returns in well
under a second whatever the completion holds.
"""

from dataclasses import dataclass

__all__ = ["Verdict"]


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one completion.

    Attributes:
        correct: the final answer is right.
        reward: the scalar the search and the objective use (+1 / -1 by default; a task may
            offer a dense variant).
        answer: the extracted final answer text, or None when none could be found.
        reason: a short machine-readable reason ("correct", "no_answer", "wrong_value",
            "bad_numbers", "parse_error", "too_long", ...), for logs and the tree viewer.
    """

    correct: bool
    reward: float
    answer: str | None
    reason: str
