"""The math verifier: `verify(gold, completion) -> Verdict`.

Three stages, each bounded, none calling eval():

1. Extract the final answer: the last `\\boxed{}` / `\\fbox{}` (boxes that end the
   completion side by side are joined as a list), else a trailing "final answer is X" or
   "Answer: X". A hedged answer ("2 or 3") is wrong by default (`hedged="first"` or
   `"last"` takes one of them instead).
2. Normalise the LaTeX: `\\dfrac`/`\\tfrac`, `\\left`/`\\right`, spacing commands, `\\text{}`
   and units, degrees, percent, dollars, thousands separators, `x = 3`, `x \\in S`,
   multiple-choice letters.
3. Parse both sides with a hand-written recursive-descent parser into a small value
   language (numbers, symbols, + - * / ^, roots, pi, e, i, trig / log / exp, infinity;
   tuples and intervals with their brackets; unordered sets and bare comma lists;
   matrices; equations) and compare:
   - exact rational arithmetic (fractions.Fraction) whenever both sides are rational;
   - a decimal tolerance only when a side is written as a decimal (relative 1e-6, or the
     exact side rounded to the decimal's digits);
   - otherwise numeric equality at high precision (mpmath, which ships with sympy) at
     the same random points for every free symbol; equations are equal when
     lhs - rhs of one is a constant non-zero multiple of the other's;
   - intervals compare endpoints AND brackets; tuples are ordered; sets and bare lists
     are unordered; matrices compare entrywise.

Budgets: completion and answer length, nesting depth, number of parse nodes, and the size
of every exact power (a 10^{10^{10}} tower is evaluated in floating point, never exactly).
Nothing here uses signals or mutable global state (the numeric comparisons use a private
mpmath context of fixed precision, never the global one), so it runs the same in threads
and worker processes; every call returns in milliseconds.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Union

import mpmath

from flywheel.rewards import Verdict

__all__ = ["MAX_ANSWER_CHARS", "MAX_COMPLETION_CHARS", "extract_answer", "normalize", "parse", "answers_equal", "verify"]

MAX_COMPLETION_CHARS = 400_000
MAX_ANSWER_CHARS = 2_000
MAX_DEPTH = 60
MAX_NODES = 2_000
MAX_EXACT_BITS = 4_096
"""Largest numerator/denominator kept exact; beyond it a value is carried in floating point."""
REL_TOL = 1e-6
"""Relative tolerance when a side is written as a decimal."""
NUMERIC_DPS = 40
HP = mpmath.MPContext()
HP.dps = NUMERIC_DPS
"""The high-precision context of the numeric comparisons: a constant, never modified after
this line (mpmath's `workdps` changes the one global context and races between threads)."""
SAMPLE_POINTS = 3

Hedged = Literal["wrong", "first", "last"]


# ----------------------------------------------------------------------------------------- 1. extract
_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_FINAL = re.compile(r"(?:final answer is|final answer:|answer is|answer:)\s*", re.IGNORECASE)


def _braced(text: str, start: int, limit: int = MAX_ANSWER_CHARS + 2) -> tuple[str, int] | None:
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


MAX_BOX_CANDIDATES = 64
"""Boxes tried from the end of a completion: the last complete one wins."""


def _last_boxes(text: str) -> list[tuple[int, int, str]]:
    """The last complete box and the complete boxes right before it, in text order."""
    starts = [m for m in _BOX.finditer(text)][-MAX_BOX_CANDIDATES:]
    found: list[tuple[int, int, str]] = []
    for m in reversed(starts):
        group = _braced(text, m.end())
        if group is None:
            tail = re.match(r"([^\s${}]+)", text[m.end() : m.end() + MAX_ANSWER_CHARS])
            if not (tail and m.group(0).endswith(" ")):
                if found:
                    break
                continue
            box = (m.start(), m.end() + tail.end(), tail.group(1))  # "\\boxed 5"
        else:
            box = (m.start(), group[1], group[0])
        if found and not re.fullmatch(r"[\s,;$]*(?:and)?[\s,;$]*", text[box[1] : found[0][0]]):
            break
        found.insert(0, box)
    return found


def extract_answer(completion: str) -> str | None:
    """The final answer text of a completion, or None (see the module docstring)."""
    boxes = _last_boxes(completion)
    if boxes:
        return ", ".join(b[2].strip() for b in boxes)
    end = completion[-20_000:]
    matches = list(_FINAL.finditer(end))
    if not matches:
        return None
    tail = end[matches[-1].end() :].strip()
    answer = tail.splitlines()[0].strip() if tail else ""
    math = re.match(r"\$+([^$]+)\$+", answer)
    if math:  # "The final answer is $42$. I hope it is correct."
        return math.group(1).strip() or None
    answer = re.split(r"\.\s|\.$", answer)[0].strip()
    return answer or None


# --------------------------------------------------------------------------------------- 2. normalise
_SPACING = re.compile(r"(?<!\\)\\[,!;: ]|\\quad|\\qquad|~|\\displaystyle|\\limits|\\nolimits")
_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)(?![a-zA-Z])\.?")
_TEXT = re.compile(r"\\(?:textbf|textit|textrm|text|mathrm|mathbf|mbox|operatorname)(?![a-zA-Z])\s*")
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_UNITS = {
    "cm", "mm", "m", "km", "in", "inch", "inches", "ft", "foot", "feet", "yd", "yard", "yards", "mi", "mile", "miles",
    "meter", "meters", "metre", "metres", "centimeter", "centimeters", "kilometer", "kilometers", "g", "kg", "gram",
    "grams", "lb", "lbs", "pound", "pounds", "oz", "ounce", "ounces", "s", "sec", "second", "seconds", "min", "minute",
    "minutes", "h", "hr", "hour", "hours", "day", "days", "week", "weeks", "year", "years", "dollar", "dollars",
    "cent", "cents", "unit", "units", "square", "sq", "cubic", "degree", "degrees", "radian", "radians", "percent",
    "people", "students", "ways", "times", "ml", "liter", "liters", "litres", "mph", "kmh", "hz", "pa", "mol", "ev",
    "kev", "mev", "gev", "ly", "au", "pc", "kpc", "mpc", "joules", "newtons", "watts", "volts", "kelvin",
}


