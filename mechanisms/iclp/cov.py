"""Covariance function of a functional column with ICLP-QR noise (spec §3.5, App. C.1).

One smoother F_j = λ_j^η/(λ_j^η + ψ) on one eigen-system (v_j, λ_j) of the noise kernel
acts on both moments, so the covariance is that of the smoothed curves Fξ_i
(ξ_ij = ⟨X_i, v_j⟩), never a difference of differently smoothed quantities:

    Ĝ_jk = F_jF_k·(1/n)Σ_i ξ_ij ξ_ik  (j <= k: the second moment, symmetric),
    m̂_j = F_j·(1/n)Σ_i ξ_ij            (the mean).

Both get the matched ICLP noise (covariance the smoother itself, ``pss.noise_shape``):
shapes √(F_jF_k) on the upper triangle and √F_j, whose weighted-ℓ1 sensitivities are

    Δ₂ = (τ²/n)·(Σ_j F_j + max_j F_j),   Δ₁ = (2τ/n)·(Σ_j F_j)^{1/2}

because per row Σ_{j<=k} √(F_jF_k)|ξ_jξ_k| = ((Σ_j √F_j|ξ_j|)² + Σ_j F_jξ_j²)/2
<= (Σ_j F_j + max_j F_j)·‖ξ‖²/2 and ‖ξ‖² <= τ² (times the computed basis' Bessel
factor); releasing the upper triangle only halves the noise of the symmetric matrix
against noising all J² entries and averaging. Centring needs the mean, a release of its
own: ε = ε_mean + ε_second (default ε_mean = ε/4). The covariance coefficients
G̃ − m̃m̃ᵀ + diag(Var m̃) (the last term removes the mean noise's own square, a public
constant) on grid × grid are post-processing; their expectation is F∘Ĉ∘F, Ĉ the
covariance of the clipped curves' coefficients.

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


def second_moment_sensitivity(filt: ArrayLike, n: int, tau: float) -> float:
    """Δ₂ = (τ²/n)·(Σ_j F_j + max_j F_j): the weighted-ℓ1 sensitivity (shapes √(F_jF_k))
    of the upper triangle (j <= k) of the smoothed second moment F∘(1/n)Σ ξξᵀ∘F in exact
    arithmetic, orthonormal basis."""
    f = np.asarray(filt, dtype=np.float64)
    return tau * tau / n * math.fsum([*f.tolist(), float(f.max())])


def mean_sensitivity(filt: ArrayLike, n: int, tau: float) -> float:
    """Δ₁ = (2τ/n)·(Σ_j F_j)^{1/2}: the smoothed mean's, shapes √F_j (matched noise)."""
    return 2.0 * tau / n * math.sqrt(math.fsum(np.asarray(filt, dtype=np.float64).tolist()))


def privacy_mse(filt: ArrayLike, n: int, tau: float, epsilon_second: float,
                epsilon_mean: float | None) -> float:
    """The continuous-Laplace approximation of the stated error (``CovPlan.accuracy``) at
    Bessel factor 1: Σ_jk 2Δ₂²F_jF_k/ε₂² for the second moment (each off-diagonal noise
    counted twice in the symmetric matrix), and, when centred, the mean
    noise's 2‖m̂‖²·ΣVar m̃_j with ‖m̂‖ <= max F·τ and Var m̃_j = 2Δ₁²F_j/ε₁² (for
    choosing ψ)."""
    total = math.fsum(np.asarray(filt, dtype=np.float64).tolist())
    shrunk = float(np.max(np.asarray(filt, dtype=np.float64))) * tau
    second = 2.0 * second_moment_sensitivity(filt, n, tau) ** 2 * total**2 / epsilon_second**2
    if epsilon_mean is None:
        return second
    return second + 2.0 * shrunk**2 * 2.0 * mean_sensitivity(filt, n, tau) ** 2 * total / (
        epsilon_mean**2)


#: the reference spread of the covariance default: curves whose deviations from their mean
#: are a Gaussian process with the mean's reference covariance (``mean.prior_share``) and
#: RMS norm τ/4 (E‖X − μ‖² = τ²/16). Larger references switch from the heavily shrunk
#: release to a noisy one at smaller ε, which raised the error on curves of spread τ²/100
#: (n = 500: 0.0025 -> 0.0034 from ε = 1/8 to 4 at τ²/10); smaller ones shrink curves of
#: spread τ²/4 too much (n = 5000, ε = 2: RMS error 0.48 of the covariance's norm here)
COV_REFERENCE_ENERGY = 0.0625


