"""Budgets in bits and the integer output counts they buy, exactly.

Noiseless privacy counts outputs: ε bits allow ⌊2^ε⌋ distinct outputs per
record (2^ε, not e^ε). A budget is an exact ``Fraction``; the count it buys
must never exceed 2^ε, and the charge for a certified count K must never be
below log2 K. log2 K is irrational unless K is a power of two, so charges are
rational *upper* bounds, rounded up to a multiple of 2^-40 and never above
the request (``charge``). The comparisons are decided exactly where the
integers stay small and otherwise with 100-digit decimals and a 1e-80
margin; an undecidable comparison is resolved conservatively (fewer
outputs), so rounding can only ever cost accuracy, never privacy.
"""

from __future__ import annotations

import decimal
import math
import numbers
from decimal import Decimal
from fractions import Fraction

#: charges are multiples of this: log2 K rounded up, at most 2^-40 above log2 K
CHARGE_DENOMINATOR = 2**40
#: budgets above this many bits are refused by the library (no quantizer needs them)
MAX_LIBRARY_BITS = Fraction(4096)
_PRECISION = 100
_MARGIN = Decimal(10) ** -80
#: exact integer comparison c**den <= 2**num is used while it costs at most this many bits
_EXACT_BITS = 1 << 16

Bits = Fraction | int | float


def as_bits(value: Bits) -> Fraction:
    """A budget as an exact fraction (floats are read exactly, not as decimals)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Rational | float):
        raise TypeError("bits must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("bits must be finite")
    bits = Fraction(value)
    if bits < 0:
        raise ValueError("bits must be >= 0")
    if bits > MAX_LIBRARY_BITS:
        raise ValueError(f"bits must be <= {MAX_LIBRARY_BITS}")
    return bits


def _log2_decimal(x: Fraction) -> Decimal:
    """log2 of a positive fraction to about 100 significant digits."""
    num = Decimal(x.numerator).ln() - Decimal(x.denominator).ln()
    return num / Decimal(2).ln()


def _power_of_two_log(x: Fraction) -> int | None:
    """k if x == 2**k exactly, else None."""
    num, den = x.numerator, x.denominator
    if num & (num - 1) == 0 and den & (den - 1) == 0:
        return (num.bit_length() - 1) - (den.bit_length() - 1)
    return None


def at_most_power(count: Fraction | int, bits: Fraction) -> bool:
    """Whether count <= 2**bits; False when too close to decide (the safe answer).

    Exact when ``count`` is a power of two or ``bits`` has a small
    denominator (compare count**den with 2**num as integers); otherwise by
    100-digit logarithms, which differ from the truth by far less than the
    1e-80 margin required for a True.
    """
    c = Fraction(count)
    if c <= 0:
        return True
    if bits < 0 and c >= 1:
        return False
    k = _power_of_two_log(c)
    if k is not None:
        return k <= bits
    num, den = bits.numerator, bits.denominator
    size = den * max(c.numerator.bit_length(), c.denominator.bit_length()) + abs(num)
    if size <= _EXACT_BITS:
        lhs = c.numerator**den
        rhs = c.denominator**den
        return lhs << max(-num, 0) <= rhs << max(num, 0)
    with decimal.localcontext() as ctx:
        ctx.prec = _PRECISION
        diff = Decimal(num) / Decimal(den) - _log2_decimal(c)
        return diff > _MARGIN


def levels_for_bits(bits: Bits, cap: int | None = None) -> int:
    """⌊2^bits⌋, the most distinct outputs ``bits`` allows (never more), capped at ``cap``.

    Computed exactly: a decimal estimate proposes the count, ``at_most_power``
    confirms it, so ``levels_for_bits(log2 3 as a float)`` is 2 or 3 exactly
    as that float is below or above log2 3.
    """
    b = as_bits(bits)
    if cap is not None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        if at_most_power(cap, b):
            return cap
    with decimal.localcontext() as ctx:
        ctx.prec = _PRECISION + int(b * Fraction(302, 1000)) + 2
        estimate = int(
            (Decimal(2) ** (Decimal(b.numerator) / Decimal(b.denominator))).to_integral_value(
                decimal.ROUND_FLOOR
            )
        )
    count = max(1, estimate + 1)
    while count > 1 and not at_most_power(count, b):
        count -= 1
    return count if cap is None else min(count, cap)


def bits_upper(count: int, denominator: int = CHARGE_DENOMINATOR) -> Fraction:
    """A multiple of 1/denominator that is >= log2(count), at most 1/denominator above it.

    Exact for powers of two. For count <= 2**40 the result stays below
    log2(count + 1), so ``levels_for_bits(bits_upper(K)) == K``: a charge
    handed back as a budget buys the very same count (the service passes the
    charge, not the request, to ``run``).
    """
    if count < 1:
        raise ValueError("count must be >= 1")
    k = _power_of_two_log(Fraction(count))
    if k is not None:
        return Fraction(k)
    with decimal.localcontext() as ctx:
        ctx.prec = _PRECISION
        scaled = _log2_decimal(Fraction(count)) * denominator
        m = int(scaled.to_integral_value(decimal.ROUND_CEILING))
        if Decimal(m) - scaled <= _MARGIN * denominator:
            m += 1
    return Fraction(m, denominator)


def charge(count: int, requested: Bits) -> Fraction:
    """What to charge for a certified count: min(request, log2 count rounded up).

    Both are upper bounds on log2 count when count <= ⌊2^request⌋, so the
    smaller one is a valid charge and never exceeds the request.
    """
    request = as_bits(requested)
    if not at_most_power(count, request):
        raise ValueError("the count exceeds what the requested bits allow")
    return min(request, bits_upper(count))


def split_bits(total: Bits, parts: int) -> list[Fraction]:
    """An equal split of a budget over ``parts`` coordinates (budgets add, Theorem 6)."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    share = as_bits(total) / parts
    return [share] * parts
