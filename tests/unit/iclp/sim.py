"""Shared simulation settings of the spec (§5.6): curves on a 100-point grid.

The "utility vs ε" setting: μ(t) = sin 2πt plus Gaussian-process errors with
an RBF covariance (sd 0.5, length-scale 0.1), τ = 1, Matérn(3/2, 0.1) noise.
"""

from __future__ import annotations

import functools

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
