"""Covariance kernels of the ICLP noise (and of the KDE smoother), on a 1-d domain.

Every kernel is isotropic, ``k(s, t) = scale · c(|s − t| / rho)`` with a
correlation function ``c`` (``c(0) = 1``), so with ``scale = 1`` the noise
has unit variance and, on the unit domain, trace 1 (spec §2.1). Lengths are
in domain units *after* the domain is rescaled to [0, 1], so one ``rho``
means the same smoothness on any grid.

The density-normalised variant (``density()``) divides by ∫ c(|r|/rho) dr so
the kernel is a probability density in its first argument: the KDE's base
kernel ``C_h`` (spec §3.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

Family = Literal["matern", "gaussian", "exponential"]
FAMILIES: tuple[Family, ...] = ("matern", "gaussian", "exponential")
#: ν with a closed-form Matérn (half-integers up to 5/2); others go through K_ν
_CLOSED_FORM_NU = (0.5, 1.5, 2.5)


@dataclass(frozen=True)
class Kernel:
    """An isotropic kernel; frozen and hashable so it can key the eigen-system cache."""

    family: Family
    rho: float
    nu: float | None = None  # Matérn smoothness; None for the other families
    scale: float = 1.0  # k(0); 1 for a noise kernel, 1/∫c for a density kernel

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown kernel family {self.family!r}")
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError("kernel length-scale rho must be a finite number > 0")
        if (self.family == "matern") != (self.nu is not None):
            raise ValueError("nu is required for the matern family and only for it")
        if self.nu is not None and not (math.isfinite(self.nu) and self.nu > 0):
            raise ValueError("matern nu must be a finite number > 0")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError("kernel scale must be a finite number > 0")

    def correlation(self, r: ArrayLike) -> NDArray[np.float64]:
        """c(|r| / rho) with c(0) = 1."""
        x = np.abs(np.asarray(r, dtype=np.float64)) / self.rho
        if self.family == "gaussian":
            return np.exp(-0.5 * x * x)
        if self.family == "exponential":
            return np.exp(-x)
        assert self.nu is not None
        return _matern(self.nu, x)

    def __call__(self, s: ArrayLike, t: ArrayLike) -> NDArray[np.float64]:
        """k(s, t), broadcasting ``s`` against ``t``."""
        diff = np.asarray(s, dtype=np.float64) - np.asarray(t, dtype=np.float64)
        return self.scale * self.correlation(diff)

    def matrix(self, points: ArrayLike) -> NDArray[np.float64]:
        """The Gram matrix K_ik = k(t_i, t_k) on a set of points."""
        p = np.asarray(points, dtype=np.float64)
        return self(p[:, None], p[None, :])

    @property
    def integral(self) -> float:
        """∫_ℝ c(|r|/rho) dr: 1 over the density normaliser of this correlation."""
        if self.family == "gaussian":
            return math.sqrt(2.0 * math.pi) * self.rho
        if self.family == "exponential":
            return 2.0 * self.rho
        assert self.nu is not None
        # The 1-d Matérn spectral density at 0 (Rasmussen & Williams 2006, eq. 4.15).
        nu = self.nu
        return (
            math.sqrt(2.0 * math.pi)
            * self.rho
            * math.exp(special.gammaln(nu + 0.5) - special.gammaln(nu))
            / math.sqrt(nu)
        )

    def density(self) -> Kernel:
        """The same shape scaled to integrate to 1 in each argument (a KDE kernel)."""
        return replace(self, scale=1.0 / self.integral)

    @property
    def beta(self) -> float:
        """Eigenvalue decay exponent β in λ_j ≍ j^(−β) on a 1-d domain (∞: faster).

        Matérn(ν) has an RKHS norm-equivalent to the Sobolev space of order
        ν + 1/2, so β = 2ν + 1; the exponential kernel is Matérn 1/2 (β = 2);
        the Gaussian's eigenvalues decay super-polynomially.
        """
        if self.family == "gaussian":
            return math.inf
        if self.family == "exponential":
            return 2.0
        assert self.nu is not None
        return 2.0 * self.nu + 1.0

    def describe(self) -> dict[str, float | str]:
        """JSON-ready public description (for results and accuracy statements)."""
        out: dict[str, float | str] = {"family": self.family, "rho": self.rho}
        if self.nu is not None:
            out["nu"] = self.nu
        out["variance"] = self.scale
        return out


def matern(nu: float, rho: float) -> Kernel:
    """Matérn(ν, ρ) with unit variance."""
    return Kernel("matern", float(rho), float(nu))


def gaussian(rho: float) -> Kernel:
    """Gaussian (RBF) exp(−r²/(2ρ²)) with unit variance."""
    return Kernel("gaussian", float(rho))


def exponential(rho: float) -> Kernel:
    """Exponential exp(−r/ρ) (Matérn 1/2) with unit variance."""
    return Kernel("exponential", float(rho))


def _matern(nu: float, x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Matérn correlation at x = |r|/ρ: 2^(1−ν)/Γ(ν) (√(2ν)x)^ν K_ν(√(2ν)x)."""
    if nu in _CLOSED_FORM_NU:
        z = math.sqrt(2.0 * nu) * x
        if nu == 0.5:
            return np.exp(-z)
        if nu == 1.5:
            return (1.0 + z) * np.exp(-z)
        return (1.0 + z + z * z / 3.0) * np.exp(-z)
    z = math.sqrt(2.0 * nu) * x
    out = np.ones_like(z)
    pos = z > 0
    zp = z[pos]
    # In logs with the scaled Bessel function kve = kv·e^z: no overflow for large ν or z.
    with np.errstate(divide="ignore"):
        log_k = (
            (1.0 - nu) * math.log(2.0)
            - special.gammaln(nu)
            + nu * np.log(zp)
            + np.log(special.kve(nu, zp))
            - zp
        )
    out[pos] = np.exp(log_k)
    return out
