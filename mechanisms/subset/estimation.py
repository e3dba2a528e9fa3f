"""Estimating the category distribution w from released subsets (§3).

The log-likelihood l_n(w) = Σ_i ln 1_{a_i}ᵀw is concave and depends on the
data only through the distinct subsets and their counts, so every estimator
works on ``Observed`` (m distinct subsets, m ≤ min(n, 2**p)):

* ``em`` — the MLE by EM, w ← w ⊙ Rᵀ(c ⊘ Rw)/n, monotone in l_n;
* ``mom`` — Q ŵ = γ̂ (Theorem 4; unbiased, may leave the simplex), and
  ``mom_closed`` — the uniform design's Eq. (6), a different estimator for p ≥ 5;
* ``one_step`` — one Newton step from MoM with the *corrected* sign
  θ̂ = θ̂_MoM − [∇²l_n]⁻¹∇l_n (the paper's "+" only holds for the observed
  information), as efficient as the MLE asymptotically.

Releases with dummy categories (Appendix B) fix the dummy share α: every
subset holds exactly one dummy, so its likelihood is (1−2α)·1_aᵀw + α on
the real part, which all estimators here accept through ``dummy_alpha``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import asymptotic, bitmask, squarem
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import Design

Method = Literal["em", "mom", "mom_closed", "one_step"]
METHODS: tuple[Method, ...] = ("em", "mom", "mom_closed", "one_step")
EM_TOL = 1e-10
EM_MAX_ITER = 100_000
#: an estimate below this counts as on the boundary (Wald SEs are invalid there)
BOUNDARY = 1e-6
#: one-step restarts from the projected MoM floored at this when a likelihood term is ≤ 0
ONE_STEP_FLOOR = 1e-6
#: distinct subsets per block when Gram matrices are accumulated
GRAM_CHUNK = 1 << 16


@dataclass(frozen=True)
class Observed:
    """Released subsets of one variable, aggregated: distinct masks and their counts.

    A subset's likelihood is ``(1 − 2α)·1_aᵀw + α`` with α = ``dummy_alpha``
    (0 without dummy categories). The m × p indicator ``rows`` are built on
    first use only: moments need per-category counts and chunked Gram
    matrices, never the whole matrix (m can approach n when p is large).
    """

    p: int
    masks: Masks
    counts: NDArray[np.int64]
    dummy_alpha: float = 0.0

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @property
    def scale(self) -> float:
        return 1.0 - 2.0 * self.dummy_alpha

    @functools.cached_property
    def rows(self) -> NDArray[np.float64]:
        """Indicators 1_a of the distinct subsets (m × p)."""
        return bitmask.indicators(self.masks, self.p)

    def likelihoods(self, w: ArrayLike) -> NDArray[np.float64]:
        """L(a_k) = P(X ∈ a_k) for each distinct subset."""
        result: NDArray[np.float64] = self.scale * (self.rows @ np.asarray(w, float))
        return result + self.dummy_alpha

    def gamma(self) -> NDArray[np.float64]:
        """γ̂: per-category inclusion frequencies."""
        included = np.zeros(self.p)
        for start in range(0, len(self.masks), GRAM_CHUNK):
            block = bitmask.bits(self.masks[start:start + GRAM_CHUNK], self.p)
            included += self.counts[start:start + GRAM_CHUNK].astype(np.float64) @ block
        result: NDArray[np.float64] = included / max(self.n, 1)
        return result

    def gram(self, weights: NDArray[Any] | None = None) -> NDArray[np.float64]:
        """Σ_k weight_k 1_{a_k}1_{a_k}ᵀ over the distinct subsets, in bounded chunks."""
        weights = self.counts if weights is None else weights
        out = np.zeros((self.p, self.p))
        for start in range(0, len(self.masks), GRAM_CHUNK):
            block = bitmask.indicators(self.masks[start:start + GRAM_CHUNK], self.p)
            out += block.T @ (np.asarray(weights[start:start + GRAM_CHUNK], float)[:, None]
                              * block)
        return out


def observe(masks: ArrayLike, p: int, *, dummy_alpha: float = 0.0) -> Observed:
    """Aggregate released masks over [p] (dummy releases: pass ``strip_dummies`` output)."""
    if not 0.0 <= dummy_alpha < 0.5:
        raise ValueError("the dummy share must lie in [0, 1/2)")
    values = bitmask.as_masks(masks)
    if values.size and int(values.max()) > int(bitmask.full(p)):
        raise ValueError("a subset holds a category outside the domain")
    distinct, counts = bitmask.aggregate(values, p)
    return Observed(p, distinct, counts, float(dummy_alpha))


def log_likelihood(obs: Observed, w: ArrayLike) -> float:
    """l_n(w) = Σ_k c_k ln L(a_k) (the constant Σ ln μ_a dropped); −inf off the support."""
    lik = obs.likelihoods(w)
    if np.any(lik[obs.counts > 0] <= 0):
        return float("-inf")
    return float(obs.counts @ np.log(lik))


# ---------------------------------------------------------------------- EM


@dataclass(frozen=True)
class EMFit:
    w: NDArray[np.float64]
    #: EM iterations (with acceleration: SQUAREM cycles of three EM steps each)
    iterations: int
    converged: bool
    log_likelihood: float
    #: l_n after each iteration when ``track=True`` (the monotonicity check)
    trace: list[float] = field(default_factory=list)


def em(
    obs: Observed,
    w0: ArrayLike | None = None,
    *,
    tol: float = EM_TOL,
    max_iter: int = EM_MAX_ITER,
    accelerate: bool = True,
    track: bool = False,
) -> EMFit:
    """The MLE by EM; stops when no coordinate moves more than ``tol`` in an iteration.

    ``accelerate`` wraps the EM map in safeguarded SQUAREM (``squarem``):
    the same fixed point, the log-likelihood still never decreases, and far
    fewer steps near the boundary. ``accelerate=False`` is the plain EM.
    """
    start = np.full(obs.p, 1.0 / obs.p) if w0 is None else np.asarray(w0, float)
    if np.any(start <= 0) or abs(start.sum() - 1.0) > 1e-9:
        raise ValueError("EM must start inside the simplex (zeros stay zero)")
    trace: list[float] = []
    if obs.n == 0:
        return EMFit(start, 0, False, 0.0, trace)
    w, iterations, converged = _em_core(
        obs.rows, obs.counts[None, :].astype(np.float64), start[None, :], obs.dummy_alpha,
        tol=tol, max_iter=max_iter, accelerate=accelerate, trace=trace if track else None)
    return EMFit(w[0], iterations, bool(converged[0]), log_likelihood(obs, w[0]), trace)


def em_batch(
    rows: NDArray[np.float64],
    counts: NDArray[np.floating[Any]] | NDArray[np.integer[Any]],
    *,
    dummy_alpha: float = 0.0,
    tol: float = EM_TOL,
    max_iter: int = EM_MAX_ITER,
    accelerate: bool = True,
) -> tuple[NDArray[np.float64], int, NDArray[np.bool_]]:
    """EM for many count vectors over the same subsets at once (B × m counts).

    Simulations and permutation tests share the candidate subsets, so one
    matrix product per iteration serves every replicate. Returns (W, iterations,
    converged per replicate).
    """
    c = np.asarray(counts, dtype=np.float64)
    seen = c.sum(axis=0) > 0  # subsets no replicate observed contribute nothing
    c, rows = c[:, seen], rows[seen]
    start = np.full((c.shape[0], rows.shape[1]), 1.0 / rows.shape[1])
    return _em_core(rows, c, start, dummy_alpha, tol=tol, max_iter=max_iter,
                    accelerate=accelerate)


def _em_core(
    rows: NDArray[np.float64],
    counts: NDArray[np.float64],
    start: NDArray[np.float64],
    offset: float,
    *,
    tol: float,
    max_iter: int,
    accelerate: bool,
    trace: list[float] | None = None,
) -> tuple[NDArray[np.float64], int, NDArray[np.bool_]]:
    scale = 1.0 - 2.0 * offset

    def step(w: NDArray[np.float64], index: NDArray[np.intp]) -> NDArray[np.float64]:
        """Posterior category counts w_j Σ_k c_k 1{j∈a_k}/L_k, renormalized."""
        c = counts[index]
        lik = scale * (w @ rows.T) + offset
        ratio = np.divide(c, lik, out=np.zeros_like(lik), where=c > 0)
        expected = w * (ratio @ rows)
        total = expected.sum(axis=1, keepdims=True)
        result: NDArray[np.float64] = expected / np.where(total > 0, total, 1.0)
        return result

    def loglik(w: NDArray[np.float64], index: NDArray[np.intp]) -> NDArray[np.float64]:
        c = counts[index]
        lik = scale * (w @ rows.T) + offset
        with np.errstate(divide="ignore"):
            terms = np.where(c > 0, c * np.log(np.where(c > 0, lik, 1.0)), 0.0)
        result: NDArray[np.float64] = terms.sum(axis=1)
        return result

    return squarem.iterate(step, loglik, start, tol=tol, max_iter=max_iter,
                           accelerate=accelerate, trace=trace)


@dataclass(frozen=True)
class KKT:
    """g_j = ∂l_n/∂w_j / λ: 1 where ŵ_j > 0 and ≤ 1 where ŵ_j = 0 at the MLE."""

    gradient: NDArray[np.float64]
    max_violation: float


def kkt(obs: Observed, w: ArrayLike, *, zero: float = BOUNDARY) -> KKT:
    """Optimality check of a simplex-constrained maximiser of l_n."""
    w = np.asarray(w, float)
    lik = obs.likelihoods(w)
    grad = obs.scale * ((obs.counts / lik) @ obs.rows)
    lam = float(w @ grad)  # = n without dummies
    g = grad / lam
    violation = np.where(w > zero, np.abs(g - 1.0), np.maximum(g - 1.0, 0.0))
    return KKT(g, float(violation.max()))


# ---------------------------------------------------------------------- moments


def mom(obs: Observed, design: Design) -> NDArray[np.float64]:
    """Raw method of moments Q⁻¹γ̂ (unbiased; can be negative; sums to 1 only if |A| is fixed)."""
    target = (obs.gamma() - obs.dummy_alpha) / obs.scale
    return np.asarray(np.linalg.solve(design.Q, target), dtype=np.float64)


def mom_closed(obs: Observed, design: Design) -> NDArray[np.float64]:
    """The uniform design's Eq. (6): ŵ = (r_p γ̂ − 1)/(r_p − 1) (differs from Q⁻¹γ̂ for p ≥ 5)."""
    r = float(design.r_p)
    target = (obs.gamma() - obs.dummy_alpha) / obs.scale
    result: NDArray[np.float64] = (r * target - 1.0) / (r - 1.0)
    return result


