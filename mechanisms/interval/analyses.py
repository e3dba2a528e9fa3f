"""Free post-processing of interval releases (Thm 6): NPMLE, Example-2 mean, moments,
Algorithm-1 regression. They read only the released table and public metadata."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from mechanisms.base import Analysis, MechanismInputError, ReleaseView
from mechanisms.interval import schemas
from mechanisms.interval.designs import pieces_from_table
from mechanisms.interval.estimators import example2_mean, moments
from mechanisms.interval.npmle import NPMLEResult, npmle, npmle_case1, result_summary
from mechanisms.interval.priors import column_prior
from mechanisms.interval.ranges import FloatArray, Pieces, points
from mechanisms.interval.regression import Learner, LeastSquares, algorithm1, sklearn_learner


def _design(release: ReleaseView) -> dict[str, Any]:
    design = release.result.get("design")
    if not isinstance(design, Mapping):
        raise MechanismInputError("release", "this release carries no interval design")
    return dict(design)


def _column(release: ReleaseView, name: str) -> NDArray[Any]:
    if release.table is None or name not in release.table:
        raise MechanismInputError("release", f"the release table has no {name!r} column")
    return np.asarray(release.table[name])


def _ranges(release: ReleaseView) -> tuple[Pieces, NDArray[np.bool_], FloatArray]:
    """Released ranges with exact reports as points, the released mask, and exact values."""
    if release.table is None:
        raise MechanismInputError("release", "the release has no table")
    pieces = pieces_from_table(release.table)
    exact = _column(release, "exact").astype(np.float64)
    released = _column(release, "released").astype(bool)
    is_exact = ~np.isnan(exact)
    if np.any(is_exact):
        pad = pieces.width - 1
        pt = points(np.where(is_exact, exact, 0.0))
        if pad:
            blank = Pieces(np.full((pieces.n, pad), np.nan), np.full((pieces.n, pad), np.nan),
                           np.zeros((pieces.n, pad), bool), np.zeros((pieces.n, pad), bool))
            pt = Pieces.concat([pt, blank])
        pieces = pt.where(is_exact, pieces)
    return pieces, released, exact


def _support(release: ReleaseView) -> tuple[float, float]:
    column = release.result.get("column") or release.params.get("column")
    return column_prior(release.meta.column(str(column)), "release").support


def _case1_ready(design: Mapping[str, Any], exact: FloatArray) -> bool:
    return (design.get("partition") == "canonical" and design.get("m") == 2
            and design.get("transform") == "identity" and not np.any(~np.isnan(exact)))


def _identifiability_warnings(design: Mapping[str, Any], support: tuple[float, float]
                              ) -> list[str]:
    warnings: list[str] = []
    selective = design.get("selective")
    if selective:
        tau = float(selective["tau"])
        if design.get("partition") == "canonical" and design.get("m") == 2 and tau > 0.5:
            warnings.append(
                "non-identifiable: selective Case-I with tau > 1/2 collects delta = 1 only where"
                " F(u) >= tau and delta = 0 only where F(u) <= 1 - tau, so the NPMLE is"
                " inconsistent (tau-resolvability fails, spec §3.4)")
        else:
            warnings.append(
                "selectively collected data: the NPMLE is consistent only under"
                " tau-resolvability (Prop 4), which is not verified for this design")
    # progressive stopping is decided from released answers only (designs.Progressive), so
    # it is ignorable for the likelihood: no warning (the old value-dependent rule was not)
    anchors = design.get("anchors")
    if isinstance(anchors, Mapping) and anchors.get("family") == "uniform" and (
        design.get("transform") == "identity"
    ):
        low, high = anchors.get("low"), anchors.get("high")
        if low is not None and high is not None and (low > support[0] or high < support[1]):
            warnings.append(
                f"F is not identified outside the anchor support [{low:g}, {high:g}]:"
                " the data's support is wider")
    return warnings


def _fit_npmle(release: ReleaseView, params: Mapping[str, Any]) -> tuple[NPMLEResult,
                                                                         list[str], int]:
    design = _design(release)
    pieces, released, exact = _ranges(release)
    used = released & ~pieces.empty().all(axis=1)
    if not np.any(used):
        raise MechanismInputError("release", "no released ranges to estimate from")
    method = params["method"]
    if method == "auto":
        method = "pava" if _case1_ready(design, exact[used]) else "auto"
    kwargs: dict[str, Any] = {"tol": params["tol"]}
    if method == "pava":
        if not _case1_ready(design, exact[used]):
            raise MechanismInputError("params.method", "pava needs Case-I ranges on the raw"
                                      " column without exact reports")
        u = _column(release, "anchor_1").astype(np.float64)[used]
        delta = _column(release, "delta").astype(np.float64)[used]
        res = npmle_case1(u, delta, **kwargs)
    else:
        if "max_iter" in params:
            kwargs["max_iter"] = params["max_iter"]
        res = npmle(pieces.take(used), method, **kwargs)
    warnings = _identifiability_warnings(design, _support(release))
    if not res.converged:
        warnings.append(f"not converged: KKT gap {res.kkt_gap:.3g} after {res.iterations}"
                        " iterations; raise max_iter")
    return res, warnings, int(pieces.n - np.count_nonzero(used))


class NPMLEAnalysis(Analysis):
    """Nonparametric MLE of the column's distribution from the released ranges."""

    name = "npmle"
    params_schema = schemas.NPMLEParams

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        res, warnings, skipped = _fit_npmle(release, params)
        out = result_summary(res)
        lower, upper = res.tail_mass()
        out.update({"tail_mass": {"below_all_ends": lower, "above_all_ends": upper},
                    "n_null": skipped, "warnings": warnings})
        return out


