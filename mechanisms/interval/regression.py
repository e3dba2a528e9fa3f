"""Algorithm 1: regression with interval-valued responses (Sec III-E, S2, corrected).

Y = f(X) + ε with F_ε known up to scale. Each iteration replaces every range
by the surrogate ỹ_i = f(x_i) + E[ε | ε ∈ S_i − f(x_i)] and refits the
learner. With squared loss, a linear learner and Gaussian ε of known σ this
is exactly EM for interval-censored regression, so it converges to the MLE
(a deterministic oracle for tests) — slowly: run it to a tolerance, not the
paper's 20 iterations.

Conditional means use the corrected formula (28): the upper-tail partial
mean is −G(ṽ) for mean-zero ε (erratum 4), computed in log space so deep
tails give c − σ²/c-type asymptotes instead of 0/0.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize, special

from mechanisms.interval.ranges import FloatArray, Pieces

NOISE_FAMILIES = ("gaussian", "logistic")
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- noise moments


def _log1mexp(x: FloatArray) -> FloatArray:
    """log(1 − e^x) for x <= 0, accurately."""
    x = np.minimum(x, 0.0)
    with np.errstate(divide="ignore"):
        out: FloatArray = np.where(x > -0.6931, np.log(-np.expm1(x)), np.log1p(-np.exp(x)))
    return out


def _log_interval_mass(lo_log: FloatArray, hi_log: FloatArray) -> FloatArray:
    """log(e^hi − e^lo) given log-CDF values lo <= hi."""
    with np.errstate(invalid="ignore"):
        out: FloatArray = hi_log + _log1mexp(lo_log - hi_log)
    return out


def _std_logcdf(family: str, x: FloatArray) -> FloatArray:
    # log Φ(x), or log σ(x) for the logistic
    out: FloatArray = special.log_ndtr(x) if family == "gaussian" else -np.logaddexp(0.0, -x)
    return out


def _std_logpdf(family: str, x: FloatArray) -> FloatArray:
    out: FloatArray
    with np.errstate(invalid="ignore"):
        if family == "gaussian":
            out = -0.5 * x * x - _LOG_SQRT_2PI
        else:
            out = -np.abs(x) - 2.0 * np.log1p(np.exp(-np.abs(x)))
    return out


def _softplus(x: FloatArray) -> FloatArray:
    out: FloatArray = np.logaddexp(0.0, x)
    return out


def _std_lower_mean(family: str, c: FloatArray) -> FloatArray:
    """E[ε | ε <= c] for the standard family (c may be ±∞)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if family == "gaussian":
            # −φ(c)/Φ(c), in logs
            out = -np.exp(_std_logpdf(family, c) - special.log_ndtr(c))
        else:
            # −softplus(−c) − e^{−c}·softplus(c), with e^{−c}·softplus(c) = log1p(e^c)/e^c
            tail = np.where(c < 30.0, np.exp(-c) * _softplus(np.minimum(c, 30.0)),
                            (c + np.exp(-c)) * np.exp(-c))
            tail = np.where(c < -30.0, 1.0 - 0.5 * np.exp(np.maximum(c, -745.0)), tail)
            out = -_softplus(-c) - tail
    out = np.where(np.isposinf(c), 0.0, out)
    out = np.where(np.isneginf(c), -np.inf, out)
    return out