def _strip_text_groups(s: str) -> str:
    """\\text{...} -> its content (units are dropped later)."""
    out, i = [], 0
    while True:
        m = _TEXT.search(s, i)
        if not m:
            out.append(s[i:])
            return "".join(out)
        group = _braced(s, m.end())
        out.append(s[i : m.start()])
        if group is None:
            i = m.end()
            continue
        before = "".join(out).strip()
        content = group[0]
        # Text after a quantity is a unit ("5\text{ apples}", "20\text{ m/s}"); text on its own
        # is the answer ("\text{Evelyn}", "\textbf{(B)}").
        is_unit = (
            bool(before)
            and re.fullmatch(r"[\sA-Za-z/^.\-0-9]*[A-Za-z][\sA-Za-z/^.\-0-9]*", content) is not None
            and re.fullmatch(r"\s*(?:or|and)\s*", content) is None
            and not before.endswith(("(", ",", "{"))
        )
        out.append(" " if is_unit else " " + content + " ")
        i = group[1]


def normalize(answer: str) -> str:
    """Canonical text of an answer (see the module docstring, stage 2)."""
    s = answer.strip()
    s = s.replace("$", " ").replace("\\(", " ").replace("\\)", " ").replace("\\[", " ").replace("\\]", " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    s = _SIZING.sub("", s)
    s = s.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}")
    s = _SPACING.sub(" ", s)
    s = _strip_text_groups(s)
    s = _DEGREE.sub(" ", s)
    s = s.replace("\\%", " ").replace("%", " ").replace("\\$", " ")
    s = s.replace("{,}", "").replace("\\dots", "").replace("\\ldots", "").replace("\\cdots", "")
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    # A trailing unit word after a quantity: "5 cm", "12 square units", "3 m^2".
    words = s.split(" ")
    while len(words) > 1 and re.sub(r"\^\{?\d\}?$", "", words[-1]).lower().strip(".,") in _UNITS | {""}:
        words.pop()
    s = " ".join(words)
    # Thousands separators, only when the whole answer is one such number.
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    # Multiple choice: "(A)", "A", "\text{(B)}", "(C) 12".
    m = re.fullmatch(r"\(?\s*([A-E])\s*\)?", s) or re.match(r"\(\s*([A-E])\s*\)(?:\s|$)", s)
    if m:
        return m.group(1)
    if s in ("\\emptyset", "\\varnothing", "\\O", "\\{ \\}"):
        return "\\{\\}"
    if s in ("\\mathbb{R}", "\\mathbb R", "\\R", "\\mathbf{R}"):
        return "(-\\infty,\\infty)"
    interval = _inequality_interval(s)
    if interval is not None:
        return interval
    # "x \in (1, 2)" -> the set; "x = 3" -> 3 when the left side is a lone variable.
    m = re.fullmatch(r"[a-zA-Z](?:_\{?\w+\}?)?\s*\\in\s*(.+)", s)
    if m:
        s = m.group(1)
    return s.strip()


