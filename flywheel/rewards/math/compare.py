"""Stage 4: equality of two parsed answers (gold first, prediction second).

- numbers: exact rational equality; otherwise a decimal states its precision (issue 36): it
  stands for a value when it states at least MIN_SIGNIFICANT (6) significant digits and lies
  less than one unit of its last place from it (rounded or cut off), the coarser decimal's
  when both sides are decimals. So 0.333333 = 1/3, 0.666667 = 2/3, 1.4142135623730951 =
  \\sqrt{2}; but 0.33 != 1/3 and 3.14 != \\pi (too few digits to name the value), and
  16386.17 != 16386.16 (a whole unit of the last place apart);
- expressions: exact rational-function identity with sympy when small (symbolic.py), else
  the value at the same random points for every free symbol (40 digits, relative 1e-15;
  never an absolute tolerance, so 1/2004! != 1/2006! and e^{-100} != e^{-101}: a value
  below 1e-30 is zero only when it shrinks at twice the precision, as rounding residue does);
- % and degrees: 25\\% equals 25 and 0.25; 60^\\circ equals 60 and \\pi/3;
- equations: lhs - rhs of one is a constant non-zero multiple of the other's; a labelled
  answer ("x = 5", "(p, q) = (3, 2)", "AB = 4") equals its bare value;
- tuples are ordered and intervals keep their brackets; sets, lists and unions of
  intervals are unordered (a list of intervals equals their union); a one-column or
  one-row matrix equals the tuple (or [list]) of its entries; a one-element set equals its element.
"""

from __future__ import annotations

import random
from fractions import Fraction

from flywheel.rewards.math.evaluate import HP, NUMERIC_DPS, Budget, numeric
from flywheel.rewards.math.expr import Reject
from flywheel.rewards.math.symbolic import rational_difference_is_zero
from flywheel.rewards.math.values import (Choice, Equation, Expr, Marked, Matrix, Num, Seq, Union_, Unordered,
                                          Value, is_label)

__all__ = ["answers_equal", "MIN_SIGNIFICANT"]

MIN_SIGNIFICANT = 6
"""Significant digits a decimal must state to stand for a value it does not equal exactly:
printf's %g default, and about one part in 10^5 -- a wrong value in that neighbourhood is
an unlikely accident. Fewer digits (0.33 for 1/3) are a rounding the problem did not ask for."""
EXPR_TOL = 1e-15
ZERO = 10**-30
"""Below this a value may be 40-digit rounding residue of a zero; `_vanishes` decides."""
SAMPLE_POINTS = 3
_ERRORS = (ZeroDivisionError, ValueError, OverflowError, TypeError, KeyError, ArithmeticError)


def answers_equal(gold: Value, pred: Value, budget: Budget | None = None) -> bool:
    """Equality of two parsed answers (see the module docstring)."""
    budget = budget or Budget()
    budget.tick()
    if isinstance(gold, Marked):
        return answers_equal(gold.plain, pred, budget) or answers_equal(gold.scaled, pred, budget)
    if isinstance(pred, Marked):
        return answers_equal(gold, pred.plain, budget) or answers_equal(gold, pred.scaled, budget)
    if isinstance(gold, (Num, Expr)) and isinstance(pred, (Num, Expr)):
        return _scalar_equal(gold, pred, budget)
    if isinstance(gold, Equation) and isinstance(pred, Equation):
        return _equation_equal(gold, pred, budget)
    if isinstance(gold, Equation) and is_label(gold.lhs):
        return answers_equal(gold.rhs, pred, budget)  # gold "x = 3", prediction "3"
    if isinstance(pred, Equation) and is_label(pred.lhs):
        return answers_equal(gold, pred.rhs, budget)  # prediction "x = 3", gold "3"
    if isinstance(gold, Choice) or isinstance(pred, Choice):
        return isinstance(gold, Choice) and isinstance(pred, Choice) and gold.letter == pred.letter
    for one, other in ((gold, pred), (pred, gold)):
        if isinstance(one, Seq) and isinstance(other, Unordered) and all(
                isinstance(x, Equation) and is_label(x.lhs) for x in other.items):
            other = Seq(one.open, one.close, tuple(x.rhs for x in other.items))  # "x = 1, y = 2" vs (1, 2)
            return answers_equal(*((one, other) if one is gold else (other, one)), budget)
        if isinstance(one, Seq) and (one.open, one.close) == ("(", ")") and isinstance(other, Unordered):
            return _pairwise(one.items, other.items, budget)  # a pair written without its parentheses, in order
    if isinstance(gold, Seq) and isinstance(pred, Seq):
        return (gold.open, gold.close) == (pred.open, pred.close) and _pairwise(gold.items, pred.items, budget)
    if isinstance(gold, (Unordered, Union_)) and isinstance(pred, (Unordered, Union_)):
        return _same_set(_members(gold), _members(pred), budget)
    if isinstance(gold, Matrix) and isinstance(pred, Matrix):
        return len(gold.rows) == len(pred.rows) and all(
            _pairwise(r, s, budget) for r, s in zip(gold.rows, pred.rows))
    if isinstance(gold, Matrix) or isinstance(pred, Matrix):
        matrix, other = (gold, pred) if isinstance(gold, Matrix) else (pred, gold)
        entries = _vector(matrix)
        if entries is None or not isinstance(other, Seq) or (other.open + other.close) not in ("()", "[]"):
            return False
        return _pairwise(entries, other.items, budget) if matrix is gold else _pairwise(other.items, entries, budget)
    for one, other, flip in ((gold, pred, False), (pred, gold, True)):
        members = _distinct(_members(one), budget) if isinstance(one, (Unordered, Union_)) else None
        if members is not None and len(members) == 1:  # "\{3\}" vs "3", "4, 4, 4" vs "4"
            return answers_equal(other, members[0], budget) if flip else answers_equal(members[0], other, budget)
    return False


