"""Column helpers shared by the statistic families (baselines, tables, quantiles, moments).

A statistic reads one numeric column between its *declared* bounds: ``declared_bounds``
gives them exactly (integer columns rounded inwards), ``clean`` clips the data to them,
and a ``Condition`` selects the rows a count counts. Bounds and conditions follow from
public metadata only, so every family that uses them reads a column the same way and
computes the same sensitivity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.base import ColumnMeta, MechanismInputError

#: declared bounds beyond this are refused (int64 columns; sums of doubles must not overflow)
MAX_BOUND = 2**62


def declared_bounds(column: ColumnMeta, statistic: str) -> tuple[Fraction, Fraction]:
    """Effective declared bounds, exact; integer columns round inwards to integers."""
    if column.type == "categorical":
        raise MechanismInputError(
            "params.column", f"column {column.name!r} is categorical; {statistic} needs numbers"
        )
    if column.bounds is None or not all(math.isfinite(b) for b in column.bounds):
        raise MechanismInputError(
            "params.column", f"column {column.name!r} has no finite declared bounds"
        )
    lo, hi = (Fraction(b) for b in column.bounds)
    if column.type == "integer":
        lo, hi = Fraction(math.ceil(lo)), Fraction(math.floor(hi))
    if not lo < hi:
        raise MechanismInputError(
            "params.column", f"column {column.name!r} has an empty or one-point declared range"
        )
    if max(abs(lo), abs(hi)) >= MAX_BOUND:
        raise MechanismInputError(
            "params.column", f"declared bounds of column {column.name!r} are too large"
        )
    return lo, hi


def clean(x: NDArray[Any], lo: float, hi: float) -> NDArray[np.float64]:
    """Missing values count as the lower bound; everything is clipped to [lo, hi].

    Makes one new array: ``x`` may be the worker's read-only memory map of a
    stored column, and a 10^7-row column is 80 MB a copy.
    """
    out = np.clip(np.asarray(x), lo, hi, out=np.empty(np.shape(x), dtype=np.float64))
    np.copyto(out, lo, where=np.isnan(out))  # clip keeps NaN
    return out


@dataclass(frozen=True)
class Condition:
    """Rows meeting ``column op values`` (``baselines.resolve_condition`` builds one)."""

    column: str
    op: str
    values: tuple[float, ...]  # numbers, or category codes for categorical columns
    clip: tuple[float, float] | None

    def mask(self, x: NDArray[Any]) -> NDArray[np.bool_]:
        if self.clip is not None:
            x = clean(x.astype(np.float64), *self.clip)
        ops = {
            "eq": np.equal,
            "ne": np.not_equal,
            "lt": np.less,
            "le": np.less_equal,
            "gt": np.greater,
            "ge": np.greater_equal,
        }
        if self.op == "in":
            return np.isin(x, np.asarray(self.values))
        result: NDArray[np.bool_] = ops[self.op](x, self.values[0])
        return result