_LESS = r"(<|\\le(?:q|qslant)?(?![a-z])|\\lt(?![a-z]))"
_MORE = r"(>|\\ge(?:q|qslant)?(?![a-z])|\\gt(?![a-z]))"
_VAR = r"[a-zA-Z](?:_\{?\w+\}?)?"


def _inequality_interval(s: str) -> str | None:
    """"a < x \\le b" -> "(a,b]"; "x > 3" -> "(3,\\infty)"; None when s is no such inequality."""

    def closed(op: str) -> bool:
        return op not in ("<", ">") and not op.startswith(("\\lt", "\\gt"))

    m = re.fullmatch(rf"(.+?)\s*{_LESS}\s*{_VAR}\s*{_LESS}\s*(.+)", s)
    if m:
        return f"{'[' if closed(m.group(2)) else '('}{m.group(1)},{m.group(4)}{']' if closed(m.group(3)) else ')'}"
    m = re.fullmatch(rf"{_VAR}\s*{_MORE}\s*(.+)", s)
    if m:
        return f"{'[' if closed(m.group(1)) else '('}{m.group(2)},\\infty)"
    m = re.fullmatch(rf"{_VAR}\s*{_LESS}\s*(.+)", s)
    if m:
        return f"(-\\infty,{m.group(2)}{']' if closed(m.group(1)) else ')'}"
    return None


# ------------------------------------------------------------------------------------------- 3. parse
class _Reject(Exception):
    pass


@dataclass(frozen=True)
class Num:
    """A real number: exact (Fraction) or approximate (mpf), and whether it was written as a decimal."""

    exact: Fraction | None
    approx: object  # mpmath.mpf / mpc
    decimal_places: int | None = None


@dataclass(frozen=True)
class Expr:
    """Any expression: evaluated numerically at points for its free symbols."""

    node: tuple
    symbols: frozenset


@dataclass(frozen=True)
class Seq:
    """A bracketed sequence: a tuple/point or an interval; brackets are part of its identity."""

    open: str
    close: str
    items: tuple


@dataclass(frozen=True)
class Unordered:
    items: tuple


@dataclass(frozen=True)
class Matrix:
    rows: tuple


@dataclass(frozen=True)
class Equation:
    lhs: object
    rhs: object


@dataclass(frozen=True)
class Union_:
    parts: tuple


@dataclass(frozen=True)
class Choice:
    letter: str


Value = Union[Num, Expr, Seq, Unordered, Matrix, Equation, Union_, Choice]

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|(?P<cmd>\\[a-zA-Z]+|\\[{}|])"
    r"|(?P<op>[-+*/^_(){}\[\],=!|<>]|\\\\|&)|(?P<name>[a-zA-Z])|(?P<other>\S))"
)
_FUNCS = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log", "ln", "exp", "lg"}
_GREEK = {"alpha", "beta", "gamma", "delta", "theta", "lambda", "mu", "phi", "omega", "sigma", "tau", "rho", "epsilon", "varepsilon", "varphi", "psi", "eta", "xi", "zeta", "kappa", "nu", "chi"}


def _tokens(s: str) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(s):
        m = _TOKEN.match(s, i)
        if not m or m.end() == i:
            break
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        i = m.end()
    return out


