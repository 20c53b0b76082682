"""The part of a completion that is the model's own answer turn, and whether it is text.

- `cut_at_new_turn`: a response that runs into a new chat turn (a model imitating
  `<|im_start|>user ...`, or any special token decoded as text) is only what came before it;
  it "ran on" when text follows the marker (then only the strict rules grade it, issue 36).
  A marker with nothing after it is an ordinary end of turn.
- `without_code`: fenced code blocks and inline code become the word "(code)": a value
  printed by a program is not an answer given as an answer (issue 36), and the word keeps
  the line that held it from being read as a bare answer.
- `degenerate`: text no fallback reads (runs of one character, a token or sentence
  repeated over and over, control or replacement characters, symbol soup).
All linear in the text they look at (at most TAIL_CHARS from the end).
"""

from __future__ import annotations

import re

__all__ = ["TAIL_CHARS", "cut_at_new_turn", "without_code", "degenerate"]

TAIL_CHARS = 100_000
"""The fallbacks after the boxes look at the completion's last characters only."""
_TURN = re.compile(
    r"<\|[A-Za-z0-9_]{1,40}\|>|<\uff5c[^\uff5c>]{1,40}\uff5c>|</s>|<s>|\[/?INST\]|<(?:start|end)_of_turn>"
    r"|^[ \t]*(?:user|assistant|system)[ \t]*$"  # a ChatML header whose special tokens decoding dropped
    r"|^[ \t]*(?:#{1,4}[ \t]*)?(?:User|USER|Human|HUMAN|Assistant|ASSISTANT|Instruction)[ \t]*:",
    re.MULTILINE,
)
_ROLE = re.compile(r"\b(?:user|assistant|system)\b")
_FENCE = re.compile(r"(```|~~~)[^\n]*\n?")
_CODE_START = re.compile(
    r"[ \t]*(?:return|def \w+\(|print\s*\(|import \w|from \S+ import|(?:const|let|var) \w+\s*=|function\b|"
    r"class \w+|elif\b|console\.log|System\.out|#include|std::)")
"""A line of code starts with a statement keyword (matched at a line's start only) ..."""
_CODE_END = (";", "{")
"""... or ends with ";" or "{" (spaces and tabs after it aside). The two are tested apart, line by
line: one pattern for both (`[^\n]*[;{][ \t]*$`) backtracks quadratically over a long line
(100,000 spaces took over 90 s)."""
_INLINE_CODE = re.compile(r"`[^`\n]{1,400}`")
_RUN = re.compile(r"([^\s\d\-=_*#~.])\1{11,}")
"""One character 12 times in a row ("$$$$$$$$$$$$", "aaaaaaaaaaaa"); digits, spacing and
markdown rules ("-----", "=====") excepted."""
REPEATS = 10
"""The same token this many times in a row is a loop ("the the the ...")."""
SENTENCE_REPEATS = 4
"""The same sentence or line this many times in a row is a loop."""
SOUP_TOKENS = 8
SOUP_WORDISH = 0.6
"""Text of at least SOUP_TOKENS tokens of which under this share look like words, numbers or
mathematics is symbol soup."""
_GARBLED = re.compile(r"[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_WORD = re.compile(r"[^\W\d_]+")
_NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[a-zA-Z]{1,4}[\u00b2\u00b3]?|%)?")
_MATH_CHARS = set("\\$^_{}=")
_PLAIN = set("+-*/<>()[].,;:!?'\"%&|") | set("\u00b2\u00b3\u03c0\u221a\u2264\u2265\u2260\u00b1\u00d7\u00f7\u00b7\u2212\u221e\u00b0")


def cut_at_new_turn(text: str) -> tuple[str, bool]:
    """(the text before the first chat-turn marker, whether any text follows the marker)."""
    m = _TURN.search(text)
    if m is None:
        return text, False
    rest = _ROLE.sub(" ", _TURN.sub(" ", text[m.end() :]))
    return text[: m.start()], bool(rest.strip())


def without_code(text: str) -> str:
    """text with every fenced block (an unclosed fence: everything after it) and every inline
    `code` span replaced by the word "(code)", and every line of code (a statement keyword
    first, or ";" / "{" last) by "(code)". Linear in the text: each line is read once."""
    out, i = [], 0
    while True:
        m = _FENCE.search(text, i)
        if m is None:
            out.append(text[i:])
            break
        out.append(text[i : m.start()] + "\n(code)\n")
        close = text.find(m.group(1), m.end())
        if close < 0:
            break
        i = close + len(m.group(1))
    lines = _INLINE_CODE.sub(" (code) ", "".join(out)).split("\n")
    return "\n".join("(code)" if _CODE_START.match(line) or line.rstrip(" \t").endswith(_CODE_END) else line
                     for line in lines)


def _wordish(token: str) -> bool:
    token = token.strip(".,;:!?()[]\"'")
    if not token or len(token) <= 2 or _MATH_CHARS & set(token) or _NUMBER.fullmatch(token):
        return True
    if token.isalpha():
        if re.search(r"[a-z][A-Z]", token):
            return False  # "NbQZhcox": case changes inside a word
        return any(c in "aeiouyAEIOUY" for c in token) or any(ord(c) > 127 for c in token)
    letters = _WORD.findall(token)
    return all(c.isalnum() or c in _PLAIN for c in token) and all(len(w) == 1 for w in letters)


def degenerate(text: str) -> bool:
    """Is the text (its last TAIL_CHARS) a loop, garbled or symbol soup? (module docstring)"""
    tail = text[-TAIL_CHARS:]
    if _RUN.search(tail) or len(_GARBLED.findall(tail)) >= 3:
        return True
    tokens = tail.split()
    run = 1
    for a, b in zip(tokens, tokens[1:]):
        run = run + 1 if a == b else 1
        if run >= REPEATS:
            return True
    run, last = 1, None
    for part in re.split(r"\n+|(?<=[.!?])\s+", tail):
        part = part.strip()
        if not part:
            continue
        run = run + 1 if part == last and len(part) > 1 else 1
        last = part
        if run >= SENTENCE_REPEATS:
            return True
    if len(tokens) >= SOUP_TOKENS:
        wordish = sum(_wordish(t) for t in tokens[-2000:])
        return wordish < SOUP_WORDISH * min(len(tokens), 2000)
    return False
