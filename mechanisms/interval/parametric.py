"""Parametric MLE of F_Y from released ranges (spec §3.2), with observed-information SEs.

The likelihood of a record is the model's mass of its released range, F_θ(S_j) =
Σ_pieces F_θ(b) − F_θ(a), or the density at an exact report; every term is divided
by F_θ(support) so that a column with declared bounds is fitted by the family
truncated to them (ranges ending at a support bound were cut there by the release,
so without the truncation a bounded column would bias the fit). Ranges depend on
the data only through the released output, so this is post-processing (Thm 6).

Families are location–scale (normal, logistic) or normal on log Y (lognormal).
The fit runs in θ = (loc, log scale) on standardised units with the analytic
score, and the standard errors come from the inverse observed information (the
negative Hessian of the log-likelihood, by central differences of the analytic
score), mapped to (loc, scale) by the delta method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special, stats

from mechanisms.interval.ranges import FloatArray

FAMILIES = ("normal", "logistic", "lognormal")
#: parameter names per family (the second is always a scale > 0)
PARAM_NAMES = {"normal": ("loc", "scale"), "logistic": ("loc", "scale"),
               "lognormal": ("meanlog", "sdlog")}


def _std_parts(family: str) -> tuple[stats.rv_continuous, str]:
    return (stats.logistic, "logistic") if family == "logistic" else (stats.norm, "normal")


def _dlogpdf(z: FloatArray, kind: str) -> FloatArray:
    """d/dz log f(z) of the standard law."""
    out: FloatArray = -np.tanh(0.5 * z) if kind == "logistic" else -z
    return out


def _log_mass(za: FloatArray, zb: FloatArray, law: stats.rv_continuous) -> FloatArray:
    """log(F(zb) − F(za)) without cancellation: through the survival function when the
    piece lies right of the median, through the CDF otherwise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        upper = za > 0
        lsa, lsb = law.logsf(za), law.logsf(zb)
        lca, lcb = law.logcdf(za), law.logcdf(zb)
        via_sf = lsa + np.log1p(-np.exp(lsb - lsa))
        via_cdf = lcb + np.log1p(-np.exp(lca - lcb))
        out: FloatArray = np.where(upper, via_sf, via_cdf)
    return np.where(np.isnan(out) | (zb <= za), -np.inf, out)


