"""Stage 2: canonical LaTeX text of an answer.

Rewrites notation, never meaning: `\\dfrac`/`\\cfrac` -> `\\frac`, sizing and spacing
commands, `\\text{}`-like wrappers (a unit after a quantity is dropped, a word on its own is
the answer), Unicode symbols, thousands separators (`1,000`, `1\\,000`, `1,\\!000`, `1 000`),
currency, "percent" / "pct" -> `\\%`, "degrees" / `°` -> `^\\circ` (the parser reads both as
marks on the value, so 25\\% = 0.25 and 60^\\circ = \\pi/3 can be decided later),
spelled-out infinity, multiple-choice letters, the empty set and the reals, and answers
joined by "and" / "or" / spacing -> a comma list.
"""

from __future__ import annotations

import re

from flywheel.rewards.math.clause import NUMBER_WORDS
from flywheel.rewards.math.spans import braced
from flywheel.rewards.math.units import UNITS

__all__ = ["normalize", "UNITS"]

_SPACING = re.compile(r"(?<!\\)\\[,;: >]|\\quad|\\qquad|~|\\displaystyle|\\limits|\\nolimits|\\!")
_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg|middle)(?![a-zA-Z])\.?")
_TEXT = re.compile(r"\\(?:textbf|textit|textrm|textnormal|textsf|texttt|text|mathrm|mathbf|mathit|mathsf|mathcal|"
                   r"mathscr|mbox|operatorname|boldsymbol|bm|emph|hbox)(?![a-zA-Z])\s*")
_DEGREE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree|\s+degrees?\b", re.IGNORECASE)
_PERCENT = re.compile(r"\\%|%|\s*\b(?:percent(?:age)?|pct)\b", re.IGNORECASE)
_UNICODE = {"\u2212": "-", "\u2013": "-", "\u00d7": "\\times ", "\u00b7": "\\cdot ", "\u2264": "\\le ",
            "\u2265": "\\ge ", "\u2260": "\\ne ", "\u03c0": "\\pi ", "\u221e": "\\infty ", "\u221a": "\\sqrt ",
            "\u00b2": "^2", "\u00b3": "^3", "\u2208": "\\in ", "\u222a": "\\cup ", "\u00b1": "\\pm ", "\u20ac": " ",
            "\u00a3": " ", "\u00a0": " ", "\u00bd": "\\frac{1}{2}", "\u2153": "\\frac{1}{3}",
            "\u2154": "\\frac{2}{3}", "\u00bc": "\\frac{1}{4}", "\u00be": "\\frac{3}{4}", "\u2155": "\\frac{1}{5}",
            "\u215b": "\\frac{1}{8}", "\u2248": "\\approx "}
_WORD_INFINITY = re.compile(r"\b(?:infinity|inf)\b", re.IGNORECASE)


def _strip_text_groups(s: str) -> str:
    """\\text{...} -> its content; a unit after a quantity ("5\\text{ cm}") -> nothing."""
    out, i = [], 0
    while True:
        m = _TEXT.search(s, i)
        if not m:
            out.append(s[i:])
            return "".join(out)
        group = braced(s, m.end())
        out.append(s[i : m.start()])
        if group is None:
            i = m.end()
            continue
        before = "".join(out).strip()
        content = group[0].strip()
        words = re.sub(r"\^\{?\d\}?", "", content).replace("/", " ").replace(".", " ").lower().split()
        # After a quantity, lower-case words are a unit or a remark ("5\text{ cm}", "17\text{ any text}").
        remark = content.islower() and len(content) > 1 and not {"and", "or"} & set(words)
        after_quantity = re.search(r"[\w})]$", before) is not None
        is_unit = bool(words) and after_quantity and (all(w in UNITS for w in words) or remark)
        out.append(" " if is_unit else " " + content + " ")
        i = group[1]


def _thousands(s: str) -> str:
    """Digit groups of three after a separator are one number: "1,000,000", "1 000", "1,\\!000"."""
    s = re.sub(r"(?<=\d),\\!\s*(?=\d)", "", s)  # ",\!" is only ever a digit-group separator
    s = re.sub(r"\{,\}", ",", s)
    s = re.sub(r"(?<![\d.])(\d{1,3})((?:(?:\\,|\\ |\s)\d{3})+)(?![\d,])",
               lambda m: m.group(1) + re.sub(r"\\,|\\ |\s", "", m.group(2)), s)
    if re.fullmatch(r"-?\$?\s*\d{1,3}(,\d{3})+(\.\d+)?\s*(\\%|[a-zA-Z][\w^{} ]*)?", s.strip()) or re.search(r"\d,\d{3},\d{3}", s):
        s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    return s


def _number_words(s: str) -> str:
    """An answer that is a number in words is that number: "five" -> 5, "twenty-five" -> 25,
    "three hundred and two" -> 302 (only the whole answer, never a word inside prose)."""
    words = re.sub(r"\\text\{([^{}]*)\}", r"\1", s).lower().replace("-", " ").replace(" and ", " ").split()
    if not words or len(words) > 8 or not all(w in NUMBER_WORDS for w in words):
        return s
    total, part = 0, 0
    for w in words:
        n = NUMBER_WORDS[w]
        if n == 100:
            part = (part or 1) * 100
        elif n >= 1000:
            total, part = total + (part or 1) * n, 0
        else:
            part += n
    return str(total + part)