def project_simplex(v: ArrayLike) -> NDArray[np.float64]:
    """Euclidean projection onto {w ≥ 0, Σw = 1} (sort-based, Held et al. 1974)."""
    v = np.asarray(v, float)
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, len(v) + 1)
    rho = int(np.nonzero(u - css / k > 0)[0][-1])
    result: NDArray[np.float64] = np.maximum(v - css[rho] / (rho + 1), 0.0)
    return result


# ---------------------------------------------------------------------- one step


def _theta_rows(obs: Observed) -> NDArray[np.float64]:
    """(1−2α)·1_aᵀB for w = α_0 + Bθ, B = (I_{p−1}, −1)ᵀ: ∂L(a)/∂θ."""
    result: NDArray[np.float64] = obs.scale * (obs.rows[:, :-1] - obs.rows[:, -1:])
    return result


def _reparam(theta: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.append(theta, 1.0 - theta.sum())


def observed_information(obs: Observed, w: ArrayLike) -> NDArray[np.float64]:
    """−∇²l_n(θ)/n = Σ_k (c_k/n) Bᵀ1_a 1_aᵀB / L_k² (per observation)."""
    lik = obs.likelihoods(w)
    d = _theta_rows(obs)
    result: NDArray[np.float64] = d.T @ ((obs.counts / lik**2)[:, None] * d) / obs.n
    return result


def one_step(obs: Observed, start: ArrayLike) -> tuple[NDArray[np.float64], list[str]]:
    """One Newton step θ − [∇²l_n]⁻¹∇l_n from ``start`` (raw: may leave the simplex)."""
    warnings: list[str] = []
    w = _reparam(np.asarray(start, float)[:-1])
    if np.any(obs.likelihoods(w)[obs.counts > 0] <= 0):
        w = np.maximum(project_simplex(w), ONE_STEP_FLOOR)
        w /= w.sum()
        warnings.append("the MoM start gave a subset probability <= 0; started from the"
                        " projected MoM estimate instead")
    lik = obs.likelihoods(w)
    d = _theta_rows(obs)
    gradient = d.T @ (obs.counts / lik)
    information = d.T @ ((obs.counts / lik**2)[:, None] * d)  # = −Hessian
    try:
        step = np.linalg.solve(information, gradient)
    except np.linalg.LinAlgError as err:
        raise np.linalg.LinAlgError("singular Hessian at the one-step start") from err
    if not np.all(np.isfinite(step)):
        raise np.linalg.LinAlgError("singular Hessian at the one-step start")
    return _reparam(w[:-1] + step), warnings


# ---------------------------------------------------------------------- dispatcher


@dataclass(frozen=True)
class Estimate:
    """An estimate of w with its uncertainty and diagnostics (JSON via ``to_json``)."""

    method: str
    w: NDArray[np.float64]
    w_raw: NDArray[np.float64]
    se: NDArray[np.float64] | None
    cov: NDArray[np.float64] | None
    n: int
    se_basis: str | None = None
    iterations: int | None = None
    converged: bool | None = None
    log_likelihood: float | None = None
    kkt_max_violation: float | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self, categories: Sequence[str] | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "method": self.method,
            "n": self.n,
            "w": _floats(self.w),
            "w_raw": _floats(self.w_raw),
            "se": None if self.se is None else _floats(self.se),
            "se_basis": self.se_basis,
            "warnings": list(self.warnings),
        }
        if categories is not None:
            doc["categories"] = list(categories)
        if self.iterations is not None:
            doc.update(iterations=self.iterations, converged=self.converged)
        if self.log_likelihood is not None:
            doc["log_likelihood"] = self.log_likelihood
        if self.kkt_max_violation is not None:
            doc["kkt_max_violation"] = self.kkt_max_violation
        return doc


