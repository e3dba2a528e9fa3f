"""GP-ADP: the Gaussian-process (ε, δ) mechanism of Mirshani et al. (2019), a baseline (spec §4).

The summary is the ridge (QR) mean f̂ = Σ_j F_j ⟨X̄, v_j⟩ v_j with
F_j = λ_j^η/(λ_j^η + ψ) (default η = 1, Hall et al.'s choice), released as
f̂ + σ·G with G ~ GP(0, C). In the eigenbasis of C that is independent
Gaussian noise N(0, σ²λ_j) per coefficient: a Gaussian mechanism in the
whitened coordinates c_j/√λ_j, whose ℓ2 sensitivity is the Cameron–Martin
sensitivity

    Δ_CM = sup ‖f̂_D − f̂_D'‖_{H_C} = (2τ/n)·max_j F_j/√λ_j   (<= τ/(n√ψ) at η = 1).

Float safety: as for the ICLP, each coefficient lives on its own power-of-two
lattice g_j·ℤ and gets *discrete* Gaussian noise (``sampling.discrete_gaussian``,
exact) of scale s_j = σ·√λ_j/g_j lattice units. The neighbours' lattice centres
differ by d_j <= (|Δĉ_j| + 2·err_j + g_j)/g_j, so Σ_j (d_j/s_j)² <= Δ_lat²/σ²
with Δ_lat = Δ_CM + ‖(g + 2·err)/√λ‖₂ (Minkowski).

c(δ): the multivariate discrete Gaussian with that shift is ρ-zCDP with
ρ = Δ_lat²/(2σ²) (Canonne, Kamath & Steinke 2020, Thm 14 and composition), and
ρ-zCDP gives (ε, δ)-DP with δ = inf_{α>1} e^{(α−1)(αρ−ε)}/(α−1)·(1 − 1/α)^α
(CKS 2020, Cor. 13). σ is the smallest with that δ <= the budget's δ, found
with scipy's brentq. This holds for every ε > 0 (no ε <= 1 condition as for
the classical c(δ) = √(2 log(1.25/δ))); it costs a few per cent more σ than the
analytic Gaussian calibration of Balle & Wang (2018), which is exact only for
continuous noise and one coordinate.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize

from mechanisms import sampling
from mechanisms.exact import float_down_any
from mechanisms.iclp import domain, mean, noise, pss, spectral
from mechanisms.iclp.kernels import Kernel
from mechanisms.iclp.release import FunctionRelease

#: the lattice is this many times finer than Δ_CM·√λ_j/√J
RESOLUTION = 1024
DEFAULT_ETA = 1.0
_ROUND_UP = 1.0 + 2.0**-40
#: below this scale the discrete Gaussian's variance is summed from its pmf
_EXACT_VARIANCE_SCALE = 20.0


def zcdp_delta(rho: float, epsilon: float) -> float:
    """δ(ε) of a ρ-zCDP mechanism: inf_{α>1} e^{(α−1)(αρ−ε)}/(α−1)·(1 − 1/α)^α (CKS Cor. 13)."""
    return math.exp(zcdp_log_delta(rho, epsilon))


def zcdp_log_delta(rho: float, epsilon: float) -> float:
    """log of ``zcdp_delta`` (no underflow), minimised over log(α − 1) with scipy."""
    if rho <= 0:
        return -math.inf

    def log_delta(log_am1: float) -> float:
        am1 = math.exp(log_am1)
        alpha = am1 + 1.0
        return am1 * (alpha * rho - epsilon) - math.log(am1) + alpha * math.log1p(-1.0 / alpha)

    found = optimize.minimize_scalar(log_delta, bounds=(-20.0, 20.0), method="bounded",
                                     options={"xatol": 1e-10})
    return min(0.0, float(found.fun))


@functools.lru_cache(maxsize=256)
def zcdp_sigma(epsilon: float, delta: float) -> float:
    """Smallest σ (unit ℓ2 sensitivity) with ``zcdp_delta(1/(2σ²), ε)`` <= δ, rounded up."""
    if not (0 < delta < 1 and epsilon > 0):
        raise ValueError("need epsilon > 0 and 0 < delta < 1")

    def excess(log_sigma: float) -> float:
        return zcdp_log_delta(0.5 * math.exp(-2.0 * log_sigma), epsilon) - math.log(delta)

    lo, hi = -10.0, 10.0
    if excess(hi) > 0:
        raise ValueError("delta too small for the sampler's range")
    if excess(lo) <= 0:
        return math.exp(lo)
    log_sigma = optimize.brentq(excess, lo, hi, xtol=1e-12)
    sigma = math.exp(log_sigma) * (1.0 + 1e-9)
    while zcdp_delta(0.5 / sigma**2, epsilon) > delta:
        sigma *= 1.0 + 1e-7
    return sigma


def cm_sensitivity(eigenvalues: ArrayLike, n: int, tau: float, eta: float, psi: float) -> float:
    """Δ_CM = (2τ/n)·max_j F_j/√λ_j for the QR filter F_j = λ_j^η/(λ_j^η + ψ)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    return 2.0 * tau / n * float(np.max(mean.qr_filter(lam, eta, psi) / np.sqrt(lam)))


