"""Shared pieces of DIP's competitors: budgets, the float-safe Laplace lattice, data cleaning.

Float safety (Mironov 2012; DESIGN §6): no competitor adds floating-point Laplace
noise to a raw value. A bounded real value v is mapped to the integer
k(v) = rint((v - c)/g) on a power-of-two grid g around a public centre c; exact
integer discrete Laplace noise D is added; the release is c + g (k + D),
a deterministic function of the integer k + D. Subtracting a constant and
dividing by a power of two are monotone under correct rounding, so every value
in [a, b] has k(a) <= k(v) <= k(b): ``units = k(b) - k(a)`` is the exact lattice
sensitivity of one value, computed with the same float operations the run uses.
Discrete Laplace noise of scale units/ε on that integer is ε-DP for the value,
exactly (the released float adds no information beyond the integer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import Schema, ValidationError, fields, validates_schema
from numpy.typing import NDArray

from mechanisms import sampling
from mechanisms.base import (
    Budget,
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Work,
    check_numeric_column,
    read_epsilon,
)
from mechanisms.exact import float_down, float_up

#: released microdata carry each record's dataset row index in this column (as ``dip``)
ROW_COLUMN = "_row"
#: the privacy unit every competitor protects
PRIVACY_UNIT = "neighbouring datasets differ in one record replaced; n_rows public"
#: most columns one naive-multivariate release may process
MAX_COLUMNS = 64
CI_LEVEL = 0.95
#: one lattice value, noise included, stays far inside int64 (see ``exact_sum``)
LATTICE_LIMIT = 2**52


class ColumnsSchema(Schema):
    """``columns``: one or more distinct numeric columns (the naive multivariate version)."""

    columns = fields.List(fields.String(), required=True, metadata={
        "description": "1 to 64 distinct numeric columns with declared bounds; each gets "
                       "epsilon/p of the budget (p columns)"})

    @validates_schema
    def _check_columns(self, data: dict[str, Any], **kwargs: Any) -> None:
        names = data.get("columns") or []
        if not 1 <= len(names) <= MAX_COLUMNS:
            raise ValidationError(f"give 1 to {MAX_COLUMNS} columns", "columns")
        if len(set(names)) != len(names):
            raise ValidationError("columns must be distinct", "columns")
        if ROW_COLUMN in names:
            raise ValidationError(f"{ROW_COLUMN!r} is reserved", "columns")


def columns_work(params: Mapping[str, Any], meta: DatasetMeta) -> Work:
    """A pass over the rows per processed column."""
    return Work(float(max(meta.n_rows, 1)) * max(len(params.get("columns") or ()), 1),
                "params.columns", "fewer columns")


def split_epsilon(budget: Budget, name: str, parts: int) -> tuple[Fraction, Fraction]:
    """(ε, ε/p): the whole budget is charged, each of ``parts`` columns gets an equal share
    (sequential composition over the columns, the paper's NLRM/NOPM)."""
    epsilon = read_epsilon(budget, name)
    return epsilon, epsilon / parts


class PerColumnMechanism(Mechanism):
    """A mechanism run on each of ``params.columns`` at ε/p (the paper's naive
    multivariate versions): one pass per column, the whole ε charged."""

    measures = ("epsilon",)

    def _plan(self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta
              ) -> Mapping[str, Any]:
        raise NotImplementedError

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        return columns_work(params, meta)

    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
             ) -> dict[str, Fraction]:
        epsilon, _ = split_epsilon(budget, self.name, len(params["columns"]))
        self._plan(params, epsilon, meta)  # refuses what cannot run, before any charge
        return {"epsilon": epsilon}


def numeric_columns(params: Mapping[str, Any], meta: DatasetMeta) -> list[ColumnMeta]:
    """The requested columns, each numeric with usable declared bounds."""
    return [_numeric(meta.column(n, "params.columns")) for n in params["columns"]]


def _numeric(column: ColumnMeta) -> ColumnMeta:
    check_numeric_column(column, "params.columns")
    return column


