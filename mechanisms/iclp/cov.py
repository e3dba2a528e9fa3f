"""Covariance function of a functional column with ICLP-QR noise (spec §3.5, App. C.1).

The second-moment operator (1/n)Σ_i X_i ⊗ X_i is a mean in H ⊗ H, whose ICLP
is C ⊗ C with eigenpairs (λ_jλ_k, v_j ⊗ v_k). Its QR coefficients

    Ĝ_jk = filt_jk·(1/n)Σ_i ξ_ij ξ_ik,  ξ_ij = ⟨X_i, v_j⟩,  filt_jk = (λ_jλ_k)^η/((λ_jλ_k)^η + ψ),

have weighted-ℓ1 sensitivity (shape √(λ_jλ_k)) at most

    Δ = (2τ²/n)·(Σ_jk (λ_jλ_k)^{2η−1}/((λ_jλ_k)^η + ψ)²)^{1/2}

because ‖ξξᵀ‖_F = ‖ξ‖² <= τ² (times the computed basis' Bessel factor).
Centring by the sample mean would change the sensitivity, so the mean is an
``iclp.mean`` release of its own: ε = ε_mean + ε_second (default ε_mean = ε/4),
and the covariance G̃ − μ̃ ⊗ μ̃ on grid × grid, symmetrised, is post-processing.

The output is an M × M surface, so the grid is capped at ``MAX_COV_GRID``
points (M² values; n·M² work for the exact grid moments, bounded from public inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.iclp import domain, erm, mean, noise, pss, spectral, sums
from mechanisms.iclp.kernels import Kernel
from mechanisms.statistics import Partial, check_rows, column_sums, product_sums, whole

#: largest grid of a covariance release (M² output values, J² noisy coefficients)
MAX_COV_GRID = 200
#: default share of ε spent on the mean (the rest on the second moment)
DEFAULT_MEAN_SHARE = Fraction(1, 4)


@dataclass(frozen=True, eq=False)
class StackedNoise:
    """Several CoefficientNoise calibrations acting on one concatenated coefficient vector
    (parts released with their own ε; the privacy loss of the whole is the sum)."""

    parts: tuple[noise.CoefficientNoise, ...]

    @property
    def steps(self) -> NDArray[np.float64]:
        return np.concatenate([p.steps for p in self.parts])

    @property
    def scales(self) -> NDArray[np.float64]:
        return np.concatenate([p.scales for p in self.parts])

    @property
    def laplace_scales(self) -> NDArray[np.float64]:
        return np.concatenate([p.laplace_scales for p in self.parts])

    def split(self, vector: ArrayLike) -> list[NDArray[Any]]:
        v = np.asarray(vector)
        cuts = np.cumsum([p.size for p in self.parts])[:-1]
        return list(np.split(v, cuts, axis=-1))

    def centre(self, coefficients: ArrayLike) -> NDArray[np.int64]:
        return np.concatenate([p.centre(c) for p, c in zip(self.parts, self.split(
            coefficients), strict=True)])

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] = ()) -> NDArray[
        np.int64
    ]:
        return np.concatenate([p.sample(rng, size) for p in self.parts], axis=-1)

    def release(self, coefficients: ArrayLike, rng: np.random.Generator) -> NDArray[
        np.float64
    ]:
        units = self.centre(coefficients) + self.sample(rng)
        return units.astype(np.float64) * self.steps

    def privacy_loss(self, released: ArrayLike, centre_a: ArrayLike, centre_b: ArrayLike
                     ) -> NDArray[np.float64]:
        y = np.asarray(released, dtype=np.float64)
        a = np.asarray(centre_a, dtype=np.float64)
        b = np.asarray(centre_b, dtype=np.float64)
        out: NDArray[np.float64] = ((np.abs(y - b) - np.abs(y - a)) / self.scales).sum(axis=-1)
        return out


def second_moment_sensitivity(eigenvalues: ArrayLike, n: int, tau: float, eta: float,
                              psi: float) -> float:
    """Δ = (2τ²/n)·(Σ_jk (λ_jλ_k)^{2η−1}/((λ_jλ_k)^η + ψ)²)^{1/2} (weighted ℓ1, exact
    arithmetic, orthonormal basis)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    prod = np.outer(lam, lam)
    filt = mean.qr_filter(prod, eta, psi)
    return 2.0 * tau * tau / n * math.sqrt(float(np.sum(filt**2 / prod)))


