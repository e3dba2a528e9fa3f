"""Bits <-> counts: ⌊2^ε⌋ exactly, charges that are upper bounds yet never above the request."""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import noiseless as nl


def _log2(x: int, digits: int = 150) -> Decimal:
    with decimal.localcontext() as ctx:
        ctx.prec = digits
        return Decimal(x).ln() / Decimal(2).ln()


def _floor_pow2_exact(bits: Fraction) -> int:
    """⌊2^bits⌋ by integer arithmetic only: the largest K with K**den <= 2**num."""
    num, den = bits.numerator, bits.denominator
    lo, hi = 1, 2 ** (num // den + 1)  # lo**den <= 2**num < hi**den
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if mid**den <= 2**num else (lo, mid)
    return lo


@pytest.mark.parametrize(
    ("bits", "count"),
    [
        (Fraction(0), 1),
        (Fraction(99, 100), 1),
        (Fraction(1), 2),
        (Fraction(1585, 1000), 3),  # just above log2 3 = 1.58496…
        (Fraction(1584, 1000), 2),  # just below
        (Fraction(2), 4),
        (Fraction(5, 2), 5),  # 2^2.5 = 5.66
        (Fraction(3), 8),
        (Fraction(10), 1024),
    ],
)
def test_levels_for_bits_table(bits: Fraction, count: int) -> None:
    assert nl.levels_for_bits(bits) == count


def test_float_log2_3_is_below_log2_3_and_buys_two() -> None:
    """The spec's ``(1 + 1e-12)`` slack would give 3 here, i.e. spend more than requested."""
    below = math.log2(3)
    assert Decimal(Fraction(below).numerator) / Decimal(Fraction(below).denominator) < _log2(3)
    assert nl.levels_for_bits(below) == 2
    above = math.nextafter(below, math.inf)
    assert nl.levels_for_bits(above) == 3


def test_cap_and_invalid_budgets() -> None:
    assert nl.levels_for_bits(100, cap=2**40) == 2**40
    assert nl.levels_for_bits(3, cap=2**40) == 8
    with pytest.raises(ValueError):
        nl.levels_for_bits(-1)
    with pytest.raises(ValueError):
        nl.levels_for_bits(math.inf)
    with pytest.raises(TypeError):
        nl.levels_for_bits("2")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40 * 64), st.integers(1, 64))
def test_levels_for_bits_is_exact_floor(num: int, den: int) -> None:
    bits = Fraction(num, den)
    assert nl.levels_for_bits(bits) == _floor_pow2_exact(bits)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**40))
def test_bits_upper_is_a_tight_upper_bound_and_a_fixed_point(count: int) -> None:
    charged = nl.bits_upper(count)
    assert charged.denominator <= nl.CHARGE_DENOMINATOR
    if count & (count - 1) == 0:
        assert charged == count.bit_length() - 1
    else:  # irrational log2: strictly above it, by a margin far beyond decimal error
        with decimal.localcontext() as ctx:
            ctx.prec = 150
            slack = Decimal(charged.numerator) / Decimal(charged.denominator) - _log2(count)
        assert Decimal(10) ** -90 < slack <= Decimal(1) / nl.CHARGE_DENOMINATOR
    # the charge, handed back as a budget, buys the same count (run re-plans from it)
    assert nl.levels_for_bits(charged) == count


def test_powers_of_two_are_charged_exactly() -> None:
    for k in range(41):
        assert nl.bits_upper(2**k) == k


@settings(max_examples=100, deadline=None)
@given(st.fractions(min_value=1, max_value=60, max_denominator=10**6))
def test_charge_never_exceeds_request_and_bounds_log2_count(bits: Fraction) -> None:
    count = nl.levels_for_bits(bits)
    charged = nl.charge(count, bits)
    assert charged <= bits
    assert nl.at_most_power(count, charged)  # 2^charge >= count: an upper bound
    with pytest.raises(ValueError):
        nl.charge(count + 1, bits)


def test_split_bits_adds_up() -> None:
    parts = nl.split_bits(Fraction(7, 3), 4)
    assert sum(parts) == Fraction(7, 3)
    assert len(set(parts)) == 1
    with pytest.raises(ValueError):
        nl.split_bits(1, 0)


def test_at_most_power_decides_close_calls_safely() -> None:
    assert nl.at_most_power(3, Fraction(1585, 1000))
    assert not nl.at_most_power(3, Fraction(1584, 1000))
    # a decimal budget within 1e-30 of log2 3, with a denominator too large for integers
    close = Fraction(15849625007211561814537389439478165, 10**34)  # log2 3 rounded down
    assert not nl.at_most_power(3, close)
    assert nl.at_most_power(3, close + Fraction(1, 10**33))
    assert nl.at_most_power(Fraction(1, 3), Fraction(-1))
    assert not nl.at_most_power(Fraction(1, 3), Fraction(-2))
