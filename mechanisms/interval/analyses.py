"""Free post-processing of interval releases (Thm 6): NPMLE, Example-2 mean, moments,
Algorithm-1 regression. They read only the released table and public metadata."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from mechanisms.base import Analysis, MechanismInputError, ReleaseView, Work
from mechanisms.interval import functionals, schemas
from mechanisms.interval.designs import pieces_from_table
from mechanisms.interval.estimators import example2_mean, moments
from mechanisms.interval.npmle import (
    NPMLEResult,
    npmle,
    npmle_case1,
    result_summary,
)
from mechanisms.interval.parametric import fit as parametric_fit
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


def _rows(release: ReleaseView) -> int:
    """Records in the released table (n is public; the table is released output)."""
    return len(_column(release, "released"))


def _width(release: ReleaseView) -> int:
    """Pieces per released range (``left``, ``left_2``, ...)."""
    table = release.table or {}
    width = 0
    while ("left" if width == 0 else f"left_{width + 1}") in table:
        width += 1
    if width == 0:
        raise MechanismInputError("release", "the release table has no range columns")
    return width


#: default iteration caps of the NPMLE solvers (``npmle.npmle``) and the relative cost of
#: a CNM iteration (gradient, Gram matrix of the support and a QP) to an EM iteration
NPMLE_DEFAULT_ITER = {"cnm": 500, "em": 100_000}
CNM_ITERATION_COST = 16


def _npmle_work(release: ReleaseView, params: Mapping[str, Any]) -> Work:
    """Iterations x records x pieces: the solver the request can reach at its cap."""
    n, width = _rows(release), _width(release)
    method = params["method"]
    if method == "pava":
        return Work(n * max(1.0, math.log2(max(n, 2))), "params.method")
    if method == "auto" and _case1_ready(_design(release), _exact_used(release)):
        return Work(n * max(1.0, math.log2(max(n, 2))), "params.method")
    cap = params.get("max_iter")
    bounds = []
    if method in ("cnm", "auto"):
        bounds.append((cap or NPMLE_DEFAULT_ITER["cnm"]) * CNM_ITERATION_COST)
    if method in ("em", "auto"):
        bounds.append(cap or NPMLE_DEFAULT_ITER["em"])
    return Work(float(max(bounds)) * n * width, "params.max_iter",
                "lower max_iter (the default is 500 CNM / 100000 EM iterations)")


def _exact_used(release: ReleaseView) -> FloatArray:
    """Exact reports of the released records (NaN where a range was released)."""
    exact = _column(release, "exact").astype(np.float64)
    return exact[_column(release, "released").astype(bool)]


def _mean_refusal(design: Mapping[str, Any]) -> str | None:
    """Why Example 2's mean does not apply to ``design`` (None: it does)."""
    if design.get("partition") == "progressive":
        return None
    anchors = design.get("anchors")
    if (design.get("partition") != "canonical" or design.get("m") != 2
            or not isinstance(anchors, Mapping) or anchors.get("family") != "uniform"
            or design.get("selective")):
        return ("Example 2's mean needs Case-I ranges with uniform anchors"
                " (interval.case1 with anchors.family = uniform, or progressive)")
    if design.get("exact_cells") or design.get("exact_range"):
        return "Example 2 needs ranges without exact reports"
    return None


def _has_design(result: Mapping[str, Any]) -> bool:
    return isinstance(result.get("design"), Mapping)


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


