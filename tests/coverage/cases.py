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

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray
from privrelease_client.reading import Reading

from mechanisms.base import ColumnMeta, DatasetMeta, Output
from tests.coverage.harness import Case, Check, Columns, Truth

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
    "v": ColumnMeta("v", "continuous", bounds=(-1.0, 1.0)),
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
            "v": rng.uniform(-1.0, 1.0, N),
            "g": rng.choice(4, N, p=[0.4, 0.3, 0.2, 0.1]).astype(np.int64),
            "h": rng.integers(0, 4, N).astype(np.int64),
            "f": np.zeros((N, len(GRID)))}


def uniform_categories(rng: np.random.Generator) -> Columns:
    """A fresh draw from the uniform population a subset design's statement is about."""
    return {**dataset(rng), "g": rng.integers(0, 4, N).astype(np.int64),
            "h": rng.integers(0, 4, N).astype(np.int64)}


# ------------------------------------------------------------------ truths


def _scalar(fn: Callable[[Columns], Any]) -> Truth:
    def truth(data: Columns, reading: Reading) -> NDArray[np.float64]:
        return np.full(len(reading.estimates), float(fn(data)))
    return truth


def _zero(data: Columns, reading: Reading) -> NDArray[np.float64]:
    return np.zeros(len(reading.estimates))


def _unused(data: Columns, reading: Reading) -> NDArray[np.float64]:
    raise AssertionError("this case's truth is the other runs' mean, or its check's own")


def _population_share(data: Columns, reading: Reading) -> NDArray[np.float64]:
    """Uniform population: each category's share is 1 / its variable's categories."""
    variables = reading.keys.get("variable") or ["g"] * len(reading.estimates)
    return np.array([1.0 / len(META.columns[str(v)].categories or ()) for v in variables])


def _histogram(bins: int) -> Truth:
    def truth(data: Columns, reading: Reading) -> NDArray[np.float64]:
        edges = np.linspace(*X_BOUNDS, bins + 1)
        return np.histogram(data["x"], bins=edges)[0].astype(np.float64)
    return truth


def _cells(statistic: str) -> Truth:
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
    """The sample covariance (over n - 1) of each released entry's pair of columns."""
    return np.array([np.cov(data[str(a)], data[str(b)])[0, 1]
                     for a, b in zip(rows, cols, strict=True)])


def _column_means(data: Columns, reading: Reading) -> NDArray[np.float64]:
    return np.array([data[str(c)].astype(np.float64).mean() for c in reading.keys["column"]])


def _vector(data: Columns, reading: Reading) -> NDArray[np.float64]:
    return np.array([data["x"].mean(), float(data["k"].max())])


# ------------------------------------------------------------------ statements on outputs
# each returns the run's scaled errors (<= 1: the statement held) and the stated level

#: the scaled error of a value outside a released set (containment has no width)
OUTSIDE = 2.0


def _quantile_ranks(data: Columns, out: Output) -> tuple[NDArray[np.float64], float]:
    """With 95 %, the records at or below a released quantile differ from q n by at most
    ``ci95_rank_error`` more than the best public candidate's do."""
    acc, lo = out.accuracy, X_BOUNDS[0]
    x = np.sort(data["x"])
    candidates = lo + acc["candidate_step"] * np.arange(acc["candidates"])
    errors = []
    for q, v in zip(out.result["quantiles"], out.result["values"], strict=True):
        best = np.abs(np.searchsorted(x, candidates, side="right") - q * N).min()
        excess = abs(np.searchsorted(x, v, side="right") - q * N) - best
        errors.append(max(excess, 0.0) / acc["ci95_rank_error"])
    return np.asarray(errors), 0.95


def _draw_shortfall(data: Columns, out: Output) -> tuple[NDArray[np.float64], float]:
    """With 95 %, a draw's count is within ``count_shortfall_95`` of the largest count."""
    assert out.table is not None
    counts = np.bincount(data["g"], minlength=len(G))
    drawn = np.array([G.index(str(v)) for v in out.table["g"]])
    return (counts.max() - counts[drawn]) / out.accuracy["count_shortfall_95"], 0.95


def _record_noise(data: Columns, out: Output) -> tuple[NDArray[np.float64], float]:
    """lrm: with 95 %, each released value is within its column's value_ci95_halfwidth."""
    assert out.table is not None and out.row_column is not None
    half = out.accuracy["columns"]["x"]["value_ci95_halfwidth"]
    rows = np.asarray(out.table[out.row_column])
    released = np.empty(N)
    released[rows] = out.table["x"]
    return np.abs(released - data["x"]) / half, 0.95


def _record_bins(data: Columns, out: Output) -> tuple[NDArray[np.float64], float]:
    """noiseless.local: every record within ``max_error`` of its value (always)."""
    assert out.table is not None
    return np.abs(np.asarray(out.table["x"]) - data["x"]) / out.accuracy["max_error"], 1.0


def _contains(data: Columns, out: Output) -> tuple[NDArray[np.float64], float]:
    """Interval privacy: every released range (a union of pieces ``left``/``right``,
    ``left_2``/``right_2``, ...; an unused piece is NaN) contains the record's value
    (always); a null (not released) states nothing."""
    assert out.table is not None
    t, v = out.table, data["k"].astype(np.float64)
    inside = np.zeros(N, dtype=bool)
    piece = 1
    while (left := f"left{'' if piece == 1 else f'_{piece}'}") in t:
        end = left.replace("left", "right")
        lo_ok = np.where(t[left.replace("left", "left_closed")] == 1, t[left] <= v, t[left] < v)
        hi_ok = np.where(t[end.replace("right", "right_closed")] == 1, v <= t[end], v < t[end])
        inside |= lo_ok & hi_ok  # NaN ends compare False: an unused piece holds nothing
        piece += 1
    return np.where(t["released"] == 1, np.where(inside, 0.0, OUTSIDE), np.nan), 1.0


