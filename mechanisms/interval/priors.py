"""The public prior of a column, against which every coverage is measured.

Interval privacy is prior-relative (spec §6.1 pitfall 5): the coverage of a
range S is P_Y(S) under a *declared* law of Y, never the data. The operator
declares it in the column metadata; ``None`` means uniform on the declared
bounds. A declared prior is truncated to the declared bounds (the data are
clipped to them), and an integer column's prior is the law of the rounded
latent variable: P(Y = k) = F(k + ½) − F(k − ½), so a range's coverage counts
the integers it holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from mechanisms.base import (
    MAX_ABS_BOUND,
    MIN_RELATIVE_SPAN,
    MIN_SPAN,
    ColumnMeta,
    MechanismInputError,
    bounds_problem,
)

FloatArray = NDArray[np.float64]

#: family -> (required parameters, optional parameters with defaults)
FAMILIES: dict[str, tuple[tuple[str, ...], dict[str, float]]] = {
    "normal": (("loc", "scale"), {}),
    "logistic": (("loc", "scale"), {}),
    "laplace": (("loc", "scale"), {}),
    "t": (("df", "loc", "scale"), {}),
    "uniform": (("low", "high"), {}),
    "beta": (("a", "b"), {"low": 0.0, "high": 1.0}),
    "lognormal": (("mu", "sigma"), {}),
    "gamma": (("shape", "scale"), {}),
}
#: the closed range each parameter must lie in, where scipy's cdf/ppf stay accurate
#: and the truncated law is not numerically a point (the README's prior table)
_LOCATION = (-MAX_ABS_BOUND, MAX_ABS_BOUND)
_SCALE = (1e-100, 1e100)
RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "normal": {"loc": _LOCATION, "scale": _SCALE},
    "logistic": {"loc": _LOCATION, "scale": _SCALE},
    "laplace": {"loc": _LOCATION, "scale": _SCALE},
    "t": {"df": (1e-2, 1e8), "loc": _LOCATION, "scale": _SCALE},
    "uniform": {"low": _LOCATION, "high": _LOCATION},
    "beta": {"a": (1e-3, 1e6), "b": (1e-3, 1e6), "low": _LOCATION, "high": _LOCATION},
    "lognormal": {"mu": (-200.0, 200.0), "sigma": (1e-3, 50.0)},
    "gamma": {"shape": (1e-3, 1e8), "scale": _SCALE},
}
#: a prior must give the declared bounds at least this much mass
MIN_MASS = 1e-9


def _frozen(family: str, p: Mapping[str, float]) -> Any:
    if family == "normal":
        return stats.norm(p["loc"], p["scale"])
    if family == "logistic":
        return stats.logistic(p["loc"], p["scale"])
    if family == "laplace":
        return stats.laplace(p["loc"], p["scale"])
    if family == "t":
        return stats.t(p["df"], p["loc"], p["scale"])
    if family == "uniform":
        return stats.uniform(p["low"], p["high"] - p["low"])
    if family == "beta":
        return stats.beta(p["a"], p["b"], p["low"], p["high"] - p["low"])
    if family == "lognormal":
        return stats.lognorm(p["sigma"], scale=math.exp(p["mu"]))
    if family == "gamma":
        return stats.gamma(p["shape"], scale=p["scale"])
    raise KeyError(family)


def _parse(spec: Mapping[str, Any], field: str) -> tuple[str, dict[str, float]]:
    """Validate a prior spec; messages name only public parameters."""
    family = spec.get("family")
    if family not in FAMILIES:
        raise MechanismInputError(
            field, f"prior family must be one of {', '.join(sorted(FAMILIES))}; got {family!r}"
        )
    required, optional = FAMILIES[family]
    unknown = sorted(set(spec) - {"family", *required, *optional})
    if unknown:
        raise MechanismInputError(field, f"{family} prior takes no {', '.join(unknown)}")
    params: dict[str, float] = dict(optional)
    for name in (*required, *optional):
        if name not in spec and name in optional:
            continue
        value = spec.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MechanismInputError(field, f"{family} prior needs a number {name!r}")
        value = float(value)
        low, high = RANGES[family][name]
        if not low <= value <= high:  # NaN fails too
            raise MechanismInputError(
                field, f"{family} prior parameter {name!r} must be in [{low:g}, {high:g}]")
        params[name] = value
    if "low" in params and not params["low"] < params["high"]:
        raise MechanismInputError(field, f"{family} prior needs low < high")
    return family, params


def concentration_problem(prior: Prior) -> str | None:
    """Why a prior is numerically a point mass, or None.

    Calibration scales anchors by the prior's SD and coverage integrates its
    quantile function: an SD of 0 (ZeroDivisionError), NaN, or below float64's
    resolution at the prior's location (every quantile the same float) makes
    both meaningless, so such priors are refused.
    """
    sd, median = prior.sd, prior.median
    if not (math.isfinite(sd) and math.isfinite(median)):
        return "the declared prior's spread is not finite on the declared bounds"
    if not sd >= max(MIN_SPAN, MIN_RELATIVE_SPAN * abs(median)):
        return ("the declared prior is too concentrated on the declared bounds: its SD must be"
                f" at least {MIN_SPAN:g} and {MIN_RELATIVE_SPAN:g} times |median|")
    return None


@dataclass(frozen=True)
class Prior:
    """A continuous law (scipy frozen distribution), truncated and maybe discretised.

    ``cdf`` is exact for the truncated (and, for integer columns, rounded)
    law; ``ppf`` is its generalised inverse. Everything is vectorised.
    """

    dist: Any
    bounds: tuple[float, float] = (-math.inf, math.inf)
    integer: bool = False
    description: Mapping[str, Any] | None = None

    @functools.cached_property
    def _latent_bounds(self) -> tuple[float, float]:
        lo, hi = self.bounds
        if self.integer:
            return lo - 0.5, hi + 0.5
        return lo, hi

    @functools.cached_property
    def _cdf_bounds(self) -> tuple[float, float]:
        lo, hi = self._latent_bounds
        return float(self.dist.cdf(lo)), float(self.dist.cdf(hi))

    @property
    def mass_on_bounds(self) -> float:
        c_lo, c_hi = self._cdf_bounds
        return c_hi - c_lo

    def cdf(self, x: ArrayLike) -> FloatArray:
        """P(Y <= x)."""
        x = np.asarray(x, dtype=np.float64)
        if self.integer:
            x = np.floor(x) + 0.5
        c_lo, c_hi = self._cdf_bounds
        raw = np.asarray(self.dist.cdf(x), dtype=np.float64)
        out: FloatArray = np.clip((raw - c_lo) / (c_hi - c_lo), 0.0, 1.0)
        return out

    def ppf(self, q: ArrayLike) -> FloatArray:
        """The smallest y with P(Y <= y) >= q (a quantile inside the support)."""
        q = np.asarray(q, dtype=np.float64)
        c_lo, c_hi = self._cdf_bounds
        lo, hi = self._latent_bounds
        x = np.clip(np.asarray(self.dist.ppf(c_lo + q * (c_hi - c_lo)), dtype=np.float64), lo, hi)
        if self.integer:
            x = np.clip(np.ceil(x - 0.5), self.bounds[0], self.bounds[1])
        return x

    def mass(
        self, left: ArrayLike, right: ArrayLike, left_closed: ArrayLike, right_closed: ArrayLike
    ) -> FloatArray:
        """P(Y in piece) for pieces with the given ends; NaN ends mean an empty piece."""
        left = np.asarray(left, dtype=np.float64)
        right = np.asarray(right, dtype=np.float64)
        lo = np.where(np.asarray(left_closed, bool), np.nextafter(left, -np.inf), left)
        hi = np.where(np.asarray(right_closed, bool), right, np.nextafter(right, -np.inf))
        out = self.cdf(hi) - self.cdf(lo)
        out = np.where(np.isnan(out), 0.0, out)
        return np.clip(out, 0.0, 1.0)

    @functools.cached_property
    def median(self) -> float:
        return float(self.ppf(0.5))

    @functools.cached_property
    def sd(self) -> float:
        """Standard deviation by midpoint quadrature on the quantile scale (finite always)."""
        return quantile_sd(self.ppf)

    @property
    def support(self) -> tuple[float, float]:
        lo, hi = (float(b) for b in self.dist.support())
        return max(lo, self.bounds[0]), min(hi, self.bounds[1])

    def describe(self) -> dict[str, Any]:
        out = dict(self.description or {"family": "custom"})
        if math.isfinite(self.bounds[0]) or math.isfinite(self.bounds[1]):
            out["truncated_to"] = [_json_float(b) for b in self.bounds]
        if self.integer:
            out["discretised"] = "integer column: P(Y=k) = F(k+1/2) - F(k-1/2)"
        return out


def quantile_sd(ppf: Callable[[FloatArray], FloatArray], points: int = 1 << 14) -> float:
    """SD of a law given its quantile function (midpoint rule on (0, 1))."""
    q = (np.arange(points) + 0.5) / points
    x = ppf(q)
    return float(np.std(x))


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


def make_prior(
    spec: Mapping[str, Any] | None,
    bounds: tuple[float, float] | None = None,
    integer: bool = False,
    field: str = "prior",
) -> Prior:
    """A Prior from a spec like {"family": "normal", "loc": 0, "scale": 1} and bounds."""
    if bounds is not None:
        lo, hi = float(bounds[0]), float(bounds[1])
        if integer:
            lo, hi = float(math.ceil(lo)), float(math.floor(hi))
        problem = bounds_problem(lo, hi, integer)
        if problem is not None:
            raise MechanismInputError(field, f"declared {problem}")
    else:
        lo, hi = -math.inf, math.inf
    if spec is None:
        if bounds is None:
            raise MechanismInputError(
                field, "interval mechanisms need a declared prior or finite bounds"
            )
        # integers lo..hi: the rounded uniform on [lo - 1/2, hi + 1/2]
        dist = stats.uniform(lo - 0.5, hi - lo + 1.0) if integer else stats.uniform(lo, hi - lo)
        description: dict[str, Any] = {"family": "uniform", "low": lo, "high": hi}
    else:
        family, params = _parse(spec, field)
        dist = _frozen(family, params)
        description = {"family": family, **params}
    prior = Prior(dist, (lo, hi), integer, description)
    if not prior.mass_on_bounds > MIN_MASS:
        raise MechanismInputError(field, "the declared prior puts no mass on the declared bounds")
    problem = concentration_problem(prior)
    if problem is not None:
        raise MechanismInputError(field, problem)
    return prior


def column_prior(column: ColumnMeta, field: str = "params.column") -> Prior:
    """The prior of a numeric column from its public metadata."""
    if column.type not in ("continuous", "integer"):
        raise MechanismInputError(
            field, f"column {column.name!r} is {column.type}; interval privacy needs numbers"
        )
    return make_prior(column.prior, column.bounds, column.type == "integer", field)