def _npmle_fitter(release: ReleaseView, params: Mapping[str, Any]
                  ) -> tuple[Callable[[NDArray[np.int64] | None], NPMLEResult], int, int]:
    """A refit of the NPMLE on rows (indices into the used records; None: all of them),
    the number of used records and of skipped (null) ones."""
    design = _design(release)
    pieces, released, exact = _ranges(release)
    used = released & ~pieces.empty().all(axis=1)
    if not np.any(used):
        raise MechanismInputError("release", "no released ranges to estimate from")
    method = params["method"]
    if method == "auto":
        method = "pava" if _case1_ready(design, exact[used]) else "auto"
    kwargs: dict[str, Any] = {"tol": params["tol"]}
    n_used = int(np.count_nonzero(used))
    skipped = int(pieces.n - n_used)
    if method == "pava":
        if not _case1_ready(design, exact[used]):
            raise MechanismInputError("params.method", "pava needs Case-I ranges on the raw"
                                      " column without exact reports")
        u = _column(release, "anchor_1").astype(np.float64)[used]
        delta = _column(release, "delta").astype(np.float64)[used]

        def fit_pava(rows: NDArray[np.int64] | None) -> NPMLEResult:
            if rows is None:
                return npmle_case1(u, delta, **kwargs)
            return npmle_case1(u[rows], delta[rows], **kwargs)

        return fit_pava, n_used, skipped
    if "max_iter" in params:
        kwargs["max_iter"] = params["max_iter"]
    ranges = pieces.take(used)

    def fit_general(rows: NDArray[np.int64] | None) -> NPMLEResult:
        if rows is None:
            return npmle(ranges, method, **kwargs)
        # a resample as distinct rows weighted by their multiplicity
        counts = np.bincount(rows, minlength=ranges.n)
        keep = np.nonzero(counts)[0]
        return npmle(ranges.take(keep), method, weights=counts[keep].astype(np.float64),
                     **kwargs)

    return fit_general, n_used, skipped


def _fit_npmle(release: ReleaseView, params: Mapping[str, Any]) -> tuple[NPMLEResult,
                                                                         list[str], int]:
    fit, _, skipped = _npmle_fitter(release, params)
    res = fit(None)
    warnings = _identifiability_warnings(_design(release), _support(release))
    if not res.converged:
        warnings.append(f"not converged: KKT gap {res.kkt_gap:.3g} after {res.iterations}"
                        " iterations; raise max_iter")
    return res, warnings, skipped


def _check_npmle(release: ReleaseView, params: Mapping[str, Any]) -> None:
    """What ``_fit_npmle`` would refuse, from the design and the table's public columns."""
    _width(release)
    if params["method"] == "pava" and not _case1_ready(_design(release), _exact_used(release)):
        raise MechanismInputError("params.method", "pava needs Case-I ranges on the raw"
                                  " column without exact reports")


class _FromNPMLE(Analysis):
    """An analysis that fits the NPMLE first: it applies, is checked and costs as one."""

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        return _has_design(result)

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        _check_npmle(release, params)

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        return _npmle_work(release, params)


class NPMLEAnalysis(_FromNPMLE):
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


def _first_answers(release: ReleaseView) -> tuple[FloatArray, FloatArray]:
    """A progressive release's first anchors and answers; every record must have one."""
    rounds = _column(release, "rounds")
    if np.any(rounds < 1):
        raise MechanismInputError(
            "release", "Example 2 needs every record's first answer; this release has"
            " records without one (stopping selected them)")
    return (_column(release, "anchor_1").astype(np.float64),
            _column(release, "answer_1").astype(np.float64))


class MeanAnalysis(Analysis):
    """Example 2: the unbiased mean from Case-I ranges with uniform anchors on [a, b]."""

    name = "mean"
    params_schema = schemas.MeanParams

    def offered_by(self, mechanism: str) -> bool:
        return mechanism in ("interval.case1", "interval.progressive")

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        design = result.get("design")
        return (self.offered_by(mechanism) and isinstance(design, Mapping)
                and _mean_refusal(design) is None)

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        refusal = _mean_refusal(_design(release))
        if refusal is not None:
            raise MechanismInputError("analysis", refusal)
        if _design(release).get("partition") == "progressive":
            _first_answers(release)
        else:
            _column(release, "anchor_1")
            _column(release, "delta")

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        design = _design(release)
        warnings: list[str] = []
        transform = design.get("transform", "identity")
        refusal = _mean_refusal(design)
        if refusal is not None:
            raise MechanismInputError("analysis", refusal)
        if design.get("partition") == "progressive":
            u, delta = _first_answers(release)
            a, b = (float(v) for v in design["support"])
        else:
            anchors = design["anchors"]
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


class MomentsAnalysis(_FromNPMLE):
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


#: relative cost per record and piece of one likelihood-and-score evaluation (log-CDFs
#: and log-densities), and evaluations per BFGS iteration (line search, Hessian)
MLE_EVAL_COST = 20
MLE_EVALS_PER_ITER = 4


