"""Float-safe weighted-ℓ1 Laplace noise on basis coefficients (the ICLP and FRL core).

ICLP (spec Thm 8) releases coefficients c̃_j = ĉ_j + Lap(0, Δ·a_j/ε) with
shape a_j = √λ_j and Δ the sensitivity in the weighted ℓ1 norm Σ_j |h_j|/a_j;
FRL is the same with a_j = 1. Continuous Laplace on floats leaks through the
floating-point support (Mironov 2012, DESIGN §6), so each coefficient is
released on its own power-of-two lattice g_j·ℤ instead:

    k_j = round(ĉ_j / g_j),   c̃_j = g_j · (k_j + K_j),   K_j ~ discrete Laplace(s_j),

with s_j = Δ_lat·a_j / (ε·g_j). Two neighbours' lattice centres differ by
|k_j − k'_j| <= (|ĉ_j − ĉ'_j| + 2·err_j)/g_j + 1, where err_j is a public bound
on the floating-point error of the computed coefficient, so the privacy loss
Σ_j |k_j − k'_j|/s_j is at most ε whenever

    Δ_lat >= Δ + Σ_j (g_j + 2·err_j) / a_j.

The lattice is chosen fine enough (g_j <= min(1, 1/ε)·Δ·a_j / (1024·J)) that
Δ_lat exceeds Δ by about 0.1%, and coarse enough that every k_j is an exact
double (|ĉ_j|/g_j < 2^50).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms import sampling
from mechanisms.exact import float_down_any

#: the lattice is this many times finer than Δ·a_j·min(1, 1/ε) / J
RESOLUTION = 1024
#: lattice centres stay below this in magnitude (exact doubles, with room for the noise)
CENTRE_LIMIT = 2.0**50
#: relative round-up applied to every computed scale (their float evaluation errs ~1e-15)
_ROUND_UP = 1.0 + 2.0**-40


class CalibrationError(ValueError):
    """The noise cannot be placed on an exact lattice (absurd ε or sensitivity)."""


@dataclass(frozen=True, eq=False)
class CoefficientNoise:
    """Public calibration of the lattice Laplace noise on J coefficients."""

    shape: NDArray[np.float64]  # a_j (√λ_j for ICLP, 1 for FRL / Bernstein)
    sensitivity: float  # Δ: bound on Σ_j |ĉ_j − ĉ'_j| / a_j in exact arithmetic
    lattice_sensitivity: float  # Δ_lat: Δ plus the rounding and float-error slack
    epsilon: float  # ε rounded down to a double
    steps: NDArray[np.float64]  # g_j, powers of two
    scales: NDArray[np.float64]  # s_j, discrete Laplace scales in lattice units

    @property
    def size(self) -> int:
        return int(self.shape.size)

    @property
    def laplace_scales(self) -> NDArray[np.float64]:
        """b_j = s_j·g_j = Δ_lat·a_j/ε: the Laplace scale of coefficient j, value units."""
        return self.scales * self.steps

    @property
    def sigma(self) -> float:
        """σ with noise = σ·X for X an ICLP of covariance diag(a_j²) (σ = √2·Δ_lat/ε)."""
        return math.sqrt(2.0) * self.lattice_sensitivity / self.epsilon

    def centre(self, coefficients: ArrayLike) -> NDArray[np.int64]:
        """k_j = round(ĉ_j / g_j): the lattice point the noise is added to."""
        c = np.asarray(coefficients, dtype=np.float64)
        if c.shape[-1:] != self.shape.shape:
            raise ValueError("coefficient vector has the wrong length")
        if not np.all(np.isfinite(c)):
            raise ValueError("coefficients must be finite")
        with np.errstate(over="ignore"):
            k = np.rint(c / self.steps)
        if not np.all(np.abs(k) < CENTRE_LIMIT):
            raise ValueError("coefficient outside the calibrated bound")
        return k.astype(np.int64)

    def sample(
        self, rng: np.random.Generator, size: int | tuple[int, ...] = ()
    ) -> NDArray[np.int64]:
        """Lattice noise K_j ~ discrete Laplace(s_j), shape size + (J,)."""
        return sampling.discrete_laplace(rng, self.scales, size)

    def release(
        self, coefficients: ArrayLike, rng: np.random.Generator
    ) -> NDArray[np.float64]:
        """c̃_j = g_j·(k_j + K_j): exact doubles on each coefficient's lattice."""
        units = self.centre(coefficients) + self.sample(rng)
        return units.astype(np.float64) * self.steps

    def max_privacy_loss(self, centre_a: ArrayLike, centre_b: ArrayLike) -> Fraction:
        """Exact sup of the log-likelihood ratio between two centres: Σ|k − k'|/s_j."""
        a = np.asarray(centre_a, dtype=np.int64)
        b = np.asarray(centre_b, dtype=np.int64)
        return sum(
            (Fraction(abs(int(x) - int(y))) / Fraction(float(s)) for x, y, s in
             zip(a, b, self.scales, strict=True)),
            Fraction(0),
        )

    def privacy_loss(
        self, released: ArrayLike, centre_a: ArrayLike, centre_b: ArrayLike
    ) -> NDArray[np.float64]:
        """log P_a(y)/P_b(y) for released lattice units y (shape (..., J))."""
        y = np.asarray(released, dtype=np.float64)
        a = np.asarray(centre_a, dtype=np.float64)
        b = np.asarray(centre_b, dtype=np.float64)
        out: NDArray[np.float64] = ((np.abs(y - b) - np.abs(y - a)) / self.scales).sum(axis=-1)
        return out

    def variances(self) -> NDArray[np.float64]:
        """Exact variance of each released coefficient's noise, value units."""
        return discrete_laplace_variance(self.scales) * self.steps**2

    def expected_sq_error(self) -> float:
        """E‖noise‖² in the quadrature L2 norm (orthonormal basis): Σ_j Var_j."""
        return float(self.variances().sum())