def _members(v: Value) -> tuple:
    return v.items if isinstance(v, Unordered) else v.parts


def _distinct(items: tuple, budget: Budget) -> tuple:
    """The members of a set, each once (a set written with a member repeated is that set)."""
    out: list = []
    for x in items[:64]:
        if not any(answers_equal(x, y, budget) for y in out):
            out.append(x)
    return tuple(out) + items[64:]


def _vector(m: Matrix) -> tuple | None:
    if all(len(r) == 1 for r in m.rows):
        return tuple(r[0] for r in m.rows)
    if len(m.rows) == 1:
        return m.rows[0]
    return None


def _pairwise(xs: tuple, ys: tuple, budget: Budget) -> bool:
    return len(xs) == len(ys) and all(answers_equal(x, y, budget) for x, y in zip(xs, ys))


def _same_set(xs: tuple, ys: tuple, budget: Budget) -> bool:
    """Every member of each side equals a member of the other (a repeated member counts once)."""
    return all(any(answers_equal(x, y, budget) for y in ys) for x in xs) and all(
        any(answers_equal(x, y, budget) for x in xs) for y in ys)


def _as_node(v: Num | Expr) -> tuple:
    if isinstance(v, Expr):
        return v.node
    if v.exact is not None:
        return ("n", v.exact, v.decimal_places)
    raise Reject("inexact number")


def _scalar_equal(gold: Num | Expr, pred: Num | Expr, budget: Budget) -> bool:
    if isinstance(gold, Num) and isinstance(pred, Num) and gold.exact is not None and pred.exact is not None:
        if gold.exact == pred.exact:
            return True
        if gold.decimal_places is None and pred.decimal_places is None:
            return False
    decimals = [v for v in (gold, pred) if isinstance(v, Num) and v.decimal_places is not None]
    symbols = (gold.symbols if isinstance(gold, Expr) else frozenset()) | (
        pred.symbols if isinstance(pred, Expr) else frozenset())
    if decimals:
        coarse = min(decimals, key=lambda v: v.decimal_places)
        if symbols or _significant(coarse) < MIN_SIGNIFICANT:
            return False
        if isinstance(gold, Num) and isinstance(pred, Num) and gold.exact is not None and pred.exact is not None:
            return abs(gold.exact - pred.exact) < Fraction(10) ** -coarse.decimal_places  # exact: 0.01 is one unit
        return _decimal_close(_value(gold, budget), _value(pred, budget), coarse.decimal_places)
    try:
        a, b = _as_node(gold), _as_node(pred)
    except Reject:
        return _close(_value(gold, budget), _value(pred, budget), EXPR_TOL)
    if _canonical(a) == _canonical(b):
        return True  # the same up to the order of sums and products: "F_k F_{n-k-1}" = "F_{n-k-1} F_k"
    exact = rational_difference_is_zero(a, b, symbols)
    if exact is not None:
        return exact
    if _numerically_equal(a, b, symbols, budget):
        return True
    # \log without a base is ln in analysis and log10 in contest problems: either reading.
    return (_has_log(a) or _has_log(b)) and _numerically_equal(_log10(a), _log10(b), symbols, budget)


def _canonical(node):
    """node with the operands of every sum and product flattened and sorted: equal
    canonical forms are equal values (addition and multiplication of scalars commute)."""
    if not isinstance(node, tuple):
        return node
    if node[0] in ("+", "*"):
        parts: list = []
        stack = [node[1], node[2]]
        while stack:
            part = stack.pop()
            if part[0] == node[0]:
                stack.extend((part[1], part[2]))
            else:
                parts.append(_canonical(part))
        return (node[0], *sorted(parts, key=repr))
    return tuple(_canonical(p) for p in node)