class MLEAnalysis(Analysis):
    """Parametric MLE of the column's law from the released ranges (spec §3.2), with
    standard errors from the observed information. Post-processing (Thm 6): free."""

    name = "mle"
    params_schema = schemas.MLEParams

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        return _has_design(result)

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        _width(release)
        if params["family"] == "lognormal" and _support(release)[0] < 0:
            raise MechanismInputError("params.family", "lognormal needs a column whose"
                                      " declared lower bound is at least 0")

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        units = (float(params["max_iter"] + 2) * MLE_EVALS_PER_ITER * MLE_EVAL_COST
                 * _rows(release) * _width(release))
        return Work(units, "params.max_iter", "lower max_iter (the default is 200)")

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        pieces, released, exact = _ranges(release)
        used = released & ~pieces.empty().all(axis=1)
        if not np.any(used):
            raise MechanismInputError("release", "no released ranges to estimate from")
        is_exact = ~np.isnan(exact)
        ranges = used & ~is_exact
        lo, hi = pieces.take(ranges).half_open()
        try:
            res = parametric_fit(lo, hi, exact[used & is_exact], params["family"],
                                 _support(release), params["max_iter"], params["tol"])
        except ValueError as err:
            raise MechanismInputError("params.family", str(err)) from None
        out = res.summary()
        out["warnings"] = _identifiability_warnings(_design(release), _support(release)) + [
            str(w) for w in res.warnings]
        out["n_null"] = int(pieces.n - np.count_nonzero(used))
        out["post_processing"] = True
        return out


def _ed_fit(release: ReleaseView, params: Mapping[str, Any], field: str = "params.source"
            ) -> tuple[NPMLEResult, list[str]]:
    """The NPMLE an ED compares: of the final ranges, or of a progressive release's first
    answers only (Table III's Round-1: Case-I data, so PAVA)."""
    if params["source"] == "final":
        res, warnings, _ = _fit_npmle(release, params)
        return res, warnings
    if _design(release).get("partition") != "progressive":
        raise MechanismInputError(field, "first_round needs a progressive release")
    rounds = _column(release, "rounds")
    asked = rounds >= 1
    if not np.any(asked):
        raise MechanismInputError("release", "no record answered a first round")
    u = _column(release, "anchor_1").astype(np.float64)[asked]
    delta = _column(release, "answer_1").astype(np.float64)[asked]
    res = npmle_case1(u, delta, tol=params["tol"])
    warnings = [] if res.converged else [f"KKT gap {res.kkt_gap:.3g}"]
    return res, warnings


def _ed_domain(release: ReleaseView, params: Mapping[str, Any]) -> tuple[float, float]:
    if "domain" in params:
        return float(params["domain"][0]), float(params["domain"][1])
    lo, hi = _support(release)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise MechanismInputError("params.domain", "the column has no finite bounds: give"
                                  " the domain to integrate over")
    return lo, hi


class _ED(_FromNPMLE):
    """Shared checks of the ED analyses."""

    params_schema = schemas.EDParams

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        if params["source"] == "first_round" and (
                _design(release).get("partition") != "progressive"):
            raise MechanismInputError("params.source", "first_round needs a progressive"
                                      " release")
        _ed_domain(release, params)

    def _answer(self, res: NPMLEResult, warnings: list[str], release: ReleaseView,
                params: Mapping[str, Any], other: Callable[[FloatArray], FloatArray],
                other_steps: FloatArray | None, reference: str) -> dict[str, Any]:
        lo, hi = _ed_domain(release, params)
        x, f = functionals.step_cdf(res)
        ed = functionals.cramer_distance(x, f, other, lo, hi, other_steps,
                                         params["integer_grid"])
        return {"ed": ed, "domain": [lo, hi], "source": params["source"],
                "reference": reference, "integer_grid": params["integer_grid"],
                "definition": "ED = integral over the domain of (F_hat(y) - F(y))^2 dy, F_hat"
                              " the NPMLE with mass at cell right ends (Table III; the Cramer"
                              " distance, half the energy distance)",
                "npmle": {"kkt_gap": res.kkt_gap, "converged": res.converged,
                          "method": res.method, "n_used": res.n},
                "post_processing": True, "warnings": warnings}


class EDAnalysis(_ED):
    """Table III's ED between the NPMLE and the column's declared prior CDF."""

    name = "ed"

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        res, warnings = _ed_fit(release, params)
        column = release.result.get("column") or release.params.get("column")
        prior = column_prior(release.meta.column(str(column)), "release")
        return self._answer(res, warnings, release, params,
                            lambda y: np.asarray(prior.cdf(y), dtype=np.float64), None,
                            "declared prior")


