"""Shared simulation settings of the spec (§5.6): curves on a 100-point grid.

The "utility vs ε" setting: μ(t) = sin 2πt plus Gaussian-process errors with
an RBF covariance (sd 0.5, length-scale 0.1), τ = 1, Matérn(3/2, 0.1) noise.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numpy.typing import NDArray

GRID = np.linspace(0.0, 1.0, 100)
MU = np.sin(2.0 * np.pi * GRID)


@functools.cache
def _error_factor(size: int, sd: float, length: float) -> NDArray[np.float64]:
    t = np.linspace(0.0, 1.0, size)
    cov = sd**2 * np.exp(-((t[:, None] - t[None, :]) ** 2) / (2.0 * length**2))
    return np.linalg.cholesky(cov + 1e-10 * np.eye(size))


def gp_curves(
    rng: np.random.Generator, n: int, mu: NDArray[np.float64] = MU, sd: float = 0.5,
    length: float = 0.1,
) -> NDArray[np.float64]:
    """n curves μ + e_i with e_i ~ GP(0, sd² exp(−(s−t)²/(2·length²))) on the grid of μ."""
    factor = _error_factor(mu.size, sd, length)
    out: NDArray[np.float64] = mu + rng.standard_normal((n, mu.size)) @ factor.T
    return out


def l2(f: NDArray[np.float64], weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """Squared quadrature norm along the last axis."""
    out: NDArray[np.float64] = (f * f) @ weights
    return out


def _normal_pdf(t: NDArray[np.float64], m: float, s: float) -> NDArray[np.float64]:
    out: NDArray[np.float64] = np.exp(-((t - m) ** 2) / (2 * s * s)) / (s * np.sqrt(2 * np.pi))
    return out


#: our stand-ins for the paper's S-1..S-4 (spec §5.1/§5.6; the paper's formulas were
#: stripped): monotone, normal-bimodal, two fast oscillations, five narrow bumps
SCENARIOS: dict[str, NDArray[np.float64]] = {
    "S1": 3.0 * GRID**2 - 2.0 * GRID**3,
    "S2": 0.2 * _normal_pdf(GRID, 0.3, 0.1) + 0.2 * _normal_pdf(GRID, 0.7, 0.1),
    "S3": np.sin(4.0 * np.pi * GRID) + 0.5 * np.cos(8.0 * np.pi * GRID),
    "S4": sum((np.exp(-((GRID - c) ** 2) / (2 * 0.02**2)) for c in (0.1, 0.3, 0.5, 0.7, 0.9)),
              np.zeros_like(GRID)),
}
#: the public norm bound of the S1-S4 simulations (spec §5.6)
SCENARIO_TAU = 3.0


def error_covariance(size: int = GRID.size, sd: float = 0.5, length: float = 0.1
                     ) -> NDArray[np.float64]:
    """Covariance matrix of the GP errors of ``gp_curves`` on a uniform grid."""
    t = np.linspace(0.0, 1.0, size)
    out: NDArray[np.float64] = sd**2 * np.exp(-((t[:, None] - t[None, :]) ** 2)
                                              / (2.0 * length**2))
    return out


def expected_sq_error(plan: Any, mu: NDArray[np.float64],
                      cov: NDArray[np.float64] | None = None) -> float:
    """Exact E‖f̃ − μ‖² of a mean plan (ICLP-QR or FRL) for curves μ + GP errors.

    = the lattice noise's exact variance + the squared bias of the filtered
    projection + the filtered sampling variance Σ_j F_j²·Var⟨e, v_j⟩/n. It ignores
    clipping, which is inactive in practice for the S1-S4 curves at τ = 3 (norms <= 2).
    """
    cov = error_covariance(mu.size) if cov is None else cov
    w, basis, filt = plan.eig.weights, plan.basis, plan.filter
    weighted = basis * w[:, None]
    coef = mu @ weighted
    bias = float(np.sum(w * (mu - basis @ (filt * coef)) ** 2))
    var = np.einsum("kj,kl,lj->j", weighted, cov, weighted)
    sampling = float(np.sum(filt**2 * var)) / plan.n
    return float(plan.noise.expected_sq_error()) + bias + sampling
