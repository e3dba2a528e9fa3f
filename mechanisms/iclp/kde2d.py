"""2-D kernel density with ICLP-QR noise (spec §3.3 with d = 2) on a product grid.

The base kernel is the *product* exponential density kernel
C_h((s, t), (s', t')) = c_h(s − s')·c_h(t − t'), c_h(r) = e^{−|r|/h}/(2h) on each
declared range rescaled to [0, 1] (the paper's d = 2 kernel is the isotropic
exponential; the product form is its separable Matérn-1/2 analogue, chosen
because its eigen-system is the Kronecker product of two cached 1-D systems:
an isotropic 50 × 50 grid would need a dense 2,500² eigendecomposition, spec
§7.12). With (λ_a, v_a) and (λ_b, v_b) the axes' systems, the eigenpairs
are (λ_aλ_b, v_a ⊗ v_b); records are binned to the nearest grid cell, and

    ĉ_ab = (λ_aλ_b)^η·(1/n)Σ_i v_a(s_i) v_b(t_i),
    Δ   = (2/n)·max_k Σ_a λ_a^{η−½}|v_a(s_k)| · max_l Σ_b λ_b^{η−½}|v_b(t_l)|

(the triangle bound of §7.11, which factorises over the axes). Released
values are densities in the product of the columns' units; clipping at 0 and
renormalising is optional post-processing.
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

from mechanisms.iclp import domain, noise, pss, spectral, sums
from mechanisms.iclp.kernels import Kernel
from mechanisms.statistics import Partial, check_rows, whole

DEFAULT_GRID_SIZE = 32
#: m per axis: m² cells, (m·J)² work per release at most
MAX_GRID_SIZE = 64
MIN_GRID_SIZE = 8
SENSITIVITY_SAFETY = 1.0 + 2.0**-30
#: bandwidths tried by the default, in grid spacings per axis (a geometric ladder)
BANDWIDTH_SPACINGS = tuple(0.5 * 2.0 ** (k / 4) for k in range(25))  # 0.5 ... 32
#: η of the estimation kernel C^η tried by the default (β = 2: η > 1.5 is the paper's range)
ETA_CANDIDATES = (1.25, 1.5, 2.0, 3.0)


def _axis(h: float, grid_size: int) -> spectral.EigenSystem:
    return spectral.eigen_system(Kernel("exponential", h).density(),
                                 domain.uniform_grid(grid_size), None, spectral.REL_FLOOR, None)


def _axis_factor(eig: spectral.EigenSystem, eta: float) -> float:
    """max_k Σ_a λ_a^{η−½}|v_a(t_k)|: the 1-D triangle factor of Δ, rounded up."""
    lam = eig.values
    axis = float(np.max(np.abs(eig.vectors) @ (lam**eta / np.sqrt(lam))))
    return axis * (1.0 + (eig.size + 4) * 2.0**-52)


def risk(n: int, epsilon: float, grid_size: int, h: float, eta: float) -> dict[str, float]:
    """Data-free E‖released − p‖² on the unit square for the reference densities p.

    privacy: 2Δ²(tr C)²/ε² (Δ = (2/n)·axis², the plan's); estimation: the binned KDE
    with C_h^η of a product of the references of ``pss.kde_references`` (every pair of
    centres, averaged): ‖p − E f̂‖² + Σ_ab (λ_aλ_b)^{2η} Var(v_a(S)v_b(T))/n, which
    factorise over the axes (E f̂ = g⊗g' with g = Σ_a λ_a^η E v_a(S) v_a).
    """
    eig = _axis(h, grid_size)
    lam, v, w = eig.values, eig.vectors, eig.weights
    delta = 2.0 / n * _axis_factor(eig, eta) ** 2
    privacy = 2.0 * delta**2 * float(np.sum(lam)) ** 2 / epsilon**2
    refs = pss.kde_references(eig.positions, w)  # (R, M) densities on the axis
    mass = refs * w
    first = mass @ v  # E v_a(S), per reference
    second = mass @ v**2
    lam_eta = lam**eta
    fit = (first * lam_eta) @ v.T  # g per reference on the grid
    a = float(np.mean((refs**2) @ w))
    b = float(np.mean((refs * fit) @ w))
    g = float(np.mean((fit**2) @ w))
    bias = a * a - 2.0 * b * b + g * g
    s2 = float(np.mean(second @ lam_eta**2))
    s1 = float(np.mean((first**2) @ lam_eta**2))
    sampling = (s2 * s2 - s1 * s1) / n
    return {"privacy": privacy, "bias": bias, "sampling": sampling,
            "total": privacy + bias + sampling}


@functools.lru_cache(maxsize=64)
def tune(n: int, epsilon: float, grid_size: int, eta: float | None
         ) -> tuple[float, float, dict[str, float]]:
    """(h, η) minimising ``risk`` over ``BANDWIDTH_SPACINGS`` × ``ETA_CANDIDATES`` (η
    fixed when given): public inputs only. The old h = max(0.2·n^(−1/6), 2 spacings) sat
    at its floor on the 32-point grid, so the error stopped falling with n (issue #32).
    The risk is a(h, η)/ε² + b(h, η) on a fixed candidate set, so its minimum is
    non-increasing in ε (a larger ε can use the smaller ε's choice)."""
    spacing = 1.0 / (grid_size - 1)
    best: tuple[float, float, dict[str, float]] | None = None
    for k in BANDWIDTH_SPACINGS:
        for e in ETA_CANDIDATES if eta is None else (eta,):
            r = risk(n, epsilon, grid_size, k * spacing, e)
            if best is None or r["total"] < best[2]["total"]:
                best = (k * spacing, e, r)
    assert best is not None
    return best


@dataclass(frozen=True, eq=False)
class Kde2dPlan:
    """A calibrated 2-D density release; built by ``plan_iclp_kde2d``."""

    bounds: tuple[tuple[float, float], tuple[float, float]]
    axes: tuple[spectral.EigenSystem, spectral.EigenSystem]
    n: int
    eta: float
    filter: NDArray[np.float64]  # (λ_aλ_b)^η, shape (J_a, J_b)
    noise: noise.CoefficientNoise
    normalize: bool
    smoothing: dict[str, Any]

    @property
    def grid_size(self) -> int:
        return int(self.axes[0].positions.size)

    @property
    def grids(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        out = []
        for (lo, hi), eig in zip(self.bounds, self.axes, strict=True):
            out.append(lo + (hi - lo) * eig.positions)
        return out[0], out[1]

    @property
    def area(self) -> float:
        (a, b), (c, d) = self.bounds
        return (b - a) * (d - c)

    def sizes(self) -> dict[str, int]:
        """The data pass (``sums.PlanPass``): records per grid cell, row-major."""
        return {"counts": self.grid_size**2}

    def widths(self) -> tuple[int | None, ...]:
        return (None, None)

    def reduce(self, *columns: np.ndarray) -> dict[str, NDArray[np.int64]]:
        """Records per grid cell (nearest point on each axis; NaN -> the lower bound)."""
        m = self.grid_size
        ix = _bins(columns[0], self.bounds[0], m)
        iy = _bins(columns[1], self.bounds[1], m)
        return {"counts": np.bincount(ix * m + iy, minlength=m * m)}

    def statistic(self, columns: Sequence[str]) -> sums.PlanPass:
        return sums.PlanPass(self, tuple(columns))

    def coefficients(self, partial: Partial) -> NDArray[np.float64]:
        """ĉ_ab = (λ_aλ_b)^η·(V_aᵀ N V_b)_ab/n, row-major, from the cell counts N."""
        check_rows(partial, self.n, "values")
        m = self.grid_size
        counts = partial.vector("counts").reshape(m, m).astype(np.float64)
        va, vb = self.axes[0].vectors, self.axes[1].vectors
        inner = va.T @ counts @ vb / self.n
        out: NDArray[np.float64] = (self.filter * inner).ravel()
        return out

    def counts(self, x: ArrayLike, y: ArrayLike) -> NDArray[np.float64]:
        """Records per grid cell (nearest point on each axis; NaN -> the lower bound)."""
        m = self.grid_size
        return self._pass(x, y).vector("counts").reshape(m, m).astype(np.float64)

    def summary(self, x: ArrayLike, y: ArrayLike) -> NDArray[np.float64]:
        """ĉ_ab = (λ_aλ_b)^η·(V_aᵀ N V_b)_ab/n, row-major."""
        return self.coefficients(self._pass(x, y))

    def _pass(self, x: ArrayLike, y: ArrayLike) -> Partial:
        a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if a.shape != (self.n,) or b.shape != (self.n,):
            raise ValueError("values must have n_rows entries")
        return whole(self.statistic(("x", "y")), {"x": a, "y": b})

    def surface(self, coefficients: NDArray[np.float64]) -> NDArray[np.float64]:
        """Grid values V_a C V_bᵀ of a coefficient matrix, per unit area of the columns."""
        c = coefficients.reshape(self.filter.shape)
        out: NDArray[np.float64] = self.axes[0].vectors @ c @ self.axes[1].vectors.T / self.area
        return out

    def release(self, x: ArrayLike, y: ArrayLike, rng: np.random.Generator) -> dict[str, Any]:
        return self.publish(self.summary(x, y), rng)

    def publish(self, summary: NDArray[np.float64], rng: np.random.Generator
                ) -> dict[str, Any]:
        """The release of non-private coefficients: noise, then the surface they span."""
        coefficients = self.noise.release(summary, rng)
        raw = self.surface(coefficients)
        values = raw
        if self.normalize:
            clipped = np.maximum(raw, 0.0)
            mass = float(np.sum(clipped)) * self.area / raw.size
            values = clipped / mass if mass > 0 else np.full_like(raw, 1.0 / self.area)
        gx, gy = self.grids
        return {
            "grid": gx,
            "grid_y": gy,
            "values": values,
            "coefficients": coefficients,
            "kind": "surface",
            "kernel": self.kernel_info(),
            "smoothing": self.smoothing,
            "postprocessing": ("clipped at 0 and renormalised to integrate to 1"
                               if self.normalize else "none"),
        }

    def kernel_info(self) -> dict[str, Any]:
        k = self.axes[0].kernel
        return {**k.describe(), "product": True,
                "bandwidth": [k.rho * (hi - lo) for lo, hi in self.bounds],
                "domain": [list(b) for b in self.bounds],
                "length_units": "rho: fraction of each declared range; bandwidth: column units"}

    def accuracy(self) -> dict[str, Any]:
        mse = self.noise.expected_sq_error() / self.area
        return {
            "noise": "ICLP-QR: discrete Laplace per coefficient of v_a (x) v_b on power-of-two"
                     " lattices",
            "laplace_scales": "Delta*sqrt(lambda_a*lambda_b)/epsilon",
            "sensitivity": self.noise.sensitivity,
            "sensitivity_lattice": self.noise.lattice_sensitivity,
            "sensitivity_norm": "weighted_l1_K_C",
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse / self.area),
            "band95": 1.96 * math.sqrt(mse / self.area),
            "kernel": self.kernel_info(),
            "smoothing": self.smoothing,
            "truncation": {"components": int(self.filter.size),
                           "grid_points": self.grid_size**2},
            "statement": (
                f"E||released - smoothed 2-D KDE||^2 = {mse:.6g} (integrated over the two"
                " declared ranges, before the optional clipping and renormalisation);"
                " rmse is its root mean square per unit area; excludes the bias of C^eta"
                " and the binning to the grid."
            ),
        }


def _bins(values: ArrayLike, bounds: tuple[float, float], m: int) -> NDArray[np.intp]:
    lo, hi = bounds
    v = np.asarray(values, dtype=np.float64)
    v = np.where(np.isnan(v), lo, v)
    u = (np.clip(v, lo, hi) - lo) * ((m - 1) / (hi - lo))
    out: NDArray[np.intp] = np.clip(np.rint(u).astype(np.intp), 0, m - 1)
    return out


def plan_iclp_kde2d(
    bounds: tuple[tuple[float, float], tuple[float, float]],
    n: int,
    epsilon: float | Fraction,
    grid_size: int = DEFAULT_GRID_SIZE,
    bandwidth: float | None = None,
    eta: float | None = None,
    normalize: bool = True,
) -> Kde2dPlan:
    """Calibrate a 2-D ICLP-QR KDE; ``bandwidth`` is a fraction of each range.

    Defaults: (h, η) from ``tune`` (η given: h alone; h given: η = 1 + 2/β = 2),
    m = 32 points per axis.
    """
    b = tuple((float(lo), float(hi)) for lo, hi in bounds)
    for lo, hi in b:
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError("bounds must be finite with lower < upper")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError("n must be a positive integer")
    if not MIN_GRID_SIZE <= grid_size <= MAX_GRID_SIZE:
        raise ValueError(f"grid_size must be between {MIN_GRID_SIZE} and {MAX_GRID_SIZE}")
    if eta is not None and not (math.isfinite(eta) and eta > 1.0):
        raise ValueError("eta must be > 1 for the KDE (spec §7.2)")
    tuned: dict[str, float] | None = None
    if bandwidth is None:
        h, eta_value, tuned = tune(n, float(epsilon), grid_size,
                                   None if eta is None else float(eta))
        rule = "min-risk"
    else:
        rule, h = "given", float(bandwidth)
        eta_value = pss.default_eta(Kernel("exponential", h)) if eta is None else float(eta)
    eta_rule = "given" if eta is not None else rule if rule == "min-risk" else "auto"
    eta = eta_value
    base = Kernel("exponential", h)
    eig = _axis(h, grid_size)
    lam = eig.values
    filt = np.outer(lam**eta, lam**eta)
    shape = np.sqrt(np.outer(lam, lam)).ravel()
    axis = _axis_factor(eig, eta)  # max_k Σ_a λ_a^{η−½}|v_a(t_k)|, rounded up
    delta = 2.0 / n * axis * axis * SENSITIVITY_SAFETY
    vmax = np.max(np.abs(eig.vectors), axis=0)
    bound = (filt * np.outer(vmax, vmax)).ravel()
    error = bound * (2 * grid_size + 8) * 2.0**-52
    calibrated = noise.calibrate(shape, delta, epsilon, error, bound)
    filt.setflags(write=False)
    smoothing = {"method": "iclp-qr", "eta": eta, "eta_rule": eta_rule,
                 "bandwidth_rule": rule, "estimation_kernel": "C^eta (product exponential)",
                 "beta": base.beta, "components": int(filt.size), "grid_size": grid_size,
                 "bandwidth_fraction": h}
    if tuned is not None:
        smoothing["risk"] = {**tuned, "criterion": (
            "min over (h, eta) of 2*Delta^2*(trC)^2/eps^2 + ||p - E f||^2 + sampling variance"
            " of the binned KDE with C_h^eta, p products of normals of sd"
            f" {pss.KDE_REFERENCE_SD} of each range")}
    return Kde2dPlan((b[0], b[1]), (eig, eig), n, eta, filt, calibrated, normalize, smoothing)