class EDReleaseAnalysis(_ED):
    """Table III's ED between this release's NPMLE and another release's (its final
    ranges, fitted the same way): e.g. Round-1 against Round-X, or two designs."""

    name = "ed_release"
    n_others = 1

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        if len(others) != 1 or not _has_design(others[0].result):
            raise MechanismInputError("releases", "name one interval release to compare with")
        _check_npmle(others[0], {**params, "method": "auto"})

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        mine = _npmle_work(release, params)
        theirs = _npmle_work(others[0], {**params, "method": "auto"}) if others else mine
        return Work(mine.units + theirs.units, mine.field, mine.hint)

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        if len(others) != 1 or not _has_design(others[0].result):
            raise MechanismInputError("releases", "name one interval release to compare with")
        res, warnings = _ed_fit(release, params)
        ref, ref_warnings, _ = _fit_npmle(others[0], {**params, "method": "auto"})
        rx, rf = functionals.step_cdf(ref)

        def ref_cdf(y: FloatArray) -> FloatArray:
            idx = np.searchsorted(rx, y, side="right") - 1
            out: FloatArray = np.where(idx >= 0, rf[np.clip(idx, 0, None)], 0.0)
            return out

        return self._answer(res, warnings + [f"reference: {w}" for w in ref_warnings],
                            release, params, ref_cdf, rx, f"NPMLE of release {others[0].id}")


#: bootstrap refits only on releases up to this many records (each refit is an NPMLE)
MAX_BOOTSTRAP_RECORDS = 1_000_000


class FunctionalsAnalysis(_FromNPMLE):
    """Functionals of F from the NPMLE (spec §3.5, Example 1): P(Y <= t), P(a < Y <= b),
    E[Y | a < Y <= b] and quantiles, with a percentile bootstrap over released records.
    Post-processing (Thm 6): free; the bootstrap's randomness touches no data."""

    name = "functionals"
    params_schema = schemas.FunctionalsParams

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        if params["bootstrap"] and _rows(release) > MAX_BOOTSTRAP_RECORDS:
            raise MechanismInputError(
                "params.bootstrap", f"the bootstrap refits at most {MAX_BOOTSTRAP_RECORDS}"
                " records; set bootstrap to 0 for point estimates")

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        one = _npmle_work(release, params)
        if not params["bootstrap"]:
            return one
        return Work(one.units * (1 + params["bootstrap"]), "params.bootstrap",
                    "fewer bootstrap replicates (each refits the NPMLE)")

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        fit, n_used, skipped = _npmle_fitter(release, params)
        res = fit(None)
        warnings = _identifiability_warnings(_design(release), _support(release))
        if not res.converged:
            warnings.append(f"not converged: KKT gap {res.kkt_gap:.3g} after"
                            f" {res.iterations} iterations; raise max_iter")
        support = _support(release)
        specs = params["functionals"]
        convention = params["convention"]
        point = functionals.values(res, specs, convention, support)
        _, placed = res.atoms(convention, support)
        warnings += placed
        replicates = params["bootstrap"]
        intervals: list[tuple[float, float] | None] = [None] * len(specs)
        ses: list[float | None] = [None] * len(specs)
        failed = 0
        if replicates:
            draws, failed = functionals.bootstrap(fit, n_used, specs, replicates, rng,
                                                  convention, support)
            intervals = functionals.percentile_interval(draws, params["level"])
            ses = [float(np.nanstd(c, ddof=1)) if np.sum(np.isfinite(c)) > 1 else None
                   for c in draws.T]
            if failed:
                warnings.append(f"{failed} of {replicates} bootstrap refits did not certify"
                                " and were dropped; raise max_iter")
            if any(s["type"] in functionals.NONSMOOTH for s in specs):
                warnings.append(
                    "bootstrap intervals of pointwise F(t) and quantiles are approximate:"
                    " the NPMLE converges at a cube-root rate there, where the percentile"
                    " bootstrap is not guaranteed to cover")

        def j(x: float | None) -> float | None:
            return float(x) if x is not None and math.isfinite(x) else None

        items = []
        for spec, value, ci, se in zip(specs, point, intervals, ses, strict=True):
            bounds = functionals.identified_range(res, spec, support)
            items.append({
                **spec, "estimate": j(float(value)),
                "ci": None if ci is None else [j(ci[0]), j(ci[1])],
                "se": j(se),
                "identified_range": None if bounds is None else [j(bounds[0]), j(bounds[1])],
            })
        return {
            "functionals": items,
            "convention": convention,
            "support": [j(s) for s in support],
            "bootstrap": {"replicates": replicates, "level": params["level"],
                          "method": "percentile, records resampled with replacement",
                          "failed": failed},
            "npmle": {"iterations": res.iterations, "kkt_gap": res.kkt_gap,
                      "converged": res.converged, "method": res.method, "n_used": res.n},
            "n_null": skipped,
            "post_processing": True,
            "warnings": warnings,
        }


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


