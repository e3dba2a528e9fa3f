"""Exact statistics of clipped columns, so quantization sees the true value.

A bin index is only as trustworthy as the number it indexes: a float sum of
10^6 records can be off by many ulps, enough to cross a bin edge and add an
output the certificate did not count (the spec's fuzz found 107 such slices
for float ``np.mean``). Here every sum is exact — a ``Fraction`` of the
clipped float64 (or int64) records — and stays vectorised: a double is
m·2^e with an integer |m| < 2^53, so ``statistics.float_sums`` adds the mantissas
per exponent (split in 26-bit halves, whose float64 bin sums are exact integers
below 2^53) and combines the exponent buckets with Python integers.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.statistics import CHUNK, SCALE, float_sums


def clip_float(x: NDArray[Any], lower: float, upper: float) -> NDArray[np.float64]:
    """Records clipped to the declared bounds; a missing value counts as the lower bound."""
    values = np.asarray(x, dtype=np.float64)
    nan = np.isnan(values)
    if nan.any():
        values = np.where(nan, lower, values)
    return np.clip(values, lower, upper)


def clip_integer(x: NDArray[Any], lower: int, upper: int) -> NDArray[np.int64]:
    """Integer records clipped to the declared bounds (floats are rounded first, NaN as lower)."""
    values = np.asarray(x)
    if values.dtype.kind == "u":  # beyond int64 only above the bound: cap first
        values = np.minimum(values, np.uint64(max(upper, 0))).astype(np.int64)
    elif values.dtype.kind != "i":
        values = np.rint(clip_float(values, float(lower), float(upper)))
    return np.clip(values, lower, upper).astype(np.int64)


def exact_int_sum(x: NDArray[np.int64]) -> int:
    """Sum of int64 values without overflow (32-bit halves, each summed in int64)."""
    values = np.asarray(x, dtype=np.int64)
    total = 0
    for start in range(0, values.shape[0], 1 << 30):
        chunk = values[start : start + (1 << 30)]
        high = int(np.sum(chunk >> 31, dtype=np.int64))
        low = int(np.sum(chunk & 0x7FFFFFFF, dtype=np.int64))
        total += (high << 31) + low
    return total


def exact_float_sum(x: NDArray[np.float64]) -> Fraction:
    """The exact sum of finite float64 values, as a fraction (``statistics.float_sums``,
    a chunk of rows at a time)."""
    values = np.asarray(x, dtype=np.float64)
    total = 0
    for start in range(0, values.shape[0], CHUNK):
        total += float_sums(values[start : start + CHUNK])[0]
    return Fraction(total, 1 << SCALE)


def exact_mean(total: Fraction | int, n: int) -> Fraction:
    """The exact mean of n records with the given exact total."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return Fraction(total) / n