@dataclass(frozen=True, eq=False)
class GaussianCoefficientNoise:
    """Discrete Gaussian noise of scale σ·√λ_j per coefficient, on power-of-two lattices."""

    shape: NDArray[np.float64]  # √λ_j
    sensitivity: float  # Δ_CM, exact arithmetic
    lattice_sensitivity: float  # Δ_lat
    epsilon: float
    delta: float
    sigma: float  # whitened σ: noise on coefficient j is N_Z(0, σ²λ_j) in value units
    steps: NDArray[np.float64]
    scales: NDArray[np.float64]  # s_j, lattice units

    @property
    def size(self) -> int:
        return int(self.shape.size)

    @property
    def rho(self) -> float:
        """zCDP parameter Δ_lat²/(2σ²)."""
        return 0.5 * (self.lattice_sensitivity / self.sigma) ** 2

    def centre(self, coefficients: ArrayLike) -> NDArray[np.int64]:
        c = np.asarray(coefficients, dtype=np.float64)
        if c.shape[-1:] != self.shape.shape or not np.all(np.isfinite(c)):
            raise ValueError("coefficient vector has the wrong length or is not finite")
        k = np.rint(c / self.steps)
        if not np.all(np.abs(k) < noise.CENTRE_LIMIT):
            raise ValueError("coefficient outside the calibrated bound")
        return k.astype(np.int64)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] = ()
               ) -> NDArray[np.int64]:
        """K_j ~ discrete Gaussian(s_j), shape size + (J,), one exact sampler call per j."""
        shape = (size,) if isinstance(size, int) else tuple(size)
        cols = [sampling.discrete_gaussian(rng, float(s), shape) for s in self.scales]
        return np.stack(cols, axis=-1)

    def release(self, coefficients: ArrayLike, rng: np.random.Generator
                ) -> NDArray[np.float64]:
        units = self.centre(coefficients) + self.sample(rng)
        return units.astype(np.float64) * self.steps

    def variances(self) -> NDArray[np.float64]:
        """Variance of each coefficient's noise, value units (exact sum for small scales)."""
        out = np.empty(self.size)
        for j, s in enumerate(self.scales):
            if s > _EXACT_VARIANCE_SCALE:
                out[j] = s * s  # the pmf sum differs by ~e^(-2π²s²) relative
            else:
                k = np.arange(-math.ceil(12 * s) - 2, math.ceil(12 * s) + 3)
                out[j] = float(np.sum(sampling.discrete_gaussian_pmf(float(s), k) * k * k))
        return out * self.steps**2

    def expected_sq_error(self) -> float:
        return float(self.variances().sum())