#: relative cost of one fit of a scikit-learn learner to a least-squares fit
SKLEARN_FIT_COST = 100


def _check_regression(release: ReleaseView, features: FloatArray, field: str,
                      params: Mapping[str, Any]) -> None:
    """What ``_regress`` refuses, before any iteration: one finite feature row per
    released record (n is public), prediction rows as wide, a learner that exists."""
    _width(release)
    n = _rows(release)
    if features.shape[0] != n:
        raise MechanismInputError(field, f"need one feature row per record ({n} rows)")
    if not np.all(np.isfinite(features)):
        raise MechanismInputError(field, "features must be finite numbers")
    if "predict" in params:
        rows = np.asarray(params["predict"], dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != features.shape[1]:
            raise MechanismInputError("params.predict", f"rows need {features.shape[1]} numbers")
    _learner(params["learner"])


def _regression_work(release: ReleaseView, d: int, params: Mapping[str, Any]) -> Work:
    """Iterations x records x (terms^2 + pieces): a least-squares refit per iteration."""
    spec = params["learner"]
    terms = d * (int(spec.get("degree", 1)) if spec["type"] == "polynomial" else 1) + 1
    per_row = terms * terms + _width(release)
    if spec["type"] == "sklearn":
        per_row *= SKLEARN_FIT_COST
    return Work(float(params["max_iter"]) * _rows(release) * per_row, "params.max_iter",
                "lower max_iter")


def _regress(release: ReleaseView, features: FloatArray, names: list[str],
             params: Mapping[str, Any], field: str = "params.features") -> dict[str, Any]:
    _check_regression(release, features, field, params)
    pieces, released, exact = _ranges(release)
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

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        return _has_design(result)

    def _inputs(self, params: Mapping[str, Any]) -> tuple[FloatArray, list[str]]:
        x = _matrix(params["features"], "params.features")
        names = list(params.get("feature_names") or [f"x{i + 1}" for i in range(x.shape[1])])
        if len(names) != x.shape[1]:
            raise MechanismInputError("params.feature_names", "one name per feature column")
        return x, names

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        x, _ = self._inputs(params)
        _check_regression(release, x, "params.features", params)

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        return _regression_work(release, len(params["features"][0]), params)

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        x, names = self._inputs(params)
        return _regress(release, x, names, params)


class RegressionReleaseAnalysis(Analysis):
    """Algorithm 1 with features from another release's table (``columns``)."""

    name = "regression_release"
    params_schema = schemas.RegressionReleaseParams
    n_others: ClassVar[int] = 1

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        return _has_design(result)

    def _features(self, params: Mapping[str, Any], others: list[ReleaseView]) -> FloatArray:
        if len(others) != 1 or others[0].table is None:
            raise MechanismInputError("releases", "name one release whose table holds"
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
        return np.column_stack(cols)

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        _check_regression(release, self._features(params, others), "releases.0", params)

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        return _regression_work(release, len(params["columns"]), params)

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        return _regress(release, self._features(params, others), list(params["columns"]),
                        params, "releases.0")


ANALYSES: dict[str, Analysis] = {
    a.name: a for a in (NPMLEAnalysis(), MeanAnalysis(), MomentsAnalysis(),
                        RegressionAnalysis(), RegressionReleaseAnalysis(), MLEAnalysis(),
                        FunctionalsAnalysis(), EDAnalysis(), EDReleaseAnalysis())
}

__all__ = ["ANALYSES"]
