"""Stage 1: the final answer text of a completion.

Fallback order (the first that finds something wins):

1. the last `\\boxed{}` / `\\fbox{}`; boxes that end the completion side by side, or joined
   by "and" / commas / spacing, are one list ("\\boxed{2} and \\boxed{3}" -> "2, 3");
   A "final answer" phrase after the last box wins over the box.
2. a "final answer" phrase: "The final answer is X", "Final Answer: X", "the answer is X",
   "Answer: X" (X: the math in that sentence, else what follows its last "is");
3. a GSM8K-style `#### X` line;
4. the last display or inline math (`\\[..\\]`, `$$..$$`, `\\(..\\)`, `$..$`) or bold `**X**`,
   unless prose with a number follows it (then that number);
5. the whole completion when it is a short formula (no prose words);
6. the last number (signs, separators, decimals, a/b fractions, a trailing %), or a
   multiple-choice letter ("(D)", "option B") written after it.

A completion with a box that never closes (or closes past MAX_ANSWER_CHARS) has no answer:
the fallbacks are for completions that never tried to box one.
With `require_box=True` only step 1 counts: the strict format some training recipes reward.
Every scan is bounded (boxes tried, characters looked at), so this is linear in the input.
"""

from __future__ import annotations

import re

__all__ = ["MAX_ANSWER_CHARS", "extract_answer", "braced"]

MAX_ANSWER_CHARS = 2_000
MAX_BOX_CANDIDATES = 64
"""Boxes tried from the end of a completion: the last complete one wins."""
TAIL_CHARS = 100_000
"""The fallbacks after the boxes look at the completion's last characters only."""

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_SPECIAL_TOKEN = re.compile(r"<\|[a-z_]+\|>")
_BETWEEN_BOXES = re.compile(
    r"(?:[\s,;.$]|\\[\[\]()]|\\quad|\\qquad|\\[,;: !]|\\text\{[^{}]{0,24}\}|\band\b|&)*")
_FINAL = re.compile(r"(?:final answer\**\s*(?:is|:)|answer\**\s*(?:is|:))\**[ \t]*", re.IGNORECASE)
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_DELIMITER = re.compile(r"\$\$|\\\[|\\\]|\\\(|\\\)|(?<!\\)\$|\*\*")
_OPENER = {"$$": "$$", "\\]": "\\[", "\\)": "\\(", "$": "$", "**": "**"}
MAX_MATH_SPANS = 64
_NUMBER = re.compile(r"(?:-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+)(?: ?(?:\\?%|percent\b))?")
_CHOICE = re.compile(r"\(([A-E])\)|\b(?:option|choice)\s+(?:is\s+)?\(?([A-E])\b")
_OPERATORS = ("+", "-", "*", "/", "^", "_", "{", "\\times", "\\cdot")
_PROSE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{4,}")


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


def _last_boxes(text: str) -> list[tuple[int, int, str]]:
    """The last complete box and the complete boxes right before it, in text order."""
    starts = list(_BOX.finditer(text))[-MAX_BOX_CANDIDATES:]
    found: list[tuple[int, int, str]] = []
    for m in reversed(starts):
        group = braced(text, m.end())
        if group is None:
            tail = re.match(r"([^\s${}]+)", text[m.end() : m.end() + MAX_ANSWER_CHARS])
            if not (tail and m.group(0).endswith(" ")):
                if found:
                    break
                continue
            box = (m.start(), m.end() + tail.end(), tail.group(1))  # "\\boxed 5"
        else:
            box = (m.start(), group[1], group[0])
        if found and box[1] > found[0][0]:  # \boxed{\boxed{5}}: the outer box holds the inner one
            found[0] = box
            continue
        if found and not _BETWEEN_BOXES.fullmatch(text[box[1] : found[0][0]]):
            break
        found.insert(0, box)
    return found


