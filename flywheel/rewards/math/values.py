"""Stage 3c: the value language of a normalised answer and its structure.

An answer is read from the outside in: multiple choice; "x \\in S" -> S; a matrix or a matrix
expression (matrices.py: sums, products, multiples); a
set `\\{..\\}` or a bracketed tuple / interval (`;` separates too); a `;`-separated list of
labelled groups ("p=5,q=2;p=7,q=2" -> (5,2),(7,2)); a comma list (unordered); a union of
intervals (`\\cup`, `\\setminus`); an inequality in one variable -> intervals (both
directions, flipped, negated, |x|, `\\ne`); an equation chain (`=`, `\\approx`); else one
expression, where `\\pm` expands into its two values.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

from flywheel.rewards.math.evaluate import HP, exact, free_symbols
from flywheel.rewards.math.expr import Reject, parse_expression
from flywheel.rewards.math.matrices import matrix_expression

__all__ = ["Num", "Expr", "Marked", "Seq", "Unordered", "Matrix", "Equation", "Union_", "Choice", "Value",
           "parse_value", "is_label"]

MAX_PM = 3
"""At most this many \\pm signs are expanded (2^3 values)."""


@dataclass(frozen=True)
class Num:
    """A real number: exact (Fraction) or not, and its decimal places when written as a decimal."""

    exact: Fraction | None
    approx: object  # mpmath mpf / mpc
    decimal_places: int | None = None


@dataclass(frozen=True)
class Expr:
    """Any other expression: compared by value at points for its free symbols."""

    node: tuple
    symbols: frozenset


@dataclass(frozen=True)
class Marked:
    """A value written with % or a degree sign: equal to the bare number or to its scaled
    reading (25\\% -> 25 or 0.25; 60^\\circ -> 60 or \\pi/3)."""

    plain: object
    scaled: object


@dataclass(frozen=True)
class Seq:
    """A bracketed sequence: a tuple / point or an interval; the brackets are part of it."""

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


Value = Union[Num, Expr, Marked, Seq, Unordered, Matrix, Equation, Union_, Choice]
_INF = Expr(("inf",), frozenset())
_NEG_INF = Expr(("neg", ("inf",)), frozenset())


def split_top(s: str, separators: str) -> list[str]:
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


def _wrapped(s: str) -> bool:
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


def parse_value(s: str) -> Value:
    s = s.strip()
    if not s:
        raise Reject("empty")
    if re.fullmatch(r"[A-E]", s):
        return Choice(s)
    m = re.fullmatch(r"[a-zA-Z](?:_\{?\w+\}?)?\s*\\in\s*(.+)", s, re.S)
    if m:
        return parse_value(m.group(1))
    entries = matrix_expression(s) if "\\begin" in s else None
    if entries is not None:
        return Matrix(tuple(tuple(_to_value(x) for x in row) for row in entries))
    m = re.fullmatch(r"[(\[]?\s*\\begin\{([pbvBV]?matrix|array)\}(?:\{[^}]*\})?(.*)\\end\{\1\}\s*[)\]]?", s, re.S)
    if m:
        rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
        return Matrix(tuple(tuple(parse_value(c) for c in r.split("&")) for r in rows))
    if s.startswith("\\{") and s.endswith("\\}") and split_top(s[2:-2], "") == [s[2:-2].strip()]:
        return Unordered(_flat(parse_value(p) for p in split_top(s[2:-2], ",;") if p))
    if s[0] == "{" and s[-1] == "}" and _wrapped(s) and len(split_top(s[1:-1], ",;")) >= 2:
        return parse_value(s[1:-1])  # "{2, 3, 5}": LaTeX braces written for a set
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _wrapped(s):
        parts = split_top(s[1:-1], ",;")
        if len(parts) >= 2:
            return Seq(s[0], s[-1], tuple(_scalar_or_value(p) for p in parts))
    groups = split_top(s, ";")
    if len(groups) >= 2 and all("=" in g for g in groups):
        width = {len(split_top(g, ",")) for g in groups}
        if len(width) == 1 and width != {1}:  # "p=5,q=2;p=7,q=2": labelled tuples
            return Unordered(tuple(Seq("(", ")", tuple(_unlabel(parse_value(x)) for x in split_top(g, ",")))
                                   for g in groups))
    parts = split_top(s, ",;")
    if len(parts) >= 2:
        return Unordered(_flat(parse_value(p) for p in parts if p))
    if "\\cup" in s:
        return Union_(tuple(parse_value(p) for p in s.split("\\cup")))
    if "\\setminus" in s:
        return _minus(*s.split("\\setminus", 1))
    if re.search(r"\\le|\\ge|<|>|\\ne", s):
        return _relation(s)
    if "=" in s or "\\approx" in s:
        pieces = _top_level_split(s, r"(=|\\approx)")
        if len(pieces) > 1:
            return _chain(pieces)
    return _scalar(s)


def _top_level_split(s: str, pattern: str) -> list[str]:
    """re.split(pattern, s) at matches outside braces ("\\sum_{k=1}^n k" has no top-level "=")."""
    out, start = [], 0
    for m in re.finditer(pattern, s):
        if s.count("{", 0, m.start()) == s.count("}", 0, m.start()):
            out += [s[start : m.start()], m.group(0)]
            start = m.end()
    return out + [s[start:]]


def _scalar_or_value(s: str) -> Value:
    return _scalar(s) if "\\pm" not in s else parse_value(s)


def _flat(values) -> tuple:
    """A \\pm inside a list adds both its values to the list."""
    out = []
    for v in values:
        out.extend(v.items if isinstance(v, Unordered) else [v])
    return tuple(out)


def _unlabel(v: Value) -> Value:
    return v.rhs if isinstance(v, Equation) and is_label(v.lhs) else v


def is_label(v: Value) -> bool:
    """A name for the answer rather than part of it: x, a_3, (p, q), AB, |AB|, f(x), A:B,
    \\frac{NO}{BO} -- symbols under products, quotients, powers and |.|, no numbers, no sums."""
    if isinstance(v, Seq):
        return all(is_label(x) for x in v.items)
    if not isinstance(v, Expr):
        return False

    def named(node: tuple) -> bool:
        if node[0] == "s":
            return node[1] not in ("pi",)
        if node[0] in ("*", "/"):
            return named(node[1]) and named(node[2])
        if node[0] == "^":
            return named(node[1])
        return node[0] == "abs" and named(node[1])

    return named(v.node)


def _chain(pieces: list[str]) -> Value:
    """ "x = 5", "y = 2x+1", "z = 1 + 1 = 2", "x = 1/3 \\approx 0.33", "\\sqrt{2} \\approx 1.41"
    (`pieces`: the sides and the relations between them)."""
    values = [parse_value(p) for p in pieces[::2]]
    ops = pieces[1::2]
    if len(values) == 2 and ops == ["="]:
        if isinstance(values[0], Num) and isinstance(values[1], Num):
            return values[1]  # a computation, "1/2 + 11/18 = 10/9": its result
        return Equation(values[0], values[1])
    start = 1 if is_label(values[0]) else 0
    exact_parts = [v for v, op in zip(values[1:], ops) if op == "="]
    answer = exact_parts[-1] if exact_parts else values[start]
    approx = [v for v, op in zip(values[1:], ops) if op == "\\approx"]
    value = Marked(answer, approx[-1]) if approx and approx[-1] is not answer else answer
    return Equation(values[0], value) if start else value


def _scalar(s: str) -> Value:
    node = parse_expression(s)
    pms = _count(node, "pm")
    if pms:
        if pms > MAX_PM:
            raise Reject("too many \\pm")
        return Unordered(tuple(_to_value(n) for n in _expand_pm(node)))
    if node[0] in ("pct", "deg"):
        return Marked(_to_value(node[1]), _to_value(node))
    return _to_value(node)


def _to_value(node: tuple) -> Value:
    symbols = free_symbols(node)
    if not symbols:
        value = exact(node)
        if value is not None:
            return Num(value, HP.mpf(value.numerator) / value.denominator, _decimal_places(node))
    return Expr(node, frozenset(symbols))


def _decimal_places(node: tuple) -> int | None:
    """The places a decimal is written to: "-2.50" -> 2; "2.3148 \\times 10^{-3}" -> 4 + 3 = 7."""
    if node[0] == "neg":
        return _decimal_places(node[1])
    if node[0] == "n":
        return node[2]
    if node[0] == "*" and node[1][0] == "n" and node[1][2] is not None and node[2][0] == "^" \
            and node[2][1][:2] == ("n", 10):
        power = exact(node[2][2])
        if power is not None and power.denominator == 1:
            return node[1][2] - int(power)
    return None


def _count(node: tuple, op: str) -> int:
    return (node[0] == op) + sum(_count(p, op) for p in node[1:] if isinstance(p, tuple))


def _expand_pm(node: tuple) -> list[tuple]:
    """Every choice of sign: a \\pm b -> a + b, a - b."""
    if node[0] == "pm":
        return [("+", a, x) for a, b in itertools.product(_expand_pm(node[1]), _expand_pm(node[2]))
                for x in (b, ("neg", b))]
    children = [_expand_pm(p) if isinstance(p, tuple) else [p] for p in node[1:]]
    return [(node[0], *combo) for combo in itertools.product(*children)]


_REL = re.compile(r"(\\le|\\ge|<|>|\\ne)")
_FLIP = {"\\le": "\\ge", "\\ge": "\\le", "<": ">", ">": "<", "\\ne": "\\ne"}


def _relation(s: str) -> Value:
    """An inequality (chain) in one variable -> an interval or a union of intervals."""
    pieces = _REL.split(s)
    sides, ops = pieces[::2], pieces[1::2]
    nodes = [parse_expression(p) for p in sides]
    variables = [i for i, n in enumerate(nodes) if _variable(n) is not None]
    if len(variables) != 1 or len(sides) > 3:
        raise Reject("relation")
    k = variables[0]
    sign, abs_value, var = _variable(nodes[k])
    bounds: list[tuple[str, tuple]] = []  # (op, bound) read as "var op bound"
    for j, op in enumerate(ops):
        if j == k - 1:  # bound op var
            bounds.append((_FLIP[op], nodes[j]))
        else:  # var op bound
            bounds.append((op, nodes[j + 1]))
    if sign < 0:  # -x < 2 -> x > -2
        bounds = [(_FLIP[op], ("neg", b)) for op, b in bounds]
    lo, hi = (_NEG_INF, "("), (_INF, ")")
    for op, b in bounds:
        if op == "\\ne":
            if len(bounds) != 1 or abs_value:
                raise Reject("relation")
            v = _to_value(b)
            return Union_((Seq("(", ")", (_NEG_INF, v)), Seq("(", ")", (v, _INF))))
        if op in ("<", "\\le"):
            hi = (_to_value(b), ")" if op == "<" else "]")
        else:
            lo = (_to_value(b), "(" if op == ">" else "[")
    if not abs_value:
        return Seq(lo[1], hi[1], (lo[0], hi[0]))
    flip = {"(": ")", "[": "]", ")": "(", "]": "["}
    negated = lambda v: _to_value(("neg", v.node)) if isinstance(v, Expr) else Num(-v.exact, -v.approx)  # noqa: E731
    if lo[0] is _NEG_INF:  # |x| < b -> (-b, b)
        return Seq(flip[hi[1]], hi[1], (negated(hi[0]), hi[0]))
    if hi[0] is _INF:  # |x| > b -> (-inf, -b) u (b, inf)
        return Union_((Seq("(", flip[lo[1]], (_NEG_INF, negated(lo[0]))), Seq(lo[1], ")", (lo[0], _INF))))
    return Union_((Seq(flip[hi[1]], flip[lo[1]], (negated(hi[0]), negated(lo[0]))), Seq(lo[1], hi[1], (lo[0], hi[0]))))


def _variable(node: tuple) -> tuple[int, bool, str] | None:
    """(sign, under |.|, name) when node is x, -x, |x|; else None."""
    if node[0] == "s" and node[1] not in ("pi", "e", "i"):
        return 1, False, node[1]
    if node[0] == "neg" and node[1][0] == "s":
        return -1, False, node[1][1]
    if node[0] == "abs" and node[1][0] == "s":
        return 1, True, node[1][1]
    return None


def _minus(whole: str, removed: str) -> Value:
    """(-inf, inf) \\setminus \\{a\\} -> (-inf, a) u (a, inf)."""
    base, points = parse_value(whole), parse_value(removed)
    items = points.items if isinstance(points, Unordered) else (points,)
    if not (isinstance(base, Seq) and base.items[0] == _NEG_INF and base.items[1] == _INF) or len(items) != 1:
        raise Reject("setminus")
    return Union_((Seq("(", ")", (_NEG_INF, items[0])), Seq("(", ")", (items[0], _INF))))