class _Parser:
    """Recursive descent over tokens -> expression nodes:
    ("n", Fraction|mpf, decimals) | ("s", name) | ("+", a, b) | ("*", a, b) | ("/", a, b) | ("^", a, b)
    | ("neg", a) | ("f", name, a) | ("root", a, n) | ("inf",) | ("abs", a) | ("fact", a)."""

    def __init__(self, text: str) -> None:
        self.t = _tokens(text)
        self.i = 0
        self.depth = 0
        self.nodes = 0
        self.last_was_frac = False

    def peek(self, k: int = 0) -> tuple[str, str] | None:
        return self.t[self.i + k] if self.i + k < len(self.t) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _Reject("end")
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        tok = self.take()
        if tok[1] != value:
            raise _Reject(f"expected {value}")

    def node(self, *parts) -> tuple:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _Reject("too_big")
        return parts

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Reject("too_deep")

    # expr := term (('+'|'-') term)*
    def expr(self) -> tuple:
        self.enter()
        left = self.term()
        while (tok := self.peek()) and tok[1] in ("+", "-") :
            self.take()
            right = self.term()
            left = self.node("+", left, right if tok[1] == "+" else self.node("neg", right))
        self.depth -= 1
        return left

    def term(self) -> tuple:
        left = self.unary()
        while True:
            tok = self.peek()
            if tok is None:
                return left
            if tok[1] in ("*", "\\cdot", "\\times"):
                self.take()
                left = self.node("*", left, self.unary())
            elif tok[1] in ("/", "\\div"):
                self.take()
                left = self.node("/", left, self.unary())
            elif self.starts_factor(tok):  # implicit product: 2x, 2\sqrt{3}, (a)(b)
                right = self.unary()
                whole = left[1] if left[0] == "neg" else left
                if self.last_was_frac and right[0] == "/" and right[1][0] == "n" and right[2][0] == "n" \
                        and whole[0] == "n" and whole[2] is None and whole[1].denominator == 1:
                    mixed = self.node("+", whole, right)  # a mixed number: 3\frac{1}{2} = 7/2
                    left = self.node("neg", mixed) if left[0] == "neg" else mixed
                else:
                    left = self.node("*", left, right)
            else:
                return left

    def starts_factor(self, tok) -> bool:
        kind, value = tok
        if kind in ("num", "name"):
            return True
        if kind == "cmd":
            return value in ("\\frac", "\\sqrt", "\\pi", "\\infty") or value[1:] in _FUNCS or value[1:] in _GREEK
        return value == "("

    def unary(self) -> tuple:
        tok = self.peek()
        if tok and tok[1] == "-":
            self.take()
            return self.node("neg", self.unary())
        if tok and tok[1] == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> tuple:
        base = self.postfix()
        tok = self.peek()
        if tok and tok[1] == "^":
            self.take()
            exponent = self.group_or_atom()
            return self.node("^", base, exponent)
        return base

    def postfix(self) -> tuple:
        a = self.atom()
        while (tok := self.peek()) and tok[1] == "!":
            self.take()
            a = self.node("fact", a)
        return a

    def group_or_atom(self) -> tuple:
        tok = self.peek()
        if tok and tok[1] == "{":
            self.take()
            self.enter()
            inner = self.expr()
            self.depth -= 1
            self.expect("}")
            return inner
        if tok and tok[1] == "-":
            self.take()
            return self.node("neg", self.group_or_atom())
        return self.atom()

    def atom(self) -> tuple:
        self.last_was_frac = False
        kind, value = self.take()
        if kind == "num":
            return self.number(value)
        if kind == "name":
            return self.subscripted(value)
        if value in ("(", "["):
            self.enter()
            inner = self.expr()
            self.depth -= 1
            closing = self.take()[1]
            if closing not in (")", "]"):
                raise _Reject("bracket")
            return inner
        if value == "{":
            self.enter()
            inner = self.expr()
            self.depth -= 1
            self.expect("}")
            return inner
        if value == "|":
            inner = self.expr()
            self.expect("|")
            return self.node("abs", inner)
        if kind == "cmd":
            name = value[1:]
            if name == "frac":
                num, den = self.group_or_atom_digit(), self.group_or_atom_digit()
                self.last_was_frac = True
                return self.node("/", num, den)
            if name == "sqrt":
                index = None
                if self.peek() and self.peek()[1] == "[":
                    self.take()
                    index = self.expr()
                    self.expect("]")
                return self.node("root", self.group_or_atom(), index or ("n", Fraction(2), None))
            if name == "pi":
                return self.node("s", "pi")
            if name == "infty":
                return self.node("inf")
            if name in _GREEK:
                return self.node("s", name)
            if name in _FUNCS:
                power = None
                if self.peek() and self.peek()[1] == "^":
                    self.take()
                    power = self.group_or_atom()
                argument = self.group_or_atom() if self.peek() and self.peek()[1] in ("{", "(") else self.unary()
                out = self.node("f", name, argument)
                return self.node("^", out, power) if power is not None else out
        raise _Reject(f"token {value!r}")

    def group_or_atom_digit(self) -> tuple:
        """An argument of \\frac; in "\\frac12" a bare digit is one argument."""
        tok = self.peek()
        if tok and tok[0] == "num" and tok[1].isdigit() and len(tok[1]) > 1:
            self.t[self.i] = ("num", tok[1][1:])
            return self.number(tok[1][0])
        return self.group_or_atom()

    def subscripted(self, name: str) -> tuple:
        if self.peek() and self.peek()[1] == "_":
            self.take()
            sub = self.take()[1]
            if sub == "{":
                parts = []
                while self.peek() and self.peek()[1] != "}":
                    parts.append(self.take()[1])
                self.expect("}")
                sub = "".join(parts)
            name = f"{name}_{sub}"
        return self.node("s", name)

    def number(self, text: str) -> tuple:
        if "e" in text.lower():
            mantissa, _, exponent = text.lower().partition("e")
            if abs(int(exponent)) > 10_000:
                raise _Reject("too_big")
            value = Fraction(mantissa) * Fraction(10) ** int(exponent)
            return self.node("n", value, None)
        decimals = len(text.split(".")[1]) if "." in text else None
        return self.node("n", Fraction(text), decimals)


