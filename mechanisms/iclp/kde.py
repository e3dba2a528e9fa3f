"""Kernel density estimation with ICLP-QR (spec §3.3, Thm 16).

The noise kernel is a density-normalised C_h (bandwidth h) on the unit
domain; the estimation kernel is its operator power K = C_h^η (η > 1), which
for the Gaussian is again a Gaussian density of bandwidth √η·h: oversmoothing
puts the estimate inside K_C so pure ε-DP is possible. Records are binned to
the nearest point of an M-point grid (a per-record, data-independent map),
so on the retained eigen-system

    ĉ_j = λ_j^η · (1/n) Σ_i v_j(t_{k_i}),
    Δ   = (1/n) · max_{k,k'} Σ_j λ_j^(η−½) |v_j(t_k) − v_j(t_k')|

is the exact weighted-ℓ1 sensitivity of the discrete problem (replacing one
record moves one unit of mass from one bin to another). Released values are
densities in the column's units; clipping at 0 and renormalising is optional
post-processing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.iclp import domain, noise, pss, spectral, sums
from mechanisms.iclp.bands import band_sentence, pointwise_band
from mechanisms.iclp.kernels import Family, Kernel
from mechanisms.iclp.mean import prefix
from mechanisms.iclp.release import FunctionRelease
from mechanisms.statistics import Partial, check_rows, whole

DEFAULT_GRID_SIZE = 200
#: the exact pairwise maximum costs M²·J; above this it falls back to the triangle bound
EXACT_PAIRWISE_LIMIT = 2 * 10**8
_CHUNK_ELEMENTS = 2**22
SENSITIVITY_SAFETY = 1.0 + 2.0**-30


def bin_values(values: ArrayLike, bounds: tuple[float, float], grid_size: int) -> NDArray[
    np.int64
]:
    """Counts of the records at the nearest of ``grid_size`` equally spaced points.

    Missing values count as the lower bound and everything is clipped to the
    declared bounds (DESIGN §6), so every record lands in exactly one bin.
    """
    lo, hi = bounds
    x = np.asarray(values, dtype=np.float64)
    if np.isnan(x).any():
        x = np.where(np.isnan(x), lo, x)
    u = np.clip(x, lo, hi)  # a fresh array: the in-place steps below never touch the data
    u -= lo
    u *= (grid_size - 1) / (hi - lo)
    np.rint(u, out=u)
    index = u.astype(np.intp)
    np.clip(index, 0, grid_size - 1, out=index)
    return np.bincount(index, minlength=grid_size)


def _pairwise_max(eig: spectral.EigenSystem, eta: float) -> float:
    """max_{k,k'} Σ_j λ_j^(η−½)|v_j(t_k) − v_j(t_k')|, cached: cost and run both need it."""
    return _pairwise_max_cached(eig, float(eta))


@functools.lru_cache(maxsize=spectral.CACHE_SIZE)
def _pairwise_max_cached(eig: spectral.EigenSystem, eta: float) -> float:
    return kde_sensitivity(eig, eig.values**eta / np.sqrt(eig.values), 1)


def kde_sensitivity(eig: spectral.EigenSystem, weights: ArrayLike, n: int) -> float:
    """(1/n)·max_{k,k'} Σ_j weights_j |v_j(t_k) − v_j(t_k')| (or its triangle bound).

    ``weights`` are filter_j/√λ_j = λ_j^(η−½). Exact when M²·J is small enough,
    otherwise (2/n)·max_k Σ_j weights_j |v_j(t_k)| (spec §7.11), also valid.
    """
    v = eig.vectors
    wt = np.asarray(weights, dtype=np.float64)
    m, j = v.shape
    if m * m * j > EXACT_PAIRWISE_LIMIT:
        return 2.0 / n * float(np.max(np.abs(v) @ wt))
    rows = max(1, _CHUNK_ELEMENTS // (m * j))  # bounded memory per block
    best = 0.0
    for start in range(0, m, rows):
        block = v[start : start + rows]
        diff = np.abs(block[:, None, :] - v[None, :, :]) @ wt
        best = max(best, float(diff.max()))
    return best / n


@dataclass(frozen=True, eq=False)
class KdePlan:
    """A calibrated ICLP-QR density release; built by ``plan_iclp_kde``."""

    bounds: tuple[float, float]
    eig: spectral.EigenSystem
    n: int
    eta: float
    filter: NDArray[np.float64]  # λ_j^η
    noise: noise.CoefficientNoise
    normalize: bool
    smoothing: dict[str, Any]

    @property
    def grid_size(self) -> int:
        return int(self.eig.positions.size)

    @property
    def grid(self) -> NDArray[np.float64]:
        lo, hi = self.bounds
        return lo + (hi - lo) * self.eig.positions

    @property
    def span(self) -> float:
        return self.bounds[1] - self.bounds[0]

    def sizes(self) -> dict[str, int]:
        """The data pass (``sums.PlanPass``): records per grid point."""
        return {"counts": self.grid_size}

    def widths(self) -> tuple[int | None, ...]:
        return (None,)

    def reduce(self, *columns: np.ndarray) -> dict[str, NDArray[np.int64]]:
        return {"counts": bin_values(columns[0], self.bounds, self.grid_size)}

    def statistic(self, column: str) -> sums.PlanPass:
        return sums.PlanPass(self, (column,))

    def coefficients(self, partial: Partial) -> NDArray[np.float64]:
        """ĉ_j = λ_j^η·(1/n)·Σ_k count_k v_j(t_k) (unit domain) from the counts."""
        check_rows(partial, self.n, "values")
        counts = partial.vector("counts")
        out: NDArray[np.float64] = self.filter * (
            (counts.astype(np.float64) @ self.eig.vectors) / self.n
        )
        return out

    def summary(self, values: ArrayLike) -> NDArray[np.float64]:
        """Non-private coefficients ĉ_j = λ_j^η·(1/n)·Σ_k count_k v_j(t_k) (unit domain)."""
        x = np.asarray(values, dtype=np.float64)
        if x.shape != (self.n,):
            raise ValueError("values must have n_rows entries")
        return self.coefficients(whole(self.statistic("values"), {"values": x}))

    def release(self, values: ArrayLike, rng: np.random.Generator) -> FunctionRelease:
        return self.publish(self.summary(values), rng)

    def publish(self, summary: NDArray[np.float64], rng: np.random.Generator
                ) -> FunctionRelease:
        """The release of non-private coefficients: noise, then the density they span."""
        coefficients = self.noise.release(summary, rng)
        raw = self.eig.synthesize(coefficients) / self.span  # density per column unit
        out = finish_density(raw, self.eig.weights, self.span) if self.normalize else raw
        return FunctionRelease(
            grid=self.grid,
            values=out,
            coefficients=coefficients,
            kernel=self.kernel_info(),
            smoothing=self.smoothing,
            extra={
                "basis": {"eigenvalues": self.eig.values},
                "postprocessing": _postprocessing(self.normalize),
            },
        )

    def kernel_info(self) -> dict[str, Any]:
        k = self.eig.kernel
        return {
            **k.describe(),
            "bandwidth": k.rho * self.span,
            "domain": list(self.bounds),
            "length_units": "rho: fraction of the declared range; bandwidth: column units",
        }

    def accuracy(self) -> dict[str, Any]:
        nz = self.noise
        mse = nz.expected_sq_error() / self.span  # L2 over the column's units
        frl = self.smoothing.get("method") == "frl"
        band = pointwise_band(self.eig.vectors, nz.variances(), self.span)
        return {
            "noise": f"{'FRL' if frl else 'ICLP-QR'}: discrete Laplace per eigen-coefficient"
                     " on power-of-two lattices",
            "laplace_scales": "Delta/epsilon" if frl else "Delta*sqrt(lambda_j)/epsilon",
            "sensitivity": nz.sensitivity,
            "sensitivity_lattice": nz.lattice_sensitivity,
            "sensitivity_norm": "l1" if frl else "weighted_l1_K_C",
            "sigma": nz.sigma,
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse),
            **band,
            "kernel": self.kernel_info(),
            "smoothing": self.smoothing,
            "truncation": {
                "components": self.eig.size,
                "grid_points": self.grid_size,
                "dropped": self.eig.dropped,
                "rel_floor": self.eig.rel_floor,
            },
            "statement": (
                f"E||released - smoothed KDE||^2 = {mse:.6g} (integrated over the column's"
                " range, before the optional clipping and renormalisation, which only"
                " reduce it for a density); excludes the bias of the estimation kernel"
                + (" C truncated to its first M eigenfunctions" if frl else " C^eta")
                + " and the binning to the grid." + band_sentence(band)
            ),
        }


def plan_iclp_kde(
    bounds: tuple[float, float],
    n: int,
    epsilon: float | Fraction,
    grid_size: int = DEFAULT_GRID_SIZE,
    family: Family = "gaussian",
    nu: float | None = None,
    bandwidth: float | None = None,
    eta: float | None = None,
    normalize: bool = True,
    rel_floor: float = spectral.REL_FLOOR,
) -> KdePlan:
    """Calibrate an ICLP-QR KDE on [lo, hi]; ``bandwidth`` is a fraction of hi − lo.

    Defaults: Gaussian kernel with (h, η) chosen by ``_tune`` (data-free risk, needs
    both left open); otherwise h = max(0.2·n^(−1/5), 2 grid spacings) and η = 1 + 2/β
    (1.5 for the Gaussian). M = 200 grid points.
    """
    lo, hi = (float(b) for b in bounds)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError("bounds must be finite with lower < upper")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError("n must be a positive integer")
    if grid_size < 3:
        raise ValueError("grid_size must be at least 3")
    risk: dict[str, float] | None = None
    if bandwidth is None and eta is None and family == "gaussian":
        h, eta, risk = _tune(n, float(epsilon), grid_size, rel_floor)
        rule = eta_rule = "min-risk"
    else:
        rule = "given" if bandwidth is not None else "auto"
        h = pss.kde_bandwidth(n, grid_size) if bandwidth is None else float(bandwidth)
        eta_rule = "given" if eta is not None else "auto"
        eta = pss.default_eta(Kernel(family, h, nu)) if eta is None else float(eta)
    base = Kernel(family, h, nu)
    kernel = base.density()
    if not (math.isfinite(eta) and eta > 1.0):
        raise ValueError("eta must be > 1 for the KDE (spec §7.2)")
    eig = spectral.eigen_system(
        kernel, domain.uniform_grid(grid_size), None, rel_floor, None
    )
    filt = eig.values**eta
    root = np.sqrt(eig.values)
    delta = _pairwise_max(eig, eta) / n * SENSITIVITY_SAFETY
    vmax = np.max(np.abs(eig.vectors), axis=0)
    bound = filt * vmax
    error = bound * (grid_size + 4) * 2.0**-52
    calibrated = noise.calibrate(root, delta, epsilon, error, bound)
    smoothing = {
        "method": "iclp-qr",
        "eta": eta,
        "eta_rule": eta_rule,
        "bandwidth_rule": rule,
        "estimation_kernel": "C^eta (Gaussian: bandwidth sqrt(eta)*h)",
        "beta": base.beta,
        "components": eig.size,
        "grid_size": grid_size,
        "bandwidth_fraction": h,
    }
    if risk is not None:
        smoothing["risk"] = {**risk, "criterion": (
            "min over (h, eta) of 2*Delta^2*trC/eps^2 + AMISE of the Gaussian KDE of"
            f" bandwidth sqrt(eta)*h for a normal reference of sd {pss.KDE_REFERENCE_SD}"
            " of the range")}
    filt.setflags(write=False)
    return KdePlan((lo, hi), eig, n, eta, filt, calibrated, normalize, smoothing)


@functools.lru_cache(maxsize=64)
def _tune(n: int, epsilon: float, grid_size: int, rel_floor: float
          ) -> tuple[float, float, dict[str, float]]:
    """(h, η) minimising the exact privacy MSE 2Δ²·tr C/ε² plus the reference AMISE.

    The default h = 0.2·n^(−1/5) and η = 1.5 ignore ε: the privacy error swamps
    the estimate at small n·ε², and the oversmoothing (bandwidth √η·h) leaves a
    bias floor at large n·ε² (FRL's truncated plain KDE beat it, issue 16). For
    the Gaussian, C_h^η is a Gaussian density kernel of bandwidth √η·h, so its
    AMISE is closed-form; the reference density (a normal of sd 0.1 of the range,
    rougher than the normal-reference rule's ≈ 0.19) is public, as are n and ε.
    """
    base_h = kde_bandwidth_default(n, grid_size)
    floor = pss.MIN_BANDWIDTH_SPACINGS / (grid_size - 1)
    best: tuple[float, float, dict[str, float]] | None = None
    for factor in pss.KDE_BANDWIDTH_FACTORS:
        h = base_h * factor
        if h < floor:
            continue
        eig = spectral.eigen_system(Kernel("gaussian", h).density(),
                                    domain.uniform_grid(grid_size), None, rel_floor, None)
        for eta in pss.KDE_ETA_CANDIDATES:
            delta = _pairwise_max(eig, eta) / n
            privacy = noise.privacy_mse(delta, epsilon, eig.values)
            estimation = pss.kde_amise(n, math.sqrt(eta) * h)
            total = privacy + estimation
            if best is None or total < best[2]["total"]:
                best = (h, eta, {"privacy": privacy, "estimation_amise": estimation,
                                 "total": total})
    assert best is not None
    return best


def kde_bandwidth_default(n: int, grid_size: int) -> float:
    """The PSS bandwidth the tuning scales (``pss.kde_bandwidth``)."""
    return pss.kde_bandwidth(n, grid_size)


def plan_frl_kde(
    bounds: tuple[float, float],
    n: int,
    epsilon: float | Fraction,
    grid_size: int = DEFAULT_GRID_SIZE,
    family: Family = "gaussian",
    nu: float | None = None,
    bandwidth: float | None = None,
    components: int | None = None,
    normalize: bool = True,
    rel_floor: float = spectral.REL_FLOOR,
) -> KdePlan:
    """Calibrate an FRL density release (the paper's FRL for densities, spec §4).

    The summary is the plain KDE with the base kernel C_h, truncated to its first M
    eigenfunctions: ĉ_j = λ_j·(1/n)Σ_i v_j(t_{k_i}), j <= M, with i.i.d. Laplace
    noise of scale Δ₁/ε and the exact ℓ1 sensitivity
    Δ₁ = (1/n)·max_{k,k'} Σ_{j<=M} λ_j|v_j(t_k) − v_j(t_k')| (moving one record).
    M defaults to the minimiser of a data-free risk (``_frl_components``; the paper picks
    M by a non-private PCV, the mean's ⌊√n·ε⌋ made the error rise with ε, issue #32);
    h as for ``plan_iclp_kde``.
    """
    lo, hi = (float(b) for b in bounds)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError("bounds must be finite with lower < upper")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError("n must be a positive integer")
    if grid_size < 3:
        raise ValueError("grid_size must be at least 3")
    rule = "given" if bandwidth is not None else "auto"
    h = pss.kde_bandwidth(n, grid_size) if bandwidth is None else float(bandwidth)
    kernel = Kernel(family, h, nu).density()
    full = spectral.eigen_system(kernel, domain.uniform_grid(grid_size), None, rel_floor, None)
    m_rule = "given" if components is not None else "auto"
    m = _frl_components(full, n, float(epsilon)) if components is None else components
    if not 1 <= m <= full.size:
        raise ValueError(f"components must be between 1 and {full.size} (the retained"
                         " eigenfunctions of the density kernel on this grid)")
    eig = prefix(full, m)
    filt = eig.values.copy()
    delta = _frl_sensitivity(eig) / n * SENSITIVITY_SAFETY
    vmax = np.max(np.abs(eig.vectors), axis=0)
    bound = filt * vmax
    error = bound * (grid_size + 4) * 2.0**-52
    calibrated = noise.calibrate(np.ones(m), delta, epsilon, error, bound)
    smoothing = {
        "method": "frl",
        "eta": 1.0,
        "bandwidth_rule": rule,
        "estimation_kernel": "C truncated to its first M eigenfunctions",
        "components": m,
        "components_rule": m_rule,
        "grid_size": grid_size,
    }
    filt.setflags(write=False)
    return KdePlan((lo, hi), eig, n, 1.0, filt, calibrated, normalize, smoothing)


@functools.lru_cache(maxsize=64)
def _frl_components(full: spectral.EigenSystem, n: int, epsilon: float) -> int:
    """FRL's default M: argmin over M of 2MΔ₁(M)²/ε² + the mean over the reference
    densities p of ‖p − Σ_{j<=M} c_j v_j‖² + Σ_{j<=M} λ_j²·Var v_j(X)/n (c_j = λ_j·E v_j(X)):
    the exact privacy error, the truncated KDE's bias and its sampling variance, public
    inputs only. The references are normals of sd ``pss.KDE_REFERENCE_SD`` centred at
    ``pss.KDE_REFERENCE_CENTRES``.

    Δ₁(M) grows with M and does not depend on ε, so the minimiser is non-decreasing in ε
    and the minimum is non-increasing (a larger ε can use the smaller ε's M).
    """
    w = full.weights
    refs = pss.kde_references(full.positions, w)
    mass = refs * w  # P(X bins to t_k), one row per reference
    first = mass @ full.vectors  # E v_j(X)
    coef = full.values * first
    var = full.values**2 * (mass @ full.vectors**2 - first**2)
    best, best_m = math.inf, 1
    for m in range(1, full.size + 1):
        privacy = 2.0 * m * (_frl_sensitivity(prefix(full, m)) / n) ** 2 / epsilon**2
        fit = coef[:, :m] @ full.vectors[:, :m].T
        bias = float(np.mean(((refs - fit) ** 2) @ w))
        sampling = float(np.mean(var[:, :m].sum(axis=1))) / n
        total = privacy + bias + sampling
        if total < best:
            best, best_m = total, m
    return best_m


@functools.lru_cache(maxsize=spectral.CACHE_SIZE)
def _frl_sensitivity(eig: spectral.EigenSystem) -> float:
    return kde_sensitivity(eig, eig.values, 1)


def iclp_kde(
    values: ArrayLike,
    bounds: tuple[float, float],
    epsilon: float | Fraction,
    rng: np.random.Generator,
    **options: Any,
) -> FunctionRelease:
    """One-call ICLP-QR density release (notebook convenience)."""
    x = np.asarray(values, dtype=np.float64)
    return plan_iclp_kde(bounds, x.shape[0], epsilon, **options).release(x, rng)


def finish_density(
    values: NDArray[np.float64], weights: NDArray[np.float64], span: float
) -> NDArray[np.float64]:
    """Clip at 0 and renormalise to integrate to 1 (post-processing; uniform if no mass)."""
    clipped = np.maximum(values, 0.0)
    mass = float(np.sum(clipped * weights)) * span
    if not mass > 0:
        return np.full_like(values, 1.0 / span)
    out: NDArray[np.float64] = clipped / mass
    return out


def _postprocessing(normalize: bool) -> str:
    return "clipped at 0 and renormalised to integrate to 1" if normalize else "none"
