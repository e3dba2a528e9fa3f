"""The Bernstein mechanism (Aldà & Rubinstein 2017; R ``diffpriv``): density and mean baselines.

``plan_bernstein_mean`` (end of the module) is the same mechanism for the mean
function of a functional column, with a pointwise (sup-norm) bound τ_∞.

The target, a KDE F_D(t) = (1/n) Σ_i φ_h(t − X_i) on the unit domain, is
evaluated on the lattice {0, 1/K, …, 1}; each of the K + 1 values gets
Laplace noise of scale Δ_∞·(K + 1)/ε, where Δ_∞ = sup_t |φ_h(t − x) −
φ_h(t − x')|/n <= φ_h(0)/n is the sup-norm sensitivity (φ_h >= 0), exactly
the ``diffpriv`` calibration ``sensitivity·(latticeK + 1)^dims/epsilon``
(spec §4). The release is the Bernstein polynomial
B(t) = Σ_ν c̃_ν·C(K, ν) t^ν (1 − t)^(K−ν). Records are binned to the output
grid first (per-record, data-independent), and the noise is the same
float-safe lattice Laplace as the ICLP coefficients, with all shapes 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from mechanisms.iclp import domain, noise, pss
from mechanisms.iclp.bands import band_sentence, pointwise_band
from mechanisms.iclp.kde import DEFAULT_GRID_SIZE, bin_values, finish_density
from mechanisms.iclp.kernels import Family, Kernel
from mechanisms.iclp.release import FunctionRelease

DEFAULT_LATTICE = 20
SENSITIVITY_SAFETY = 1.0 + 2.0**-30


def bernstein_basis(order: int, points: ArrayLike) -> NDArray[np.float64]:
    """b_{ν,K}(t) = C(K, ν) t^ν (1 − t)^(K−ν), shape (len(points), K + 1); rows sum to 1."""
    t = np.asarray(points, dtype=np.float64)
    out: NDArray[np.float64] = stats.binom.pmf(np.arange(order + 1)[None, :], order, t[:, None])
    return out


@dataclass(frozen=True, eq=False)
class BernsteinPlan:
    """A calibrated Bernstein density release; built by ``plan_bernstein_kde``."""

    bounds: tuple[float, float]
    kernel: Kernel  # density-normalised, on the unit domain
    n: int
    order: int  # K
    grid_size: int
    weights: NDArray[np.float64]  # output-grid quadrature (1/M)
    design: NDArray[np.float64]  # φ_h(ν/K − t_k), shape (M, K + 1)
    basis: NDArray[np.float64]  # b_{ν,K}(t_k), shape (M, K + 1)
    sup_sensitivity: float  # Δ_∞ = φ_h(0)/n
    noise: noise.CoefficientNoise
    normalize: bool

    @property
    def span(self) -> float:
        return self.bounds[1] - self.bounds[0]

    @property
    def grid(self) -> NDArray[np.float64]:
        return self.bounds[0] + self.span * domain.uniform_grid(self.grid_size)

    def summary(self, values: ArrayLike) -> NDArray[np.float64]:
        """F_D(ν/K), ν = 0..K, of the binned records (unit-domain density)."""
        counts = bin_values(values, self.bounds, self.grid_size)
        if int(counts.sum()) != self.n:
            raise ValueError("values must have n_rows entries")
        out: NDArray[np.float64] = (counts.astype(np.float64) @ self.design) / self.n
        return out

    def release(self, values: ArrayLike, rng: np.random.Generator) -> FunctionRelease:
        coefficients = self.noise.release(self.summary(values), rng)
        raw = (self.basis @ coefficients) / self.span
        out = finish_density(raw, self.weights, self.span) if self.normalize else raw
        return FunctionRelease(
            grid=self.grid,
            values=out,
            coefficients=coefficients,
            kernel=self.kernel_info(),
            smoothing={"method": "bernstein", "lattice_size": self.order},
            extra={
                "lattice": [float(self.bounds[0] + self.span * v / self.order)
                            for v in range(self.order + 1)],
                "postprocessing": "clipped at 0 and renormalised to integrate to 1"
                if self.normalize else "none",
            },
        )

    def kernel_info(self) -> dict[str, Any]:
        return {
            **self.kernel.describe(),
            "bandwidth": self.kernel.rho * self.span,
            "domain": list(self.bounds),
            "length_units": "rho: fraction of the declared range; bandwidth: column units",
        }

    def accuracy(self) -> dict[str, Any]:
        nz = self.noise
        variances = nz.variances()
        # E‖Σ_ν L_ν b_ν‖² = Σ_ν Var_ν ‖b_ν‖² for independent L_ν (quadrature L2, unit domain)
        gram_diag = np.sum(self.basis**2 * self.weights[:, None], axis=0)
        mse = float(np.sum(variances * gram_diag)) / self.span
        band = pointwise_band(self.basis, variances, self.span)
        return {
            "noise": "Bernstein: discrete Laplace per lattice value on power-of-two lattices",
            "laplace_scales": "Delta_inf*(K+1)/epsilon",
            "sensitivity": self.sup_sensitivity,
            "sensitivity_norm": "sup",
            "sensitivity_l1_lattice": nz.lattice_sensitivity,
            "laplace_scale": float(nz.laplace_scales[0]),
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse),
            **band,
            "kernel": self.kernel_info(),
            "smoothing": {"method": "bernstein", "lattice_size": self.order},
            "statement": (
                f"E||released - Bernstein polynomial of the KDE||^2 = {mse:.6g} (integrated"
                " over the column's range, before the optional clipping and renormalisation);"
                " excludes the Bernstein approximation bias."
                + band_sentence(band, "the Bernstein polynomial of the KDE")
            ),
        }


def plan_bernstein_kde(
    bounds: tuple[float, float],
    n: int,
    epsilon: float | Fraction,
    lattice_size: int = DEFAULT_LATTICE,
    grid_size: int = DEFAULT_GRID_SIZE,
    family: Family = "gaussian",
    nu: float | None = None,
    bandwidth: float | None = None,
    normalize: bool = True,
) -> BernsteinPlan:
    """Calibrate the Bernstein mechanism for a KDE on [lo, hi] (bandwidth: fraction of hi − lo)."""
    lo, hi = (float(b) for b in bounds)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError("bounds must be finite with lower < upper")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError("n must be a positive integer")
    if lattice_size < 1 or grid_size < 3:
        raise ValueError("lattice_size must be >= 1 and grid_size >= 3")
    h = pss.kde_bandwidth(n, grid_size) if bandwidth is None else float(bandwidth)
    kernel = Kernel(family, h, nu).density()
    t = domain.uniform_grid(grid_size)
    lattice = np.arange(lattice_size + 1) / lattice_size
    design = kernel(t[:, None], lattice[None, :])
    sup = kernel.scale / n * SENSITIVITY_SAFETY  # φ_h(0)/n
    size = lattice_size + 1
    bound = np.full(size, kernel.scale)
    error = bound * (grid_size + 4) * 2.0**-52
    calibrated = noise.calibrate(np.ones(size), sup * size, epsilon, error, bound)
    return BernsteinPlan(
        bounds=(lo, hi),
        kernel=kernel,
        n=n,
        order=lattice_size,
        grid_size=grid_size,
        weights=np.full(grid_size, 1.0 / grid_size),
        design=design,
        basis=bernstein_basis(lattice_size, t),
        sup_sensitivity=sup,
        noise=calibrated,
        normalize=normalize,
    )


def bernstein_kde(
    values: ArrayLike,
    bounds: tuple[float, float],
    epsilon: float | Fraction,
    rng: np.random.Generator,
    **options: Any,
) -> FunctionRelease:
    """One-call Bernstein density release (notebook convenience)."""
    x = np.asarray(values, dtype=np.float64)
    return plan_bernstein_kde(bounds, x.shape[0], epsilon, **options).release(x, rng)


# --------------------------------------------------------------------------- mean function

#: default Bernstein order K for the mean function (K + 1 lattice values)
DEFAULT_MEAN_LATTICE = 10


@dataclass(frozen=True, eq=False)
class BernsteinMeanPlan:
    """The Bernstein mechanism for a mean function (spec §4); built by
    ``plan_bernstein_mean``.

    Each curve is clipped pointwise to [−τ_∞, τ_∞] (public, per record), the mean
    curve is read at the lattice {0, 1/K, …, 1} of the unit domain by linear
    interpolation of the grid, and each of the K + 1 values gets Laplace noise of
    scale Δ_∞·(K + 1)/ε with Δ_∞ = 2τ_∞/n (the ``diffpriv`` calibration). The
    release is the Bernstein polynomial of the noisy values on the column's grid.
    """

    grid: NDArray[np.float64]  # column grid, original units
    positions: NDArray[np.float64]  # the grid on [0, 1]
    weights: NDArray[np.float64]  # quadrature weights of the grid
    n: int
    sup_bound: float  # τ_∞
    order: int  # K
    interpolation: NDArray[np.float64]  # (M, K + 1): lattice value ν = column ν · curve
    basis: NDArray[np.float64]  # b_{ν,K}(t_k), (M, K + 1)
    sup_sensitivity: float
    noise: noise.CoefficientNoise

    def summary(self, curves: ArrayLike) -> NDArray[np.float64]:
        """F_D(ν/K): the mean of the pointwise-clipped curves at the lattice points."""
        x = np.asarray(curves, dtype=np.float64)
        if x.ndim != 2 or x.shape != (self.n, self.grid.size):
            raise ValueError(f"curves must have shape (n_rows, {self.grid.size}) = "
                             f"({self.n}, {self.grid.size})")
        clipped = np.nan_to_num(np.clip(x, -self.sup_bound, self.sup_bound), nan=0.0)
        out: NDArray[np.float64] = clipped.mean(axis=0) @ self.interpolation
        return out

    def release(self, curves: ArrayLike, rng: np.random.Generator) -> FunctionRelease:
        coefficients = self.noise.release(self.summary(curves), rng)
        return FunctionRelease(
            grid=self.grid,
            values=self.basis @ coefficients,
            coefficients=coefficients,
            kernel={"family": "bernstein", "order": self.order,
                    "domain": [float(self.grid[0]), float(self.grid[-1])]},
            smoothing={"method": "bernstein", "lattice_size": self.order,
                       "sup_bound": self.sup_bound},
            extra={"lattice": [float(self.grid[0] + (self.grid[-1] - self.grid[0]) * v
                                     / self.order) for v in range(self.order + 1)]},
        )

    def accuracy(self) -> dict[str, Any]:
        nz = self.noise
        gram_diag = np.sum(self.basis**2 * self.weights[:, None], axis=0)
        mse = float(np.sum(nz.variances() * gram_diag))
        # the noise is far from uniform over the domain (at an end one lattice value is the
        # whole curve): a band of 1.96 x the domain's RMS covered ~80 % there
        band = pointwise_band(self.basis, nz.variances(), 1.0)
        return {
            "noise": "Bernstein: discrete Laplace per lattice value on power-of-two lattices",
            "laplace_scales": "Delta_inf*(K+1)/epsilon",
            "sensitivity": self.sup_sensitivity,
            "sensitivity_norm": "sup",
            "sensitivity_l1_lattice": nz.lattice_sensitivity,
            "laplace_scale": float(nz.laplace_scales[0]),
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse),
            "smoothing": {"method": "bernstein", "lattice_size": self.order,
                          "sup_bound": self.sup_bound},
            "norm_bound": self.sup_bound,
            **band,
            "statement": (
                f"E||released - Bernstein polynomial of the mean||^2 = {mse:.6g} (RMS over"
                " the domain, curve units); excludes the Bernstein approximation bias and"
                f" the effect of clipping every curve value to [-{self.sup_bound:g},"
                f" {self.sup_bound:g}]."
                + band_sentence(band, "the Bernstein polynomial of the mean", "mean")
            ),
        }


def interpolation_matrix(positions: ArrayLike, points: ArrayLike) -> NDArray[np.float64]:
    """(M, P) matrix L with (f @ L)[p] = the linear interpolant of f (on ``positions``) at
    ``points[p]``; each column has at most two non-negative entries summing to 1."""
    t = np.asarray(positions, dtype=np.float64)
    q = np.asarray(points, dtype=np.float64)
    out = np.zeros((t.size, q.size))
    right = np.clip(np.searchsorted(t, q, side="right"), 1, t.size - 1)
    left = right - 1
    frac = np.clip((q - t[left]) / (t[right] - t[left]), 0.0, 1.0)
    cols = np.arange(q.size)
    out[left, cols] += 1.0 - frac
    out[right, cols] += frac
    return out


def plan_bernstein_mean(
    grid: Sequence[float] | ArrayLike,
    sup_bound: float,
    n: int,
    epsilon: float | Fraction,
    lattice_size: int = DEFAULT_MEAN_LATTICE,
) -> BernsteinMeanPlan:
    """Calibrate the Bernstein mechanism for the mean of curves bounded by τ_∞ pointwise."""
    points, tau_inf = domain.validate_functional_meta(grid, sup_bound)
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError("n must be a positive integer")
    if not (math.isfinite(float(epsilon)) and float(epsilon) > 0):
        raise ValueError("epsilon must be a finite number > 0")
    if lattice_size < 1:
        raise ValueError("lattice_size must be >= 1")
    positions = domain.unit_positions(points)
    lattice = np.arange(lattice_size + 1) / lattice_size
    size = lattice_size + 1
    sup = 2.0 * tau_inf / n * SENSITIVITY_SAFETY
    bound = np.full(size, tau_inf)
    error = bound * (n + 8) * 2.0**-52  # mean of n values in [−τ_∞, τ_∞], then 2 products
    calibrated = noise.calibrate(np.ones(size), sup * size, epsilon, error, bound)
    return BernsteinMeanPlan(
        grid=np.array(points),
        positions=positions,
        weights=domain.quadrature_weights(points),
        n=n,
        sup_bound=tau_inf,
        order=lattice_size,
        interpolation=interpolation_matrix(positions, lattice),
        basis=bernstein_basis(lattice_size, positions),
        sup_sensitivity=sup,
        noise=calibrated,
    )