def _split_top(s: str, separators: str) -> list[str]:
    """Split at separators outside (), [], {} and \\{ \\}."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in separators and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _scalar(text: str) -> Value:
    parser = _Parser(text)
    node = parser.expr()
    if parser.peek() is not None:
        raise _Reject(f"trailing {parser.peek()[1]!r}")
    symbols = _symbols(node)
    if not symbols:
        exact = _exact(node)
        if exact is not None:
            return Num(exact, HP.mpf(exact.numerator) / exact.denominator, _decimals(node))
    return Expr(node, frozenset(symbols))


def parse(answer: str) -> Value:
    """The value language of a normalised answer (raises ValueError when it cannot be read)."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise ValueError("too_long")
    try:
        return _parse(answer.strip())
    except (_Reject, ZeroDivisionError, ValueError, OverflowError, IndexError) as err:
        raise ValueError(str(err) or type(err).__name__) from None


def _parse(s: str) -> Value:
    s = s.strip()
    if re.fullmatch(r"[A-E]", s):
        return Choice(s)
    m = re.fullmatch(r"[(\[]?\s*\\begin\{([pbvBV]?matrix|array)\}(?:\{[^}]*\})?(.*)\\end\{\1\}\s*[)\]]?", s, re.S)
    if m:
        rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
        return Matrix(tuple(tuple(_parse(c.strip()) for c in r.split("&")) for r in rows))
    if "\\cup" in s:
        return Union_(tuple(_parse(p) for p in s.split("\\cup")))
    if s.count("=") == 1 and not re.search(r"[<>]=|=[<>]|\\[lg]eq?", s):
        left, right = s.split("=")
        return Equation(_parse(left), _parse(right))
    if s.startswith("\\{") and s.endswith("\\}"):
        inner = s[2:-2]
        return Unordered(tuple(_parse(p) for p in _split_top(inner, ",;") if p))
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _matching(s):
        parts = _split_top(s[1:-1], ",")
        if len(parts) >= 2:
            return Seq(s[0], s[-1], tuple(_parse(p) for p in parts))
    parts = _split_top(s, ",;")
    if len(parts) >= 2:
        return Unordered(tuple(_parse(p) for p in parts if p))
    return _scalar(s)