def reference_risk(filt: ArrayLike, share: ArrayLike, n: int, privacy: float
                   ) -> dict[str, float]:
    """Predicted E‖released − G‖²_HS at τ = 1 for the reference covariance G (every term
    scales as τ⁴): public inputs only.

    G = s²·Σ_j p_j v_j⊗v_j (s² = ``COV_REFERENCE_ENERGY``, p the reference share), so the
    one-smoother target F∘G∘F misses (1 − F_j²)·s²p_j on the diagonal: bias
    s⁴·(Σ_j (1 − F_j²)²p_j² + (1 − Σ_j p_j)²) (the energy outside the retained components
    as one more direction); sampling, Gaussian curves: Var Ĝ_jk = (G_jjG_kk + δ_jkG_jj²)/n,
    so s⁴·((Σ_j F_j²p_j)² + Σ_j F_j⁴p_j²)/n; privacy: the plan's (``privacy_mse``).
    """
    f = np.asarray(filt, dtype=np.float64)
    p = np.asarray(share, dtype=np.float64)[: f.size]
    s4 = COV_REFERENCE_ENERGY**2
    outside = max(0.0, 1.0 - float(p.sum()))
    bias = s4 * (float(np.sum((1.0 - f**2) ** 2 * p**2)) + outside**2)
    sampling = s4 * (float(np.sum(f**2 * p)) ** 2 + float(np.sum(f**4 * p**2))) / n
    return {"privacy": privacy, "bias": bias, "sampling": sampling,
            "total": privacy + bias + sampling}


