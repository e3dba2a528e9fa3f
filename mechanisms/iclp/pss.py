"""Privacy-safe selection (PSS) of the tuning parameters (spec §3.2, Sec. 4.4).

Tuning may depend only on public quantities: n, ε, τ, the grid and the
kernels, never on the data (cross-validation would leak). ``balanced_psi``
and ``free_psi`` are the rate-optimal orders of Corollary 15 with constant 1;
``qr_risk`` / ``minimise_qr_risk`` is the default for the ICLP-QR mean: the
orders alone leave the privacy error flat in ε (issue 16), so the default
minimises an explicit data-free risk instead, with the noise covariance matched
to the smoother (``noise_shape``) and a guard that keeps it no worse than FRL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize

from mechanisms.iclp.kernels import Kernel

#: η for kernels with super-polynomial decay (Gaussian, β = ∞): any η > 1 oversmooths
ETA_INFINITE_BETA = 1.5
#: KDE bandwidth constant c in h = c·n^(−1/5) on the unit domain (h = 0.05 at n = 1000)
BANDWIDTH_CONSTANT = 0.2
#: the KDE bandwidth is never below this many grid spacings
MIN_BANDWIDTH_SPACINGS = 2.0


def default_eta(kernel: Kernel) -> float:
    """η = 1 + 2/β: strictly above the oversmoothing threshold 1 + 1/β."""
    beta = kernel.beta
    return ETA_INFINITE_BETA if math.isinf(beta) else 1.0 + 2.0 / beta


def balanced_psi(n: int, epsilon: float | Fraction, eta: float, beta: float) -> float:
    """ψ = (nε²)^(−ηβ/(β+1)): privacy error of the same order as estimation, O(1/n)."""
    power = eta if math.isinf(beta) else eta * beta / (beta + 1.0)
    return float((n * float(epsilon) ** 2) ** (-power))


def free_psi(n: int) -> float:
    """ψ = 1/n: with η > 1 + 1/β the privacy error is o(1/n) ("free privacy")."""
    return 1.0 / n


def frl_components(n: int, epsilon: Fraction, available: int) -> int:
    """M = min(J, max(1, ⌊√n·ε⌋)), computed exactly (⌊√x⌋ = isqrt(⌊x⌋))."""
    root = math.isqrt(math.floor(n * Fraction(epsilon) ** 2))
    return min(available, max(1, root))


def frl_risk(prior_share: ArrayLike, n: int, epsilon: float | Fraction
             ) -> NDArray[np.float64]:
    """R(M)/τ² for M = 1..J: FRL's data-free risk under the reference class of ``qr_risk``.

    8M²/(nε)² (its exact privacy error, Δ₁ = 2τ√M/n) + κ·(1 − Σ_{j<=M} p_j) (the energy
    of the reference mean outside the first M components) + Σ_{j<=M} p_j/n (sampling).
    """
    p = np.cumsum(np.asarray(prior_share, dtype=np.float64))
    m = np.arange(1, p.size + 1, dtype=np.float64)
    out: NDArray[np.float64] = (8.0 * m**2 / (n * float(epsilon)) ** 2
                                + PRIOR_ENERGY * np.maximum(0.0, 1.0 - p) + p / n)
    return out


def frl_min_risk_components(prior_share: ArrayLike, n: int, epsilon: float | Fraction) -> int:
    """FRL's default M: the argmin of ``frl_risk`` (the first of ties), public inputs only.

    The paper's M = ⌊√n·ε⌋ (``frl_components``) keeps FRL's privacy error near 8τ²/n at
    every ε, so a larger ε bought more components whose noise outweighed their bias on a
    smooth mean: at n = 500 the error rose with ε (issue #32). R(M, ε) = a(M)/ε² + b(M)
    with a increasing in M, so the minimiser is non-decreasing in ε and the minimum is
    non-increasing: a larger ε can always use the smaller ε's M at less privacy error.
    """
    return int(np.argmin(frl_risk(prior_share, n, epsilon))) + 1


def kde_bandwidth(n: int, grid_size: int) -> float:
    """h = 0.2·n^(−1/5) on [0, 1] (Remark 17's rate), at least two grid spacings."""
    return max(BANDWIDTH_CONSTANT * n ** (-0.2), MIN_BANDWIDTH_SPACINGS / (grid_size - 1))


# --------------------------------------------------------------------------- ICLP-QR risk


#: noise length-scales tried when the request leaves ``rho`` to the default ("auto")
RHO_CANDIDATES = (0.1, 0.05, 0.03, 0.02, 0.01)
#: powers η of the ridge kernel C^η tried when ``eta`` is left to the default
ETA_CANDIDATES = (1.0, 1.5, 2.0, 3.0, 4.0)
#: retained components J tried: ⌈GROWTH^k⌉ for k >= 0, and all of them
COMPONENT_GROWTH = 1.6
#: κ: the reference mean carries this fraction of τ² as energy (E‖μ‖² = κτ²)
PRIOR_ENERGY = 0.05
#: the reference smoothness class of the mean: a Gaussian process with this covariance
PRIOR_NU, PRIOR_RHO = 1.5, 0.1
#: log ψ grid step of the coarse scan before the bounded refinement
_LOG_STEP = 0.25
#: ψ values whose guard is evaluated at a time (in order of the objective)
_GUARD_BLOCK = 16
#: bisection steps towards the guard's boundary (log ψ to ~0.25·2^-20)
_BISECTIONS = 20


#: noise covariance of ICLP-QR: "matched" (eigenvalues F_j, the smoother itself; the
#: default) or "kernel" (eigenvalues λ_j of C, the paper's ICLP)
NoiseProfile = Literal["matched", "kernel"]


@dataclass(frozen=True)
class QrRisk:
    """The three terms of the data-free risk R(ψ) of an ICLP-QR mean (see ``qr_risk``)."""

    privacy: float  # 2Δ²·Σ_j a_j²/ε², exact for the continuous ICLP with shape a
    bias: float  # E‖(I − F)μ‖² for μ ~ GP(0, κτ²·C_ref) (incl. the energy outside span(v_≤J))
    sampling: float  # (τ²/n)·Σ_j F_j²·p_j: variance of the filtered mean of curves

    @property
    def total(self) -> float:
        return self.privacy + self.bias + self.sampling

    def describe(self) -> dict[str, float]:
        return {"privacy": self.privacy, "bias": self.bias, "sampling": self.sampling,
                "total": self.total}


def noise_shape(eigenvalues: ArrayLike, filt: ArrayLike, profile: NoiseProfile
                ) -> NDArray[np.float64]:
    """a_j: coefficient j gets Laplace noise of scale Δ·a_j/ε (ICLP with covariance Σa_j²v_j⊗v_j).

    For a fixed filter F the privacy error 2Δ²Σa_j²/ε² with Δ = (2τ/n)(Σ F_j²/a_j²)^½ is
    (8τ²/(nε)²)·(Σ F_j²/a_j²)(Σ a_j²) >= (8τ²/(nε)²)·(Σ F_j)² (Cauchy–Schwarz), with
    equality iff a_j² ∝ F_j: the "matched" profile, i.e. the noise covariance is the
    smoother C^η(C^η + ψI)^(−1) itself. "kernel" is the paper's a_j = √λ_j.
    """
    base = filt if profile == "matched" else eigenvalues
    out: NDArray[np.float64] = np.sqrt(np.asarray(base, dtype=np.float64))
    return out


def _terms(lam: NDArray[np.float64], p: NDArray[np.float64], n: int, epsilon: float,
           tau: float, eta: float, psis: NDArray[np.float64], profile: NoiseProfile,
           spread: NDArray[np.float64] | None = None,
           ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """(privacy, bias, sampling) for each ψ in ``psis`` (vectorised ``qr_risk``); the
    curves' spread is shared like the mean (``p``) unless ``spread`` says otherwise."""
    spread = p if spread is None else spread
    lam_eta = lam**eta
    filt = lam_eta / (lam_eta + psis[:, None])
    if profile == "matched":
        s = np.sum(filt, axis=1) ** 2  # (Σ F²/F)·(Σ F)
    else:
        s = np.sum(filt**2 / lam, axis=1) * float(lam.sum())
    privacy = 8.0 * tau**2 * s / (n**2 * epsilon**2)
    if p.ndim == 2:  # one reference class per column: (ψ, class) arrays
        outside2 = np.maximum(0.0, 1.0 - p.sum(axis=0))
        bias2 = PRIOR_ENERGY * tau**2 * ((1.0 - filt) ** 2 @ p + outside2)
        return privacy[:, None], bias2, tau**2 / n * (filt**2 @ spread)
    outside = max(0.0, 1.0 - float(p.sum()))
    bias = PRIOR_ENERGY * tau**2 * (np.sum((1.0 - filt) ** 2 * p, axis=1) + outside)
    sampling = tau**2 / n * np.sum(filt**2 * spread, axis=1)
    return privacy, bias, sampling


def qr_risk(
    eigenvalues: ArrayLike,
    prior_share: ArrayLike,
    n: int,
    epsilon: float | Fraction,
    tau: float,
    eta: float,
    psi: float | ArrayLike,
    profile: NoiseProfile = "kernel",
) -> QrRisk | list[QrRisk]:
    """R(ψ) = privacy MSE + reference bias + sampling variance of ICLP-QR (public inputs).

    * privacy: 2Δ(ψ)²·Σa_j²/ε² with Δ(ψ) = (2τ/n)·(Σ_j F_j²/a_j²)^½ and a the noise
      shape of ``profile`` (``noise_shape``) — the exact expected squared L2 error the
      noise adds (spec Thm 14); ψ = 0 is the unshrunk projection (F = 1);
    * bias: the worst case over the public ball ‖μ‖ <= τ is useless here — it is
      τ²·max_j (ψ/(λ_j^η+ψ))² ≈ τ² for every ψ, because the smallest retained λ_j are
      far below any useful ψ — so the bias is averaged over a reference class instead:
      μ with E μ⊗μ = κτ²·Σ_ref, whose share of energy on v_j is p_j (``prior_share``,
      Σ_all p = 1), giving κτ²·(Σ_{j<=J} (1 − F_j)²·p_j + 1 − Σ_{j<=J} p_j);
    * sampling: (τ²/n)·Σ_j F_j²·p_j, the variance of the filtered mean of n curves whose
      spread (E‖X − μ‖² <= τ²) is distributed like the reference class.

    All three depend only on n, ε, τ, the grid and the kernels, so minimising R over the
    tuning is privacy-safe (spec §4.4); it needs no data and no budget.
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    p = np.asarray(prior_share, dtype=np.float64)
    psis = np.atleast_1d(np.asarray(psi, dtype=np.float64))
    terms = _terms(lam, p, n, float(epsilon), tau, eta, psis, profile)
    out = [QrRisk(float(a), float(b), float(c)) for a, b, c in zip(*terms, strict=True)]
    return out if np.ndim(psi) else out[0]


def minimise_qr_risk(
    eigenvalues: ArrayLike,
    prior_share: ArrayLike,
    n: int,
    epsilon: float | Fraction,
    tau: float,
    eta: float,
    profile: NoiseProfile = "kernel",
    guard_share: ArrayLike | None = None,
    guard_limit: float = math.inf,
    cutoff: float = math.inf,
    guard_spread: ArrayLike | None = None,
) -> tuple[float, QrRisk, float] | None:
    """argmin_ψ R(ψ) subject to R_guard(ψ) <= guard_limit; None if no ψ is feasible.

    R_guard is the same risk with the reference share ``guard_share``: shape (J,) for one
    class, or (J, K) for K classes, one per column, of which the worst counts (FRL's
    basis functions, see ``mean._tune``). Candidates: ψ = 0 and a scan of log ψ, then
    scipy's bounded Brent step on R around the best feasible scan point; if the guard
    fails at Brent's point, bisection towards it finds the guard's boundary. Returns
    (ψ, R(ψ), R_guard(ψ)), or None also when no feasible ψ has R below ``cutoff`` (the
    caller's best so far: this only saves work). ``guard_spread`` is the guard classes'
    share of the curves' spread (default: ``guard_share``).
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    p = np.asarray(prior_share, dtype=np.float64)
    guard = p if guard_share is None else np.asarray(guard_share, dtype=np.float64)
    spread = None if guard_spread is None else np.asarray(guard_spread, dtype=np.float64)
    eps = float(epsilon)
    lo = eta * math.log(float(lam[-1])) - 8.0
    hi = eta * math.log(float(lam[0])) + 8.0
    logs = np.arange(lo, hi + _LOG_STEP, _LOG_STEP)
    psis = np.concatenate([[0.0], np.exp(logs)])

    def main(values: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(sum(_terms(lam, p, n, eps, tau, eta, values, profile)))

    def guarded(values: NDArray[np.float64]) -> NDArray[np.float64]:
        out = np.asarray(sum(_terms(lam, guard, n, eps, tau, eta, values, profile, spread)))
        return np.max(out, axis=1) if out.ndim == 2 else out  # the worst class counts

    total = main(psis)
    # the best feasible ψ is the first feasible one in order of R: check the guard (the
    # costly part, J x K per ψ) in that order, a block at a time, stopping at R >= cutoff
    order = np.argsort(total, kind="stable")
    order = order[total[order] < cutoff]
    k = -1
    for start in range(0, order.size, _GUARD_BLOCK):
        block = order[start:start + _GUARD_BLOCK]
        ok = np.flatnonzero(guarded(psis[block]) <= guard_limit)
        if ok.size:
            k = int(block[ok[0]])
            break
    if k < 0:
        return None
    psi = float(psis[k])
    if k > 0:
        found = optimize.minimize_scalar(
            lambda x: float(main(np.array([math.exp(x)]))[0]),
            bounds=(logs[k - 1] - _LOG_STEP, logs[k - 1] + _LOG_STEP), method="bounded",
            options={"xatol": 1e-3})
        if float(found.fun) < total[k]:
            # R falls from the scan point to Brent's; if the guard fails there, the best
            # feasible point of that segment is on the guard's boundary: bisect log ψ
            good, bad = math.log(psi), float(found.x)
            if guarded(np.array([math.exp(bad)]))[0] <= guard_limit:
                good = bad
            else:
                for _ in range(_BISECTIONS):
                    mid = 0.5 * (good + bad)
                    if guarded(np.array([math.exp(mid)]))[0] <= guard_limit:
                        good = mid
                    else:
                        bad = mid
            if main(np.array([math.exp(good)]))[0] < total[k]:
                psi = math.exp(good)
    best = qr_risk(lam, p, n, eps, tau, eta, psi, profile)
    assert isinstance(best, QrRisk)
    return psi, best, float(guarded(np.array([psi]))[0])


def component_candidates(available: int) -> list[int]:
    """J ∈ {⌈1.6^k⌉} ∪ {J_max}: a geometric ladder, so the search stays O(log J) fits."""
    out = {available}
    k = 0
    while (j := math.ceil(COMPONENT_GROWTH**k)) < available:
        out.add(j)
        k += 1
    return sorted(out)


# --------------------------------------------------------------------------- ICLP-QR KDE risk

#: bandwidth multipliers of ``kde_bandwidth`` tried by the KDE's default tuning
KDE_BANDWIDTH_FACTORS = (0.5, 0.7, 1.0, 1.4, 2.0, 2.8)
#: η of the estimation kernel C_h^η tried by the KDE's default tuning
KDE_ETA_CANDIDATES = (1.05, 1.2, 1.5, 2.0, 3.0)
#: the reference density's roughness: a normal of this sd (fraction of the declared range)
KDE_REFERENCE_SD = 0.1
#: centres of the reference normals of the FRL-KDE and 2-D KDE defaults (one centre
#: would favour the symmetric eigenfunctions)
KDE_REFERENCE_CENTRES = (0.3, 0.4, 0.5, 0.6, 0.7)


def kde_references(positions: ArrayLike, weights: ArrayLike) -> NDArray[np.float64]:
    """The reference densities on a grid of [0, 1], one row per centre, each integrating
    to 1 under ``weights`` (public: no data)."""
    t = np.asarray(positions, dtype=np.float64)
    centres = np.array(KDE_REFERENCE_CENTRES)[:, None]
    out: NDArray[np.float64] = np.exp(-0.5 * ((t[None, :] - centres) / KDE_REFERENCE_SD) ** 2)
    out /= (out @ np.asarray(weights, dtype=np.float64))[:, None]
    return out


def kde_amise(n: int, bandwidth: float) -> float:
    """AMISE of a Gaussian KDE of bandwidth b for the reference normal density:
    b⁴·R(p'')/4 + R(K)/(n·b), R(p'') = 3/(8√π σ⁵), R(K) = 1/(2√π) (unit domain)."""
    roughness = 3.0 / (8.0 * math.sqrt(math.pi) * KDE_REFERENCE_SD**5)
    return bandwidth**4 * roughness / 4.0 + 1.0 / (2.0 * math.sqrt(math.pi) * n * bandwidth)