def _matching(s: str) -> bool:
    """The first bracket closes at the very end (so "(1)(2)" is not one sequence)."""
    depth = 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return False
    return depth == 0


# ------------------------------------------------------------------------------------------ evaluate
def _symbols(node: tuple) -> set[str]:
    if node[0] == "s":
        return set() if node[1] == "pi" else {node[1]}
    out: set[str] = set()
    for part in node[1:]:
        if isinstance(part, tuple):
            out |= _symbols(part)
    return out


def _decimals(node: tuple) -> int | None:
    """Decimal places when the value is written as a single (possibly negated) decimal literal."""
    if node[0] == "n":
        return node[2]
    if node[0] == "neg":
        return _decimals(node[1])
    return None


def _exact(node: tuple) -> Fraction | None:
    """The exact rational value, or None (irrational, symbolic, or too big to keep exact)."""
    op = node[0]
    if op == "n":
        return node[1]
    if op == "neg":
        a = _exact(node[1])
        return None if a is None else -a
    if op in ("+", "*", "/"):
        a, b = _exact(node[1]), _exact(node[2])
        if a is None or b is None:
            return None
        if op == "+":
            out = a + b
        elif op == "*":
            out = a * b
        else:
            if b == 0:
                raise _Reject("division by zero")
            out = a / b
        return out if _small(out) else None
    if op == "^":
        a, b = _exact(node[1]), _exact(node[2])
        if a is None or b is None or b.denominator != 1:
            return None
        bits = max(a.numerator.bit_length(), a.denominator.bit_length()) * abs(b.numerator)
        if bits > MAX_EXACT_BITS:
            return None
        if a == 0 and b < 0:
            raise _Reject("division by zero")
        return a ** int(b)
    if op == "fact":
        a = _exact(node[1])
        if a is None or a.denominator != 1 or not 0 <= a <= 300:
            return None
        out = Fraction(1)
        for k in range(2, int(a) + 1):
            out *= k
        return out
    if op == "abs":
        a = _exact(node[1])
        return None if a is None else abs(a)
    return None


def _small(x: Fraction) -> bool:
    return max(x.numerator.bit_length(), x.denominator.bit_length()) <= MAX_EXACT_BITS


def _numeric(node: tuple, env: dict[str, object]):
    op = node[0]
    if op == "n":
        v = node[1]
        return HP.mpf(v.numerator) / v.denominator
    if op == "s":
        if node[1] == "pi":
            return HP.pi
        if node[1] == "e" and "e" not in env:
            return HP.e
        if node[1] == "i" and "i" not in env:
            return HP.mpc(0, 1)
        return env[node[1]]
    if op == "inf":
        return HP.inf
    if op == "neg":
        return -_numeric(node[1], env)
    a = _numeric(node[1], env) if isinstance(node[1], tuple) else None
    if op == "+":
        return a + _numeric(node[2], env)
    if op == "*":
        return a * _numeric(node[2], env)
    if op == "/":
        return a / _numeric(node[2], env)
    if op == "^":
        b = _numeric(node[2], env)
        if abs(a) not in (0, 1) and abs(b) * abs(HP.log(abs(a), 2)) > 10**6:
            raise _Reject("too_big")  # a power tower: never materialise 2^(10^10)-bit numbers
        return HP.power(a, b)
    if op == "root":
        return HP.root(_numeric(node[1], env), int(_numeric(node[2], env)))
    if op == "abs":
        return abs(_numeric(node[1], env))
    if op == "fact":
        x = _numeric(node[1], env)
        if abs(x) > 10**5:
            raise _Reject("too_big")
        return HP.factorial(x)
    if op == "f":
        name, x = node[1], _numeric(node[2], env)
        table = {"sin": HP.sin, "cos": HP.cos, "tan": HP.tan, "sec": HP.sec, "csc": HP.csc,
                 "cot": HP.cot, "arcsin": HP.asin, "arccos": HP.acos, "arctan": HP.atan,
                 "sinh": HP.sinh, "cosh": HP.cosh, "tanh": HP.tanh, "ln": HP.log,
                 "log": HP.log, "exp": HP.exp, "lg": HP.log10}
        return table[name](x)
    raise _Reject(f"cannot evaluate {op}")