def _std_interval(family: str, a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(log P(a < ε <= b), E[ε | a < ε <= b]) for the standard family, vectorised.

    Upper-tail intervals are reflected (ε is symmetric) so CDF differences never cancel.
    """
    flip = a > 0
    lo = np.where(flip, -b, a)
    hi = np.where(flip, -a, b)
    log_lo = _std_logcdf(family, lo)
    log_hi = _std_logcdf(family, hi)
    log_mass = _log_interval_mass(log_lo, log_hi)
    # E[ε | lo < ε <= hi] = (P(hi)·E[ε|ε<=hi] − P(lo)·E[ε|ε<=lo]) / (P(hi) − P(lo))
    m_hi = _std_lower_mean(family, hi)
    m_lo = _std_lower_mean(family, lo)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        w_hi = np.exp(log_hi - log_mass)
        w_lo = np.exp(log_lo - log_mass)
        mean = np.where(np.isneginf(lo), m_hi,
                        w_hi * m_hi - np.where(w_lo > 0, w_lo * m_lo, 0.0))
    # underflowed mass: fall back to the midpoint (or the finite end for a half-line)
    bad = ~np.isfinite(log_mass) | ~np.isfinite(mean)
    mid = np.where(np.isneginf(lo), hi - 1.0, 0.5 * (lo + hi))
    mean = np.where(bad, mid, mean)
    mean = np.where(flip, -mean, mean)
    return log_mass, mean


def conditional_mean(left: ArrayLike, right: ArrayLike, family: str = "gaussian",
                     scale: float = 1.0) -> FloatArray:
    """E[ε | left < ε <= right] for mean-zero noise of the given family and scale.

    Gaussian: σ(φ(α) − φ(β))/(Φ(β) − Φ(α)). Logistic (scale s, SD sπ/√3 — erratum 5):
    via G(x) = −s·H(F(x)); both computed from log-CDFs.
    """
    a = np.asarray(left, dtype=np.float64) / scale
    b = np.asarray(right, dtype=np.float64) / scale
    out: FloatArray = scale * _std_interval(family, a, b)[1]
    return out


def _piece_moments(pieces_lo: FloatArray, pieces_hi: FloatArray, family: str,
                   scale: float) -> tuple[FloatArray, FloatArray]:
    """Per record: log P(ε in the union of pieces) and E[ε | union], pieces (n, P)."""
    if pieces_lo.shape[1] == 1:
        log_mass, mean = _std_interval(family, pieces_lo[:, 0] / scale, pieces_hi[:, 0] / scale)
        return log_mass, scale * mean
    valid = ~np.isnan(pieces_lo)
    a = np.where(valid, pieces_lo, 0.0) / scale
    b = np.where(valid, pieces_hi, 1.0) / scale
    log_mass, mean = _std_interval(family, a, b)
    log_mass = np.where(valid, log_mass, -np.inf)
    total = special.logsumexp(log_mass, axis=1)
    with np.errstate(invalid="ignore"):
        weights = np.exp(log_mass - total[:, None])
    weights = np.where(np.isfinite(weights), weights, 0.0)
    out_mean: FloatArray = scale * np.sum(weights * np.where(valid, mean, 0.0), axis=1)
    return total, out_mean


def _gaussian_var(a: FloatArray, b: FloatArray) -> FloatArray:
    """Var[ε | a < ε <= b] for standard normal ε (for the EM update of σ)."""
    flip = a > 0
    lo = np.where(flip, -b, a)
    hi = np.where(flip, -a, b)
    log_mass = _log_interval_mass(special.log_ndtr(lo), special.log_ndtr(hi))
    with np.errstate(over="ignore", invalid="ignore"):
        p_lo = np.where(np.isinf(lo), 0.0, np.exp(_std_logpdf("gaussian", lo) - log_mass))
        p_hi = np.where(np.isinf(hi), 0.0, np.exp(_std_logpdf("gaussian", hi) - log_mass))
        t_lo = np.where(np.isinf(lo), 0.0, lo * p_lo)
        t_hi = np.where(np.isinf(hi), 0.0, hi * p_hi)
        mean = p_lo - p_hi
        var = 1.0 + t_lo - t_hi - mean * mean
    var = np.where(np.isfinite(var), np.clip(var, 0.0, None), 0.0)
    return var


# --------------------------------------------------------------------------- learners


class Learner(Protocol):
    def fit(self, x: FloatArray, y: FloatArray) -> Learner: ...

    def predict(self, x: FloatArray) -> FloatArray: ...


def polynomial_features(x: FloatArray, degree: int) -> FloatArray:
    """[1, all monomials of the columns up to ``degree``]."""
    n, d = x.shape
    cols = [np.ones(n)]
    for k in range(1, degree + 1):
        for combo in itertools.combinations_with_replacement(range(d), k):
            cols.append(np.prod(x[:, combo], axis=1))
    return np.column_stack(cols)


@dataclass
class LeastSquares:
    """Least squares on polynomial features (degree 1: linear with intercept).

    The projection onto the column space is factored once (QR), so each of the
    many Algorithm-1 refits is two matrix–vector products.
    """

    degree: int = 1
    coef: FloatArray | None = None
    _key: int | None = field(default=None, repr=False)
    _q: FloatArray | None = field(default=None, repr=False)
    _r: FloatArray | None = field(default=None, repr=False)

    def fit(self, x: FloatArray, y: FloatArray) -> LeastSquares:
        if self._key != id(x) or self._q is None:
            design = polynomial_features(x, self.degree)
            if np.linalg.matrix_rank(design) < design.shape[1]:
                raise ValueError("the features are collinear (or fewer rows than terms)")
            self._q, self._r = np.linalg.qr(design)
            self._key = id(x)
        assert self._r is not None
        self.coef = np.asarray(np.linalg.solve(self._r, self._q.T @ y), dtype=np.float64)
        return self

    def predict(self, x: FloatArray) -> FloatArray:
        assert self.coef is not None
        out: FloatArray = polynomial_features(x, self.degree) @ self.coef
        return out

    def term_names(self, names: list[str]) -> list[str]:
        out = ["1"]
        for k in range(1, self.degree + 1):
            for combo in itertools.combinations_with_replacement(range(len(names)), k):
                out.append("*".join(names[i] for i in combo))
        return out


#: scikit-learn modules whose regressors may be named (no other code is reachable)
SKLEARN_MODULES = ("sklearn.ensemble", "sklearn.linear_model", "sklearn.tree",
                   "sklearn.neighbors", "sklearn.svm", "sklearn.kernel_ridge")


def sklearn_available() -> bool:
    return importlib.util.find_spec("sklearn") is not None


def sklearn_learner(name: str, options: Mapping[str, Any] | None = None) -> Learner:
    """A scikit-learn regressor by class name, only if scikit-learn is installed."""
    if not sklearn_available():
        raise ValueError("scikit-learn is not installed on this server")
    for module_name in SKLEARN_MODULES:
        module = importlib.import_module(module_name)
        cls = getattr(module, name, None)
        if isinstance(cls, type) and name in getattr(module, "__all__", ()):
            base = importlib.import_module("sklearn.base")
            if not issubclass(cls, base.RegressorMixin):
                break
            try:
                learner: Learner = cls(**dict(options or {}))
            except TypeError as err:
                raise ValueError(f"bad options for {name}: {err}") from None
            return learner
    raise ValueError(f"{name!r} is not a scikit-learn regressor in {', '.join(SKLEARN_MODULES)}")


# --------------------------------------------------------------------------- Algorithm 1


@dataclass(frozen=True)
class RegressionResult:
    learner: Learner
    fitted: FloatArray
    iterations: int
    converged: bool
    max_change: float
    scale: float
    loglik: float
    history: list[float]


def observed_loglik(pieces_lo: FloatArray, pieces_hi: FloatArray, exact: FloatArray,
                    fitted: FloatArray, family: str, scale: float) -> float:
    """Σ log P(y_i in S_i | x_i) (+ log density for exact values) under the noise model."""
    rng_rows = np.isnan(exact)
    log_mass, _ = _piece_moments(pieces_lo[rng_rows] - fitted[rng_rows, None],
                                 pieces_hi[rng_rows] - fitted[rng_rows, None], family, scale)
    total = float(np.sum(log_mass))
    if np.any(~rng_rows):
        r = (exact[~rng_rows] - fitted[~rng_rows]) / scale
        total += float(np.sum(_std_logpdf(family, r)) - r.size * math.log(scale))
    return total


def algorithm1(
    x: ArrayLike, pieces: Pieces, learner: Learner, family: str = "gaussian",
    scale: float | None = 1.0, exact: ArrayLike | None = None, tol: float = 1e-8,
    max_iter: int = 10_000, init: ArrayLike | None = None,
) -> RegressionResult:
    """Iterate ỹ = f(x) + E[ε | S − f(x)] and refit, from f = 0, until the fits settle.

    Stops when max_i |f_k(x_i) − f_{k−1}(x_i)| < tol·(1 + SD(ỹ)). ``scale=None``
    estimates a Gaussian σ by the EM update σ² = mean(E[(Y − f)² | S]) (erratum 7).
    """
    if family not in NOISE_FAMILIES:
        raise ValueError(f"noise family must be one of {NOISE_FAMILIES}")
    if scale is None and family != "gaussian":
        raise ValueError("the noise scale can be estimated for Gaussian noise only")
    xa = np.asarray(x, dtype=np.float64)
    if xa.ndim == 1:
        xa = xa[:, None]
    lo, hi = pieces.half_open()
    n = xa.shape[0]
    if lo.shape[0] != n:
        raise ValueError("features and ranges have different numbers of rows")
    ex = np.full(n, np.nan) if exact is None else np.asarray(exact, dtype=np.float64)
    is_exact = ~np.isnan(ex)
    sigma = 1.0 if scale is None else float(scale)
    fitted = np.zeros(n) if init is None else np.asarray(init, dtype=np.float64).copy()
    history: list[float] = []
    converged = False
    change = math.inf
    iterations = 0
    for iterations in range(1, max_iter + 1):
        _, shift = _piece_moments(lo - fitted[:, None], hi - fitted[:, None], family, sigma)
        surrogate = np.where(is_exact, ex, fitted + shift)
        if scale is None:
            sigma = _update_sigma(lo, hi, ex, fitted, sigma)
        learner.fit(xa, surrogate)
        new = np.asarray(learner.predict(xa), dtype=np.float64)
        change = float(np.max(np.abs(new - fitted)))
        fitted = new
        if iterations % 10 == 1:
            history.append(observed_loglik(lo, hi, ex, fitted, family, sigma))
        if change < tol * (1.0 + float(np.std(surrogate))):
            converged = True
            break
    ll = observed_loglik(lo, hi, ex, fitted, family, sigma)
    history.append(ll)
    return RegressionResult(learner, fitted, iterations, converged, change, sigma, ll, history)


def _update_sigma(lo: FloatArray, hi: FloatArray, exact: FloatArray, fitted: FloatArray,
                  sigma: float) -> float:
    """σ² <- mean E[(Y − f(x))² | S] = mean(Var(ε | S − f) + E[ε | S − f]²); one piece only."""
    a = (lo[:, 0] - fitted) / sigma
    b = (hi[:, 0] - fitted) / sigma
    _, mean = _std_interval("gaussian", a, b)
    second = _gaussian_var(a, b) + mean * mean
    second = np.where(np.isnan(exact), second * sigma * sigma, (exact - fitted) ** 2)
    return float(math.sqrt(max(float(np.mean(second)), 1e-300)))


def interval_mle(x: ArrayLike, pieces: Pieces, family: str = "gaussian", scale: float = 1.0,
                 degree: int = 1) -> FloatArray:
    """Direct MLE of polynomial coefficients with known noise scale (BFGS; the oracle)."""
    xa = np.asarray(x, dtype=np.float64)
    if xa.ndim == 1:
        xa = xa[:, None]
    design = polynomial_features(xa, degree)
    lo, hi = pieces.half_open()
    nan = np.full(xa.shape[0], np.nan)

    def negll(beta: NDArray[np.float64]) -> float:
        f = design @ beta
        return -observed_loglik(lo, hi, nan, f, family, scale)

    def grad(beta: NDArray[np.float64]) -> NDArray[np.float64]:
        f = design @ beta
        if family == "gaussian":
            # score: Σ x E[ε | S − f]/σ²
            _, m = _piece_moments(lo - f[:, None], hi - f[:, None], family, scale)
            out: NDArray[np.float64] = -(design.T @ m) / (scale * scale)
            return out
        return optimize.approx_fprime(beta, negll, 1e-7)

    start = np.zeros(design.shape[1])
    res = optimize.minimize(negll, start, jac=grad, method="BFGS",
                            options={"gtol": 1e-10, "maxiter": 10_000})
    out: FloatArray = res.x
    return out
