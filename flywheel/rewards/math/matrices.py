"""Matrix expressions: sums, differences, products and scalar multiples of matrix literals,
evaluated entry by entry into one matrix of expression trees (issue 36: an evaluable
expression equals its value, "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix} +
\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}" = "\\begin{pmatrix}6&8\\\\10&12\\end{pmatrix}").

Grammar: [coefficient] M (op [coefficient] M)*, where M is a matrix literal, a product is
two matrices side by side or joined by \\cdot / \\times, and "+" / "-" start a new term. A
coefficient is any expression the parser reads. At most MAX_SIZE rows and columns, and no
entry over the parser's MAX_NODES nodes (products share subtrees, so sizes are counted as
the entries are built, never by walking them).
"""

from __future__ import annotations

import re
from fractions import Fraction

from flywheel.rewards.math.expr import MAX_NODES, Reject, parse_expression

__all__ = ["MATRIX", "MAX_SIZE", "matrix_expression"]

MAX_SIZE = 8
MATRIX = re.compile(r"\\begin\{([pbvBV]?matrix|array)\}(?:\{[^}]*\})?(.*?)\\end\{\1\}", re.S)
_PRODUCT = re.compile(r"\s*(?:\\cdot|\\times|\*)?\s*")


class _Sizes:
    """Tree sizes of the entries built so far (by id: entries share subtrees)."""

    def __init__(self) -> None:
        self.of: dict[int, int] = {}
        self.keep: list[tuple] = []  # keeps the ids valid

    def leaf(self, node: tuple) -> tuple:
        self.of[id(node)] = 1 + sum(self.leaf(p) and self.of[id(p)] for p in node[1:] if isinstance(p, tuple))
        self.keep.append(node)
        return node

    def join(self, op: str, a: tuple, b: tuple) -> tuple:
        size = 1 + self.of[id(a)] + self.of[id(b)]
        if size > MAX_NODES:
            raise Reject("too_big")
        node = (op, a, b)
        self.of[id(node)] = size
        self.keep.append(node)
        return node


def _literal(body: str, sizes: _Sizes) -> list[list[tuple]]:
    rows = [r for r in re.split(r"\\\\", body) if r.strip()]
    if len(rows) > MAX_SIZE:
        raise Reject("matrix shape")
    cells = [[sizes.leaf(parse_expression(c)) for c in r.split("&")] for r in rows]
    if not cells or len({len(r) for r in cells}) != 1 or len(cells[0]) > MAX_SIZE:
        raise Reject("matrix shape")
    return cells


def _times(a: list[list[tuple]], b: list[list[tuple]], sizes: _Sizes) -> list[list[tuple]]:
    if len(a[0]) != len(b):
        raise Reject("matrix shapes")
    out = []
    for row in a:
        out_row = []
        for j in range(len(b[0])):
            total = sizes.join("*", row[0], b[0][j])
            for k in range(1, len(b)):
                total = sizes.join("+", total, sizes.join("*", row[k], b[k][j]))
            out_row.append(total)
        out.append(out_row)
    return out


def _scaled(c: tuple | None, m: list[list[tuple]], sizes: _Sizes) -> list[list[tuple]]:
    return m if c is None else [[sizes.join("*", c, x) for x in row] for row in m]


def matrix_expression(s: str) -> list[list[tuple]] | None:
    """The entries (expression trees) of a matrix expression with two or more matrices or a
    coefficient, or None when s is not one (a lone literal is left to the caller)."""
    literals = list(MATRIX.finditer(s))
    if not literals or s[literals[-1].end() :].strip() or (len(literals) == 1 and not s[: literals[0].start()].strip()):
        return None
    sizes = _Sizes()
    total = None
    term = None
    previous = 0
    for m in literals:
        glue = s[previous : m.start()].strip()
        sign = ""
        if term is not None and glue[:1] in "+-" and glue:
            sign, glue = glue[0], glue[1:].strip()
            total = term if total is None else _add(total, term, sizes)
            term = None
        elif term is None and glue[:1] == "-":
            sign, glue = "-", glue[1:].strip()
        coefficient = None
        if glue and not _PRODUCT.fullmatch(glue):
            coefficient = sizes.leaf(parse_expression(re.sub(r"(?:\\cdot|\\times|\*)\s*$", "", glue)))
        if sign == "-":
            coefficient = sizes.leaf(("neg", coefficient if coefficient is not None else ("n", Fraction(1), None)))
        matrix = _scaled(coefficient, _literal(m.group(2), sizes), sizes)
        if term is None:
            term = matrix
        elif coefficient is None:
            term = _times(term, matrix, sizes)
        else:
            raise Reject("coefficient between matrices")
        previous = m.end()
    return term if total is None else _add(total, term, sizes)


def _add(a: list[list[tuple]], b: list[list[tuple]], sizes: _Sizes) -> list[list[tuple]]:
    if len(a) != len(b) or len(a[0]) != len(b[0]):
        raise Reject("matrix shapes")
    return [[sizes.join("+", x, y) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]