def _close(a, b, rel: float) -> bool:
    if a == b:
        return True
    if HP.isinf(a) or HP.isinf(b) or HP.isnan(a) or HP.isnan(b):
        return False
    diff = abs(a - b)
    return diff <= rel * max(abs(a), abs(b)) or diff <= HP.mpf(10) ** -30


def _points(symbols: frozenset, seed: int) -> list[dict[str, object]]:
    rng = random.Random(f"{seed}:{sorted(symbols)}")
    return [{s: HP.mpf(rng.uniform(0.3, 2.7)) for s in symbols} for _ in range(SAMPLE_POINTS)]


def _as_expr(v: Value) -> Expr | None:
    if isinstance(v, Expr):
        return v
    if isinstance(v, Num):
        return Expr(("n", v.exact, v.decimal_places) if v.exact is not None else ("n", Fraction(0), None), frozenset())
    return None


def _num_equal(a: Num, b: Num) -> bool:
    """a = the reference, b = the prediction."""
    if a.exact is not None and b.exact is not None and a.decimal_places is None and b.decimal_places is None:
        return a.exact == b.exact
    if a.exact is not None and b.exact is not None and a.exact == b.exact:
        return True
    # A reference written as a decimal sets the precision: an exact prediction rounded to its
    # digits counts (gold 0.333, prediction 1/3); a decimal prediction of an exact reference
    # must be within the relative tolerance (gold 1/3, prediction 0.33 is wrong).
    if a.decimal_places is not None and b.decimal_places is None and b.exact is not None:
        scale = Fraction(10) ** a.decimal_places
        if Fraction(round(b.exact * scale), 1) / scale == a.exact:
            return True
    if a.decimal_places is not None or b.decimal_places is not None:
        return _close(a.approx, b.approx, REL_TOL)
    return False


def _expr_equal(a: Expr, b: Expr, tol: float = 1e-20) -> bool:
    symbols = a.symbols | b.symbols
    for env in _points(symbols, 0) if symbols else [{}]:
        try:
            x, y = _numeric(a.node, env), _numeric(b.node, env)
        except (ZeroDivisionError, ValueError, OverflowError, TypeError, KeyError):
            return False
        if not _close(x, y, tol):
            return False
    return True


def answers_equal(gold: Value, pred: Value) -> bool:
    """Equality of two parsed answers (see the module docstring, stage 3)."""
    if isinstance(gold, Num) and isinstance(pred, Num):
        return _num_equal(gold, pred)
    if isinstance(gold, (Num, Expr)) and isinstance(pred, (Num, Expr)):
        if isinstance(gold, Num) and gold.decimal_places is not None or isinstance(pred, Num) and pred.decimal_places is not None:
            return _expr_equal(_as_expr(gold), _as_expr(pred), REL_TOL)
        return _expr_equal(_as_expr(gold), _as_expr(pred))
    if isinstance(gold, Equation) and isinstance(pred, Equation):
        return _equation_equal(gold, pred)
    if isinstance(gold, Equation) and _is_variable(gold.lhs) and not isinstance(pred, Equation):
        return answers_equal(gold.rhs, pred)  # gold "x = 3", prediction "3"
    if isinstance(pred, Equation) and _is_variable(pred.lhs) and not isinstance(gold, Equation):
        return answers_equal(gold, pred.rhs)  # prediction "x = 3", gold "3"
    if isinstance(gold, Choice) or isinstance(pred, Choice):
        return isinstance(gold, Choice) and isinstance(pred, Choice) and gold.letter == pred.letter
    if isinstance(gold, Seq) and isinstance(pred, Seq):
        return (gold.open, gold.close) == (pred.open, pred.close) and len(gold.items) == len(pred.items) and all(
            answers_equal(x, y) for x, y in zip(gold.items, pred.items))
    if isinstance(gold, Unordered) and isinstance(pred, Unordered):
        return _same_multiset(gold.items, pred.items)
    if isinstance(gold, Union_) and isinstance(pred, Union_):
        return _same_multiset(gold.parts, pred.parts)
    if isinstance(gold, Matrix) and isinstance(pred, Matrix):
        return len(gold.rows) == len(pred.rows) and all(
            len(r) == len(s) and all(answers_equal(x, y) for x, y in zip(r, s)) for r, s in zip(gold.rows, pred.rows))
    # A one-element set against its element ("\{3\}" vs "3").
    if isinstance(gold, Unordered) and len(gold.items) == 1:
        return answers_equal(gold.items[0], pred)
    if isinstance(pred, Unordered) and len(pred.items) == 1:
        return answers_equal(gold, pred.items[0])
    return False