def _numerically_equal(a: tuple, b: tuple, symbols: frozenset, budget: Budget) -> bool:
    for env in _points(symbols) if symbols else [{}]:
        try:
            x, y = numeric(a, env, budget), numeric(b, env, budget)
        except _ERRORS:
            return False
        if abs(x) < ZERO or abs(y) < ZERO:  # a zero, or a genuinely tiny value?
            zero_x = abs(x) < ZERO and _vanishes(a, env, budget, x)
            zero_y = abs(y) < ZERO and _vanishes(b, env, budget, y)
            if zero_x or zero_y:
                if not (zero_x and zero_y):
                    return False
                continue
        if not _close(x, y, EXPR_TOL):
            return False
    return True


def _has_log(node: tuple) -> bool:
    return node[:2] == ("f", "log") or any(_has_log(p) for p in node[1:] if isinstance(p, tuple))


def _log10(node: tuple) -> tuple:
    if node[:2] == ("f", "log"):
        return ("f", "lg", _log10(node[2]))
    return tuple(_log10(p) if isinstance(p, tuple) else p for p in node)


def _value(v: Num | Expr, budget: Budget):
    if isinstance(v, Num):
        return v.approx
    return numeric(v.node, {}, budget)


def _significant(v: Num) -> int:
    """The significant digits a decimal is written with: 0.333333 -> 6, 2.50 -> 3,
    2.3148 \\times 10^{-3} -> 5."""
    digits = abs(v.exact * Fraction(10) ** v.decimal_places)
    return len(str(round(digits))) if digits else 1


def _decimal_close(x, y, places: int) -> bool:
    """Less than one unit of the coarser decimal's last place apart (gold 2/3 vs 0.666666667:
    yes; \\sqrt{2} vs the float 1.4142135623730951: yes)."""
    if HP.isinf(x) or HP.isinf(y) or HP.isnan(x) or HP.isnan(y):
        return False
    return abs(x - y) < HP.mpf(10) ** (-places)


def _close(a, b, rel) -> bool:
    if a == b:
        return True
    if HP.isinf(a) or HP.isinf(b) or HP.isnan(a) or HP.isnan(b):
        return False
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _vanishes(node: tuple, env: dict, budget: Budget, value) -> bool:
    """Is a value below ZERO a true zero? Evaluated again at twice the working precision, a
    zero's rounding residue shrinks (sin(pi): 1e-40 -> 1e-80) while a tiny value stays
    itself (1/2004!, e^{-100})."""
    with HP.workdps(2 * NUMERIC_DPS):
        again = numeric(node, env, budget)
    return again == 0 or abs(again) < abs(value) * HP.mpf(10) ** (-NUMERIC_DPS // 2)


def _points(symbols: frozenset) -> list[dict[str, object]]:
    """The same points for both sides: seeded by the symbol names, never by global state."""
    rng = random.Random(f"points:{sorted(symbols)}")
    return [{s: HP.mpf(rng.uniform(0.3, 2.7)) for s in symbols} for _ in range(SAMPLE_POINTS)]


def _equation_equal(a: Equation, b: Equation, budget: Budget) -> bool:
    """Same equation: lhs - rhs of one is a non-zero constant multiple of the other's."""
    lone = [v.node[1] for v in (a.lhs, b.lhs) if isinstance(v, Expr) and v.node[0] == "s"]
    if is_label(a.lhs) and is_label(b.lhs) and not (len(lone) == 2 and lone[0] != lone[1]):
        # "f(x) = 2x + 3" vs "y = 2x + 3": the labels name the same answer. Two different
        # lone variables are compared as equations below ("a = 2" is not "b = 2"; "a = b" is "b = a").
        if isinstance(a.lhs, Seq) or isinstance(b.lhs, Seq):
            return answers_equal(a.lhs, b.lhs, budget) and answers_equal(a.rhs, b.rhs, budget)
        return answers_equal(a.rhs, b.rhs, budget)
    sides = (a.lhs, a.rhs, b.lhs, b.rhs)
    if not all(isinstance(v, (Num, Expr)) for v in sides):
        return False
    try:
        fa = ("+", _as_node(a.lhs), ("neg", _as_node(a.rhs)))
        fb = ("+", _as_node(b.lhs), ("neg", _as_node(b.rhs)))
    except Reject:
        return False
    symbols = frozenset().union(*(v.symbols for v in sides if isinstance(v, Expr)))
    ratio, tiny = None, HP.mpf(10) ** -25
    for env in _points(symbols) if symbols else [{}]:
        try:
            x, y = numeric(fa, env, budget), numeric(fb, env, budget)
        except _ERRORS:
            return False
        if abs(y) < tiny or abs(x) < tiny:
            if not (abs(x) < tiny and abs(y) < tiny):
                return False
            continue
        if ratio is None:
            ratio = x / y
        elif not _close(x / y, ratio, EXPR_TOL):
            return False
    return True
