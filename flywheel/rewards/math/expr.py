"""Stage 3a: a bounded recursive-descent parser from one normalised LaTeX expression to a
tree of tuples. The tree, never the raw text, is what later stages evaluate or hand to
sympy, so model output can only ever name the operations listed here.

Nodes: ("n", Fraction, decimals|None) | ("s", name) | ("+", a, b) | ("neg", a) | ("*", a, b)
| ("/", a, b) | ("^", a, b) | ("f", name, a) | ("log", base, a) | ("root", a, n) | ("inf",)
| ("abs", a) | ("fact", a) | ("floor", a) | ("ceil", a) | ("binom", n, k) | ("pm", a, b)
| ("pct", a) | ("deg", a) | ("int", var, lo, hi, body) | ("sum" | "prod", var, lo, hi, body).

Budgets: nesting depth (MAX_DEPTH) and node count (MAX_NODES); numbers with an exponent
over 10^4 digits are rejected.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MAX_DEPTH", "MAX_NODES", "Reject", "FUNCS", "parse_expression"]

MAX_DEPTH = 60
MAX_NODES = 2_000


class Reject(Exception):
    """The text is not an expression this parser reads, or it is over a budget."""


_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|(?P<cmd>\\[a-zA-Z]+|\\[{}|%])"
    r"|(?P<op>[-+*/^_(){}\[\],=!|<>:;'%]|\\\\|&)|(?P<name>[a-zA-Z])|(?P<other>\S))"
)
FUNCS = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log",
         "ln", "exp", "lg", "sgn"}
_GREEK = {"alpha", "beta", "gamma", "delta", "theta", "lambda", "mu", "phi", "omega", "sigma", "tau", "rho",
          "epsilon", "varepsilon", "varphi", "psi", "eta", "xi", "zeta", "kappa", "nu", "chi", "vartheta",
          "Delta", "Gamma", "Omega", "Phi", "Lambda", "Sigma", "Theta"}
_FACTOR_COMMANDS = {"frac", "sqrt", "binom", "pi", "infty", "int", "lfloor", "lceil", "sum", "prod"}


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


def parse_expression(text: str) -> tuple:
    """The tree of `text`; raises Reject when it is not one whole expression."""
    parser = _Parser(text)
    node = parser.expr()
    if parser.peek() is not None:
        raise Reject(f"trailing {parser.peek()[1]!r}")
    return node


class _Parser:
    def __init__(self, text: str) -> None:
        self.t = _tokens(text)
        self.i = 0
        self.end = len(self.t)
        self.depth = 0
        self.nodes = 0
        self.last_was_frac = False
        self.depth_in_abs = 0

    def peek(self, k: int = 0) -> tuple[str, str] | None:
        return self.t[self.i + k] if self.i + k < self.end else None

    def at(self, value: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[1] == value

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise Reject("end")
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        if self.take()[1] != value:
            raise Reject(f"expected {value}")

    def node(self, *parts) -> tuple:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise Reject("too_big")
        return parts

    def nested(self, parse):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Reject("too_deep")
        out = parse()
        self.depth -= 1
        return out

    # expr := term (('+' | '-' | '\pm' | '\mp') term)*
    def expr(self) -> tuple:
        return self.nested(self._expr)

    def _expr(self) -> tuple:
        left = self.term()
        while (tok := self.peek()) and tok[1] in ("+", "-", "\\pm", "\\mp"):
            self.take()
            right = self.term()
            if tok[1] in ("\\pm", "\\mp"):
                left = self.node("pm", left, right)
            else:
                left = self.node("+", left, right if tok[1] == "+" else self.node("neg", right))
        return left

    def term(self) -> tuple:
        left = self.unary()
        while (tok := self.peek()) is not None:
            if tok[1] in ("\\%", "%"):  # a percent applies to the whole term: 33\frac{1}{3}\%
                self.take()
                left = self.node("pct", left)
            elif tok[1] in ("*", "\\cdot", "\\times"):
                self.take()
                left = self.node("*", left, self.unary())
            elif tok[1] in ("/", "\\div", ":"):
                self.take()
                left = self.node("/", left, self.unary())
            elif self.starts_factor(tok):  # implicit product: 2x, 2\sqrt{3}, (a)(b)
                if tok[0] == "num" and (left[0] == "n" and self.t[self.i - 1][0] == "num" or self.t[self.i - 1][0] == "name"):
                    raise Reject("a number after a number or a letter")  # "1 2 3" is a list; "x2", "v0" no products
                right = self.unary()
                whole = left[1] if left[0] == "neg" else left
                if (self.last_was_frac and right[0] == "/" and right[1][0] == "n" and right[2][0] == "n"
                        and whole[0] == "n" and whole[2] is None and whole[1].denominator == 1):
                    mixed = self.node("+", whole, right)  # a mixed number: 3\frac{1}{2} = 7/2
                    left = self.node("neg", mixed) if left[0] == "neg" else mixed
                else:
                    left = self.node("*", left, right)
            else:
                return left
        return left

    def starts_factor(self, tok) -> bool:
        kind, value = tok
        if kind in ("num", "name"):
            return True
        if kind == "cmd":
            return value[1:] in _FACTOR_COMMANDS or value[1:] in FUNCS or value[1:] in _GREEK
        return value in ("(", "|") and not (value == "|" and self.depth_in_abs)  # inside |..| a "|" closes

    def unary(self) -> tuple:
        tok = self.peek()
        if tok and tok[1] in "+-" and self.peek(1) and self.peek(1)[1] in "+-" and self.peek(2) \
                and self.peek(2)[1] in "+-":
            raise Reject("a run of signs")  # "------12" is a rule line, not -(-(...12))
        if tok and tok[1] == "-":
            self.take()
            return self.node("neg", self.nested(self.unary))
        if tok and tok[1] == "+":
            self.take()
            return self.nested(self.unary)
        if tok and tok[1] in ("\\pm", "\\mp"):
            self.take()
            return self.node("pm", ("n", Fraction(0), None), self.nested(self.unary))
        return self.power()

    def power(self) -> tuple:
        base = self.postfix()
        while self.at("^"):
            self.take()
            if self.at("\\circ") or (self.at("{") and self.peek(1) == ("cmd", "\\circ")):
                braced = self.take()[1] == "{"
                if braced:
                    self.take()
                    self.expect("}")
                base = self.node("deg", base)
                continue
            base = self.node("^", base, self.nested(self.group_or_atom))
        return self.postfixes(base)

    def postfix(self) -> tuple:
        return self.postfixes(self.atom())

    def postfixes(self, a: tuple) -> tuple:
        while (tok := self.peek()) and tok[1] in ("!", "'"):
            self.take()
            if tok[1] == "!":
                a = self.node("fact", a)
            else:
                a = self.node("s", f"{a[1]}'") if a[0] == "s" else a
        return a

    def group_or_atom(self) -> tuple:
        if self.at("{"):
            self.take()
            inner = self.expr()
            self.expect("}")
            return inner
        if self.at("-"):
            self.take()
            return self.node("neg", self.group_or_atom())
        return self.atom()

    def digit_argument(self) -> tuple:
        """An argument of \\frac / \\binom; in "\\frac12" a bare digit is one argument."""
        tok = self.peek()
        if tok and tok[0] == "num" and tok[1].isdigit() and len(tok[1]) > 1:
            self.t[self.i] = ("num", tok[1][1:])
            return self.number(tok[1][0])
        return self.nested(self.group_or_atom)

    def function_argument(self) -> tuple:
        """\\sin(x), \\sin{x}, or brace-less: a run of factors ("\\sin 2x", "\\sin 30^\\circ"),
        stopping at the next function ("\\sin x \\cos x")."""
        if self.at("(") or self.at("{"):
            return self.power()
        arg = self.power()
        while (tok := self.peek()) and self.starts_factor(tok) and tok[1] != "(" \
                and not (tok[0] == "cmd" and (tok[1][1:] in FUNCS or tok[1] in ("\\frac", "\\int", "\\binom"))):
            arg = self.node("*", arg, self.power())
        return arg

    def atom(self) -> tuple:
        self.last_was_frac = False
        kind, value = self.take()
        if kind == "num":
            return self.number(value)
        if kind == "name":
            return self.subscripted(value)
        if value in ("(", "[", "{"):
            inner = self.expr()
            closing = self.take()[1]
            if closing not in (")", "]", "}"):
                raise Reject("bracket")
            return inner
        if value == "|":
            self.depth_in_abs += 1
            inner = self.expr()
            self.depth_in_abs -= 1
            self.expect("|")
            return self.node("abs", inner)
        if kind == "cmd":
            return self.command(value[1:])
        raise Reject(f"token {value!r}")

    def command(self, name: str) -> tuple:
        if name == "frac":
            num, den = self.digit_argument(), self.digit_argument()
            self.last_was_frac = True
            return self.node("/", num, den)
        if name == "binom":
            return self.node("binom", self.digit_argument(), self.digit_argument())
        if name == "sqrt":
            index = ("n", Fraction(2), None)
            if self.at("["):
                self.take()
                index = self.expr()
                self.expect("]")
            return self.node("root", self.digit_argument(), index)
        if name in ("lfloor", "lceil"):
            inner = self.expr()
            self.expect("\\r" + name[1:])
            return self.node(name[1:], inner)
        if name == "pi":
            return self.node("s", "pi")
        if name == "infty":
            return self.node("inf")
        if name in _GREEK:
            return self.node("s", name)
        if name == "int":
            return self.integral()
        if name in ("sum", "prod"):
            return self.big_operator(name)
        if name in FUNCS:
            base = None
            if name == "log" and self.at("_"):
                self.take()
                base = self.nested(self.group_or_atom)
            power = None
            if self.at("^"):
                self.take()
                power = self.nested(self.group_or_atom)
            argument = self.nested(self.function_argument)
            out = self.node("log", base, argument) if base is not None else self.node("f", name, argument)
            return self.node("^", out, power) if power is not None else out
        raise Reject(f"command \\{name}")

    def integral(self) -> tuple:
        """\\int_a^b f(x) dx with numeric bounds: the integrand ends at "d<variable>"."""
        lo = hi = None
        for _ in range(2):
            if self.at("_"):
                self.take()
                lo = self.nested(self.group_or_atom)
            elif self.at("^"):
                self.take()
                hi = self.nested(self.group_or_atom)
        if lo is None or hi is None:
            raise Reject("indefinite integral")
        stop = next((j for j in range(self.i, self.end - 1)
                     if self.t[j] == ("name", "d") and self.t[j + 1][0] == "name"), None)
        if stop is None:
            raise Reject("no differential")
        saved, self.end = self.end, stop
        body = self.expr()
        if self.i != stop:
            raise Reject("integrand")
        self.end = saved
        self.take()
        var = self.take()[1]
        return self.node("int", var, lo, hi, body)

    def big_operator(self, name: str) -> tuple:
        """\\sum_{k=a}^{b} body / \\prod_{k=a}^{b} body: the body is the product term that
        follows ("\\sum_{k=1}^{n} k^2 + 1" adds 1 to the sum)."""
        var = lo = hi = None
        for _ in range(2):
            if self.at("_"):
                self.take()
                self.expect("{")
                var = self.take()
                if var[0] != "name":
                    raise Reject("index")
                self.expect("=")
                lo = self.expr()
                self.expect("}")
            elif self.at("^"):
                self.take()
                hi = self.nested(self.group_or_atom)
        if var is None or hi is None:
            raise Reject("sum bounds")
        return self.node(name, var[1], lo, hi, self.nested(self.term))

    def subscripted(self, name: str) -> tuple:
        if self.at("_"):
            self.take()
            sub = self.take()[1]
            if sub == "{":
                parts = []
                while self.peek() and not self.at("}"):
                    parts.append(self.take()[1])
                self.expect("}")
                sub = "".join(parts)
            name = f"{name}_{sub}"
        return self.node("s", name)

    def number(self, text: str) -> tuple:
        if "e" in text.lower():
            mantissa, _, exponent = text.lower().partition("e")
            if abs(int(exponent)) > 10_000:
                raise Reject("too_big")
            return self.node("n", Fraction(mantissa) * Fraction(10) ** int(exponent), None)
        if self.at("\\overline") and "." in text:  # a repeating decimal: 0.1\overline{6} = 1/6
            self.take()
            if self.at("{"):
                self.take()
                digits = self.take()[1]
                self.expect("}")
            else:
                digits = self.take()[1][:1]
            if not digits.isdigit() or len(digits) > 50:
                raise Reject("overline")
            fixed = text.split(".")[1]
            head = Fraction(text if not text.endswith(".") else text[:-1])
            period = Fraction(int(digits), 10 ** len(fixed) * (10 ** len(digits) - 1))
            return self.node("n", head + period, None)
        decimals = len(text.split(".")[1]) if "." in text else None
        return self.node("n", Fraction(text), decimals or None)
