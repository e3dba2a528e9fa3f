"""ICLP-AR mean function: the ℓ1-penalised (soft-thresholding) variant the paper compares.

f̂ = argmin_f ‖X̄ − f‖² + ψ‖f‖_{K_{C^η}} has the closed form (spec §3.2, eq. 10)

    ĉ_j = S_{θ_j}(⟨X̄, v_j⟩),  S_θ(x) = sign(x)(|x| − θ)_+,  θ_j = ψ / (2 λ_j^(η/2)).

Because |⟨X̄, v_j⟩| <= τ, every coefficient with θ_j >= τ is 0 for every
dataset, so only J = #{θ_j < τ} are released (truncation is post-processing
and any J is exactly ε-DP when projection, sensitivity and noise share it).
Soft thresholding is 1-Lipschitz, so the weighted-ℓ1 sensitivity is
Σ_{j<=J} |Δx̄_j|/√λ_j <= (2τ/n)·(Σ_{j<=J} 1/λ_j)^½ (Cauchy–Schwarz), attained
when no coefficient is thresholded (Remark 13). The noise is the ICLP's,
Lap(0, Δ√λ_j/ε) per coefficient on power-of-two lattices (``noise``).

Default tuning: η = 1 + 2/β and ψ minimising a data-free risk (``min_risk_psi``); the
paper's PSS ψ = 2τ·(nε²)^(−ηβ/(2(β+1))) (``ar_psi``), which balances the privacy error
at O(1/n), made the error rise with ε (issue #32) and is kept for reference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from mechanisms.iclp import domain, mean, pss, spectral
from mechanisms.iclp.kernels import Kernel
from mechanisms.iclp.release import FunctionRelease


def ar_thresholds(eigenvalues: ArrayLike, eta: float, psi: float) -> NDArray[np.float64]:
    """θ_j = ψ / (2 λ_j^(η/2))."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    out: NDArray[np.float64] = psi / (2.0 * lam ** (eta / 2.0))
    return out


def ar_components(eigenvalues: ArrayLike, tau: float, eta: float, psi: float) -> int:
    """J = #{j : θ_j < τ}: the coefficients that are not zero for every dataset."""
    return int(np.count_nonzero(ar_thresholds(eigenvalues, eta, psi) < tau))


def ar_sensitivity(eigenvalues: ArrayLike, n: int, tau: float, components: int) -> float:
    """Δ_AR = (2τ/n)·(Σ_{j<=J} 1/λ_j)^½ in the weighted-ℓ1 norm."""
    lam = np.asarray(eigenvalues, dtype=np.float64)[:components]
    return 2.0 * tau / n * math.sqrt(float(np.sum(1.0 / lam)))


def ar_psi(n: int, epsilon: float | Fraction, tau: float, eta: float, beta: float) -> float:
    """ψ_AR = 2τ·(nε²)^(−ηβ/(2(β+1))) (spec §3.2; β = ∞ gives the exponent −η/2)."""
    power = eta / 2.0 if math.isinf(beta) else eta * beta / (2.0 * (beta + 1.0))
    return float(2.0 * tau * (n * float(epsilon) ** 2) ** (-power))


#: candidate ψ of the default per decade (a public log grid over the useful range)
PSI_PER_DECADE = 8