def _phrase_answer(sentence: str) -> str | None:
    """The answer inside a "final answer" sentence: its math, else what follows its last
    " is " ("The volume of $V$ is 120"), else the sentence when it is a formula, else its
    last number."""
    sentence = sentence.strip()
    after_is = re.split(r"\s(?:is|are|be|was|equals)\s", sentence)
    if len(after_is) > 1:
        sentence = after_is[-1].strip()
    maths = _math_spans(sentence)
    if maths:
        joined = [maths[-1]]
        for m in reversed(maths[:-1]):
            if not re.fullmatch(r"[\s,;]*(?:and|or)?[\s,;]*", sentence[m[1] : joined[0][0]]):
                break
            joined.insert(0, m)
        return ", ".join(m[2] for m in joined) or None
    if not _PROSE.search(_strip_commands(sentence)):
        return sentence.strip().rstrip(".").strip() or None
    return _last_number(sentence)


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """The math spans (`$$..$$`, `\\[..\\]`, `\\(..\\)`, `$..$`, `**..**`) of text, in order,
    paired from the end over one linear scan of delimiters (a regex with a lazy span would
    rescan the rest of the text from every unclosed opener: quadratic on adversarial input).
    At most MAX_MATH_SPANS spans, each at most MAX_ANSWER_CHARS long."""
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


def _strip_commands(text: str) -> str:
    """Text without LaTeX commands and plain function names, to tell a formula from prose."""
    text = re.sub(r"\\[a-zA-Z]+(?:\{[^{}]*\})?", " ", text)
    return re.sub(r"\b(?:sqrt|sin|cos|tan|log|exp|pi|infinity)\b", " ", text)


def _last_number(text: str) -> str | None:
    """The last number that stands alone: an operand of an operator ("1+1", "2^3") is part
    of an expression, not an answer."""
    numbers = list(_NUMBER.finditer(text))[-MAX_MATH_SPANS:]
    for m in reversed(numbers):
        before = text[max(0, m.start() - 8) : m.start()].rstrip()
        after = text[m.end() : m.end() + 8].lstrip()
        if not (before.endswith(_OPERATORS) or after.startswith(_OPERATORS)):
            return m.group(0)
    return None


def _final_sentence(tail: str) -> str:
    """Text after a "final answer" phrase up to the end of its sentence (a period that is
    not a decimal point, or a line break), math spans kept whole."""
    tail = tail[:MAX_ANSWER_CHARS]
    spans = {start: end for start, end, _ in _math_spans(tail)}
    i = 0
    while i < len(tail):
        if i in spans:
            i = spans[i]
            continue
        c = tail[i]
        if c == "\n" or (c == "." and (i + 1 == len(tail) or not tail[i + 1].isdigit())):
            break
        i += 1
    return tail[:i]


def extract_answer(completion: str, *, require_box: bool = False) -> str | None:
    """The final answer text of a completion, or None (see the module docstring)."""
    completion = completion.replace("\u2212", "-")  # the Unicode minus sign
    special = _SPECIAL_TOKEN.search(completion)
    if special:  # "... 2/3. <|im_start|>user ..." : the model's turn ended there
        completion = completion[: special.start()]
    boxes = _last_boxes(completion)
    end = completion[-TAIL_CHARS:]
    offset = len(completion) - len(end)
    phrases = [] if require_box else list(_FINAL.finditer(end))
    if phrases and (not boxes or phrases[-1].start() + offset > boxes[-1][1]):
        sentence = _final_sentence(end[phrases[-1].end() :])
        later = end[phrases[-1].end() + len(sentence) :]
        # A phrase after the last box wins; one followed by more math or a #### line
        # ("whether the answer is positive ... so $x = 7$") was not the final answer.
        later = later[: MAX_ANSWER_CHARS * 4]
        if not (any(later[st : st + 2] != "**" for st, _, _ in _math_spans(later)) or "####" in later):
            answer = _phrase_answer(sentence)
            if answer:
                return answer
    if boxes:
        return ", ".join(b[2].strip() for b in boxes)
    if require_box or _BOX.search(completion):
        return None  # a box that never closes (or is over MAX_ANSWER_CHARS) is a malformed answer
    hashes = list(_HASHES.finditer(end))
    if hashes and hashes[-1].group(1).strip():
        return hashes[-1].group(1).strip()
    maths = _math_spans(end)
    if maths:
        _, span_end, content = maths[-1]
        number = list(_NUMBER.finditer(end, span_end))
        if number and _PROSE.search(end, span_end, number[-1].start()):
            return number[-1].group(0)  # "... $d = 90/n$ ... so there are 12 sequences"
        return content
    stripped = end.strip()
    if stripped and len(stripped) <= 200 and not _PROSE.search(_strip_commands(stripped)):
        return stripped
    number = _last_number(end)
    choices = list(_CHOICE.finditer(end[-TAIL_CHARS:]))
    if choices and (number is None or choices[-1].end() > end.rfind(number)):
        return next(g for g in choices[-1].groups() if g)  # "The correct option is B.", "Therefore (D)."
    return number
