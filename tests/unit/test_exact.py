"""mechanisms.exact: directed Fraction -> float rounding and the guarantee-text format."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from mechanisms.exact import float_down, float_down_any, float_up, fmt

CASES = [Fraction(1, 3), Fraction(-1, 3), Fraction(2, 3), Fraction(1, 10**20), Fraction(5),
         Fraction(0), Fraction(2**60 + 1), Fraction(-(2**60) - 1), Fraction(1, 2)]


@pytest.mark.parametrize("x", CASES)
def test_directed_rounding_brackets_the_fraction(x: Fraction) -> None:
    lo, hi = float_down(x), float_up(x)
    assert Fraction(lo) <= x <= Fraction(hi)
    if Fraction(float(x)) == x:
        assert lo == hi == float(x)
    else:
        assert math.nextafter(lo, math.inf) == hi


def test_float_down_any_passes_floats_through() -> None:
    assert float_down_any(Fraction(1, 3)) == float_down(Fraction(1, 3))
    assert float_down_any(0.1) == 0.1
    assert float_down_any(math.inf) == math.inf
    assert math.isnan(float_down_any(math.nan))


def test_fmt() -> None:
    assert fmt(Fraction(3)) == "3"
    assert fmt(Fraction(1, 10)) == "0.1"
    assert fmt(Fraction(1, 3)) == repr(1 / 3)
    assert fmt(Fraction(1, 3), significant=12) == "0.333333333333"
    assert fmt(Fraction(7), significant=12) == "7"
