"""What the coverage suite runs: one or more cases per registered mechanism, or a reason.

Every registered mechanism is in ``CASES`` (its accuracy statement is checked against
simulation) or in ``EXEMPT`` (why its statement is not an interval around a released
number, and where it is checked instead); ``tests/coverage/test_coverage.py`` fails for a
mechanism in neither. ``CI`` names the cases CI runs small (their statements hold today);
the others run only at length in ``make audit``. Moving a case into CI is one line here.

The truths: the exact statistic of the fixed dataset, computed here from the columns
(clipped to the declared bounds: the data are drawn inside them); zero for a functional
mechanism run on zero curves or a zero response (a linear smoother of zero data is zero,
and its noise does not depend on the data); the mean of the other runs for a density,
whose smoothed KDE only the mechanism computes (an unbiased release: the noise is
zero-mean and ``normalize`` is off); the population for a statement about one (subset
designs: shares under a uniform population, a fresh dataset per run).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray
from privrelease_client.reading import Reading

from mechanisms.base import ColumnMeta, DatasetMeta
from tests.coverage.harness import Case, Columns

N = 240
X_BOUNDS = (0.0, 10.0)
GRID = tuple(float(t) for t in np.linspace(0.0, 1.0, 12))
G = ("a", "b", "c", "d")
H = ("p", "q", "r", "s")
META = DatasetMeta(N, {
    "x": ColumnMeta("x", "continuous", bounds=X_BOUNDS),
    "u": ColumnMeta("u", "continuous", bounds=X_BOUNDS),
    "k": ColumnMeta("k", "integer", bounds=(0.0, 5.0)),
    "y": ColumnMeta("y", "continuous", bounds=(-1.0, 1.0)),
    "g": ColumnMeta("g", "categorical", categories=G),
    "h": ColumnMeta("h", "categorical", categories=H),
    "f": ColumnMeta("f", "functional", grid=GRID, norm_bound=2.0),
})
ZCDP = DatasetMeta(N, META.columns, gaussian_accounting="zcdp")
EPS = {"epsilon": Fraction(1)}


def dataset(rng: np.random.Generator) -> Columns:
    """Every column, inside its declared bounds; functional curves and ``y`` are zero."""
    return {"x": rng.beta(2.0, 3.0, N) * 10.0, "u": rng.uniform(0.0, 10.0, N),
            "k": rng.integers(0, 6, N).astype(np.int64), "y": np.zeros(N),
            "g": rng.choice(4, N, p=[0.4, 0.3, 0.2, 0.1]).astype(np.int64),
            "h": rng.integers(0, 4, N).astype(np.int64),
            "f": np.zeros((N, len(GRID)))}


def uniform_categories(rng: np.random.Generator) -> Columns:
    """A fresh draw from the uniform population a subset design's statement is about."""
    return {**dataset(rng), "g": rng.integers(0, 4, N).astype(np.int64),
            "h": rng.integers(0, 4, N).astype(np.int64)}


# ------------------------------------------------------------------ truths


def _scalar(fn: Any) -> Any:
    def truth(data: Columns, reading: Reading) -> NDArray[np.float64]:
        return np.full(len(reading.estimates), float(fn(data)))
    return truth


def _zero(data: Columns, reading: Reading) -> NDArray[np.float64]:
    return np.zeros(len(reading.estimates))


def _unused(data: Columns, reading: Reading) -> NDArray[np.float64]:
    raise AssertionError("the truth is the mean of the other runs")


def _population_share(data: Columns, reading: Reading) -> NDArray[np.float64]:
    """Uniform population: each category's share is 1 / its variable's categories."""
    variables = reading.keys.get("variable") or ["g"] * len(reading.estimates)
    return np.array([1.0 / len(META.columns[str(v)].categories or ()) for v in variables])


def _histogram(bins: int) -> Any:
    def truth(data: Columns, reading: Reading) -> NDArray[np.float64]:
        edges = np.linspace(*X_BOUNDS, bins + 1)
        return np.histogram(data["x"], bins=edges)[0].astype(np.float64)
    return truth


