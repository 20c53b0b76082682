"""Stage 3b: values of expression trees, exactly (fractions.Fraction) or numerically (a
private mpmath context), under a work budget.

The budget (`Budget`) counts evaluation steps and checks a deadline in the thread's CPU time
every 256 steps; every node evaluated costs one step. It is a plain object passed down the
calls, so it holds in threads and dataloader worker processes (signals do not). Single
operations are bounded before they run: exact powers by the bits of their result,
floating powers by the size of their exponent, factorials by their argument, integrals by
the number of points at which the integrand is evaluated.

The numeric context is private to each thread (mpmath's global `mp.dps` is shared by every
library; a shared private one would still race on mpmath's own temporary precision
changes), so a verdict never depends on another thread.
"""

from __future__ import annotations

import math
import threading
import time
from fractions import Fraction

import mpmath

from flywheel.rewards.math.expr import Reject

__all__ = ["HP", "Budget", "CONSTANTS", "free_symbols", "exact", "numeric"]

NUMERIC_DPS = 40


class _ThreadContext:
    """The numeric context of the calling thread, fixed at NUMERIC_DPS digits. mpmath
    functions raise and restore their context's precision while they run (quad, gamma,
    binomial use workprec), so one context shared by threads would let a thread compute
    at another's temporary precision; mpmath's global `mp` is shared with every library."""

    _local = threading.local()

    def __getattr__(self, name: str):
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = mpmath.MPContext()
            ctx.dps = NUMERIC_DPS
        return getattr(ctx, name)


HP = _ThreadContext()
MAX_EXACT_BITS = 4_096
"""Largest numerator/denominator kept exact; beyond it a value is carried in floating point."""
MAX_FLOAT_EXPONENT_BITS = 10**6
MAX_FACTORIAL = 10**5
CONSTANTS = {"pi", "e", "i"}
"""Symbols read as constants: pi, Euler's e, the imaginary unit."""


class Budget:
    """Steps left and a deadline in this thread's CPU time (time.thread_time(): other threads'
    work does not count, so a verdict does not depend on how busy the process is); `tick`
    raises Reject("budget") past either, checking the clock every 256 steps."""

    def __init__(self, steps: int = 200_000, seconds: float = 0.5) -> None:
        self.steps = steps
        self.deadline = time.thread_time() + seconds

    def tick(self, cost: int = 1) -> None:
        self.steps -= cost
        if self.steps < 0 or (self.steps & 255) < cost and time.thread_time() > self.deadline:
            raise Reject("budget")


def free_symbols(node: tuple) -> set[str]:
    if node[0] == "s":
        return set() if node[1] in CONSTANTS else {node[1]}
    if node[0] in ("int", "sum", "prod"):
        return (free_symbols(node[4]) - {node[1]}) | free_symbols(node[2]) | free_symbols(node[3])
    out: set[str] = set()
    for part in node[1:]:
        if isinstance(part, tuple):
            out |= free_symbols(part)
    return out


def _small(x: Fraction) -> bool:
    return max(x.numerator.bit_length(), x.denominator.bit_length()) <= MAX_EXACT_BITS


def exact(node: tuple) -> Fraction | None:
    """The exact rational value, or None (irrational, symbolic, or too big to keep exact)."""
    op = node[0]
    if op == "n":
        return node[1]
    if op in ("neg", "abs", "pct", "floor", "ceil"):
        a = exact(node[1])
        if a is None:
            return None
        return {"neg": lambda: -a, "abs": lambda: abs(a), "pct": lambda: a / 100,
                "floor": lambda: Fraction(math.floor(a)), "ceil": lambda: Fraction(math.ceil(a))}[op]()
    if op in ("+", "*", "/"):
        a, b = exact(node[1]), exact(node[2])
        if a is None or b is None:
            return None
        if op == "/" and b == 0:
            raise Reject("division by zero")
        out = a + b if op == "+" else a * b if op == "*" else a / b
        return out if _small(out) else None
    if op == "^":
        a, b = exact(node[1]), exact(node[2])
        if a is None or b is None or b.denominator != 1:
            return None
        if max(a.numerator.bit_length(), a.denominator.bit_length()) * abs(b.numerator) > MAX_EXACT_BITS:
            return None
        if a == 0 and b < 0:
            raise Reject("division by zero")
        return a ** int(b)
    if op == "fact":
        a = exact(node[1])
        if a is None or a.denominator != 1 or not 0 <= a <= 300:
            return None
        return Fraction(math.factorial(int(a)))
    if op == "binom":
        n, k = exact(node[1]), exact(node[2])
        if n is None or k is None or n.denominator != 1 or k.denominator != 1 or not 0 <= n <= 2_000:
            return None
        return Fraction(math.comb(int(n), int(k))) if k >= 0 else Fraction(0)
    if op == "root":
        a, n = exact(node[1]), exact(node[2])
        if a is None or n is None or n.denominator != 1 or not 2 <= n <= 64 or a < 0 and n % 2 == 0:
            return None
        sign, a = (-1 if a < 0 else 1), abs(a)
        p, q = _int_root(a.numerator, int(n)), _int_root(a.denominator, int(n))
        return None if p is None or q is None else Fraction(sign * p, q)
    return None