def calibrate_gaussian(shape: ArrayLike, sensitivity: float, epsilon: float | Fraction,
                       delta: float | Fraction, error: ArrayLike, bound: ArrayLike
                       ) -> GaussianCoefficientNoise:
    """Lattices and discrete Gaussian scales for an (ε, δ)-DP release (see the module doc)."""
    a = np.asarray(shape, dtype=np.float64)
    err = np.broadcast_to(np.asarray(error, dtype=np.float64), a.shape)
    top = np.broadcast_to(np.asarray(bound, dtype=np.float64), a.shape)
    eps = float_down_any(epsilon)
    dlt = float_down_any(delta)
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise noise.CalibrationError("sensitivity must be a finite number > 0")
    if not (0 < dlt < 1 and math.isfinite(eps) and eps > 0):
        raise noise.CalibrationError("need epsilon > 0 and 0 < delta < 1")
    fine = sensitivity * a / (RESOLUTION * math.sqrt(a.size))
    steps = np.maximum(noise.pow2_floor(fine), noise.pow2_ceil(top / noise.CENTRE_LIMIT))
    slack = float(np.sqrt(np.sum(((steps + 2.0 * err) / a) ** 2)))
    lattice = (sensitivity + slack) * _ROUND_UP
    try:
        sigma = zcdp_sigma(eps, dlt) * lattice * _ROUND_UP
    except ValueError as exc:
        raise noise.CalibrationError(str(exc)) from None
    scales = sigma * a / steps * _ROUND_UP
    if not np.all(scales <= sampling.MAX_SIGMA):
        raise noise.CalibrationError("budget too small: the noise would exceed the sampler's range")
    for arr in (a, steps, scales):
        arr.setflags(write=False)
    return GaussianCoefficientNoise(a, float(sensitivity), float(lattice), eps, dlt, sigma,
                                    steps, scales)


@dataclass(frozen=True, eq=False)
class GpPlan:
    """A calibrated GP-ADP mean release; built by ``plan_gp_mean``."""

    grid: NDArray[np.float64]
    eig: spectral.EigenSystem
    n: int
    tau: float
    filter: NDArray[np.float64]
    gaussian: GaussianCoefficientNoise
    smoothing: dict[str, Any]

    @property
    def components(self) -> int:
        return int(self.filter.size)

    @property
    def basis(self) -> NDArray[np.float64]:
        return self.eig.vectors

    def summary(self, curves: ArrayLike) -> NDArray[np.float64]:
        """ĉ_j = F_j·⟨mean of clipped curves, v_j⟩ (the QR mean's coefficients)."""
        x = np.asarray(curves, dtype=np.float64)
        if x.ndim != 2 or x.shape != (self.n, self.grid.size):
            raise ValueError(f"curves must have shape (n_rows, {self.grid.size}) = "
                             f"({self.n}, {self.grid.size})")
        avg = domain.clipped_mean(x, self.eig.weights, self.tau)
        out: NDArray[np.float64] = self.filter * ((avg * self.eig.weights) @ self.basis)
        return out

    def release(self, curves: ArrayLike, rng: np.random.Generator) -> FunctionRelease:
        coefficients = self.gaussian.release(self.summary(curves), rng)
        return FunctionRelease(grid=self.grid, values=self.basis @ coefficients,
                               coefficients=coefficients, kernel=self.kernel_info(),
                               smoothing=self.smoothing,
                               extra={"basis": {"eigenvalues": self.eig.values}})

    def kernel_info(self) -> dict[str, Any]:
        return {**self.eig.kernel.describe(),
                "domain": [float(self.grid[0]), float(self.grid[-1])],
                "length_units": "fraction of the grid span"}

    def accuracy(self) -> dict[str, Any]:
        nz = self.gaussian
        mse = nz.expected_sq_error()
        return {
            "noise": "GP-ADP: discrete Gaussian per eigen-coefficient (a Gaussian process with"
                     " covariance C) on power-of-two lattices",
            "gaussian_scales": "sigma*sqrt(lambda_j)",
            "sensitivity": nz.sensitivity,
            "sensitivity_lattice": nz.lattice_sensitivity,
            "sensitivity_norm": "cameron_martin_H_C",
            "sigma": nz.sigma,
            "calibration": "rho-zCDP (Canonne-Kamath-Steinke 2020) converted to (epsilon, delta)"
                           " by their Cor. 13; valid for every epsilon",
            "zcdp_rho": nz.rho,
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse),
            "kernel": self.kernel_info(),
            "smoothing": self.smoothing,
            "truncation": {"components": self.components, "grid_points": int(self.grid.size),
                           "rel_floor": self.eig.rel_floor},
            "norm_bound": self.tau,
            "statement": (
                f"E||released - smoothed mean||^2 = {mse:.6g} (RMS over the domain, curve"
                f" units), the privacy error only; approximate DP with delta = {nz.delta:g}."
            ),
        }