def _zf(z: FloatArray, logp: FloatArray, law: stats.rv_continuous
        ) -> tuple[FloatArray, FloatArray]:
    """f(z)/P and z·f(z)/P per piece end (0 at infinite ends), with P = exp(logp)."""
    finite = np.isfinite(z)
    zz = np.where(finite, z, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.where(finite, np.exp(law.logpdf(zz) - logp), 0.0)
    return r, r * zz


@dataclass(frozen=True)
class ParametricFit:
    """The MLE (family's natural parameters), its covariance and diagnostics."""

    family: str
    params: dict[str, float]
    se: dict[str, float]
    cov: list[list[float]]
    loglik: float
    iterations: int
    converged: bool
    gradient_norm: float
    n: int
    n_exact: int
    support: tuple[float, float]
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        def j(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        z = 1.959963984540054
        names = PARAM_NAMES[self.family]
        return {
            "family": self.family,
            "params": self.params,
            "se": {k: j(v) for k, v in self.se.items()},
            "ci95": {k: [j(self.params[k] - z * self.se[k]), j(self.params[k] + z * self.se[k])]
                     for k in names},
            "cov": [[j(v) for v in row] for row in self.cov],
            "cov_order": list(names),
            "loglik": self.loglik,
            "iterations": self.iterations,
            "converged": self.converged,
            "gradient_norm": self.gradient_norm,
            "n_used": self.n,
            "n_exact": self.n_exact,
            "truncated_to": [j(self.support[0]), j(self.support[1])],
            "se_method": "inverse observed information (negative Hessian of the"
                         " log-likelihood at the MLE), delta method for the scale",
            "warnings": self.warnings,
        }


class _Likelihood:
    """Σ_j log F_θ(S_j) − n log F_θ(support) in standardised units, with its score."""

    def __init__(self, left: FloatArray, right: FloatArray, exact: FloatArray,
                 support: tuple[float, float], family: str) -> None:
        self.law, self.kind = _std_parts(family)
        self.left, self.right = left, right
        self.exact = exact
        self.support = support
        self.n_total = left.shape[0] + exact.shape[0]
        self.truncated = bool(np.isfinite(support[0]) or np.isfinite(support[1]))

    def value_and_score(self, theta: FloatArray) -> tuple[float, FloatArray]:
        mu, log_sigma = float(theta[0]), float(theta[1])
        sigma = math.exp(log_sigma)
        ll = 0.0
        g = np.zeros(2)
        if self.left.size:
            za = (self.left - mu) / sigma
            zb = (self.right - mu) / sigma
            lm = _log_mass(za, zb, self.law)
            logp = special.logsumexp(lm, axis=1)
            ll += float(logp.sum())
            ra, za_r = _zf(za, logp[:, None], self.law)
            rb, zb_r = _zf(zb, logp[:, None], self.law)
            piece = np.isfinite(lm)
            g[0] += float(-np.sum(np.where(piece, rb - ra, 0.0)) / sigma)
            g[1] += float(-np.sum(np.where(piece, zb_r - za_r, 0.0)))
        if self.exact.size:
            z = (self.exact - mu) / sigma
            ll += float(np.sum(self.law.logpdf(z)) - self.exact.size * log_sigma)
            s = _dlogpdf(z, self.kind)
            g[0] += float(-np.sum(s) / sigma)
            g[1] += float(-self.exact.size - np.sum(z * s))
        if self.truncated:
            za = np.array([[(self.support[0] - mu) / sigma]])
            zb = np.array([[(self.support[1] - mu) / sigma]])
            lm = _log_mass(za, zb, self.law)
            logp = lm[:, 0]
            ll -= self.n_total * float(logp[0])
            ra, za_r = _zf(za, logp[:, None], self.law)
            rb, zb_r = _zf(zb, logp[:, None], self.law)
            g[0] -= self.n_total * float(-(rb - ra)[0, 0] / sigma)
            g[1] -= self.n_total * float(-(zb_r - za_r)[0, 0])
        return ll, g


def _start(left: FloatArray, right: FloatArray, exact: FloatArray) -> tuple[float, float]:
    """A crude (centre, spread) from range midpoints (half-lines: their finite end)."""
    lo, hi = left.ravel(), right.ravel()
    mid = np.where(np.isfinite(lo) & np.isfinite(hi), 0.5 * (lo + hi),
                   np.where(np.isfinite(lo), lo, hi))
    vals = np.concatenate([mid[np.isfinite(mid)], exact])
    if vals.size == 0:
        return 0.0, 1.0
    centre = float(np.median(vals))
    spread = float(np.subtract(*np.percentile(vals, [75, 25]))) / 1.349
    if not (math.isfinite(spread) and spread > 0):
        spread = float(np.std(vals)) or max(1.0, abs(centre))
    return centre, spread


def fit(left: ArrayLike, right: ArrayLike, exact: ArrayLike | None = None,
        family: str = "normal", support: tuple[float, float] = (-math.inf, math.inf),
        max_iter: int = 200, tol: float = 1e-8) -> ParametricFit:
    """MLE of ``family`` from ranges ∪_k (left[j,k], right[j,k]] (NaN: unused piece)
    and exact reports ``exact``, truncated to ``support``; see the module docstring."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}")
    lo = np.atleast_2d(np.asarray(left, dtype=np.float64))
    hi = np.atleast_2d(np.asarray(right, dtype=np.float64))
    ex = np.asarray([] if exact is None else exact, dtype=np.float64).ravel()
    if lo.shape != hi.shape:
        raise ValueError("left and right need the same shape")
    sup = (float(support[0]), float(support[1]))
    warnings: list[str] = []
    log_jacobian = 0.0
    if family == "lognormal":
        if sup[0] < 0 or np.any(ex <= 0):
            raise ValueError("lognormal needs a column bounded below by 0 and positive"
                             " exact reports")
        with np.errstate(divide="ignore"):
            lo, hi = np.log(np.maximum(lo, 0.0)), np.log(np.maximum(hi, 0.0))
            sup = (math.log(sup[0]) if sup[0] > 0 else -math.inf, math.log(sup[1]))
        log_jacobian = -float(np.sum(np.log(ex)))
        ex = np.log(ex)
    unused = np.isnan(lo) | np.isnan(hi)
    lo = np.where(unused, np.nan, lo)
    hi = np.where(unused, np.nan, hi)
    if lo.shape[0] + ex.size == 0:
        raise ValueError("no ranges to fit")
    # standardise so that the optimiser sees O(1) parameters
    centre, spread = _start(lo, hi, ex)
    like = _Likelihood((lo - centre) / spread, (hi - centre) / spread, (ex - centre) / spread,
                       ((sup[0] - centre) / spread, (sup[1] - centre) / spread), family)

    def neg(theta: FloatArray) -> tuple[float, FloatArray]:
        ll, g = like.value_and_score(theta)
        if not math.isfinite(ll):
            return math.inf, np.zeros(2)
        return -ll, -g

    res = optimize.minimize(neg, np.zeros(2), jac=True, method="BFGS",
                            options={"maxiter": max_iter, "gtol": tol * max(1, like.n_total)})
    theta = np.asarray(res.x, dtype=np.float64)
    ll, g = like.value_and_score(theta)
    hess = np.zeros((2, 2))
    for i in range(2):
        h = 1e-5 * max(1.0, abs(theta[i]))
        e = np.zeros(2)
        e[i] = h
        hess[:, i] = (like.value_and_score(theta + e)[1] - like.value_and_score(theta - e)[1]) / (
            2 * h)
    hess = 0.5 * (hess + hess.T)
    info = -hess
    grad_norm = float(np.max(np.abs(g)))
    # in standardised units a real MLE has information of order n; a vanishing one is a
    # flat likelihood (e.g. every range a half-line on the same side: no finite MLE)
    identified = bool(np.all(np.isfinite(info))
                      and np.min(np.linalg.eigvalsh(info)) > 1e-6 * like.n_total)
    converged = bool(math.isfinite(ll) and grad_norm <= max(tol * like.n_total, 1e-6)
                     and identified)
    try:
        cov_std = np.linalg.inv(info)
    except np.linalg.LinAlgError:
        cov_std = np.full((2, 2), np.inf)
    if not identified or not np.all(np.diag(cov_std) > 0):
        warnings.append("the observed information is not positive definite: the"
                        " parameters are not identified by these ranges")
        cov_std = np.full((2, 2), np.inf)
    # back to data units: loc = centre + spread·μ', scale = spread·exp(logσ')
    loc = centre + spread * float(theta[0])
    scale = spread * math.exp(float(theta[1]))
    jac = np.diag([spread, scale])
    cov = jac @ cov_std @ jac.T if identified else np.full((2, 2), np.inf)
    names = PARAM_NAMES[family]
    if identified and not converged:
        warnings.append(f"not converged after {int(res.nit)} iterations (score"
                        f" {grad_norm:.3g}); raise max_iter")
    ll_data = ll - ex.size * math.log(spread) + log_jacobian  # densities in data units
    return ParametricFit(
        family=family,
        params={names[0]: loc, names[1]: scale},
        se={names[0]: float(math.sqrt(cov[0, 0])), names[1]: float(math.sqrt(cov[1, 1]))},
        cov=[[float(v) for v in row] for row in cov],
        loglik=float(ll_data),
        iterations=int(res.nit),
        converged=converged,
        gradient_norm=grad_norm,
        n=int(lo.shape[0] + ex.size),
        n_exact=int(ex.size),
        support=(float(support[0]), float(support[1])),
        warnings=warnings,
    )
