"""Garbled-text and infinite-repetition filter for negative samples (deepsearch.md §7).

The paper drops INCORRECT trajectories whose text is garbled or loops forever (the released
code lacks the filter, §9): their negative advantage would push probability mass around on
junk the policy rarely means to produce. Correct trajectories passed the verifier and are
never filtered; `degenerate_negative` applies that rule.

Every check is linear in the text length (regex passes, one zlib pass, slice comparisons
that run in C), so a 100k-character response is judged in milliseconds. The thresholds are
set so that ordinary Countdown traces and math prose (LaTeX, \\boxed{}) pass; see
tests/test_adaptive.py for the worked positives and negatives.

Reasons, in the order they are checked:
    "non_printable"  control characters (other than tab / newline / carriage return) or
                     private-use code points make up more than `max_non_printable_fraction`.
    "garbled"        U+FFFD replacement characters (broken UTF-8 from byte-level tokens)
                     exceed `max_replacement_fraction`, or a long text is almost all symbols
                     (letters, digits, '_' and whitespace below `min_word_fraction`).
    "repetition"     the text ends in one unit of at most `max_period` characters repeated
                     over and over (a period-p tail), long enough: see `repeated_tail`.
    "low_diversity"  a long text compresses more than `max_compression_ratio` times (near
                     repetition with small variations, which an exact period misses), or the
                     last `diversity_window` token ids hold too few distinct tokens.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

from flywheel.finite import check_finite_fields

# Cc minus \t \n \r, plus the C1 controls and the BMP private-use area.
_NON_PRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ue000-\uf8ff]")
_REPLACEMENT = re.compile("\ufffd")
_NOT_WORD = re.compile(r"[^\w\s]")


def repeated_tail(text: str, max_period: int = 256, min_length: int = 32, min_repeats: int = 4) -> tuple[int, int]:
    """The longest suffix of `text` that repeats one unit of p <= max_period characters.

    Returns (length, period) of the longest suffix with period p (text[i] == text[i + p]
    throughout it) among the periods whose suffix is at least max(min_length,
    min_repeats * p) long; (0, 0) when there is none. A trailing partial unit counts (a
    response cut off mid-loop).

    Cost: one short slice comparison per period, then an exponential + binary search on
    the suffix length for the periods that pass: O(max_period * min_repeats * max_period +
    length * log(length)) character comparisons, done by C string equality.

    >>> repeated_tail("Let me think:" + "I am stuck. " * 10)
    (120, 12)
    >>> repeated_tail("9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>")
    (0, 0)
    """
    n = len(text)
    best = (0, 0)
    for period in range(1, min(max_period, n) + 1):
        probe = max(min_length, min_repeats * period)
        if probe > n:
            break  # probe only grows with the period
        if not _has_period(text, n - probe, period):
            continue
        length = _longest_periodic_suffix(text, period, probe)
        if length > best[0]:
            best = (length, period)
    return best


def _has_period(text: str, start: int, period: int) -> bool:
    """text[start:] has period `period` (equal to itself shifted by `period`)."""
    return text[start + period :] == text[start : len(text) - period]


def _longest_periodic_suffix(text: str, period: int, known: int) -> int:
    """Periodicity of a suffix is monotone in its length (a shorter suffix of a periodic one
    is periodic), so gallop up from the `known` good length, then bisect."""
    n = len(text)
    good, bad = known, None
    while bad is None:
        trial = min(2 * good, n)
        if _has_period(text, n - trial, period):
            good = trial
            if good == n:
                return n
        else:
            bad = trial
    while bad - good > 1:
        mid = (good + bad) // 2
        if _has_period(text, n - mid, period):
            good = mid
        else:
            bad = mid
    return good


@dataclass(frozen=True)
class DegenerateFilter:
    """Thresholds of the garbled / infinite-repetition filter; call it on a response.

    Args:
        enabled: run the filter; off = nothing is ever flagged.
        max_non_printable_fraction: flag "non_printable" above this fraction of control /
            private-use characters.
        max_replacement_fraction: flag "garbled" above this fraction of U+FFFD characters.
        min_word_fraction: flag "garbled" when letters, digits, '_' and whitespace make up
            less than this fraction of a text of at least `min_symbol_check_chars`.
        min_symbol_check_chars: texts shorter than this skip the symbol-fraction check.
        max_period: longest repeated unit, in characters, that the repetition check looks for.
        min_repeats: the unit must repeat at least this many times in the tail.
        min_repeat_chars: repeated tails shorter than this are never flagged ("......",
            "0.33333" are fine).
        max_repeat_fraction: flag "repetition" when the repeated tail covers more than this
            fraction of the (right-stripped) text ...
        max_repeat_chars: ... or is at least this long, whatever the fraction (a long
            answer that starts looping near its end).
        max_compression_ratio: flag "low_diversity" when a text of at least
            `min_compression_chars` UTF-8 bytes compresses (zlib) more than this many times;
            prose and math compress about 2-4 times.
        min_compression_chars: shorter texts skip the compression check.
        diversity_window: with token ids, the number of final tokens whose distinct count
            is checked; shorter responses skip the check.
        min_distinct_ratio: flag "low_diversity" when the last `diversity_window` token ids
            hold fewer than `diversity_window * min_distinct_ratio` distinct tokens.
    """

    enabled: bool = True
    max_non_printable_fraction: float = 0.02
    max_replacement_fraction: float = 0.02
    min_word_fraction: float = 0.2
    min_symbol_check_chars: int = 64
    max_period: int = 256
    min_repeats: int = 4
    min_repeat_chars: int = 32
    max_repeat_fraction: float = 0.5
    max_repeat_chars: int = 2000
    max_compression_ratio: float = 10.0
    min_compression_chars: int = 2048
    diversity_window: int = 1024
    min_distinct_ratio: float = 1 / 64

    def __post_init__(self) -> None:
        check_finite_fields(self, "data.credit.degenerate_filter")
        fractions = ("max_non_printable_fraction", "max_replacement_fraction", "min_word_fraction", "max_repeat_fraction")
        for name in (*fractions, "min_distinct_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"--data.credit.degenerate_filter.{name} must be in [0, 1], got {value}")
        for name in ("max_period", "min_repeats", "min_repeat_chars", "max_repeat_chars", "diversity_window"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"--data.credit.degenerate_filter.{name} must be >= 1, got {value}")
        if self.max_compression_ratio < 1.0:
            raise ValueError(
                f"--data.credit.degenerate_filter.max_compression_ratio must be >= 1, got {self.max_compression_ratio}"
            )

    def __call__(self, text: str, token_ids: Sequence[int] | None = None) -> str | None:
        """The reason `text` is degenerate ("non_printable", "garbled", "repetition",
        "low_diversity"), or None when it looks like ordinary output."""
        if not self.enabled:
            return None
        text = text.rstrip()
        n = len(text)
        if n:
            if _NON_PRINTABLE.subn("", text)[1] > self.max_non_printable_fraction * n:
                return "non_printable"
            if _REPLACEMENT.subn("", text)[1] > self.max_replacement_fraction * n:
                return "garbled"
            if n >= self.min_symbol_check_chars and n - _NOT_WORD.subn("", text)[1] < self.min_word_fraction * n:
                return "garbled"
            length, _ = repeated_tail(text, self.max_period, self.min_repeat_chars, self.min_repeats)
            if length and (length > self.max_repeat_fraction * n or length >= self.max_repeat_chars):
                return "repetition"
            raw = text.encode("utf-8", "replace")
            if len(raw) >= self.min_compression_chars and len(raw) > self.max_compression_ratio * len(zlib.compress(raw, 6)):
                return "low_diversity"
        if token_ids is not None and len(token_ids) >= self.diversity_window:
            window = token_ids[len(token_ids) - self.diversity_window :]
            if len(set(window)) < self.min_distinct_ratio * self.diversity_window:
                return "low_diversity"
        return None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def is_degenerate(text: str, token_ids: Sequence[int] | None = None, **thresholds: Any) -> str | None:
    """`DegenerateFilter(**thresholds)(text, token_ids)`: the reason or None.

    >>> is_degenerate("9*8=72\\n72-5=67\\n<answer>(9*8)-5</answer>") is None
    True
    >>> is_degenerate("9*8=72\\n" + "72-5=67\\n" * 20)
    'repetition'
    """
    return DegenerateFilter(**thresholds)(text, token_ids)


def degenerate_negative(
    correct: bool, text: str, token_ids: Sequence[int] | None = None, flt: DegenerateFilter = DegenerateFilter()
) -> str | None:
    """The paper's rule: only an incorrect response is dropped for being degenerate; a
    correct one always returns None."""
    return None if correct else flt(text, token_ids)
