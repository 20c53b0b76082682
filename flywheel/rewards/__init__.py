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
            "bad_numbers", "parse_error", "too_long", ...), for logs and the tree viewer;
            "<outcome>:<rule>" when the verifier names the rule that read the answer
            ("correct:box", "wrong_value:last_line": the math verifier, issue 36).
    """

    correct: bool
    reward: float
    answer: str | None
    reason: str

    @property
    def answer_rule(self) -> str | None:
        """The rule that read the answer (the reason's part after ":"), None when not named.

        >>> Verdict(True, 1.0, "12", "correct:phrase").answer_rule, Verdict(False, -1.0, None, "no_answer").answer_rule
        ('phrase', None)
        """
        outcome, _, rule = self.reason.partition(":")
        return rule or None