def calibrate(
    shape: ArrayLike,
    sensitivity: float,
    epsilon: float | Fraction,
    error: ArrayLike,
    bound: ArrayLike,
) -> CoefficientNoise:
    """Lattice steps and discrete scales for an exact ε-DP weighted-ℓ1 Laplace release.

    ``shape`` a_j > 0; ``sensitivity`` Δ (already a rigorous upper bound);
    ``error`` per-coefficient bounds on |computed − exact| of ĉ_j; ``bound``
    per-coefficient bounds on |ĉ_j| (to keep lattice centres exact).
    """
    a = np.asarray(shape, dtype=np.float64)
    err = np.broadcast_to(np.asarray(error, dtype=np.float64), a.shape)
    top = np.broadcast_to(np.asarray(bound, dtype=np.float64), a.shape)
    eps = float_down_any(epsilon)
    if a.ndim != 1 or a.size == 0 or not np.all((a > 0) & np.isfinite(a)):
        raise CalibrationError("shape must be a non-empty vector of positive numbers")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise CalibrationError("sensitivity must be a finite number > 0")
    if not (math.isfinite(eps) and eps > 0):
        raise CalibrationError("epsilon must be a finite number > 0")
    if not (np.all(err >= 0) and np.all(top >= 0)):
        raise CalibrationError("error and bound must be non-negative")
    fine = sensitivity * min(1.0, 1.0 / eps) * a / (RESOLUTION * a.size)
    # centres |ĉ_j|/g_j must stay strictly below the limit, for every |ĉ_j| <= bound +
    # error: with twice that over the limit, a bound that is a power of two (2^53 squared,
    # say) no longer lands exactly on it
    coarse = 2.0 * (top + err) / CENTRE_LIMIT
    steps = np.maximum(pow2_floor(fine), pow2_ceil(coarse))
    slack = float(np.sum((steps + 2.0 * err) / a))
    lattice = (sensitivity + slack) * _ROUND_UP
    scales = lattice * a / (eps * steps) * _ROUND_UP
    if not np.all(scales <= sampling.MAX_SCALE):
        raise CalibrationError("epsilon too small: the noise would exceed the sampler's range")
    for arr in (a, steps, scales):
        arr.setflags(write=False)
    return CoefficientNoise(
        shape=a,
        sensitivity=float(sensitivity),
        lattice_sensitivity=float(lattice),
        epsilon=eps,
        steps=steps,
        scales=scales,
    )


def discrete_laplace_variance(scales: ArrayLike) -> NDArray[np.float64]:
    """Var X = 2p/(1 − p)² for the discrete Laplace with p = e^(−1/s)."""
    s = np.asarray(scales, dtype=np.float64)
    p = np.exp(-1.0 / s)
    q = -np.expm1(-1.0 / s)
    out: NDArray[np.float64] = 2.0 * p / (q * q)
    return out


def discrete_laplace_fourth_moment(scales: ArrayLike) -> NDArray[np.float64]:
    """E X⁴ = 2p(1 + 10p + p²)/(1 − p)⁴ for the discrete Laplace with p = e^(−1/s)."""
    s = np.asarray(scales, dtype=np.float64)
    p = np.exp(-1.0 / s)
    q = -np.expm1(-1.0 / s)
    out: NDArray[np.float64] = 2.0 * p * (1.0 + 10.0 * p + p * p) / q**4
    return out


def privacy_mse(sensitivity: float, epsilon: float, eigenvalues: ArrayLike) -> float:
    """Continuous-ICLP privacy MSE 2Δ²·tr C/ε² (spec Thm 14), the lattice-free reference."""
    return 2.0 * sensitivity**2 * float(np.sum(eigenvalues)) / float(epsilon) ** 2


def pow2_floor(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Largest power of two <= x (x > 0, normal)."""
    if np.any(x < np.finfo(np.float64).tiny) or not np.all(np.isfinite(x)):
        raise CalibrationError("sensitivity too small for a normal power-of-two lattice")
    mant, expo = np.frexp(x)
    del mant
    out: NDArray[np.float64] = np.ldexp(1.0, expo - 1)
    return out


def pow2_ceil(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Smallest power of two >= x (0 for x = 0)."""
    mant, expo = np.frexp(x)
    out: NDArray[np.float64] = np.where(mant == 0.5, np.ldexp(1.0, expo - 1), np.ldexp(1.0, expo))
    return np.where(x > 0, out, 0.0)