def normalize(answer: str) -> str:
    """Canonical text of an answer (see the module docstring)."""
    s = answer.strip()
    for k, v in _UNICODE.items():
        s = s.replace(k, v)
    s = s.replace("\\$", " ").replace("$", " ").replace("\\(", " ").replace("\\)", " ")
    s = s.replace("\\[", " ").replace("\\]", " ")
    s = re.sub(r"\*\*(.+?)\*\*", r" \1 ", s)  # markdown bold
    s = s.replace("**", "^")  # a Python power: x**2
    s = re.sub(r"(?<![\\a-zA-Z])(pi|sqrt)(?![a-zA-Z])", r"\\\1 ", s)  # plain-text "pi", "sqrt(2)"
    s = re.sub(r"\\(?:boxed|fbox)\s*(?=\{)", "", s)  # a box inside the answer (or the reference)
    s = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![a-zA-Z])", r"\\binom", s)
    s = re.sub(r"\{\s*([^{}]+?)\s*\\choose\s*([^{}]+?)\s*\}", r"\\binom{\1}{\2}", s)
    s = _SIZING.sub("", s)
    s = s.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}").replace("\\lvert", "|").replace("\\rvert", "|")
    s = s.replace("\\langle", "(").replace("\\rangle", ")")  # a vector <1, 2>
    s = s.replace("\\vert", "|").replace("\\mid", "|").replace("\\lt", "<").replace("\\gt", ">")
    s = re.sub(r"\\(?:leq?|leqslant)(?![a-zA-Z])", r"\\le ", s)
    s = re.sub(r"\\(?:geq?|geqslant)(?![a-zA-Z])", r"\\ge ", s)
    s = re.sub(r"\\(?:neq?)(?![a-zA-Z])|!=", r"\\ne ", s)
    s = s.replace("<=", "\\le ").replace(">=", "\\ge ")
    s = _thousands(s)
    s = re.sub(r"(?<![\d.])(\d+)\s+(\d+)/(\d+)(?![\d.])", r"\1\\frac{\2}{\3}", s)  # "3 1/2": a mixed number
    s = re.sub(r"_\{(\w)\}", r"_\1", s)  # a_{3} -> a_3
    s = re.sub(r"(?<!\\),(?=\\q?quad)", " ", s)
    s = re.sub(r"(\S)\s*\\q?quad\s*(?=\S)", r"\1, ", s)  # "2 \quad 3": a list
    s = _SPACING.sub(" ", s)
    s = _strip_text_groups(s)
    s = _DEGREE.sub("^\\\\circ ", s)
    s = _PERCENT.sub(" \\\\% ", s)
    s = _WORD_INFINITY.sub("\\\\infty ", s)
    s = _number_words(s)
    s = s.replace("\\dots", "").replace("\\ldots", "").replace("\\cdots", "")
    s = re.sub(r"(?<=\d)\\$", "", s)  # a stray trailing backslash: "185\"
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    s = re.sub(r"\s*(?:,\s*)?\b(?:and|or)\b\s*", ", ", s)  # "2 and 3", "1, 2, and 3", "x = 1 or x = 2"
    s = re.sub(r"^,\s*|,\s*$", "", s).strip()
    words = s.split(" ")
    while len(words) > 1 and re.sub(r"\^\{?\d\}?$", "", words[-1]).lower().strip(".,") in UNITS | {""}:
        words.pop()  # a trailing unit word: "5 cm", "12 square units"
    s = " ".join(words)
    m = (re.fullmatch(r"\(?\s*([A-E])\s*\)?", s) or re.match(r"\(\s*([A-E])\s*\)(?:\s|$)", s)
         or re.match(r"([A-E])[.:)]\s", s))
    if m:  # multiple choice: "(A)", "A", "\text{(B)}", "(C) 12", "C. x = 42"
        return m.group(1)
    if s in ("\\emptyset", "\\varnothing", "\\O", "\\{ \\}", "\\{\\}"):
        return "\\{\\}"
    s = re.sub(r"^all real numbers$|^all reals$", r"\\mathbb{R}", s, flags=re.IGNORECASE)
    m = re.fullmatch(r"\\\{\s*[a-zA-Z]\s*(?:\||:)\s*(.+)\\\}", s)
    if m:  # set-builder notation: \{x \mid x > 2\} -> x > 2
        s = m.group(1).strip()
    s = re.sub(r"\\mathbb\s*\{?\s*R\s*\}?|\\R(?![a-zA-Z])|\\mathbf\s*\{?\s*R\s*\}?", r"(-\\infty,\\infty)", s)
    s = re.sub(r"^\(-\\infty,\\infty\)\s*-\s*(?=\\\{)", r"(-\\infty,\\infty) \\setminus ", s)  # R - \{1\}
    s = re.sub(r"^\\approx\s*", "", s)  # "\approx 3.14": the value
    return s.strip()
