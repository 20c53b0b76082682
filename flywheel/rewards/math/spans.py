"""Bounded scans of a completion: brace groups, math spans and the last boxes.

Every scan is linear in its input and stops at a fixed number of candidates (a regex with
a lazy span would rescan the rest of the text from every unclosed opener: quadratic on
adversarial input).
"""

from __future__ import annotations

import re

__all__ = ["MAX_ANSWER_CHARS", "MAX_BOX_CANDIDATES", "MAX_MATH_SPANS", "BOX", "braced", "last_boxes", "math_spans"]

MAX_ANSWER_CHARS = 2_000
MAX_BOX_CANDIDATES = 64
"""Boxes tried from the end of a completion: the last complete one wins."""
MAX_MATH_SPANS = 64

BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_LABEL = (r"(?:[A-Za-z](?:_\{?\w{1,8}\}?)?(?:\([a-z]\))?\s*=\s*"
          r"|(?:\([a-h]\)|[Pp]art\s+\(?[a-h1-9]\)?)\s*:?\s*)")
"""A name for one part of an answer: "y_1 = ", "f(x) = ", "(a) ", "Part (b): "."""
_BETWEEN_BOXES = re.compile(
    r"(?:[\s,;.$]|\\[\[\]()]|\\quad|\\qquad|\\[,;: !]|\\text\{[^{}]{0,24}\}|\band\b|\bor\b|&|" + _LABEL + r")*")
_HEDGE_BETWEEN = re.compile(r"\bor\b|\\text\{\s*or\s*\}")
_LABEL_BEFORE = re.compile(_LABEL + r"\$?\s*$")
_DELIMITER = re.compile(r"\$\$|\\\[|\\\]|\\\(|\\\)|(?<!\\)\$|\*\*")
_OPENER = {"$$": "$$", "\\]": "\\[", "\\)": "\\(", "$": "$", "**": "**"}


def braced(text: str, start: int, limit: int = MAX_ANSWER_CHARS + 2) -> tuple[str, int] | None:
    """The content of the {...} group opening at text[start] and the index after it; None
    when it does not close within `limit` characters."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, min(len(text), start + limit)):
        c = text[i]
        if i > 0 and text[i - 1] == "\\":
            continue  # an escaped brace \\{ or \\} is content
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def last_boxes(text: str) -> tuple[list[tuple[int, int, str]], bool, bool]:
    """The last complete box and the complete boxes right before it, in text order; whether
    any two of them are joined by "or" ("\\boxed{2} or \\boxed{3}": one answer "2 or 3",
    a hedge against a single value, a list against a set); and whether an earlier box stands
    beside them as another candidate ("\\boxed{2} or possibly \\boxed{3}": a hedge).

    Boxes joined by spacing, commas or "and" are one answer ("\\boxed{2} and \\boxed{3}" ->
    "2, 3"); so are boxes that each follow a short label ("y_1 = \\boxed{a}, y_2 = \\boxed{b}"
    -> "y_1 = a, y_2 = b"), labels kept."""
    starts = list(BOX.finditer(text))[-MAX_BOX_CANDIDATES:]
    boxes: list[tuple[int, int, str]] = []
    for m in reversed(starts):
        group = braced(text, m.end())
        if group is None:
            tail = re.match(r"([^\s${}]+)", text[m.end() : m.end() + MAX_ANSWER_CHARS])
            if not (tail and m.group(0).endswith(" ")):
                if boxes:
                    break
                continue
            box = (m.start(), m.end() + tail.end(), tail.group(1))  # "\\boxed 5"
        else:
            box = (m.start(), group[1], group[0])
        if boxes and box[1] > boxes[0][0]:  # \boxed{\boxed{5}}: the outer box holds the inner one
            boxes[0] = box
            continue
        if boxes and not _BETWEEN_BOXES.fullmatch(text[box[1] : boxes[0][0]]):
            break
        boxes.insert(0, box)
    labels = [_LABEL_BEFORE.search(text, max(0, start - 24), start) for start, _, _ in boxes]
    named = [m is not None and "=" in m.group(0) for m in labels]  # "y_2 = \boxed{..}"
    plain = len(boxes)  # the boxes after the last one whose name is between it and the one before
    for i in range(1, len(boxes)):
        if named[i]:
            plain = len(boxes) - i
    if plain < len(boxes) and all(named):
        found = [(s, e, labels[i].group(0).rstrip("$ ") + " " + c) for i, (s, e, c) in enumerate(boxes)]
    else:
        found = boxes[len(boxes) - plain :]
    joined_by_or = any(_HEDGE_BETWEEN.search(text[a[1] : b[0]]) for a, b in zip(found, found[1:]))
    hedged = False
    earlier = [m for m in starts if m.start() < found[0][0]] if found else []
    if earlier:  # "\boxed{2} or possibly \boxed{3}": another box earlier in the same sentence
        group = braced(text, earlier[-1].end())
        between = text[group[1] : found[0][0]] if group else ""
        hedged = (len(between) <= 80 and not re.search(r"[.!?]\s|\n", between)
                            and _HEDGE_BETWEEN.search(between) is not None)
    return found, joined_by_or, hedged


def math_spans(text: str) -> list[tuple[int, int, str]]:
    """The math spans (`$$..$$`, `\\[..\\]`, `\\(..\\)`, `$..$`, `**..**`) of text, in order,
    paired from the end over one linear scan of delimiters. At most MAX_MATH_SPANS spans,
    each at most MAX_ANSWER_CHARS long."""
    delimiters = [(m.start(), m.end(), m.group(0)) for m in _DELIMITER.finditer(text)]
    spans: list[tuple[int, int, str]] = []
    j = len(delimiters) - 1
    while j > 0 and len(spans) < MAX_MATH_SPANS:
        start, end, kind = delimiters[j]
        opener = _OPENER.get(kind)
        k = j - 1
        if opener is not None and delimiters[k][2] == opener and start - delimiters[k][1] <= MAX_ANSWER_CHARS:
            content = text[delimiters[k][1] : start]
            if content.strip() and not (kind == "$" and "\n\n" in content):
                spans.append((delimiters[k][0], end, content.strip()))
                j = k - 1
                continue
        j -= 1
    return spans[::-1]