@dataclass(frozen=True, eq=False)
class CovPlan:
    """A calibrated covariance release (mean plan + second-moment calibration)."""

    grid: NDArray[np.float64]
    eig: spectral.EigenSystem
    n: int
    tau: float
    filter: NDArray[np.float64]  # J × J
    second: noise.CoefficientNoise
    mean_plan: mean.MeanPlan | None
    epsilons: dict[str, Fraction]
    smoothing: dict[str, Any]

    @property
    def components(self) -> int:
        return int(self.filter.shape[0])

    @property
    def noise(self) -> StackedNoise:
        """Second-moment coefficients (row-major J²) then the mean's, one vector."""
        parts = (self.second,) if self.mean_plan is None else (self.second, self.mean_plan.noise)
        return StackedNoise(parts)

    def sizes(self) -> dict[str, int]:
        """The data pass (``sums.PlanPass``): exact sums of the clipped curves' products
        X_k·X_l on the grid (k <= l, row-major upper triangle), and of X_k (centred)."""
        m = int(self.grid.size)
        out = {"moment": m * (m + 1) // 2}
        if self.mean_plan is not None:
            out.update(self.mean_plan.sizes())
        return out

    def widths(self) -> tuple[int | None, ...]:
        return (int(self.grid.size),)

    def reduce(self, *columns: np.ndarray) -> dict[str, list[int]]:
        x = sums.clipped(columns[0], self.eig.weights, self.tau)
        out = {"moment": product_sums(x, x, np.triu_indices(self.grid.size))}
        if self.mean_plan is not None:  # the same clipping (grid, weights and τ)
            out["sums"] = column_sums(x)
        return out

    def statistic(self, column: str) -> sums.PlanPass:
        return sums.PlanPass(self, (column,))

    def coefficients(self, partial: Partial) -> NDArray[np.float64]:
        """Ĝ = filter·(Vᵀ W S W V) with S the second moment of the clipped curves on the
        grid (each entry rounded once from its exact sum), row-major; then the mean's."""
        check_rows(partial, self.n, "curves")
        m = int(self.grid.size)
        moment = np.zeros((m, m))
        moment[np.triu_indices(m)] = sums.totals(partial, "moment", self.n)
        moment = moment + np.triu(moment, 1).T
        projection = self.eig.weights[:, None] * self.eig.vectors[:, : self.components]
        g = (self.filter * (projection.T @ moment @ projection)).ravel()
        if self.mean_plan is None:
            return g
        return np.concatenate([g, self.mean_plan.coefficients(partial)])

    def summary(self, curves: ArrayLike) -> NDArray[np.float64]:
        """Non-private coefficients: Ĝ (row-major) then the mean's (if centred)."""
        x = np.asarray(curves, dtype=np.float64)
        if x.ndim != 2 or x.shape != (self.n, self.grid.size):
            raise ValueError(f"curves must have shape (n_rows, {self.grid.size})")
        return self.coefficients(whole(self.statistic("curves"), {"curves": x}))

    def release(self, curves: ArrayLike, rng: np.random.Generator) -> dict[str, Any]:
        return self.publish(self.summary(curves), rng)

    def publish(self, summary: NDArray[np.float64], rng: np.random.Generator
                ) -> dict[str, Any]:
        """The release of non-private coefficients: noise, then the surfaces."""
        return self.result(self.noise.release(summary, rng))

    def result(self, coefficients: NDArray[np.float64]) -> dict[str, Any]:
        """Post-processing of the noisy coefficients: the surfaces on grid × grid."""
        j = self.components
        g = coefficients[: j * j].reshape(j, j)
        g = 0.5 * (g + g.T)
        basis = self.eig.vectors[:, :j]
        moment = basis @ g @ basis.T
        out: dict[str, Any] = {
            "grid": self.grid,
            "second_moment": moment,
            "coefficients": coefficients,
            "kind": "surface",
            "smoothing": self.smoothing,
            "kernel": self.kernel_info(),
            "basis": {"eigenvalues": self.eig.values[:j]},
        }
        if self.mean_plan is None:
            out["values"] = moment
            out["centred"] = False
            return out
        mu = self.mean_plan.basis @ coefficients[j * j:]
        cov = moment - np.outer(mu, mu)
        out["values"] = 0.5 * (cov + cov.T)
        out["mean"] = mu
        out["centred"] = True
        return out

    def kernel_info(self) -> dict[str, Any]:
        return {**self.eig.kernel.describe(),
                "domain": [float(self.grid[0]), float(self.grid[-1])],
                "length_units": "fraction of the grid span"}

    def accuracy(self) -> dict[str, Any]:
        """Expected squared HS (L2 on grid × grid) error of the second moment's noise after
        the symmetrisation (pairs averaged: (Σ_jk Var_jk + Σ_j Var_jj)/2); the mean's
        statement separately (the centred surface's error is not closed-form)."""
        var = self.second.variances()
        diag = float(np.trace(var.reshape(self.components, self.components)))
        mse = 0.5 * (float(var.sum()) + diag)
        out: dict[str, Any] = {
            "noise": "ICLP-QR on H x H: discrete Laplace per coefficient of v_j (x) v_k",
            "laplace_scales": "Delta*sqrt(lambda_j*lambda_k)/epsilon_second",
            "sensitivity": self.second.sensitivity,
            "sensitivity_lattice": self.second.lattice_sensitivity,
            "sensitivity_norm": "weighted_l1_K_CxC",
            "epsilon_split": {k: str(v) for k, v in self.epsilons.items()},
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse),
            "band95": 1.96 * math.sqrt(mse),
            "smoothing": self.smoothing,
            "truncation": {"components": self.components, "grid_points": int(self.grid.size),
                           "coefficients": self.components**2},
            "norm_bound": self.tau,
            "statement": (
                f"E||released second moment - smoothed second moment||_HS^2 = {mse:.6g}"
                " (mean square over grid x grid), the privacy error of the second moment only;"
                " the covariance subtracts the separately released mean's outer product"
                " (see mean_accuracy), and the smoothing bias and the clipping to norm"
                f" {self.tau:g} are excluded. band95 is 1.96 x the RMS error."
            ),
        }
        if self.mean_plan is not None:
            out["mean_accuracy"] = self.mean_plan.accuracy()
        return out


