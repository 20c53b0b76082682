"""Mastermind's rules: reading a guess, the feedback it earns, and whether it fits earlier feedback.

A code is `length` digits, each 1..`digits` (repeats allowed; the classic game is 4 digits
1-6). Two kinds of feedback:

- pegs (the classic game, `feedback`): black pegs for the right digit in the right place,
  white pegs for a right digit in the wrong place, each secret digit counted at most once:

      secret 1234, guess 1111 -> 1 black (the first 1), 0 white (the secret has one 1 only)
      secret 1122, guess 2211 -> 0 black, 4 white

- marks (Wordle's rule, `marks`): one mark per position, "G" the right digit there, "Y" a
  digit the secret holds elsewhere, "." neither; a digit is marked G or Y at most as many
  times as the secret holds it, G first, then Y from left to right:

      secret 1234, guess 1111 -> "G..." (the secret's one 1 is matched in place)
      secret 1122, guess 2211 -> "YYYY"

A guess is untrusted model output: `parse_code` compares its length with the code's before it
looks at a single character, so any text, however long, is read in constant time, and nothing
is ever handed to eval() or int() of an unbounded string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

__all__ = ["MAX_DIGITS", "Code", "Feedback", "code_text", "consistent", "feedback", "marks", "parse_code"]

MAX_DIGITS = 9
"""Digits a code may use at most (1-9): each digit is one character."""

Code = tuple[int, ...]
"""A code as its digits, e.g. (3, 5, 1, 2)."""


@dataclass(frozen=True)
class Feedback:
    """The pegs a guess earns: `black` right digit right place, `white` right digit wrong place."""

    black: int
    white: int


def parse_code(text: str, length: int, digits: int) -> Code | None:
    """The code `text` spells: exactly `length` ASCII digits, each 1..`digits`; None for any
    other text (no whitespace, signs or other numerals are forgiven).

    >>> parse_code("3512", 4, 6), parse_code("3517", 4, 6), parse_code("351", 4, 6), parse_code(" 3512", 4, 6)
    ((3, 5, 1, 2), None, None, None)
    >>> parse_code("\\u0663512", 4, 6) is None  # an Arabic-Indic three is not a digit of the game
    True
    """
    if len(text) != length:  # first: a long text costs nothing
        return None
    allowed = "123456789"[:digits]
    if any(char not in allowed for char in text):
        return None
    return tuple(ord(char) - ord("0") for char in text)


def code_text(code: Code) -> str:
    """A code as text, the inverse of `parse_code`.

    >>> code_text((3, 5, 1, 2))
    '3512'
    """
    return "".join(str(digit) for digit in code)


def feedback(secret: Code, guess: Code) -> Feedback:
    """The pegs `guess` earns against `secret` (the two of one length).

    White pegs are the digits the two share, each counted min(times in secret, times in guess),
    less the black pegs (a black peg is a shared digit too).

    >>> feedback((1, 2, 3, 4), (1, 1, 1, 1))  # shared: one 1; black: position 1
    Feedback(black=1, white=0)
    >>> feedback((1, 1, 2, 2), (2, 2, 1, 1))  # shared: two 1s and two 2s, none in place
    Feedback(black=0, white=4)
    >>> feedback((1, 2, 3, 4), (2, 1, 3, 5))  # shared: 1, 2, 3; black: the 3
    Feedback(black=1, white=2)
    """
    if len(secret) != len(guess):
        raise ValueError(f"a guess of {len(guess)} digits cannot be scored against a secret of {len(secret)}")
    black = sum(s == g for s, g in zip(secret, guess))
    shared = sum(min(secret.count(digit), guess.count(digit)) for digit in set(guess))
    return Feedback(black=black, white=shared - black)


def marks(secret: Code, guess: Code) -> str:
    """The marks `guess` earns against `secret` (the two of one length), one per position.

    >>> marks((1, 2, 3, 4), (1, 1, 1, 1)), marks((1, 1, 2, 2), (2, 2, 1, 1))
    ('G...', 'YYYY')
    >>> marks((4, 2, 4, 6), (1, 3, 1, 4)), marks((4, 2, 4, 6), (4, 4, 4, 2))  # the secret's 4s: two
    ('...Y', 'G.GY')
    """
    if len(secret) != len(guess):
        raise ValueError(f"a guess of {len(guess)} digits cannot be scored against a secret of {len(secret)}")
    unmatched: dict[int, int] = {}  # the secret's digits not matched in place, with their counts
    for s, g in zip(secret, guess):
        if s != g:
            unmatched[s] = unmatched.get(s, 0) + 1
    out = []
    for s, g in zip(secret, guess):
        if s == g:
            out.append("G")
        elif unmatched.get(g, 0):
            unmatched[g] -= 1
            out.append("Y")
        else:
            out.append(".")
    return "".join(out)


def consistent(history: Sequence[tuple[Code, Hashable]], guess: Code,
               score: Callable[[Code, Code], Hashable] = feedback) -> bool:
    """Whether `guess` could be the secret, given earlier guesses and the feedback each earned
    under `score` (`feedback`: pegs, or `marks`): had it been the secret, every earlier guess
    would have earned the same feedback.

    >>> history = [((1, 1, 2, 2), Feedback(black=1, white=1))]
    >>> consistent(history, (1, 3, 1, 4)), consistent(history, (1, 1, 2, 2)), consistent(history, (3, 3, 4, 4))
    (True, False, False)
    >>> consistent([((1, 1, 1, 1), "G...")], (1, 2, 2, 2), marks), consistent([((1, 1, 1, 1), "G...")], (2, 1, 2, 2), marks)
    (True, False)
    """
    return all(score(guess, earlier) == earned for earlier, earned in history)
