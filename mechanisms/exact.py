"""Exact ``Fraction`` to float rounding, and printing exact amounts.

Budgets, sensitivities and scales are exact fractions; the noise samplers and
calibration formulas take floats. Rounding a fraction to the nearest float may move it
either way, which could make a mechanism spend more than it is charged. These helpers
round in a chosen direction instead (the float just below or just above), so that each
conversion errs on the conservative side: an ε or a sensitivity used as a divisor rounds
down, a noise scale rounds up.
"""

from __future__ import annotations

import math
from fractions import Fraction


def float_down(x: Fraction) -> float:
    """The largest float <= ``x``."""
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f


def float_up(x: Fraction) -> float:
    """The smallest float >= ``x``."""
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


def float_down_any(x: float | Fraction) -> float:
    """``float_down`` for a Fraction; any other number through ``float()`` as it is.

    A float argument is already a double and comes back unchanged, NaN and infinities
    included, so the caller's own finiteness check reports them.
    """
    if isinstance(x, Fraction):
        return float_down(x)
    return float(x)


def fmt(x: Fraction, significant: int | None = None) -> str:
    """An exact amount for a guarantee text: an integer as such, otherwise a float.

    The float is ``repr(float(x))`` (the shortest text that reads back as the same
    double), or with ``significant`` that many significant digits (``%g``).
    """
    if x.denominator == 1:
        return str(x.numerator)
    return repr(float(x)) if significant is None else f"{float(x):.{significant}g}"