def plan_iclp_cov(
    grid: ArrayLike,
    tau: float,
    n: int,
    epsilon: float | Fraction,
    kernel: Kernel = mean.DEFAULT_KERNEL,
    eta: float | None = None,
    psi: float | None = None,
    max_components: int | None = None,
    centred: bool = True,
    mean_share: Fraction = DEFAULT_MEAN_SHARE,
) -> CovPlan:
    """Calibrate a covariance release; ε = ε_mean + ε_second with ε_mean = share·ε exactly.

    ψ defaults to ``erm.proxy_psi`` with R = τ² at ε_second; the mean uses
    ``iclp.mean``'s defaults at ε_mean.
    """
    points, tau = domain.validate_functional_meta(grid, tau)
    if len(points) > MAX_COV_GRID:
        raise ValueError(f"covariance releases support grids of at most {MAX_COV_GRID} points")
    eps = Fraction(epsilon)
    if not eps > 0:
        raise ValueError("epsilon must be > 0")
    if not 0 < mean_share < 1:
        raise ValueError("mean_share must be strictly between 0 and 1")
    eps_mean = eps * mean_share if centred else Fraction(0)
    eps_second = eps - eps_mean
    eta_rule = "given" if eta is not None else "auto"
    eta = pss.default_eta(kernel) if eta is None else float(eta)
    if not (math.isfinite(eta) and eta > 0.5):
        raise ValueError("eta must be > 1/2")
    eig = spectral.eigen_system(kernel, domain.unit_positions(points),
                                domain.quadrature_weights(points), spectral.REL_FLOOR,
                                max_components)
    lam = eig.values
    prod = np.outer(lam, lam)
    bessel = spectral.bessel_factor(eig)
    tau_eff = tau * mean.TAU_SLACK
    psi_rule = "given" if psi is not None else "min privacy MSE + psi*tau^4/4"
    if psi is None:
        # both terms scale as τ⁴: minimise at τ = 1 (no overflow for huge declared τ)
        trace, e2 = float(prod.sum()), float(eps_second) ** 2
        psi = erm.proxy_psi(lambda p: 2.0 * (second_moment_sensitivity(
            lam, n, 1.0, eta, p) * bessel) ** 2 * trace / e2, 1.0)
    psi = float(psi)
    if not (math.isfinite(psi) and psi > 0):
        raise ValueError("psi must be a finite number > 0")
    filt = mean.qr_filter(prod, eta, psi)
    delta = (second_moment_sensitivity(lam, n, tau_eff, eta, psi) * bessel
             * mean.SENSITIVITY_SAFETY)
    # |Ĝ_jk| <= filt·bessel·τ²; the grid moments are rounded once from exact sums of
    # rounded products (2u), the two M-term projections err by γ_2M·bessel·τ² (Cauchy–
    # Schwarz per curve): well inside the bound kept from the per-row ξ (γ_M, then γ_n)
    size = bessel * tau_eff**2
    bound = (filt * size).ravel()
    error = bound * (n + 2 * len(points) + 16) * 2.0**-52
    second = noise.calibrate(np.sqrt(prod).ravel(), delta, eps_second, error, bound)
    mean_plan = (mean.plan_iclp_mean(points, tau, n, eps_mean, kernel)
                 if centred else None)
    filt.setflags(write=False)
    smoothing = {"method": "iclp-qr covariance", "eta": eta, "eta_rule": eta_rule, "psi": psi,
                 "psi_rule": psi_rule, "beta": kernel.beta, "components": eig.size,
                 "mean_share": str(mean_share) if centred else "0"}
    epsilons = {"second_moment": eps_second, "mean": eps_mean}
    return CovPlan(np.array(points), eig, n, tau, filt, second, mean_plan, epsilons, smoothing)