def ar_risk(eigenvalues: ArrayLike, share: ArrayLike, n: int, epsilon: float, tau: float,
            eta: float, psi: float) -> float:
    """Predicted E‖released − μ‖² of ICLP-AR for the reference class of ``mean._tune``
    (μ ~ GP(0, κτ²·C_ref), spread τ²/n along the same shares), public inputs only.

    Coefficient j is x = μ_j + e_j ~ N(0, s²), s² = a + b (a = κτ²p_j, b = τ²p_j/n), and
    S_θ(x) − μ_j = (S_θ(x) − x) + e_j with S_θ(x) − x = −min(|x|, θ)·sign x and
    E[e_j | x] = (b/s²)x, so E(S_θ(x) − μ_j)² = E min(|x|, θ)² − 2(b/s²)E[min(|x|, θ)|x|]
    + b, closed forms in Φ, φ. Components with θ_j >= τ are dropped (error a), and the
    privacy error is 2Δ²Σ_{j<=J}λ_j/ε².
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    p = np.asarray(share, dtype=np.float64)
    a, b = pss.PRIOR_ENERGY * tau**2 * p, tau**2 * p / n
    s = np.sqrt(a + b)
    theta = ar_thresholds(lam, eta, psi)
    t = theta / s
    inner = s**2 * (2.0 * stats.norm.cdf(t) - 1.0 - 2.0 * t * stats.norm.pdf(t))
    tail = 2.0 * stats.norm.sf(t)
    sq = inner + theta**2 * tail
    cross = inner + 2.0 * theta * s * stats.norm.pdf(t)
    kept = theta < tau
    error = np.where(kept, sq - 2.0 * b / s**2 * cross + b, a)
    j = max(1, int(np.count_nonzero(kept)))
    privacy = 2.0 * ar_sensitivity(lam[:j], n, tau, j) ** 2 * float(np.sum(lam[:j])) / epsilon**2
    outside = pss.PRIOR_ENERGY * tau**2 * max(0.0, 1.0 - float(p.sum()))
    return privacy + float(np.sum(error)) + outside


@functools.lru_cache(maxsize=64)
def min_risk_psi(eig: spectral.EigenSystem, n: int, epsilon: float, tau: float,
                 eta: float) -> float:
    """argmin of ``ar_risk`` over a log grid of ψ spanning J = 1 … all components (the
    ψ at which θ_j = τ). The paper's balanced ψ left the error rising with ε (issue #32);
    the risk is a(ψ)/ε² + b(ψ) on a grid fixed by public inputs, so its minimum is
    non-increasing in ε."""
    lam = eig.values
    share = mean.prior_share(eig)
    lo = math.log10(2.0 * tau * float(lam[-1]) ** (eta / 2.0)) - 1.0
    hi = math.log10(2.0 * tau * float(lam[0]) ** (eta / 2.0))
    count = math.ceil((hi - lo) * PSI_PER_DECADE) + 1
    grid = 10.0 ** np.linspace(lo, hi, count)
    return float(min(grid, key=lambda p: ar_risk(lam, share, n, epsilon, tau, eta,
                                                  float(p))))


@dataclass(frozen=True, eq=False)
class ArPlan(mean.MeanPlan):
    """An ICLP-AR mean release: ``filter`` is all ones, the shrinkage is the threshold."""

    thresholds: NDArray[np.float64]

    def summary(self, curves: ArrayLike) -> NDArray[np.float64]:
        """ĉ_j = S_{θ_j}(⟨mean of clipped curves, v_j⟩), j <= J."""
        raw = super().summary(curves)  # filter = 1: the plain coefficients
        out: NDArray[np.float64] = np.sign(raw) * np.maximum(np.abs(raw) - self.thresholds, 0.0)
        return out


def plan_iclp_ar_mean(
    grid: Sequence[float] | ArrayLike,
    tau: float,
    n: int,
    epsilon: float | Fraction,
    kernel: Kernel = mean.DEFAULT_KERNEL,
    eta: float | None = None,
    psi: float | None = None,
    rel_floor: float = spectral.REL_FLOOR,
) -> ArPlan:
    """Calibrate an ICLP-AR mean release; η, ψ default to the PSS rules above."""
    points, tau = domain.validate_functional_meta(grid, tau)
    mean.check_n_eps(n, epsilon)
    eta_rule = "given" if eta is not None else "auto"
    eta_value = pss.default_eta(kernel) if eta is None else float(eta)
    if not (math.isfinite(eta_value) and eta_value >= 1.0):
        raise ValueError("eta must be >= 1 for ICLP-AR (K_{C^eta} inside K_C, spec §3.1)")
    full = mean.eigen(kernel, points, rel_floor, None)
    psi_rule = "given" if psi is not None else "min-risk"
    psi_value = (min_risk_psi(full, n, float(epsilon), tau, eta_value) if psi is None
                 else float(psi))
    if not (math.isfinite(psi_value) and psi_value > 0):
        raise ValueError("psi must be a finite number > 0")
    j = ar_components(full.values, tau, eta_value, psi_value)
    # θ_1 >= τ: the estimator is 0 for every dataset; keep one (always-zero) coefficient
    # so the release is well defined (pure noise around 0) instead of refusing
    thresholded = j == 0
    j = max(1, j)
    eig = mean.prefix(full, j)
    theta = ar_thresholds(eig.values, eta_value, psi_value)
    theta.setflags(write=False)
    bessel = spectral.bessel_factor(eig)
    delta = ar_sensitivity(eig.values, n, tau * mean.TAU_SLACK, j) * math.sqrt(bessel)
    smoothing = {
        "method": "iclp-ar",
        "eta": eta_value,
        "eta_rule": eta_rule,
        "psi": psi_value,
        "psi_rule": psi_rule,
        "beta": kernel.beta,
        "components": j,
        "components_rule": "theta_j < tau",
        "all_thresholded": thresholded,
    }
    base = mean.make_plan("iclp-ar", points, eig, n, tau, np.ones(j), np.sqrt(eig.values),
                      delta * mean.SENSITIVITY_SAFETY, epsilon, smoothing)
    values = {f.name: getattr(base, f.name) for f in fields(mean.MeanPlan)}
    return ArPlan(**values, thresholds=theta)


def iclp_ar_mean(
    curves: ArrayLike,
    grid: Sequence[float] | ArrayLike,
    tau: float,
    epsilon: float | Fraction,
    rng: np.random.Generator,
    **options: Any,
) -> FunctionRelease:
    """One-call ICLP-AR mean release (notebook convenience)."""
    x = np.asarray(curves, dtype=np.float64)
    return plan_iclp_ar_mean(grid, tau, x.shape[0], epsilon, **options).release(x, rng)
