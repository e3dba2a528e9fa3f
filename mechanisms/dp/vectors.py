"""Integer noise for vector releases on a lattice (cross-tabs, covariance matrices).

A vector statistic is rounded to a lattice ``grid * Z^d`` (as the scalar
baselines do, DESIGN §6) and independent integer noise is added per entry:

* ``laplace`` / ``geometric``: discrete Laplace of scale ``L1 / ε`` with
  ``L1`` the lattice L1 sensitivity: the product density ratio is at most
  ``exp(ε · ||shift||_1 / L1)``, so pure ε-DP.
* ``gaussian``: discrete Gaussian of σ. A count table (one unit moves out of one
  cell into another) has exactly the histogram's privacy curve, reused from
  ``baselines.discrete_gaussian_sigma(pair=True)``; a one-entry vector uses the
  scalar curve. Other vectors use ρ-zCDP: the discrete Gaussian with integer
  shift s is ``s²/(2σ²)``-zCDP (Canonne, Kamath & Steinke 2020, "The Discrete
  Gaussian for Differential Privacy": its Rényi divergences are at most the
  continuous Gaussian's, α s²/(2σ²)) and coordinates compose, so a shift of squared L2 norm
  ``L2²`` costs ``ρ = L2²/(2σ²)``; ρ converts to (ε, δ) by their conversion
  (Cor. 13 of the arXiv version):
  ``δ = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α``, which OpenDP's
  ``make_zCDP_to_approxDP`` also implements (the unit tests compare with it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray
from scipy import optimize

from mechanisms import sampling, zcdp
from mechanisms.base import MechanismInputError
from mechanisms.exact import float_down, float_up

CI_LEVEL = 0.95


@dataclass(frozen=True)
class VectorNoise:
    """Independent integer noise per entry, in lattice units."""

    kind: str  # "discrete_laplace" | "discrete_gaussian"
    scale: float  # discrete Laplace scale or discrete Gaussian σ

    def sample(self, rng: np.random.Generator, size: int) -> NDArray[np.int64]:
        if self.kind == "discrete_laplace":
            return sampling.discrete_laplace(rng, self.scale, size)
        return sampling.discrete_gaussian(rng, self.scale, size)

    def halfwidth(self, level: float = CI_LEVEL) -> int:
        """Smallest k with P(|noise| <= k) >= level (exact tail formulas)."""
        if self.kind == "discrete_laplace":
            return sampling.discrete_laplace_halfwidth(self.scale, level)
        return sampling.discrete_gaussian_halfwidth(self.scale, level)


def zcdp_log_delta(rho: float, epsilon: float) -> float:
    """log δ(ε) of a ρ-zCDP mechanism by CKS 2020 Cor. 13 (any α is a valid bound)."""

    def log_delta(log_am1: float) -> float:
        am1 = math.exp(log_am1)
        alpha = 1.0 + am1
        return am1 * (alpha * rho - epsilon) - log_am1 + alpha * math.log1p(-1.0 / alpha)

    best = optimize.minimize_scalar(log_delta, bounds=(-30.0, 40.0), method="bounded",
                                    options={"xatol": 1e-10})
    return float(min(log_delta(float(best.x)), 0.0))


@functools.lru_cache(maxsize=256)
def zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest ρ (to 1e-9 relative, rounded down) whose Cor. 13 δ(ε) is <= δ."""
    target = math.log(delta)

    def excess(log_rho: float) -> float:
        return zcdp_log_delta(math.exp(log_rho), epsilon) - target

    lo, hi = math.log(epsilon) - 1.0, math.log(epsilon) + 1.0
    while excess(lo) > 0:
        lo -= 2.0
    while excess(hi) <= 0:
        hi += 2.0
    rho = math.exp(optimize.brentq(excess, lo, hi, xtol=1e-12)) * (1.0 - 1e-9)
    while zcdp_log_delta(rho, epsilon) > target:
        rho *= 1.0 - 1e-7
    return rho


def laplace_noise(epsilon: Fraction, l1_units: int) -> VectorNoise:
    """Discrete Laplace of scale L1/ε (rounded up): pure ε-DP for the vector."""
    scale = float_up(Fraction(l1_units) / epsilon)
    if scale > sampling.MAX_SCALE:
        raise MechanismInputError(
            "budget.epsilon", "epsilon too small: the noise would exceed the sampler's range")
    return VectorNoise("discrete_laplace", scale)


def gaussian_noise(epsilon: Fraction | None, delta: Fraction | None, l2sq_units: int, *,
                   count_table: bool = False, scalar_units: int | None = None,
                   rho: Fraction | None = None) -> VectorNoise:
    """Discrete Gaussian σ for an (ε, δ) budget (see the module doc for the three cases),
    or, given ``rho`` (a zcdp dataset), the σ with L2²/(2σ²) <= ρ (CKS 2020 Thm 14; a
    count table's shift is one unit out of a cell and one into another: L2² = 2)."""
    from mechanisms.dp import baselines  # baselines dispatches here; import late

    eps_f = delta_f = 0.0
    if rho is None:
        assert epsilon is not None and delta is not None
        eps_f, delta_f = float_down(epsilon), float_down(delta)
    try:
        if rho is not None:
            sigma = zcdp.sigma_for_rho(2 if count_table else l2sq_units, rho)
        elif count_table:
            sigma = baselines.discrete_gaussian_sigma(eps_f, delta_f, 1, True)
        elif scalar_units is not None:
            sigma = baselines.discrete_gaussian_sigma(eps_f, delta_f, scalar_units, False)
        else:
            rho_f = zcdp_rho(eps_f, delta_f)
            sigma = math.nextafter(math.sqrt(l2sq_units / (2.0 * rho_f)) * (1.0 + 1e-12),
                                   math.inf)
    except ValueError:
        sigma = math.inf
    if sigma > sampling.MAX_SIGMA:
        raise MechanismInputError(
            "budget.epsilon", "budget too small: the noise would exceed the sampler's range")
    return VectorNoise("discrete_gaussian", sigma)


def grid_for(*scales: float) -> float:
    """A power-of-two lattice step at most min(scales) / 2**10 (DESIGN §6)."""
    try:
        return sampling.grid_for(min(scales))
    except ValueError:
        raise MechanismInputError(
            "params.column", "declared range is too narrow for a lattice") from None


def units(change: Fraction, err: Fraction, grid: float) -> int:
    """Lattice units a rounded entry can move: reals ≤ D apart round to ≤ floor(D)+1 apart."""
    return math.floor((change + 2 * err) / Fraction(grid)) + 1
