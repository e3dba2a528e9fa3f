"""Function-on-scalar regression with ICLP noise (spec §3.6, App. C.2).

Model Y_i(t) = Σ_k x_ik β_k(t) + e_i(t) with p bounded scalar covariates
(optionally an intercept column of ones). OLS is β̂ = G⁻¹S with
G = (1/n)Σ_i x_i x_iᵀ (p × p) and S = (1/n)Σ_i x_i Y_i ∈ H^p. The release
spends ε = ε₁ + ε₂ (default ε₁ = ε/4, exact Fractions):

* ε₁: G's p(p+1)/2 upper-triangle entries with float-safe lattice Laplace
  noise (``noise.calibrate`` with unit shape, the FRL core; never numpy's float
  Laplace). ℓ1 sensitivity Σ_{j<=k} range(x_j x_k)/n, where range is max − min
  of the product over the declared box (0 for the intercept's 1·1).
* ε₂: the p mean functions S_k = (1/n)Σ_i x_ik Y_i with the ICLP-QR mean
  machinery on one stacked coefficient vector (p·J entries, shapes √λ_j): the
  weighted-ℓ1 sensitivity is *summed over the components*,
  Δ₂ = Σ_k Δ_QR(c_k τ) = Δ_QR(τ)·Σ_k c_k with c_k = max|x_k| over its bounds,
  since ‖x_ik Y_i − x'_ik Y'_i‖ <= 2c_kτ after clipping Y to τ.

Post-processing: G̃ symmetrised, projected to the positive-definite cone
with eigenvalues floored at the Laplace scale of its entries, and
β̃ = G̃⁻¹S̃: p released functions on the response's grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.iclp import cov, domain, erm, mean, noise, pss, spectral, sums
from mechanisms.iclp.kernels import Kernel
from mechanisms.statistics import Partial, check_rows, product_sums, whole

DEFAULT_GRAM_SHARE = Fraction(1, 4)
MAX_COVARIATES = 10
_U = 2.0**-53


def product_range(a: tuple[float, float], b: tuple[float, float], same: bool) -> float:
    """max − min of x·y over x ∈ a, y ∈ b (x = y when ``same``: the square's range)."""
    if same:
        lo, hi = a
        top = max(lo * lo, hi * hi)
        bottom = 0.0 if lo <= 0.0 <= hi else min(lo * lo, hi * hi)
        return top - bottom
    corners = [x * y for x in a for y in b]
    return max(corners) - min(corners)


def reference_gram(box: Sequence[tuple[float, float]]) -> NDArray[np.float64]:
    """E x xᵀ for independent covariates uniform on their declared boxes (the intercept's
    box is [1, 1]): the design of the default's reference, from public bounds only."""
    mid = np.array([0.5 * (lo + hi) for lo, hi in box])
    out: NDArray[np.float64] = np.outer(mid, mid)
    np.fill_diagonal(out, [(lo * lo + lo * hi + hi * hi) / 3.0 for lo, hi in box])
    return out


def reference_risk(eig: spectral.EigenSystem, share: ArrayLike, box: Sequence[tuple[float, float]],
                   n: int, eta: float, psi: float, s_privacy: float) -> dict[str, float]:
    """Predicted E Σ_k ‖β̃_k − β_k‖² at τ = 1 (every term scales as τ²), public inputs only.

    Reference: the design ``reference_gram`` (G), and coefficient functions β_k whose
    contributions x_kβ_k (|x_k| <= c_k) are the mean's reference class, E‖β_k‖² =
    κ/c_k² (κ = ``pss.PRIOR_ENERGY``, shares p_j). Then β̃ ≈ G⁻¹S̃ and, with the filter
    F_j = λ_j^η/(λ_j^η + ψ): privacy ‖G⁻¹‖²_F·v (v = ``s_privacy``, S̃_k's noise), bias
    Σ_k κ/c_k²·(Σ_j (1 − F_j)²p_j + the energy outside the components), sampling
    tr(G⁻¹)·Σ_j F_j²p_j/n (OLS of curves of spread <= τ²). The Gram's own noise and its
    floor are left out: they are the same for every ψ.
    """
    p = np.asarray(share, dtype=np.float64)
    filt = mean.qr_filter(eig.values, eta, psi)
    scale = np.array([max(abs(lo), abs(hi)) for lo, hi in box])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        inverse = np.linalg.inv(reference_gram(box))
        privacy = float(np.sum(inverse**2)) * s_privacy
        outside = max(0.0, 1.0 - float(p.sum()))
        bias = pss.PRIOR_ENERGY * float(np.sum(scale**-2.0)) * (
            float(np.sum((1.0 - filt) ** 2 * p)) + outside)
        sampling = float(np.trace(inverse)) * float(np.sum(filt**2 * p)) / n
    total = privacy + bias + sampling
    return {"privacy": privacy, "bias": bias, "sampling": sampling,
            "total": total if math.isfinite(total) else math.inf}


@dataclass(frozen=True, eq=False)
class FosPlan:
    """A calibrated function-on-scalar regression; built by ``plan_iclp_fos``."""

    names: tuple[str, ...]  # the p covariates ("(intercept)" first when added)
    bounds: tuple[tuple[float, float], ...]
    grid: NDArray[np.float64]
    eig: spectral.EigenSystem
    n: int
    tau: float
    filter: NDArray[np.float64]  # QR filter of each component, J
    gram_noise: noise.CoefficientNoise
    mean_noise: noise.CoefficientNoise
    epsilons: dict[str, Fraction]
    smoothing: dict[str, Any]

    @property
    def p(self) -> int:
        return len(self.names)

    @property
    def noise(self) -> cov.StackedNoise:
        """G's upper triangle (row-major) then S's p·J coefficients, one vector."""
        return cov.StackedNoise((self.gram_noise, self.mean_noise))

    def design(self, covariates: Sequence[ArrayLike]) -> NDArray[np.float64]:
        """rows × p design: each column clipped to its bounds (NaN -> its lower bound)."""
        given = [np.asarray(v, dtype=np.float64) for v in covariates]
        rows = given[0].shape[0] if given and given[0].ndim == 1 else -1
        if self.names and self.names[0] == "(intercept)":
            given.insert(0, np.ones(max(rows, 0)))
        if len(given) != self.p:
            raise ValueError(f"expected {self.p} covariate columns")
        cols = []
        for (lo, hi), v in zip(self.bounds, given, strict=True):
            if v.shape != (rows,):
                raise ValueError("covariates must have one entry per row")
            cols.append(np.clip(np.where(np.isnan(v), lo, v), lo, hi))
        return np.column_stack(cols)

    def sizes(self) -> dict[str, int]:
        """The data pass (``sums.PlanPass``): exact sums of the clipped covariates'
        products x_a·x_b (a <= b, row-major), and of x_a times the clipped curves' grid
        values (p × M, row-major)."""
        return {"gram": self.p * (self.p + 1) // 2, "cross": self.p * int(self.grid.size)}

    def widths(self) -> tuple[int | None, ...]:
        return (*(None,) * (self.p - self._intercept), int(self.grid.size))

    @property
    def _intercept(self) -> int:
        return int(bool(self.names) and self.names[0] == "(intercept)")

    def reduce(self, *columns: np.ndarray) -> dict[str, list[int]]:
        x = self.design(columns[:-1])
        y = sums.clipped(columns[-1], self.eig.weights, self.tau)
        m = int(self.grid.size)
        cross = (np.repeat(np.arange(self.p), m), np.tile(np.arange(m), self.p))
        return {"gram": product_sums(x, x, np.triu_indices(self.p)),
                "cross": product_sums(x, y, cross)}

    def statistic(self, covariates: Sequence[str], response: str) -> sums.PlanPass:
        return sums.PlanPass(self, (*covariates, response))

    def coefficients(self, partial: Partial) -> NDArray[np.float64]:
        """The upper triangle of G, then the QR coefficients of S_1..S_p: the means of the
        products, each rounded once from its exact sum, projected on the basis."""
        check_rows(partial, self.n, "curves")
        upper = sums.totals(partial, "gram", self.n)
        cross = sums.totals(partial, "cross", self.n).reshape(self.p, -1)  # p × M
        s = ((cross * self.eig.weights) @ self.eig.vectors) * self.filter  # p × J
        return np.concatenate([upper, s.ravel()])

    def summary(self, covariates: Sequence[ArrayLike], curves: ArrayLike) -> NDArray[
        np.float64
    ]:
        """Non-private (upper triangle of G, then the QR coefficients of S_1..S_p)."""
        given = [np.asarray(v, dtype=np.float64) for v in covariates]
        y = np.asarray(curves, dtype=np.float64)
        if y.shape != (self.n, self.grid.size):
            raise ValueError(f"curves must have shape (n_rows, {self.grid.size})")
        if any(v.shape != (self.n,) for v in given):
            raise ValueError("covariates must have n_rows entries")
        names = [f"x{k}" for k in range(len(given))]
        batch = {**dict(zip(names, given, strict=True)), "curves": y}
        return self.coefficients(whole(self.statistic(names, "curves"), batch))

    def release(self, covariates: Sequence[ArrayLike], curves: ArrayLike,
                rng: np.random.Generator) -> dict[str, Any]:
        return self.publish(self.summary(covariates, curves), rng)

    def publish(self, summary: NDArray[np.float64], rng: np.random.Generator
                ) -> dict[str, Any]:
        """The release of non-private coefficients: noise, then β̃."""
        return self.result(self.noise.release(summary, rng))

    def result(self, coefficients: NDArray[np.float64]) -> dict[str, Any]:
        """β̃ = G̃⁻¹S̃ after the PD projection (post-processing of the noisy vector)."""
        k = self.p * (self.p + 1) // 2
        gram = np.zeros((self.p, self.p))
        gram[np.triu_indices(self.p)] = coefficients[:k]
        gram = gram + np.triu(gram, 1).T
        floor = float(np.max(self.gram_noise.laplace_scales))
        lam, vec = np.linalg.eigh(gram)
        projected = (vec * np.maximum(lam, floor)) @ vec.T
        s = coefficients[k:].reshape(self.p, -1)
        beta = np.linalg.solve(projected, s)  # p × J
        curves = beta @ self.eig.vectors.T
        inverse = np.linalg.inv(projected)
        with np.errstate(over="ignore", invalid="ignore"):  # absurd bounds: inf -> null
            var = self.mean_noise.variances().reshape(self.p, -1).sum(axis=1)  # per S_k
            # given the released G̃ (post-processing): S̃'s noise through G̃⁻¹; G̃'s own noise
            # is left out (the simulated RMS matches within Monte Carlo error:
            # tests/unit/iclp/test_stated_accuracy.py)
            rms = np.sqrt((inverse**2) @ var)
            band = 1.96 * rms
        return {
            "grid": self.grid,
            "values": curves,
            "names": list(self.names),
            "kind": "curves",
            "coefficients": coefficients,
            "gram": projected,
            "rmse": rms,
            "band95": band,
            "kernel": {**self.eig.kernel.describe(),
                       "domain": [float(self.grid[0]), float(self.grid[-1])]},
            "smoothing": self.smoothing,
        }

    def accuracy(self) -> dict[str, Any]:
        s_mse = self.mean_noise.variances().reshape(self.p, -1).sum(axis=1)
        return {
            "noise": "Gram: discrete Laplace per upper-triangle entry; S: ICLP-QR per"
                     " component, stacked",
            "epsilon_split": {k: str(v) for k, v in self.epsilons.items()},
            "gram_sensitivity_l1": self.gram_noise.sensitivity,
            "gram_laplace_scale": float(np.max(self.gram_noise.laplace_scales)),
            "gram_expected_sq_error": self.gram_noise.expected_sq_error(),
            "s_sensitivity": self.mean_noise.sensitivity,
            "s_sensitivity_norm": "weighted_l1_K_C summed over the p components",
            "s_expected_sq_l2_error": s_mse,
            "s_rmse": np.sqrt(s_mse),
            "coefficient_rmse": "result.rmse",
            "smoothing": self.smoothing,
            "statement": (
                "The coefficient functions' RMS privacy error (L2 over the grid) depends on"
                " the Gram matrix, so it is stated with the release: result.rmse[k] ="
                " sqrt(sum_a (G~^-1)_ka^2 s_expected_sq_l2_error[a]) for each beta_k, the"
                " noise of S~ through the released G~^-1, and result.band95 = 1.96 x it"
                " (post-processing of the released G~; the Gram's own noise, Laplace scale"
                " gram_laplace_scale, is left out). s_rmse[k] is the RMS error of S_k ="
                " (1/n) sum_i x_ik Y_i alone, before G~^-1 amplifies it; the smoothing bias"
                " and the clipping of Y are excluded."
            ),
        }


def plan_iclp_fos(
    names: Sequence[str],
    bounds: Sequence[tuple[float, float]],
    grid: ArrayLike,
    tau: float,
    n: int,
    epsilon: float | Fraction,
    intercept: bool = True,
    kernel: Kernel = mean.DEFAULT_KERNEL,
    eta: float | None = None,
    psi: float | None = None,
    gram_share: Fraction = DEFAULT_GRAM_SHARE,
) -> FosPlan:
    """Calibrate a function-on-scalar regression; ε₁ = gram_share·ε exactly, ε₂ = ε − ε₁.

    ψ defaults to the minimiser over ``erm.PSI_GRID`` of ``reference_risk`` at ε₂, η to
    1 + 2/β.
    """
    points, tau = domain.validate_functional_meta(grid, tau)
    if len(names) != len(bounds) or not names:
        raise ValueError("one bounds pair per covariate, at least one covariate")
    if len(names) + intercept > MAX_COVARIATES:
        raise ValueError(f"at most {MAX_COVARIATES} covariates (with the intercept)")
    box = [(float(lo), float(hi)) for lo, hi in bounds]
    for lo, hi in box:
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError("covariate bounds must be finite with lower < upper")
    if intercept:
        box.insert(0, (1.0, 1.0))
        names = ["(intercept)", *names]
    eps = Fraction(epsilon)
    if not eps > 0:
        raise ValueError("epsilon must be > 0")
    if not 0 < gram_share < 1:
        raise ValueError("gram_share must be strictly between 0 and 1")
    eps1 = eps * gram_share
    eps2 = eps - eps1
    p = len(box)
    # --- ε₁: the Gram matrix
    ranges = [product_range(box[j], box[k], j == k) for j in range(p) for k in range(j, p)]
    magnitude = [max(abs(box[j][0]), abs(box[j][1])) * max(abs(box[k][0]), abs(box[k][1]))
                 for j in range(p) for k in range(j, p)]
    # the computed mean of products errs by ≤ γ_{n+2}·max|x_j x_k| (rounded up: γ <= 2(n+2)u)
    gram_error = np.array(magnitude) * (n + 4) * 2.0 * _U
    gram_delta = math.fsum(ranges) / n * (1.0 + 2.0**-40)
    if gram_delta == 0.0:  # intercept only: G = 1 is public; noise it anyway (tiny)
        gram_delta = 2.0**-40
    gram_noise = noise.calibrate(np.ones(len(ranges)), gram_delta, eps1, gram_error,
                                 np.array(magnitude))
    # --- ε₂: the p mean functions, QR per component, sensitivity summed over components
    eta_rule = "given" if eta is not None else "auto"
    eta = pss.default_eta(kernel) if eta is None else float(eta)
    if not (math.isfinite(eta) and eta > 0.5):
        raise ValueError("eta must be > 1/2")
    eig = spectral.eigen_system(kernel, domain.unit_positions(points),
                                domain.quadrature_weights(points))
    scale = [max(abs(lo), abs(hi)) for lo, hi in box]
    tau_eff = tau * mean.TAU_SLACK
    bessel = spectral.bessel_factor(eig)

    def delta(q: float) -> float:
        return (mean.qr_sensitivity(eig.values, n, tau_eff * math.fsum(scale), eta, q)
                * math.sqrt(bessel) * mean.SENSITIVITY_SAFETY * (1.0 + 2.0**-40))

    psi_rule = "given" if psi is not None else "min-risk"
    share = mean.prior_share(eig)
    e2, total_scale = float(eps2) ** 2, math.fsum(scale)

    def reference(q: float) -> dict[str, float]:
        """``reference_risk`` at τ = 1: S̃_k's noise 2Δ²·tr C/ε₂² with Δ at τ = 1."""
        unit = mean.qr_sensitivity(eig.values, n, 1.0, eta, q) * math.sqrt(bessel) * total_scale
        return reference_risk(eig, share, box, n, eta, q, 2.0 * unit**2 * eig.trace / e2)

    if psi is None:
        # ψ for error (issue #32): privacy + ψR²/4 (a worst-case bias) let the privacy
        # error of S̃, amplified by G̃⁻¹, rise with ε (7.6 -> 21 from ε = 1/8 to 0.42 at
        # n = 500); the reference risk is a(ψ)/ε² + b(ψ) on the fixed grid
        # ``erm.PSI_GRID``, so its minimum is non-increasing in ε
        psi = min(erm.PSI_GRID, key=lambda q: reference(q)["total"])
    psi = float(psi)
    if not (math.isfinite(psi) and psi > 0):
        raise ValueError("psi must be a finite number > 0")
    filt = mean.qr_filter(eig.values, eta, psi)
    delta2 = delta(psi)
    size = math.sqrt(bessel) * tau_eff
    bound = np.concatenate([filt * size * c for c in scale])
    error = bound * (n + len(points) + p + 8) * 2.0**-52
    mean_noise = noise.calibrate(np.tile(np.sqrt(eig.values), p), delta2, eps2, error, bound)
    filt.setflags(write=False)
    smoothing = {"method": "iclp-qr function-on-scalar", "eta": eta, "eta_rule": eta_rule,
                 "psi": psi, "psi_rule": psi_rule, "beta": kernel.beta,
                 "components": eig.size, "gram_share": str(gram_share),
                 "pd_floor": "the Gram entries' Laplace scale"}
    if psi_rule == "min-risk":
        smoothing["risk"] = {
            **{k: v * tau * tau for k, v in reference(psi).items()},
            "criterion": (
                "min over psi of ||G^-1||_F^2 * (the noise of S~) + sum_k kappa tau^2/c_k^2 *"
                " sum((1-F_j)^2 p_j) + tau^2 tr(G^-1) sum(F_j^2 p_j)/n, G = E x x^T for"
                " covariates uniform on their bounds, p the share of Matern(1.5, 0.1),"
                f" kappa = {pss.PRIOR_ENERGY:g}; the Gram's own noise is left out")}
    return FosPlan(tuple(names), tuple(box), np.array(points), eig, n, tau, filt, gram_noise,
                   mean_noise, {"gram": eps1, "functions": eps2}, smoothing)