def _cells(statistic: str) -> Any:
    """A cross-tab's cells by their labels: counts, or means of x."""
    def truth(data: Columns, reading: Reading) -> NDArray[np.float64]:
        out = []
        for i in range(len(reading.estimates)):
            rows = np.ones(N, dtype=bool)
            for name, labels in reading.keys.items():
                cats = META.columns[name].categories or ()
                rows &= data[name] == cats.index(str(labels[i]))
            out.append(rows.sum() if statistic == "count" else data["x"][rows].mean())
        return np.asarray(out, dtype=np.float64)
    return truth


def _covariance(data: Columns, reading: Reading) -> NDArray[np.float64]:
    rows, cols = reading.keys["row"], reading.keys["column"]
    return np.array([np.cov(data[str(a)], data[str(b)], bias=True)[0, 1]
                     for a, b in zip(rows, cols, strict=True)])


def _column_means(data: Columns, reading: Reading) -> NDArray[np.float64]:
    return np.array([data[str(c)].astype(np.float64).mean() for c in reading.keys["column"]])


def _vector(data: Columns, reading: Reading) -> NDArray[np.float64]:
    return np.array([data["x"].mean(), float(data["k"].max())])


# ------------------------------------------------------------------ the cases


def _case(label: str, mechanism: str, params: dict[str, Any], truth: Any,
          budget: dict[str, Fraction] = EPS, **kw: Any) -> Case:
    return Case(label, mechanism, params, budget, kw.pop("meta", META),
                kw.pop("data", dataset), truth, **kw)