def plan_gp_mean(
    grid: Sequence[float] | ArrayLike,
    tau: float,
    n: int,
    epsilon: float | Fraction,
    delta: float | Fraction,
    kernel: Kernel = mean.DEFAULT_KERNEL,
    eta: float | None = None,
    psi: float | None = None,
    rel_floor: float = spectral.REL_FLOOR,
) -> GpPlan:
    """Calibrate a GP-ADP mean release; ψ defaults to the minimiser of the same data-free
    risk as ICLP-QR's (``pss.qr_risk``'s bias and sampling terms, with the Gaussian's
    privacy error σ²·tr C)."""
    points, tau = domain.validate_functional_meta(grid, tau)
    mean.check_n_eps(n, epsilon)
    if not 0 < float(delta) < 1:
        raise ValueError("delta must be in (0, 1)")
    eta_value = DEFAULT_ETA if eta is None else float(eta)
    if not (math.isfinite(eta_value) and eta_value >= 0.5):
        raise ValueError("eta must be >= 1/2 for GP-ADP (F_j/sqrt(lambda_j) bounded)")
    eig = mean.eigen(kernel, points, rel_floor, None)
    c = zcdp_sigma(float_down_any(epsilon), float_down_any(delta))
    if psi is None:
        psi_rule, psi_value = "min-risk", _tune_psi(eig, n, c, tau, eta_value)
    else:
        psi_rule, psi_value = "given", float(psi)
    if not (math.isfinite(psi_value) and psi_value > 0):
        raise ValueError("psi must be a finite number > 0")
    filt = mean.qr_filter(eig.values, eta_value, psi_value)
    bessel = spectral.bessel_factor(eig)
    d_cm = cm_sensitivity(eig.values, n, tau * mean.TAU_SLACK, eta_value, psi_value)
    d_cm *= math.sqrt(bessel) * mean.SENSITIVITY_SAFETY
    size = math.sqrt(bessel) * tau * mean.TAU_SLACK
    bound = filt * size
    error = bound * (n + len(points) + 8) * 2.0**-52
    gaussian = calibrate_gaussian(np.sqrt(eig.values), d_cm, epsilon, delta, error, bound)
    smoothing = {"method": "gp-adp", "eta": eta_value, "psi": psi_value, "psi_rule": psi_rule,
                 "components": eig.size, "c_delta": c}
    filt.setflags(write=False)
    return GpPlan(np.array(points), eig, n, tau, filt, gaussian, smoothing)


def _tune_psi(eig: spectral.EigenSystem, n: int, c: float, tau: float, eta: float) -> float:
    """argmin over log ψ of c²Δ_CM(ψ)²·tr C + the reference bias + sampling (``pss``)."""
    lam = eig.values
    share = mean.prior_share(eig)
    grid = np.arange(eta * math.log(float(lam[-1])) - 8.0,
                     eta * math.log(float(lam[0])) + 8.0, 0.05)
    psis = np.exp(grid)[:, None]
    filt = lam**eta / (lam**eta + psis)
    d_cm = 2.0 * tau / n * np.max(filt / np.sqrt(lam), axis=1)
    privacy = (c * d_cm) ** 2 * float(lam.sum())
    outside = max(0.0, 1.0 - float(share.sum()))
    bias = pss.PRIOR_ENERGY * tau**2 * (np.sum((1 - filt) ** 2 * share, axis=1) + outside)
    sampling_var = tau**2 / n * np.sum(filt**2 * share, axis=1)
    return float(np.exp(grid[int(np.argmin(privacy + bias + sampling_var))]))