@dataclass(frozen=True, eq=False)
class CovPlan:
    """A calibrated covariance release (mean plan + second-moment calibration)."""

    grid: NDArray[np.float64]
    eig: spectral.EigenSystem
    n: int
    tau: float
    filter: NDArray[np.float64]  # F_j, J: the one smoother of both moments
    second: noise.CoefficientNoise
    mean_plan: mean.MeanPlan | None
    epsilons: dict[str, Fraction]
    smoothing: dict[str, Any]

    @property
    def components(self) -> int:
        return int(self.filter.shape[0])

    @property
    def product_filter(self) -> NDArray[np.float64]:
        """F_jF_k, J × J: the second moment's filter (F ⊗ F)."""
        return np.outer(self.filter, self.filter)

    @property
    def upper(self) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """The released second-moment coefficients (j <= k, row-major)."""
        return np.triu_indices(self.components)

    @property
    def noise(self) -> StackedNoise:
        """Second-moment coefficients (upper triangle, row-major) then the mean's."""
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
        grid (each entry rounded once from its exact sum), its upper triangle row-major;
        then the mean's."""
        check_rows(partial, self.n, "curves")
        m = int(self.grid.size)
        moment = np.zeros((m, m))
        moment[np.triu_indices(m)] = sums.totals(partial, "moment", self.n)
        moment = moment + np.triu(moment, 1).T
        projection = self.eig.weights[:, None] * self.eig.vectors[:, : self.components]
        g = (self.product_filter * (projection.T @ moment @ projection))[self.upper]
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
        size = j * (j + 1) // 2
        g = np.zeros((j, j))
        g[self.upper] = coefficients[:size]
        g = g + np.triu(g, 1).T
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
        m = coefficients[size:]
        # E[m̃m̃ᵀ] = m̂m̂ᵀ + diag(Var m̃): the public variances taken off keep E[c] = F∘Ĉ∘F
        c = g - np.outer(m, m) + np.diag(self.mean_plan.noise.variances())
        mu = self.mean_plan.basis @ m
        cov = basis @ c @ basis.T
        out["values"] = 0.5 * (cov + cov.T)  # symmetric up to rounding: made exact
        out["mean"] = mu
        out["centred"] = True
        return out

    def kernel_info(self) -> dict[str, Any]:
        return {**self.eig.kernel.describe(),
                "domain": [float(self.grid[0]), float(self.grid[-1])],
                "length_units": "fraction of the grid span"}

    def second_moment_mse(self) -> float:
        """E‖G̃ − F∘M̂∘F‖²_HS: the second moment's noise, each off-diagonal coefficient's
        twice (it fills both (j, k) and (k, j))."""
        var = self.second.variances()
        rows, cols = self.upper
        return math.fsum((var * np.where(rows == cols, 1.0, 2.0)).tolist())

    def mean_noise_mse(self) -> float:
        """A bound on E‖m̃m̃ᵀ − diag(Var m̃) − m̂m̂ᵀ‖²_HS over every dataset. With m̃ = m̂ + e
        (independent symmetric e_j, variance v_j, fourth moment κ_j) the terms m̂eᵀ + emᵀ
        and eeᵀ − diag v are uncorrelated: 2‖m̂‖²Σv + 2Σm̂_j²v_j <= 2R²(Σv + max v) with
        ‖m̂‖ <= R = max_j F_j·√bessel·τ (m̂_j = F_j·⟨mean, v_j⟩: the smoother shrinks the
        mean it subtracts), plus Σ_{j≠k} v_jv_k + Σ_j (κ_j − v_j²)."""
        if self.mean_plan is None:
            return 0.0
        nz = self.mean_plan.noise
        v = nz.variances()
        kappa = noise.discrete_laplace_fourth_moment(nz.scales) * nz.steps**4
        radius_sq = (spectral.bessel_factor(self.eig)
                     * (float(np.max(self.filter)) * self.tau * mean.TAU_SLACK) ** 2)
        total = math.fsum(v.tolist())
        linear = 2.0 * radius_sq * (total + float(v.max()))
        quadratic = total**2 - 2.0 * math.fsum((v * v).tolist()) + math.fsum(kappa.tolist())
        return linear + quadratic

    def accuracy(self) -> dict[str, Any]:
        """Expected squared HS (L2 on grid × grid) privacy error of the released surface:
        the second moment's noise plus the mean's (independent, uncorrelated terms)."""
        second = self.second_moment_mse()
        from_mean = self.mean_noise_mse()
        mse = second + from_mean
        what = "covariance" if self.mean_plan is not None else "second moment"
        out: dict[str, Any] = {
            "noise": "ICLP-QR on H x H: discrete Laplace per coefficient of v_j (x) v_k"
                     + ("; the mean's per coefficient of v_j" if self.mean_plan else ""),
            "laplace_scales": "Delta*sqrt(F_j*F_k)/epsilon_second (matched to the smoother)",
            "sensitivity": self.second.sensitivity,
            "sensitivity_lattice": self.second.lattice_sensitivity,
            "sensitivity_norm": "weighted_l1_K_CxC",
            "epsilon_split": {k: str(v) for k, v in self.epsilons.items()},
            "expected_sq_l2_error": mse,
            "second_moment_sq_l2_error": second,
            "mean_noise_sq_l2_error": from_mean,
            "rmse": math.sqrt(mse),
            "band95": 1.96 * math.sqrt(mse),
            "smoothing": self.smoothing,
            "truncation": {"components": self.components, "grid_points": int(self.grid.size),
                           "coefficients": self.components**2},
            "norm_bound": self.tau,
            "statement": (
                f"E||released {what} - smoothed {what}||_HS^2 <= {mse:.6g} (mean square over"
                " grid x grid) for every dataset: all the privacy noise, the second moment's"
                f" ({second:.6g}, epsilon_second)"
                + (f" and the mean's ({from_mean:.6g}, epsilon_mean, with the mean's norm at"
                   f" most {self.tau:g})" if self.mean_plan is not None else "")
                + ". The smoothed " + what + " is that of the curves smoothed by one filter"
                " F_j = lambda_j^eta/(lambda_j^eta + psi) for both moments; the smoothing"
                f" bias and the clipping to norm {self.tau:g} are excluded. band95 is 1.96 x"
                " the RMS error (over the surface, not per cell)."
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

    ψ defaults to the minimiser over ``erm.PSI_GRID`` of ``reference_risk`` (privacy: both
    moments' noise at their ε); the mean uses the same eigen-system, η, ψ and filter.
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
    bessel = spectral.bessel_factor(eig)
    tau_eff = tau * mean.TAU_SLACK
    psi_rule = "given" if psi is not None else "min-risk"
    share = mean.prior_share(eig)
    e_second = float(eps_second)
    e_mean = float(eps_mean) if centred else None

    def reference(q: float) -> dict[str, float]:
        """``reference_risk`` at τ = 1 (every term scales as τ⁴: no overflow)."""
        f = mean.qr_filter(lam, eta, q)
        return reference_risk(f, share, n,
                              privacy_mse(f, n, 1.0, e_second, e_mean) * bessel**2)

    if psi is None:
        # ψ for error (issue #32): the worst-case bias ψτ⁴/4 made the error rise with ε
        # (0.28 -> 0.39 from ε = 1/8 to 3/16 at n = 500); the reference risk is
        # a(ψ)/ε² + b(ψ) on the fixed grid ``erm.PSI_GRID``, so its minimum is
        # non-increasing in ε
        psi = min(erm.PSI_GRID, key=lambda q: reference(q)["total"])
    psi = float(psi)
    if not (math.isfinite(psi) and psi > 0):
        raise ValueError("psi must be a finite number > 0")
    filt = mean.qr_filter(lam, eta, psi)
    kept = int(np.count_nonzero(filt > 0))  # F underflows to 0 only at the tail: a prefix
    if kept == 0:
        raise ValueError("psi is so large that every coefficient is shrunk to 0")
    if kept < eig.size:
        eig, filt = mean.prefix(eig, kept), filt[:kept].copy()
    root = np.sqrt(filt)
    delta = (second_moment_sensitivity(filt, n, tau_eff) * bessel * mean.SENSITIVITY_SAFETY)
    # |Ĝ_jk| <= F_jF_k·bessel·τ²; the grid moments are rounded once from exact sums of
    # rounded products (2u), the two M-term projections err by γ_2M·bessel·τ² (Cauchy–
    # Schwarz per curve): well inside the bound kept from the per-row ξ (γ_M, then γ_n)
    size = bessel * tau_eff**2
    upper = np.triu_indices(filt.size)
    bound = np.outer(filt, filt)[upper] * size
    error = bound * (n + 2 * len(points) + 16) * 2.0**-52
    second = noise.calibrate(np.outer(root, root)[upper], delta, eps_second, error, bound)
    smoothing = {"method": "iclp-qr covariance", "eta": eta, "eta_rule": eta_rule, "psi": psi,
                 "psi_rule": psi_rule, "beta": kernel.beta, "components": eig.size,
                 "filter": "F_j = lambda_j^eta/(lambda_j^eta + psi), F (x) F on the second"
                           " moment and F on the mean",
                 "mean_share": str(mean_share) if centred else "0"}
    mean_plan = None
    if centred:
        delta_mean = (mean_sensitivity(filt, n, tau_eff) * math.sqrt(bessel)
                      * mean.SENSITIVITY_SAFETY)
        mean_plan = mean.make_plan(
            "iclp-qr", points, eig, n, tau, filt.copy(), root, delta_mean, eps_mean,
            {**smoothing, "method": "iclp-qr", "noise_profile": "matched",
             "role": "the covariance's mean: the same smoother F"})
    if psi_rule == "min-risk":
        smoothing["risk"] = {
            **{k: v * (tau * tau) * (tau * tau) for k, v in reference(psi).items()},
            "reference_energy": COV_REFERENCE_ENERGY * tau * tau,
            "criterion": (
                "min over psi of the privacy error + s^4*(sum((1-F_j^2)^2 p_j^2)"
                " + outside^2) + s^4*((sum F_j^2 p_j)^2 + sum F_j^4 p_j^2)/n for a reference"
                " covariance s^2*sum p_j v_j (x) v_j, p the share of Matern(1.5, 0.1),"
                f" s^2 = {COV_REFERENCE_ENERGY:g}*tau^2")}
    filt.setflags(write=False)
    epsilons = {"second_moment": eps_second, "mean": eps_mean}
    plan = CovPlan(np.array(points), eig, n, tau, filt, second, mean_plan, epsilons, smoothing)
    try:  # the statement is part of the answer: one too large for a float is refused here
        stated = plan.second_moment_mse() + plan.mean_noise_mse()
    except OverflowError:
        stated = math.inf
    if not math.isfinite(stated):
        raise noise.CalibrationError(
            "epsilon too small: the stated error would exceed the floating-point range")
    return plan