def estimate(
    data: Observed | ArrayLike,
    design: Design | None = None,
    method: Method = "em",
    *,
    p: int | None = None,
    project: bool = True,
    tol: float = EM_TOL,
    max_iter: int = EM_MAX_ITER,
    accelerate: bool = True,
) -> Estimate:
    """Estimate w by ``method``; ``design`` is needed by every method but EM.

    ``w`` is on the simplex (projected when ``project``), ``w_raw`` is the
    estimator itself (the one the theory covers). Standard errors come from
    the asymptotic covariance with ŵ plugged in: expected Fisher information
    when the design is enumerable, observed information otherwise (MLE and
    one-step); the sandwich Q⁻¹ĈQ⁻¹ with the empirical covariance Ĉ of the
    indicators (moments).
    """
    if isinstance(data, Observed):
        obs = data
    else:
        if p is None:
            if design is None:
                raise ValueError("give p or a design")
            p = design.p
        obs = observe(data, p)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}")
    if method != "em" and design is None:
        raise ValueError(f"{method} needs the design")
    if obs.n == 0:
        flat = np.full(obs.p, 1.0 / obs.p)
        return Estimate(method, flat, flat, None, None, 0, warnings=["no released records"])
    warnings = _identification_warnings(obs)
    if method == "em":
        fit = em(obs, tol=tol, max_iter=max_iter, accelerate=accelerate)
        if not fit.converged:
            warnings.append(f"EM stopped after {max_iter} iterations without converging")
        return _mle_estimate("em", obs, design, fit.w, fit.w, warnings, fit.iterations,
                             fit.converged)
    assert design is not None
    if method == "one_step":
        try:
            raw, extra = one_step(obs, mom(obs, design))
        except np.linalg.LinAlgError:
            fit = em(obs, tol=tol, max_iter=max_iter, accelerate=accelerate)
            return _mle_estimate("em", obs, design, fit.w, fit.w, [
                *warnings, "singular Hessian at the MoM estimate; returned the EM estimate"],
                fit.iterations, fit.converged)
        w = project_simplex(raw) if project else raw
        if np.any(raw < 0) or np.any(raw > 1):
            warnings.append("the one-step estimate left the simplex" +
                            ("; projected" if project else ""))
        return _mle_estimate("one_step", obs, design, w, raw, [*warnings, *extra])
    if method == "mom_closed" and not design.is_uniform:
        raise ValueError("mom_closed is the uniform design's closed form")
    raw = mom(obs, design) if method == "mom" else mom_closed(obs, design)
    if np.any(raw < 0) or np.any(raw > 1):
        warnings.append("the moment estimate left the simplex" +
                        ("; projected" if project else " (kept raw)"))
    cov = _moment_covariance(obs, design, method)
    return Estimate(method, project_simplex(raw) if project else raw, raw,
                    np.sqrt(np.clip(np.diag(cov), 0.0, None)), cov, obs.n,
                    se_basis="sandwich covariance of the raw estimate", warnings=warnings)