def _same_multiset(xs: tuple, ys: tuple) -> bool:
    if len(xs) != len(ys):
        return False
    left = list(ys)
    for x in xs:
        for j, y in enumerate(left):
            if answers_equal(x, y):
                del left[j]
                break
        else:
            return False
    return True


def _is_variable(v: Value) -> bool:
    """A lone variable, or a tuple of them ("(a, b) = (2, 3)")."""
    if isinstance(v, Seq):
        return all(_is_variable(x) for x in v.items)
    return isinstance(v, Expr) and v.node[0] == "s"


def _equation_equal(a: Equation, b: Equation) -> bool:
    """Same equation: lhs - rhs of one is a non-zero constant multiple of the other's."""
    da, db = (_as_expr(a.lhs), _as_expr(a.rhs)), (_as_expr(b.lhs), _as_expr(b.rhs))
    if None in da or None in db:
        return answers_equal(a.lhs, b.lhs) and answers_equal(a.rhs, b.rhs)
    fa = ("+", da[0].node, ("neg", da[1].node))
    fb = ("+", db[0].node, ("neg", db[1].node))
    symbols = da[0].symbols | da[1].symbols | db[0].symbols | db[1].symbols
    ratio = None
    tiny = HP.mpf(10) ** -25
    for env in _points(frozenset(symbols), 1) if symbols else [{}]:
        try:
            x, y = _numeric(fa, env), _numeric(fb, env)
        except (ZeroDivisionError, ValueError, OverflowError, TypeError, KeyError):
            return False
        if abs(y) < tiny or abs(x) < tiny:
            if not (abs(x) < tiny and abs(y) < tiny):
                return False
            continue
        r = x / y
        if ratio is None:
            ratio = r
        elif not _close(r, ratio, 1e-20):
            return False
    return True


# ------------------------------------------------------------------------------------------- verify
def _compact(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


_HEDGE = re.compile(r"\s(?:or|either)\s|\\text\{\s*or\s*\}|\\lor", re.IGNORECASE)


def verify(gold: str, completion: str, *, hedged: Hedged = "wrong", correct_reward: float = 1.0,
           wrong_reward: float = -1.0) -> Verdict:
    """Grade `completion` against the reference answer `gold` (LaTeX allowed)."""
    if len(completion) > MAX_COMPLETION_CHARS:
        return Verdict(False, wrong_reward, None, "too_long")
    answer = extract_answer(completion)
    if answer is None:
        return Verdict(False, wrong_reward, None, "no_answer")
    if len(answer) > MAX_ANSWER_CHARS:
        return Verdict(False, wrong_reward, answer[:80], "too_long")
    if _HEDGE.search(f" {answer} "):
        options = [p for p in _HEDGE.split(answer) if p.strip()]
        if hedged == "wrong" or not options:
            return Verdict(False, wrong_reward, answer, "hedged")
        answer = options[0] if hedged == "first" else options[-1]
    gold_text, pred_text = normalize(gold), normalize(answer)
    if _compact(gold_text) == _compact(pred_text):
        return Verdict(True, correct_reward, answer, "correct")
    try:
        gold_value = parse(gold_text)
    except ValueError:  # a reference that is not mathematics ("Evelyn", "\\text{yes}"): text equality only
        return Verdict(False, wrong_reward, answer, "wrong_value")
    try:
        pred_value = parse(pred_text)
    except ValueError:
        return Verdict(False, wrong_reward, answer, "parse_error")
    try:
        ok = answers_equal(gold_value, pred_value)
    except (_Reject, ZeroDivisionError, ValueError, OverflowError, TypeError, RecursionError, KeyError):
        ok = False
    return Verdict(ok, correct_reward if ok else wrong_reward, answer, "correct" if ok else "wrong_value")