class MeanAnalysis(Analysis):
    """Example 2: the unbiased mean from Case-I ranges with uniform anchors on [a, b]."""

    name = "mean"
    params_schema = schemas.MeanParams

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        design = _design(release)
        warnings: list[str] = []
        transform = design.get("transform", "identity")
        if design.get("partition") == "progressive":
            rounds = _column(release, "rounds")
            if np.any(rounds < 1):
                raise MechanismInputError(
                    "release", "Example 2 needs every record's first answer; this release has"
                    " records without one (stopping selected them)")
            u = _column(release, "anchor_1").astype(np.float64)
            delta = _column(release, "answer_1").astype(np.float64)
            a, b = (float(v) for v in design["support"])
        else:
            anchors = design.get("anchors")
            if (design.get("partition") != "canonical" or design.get("m") != 2
                    or not isinstance(anchors, Mapping) or anchors.get("family") != "uniform"
                    or design.get("selective")):
                raise MechanismInputError(
                    "release", "Example 2's mean needs Case-I ranges with uniform anchors"
                    " (interval.case1 with anchors.family = uniform, or progressive)")
            if design.get("exact_cells") or design.get("exact_range"):
                raise MechanismInputError("release", "Example 2 needs ranges without exact"
                                          " reports")
            u = _column(release, "anchor_1").astype(np.float64)
            delta = _column(release, "delta").astype(np.float64)
            a, b = float(anchors["low"]), float(anchors["high"])
            lo, hi = _support(release)
            if transform != "identity":
                from mechanisms.interval.transforms import Transform

                lo, hi = Transform(transform).image_support(lo, hi)
            if lo < a or hi > b:
                warnings.append(
                    f"values outside the anchor range [{a:g}, {b:g}] count as its ends (bias):"
                    " Example 2 is unbiased only when Y lies in [a, b]")
        est = example2_mean(u, delta, a, b, clip=params["clip"])
        lo_ci, hi_ci = est.ci95
        estimand = "E[Y]" if transform == "identity" else f"E[{transform}(Y)]"
        return {"estimate": est.value, "se": est.se, "ci95": [lo_ci, hi_ci], "n": est.n,
                "a": a, "b": b, "estimand": estimand, "clipped": params["clip"],
                "warnings": warnings}


class MomentsAnalysis(Analysis):
    """Plug-in moments ∫ y^k dF̂ of the NPMLE under a stated mass-placement convention."""

    name = "moments"
    params_schema = schemas.MomentsParams

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        res, warnings, skipped = _fit_npmle(release, params)
        support = _support(release)
        values, more = moments(res, params["orders"], params["convention"], support)
        out: dict[str, Any] = {
            "moments": {str(k): v for k, v in values.items()},
            "convention": params["convention"],
            "support": [s if math.isfinite(s) else None for s in support],
            "tail_mass": dict(zip(("below_all_ends", "above_all_ends"), res.tail_mass(),
                                  strict=True)),
            "npmle": {"iterations": res.iterations, "kkt_gap": res.kkt_gap,
                      "converged": res.converged, "method": res.method, "n_used": res.n},
            "n_null": skipped,
            "warnings": warnings + more,
        }
        if 1 in values and 2 in values:
            out["variance"] = max(0.0, values[2] - values[1] ** 2)
        return out


def _learner(spec: Mapping[str, Any]) -> Learner:
    kind = spec["type"]
    if kind == "linear":
        return LeastSquares(1)
    if kind == "polynomial":
        return LeastSquares(int(spec["degree"]))
    try:
        return sklearn_learner(spec["estimator"], spec.get("options"))
    except ValueError as err:
        raise MechanismInputError("params.learner", str(err)) from None