MEAN = {"statistic": "mean", "column": "x"}
TABLE = {"statistic": "count", "group_by": ["g", "h"]}
DELTA = {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}
FUNCTIONAL: dict[str, dict[str, Any]] = {
    "iclp.mean": {"column": "f"}, "iclp.ar": {"column": "f"}, "frl.mean": {"column": "f"},
    "bernstein.mean": {"column": "f"}, "iclp.cov": {"column": "f"},
    "iclp.fos": {"response": "f", "covariates": ["x"]},
    "iclp.erm": {"covariate": "x", "response": "y"},
}
DENSITIES: dict[str, dict[str, Any]] = {
    "iclp.kde": {"column": "x", "normalize": False},
    "frl.kde": {"column": "x", "normalize": False},
    "bernstein.kde": {"column": "x", "normalize": False},
    "iclp.kde2d": {"columns": ["x", "u"], "normalize": False},
}
SUBSETS: dict[str, dict[str, Any]] = {
    "subset.uniform": {"column": "g"},
    "subset.product": {"columns": ["g", "h"]},
    "subset.custom": {"column": "g", "design": {
        "type": "mu", "subsets": [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"],
                                  ["a", "d"], ["b", "c"]],
        "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]}},
}

CASES: dict[str, Case] = {c.label: c for c in [
    _case("laplace.mean", "laplace", MEAN, _scalar(lambda d: d["x"].mean())),
    _case("laplace.sum", "laplace", {"statistic": "sum", "column": "x"},
          _scalar(lambda d: d["x"].sum())),
    _case("laplace.std", "laplace", {"statistic": "std", "column": "x"},
          _scalar(lambda d: d["x"].std())),
    _case("laplace.histogram", "laplace", {"statistic": "histogram", "column": "x",
                                           "bins": 4}, _histogram(4)),
    _case("laplace.count_table", "laplace", TABLE, _cells("count")),
    _case("laplace.count_table.simultaneous", "laplace",
          {**TABLE, "confidence": {"level": 0.9, "simultaneous": True}}, _cells("count")),
    _case("laplace.consistent", "laplace", {**TABLE, "consistency": True}, _cells("count")),
    _case("laplace.mean_table", "laplace", {**MEAN, "group_by": ["g"]}, _cells("mean")),
    _case("laplace.covariance", "laplace", {"statistic": "covariance",
                                            "columns": ["x", "u"]}, _covariance),
    _case("laplace.covariance.simultaneous", "laplace", {
        "statistic": "covariance", "columns": ["x", "u", "k"],
        "confidence": {"level": 0.9, "simultaneous": True}}, _covariance),
    _case("geometric.count", "geometric", {"statistic": "count", "condition": {
        "column": "x", "op": "ge", "value": 5}}, _scalar(lambda d: (d["x"] >= 5).sum())),
    _case("geometric.histogram", "geometric", {"statistic": "histogram", "column": "x",
                                               "bins": 4}, _histogram(4)),
    _case("geometric.count_table", "geometric", {"statistic": "count", "group_by": ["g"]},
          _cells("count")),
    _case("gaussian.mean", "gaussian", MEAN, _scalar(lambda d: d["x"].mean()), DELTA),
    _case("gaussian.mean.zcdp", "gaussian", MEAN, _scalar(lambda d: d["x"].mean()),
          {"rho": Fraction(1, 2)}, meta=ZCDP),
    _case("gaussian.histogram", "gaussian", {"statistic": "histogram", "column": "x",
                                             "bins": 4}, _histogram(4), DELTA),
    _case("lrm", "lrm", {"columns": ["x"]}, _column_means),
    _case("opm.mean", "opm.mean", {"columns": ["x", "k"]}, _column_means),
    _case("opm.l2ball", "opm.l2ball", {"column": "x"}, _column_means),
    _case("noiseless.aggregate.median", "noiseless.aggregate",
          {"statistic": "median", "column": "x"}, _scalar(lambda d: np.median(d["x"])),
          {"noiseless_bits": Fraction(3)}, fresh=True, runs=(50, 1000)),
    _case("noiseless.aggregate.mean", "noiseless.aggregate", MEAN,
          _scalar(lambda d: d["x"].mean()), {"noiseless_bits": Fraction(2)}, fresh=True,
          runs=(50, 1000)),
    _case("noiseless.vector", "noiseless.vector", {"queries": [
        {"statistic": "mean", "column": "x", "bits": 1},
        {"statistic": "max", "column": "k", "bits": 2}]}, _vector,
        {"noiseless_bits": Fraction(3)}, fresh=True, runs=(50, 1000)),
    *[_case(name, name, params, _zero, runs=(300, 4000)) for name, params in FUNCTIONAL.items()],
    _case("gp.adp", "gp.adp", {"column": "f"}, _zero, DELTA, runs=(300, 4000)),
    *[_case(name, name, params, _unused, truth_kind="others_mean", runs=(300, 4000))
      for name, params in DENSITIES.items()],
    *[_case(name, name, params, _population_share, {"subset_draws": Fraction(1)},
            data=uniform_categories, fresh=True, runs=(300, 3000))
      for name, params in SUBSETS.items()],
]}

#: the cases CI runs small (statements that hold on today's main); the rest run in
#: ``make audit`` only
CI: frozenset[str] = frozenset({
    "laplace.mean", "laplace.sum", "laplace.std", "laplace.histogram",
})

#: registered mechanisms with no case, and why (where their statement is checked)
EXEMPT: dict[str, str] = {
    "dip": "microdata release: its statement is about the distribution of the released"
           " records (total variation, mean and quantile shifts of the noisy-histogram"
           " reference), checked in tests/unit/dip/test_histogram.py and test_copula.py",
    "exm": "draws, not estimates: its statement bounds a draw's count shortfall from the"
           " mode (count_shortfall_95), no interval around a released number",
    "noiseless.local": "microdata release: each record within max_error of its value,"
                       " checked on every dataset of small domains by the noiseless audit"
                       " (mechanisms/noiseless/audit.py)",
    "interval.case1": "interval privacy: each record's released range contains its value"
                      " and the expected coverage under the prior is the notion's defining"
                      " property, checked by the interval audit (tests/audit/interval)",
    "interval.case2": "interval privacy: as interval.case1",
    "interval.casek": "interval privacy: as interval.case1",
    "interval.progressive": "interval privacy: as interval.case1",
    "interval.progressive_categorical": "interval privacy: as interval.case1 (released"
                                        " sets of categories)",
    "interval.ring": "interval privacy: as interval.case1",
    "interval.selective": "interval privacy: as interval.case1",
    "subset.dummy": "states standard errors only for the method-of-moments estimate"
                    " with dummy records; the release's reading draws no interval at a"
                    " level (its privacy metrics are checked by the subset audit)",
}
