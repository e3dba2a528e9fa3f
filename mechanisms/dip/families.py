"""Public parametric references by name: ``{"family": ..., "params": {...}}`` -> F.

Theorem 1's exact invariance needs F fixed before the data are seen, so a
family is described by public parameters only. Each family fits one column
type: continuous families (and ``mixture``) continuous columns, integer
families integer columns, ``categorical`` categorical columns. Families are
truncated to the column's declared bounds, so outputs stay in the domain.
Several columns take ``product`` (independent marginals by column) or
``multivariate_normal`` (continuous columns without declared bounds).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from mechanisms.base import ColumnMeta, MechanismInputError
from mechanisms.dip.reference import Gaussian, Product, Reference
from mechanisms.dip.univariate import (
    FinitePMF,
    Mixture,
    Normal,
    ParametricContinuous,
    ParametricDiscrete,
    Univariate,
)

#: parameter magnitudes beyond this are refused (scipy loses its accuracy long before)
MAX_PARAM = 1e12
MAX_SUPPORT = 100_000


class _Params:
    """Reads a family's params with field-named errors; unknown names are refused."""

    def __init__(self, raw: Any, field: str, allowed: Sequence[str]) -> None:
        if not isinstance(raw, Mapping):
            raise MechanismInputError(field, "must be an object")
        extra = sorted(set(raw) - set(allowed))
        if extra:
            raise MechanismInputError(
                f"{field}.{extra[0]}", f"unknown parameter; allowed: {', '.join(allowed)}"
            )
        self.raw, self.field = raw, field

    def number(self, name: str, default: float | None = None, *, positive: bool = False,
               unit: bool = False, integer: bool = False) -> float:
        field = f"{self.field}.{name}"
        if name not in self.raw:
            if default is None:
                raise MechanismInputError(field, "required")
            return default
        value = self.raw[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise MechanismInputError(field, "must be a number")
        x = float(value)
        if not math.isfinite(x) or abs(x) > MAX_PARAM:
            raise MechanismInputError(field, f"must be finite and at most {MAX_PARAM:g} in size")
        if positive and not x > 0:
            raise MechanismInputError(field, "must be positive")
        if unit and not 0.0 <= x <= 1.0:
            raise MechanismInputError(field, "must be in [0, 1]")
        if integer and x != math.floor(x):
            raise MechanismInputError(field, "must be an integer")
        return x

    def numbers(self, name: str, *, required: bool = True) -> list[float] | None:
        field = f"{self.field}.{name}"
        if name not in self.raw:
            if required:
                raise MechanismInputError(field, "required")
            return None
        value = self.raw[name]
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_SUPPORT:
            raise MechanismInputError(field, f"must be a list of 1 to {MAX_SUPPORT} numbers")
        out = []
        for v in value:
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise MechanismInputError(field, "must contain finite numbers only")
            out.append(float(v))
        return out


def _normal(p: _Params) -> stats.rv_continuous:
    return stats.norm(p.number("loc", 0.0), p.number("scale", 1.0, positive=True))


def _uniform(p: _Params) -> stats.rv_continuous:
    low, high = p.number("low"), p.number("high")
    if not low < high:
        raise MechanismInputError(f"{p.field}.high", "must exceed low")
    return stats.uniform(low, high - low)


def _beta(p: _Params) -> stats.rv_continuous:
    return stats.beta(p.number("a", positive=True), p.number("b", positive=True),
                      p.number("loc", 0.0), p.number("scale", 1.0, positive=True))


def _exponential(p: _Params) -> stats.rv_continuous:
    return stats.expon(p.number("loc", 0.0), p.number("scale", 1.0, positive=True))


def _gamma(p: _Params) -> stats.rv_continuous:
    return stats.gamma(p.number("shape", positive=True), p.number("loc", 0.0),
                       p.number("scale", 1.0, positive=True))


def _lognormal(p: _Params) -> stats.rv_continuous:
    mu = p.number("mu", 0.0)
    if abs(mu) > 700:
        raise MechanismInputError(f"{p.field}.mu", "must be within ±700")
    return stats.lognorm(p.number("sigma", 1.0, positive=True), scale=math.exp(mu))


def _laplace(p: _Params) -> stats.rv_continuous:
    return stats.laplace(p.number("loc", 0.0), p.number("scale", 1.0, positive=True))


def _student_t(p: _Params) -> stats.rv_continuous:
    return stats.t(p.number("df", positive=True), p.number("loc", 0.0),
                   p.number("scale", 1.0, positive=True))


def _bernoulli(p: _Params) -> stats.rv_discrete:
    return stats.bernoulli(p.number("p", unit=True))


def _binomial(p: _Params) -> stats.rv_discrete:
    return stats.binom(int(p.number("n", positive=True, integer=True)), p.number("p", unit=True))


def _poisson(p: _Params) -> stats.rv_discrete:
    return stats.poisson(p.number("mu", positive=True))


def _geometric(p: _Params) -> stats.rv_discrete:
    prob = p.number("p", unit=True)
    if prob == 0:
        raise MechanismInputError(f"{p.field}.p", "must be positive")
    return stats.geom(prob, loc=int(p.number("loc", 0.0, integer=True)))


def _negative_binomial(p: _Params) -> stats.rv_discrete:
    prob = p.number("p", unit=True)
    if prob == 0:
        raise MechanismInputError(f"{p.field}.p", "must be positive")
    return stats.nbinom(p.number("n", positive=True), prob)


def _discrete_uniform(p: _Params) -> stats.rv_discrete:
    low, high = p.number("low", integer=True), p.number("high", integer=True)
    if not low <= high:
        raise MechanismInputError(f"{p.field}.high", "must be at least low")
    return stats.randint(int(low), int(high) + 1)


Builder = Callable[[_Params], Any]
#: continuous families for continuous columns: name -> (builder, parameter names)
CONTINUOUS: dict[str, tuple[Builder, tuple[str, ...]]] = {
    "normal": (_normal, ("loc", "scale")),
    "uniform": (_uniform, ("low", "high")),
    "beta": (_beta, ("a", "b", "loc", "scale")),
    "exponential": (_exponential, ("loc", "scale")),
    "gamma": (_gamma, ("shape", "loc", "scale")),
    "lognormal": (_lognormal, ("mu", "sigma")),
    "laplace": (_laplace, ("loc", "scale")),
    "student_t": (_student_t, ("df", "loc", "scale")),
}
#: integer families for integer columns
DISCRETE: dict[str, tuple[Builder, tuple[str, ...]]] = {
    "bernoulli": (_bernoulli, ("p",)),
    "binomial": (_binomial, ("n", "p")),
    "poisson": (_poisson, ("mu",)),
    "geometric": (_geometric, ("p", "loc")),
    "negative_binomial": (_negative_binomial, ("n", "p")),
    "discrete_uniform": (_discrete_uniform, ("low", "high")),
}
UNIVARIATE = (*CONTINUOUS, *DISCRETE, "pmf", "categorical", "mixture")
MULTIVARIATE = ("product", "multivariate_normal")
FAMILIES = (*UNIVARIATE, *MULTIVARIATE)


def _continuous(family: str, raw: Any, field: str, lo: float | None,
                hi: float | None) -> ParametricContinuous:
    build, names = CONTINUOUS[family]
    dist = build(_Params(raw, field, names))
    if family == "normal":  # the fast path: same law, no scipy call overhead
        loc, scale = dist.args
        return Normal(loc, scale, lo, hi)
    return ParametricContinuous(dist, lo, hi)


def _bounds(column: ColumnMeta) -> tuple[float | None, float | None]:
    if column.bounds is None:
        return None, None
    lo, hi = (float(b) for b in column.bounds)
    return (lo if math.isfinite(lo) else None), (hi if math.isfinite(hi) else None)


def _wrong_type(field: str, family: str, column: ColumnMeta) -> MechanismInputError:
    return MechanismInputError(
        field, f"family {family!r} does not fit column {column.name!r} ({column.type})"
    )


def univariate(family: str, raw: Any, column: ColumnMeta, field: str) -> Univariate:
    """The one-dimensional reference ``family(params)`` for ``column``, truncated to its bounds."""
    lo, hi = _bounds(column)
    params_field = f"{field}.params"
    try:
        if family in CONTINUOUS:
            if column.type != "continuous":
                raise _wrong_type(f"{field}.family", family, column)
            return _continuous(family, raw, params_field, lo, hi)
        if family in DISCRETE:
            if column.type != "integer":
                raise _wrong_type(f"{field}.family", family, column)
            build, names = DISCRETE[family]
            return ParametricDiscrete(build(_Params(raw, params_field, names)), lo, hi)
        if family == "pmf":
            return _pmf(raw, column, params_field, lo, hi)
        if family == "categorical":
            return _categorical(raw, column, params_field)
        if family == "mixture":
            return _mixture(raw, column, params_field, lo, hi)
    except ValueError as exc:
        if isinstance(exc, MechanismInputError):
            raise
        raise MechanismInputError(params_field, str(exc)) from None
    raise MechanismInputError(
        f"{field}.family", f"{family!r} describes several columns; use it for all of them"
    )


def _pmf(raw: Any, column: ColumnMeta, field: str, lo: float | None,
         hi: float | None) -> Univariate:
    if column.type != "integer":
        raise _wrong_type(field.rsplit(".", 1)[0] + ".family", "pmf", column)
    p = _Params(raw, field, ("support", "probs"))
    support, probs = p.numbers("support"), p.numbers("probs")
    assert support is not None and probs is not None
    if len(support) != len(probs):
        raise MechanismInputError(f"{field}.probs", "needs one probability per support point")
    if any(s != math.floor(s) for s in support):
        raise MechanismInputError(f"{field}.support", "must be integers for an integer column")
    if (lo is not None and min(support) < lo) or (hi is not None and max(support) > hi):
        raise MechanismInputError(f"{field}.support", "must lie inside the declared bounds")
    return FinitePMF(support, probs)


def _categorical(raw: Any, column: ColumnMeta, field: str) -> Univariate:
    if column.type != "categorical" or not column.categories:
        raise _wrong_type(field.rsplit(".", 1)[0] + ".family", "categorical", column)
    probs = _Params(raw, field, ("probs",)).numbers("probs")
    assert probs is not None
    if len(probs) != len(column.categories):
        raise MechanismInputError(f"{field}.probs", "needs one probability per category")
    return FinitePMF(np.arange(len(probs)), probs)


def _mixture(raw: Any, column: ColumnMeta, field: str, lo: float | None,
             hi: float | None) -> Univariate:
    if column.type != "continuous":
        raise _wrong_type(field.rsplit(".", 1)[0] + ".family", "mixture", column)
    p = _Params(raw, field, ("atoms", "weights", "continuous"))
    atoms, weights = p.numbers("atoms"), p.numbers("weights")
    assert atoms is not None and weights is not None
    if len(atoms) != len(weights):
        raise MechanismInputError(f"{field}.weights", "needs one weight per atom")
    order = np.argsort(atoms)
    cont = None
    if "continuous" in raw:
        spec = raw["continuous"]
        if not isinstance(spec, Mapping) or spec.get("family") not in CONTINUOUS:
            raise MechanismInputError(
                f"{field}.continuous", f"must be {{family, params}} with family one of"
                f" {', '.join(CONTINUOUS)}"
            )
        cont = _continuous(
            spec["family"], spec.get("params", {}), f"{field}.continuous.params", lo, hi
        )
    elif (lo is not None and min(atoms) < lo) or (hi is not None and max(atoms) > hi):
        raise MechanismInputError(f"{field}.atoms", "must lie inside the declared bounds")
    return Mixture([atoms[i] for i in order], [weights[i] for i in order], cont)


def reference(
    family: str, raw: Any, columns: Sequence[ColumnMeta], field: str = "params.reference"
) -> Reference:
    """The joint parametric reference for ``columns`` (in request order)."""
    names = [c.name for c in columns]
    if family == "multivariate_normal":
        for c in columns:
            if c.type != "continuous":
                raise _wrong_type(f"{field}.family", family, c)
            if c.bounds is not None and any(math.isfinite(float(b)) for b in c.bounds):
                raise MechanismInputError(
                    f"{field}.family", f"multivariate_normal cannot be truncated to the bounds"
                    f" of column {c.name!r}; use product with truncated marginals"
                )
        p = _Params(raw, f"{field}.params", ("mean", "cov"))
        mean = p.numbers("mean")
        cov = raw.get("cov")
        if not (isinstance(cov, list) and all(isinstance(r, list) for r in cov)):
            raise MechanismInputError(f"{field}.params.cov", "must be a list of rows")
        try:
            return Gaussian(names, mean or [], np.asarray(cov, dtype=np.float64))
        except (ValueError, TypeError) as exc:
            raise MechanismInputError(f"{field}.params", str(exc)) from None
    if family == "product":
        if not isinstance(raw, Mapping) or sorted(raw) != sorted(names):
            raise MechanismInputError(
                f"{field}.params", "product needs one {family, params} entry per column"
            )
        marginals = {}
        for c in columns:
            spec = raw[c.name]
            sub = f"{field}.params.{c.name}"
            if not isinstance(spec, Mapping) or spec.get("family") not in UNIVARIATE:
                raise MechanismInputError(f"{sub}.family", "must be a one-column family")
            marginals[c.name] = univariate(spec["family"], spec.get("params", {}), c, sub)
        return Product(marginals)
    if len(columns) != 1:
        raise MechanismInputError(
            f"{field}.family", f"{family!r} describes one column; use product or"
            " multivariate_normal for several"
        )
    return Product({names[0]: univariate(family, raw, columns[0], field)})
