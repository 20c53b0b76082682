"""Units of measure: the unit a quantity is written in, and exact conversion between the
common SI and imperial units of one family (issue 36: "2 kg" equals "2000 g").

Families: length, area, volume, mass, time and speed, built from units of length, mass and
time (exact factors: 1 in = 0.0254 m, 1 lb = 0.45359237 kg, 1 US gal = 3.785411784 L).
A unit is a product of names with integer powers, at most one division ("km/h",
"m\\cdot s^{-2}", "\\text{cm}^3", "square feet"). Ambiguous names (a ton, a year, a month,
a nautical mile) are not converted. `UNITS` is every word normalize.py drops after a
quantity: the convertible names and count nouns ("apples", "ways").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction as F

__all__ = ["UNITS", "Unit", "split_quantity"]

_BASE: dict[str, tuple[F, tuple[int, int, int]]] = {}
"""name -> (factor to SI, (length, mass, time) exponents)."""


def _add(names: str, factor: F, dims: tuple[int, int, int]) -> None:
    for name in names.split():
        _BASE[name] = (factor, dims)


L, M, T = (1, 0, 0), (0, 1, 0), (0, 0, 1)
_add("mm millimeter millimeters millimetre millimetres", F(1, 1000), L)
_add("cm centimeter centimeters centimetre centimetres", F(1, 100), L)
_add("dm decimeter decimeters", F(1, 10), L)
_add("m meter meters metre metres", F(1), L)
_add("km kilometer kilometers kilometre kilometres", F(1000), L)
_add("in inch inches", F(254, 10000), L)
_add("ft foot feet", F(3048, 10000), L)
_add("yd yard yards", F(9144, 10000), L)
_add("mi mile miles", F(1609344, 1000), L)
_add("mg milligram milligrams", F(1, 10**6), M)
_add("g gram grams", F(1, 1000), M)
_add("kg kilogram kilograms", F(1), M)
_add("tonne tonnes", F(1000), M)
_add("lb lbs pound pounds", F(45359237, 10**8), M)
_add("oz ounce ounces", F(45359237, 16 * 10**8), M)
_add("ms millisecond milliseconds", F(1, 1000), T)
_add("s sec secs second seconds", F(1), T)
_add("min mins minute minutes", F(60), T)
_add("h hr hrs hour hours", F(3600), T)
_add("day days", F(86400), T)
_add("week weeks", F(604800), T)
_add("ml mL milliliter milliliters millilitre millilitres cc", F(1, 10**6), (3, 0, 0))
_add("l L liter liters litre litres", F(1, 1000), (3, 0, 0))
_add("gal gallon gallons", F(3785411784, 10**12), (3, 0, 0))
_add("qt quart quarts", F(3785411784, 4 * 10**12), (3, 0, 0))
_add("pt pint pints", F(3785411784, 8 * 10**12), (3, 0, 0))
_add("ha hectare hectares", F(10**4), (2, 0, 0))
_add("acre acres", F(40468564224, 10**7), (2, 0, 0))
_add("mph", F(1609344, 3600 * 1000), (1, 0, -1))
_add("kmh kph", F(1000, 3600), (1, 0, -1))

UNITS = set(_BASE) | {
    "sq", "square", "cubic", "unit", "units", "dollar", "dollars", "cent", "cents", "yuan", "euro", "euros", "radian",
    "radians", "people", "students", "ways", "times", "hz", "pa", "mol", "ev", "kev", "mev", "gev", "ly", "au", "pc",
    "kpc", "mpc", "joules", "newtons", "watts", "volts", "kelvin", "apples", "tiles", "marbles", "cookies", "books",
    "pages", "boxes", "bags", "eggs", "cups", "points", "games", "items", "year", "years", "month", "months",
}
_POWER_WORDS = {"square": 2, "sq": 2, "cubic": 3}
_WRAPPER = re.compile(r"\\(?:text|mathrm|textrm|mbox|operatorname)\s*\{([^{}]*)\}")
_FACTOR = re.compile(r"(square|sq|cubic)?\s*([A-Za-z]+)\.?\s*(?:\^\s*\{?\s*(-?\d)\s*\}?|([\u00b2\u00b3]))?")


@dataclass(frozen=True)
class Unit:
    """A unit: its factor to SI and its (length, mass, time) exponents."""

    factor: F
    dims: tuple[int, int, int]


def _term(text: str) -> Unit | None:
    """A product of unit names with powers, or None."""
    factor, dims, i = F(1), [0, 0, 0], 0
    text = text.strip()
    if not text:
        return None
    while i < len(text):
        m = _FACTOR.match(text, i)
        if m is None or m.end() == i or m.group(2) not in _BASE:
            return None
        power = int(m.group(3)) if m.group(3) else {"\u00b2": 2, "\u00b3": 3}.get(m.group(4) or "", 1)
        power *= _POWER_WORDS.get(m.group(1) or "", 1)
        base, base_dims = _BASE[m.group(2)]
        factor *= base**power
        dims = [d + power * e for d, e in zip(dims, base_dims)]
        i = m.end()
        sep = re.match(r"\s*(?:\\cdot|\\times|\*|\u00b7)?\s*", text[i:])
        i += sep.end() if sep else 0
    return Unit(factor, (dims[0], dims[1], dims[2]))


def _unit(text: str) -> Unit | None:
    parts = re.split(r"\s*(?:/|\bper\b)\s*", text)
    if len(parts) > 2:
        return None
    units = [_term(p) for p in parts]
    if any(u is None for u in units):
        return None
    if len(units) == 1:
        return units[0]
    a, b = units
    return Unit(a.factor / b.factor, (a.dims[0] - b.dims[0], a.dims[1] - b.dims[1], a.dims[2] - b.dims[2]))


def split_quantity(answer: str) -> tuple[str, Unit] | None:
    """(the value's text, its unit) when the answer is a number followed by a unit it
    converts ("2\\text{ kg}", "5 km/h", "3\\,\\mathrm{m}^2", "12 square feet"), else None.
    The value must hold no letters (so "2m" in "x = 2m" is never read as metres)."""
    text = _WRAPPER.sub(lambda m: " " + m.group(1) + " ", answer.replace("\\,", " ").replace("\\ ", " "))
    text = text.replace("$", " ").strip().rstrip(".")
    m = re.match(r"\s*((?:[-+]?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)|\\frac\{\d+\}\{\d+\}|\d+/\d+)"
                 r"(?:\s*\\times\s*10\^\{?-?\d+\}?)?)\s*(.*)$", text, re.S)
    if m is None or not m.group(2):
        return None
    unit = _unit(m.group(2))
    return (m.group(1).replace(" ", ""), unit) if unit is not None else None