def _regress(release: ReleaseView, features: FloatArray, names: list[str],
             params: Mapping[str, Any]) -> dict[str, Any]:
    pieces, released, exact = _ranges(release)
    if features.shape[0] != pieces.n:
        raise MechanismInputError(
            "params.features", f"need one feature row per record ({pieces.n} rows)")
    if not np.all(np.isfinite(features)):
        raise MechanismInputError("params.features", "features must be finite numbers")
    design = _design(release)
    warnings = []
    if design.get("selective") or design.get("partition") == "progressive":
        warnings.append("rows were collected selectively: the fit uses released rows only and"
                        " may be biased if collection depends on the features")
    used = released
    x = features[used]
    learner = _learner(params["learner"])
    noise = params["noise"]
    init = None
    if params["init"] == "midpoint":
        lo, hi = pieces.take(used).half_open()
        mid = np.where(np.isfinite(lo[:, 0]) & np.isfinite(hi[:, 0]), 0.5 * (lo[:, 0] + hi[:, 0]),
                       np.where(np.isfinite(lo[:, 0]), lo[:, 0], hi[:, 0]))
        mid = np.where(np.isnan(exact[used]), mid, exact[used])
        mid = np.where(np.isfinite(mid), mid, 0.0)
        init = np.asarray(_learner(params["learner"]).fit(x, mid).predict(x), dtype=np.float64)
    try:
        res = algorithm1(x, pieces.take(used), learner, noise["family"], noise["scale"],
                         exact=exact[used], tol=params["tol"], max_iter=params["max_iter"],
                         init=init)
    except ValueError as err:
        raise MechanismInputError("params", str(err)) from None
    if not res.converged:
        warnings.append(f"not converged after {res.iterations} iterations (max change"
                        f" {res.max_change:.3g}); raise max_iter")
    out: dict[str, Any] = {
        "iterations": res.iterations,
        "converged": res.converged,
        "max_change": res.max_change,
        "noise": {"family": noise["family"], "scale": res.scale,
                  "estimated": noise["scale"] is None},
        "loglik": res.loglik,
        "loglik_history": res.history[-50:],
        "n_used": int(x.shape[0]),
        "n_null": int(pieces.n - x.shape[0]),
        "warnings": warnings,
    }
    if isinstance(learner, LeastSquares):
        assert learner.coef is not None
        out["coefficients"] = dict(zip(learner.term_names(names),
                                       (float(c) for c in learner.coef), strict=True))
    if "predict" in params:
        rows = np.asarray(params["predict"], dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != features.shape[1]:
            raise MechanismInputError("params.predict", f"rows need {features.shape[1]} numbers")
        out["predictions"] = [float(v) for v in learner.predict(rows)]
    return out


def _matrix(rows: list[list[float]], field: str) -> FloatArray:
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise MechanismInputError(field, "every row needs the same number of features")
    return np.asarray(rows, dtype=np.float64)


class RegressionAnalysis(Analysis):
    """Algorithm 1 with features given inline (``features``: n rows × d, row order)."""

    name = "regression"
    params_schema = schemas.RegressionParams

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        x = _matrix(params["features"], "params.features")
        names = list(params.get("feature_names") or [f"x{i + 1}" for i in range(x.shape[1])])
        if len(names) != x.shape[1]:
            raise MechanismInputError("params.feature_names", "one name per feature column")
        return _regress(release, x, names, params)


class RegressionReleaseAnalysis(Analysis):
    """Algorithm 1 with features from another release's table (``columns``)."""

    name = "regression_release"
    params_schema = schemas.RegressionReleaseParams
    n_others: ClassVar[int] = 1

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        if len(others) != 1 or others[0].table is None:
            raise MechanismInputError("params.releases", "name one release whose table holds"
                                      " the features")
        table = others[0].table
        cols = []
        for name in params["columns"]:
            if name not in table:
                raise MechanismInputError("params.columns", f"no column {name!r} in that table")
            col = np.asarray(table[name])
            if col.dtype.kind not in "biuf":
                raise MechanismInputError("params.columns", f"column {name!r} is not numeric")
            cols.append(col.astype(np.float64))
        return _regress(release, np.column_stack(cols), list(params["columns"]), params)


ANALYSES: dict[str, Analysis] = {
    a.name: a for a in (NPMLEAnalysis(), MeanAnalysis(), MomentsAnalysis(),
                        RegressionAnalysis(), RegressionReleaseAnalysis())
}

__all__ = ["ANALYSES"]