def _mle_estimate(
    method: str,
    obs: Observed,
    design: Design | None,
    w: NDArray[np.float64],
    raw: NDArray[np.float64],
    warnings: list[str],
    iterations: int | None = None,
    converged: bool | None = None,
) -> Estimate:
    """Attach Wald SEs B I(θ̂)⁻¹Bᵀ/n, the log-likelihood and the KKT check."""
    cov, basis = _mle_covariance(obs, design, w)
    se = None if cov is None else np.sqrt(np.clip(np.diag(cov), 0.0, None))
    if np.any(w < BOUNDARY):
        warnings = [*warnings, "the estimate is on the boundary of the simplex: standard errors"
                    " (and asymptotic normality) do not hold there"]
    loglik = log_likelihood(obs, w)
    if not np.isfinite(loglik):
        warnings = [*warnings, "the estimate gives an observed subset probability 0"]
    with np.errstate(divide="ignore", invalid="ignore"):
        violation = kkt(obs, w).max_violation
    return Estimate(method, w, raw, se, cov, obs.n, basis, iterations, converged,
                    loglik if np.isfinite(loglik) else None,
                    violation if np.isfinite(violation) else None, warnings)


def _mle_covariance(
    obs: Observed, design: Design | None, w: NDArray[np.float64]
) -> tuple[NDArray[np.float64] | None, str | None]:
    basis = "observed information"
    try:
        # a zero in ŵ can make L(a) = 0 for unobserved subsets: non-finite, reported as None
        with np.errstate(divide="ignore", invalid="ignore"):
            if design is not None and design.enumerable and obs.dummy_alpha == 0:
                info = asymptotic.fisher_information(design, w)
                basis = "expected Fisher information"
            else:
                info = observed_information(obs, w)
            inv = np.linalg.inv(info)
    except (np.linalg.LinAlgError, ValueError, ZeroDivisionError, FloatingPointError):
        return None, None
    if not np.all(np.isfinite(inv)):
        return None, None
    b = asymptotic.reparam_matrix(obs.p)
    return b @ inv @ b.T / obs.n, basis