def _contains_category(column: str) -> Check:
    """A released set (a bitmask over the categories) holds the record's category
    (always); the table's records are the rows, in their order."""
    def check(data: Columns, out: Output) -> tuple[NDArray[np.float64], float]:
        assert out.table is not None
        name = "set_mask" if "set_mask" in out.table else column
        masks = np.asarray(out.table[name]).astype(np.int64)
        return np.where((masks >> data[column]) & 1 == 1, 0.0, OUTSIDE), 1.0
    return check


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
CALIBRATED = {"column": "k", "calibrate": True, "transform": "exp"}
INTERVALS: dict[str, dict[str, Any]] = {
    "interval.case1": CALIBRATED, "interval.case2": CALIBRATED,
    "interval.casek": {**CALIBRATED, "m": 3}, "interval.ring": CALIBRATED,
    "interval.selective": {**CALIBRATED, "tau": 0.5},
    "interval.progressive": {"column": "k", "rounds": 2},
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
          _scalar(lambda d: d["x"].std(ddof=1))),
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
    *[_case(name, name, params, _zero, runs=(100, 1000) if name == "iclp.erm" else (300, 4000))
      for name, params in FUNCTIONAL.items()],
    _case("iclp.fos.small_covariate", "iclp.fos", {"response": "f", "covariates": ["v"],
                                             "intercept": True}, _zero, runs=(300, 4000)),
    _case("gp.adp", "gp.adp", {"column": "f"}, _zero, DELTA, runs=(300, 4000)),
    *[_case(name, name, params, _unused, truth_kind="others_mean", runs=(300, 4000))
      for name, params in DENSITIES.items()],
    *[_case(name, name, params, _population_share, {"subset_draws": Fraction(1)},
            data=uniform_categories, fresh=True, runs=(300, 3000))
      for name, params in SUBSETS.items()],
    _case("laplace.quantile", "laplace", {"statistic": "quantile", "column": "x",
                                          "quantiles": [0.1, 0.5, 0.9]}, _unused,
          check=_quantile_ranks, runs=(100, 1000)),
    _case("exm", "exm", {"column": "g", "draws": 3}, _unused, check=_draw_shortfall),
    _case("lrm.records", "lrm", {"columns": ["x"]}, _unused, check=_record_noise),
    _case("noiseless.local", "noiseless.local", {"column": "x"}, _unused,
          {"noiseless_bits": Fraction(3)}, check=_record_bins, fresh=True, runs=(50, 1000)),
    *[_case(name, name, params, _unused,
            {"interval_leakage": Fraction(90 if name == "interval.progressive" else 15, 100)},
            check=_contains, fresh=True, runs=(10, 300))
      for name, params in INTERVALS.items()],
    _case("interval.progressive_categorical", "interval.progressive_categorical",
          {"column": "g", "rounds": 1}, _unused, {"interval_leakage": Fraction(6, 10)},
          check=_contains_category("g"), fresh=True, runs=(10, 300)),
    *[_case(f"{name}.contains", name, params, _unused, {"subset_draws": Fraction(1)},
            check=_contains_category("g"), fresh=True, runs=(10, 300))
      for name, params in SUBSETS.items()],
]}

#: the cases CI runs small (statements that hold on today's main); the rest run in
#: ``make audit`` only
CI: frozenset[str] = frozenset({
    "laplace.mean", "laplace.sum", "laplace.std", "laplace.histogram", "laplace.count_table",
    "laplace.count_table.simultaneous", "laplace.consistent", "laplace.mean_table",
    "laplace.covariance", "laplace.covariance.simultaneous", "laplace.quantile",
    "geometric.count", "geometric.histogram", "geometric.count_table",
    "gaussian.mean", "gaussian.mean.zcdp", "gaussian.histogram",
    "lrm", "lrm.records", "opm.mean", "opm.l2ball", "exm",
    "noiseless.aggregate.median", "noiseless.aggregate.mean", "noiseless.vector",
    "noiseless.local",
    "iclp.mean", "iclp.ar", "iclp.fos", "iclp.fos.small_covariate", "iclp.kde", "iclp.kde2d",
    "iclp.cov", "frl.mean", "frl.kde", "bernstein.mean", "bernstein.kde", "gp.adp",
    "subset.uniform", "subset.product", "subset.custom", "subset.uniform.contains",
    "subset.product.contains", "subset.custom.contains",
    "interval.case1", "interval.case2", "interval.casek", "interval.ring",
    "interval.selective", "interval.progressive", "interval.progressive_categorical",
})

#: registered mechanisms with no case, and why (where their statement is checked)
EXEMPT: dict[str, str] = {
    "dip": "microdata release: its statement is about the distribution of the released"
           " records (total variation, mean and quantile shifts of the noisy-histogram"
           " reference), checked in tests/unit/dip/test_histogram.py and test_copula.py",
    "subset.dummy": "its records are interleaved with dummy records at secret positions,"
                    " so containment can not be checked per row from the output, and it"
                    " states standard errors without an interval at a level; the subset"
                    " audit (mechanisms/subset/audit.py) checks its design's laws",
}
