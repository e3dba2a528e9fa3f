"""Every functional and density mechanism on a fixed smooth dataset (issue #32 item 5).

Each case is a registered mechanism at its default params, a public schema, a dataset
drawn once from a fixed seed, and the function the release estimates (the population
mean, density, regression function, covariance or coefficient curves), so that the
Monte Carlo mean over noise seeds of the squared L2 error estimates the expected error
of the release at each ε. ``errors`` returns the per-seed errors; the test compares
their means along an ε grid within their standard errors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.iclp import sums
from mechanisms.iclp.entries import Priced, StreamingFunction
from mechanisms.statistics import whole
from tests.unit.iclp.sim import gp_curves

N = 500
POINTS = 50
GRID = tuple(float(t) for t in np.linspace(0.0, 1.0, POINTS))
T = np.array(GRID)
#: the smooth mean of the functional cases (S1's smoothstep, spec §5.6 stand-in)
MU = 3.0 * T**2 - 2.0 * T**3
TAU = 3.0
#: the density of the density cases: Beta(2, 4) on [0, 1]
DENSITY = stats.beta(2.0, 4.0)
DELTA = Fraction(1, 10**6)


def logit_truth(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """log-odds of the logistic case: a smooth slope of 4 across the range."""
    out: NDArray[np.float64] = 4.0 * (x - 0.5)
    return out


def ridge_truth(x: NDArray[np.float64]) -> NDArray[np.float64]:
    out: NDArray[np.float64] = 0.5 * np.sin(2.0 * np.pi * x)
    return out


def _meta() -> DatasetMeta:
    return DatasetMeta(N, {
        "curves": ColumnMeta("curves", "functional", grid=GRID, norm_bound=TAU),
        "x": ColumnMeta("x", "continuous", (0.0, 1.0)),
        "z": ColumnMeta("z", "continuous", (0.0, 1.0)),
        "y": ColumnMeta("y", "continuous", (-2.0, 2.0)),
        "b": ColumnMeta("b", "integer", (0, 1)),
        "u": ColumnMeta("u", "continuous", (0.0, 1.0)),
    })


META = _meta()


@functools.cache
def data() -> dict[str, NDArray[np.float64]]:
    """The one dataset of every case (seed 0)."""
    rng = np.random.default_rng(0)
    curves = gp_curves(rng, N, mu=MU, sd=0.3, length=0.2)
    x = DENSITY.rvs(N, random_state=rng)
    z = DENSITY.rvs(N, random_state=rng)
    u = rng.uniform(0.0, 1.0, N)
    y = np.clip(ridge_truth(u) + rng.normal(0.0, 0.3, N), -2.0, 2.0)
    b = (rng.uniform(0.0, 1.0, N) < 1.0 / (1.0 + np.exp(-logit_truth(u)))).astype(float)
    # function-on-scalar: Y_i(t) = μ(t) + u_i·sin(πt) + error
    fos = MU + u[:, None] * np.sin(np.pi * T)[None, :] + gp_curves(
        rng, N, mu=np.zeros(POINTS), sd=0.2, length=0.2)
    return {"curves": curves, "x": x, "z": z, "y": y, "b": b, "u": u, "fos": fos}


def _fos_meta() -> DatasetMeta:
    cols = dict(META.columns)
    cols["fos"] = ColumnMeta("fos", "functional", grid=GRID, norm_bound=TAU)
    return DatasetMeta(N, cols)


FOS_META = _fos_meta()


def _curve_error(values: Any) -> float:
    return float(np.mean((np.asarray(values) - MU) ** 2))


def _density_error(values: Any, grid: Any) -> float:
    return float(np.mean((np.asarray(values) - DENSITY.pdf(np.asarray(grid))) ** 2))


def _surface_error(values: Any, grid: Any, grid_y: Any) -> float:
    truth = np.outer(DENSITY.pdf(np.asarray(grid)), DENSITY.pdf(np.asarray(grid_y)))
    return float(np.mean((np.asarray(values) - truth) ** 2))


def _population_cov() -> NDArray[np.float64]:
    t = T
    out: NDArray[np.float64] = 0.3**2 * np.exp(-((t[:, None] - t[None, :]) ** 2)
                                              / (2.0 * 0.2**2))
    return out


@dataclass(frozen=True)
class Case:
    """A mechanism at default params and the squared L2 error of one of its results."""

    mechanism: str
    params: Mapping[str, Any]
    error: Callable[[Mapping[str, Any]], float]
    meta: DatasetMeta = META
    columns: Mapping[str, str] | None = None  # column name -> key of ``data()``

    def budget(self, epsilon: Fraction) -> dict[str, Fraction]:
        mech = registry.get(self.mechanism)
        return ({"epsilon": epsilon, "delta": DELTA} if "delta" in mech.measures
                else {"epsilon": epsilon})

    def errors(self, epsilon: Fraction, seeds: int) -> NDArray[np.float64]:
        """Squared L2 errors of ``seeds`` releases (noise seeds 0..seeds-1)."""
        mech = registry.get(self.mechanism)
        assert isinstance(mech, Priced)
        params = mech.load_params(dict(self.params))
        cost = mech.cost(params, self.budget(epsilon), self.meta)
        source = data()
        cols = {name: source[self.columns.get(name, name) if self.columns else name]
                for name in (mech.columns(params))}
        eps = Fraction(epsilon)
        if isinstance(mech, StreamingFunction):  # the data pass and solve once, then noise
            statistic = mech.statistic(params, cost, self.meta)
            assert isinstance(statistic, sums.PlanPass)
            plan: Any = statistic.plan
            coefficients = plan.coefficients(whole(statistic, cols))
            out = [self.error(mech.output(plan, plan.publish(
                coefficients, np.random.default_rng(1000 + s)), eps).result)
                for s in range(seeds)]
        else:
            out = [self.error(mech.run(cols, params, cost, self.meta,
                                       np.random.default_rng(1000 + s)).result)
                   for s in range(seeds)]
        return np.array(out)

    def stated(self, epsilon: Fraction) -> Mapping[str, Any]:
        mech = registry.get(self.mechanism)
        params = mech.load_params(dict(self.params))
        return mech.price(params, self.budget(epsilon), self.meta)[1]


def _values(check: Callable[..., float], *keys: str) -> Callable[[Mapping[str, Any]], float]:
    return lambda result: check(*(result[k] for k in keys))


def _cov_error(result: Mapping[str, Any]) -> float:
    return float(np.mean((np.asarray(result["values"]) - _population_cov()) ** 2))


def _fos_error(result: Mapping[str, Any]) -> float:
    values = np.asarray(result["values"])
    truth = np.stack([MU, np.sin(np.pi * T)])
    return float(np.mean((values - truth) ** 2))


def _erm_error(truth: Callable[[NDArray[np.float64]], NDArray[np.float64]]
               ) -> Callable[[Mapping[str, Any]], float]:
    def error(result: Mapping[str, Any]) -> float:
        grid = np.asarray(result["grid"])
        return float(np.mean((np.asarray(result["values"]) - truth(grid)) ** 2))
    return error


CURVE = _values(_curve_error, "values")
DENSITY_ERROR = _values(_density_error, "values", "grid")

CASES: dict[str, Case] = {
    "iclp.mean": Case("iclp.mean", {"column": "curves"}, CURVE),
    "frl.mean": Case("frl.mean", {"column": "curves"}, CURVE),
    "iclp.ar": Case("iclp.ar", {"column": "curves"}, CURVE),
    "bernstein.mean": Case("bernstein.mean", {"column": "curves"}, CURVE),
    "gp.adp": Case("gp.adp", {"column": "curves"}, CURVE),
    "iclp.kde": Case("iclp.kde", {"column": "x"}, DENSITY_ERROR),
    "frl.kde": Case("frl.kde", {"column": "x"}, DENSITY_ERROR),
    "bernstein.kde": Case("bernstein.kde", {"column": "x"}, DENSITY_ERROR),
    "iclp.kde2d": Case("iclp.kde2d", {"columns": ["x", "z"]},
                       _values(_surface_error, "values", "grid", "grid_y")),
    "iclp.cov": Case("iclp.cov", {"column": "curves"}, _cov_error),
    "iclp.fos": Case("iclp.fos", {"response": "fos", "covariates": ["u"]}, _fos_error,
                     FOS_META),
    "iclp.erm.square": Case("iclp.erm", {"covariate": "u", "response": "y"},
                            _erm_error(ridge_truth)),
    "iclp.erm.logistic": Case("iclp.erm", {"covariate": "u", "response": "b",
                                           "loss": "logistic"}, _erm_error(logit_truth)),
}