def _moment_covariance(obs: Observed, design: Design, method: str) -> NDArray[np.float64]:
    """Q⁻¹ĈQ⁻¹/n (or (r/(r−1))²Ĉ/n), Ĉ the empirical covariance of the indicators."""
    gamma = obs.gamma()
    second = obs.gram() / obs.n
    c_hat = (second - np.outer(gamma, gamma)) / obs.scale**2
    if method == "mom_closed":
        r = float(design.r_p)
        result: NDArray[np.float64] = (r / (r - 1.0)) ** 2 * c_hat / obs.n
        return result
    q_inv = np.linalg.inv(design.Q)
    result = q_inv @ c_hat @ q_inv / obs.n
    return result


def _identification_warnings(obs: Observed) -> list[str]:
    """Assumption 2: rank(R·B) = p − 1, else the MLE is not unique.

    Blocks of distinct subsets are added until the rank is full, so a large
    release is usually settled by its first block.
    """
    b = asymptotic.reparam_matrix(obs.p)
    gram = np.zeros((obs.p - 1, obs.p - 1))
    for start in range(0, len(obs.masks), GRAM_CHUNK):
        block = bitmask.indicators(obs.masks[start:start + GRAM_CHUNK], obs.p) @ b
        gram += block.T @ block
        if np.linalg.matrix_rank(gram) == obs.p - 1:
            return []
    if obs.p > 1:
        return ["the observed subsets do not identify w (rank(R·B) < p - 1): the MLE is not"
                " unique; more records are needed"]
    return []


def _floats(values: ArrayLike) -> list[float]:
    return [float(v) for v in np.asarray(values, float)]