def _int_root(x: int, n: int) -> int | None:
    if x.bit_length() > MAX_EXACT_BITS:
        return None
    r = round(x ** (1.0 / n)) if x.bit_length() < 1000 else None
    if r is None:
        return None
    for c in (r - 1, r, r + 1):
        if c >= 0 and c**n == x:
            return c
    return None


_FUNCTIONS = {"sin": "sin", "cos": "cos", "tan": "tan", "sec": "sec", "csc": "csc", "cot": "cot", "arcsin": "asin",
              "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "ln": "log",
              "log": "log", "exp": "exp", "lg": "log10", "sgn": "sign"}
"""Parser function name -> the mpmath function, looked up in the calling thread's context."""


def numeric(node: tuple, env: dict[str, object], budget: Budget):
    """The value at `env` (a point for the free symbols) in the private context."""
    # Long: one branch per operator of the expression tree, each a line or two, in one dispatch
    budget.tick()
    op = node[0]
    if op == "n":
        return HP.mpf(node[1].numerator) / node[1].denominator
    if op == "s":
        name = node[1]
        if name in env:
            return env[name]
        if name in CONSTANTS:
            return {"pi": HP.pi, "e": HP.e, "i": HP.mpc(0, 1)}[name]
        raise Reject(f"unbound {name}")
    if op == "inf":
        return HP.inf
    if op == "int":
        return _integral(node, env, budget)
    if op in ("sum", "prod"):
        return _big_operator(node, env, budget)
    if op == "log":
        return HP.log(numeric(node[2], env, budget)) / HP.log(numeric(node[1], env, budget))
    if op == "f":
        return getattr(HP, _FUNCTIONS[node[1]])(numeric(node[2], env, budget))
    if op == "pm":
        raise Reject("pm")  # expanded into two values before evaluation
    a = numeric(node[1], env, budget)
    if op == "neg":
        return -a
    if op == "abs":
        return abs(a)
    if op == "pct":
        return a / 100
    if op == "deg":
        return a * HP.pi / 180
    if op in ("floor", "ceil"):
        return (HP.floor if op == "floor" else HP.ceil)(HP.re(a))
    if op == "fact":
        if abs(a) > MAX_FACTORIAL:
            raise Reject("too_big")
        return HP.factorial(a)
    b = numeric(node[2], env, budget)
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    if op == "^":
        if abs(a) not in (0, 1) and abs(b) * abs(HP.log(abs(a), 2)) > MAX_FLOAT_EXPONENT_BITS:
            raise Reject("too_big")  # a power tower: never materialise 2^(10^10)-bit numbers
        if HP.im(a) == 0 and a < 0:  # (-8)^{1/3} = -2 and (x^2-2)^{5/3} real, as with \\sqrt[3]
            q = exact(node[2])
            if q is not None and q.denominator % 2 == 1:
                return (-1) ** (q.numerator % 2) * HP.power(-a, b)
        return HP.power(a, b)
    if op == "root":
        if b != int(HP.re(b)) or not 1 <= b <= 1_000:
            raise Reject("root index")
        if HP.im(a) == 0 and a < 0 and int(b) % 2 == 1:
            return -HP.root(-a, int(b))  # the real cube root of a negative number
        return HP.root(a, int(b))
    if op == "binom":
        if abs(a) > MAX_FACTORIAL or abs(b) > MAX_FACTORIAL:
            raise Reject("too_big")
        return HP.binomial(a, b)
    raise Reject(f"cannot evaluate {op}")


MAX_TERMS = 10_000
"""Terms a \\sum or \\prod may have to be evaluated."""


def _big_operator(node: tuple, env: dict[str, object], budget: Budget):
    """A finite sum or product over integer bounds (each term costs its budget steps)."""
    op, var, lo_node, hi_node, body = node
    lo, hi = numeric(lo_node, env, budget), numeric(hi_node, env, budget)
    if not all(HP.im(x) == 0 and x == int(HP.re(x)) for x in (lo, hi)) or int(hi) - int(lo) > MAX_TERMS:
        raise Reject("sum bounds")
    out = HP.mpf(0 if op == "sum" else 1)
    for k in range(int(lo), int(hi) + 1):
        term = numeric(body, {**env, var: HP.mpf(k)}, budget)
        out = out + term if op == "sum" else out * term
    return out


def _integral(node: tuple, env: dict[str, object], budget: Budget):
    """A definite integral over finite real bounds, by tanh-sinh quadrature (each integrand
    evaluation costs budget steps, so a heavy integrand runs out of budget, not of time)."""
    _, var, lo_node, hi_node, body = node
    lo, hi = numeric(lo_node, env, budget), numeric(hi_node, env, budget)
    if not all(HP.isfinite(x) and HP.im(x) == 0 for x in (lo, hi)):
        raise Reject("integral bounds")
    budget.tick(100)
    return HP.quad(lambda t: numeric(body, {**env, var: t}, budget), [lo, hi], maxdegree=6)