@dataclass(frozen=True)
class Lattice:
    """A clipped real value on a power-of-two grid, with exact discrete Laplace noise.

    ``lo``/``hi``: the clipping interval; ``centre`` c (a grid point) and ``grid`` g;
    ``units``: the exact lattice sensitivity k(hi) - k(lo); ``scale``: the discrete
    Laplace scale in lattice units (>= units/ε, rounded up); ``integer``: g = 1, c = lo
    on an integer column (the geometric mechanism, integer outputs).
    """

    lo: float
    hi: float
    centre: float
    grid: float
    units: int
    scale: float
    integer: bool

    def index(self, x: NDArray[Any]) -> NDArray[np.int64]:
        """k(clip(x)) for each value; missing values count as ``lo`` (one new array)."""
        if self.integer:
            if x.dtype.kind not in "iu":
                raise TypeError("integer column must hold integers")
            return np.clip(x.astype(np.int64), int(self.lo), int(self.hi)) - int(self.centre)
        v = np.clip(np.asarray(x, dtype=np.float64), self.lo, self.hi)
        np.copyto(v, self.lo, where=np.isnan(v))
        v -= self.centre
        v /= self.grid
        return np.rint(v).astype(np.int64)

    def value(self, k: NDArray[np.int64]) -> NDArray[np.float64]:
        """c + g k: exact while |k| < 2**53 (g k is then exact; one rounding adding c)."""
        return self.centre + self.grid * k.astype(np.float64)

    @property
    def noise_variance(self) -> float:
        """Var of one discrete Laplace draw, value units: g^2 2p/(1-p)^2, p = e^(-1/s)."""
        p = math.exp(-1.0 / self.scale)
        return self.grid**2 * 2.0 * p / (-math.expm1(-1.0 / self.scale)) ** 2

    @property
    def laplace_scale(self) -> float:
        """The noise scale in value units (g times the lattice scale)."""
        return self.grid * self.scale

    @property
    def halfwidth(self) -> float:
        """95% half-width of one draw's noise, value units."""
        return self.grid * sampling.discrete_laplace_halfwidth(self.scale, CI_LEVEL)


def lattice(lo: float, hi: float, epsilon: Fraction, integer: bool = False,
            field: str = "params.columns") -> Lattice:
    """Calibrate discrete Laplace noise on [lo, hi] to ε-DP for one value.

    Real values: g = the largest power of two <= min(hi - lo, (hi - lo)/ε) / 2^10,
    c = lo snapped to the grid. Integer values: g = 1, c = lo.
    """
    if integer:
        units = int(hi) - int(lo)
        grid, centre = 1.0, float(lo)
    else:
        span = hi - lo
        try:
            grid = sampling.grid_for(min(span, float_down(Fraction(span) / epsilon)))
        except ValueError:
            raise MechanismInputError(field, "declared range is too narrow for a grid") from None
        centre = sampling.snap(lo, grid)
        k_lo = int(np.rint((np.float64(lo) - centre) / grid))
        k_hi = int(np.rint((np.float64(hi) - centre) / grid))
        units = k_hi - k_lo
    scale = float_up(Fraction(units) / epsilon)
    if not 0 < scale <= sampling.MAX_SCALE:
        raise MechanismInputError(
            "budget.epsilon", "epsilon too small for the declared range: the noise would exceed"
            " the sampler's range")
    if (abs(centre) / grid + units + 64 * scale) >= LATTICE_LIMIT:
        raise MechanismInputError(field, "declared range too wide for exact lattice arithmetic")
    return Lattice(lo, hi, centre, grid, units, scale, integer)


def exact_sum(k: NDArray[np.int64]) -> int:
    """Σ k exactly (Python int): high and low 31-bit halves summed separately in int64."""
    high = k >> 31
    low = k & ((1 << 31) - 1)
    return (int(high.sum(dtype=np.int64)) << 31) + int(low.sum(dtype=np.int64))


def column_array(data: Mapping[str, np.ndarray], name: str, n_rows: int) -> NDArray[Any]:
    x = np.asarray(data[name])
    if x.ndim != 1 or x.shape[0] != n_rows:
        raise ValueError(f"column {name!r} does not have n_rows entries")
    return x
