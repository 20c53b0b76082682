"""Exact zero-equivalence of two rational expressions with sympy, on trees built by
flywheel's own parser (never sympify / parse_expr of text).

sympy operations cannot be interrupted, so they only ever run on inputs whose cost is
bounded beforehand: at most MAX_NODES nodes, MAX_SYMBOLS free symbols, integer exponents
of at most MAX_EXPONENT, and a total polynomial degree of at most MAX_DEGREE -- so the
expanded numerator has at most C(MAX_DEGREE + MAX_SYMBOLS, MAX_SYMBOLS) terms (969).
Anything else (radicals, trig, logs) is left to the numeric comparison.
"""

from __future__ import annotations

import sympy

__all__ = ["rational_difference_is_zero"]

MAX_NODES = 120
MAX_SYMBOLS = 3
MAX_EXPONENT = 16
MAX_DEGREE = 16


def _degree(node: tuple) -> int | None:
    """An upper bound on the polynomial degree of node's numerator and denominator, or None
    when node is not a small rational expression in its symbols."""
    op = node[0]
    if op == "n":
        return 0
    if op == "s":
        return 1 if node[1] != "i" else 0
    if op == "neg":
        return _degree(node[1])
    if op in ("+", "*", "/"):
        a, b = _degree(node[1]), _degree(node[2])
        if a is None or b is None:
            return None
        return max(a, b) * 2 if op == "/" else (a + b if op == "*" else max(a, b))
    if op == "^" and node[2][0] == "n" and node[2][1].denominator == 1 and abs(node[2][1]) <= MAX_EXPONENT:
        a = _degree(node[1])
        return None if a is None else a * abs(int(node[2][1]))
    return None


def _size(node: tuple) -> int:
    return 1 + sum(_size(p) for p in node[1:] if isinstance(p, tuple))


def _to_sympy(node: tuple, symbols: dict[str, sympy.Symbol]):
    op = node[0]
    if op == "n":
        return sympy.Rational(node[1].numerator, node[1].denominator)
    if op == "s":
        if node[1] == "i":
            return sympy.I
        return symbols.setdefault(node[1], sympy.Symbol(node[1]))
    if op == "neg":
        return -_to_sympy(node[1], symbols)
    a, b = _to_sympy(node[1], symbols), _to_sympy(node[2], symbols)
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    return a ** b  # "^" with a small integer exponent (checked by _degree)


def rational_difference_is_zero(a: tuple, b: tuple, symbols: frozenset) -> bool | None:
    """True / False when a - b is provably (not) identically zero as a rational function,
    None when the pair is outside the bounds above (the caller decides numerically)."""
    if len(symbols) > MAX_SYMBOLS or _size(a) + _size(b) > MAX_NODES:
        return None
    da, db = _degree(a), _degree(b)
    if da is None or db is None or da + db > MAX_DEGREE:
        return None
    table: dict[str, sympy.Symbol] = {}
    try:
        difference = _to_sympy(a, table) - _to_sympy(b, table)
        numerator, _ = sympy.fraction(sympy.together(difference))
        return sympy.expand(numerator) == 0
    except (ZeroDivisionError, ValueError, TypeError):
        return None
