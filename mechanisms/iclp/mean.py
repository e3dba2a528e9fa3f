"""Mean functions: ICLP-QR (the paper's recommendation) and the FRL baseline (spec §3.2).

Both project the mean of the clipped curves on the eigenbasis of the noise
kernel C and add lattice Laplace noise to the coefficients:

* ICLP-QR shrinks coefficient j by F_j = λ_j^η/(λ_j^η + ψ) (ridge in the
  RKHS of C^η) and adds ICLP noise of scale Δ·a_j/ε, with the weighted-ℓ1
  sensitivity Δ = (2τ/n)·(Σ_j F_j²/a_j²)^½ (Cauchy–Schwarz; attained). The
  paper's noise covariance is C (a_j = √λ_j); by default it is the smoother
  itself (a_j = √F_j, "matched"), which by Cauchy–Schwarz gives the least
  privacy error (8τ²/(nε)²)·(Σ F_j)² for the same estimator, hence a smaller
  expected error for every mean and data distribution. By default (ψ =
  "auto") the noise length-scale, η, the number of components and ψ minimise
  the data-free risk of ``pss.qr_risk``, guarded so it is no worse than FRL's
  (``_tune``; FRL is ψ = 0, J = M in this family): the paper's balanced ψ
  keeps the privacy error flat in ε, so QR lost to FRL by 3-10x at large ε
  (issue 16).
* FRL keeps the first M coefficients unshrunk and adds i.i.d. noise of scale
  Δ₁/ε with Δ₁ = 2τ√M/n.

A plan holds everything that follows from public inputs (n, τ, grid, kernel,
ε); ``release`` is the only step that reads curves.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.iclp import domain, noise, pss, spectral, sums
from mechanisms.iclp.bands import band_sentence, pointwise_band
from mechanisms.iclp.kernels import Kernel, matern
from mechanisms.iclp.release import FunctionRelease
from mechanisms.statistics import Partial, check_rows, column_sums, whole

#: τ_eff = τ·TAU_SLACK bounds the computed norm of a clipped curve (rounding ≈ M·2^-53)
TAU_SLACK = 1.0 + 2.0**-30
#: relative slack of the FRL guard: FRL's own candidate meets it up to the rounding of
#: its basis' orthonormality (≈ 1e-14)
GUARD_SLACK = 1e-9
#: a later candidate must beat the incumbent by this factor: rounding-level ties go to the
#: earlier one (kernel 0, FRL's basis, comes first)
_TIE = 1.0 - 1e-12
#: computed closed-form sensitivities are multiplied by this (their rounding is ≈ J·2^-53)
SENSITIVITY_SAFETY = 1.0 + 2.0**-30
DEFAULT_KERNEL = matern(1.5, 0.1)
Method = Literal["iclp-qr", "iclp-ar", "frl"]
_LABELS = {"iclp-qr": "ICLP-QR", "iclp-ar": "ICLP-AR", "frl": "FRL"}
PsiRule = Literal["auto", "balanced", "free"]
ProfileRule = Literal["auto", "matched", "kernel"]


def qr_filter(eigenvalues: ArrayLike, eta: float, psi: float) -> NDArray[np.float64]:
    """Shrinkage λ^η/(λ^η + ψ) of the ICLP-QR mean (ridge in H_{C^η})."""
    lam_eta = np.asarray(eigenvalues, dtype=np.float64) ** eta
    out: NDArray[np.float64] = lam_eta / (lam_eta + psi)
    return out


def qr_sensitivity(eigenvalues: ArrayLike, n: int, tau: float, eta: float, psi: float) -> float:
    """Δ_QR = (2τ/n)·(Σ_j λ_j^(2η−1)/(λ_j^η + ψ)²)^½ in the weighted-ℓ1 norm."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    weights = qr_filter(lam, eta, psi) ** 2 / lam
    return 2.0 * tau / n * math.sqrt(float(weights.sum()))


def weighted_l1_sensitivity(filt: ArrayLike, shape: ArrayLike, n: int, tau: float) -> float:
    """Δ = (2τ/n)·(Σ_j F_j²/a_j²)^½: sup of Σ_j F_j|d_j|/a_j over ‖d‖ <= 2τ/n (attained).

    With a_j = √λ_j this is ``qr_sensitivity``; with the matched a_j = √F_j it is
    (2τ/n)·(Σ_j F_j)^½, and with F = a = 1 on M components it is FRL's Δ₁ = 2τ√M/n.
    """
    ratio = np.asarray(filt, dtype=np.float64) / np.asarray(shape, dtype=np.float64)
    # the operation order of ``frl_sensitivity``, so FRL's point gives FRL's Δ bit for bit
    return 2.0 * tau * math.sqrt(float(np.sum(ratio * ratio))) / n


def qr_worst_case(eig: spectral.EigenSystem, tau: float, eta: float, psi: float,
                  profile: pss.NoiseProfile = "kernel") -> NDArray[np.float64]:
    """Curve x with ‖x‖ = τ such that replacing τu by −τu attains Δ (spec §3.2):
    u ∝ Σ_j (F_j/a_j)·v_j for the noise shape a of ``profile``."""
    filt = qr_filter(eig.values, eta, psi)
    direction = filt / pss.noise_shape(eig.values, filt, profile)
    curve = eig.synthesize(direction)
    return tau * curve / float(np.sqrt(np.sum(eig.weights * curve * curve)))


def frl_sensitivity(components: int, n: int, tau: float) -> float:
    """Δ₁ = 2τ√M/n: ℓ1 norm of M coefficients of a difference of norm <= 2τ, over n."""
    return 2.0 * tau * math.sqrt(components) / n


@dataclass(frozen=True, eq=False)
class MeanPlan:
    """A calibrated mean-function release; built by ``plan_iclp_mean`` / ``plan_frl_mean``."""

    method: Method
    grid: NDArray[np.float64]  # the column's grid, original units
    eig: spectral.EigenSystem
    n: int
    tau: float
    filter: NDArray[np.float64]  # multiplies ⟨x̄, v_j⟩, j <= components
    noise: noise.CoefficientNoise
    smoothing: dict[str, Any]

    @property
    def components(self) -> int:
        return int(self.filter.size)

    @property
    def basis(self) -> NDArray[np.float64]:
        """v_j(t_k) for the released components, shape (M, components)."""
        return self.eig.vectors[:, : self.components]

    def sizes(self) -> dict[str, int]:
        """The data pass (``sums.PlanPass``): exact column sums of the clipped curves."""
        return {"sums": int(self.grid.size)}

    def widths(self) -> tuple[int | None, ...]:
        return (int(self.grid.size),)

    def reduce(self, *columns: np.ndarray) -> dict[str, list[int]]:
        x, factor = domain.clip_factors(np.asarray(columns[0], dtype=np.float64),
                                        self.eig.weights, self.tau)
        return {"sums": column_sums(x, factor)}  # the clipped curves, not copied

    def statistic(self, column: str) -> sums.PlanPass:
        return sums.PlanPass(self, (column,))

    def coefficients(self, partial: Partial) -> NDArray[np.float64]:
        """ĉ_j = filter_j·⟨mean of clipped curves, v_j⟩ from the data pass's partial (the
        mean rounded once from the exact sums)."""
        check_rows(partial, self.n, "curves")
        mean = sums.totals(partial, "sums", self.n)
        out: NDArray[np.float64] = self.filter * ((mean * self.eig.weights) @ self.basis)
        return out

    def summary(self, curves: ArrayLike) -> NDArray[np.float64]:
        """Non-private coefficients ĉ_j = filter_j·⟨mean of clipped curves, v_j⟩."""
        x = np.asarray(curves, dtype=np.float64)
        if x.ndim != 2 or x.shape != (self.n, self.grid.size):
            raise ValueError(f"curves must have shape (n_rows, {self.grid.size}) = "
                             f"({self.n}, {self.grid.size})")
        return self.coefficients(whole(self.statistic("curves"), {"curves": x}))

    def smoothed_mean(self, curves: ArrayLike) -> NDArray[np.float64]:
        """The non-private target f̂ on the grid (for simulations; never released)."""
        return self.basis @ self.summary(curves)

    def release(self, curves: ArrayLike, rng: np.random.Generator) -> FunctionRelease:
        """Noisy coefficients on their lattices, and the function they span on the grid."""
        return self.publish(self.summary(curves), rng)

    def publish(self, summary: NDArray[np.float64], rng: np.random.Generator
                ) -> FunctionRelease:
        """The release of non-private coefficients: noise, then the function they span."""
        coefficients = self.noise.release(summary, rng)
        return FunctionRelease(
            grid=self.grid,
            values=self.basis @ coefficients,
            coefficients=coefficients,
            kernel=self.kernel_info(),
            smoothing=self.smoothing,
            extra={"basis": self.basis_info()},
        )

    def kernel_info(self) -> dict[str, Any]:
        return {
            **self.eig.kernel.describe(),
            "domain": [float(self.grid[0]), float(self.grid[-1])],
            "length_units": "fraction of the grid span",
        }

    def basis_info(self) -> dict[str, Any]:
        return {
            "eigenvalues": self.eig.values[: self.components],
            "sign_convention": "largest-magnitude grid value positive",
            "inner_product": "sum_k w_k f(t_k) g(t_k), Voronoi weights summing to 1",
        }

    def accuracy(self) -> dict[str, Any]:
        """Expected squared L2 error of the noise and the tuning, from public inputs."""
        nz = self.noise
        mse = nz.expected_sq_error()
        # per point: few components leave the noise uneven over the domain (its ends got
        # ~92 % under a band of 1.96 x the domain's RMS)
        band = pointwise_band(self.basis, nz.variances(), 1.0)
        rounding = float(np.sum(nz.steps**2)) / 4.0
        label = _LABELS[self.method]
        risk = self.smoothing.get("risk")
        tuning = "" if risk is None else (
            f" The tuning (rho={self.smoothing['rho']:g}, J={self.components},"
            f" eta={self.smoothing['eta']:g}, psi={self.smoothing['psi']:.3g}) minimises a"
            f" data-free risk whose predicted E||released - mean||^2 is {risk['total']:.3g}"
            f" (privacy {risk['privacy']:.3g}, bias {risk['bias']:.3g} for a reference"
            " Matern(1.5, 0.1) mean of energy"
            f" {risk['prior_energy']:g}*tau^2, sampling {risk['sampling']:.3g}); FRL's"
            f" default (M={risk['frl']['components']}) has {risk['frl']['total']:.3g} there"
            + (" and the choice is no worse than FRL's for a mean along any of FRL's basis"
               " functions" if risk["frl_guard_met"] else "")
            + "; the actual bias depends on the true mean's smoothness.")
        iclp = self.method != "frl"
        profile = self.smoothing.get("noise_profile", "kernel")
        shape = ("Delta/epsilon" if not iclp else "Delta*sqrt(F_j)/epsilon, F_j the smoother"
                 if profile == "matched" else "Delta*sqrt(lambda_j)/epsilon")
        return {
            "noise": f"{label}: discrete Laplace per eigen-coefficient on power-of-two lattices",
            "laplace_scales": shape,
            "sensitivity": nz.sensitivity,
            "sensitivity_lattice": nz.lattice_sensitivity,
            "sensitivity_norm": "weighted_l1_K_C" if iclp else "l1",
            "sigma": nz.sigma,
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse),
            "rounding_sq_l2_bound": rounding,
            "kernel": self.kernel_info(),
            "smoothing": self.smoothing,
            "truncation": {
                "components": self.components,
                "grid_points": int(self.grid.size),
                "dropped": int(self.grid.size - self.components),
                "rel_floor": self.eig.rel_floor,
            },
            "norm_bound": self.tau,
            **band,
            "statement": (
                f"E||released - smoothed mean||^2 = {mse:.6g} (RMS over the domain, curve"
                f" units), the privacy error only; it excludes the smoothing bias and the"
                f" sampling error of the mean of curves clipped to norm {self.tau:g}."
                + band_sentence(band, "the smoothed mean", "mean")
                + tuning
            ),
        }


def plan_iclp_mean(
    grid: Sequence[float] | ArrayLike,
    tau: float,
    n: int,
    epsilon: float | Fraction,
    kernel: Kernel | Sequence[Kernel] | None = None,
    eta: float | None = None,
    psi: float | PsiRule | None = None,
    max_components: int | None = None,
    rel_floor: float = spectral.REL_FLOOR,
    noise_profile: ProfileRule = "auto",
    frl_guard: bool = True,
) -> MeanPlan:
    """Calibrate an ICLP-QR mean release (spec §3.2).

    ``psi`` is a number >= 0 (0: no ridge, the plain projection on J components),
    ``None``/``"auto"`` (default: ``_tune``), ``"balanced"`` ((nε²)^(−ηβ/(β+1)), the
    paper's PSS order) or ``"free"`` (1/n). Under ``"auto"`` every knob the caller leaves
    open is chosen jointly: the noise kernel among ``kernel`` when it is a sequence
    (``None``: Matérn ν = 3/2 with ρ in ``pss.RHO_CANDIDATES``), η among
    ``pss.ETA_CANDIDATES``, the number of components J on a geometric ladder plus FRL's M
    (a prefix of one eigen-system, so projection, sensitivity and noise still share it),
    and ψ (including 0). Under the fixed rules η defaults to 1 + 2/β, J to all retained
    components and the kernel to the first candidate.

    ``noise_profile``: the ICLP noise covariance, with the kernel's eigenfunctions and
    eigenvalues a_j². "matched" (a_j² = F_j, the filter: the least privacy error for the
    estimator, ``pss.noise_shape``), "kernel" (a_j² = λ_j, the paper's), or "auto":
    "kernel" under the paper's rules "balanced"/"free", otherwise "matched".
    ``frl_guard=False`` drops the FRL guard of ``_tune`` (larger gains on smooth means,
    losses to FRL on others).
    """
    points, tau = domain.validate_functional_meta(grid, tau)
    check_n_eps(n, epsilon)
    if eta is not None and not (math.isfinite(eta) and eta > 0.5):
        raise ValueError("eta must be > 1/2 for the mean (spec §7.2)")
    if max_components is not None and max_components < 1:
        raise ValueError("max_components must be at least 1")
    if noise_profile not in ("auto", "matched", "kernel"):
        raise ValueError("noise_profile must be 'auto', 'matched' or 'kernel'")
    profile: pss.NoiseProfile = (
        noise_profile if noise_profile != "auto"
        else "kernel" if psi in ("balanced", "free") else "matched")
    candidates = _kernel_candidates(kernel)
    eta_rule = "given" if eta is not None else "auto"
    tuned: Tuned | None = None
    if psi is None or psi == "auto":
        tuned = _tune(candidates, points, rel_floor, max_components, n, float(epsilon),
                      tau, None if eta is None else float(eta), profile, frl_guard)
        kern, eta_value, psi_value = tuned.kernel, tuned.eta, tuned.psi
        psi_rule = "min-risk"
        eig = prefix(eigen(kern, points, rel_floor, None), tuned.components)
    else:
        kern = candidates[0]
        eta_value = pss.default_eta(kern) if eta is None else float(eta)
        if psi == "balanced":
            psi_rule, psi_value = "balanced", pss.balanced_psi(n, epsilon, eta_value, kern.beta)
        elif psi == "free":
            psi_rule, psi_value = "free", pss.free_psi(n)
        else:
            psi_rule, psi_value = "given", float(psi)
        eig = eigen(kern, points, rel_floor, None)  # a cap takes a prefix, as ``_tune`` does
        if max_components is not None:
            eig = prefix(eig, max_components)
    if not (math.isfinite(psi_value) and psi_value >= 0):
        raise ValueError("psi must be a finite number >= 0")
    filt = qr_filter(eig.values, eta_value, psi_value)
    kept = int(np.count_nonzero(filt > 0))  # F underflows to 0 only at the tail: a prefix
    if kept < eig.size:
        if kept == 0:
            raise ValueError("psi is so large that every coefficient is shrunk to 0")
        eig, filt = prefix(eig, kept), filt[:kept].copy()
    shape = pss.noise_shape(eig.values, filt, profile)
    tau_eff = tau * TAU_SLACK
    bessel = spectral.bessel_factor(eig)
    delta = weighted_l1_sensitivity(filt, shape, n, tau_eff) * math.sqrt(bessel)
    smoothing: dict[str, Any] = {
        "method": "iclp-qr",
        "eta": eta_value,
        "eta_rule": eta_rule,
        "psi": psi_value,
        "psi_rule": psi_rule,
        "beta": kern.beta,
        "components": eig.size,
        "components_rule": "given" if max_components is not None else (
            "auto" if psi_rule == "min-risk" else "all"),
        "rho": kern.rho,
        "rho_rule": "auto" if len(candidates) > 1 and psi_rule == "min-risk" else "given",
        "noise_profile": profile,
    }
    if tuned is not None:
        smoothing["risk"] = {
            **tuned.risk.describe(),
            "criterion": (
                "min over (rho, J, eta, psi) of 2*Delta^2*sum(a^2)/eps^2 + kappa*tau^2*"
                "E||(I-F)mu||^2 + tau^2/n*E||F e||^2 with mu, e ~ GP(0, Matern(1.5, 0.1)),"
                " subject to: for each of FRL's M basis functions b_i, the error for the mean"
                " sqrt(kappa)*tau*b_i (no spread) is at most FRL's; FRL (psi=0, J=M, flat"
                " noise) is a candidate, so the minimum is never above FRL's"
            ),
            "prior_energy": pss.PRIOR_ENERGY,
            "frl": {"components": tuned.frl_components, "total": tuned.frl_risk,
                    "worst_on_frl_basis": tuned.frl_guard},
            "worst_on_frl_basis": tuned.guard,
            "frl_guard_met": tuned.guarded,
        }
    return make_plan("iclp-qr", points, eig, n, tau, filt, shape,
                 delta * SENSITIVITY_SAFETY, epsilon, smoothing)


def _kernel_candidates(kernel: Kernel | Sequence[Kernel] | None) -> tuple[Kernel, ...]:
    if kernel is None:
        return tuple(matern(1.5, rho) for rho in pss.RHO_CANDIDATES)
    if isinstance(kernel, Kernel):
        return (kernel,)
    out = tuple(kernel)
    if not out or not all(isinstance(k, Kernel) for k in out):
        raise ValueError("kernel must be a Kernel or a non-empty sequence of them")
    return out


@dataclass(frozen=True)
class Tuned:
    """The default's choice and its data-free risks (``_tune``)."""

    kernel: Kernel
    components: int
    eta: float
    psi: float
    risk: pss.QrRisk  # under the smooth reference class
    guard: float  # the worst risk over FRL's basis functions b_i
    frl_components: int
    frl_risk: float  # FRL's total risk under the smooth class
    frl_guard: float  # FRL's risk for the mean √κτ·b_i, no spread (any i <= M)
    guarded: bool  # False if no candidate met the guard and it was dropped


@functools.lru_cache(maxsize=64)
def _tune(kernels: tuple[Kernel, ...], points: tuple[float, ...], rel_floor: float,
          cap: int | None, n: int, epsilon: float, tau: float, eta: float | None,
          profile: pss.NoiseProfile = "matched", guarded: bool = True) -> Tuned:
    """argmin of ``pss.qr_risk`` over the open knobs, guarded by FRL (public inputs only).

    Objective: the risk under the smooth reference class of ``prior_share``. Guard: for
    each of FRL's basis functions b_i (i <= M, the eigenfunctions of ``kernels[0]``, M =
    FRL's default ``pss.frl_components``), data whose mean is √κ·τ·b_i and whose curves
    do not spread must cost at most what FRL costs there, 8τ²M²/(nε)² (FRL has no bias
    on b_i). No spread is the guard's worst case: shrinking only ever lowers the
    sampling variance of a spread along b_i (F_j <= 1, Σ_j ⟨v_j, b_i⟩² <= 1), so the
    guard also holds with any spread up to τ² along b_i. With the matched profile FRL's
    release itself is a candidate (kernel 0, J = M, ψ = 0: F = a = 1, Δ = 2τ√M/n) and
    meets the guard with equality, so the default's risk is never above FRL's under the
    smooth class, nor on any b_i, by construction. If no candidate is feasible (a cap
    below M, or the kernel profile) or ``guarded`` is False, the guard is dropped.
    """
    etas = pss.ETA_CANDIDATES if eta is None else (eta,)
    base = eigen(kernels[0], points, rel_floor, None)
    m = frl_default_components(base, n, epsilon)
    frl_risk = _total(pss.qr_risk(base.values[:m], prior_share(base)[:m], n, epsilon, tau,
                                  1.0, 0.0, "matched"))
    # FRL on the mean √κτ·b_i (i <= M) with no spread: no bias, privacy 8τ²M²/(nε)²
    frl_guard = 8.0 * tau**2 * m**2 / (n**2 * epsilon**2)
    limits = (frl_guard * (1.0 + GUARD_SLACK), math.inf) if guarded else (math.inf,)
    for limit in limits:
        best: Tuned | None = None
        for kern in kernels:
            eig = eigen(kern, points, rel_floor, None)
            share, guard = prior_share(eig), _band_share(eig, base, m)
            sizes = (sorted({*pss.component_candidates(eig.size), min(m, eig.size)})
                     if cap is None else [min(cap, eig.size)])
            for j in sizes:
                for e in etas:
                    found = pss.minimise_qr_risk(
                        eig.values[:j], share[:j], n, epsilon, tau, e, profile, guard[:j],
                        limit, math.inf if best is None else best.risk.total * _TIE,
                        np.zeros_like(guard[:j]))
                    if found is None:
                        continue
                    psi, risk, worst = found
                    if best is None or risk.total < best.risk.total * _TIE:
                        best = Tuned(kern, j, e, psi, risk, worst, m, frl_risk, frl_guard,
                                     math.isfinite(limit))
        if best is not None:
            return best
    raise AssertionError("the unconstrained search always has a candidate")


def _total(risk: pss.QrRisk | list[pss.QrRisk]) -> float:
    assert isinstance(risk, pss.QrRisk)
    return risk.total


@functools.lru_cache(maxsize=spectral.CACHE_SIZE)
def _band_share(eig: spectral.EigenSystem, base: spectral.EigenSystem, m: int
                ) -> NDArray[np.float64]:
    """P_ji = ⟨v_j, b_i⟩², i <= M: column i is the share of a mean along FRL's b_i."""
    cross = (eig.vectors * eig.weights[:, None]).T @ base.vectors[:, :m]
    out: NDArray[np.float64] = cross * cross
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=spectral.CACHE_SIZE)
def prior_share(eig: spectral.EigenSystem) -> NDArray[np.float64]:
    """p_j = E⟨μ, v_j⟩²/E‖μ‖² for μ ~ GP(0, C_ref) (the reference class of ``pss``).

    With A = W^½ K_ref W^½ and u_j = W^½ v_j, E⟨μ, v_j⟩² = u_jᵀ A u_j and
    E‖μ‖² = tr A; for the reference kernel itself p_j = λ_j / tr A.
    """
    reference = matern(pss.PRIOR_NU, pss.PRIOR_RHO)
    root = np.sqrt(eig.weights)
    a = root[:, None] * reference.matrix(eig.positions) * root[None, :]
    if eig.kernel == reference:
        out = eig.values / float(np.trace(a))
    else:
        u = eig.vectors * root[:, None]
        out = np.einsum("kj,kj->j", u, a @ u) / float(np.trace(a))
    out.setflags(write=False)
    return out


def prefix(eig: spectral.EigenSystem, components: int) -> spectral.EigenSystem:
    """The first J eigenpairs of a system: the same basis, so DP is unchanged (spec §2.5).

    The defect bound of the whole system also bounds its leading block's.
    """
    if components >= eig.size:
        return eig
    vectors = np.ascontiguousarray(eig.vectors[:, :components])
    values = eig.values[:components].copy()
    for arr in (vectors, values):
        arr.setflags(write=False)
    return dataclasses.replace(eig, values=values, vectors=vectors,
                               dropped=eig.dropped + eig.size - components)


def plan_frl_mean(
    grid: Sequence[float] | ArrayLike,
    tau: float,
    n: int,
    epsilon: float | Fraction,
    kernel: Kernel = DEFAULT_KERNEL,
    components: int | None = None,
    rel_floor: float = spectral.REL_FLOOR,
) -> MeanPlan:
    """Calibrate an FRL mean release on the first M eigenfunctions of ``kernel``.

    M defaults to ``frl_default_components`` (min-risk; the paper's ⌊√n·ε⌋ is
    ``pss.frl_components``, given explicitly as ``components``).
    """
    points, tau = domain.validate_functional_meta(grid, tau)
    check_n_eps(n, epsilon)
    eig = eigen(kernel, points, rel_floor, None)
    rule = "given" if components is not None else "auto"
    m = frl_default_components(eig, n, epsilon) if components is None else components
    if not 1 <= m <= eig.size:
        raise ValueError(f"components must be between 1 and {eig.size} (the retained"
                         " eigenfunctions of the basis kernel on this grid)")
    bessel = spectral.bessel_factor(eig)
    delta = frl_sensitivity(m, n, tau * TAU_SLACK) * math.sqrt(bessel)
    smoothing = {"method": "frl", "components": m, "components_rule": rule}
    return make_plan("frl", points, eig, n, tau, np.ones(m), np.ones(m),
                 delta * SENSITIVITY_SAFETY, epsilon, smoothing)


def frl_default_components(eig: spectral.EigenSystem, n: int, epsilon: float | Fraction
                           ) -> int:
    """FRL's default M on ``eig``: ``pss.frl_min_risk_components`` under the reference
    class of ``prior_share`` (the risk ``_tune`` reports as FRL's)."""
    return pss.frl_min_risk_components(prior_share(eig), n, epsilon)


def iclp_mean(
    curves: ArrayLike,
    grid: Sequence[float] | ArrayLike,
    tau: float,
    epsilon: float | Fraction,
    rng: np.random.Generator,
    **options: Any,
) -> FunctionRelease:
    """One-call ICLP-QR mean release (notebook convenience)."""
    x = np.asarray(curves, dtype=np.float64)
    return plan_iclp_mean(grid, tau, x.shape[0], epsilon, **options).release(x, rng)


def frl_mean(
    curves: ArrayLike,
    grid: Sequence[float] | ArrayLike,
    tau: float,
    epsilon: float | Fraction,
    rng: np.random.Generator,
    **options: Any,
) -> FunctionRelease:
    """One-call FRL mean release (notebook convenience)."""
    x = np.asarray(curves, dtype=np.float64)
    return plan_frl_mean(grid, tau, x.shape[0], epsilon, **options).release(x, rng)


def check_n_eps(n: int, epsilon: float | Fraction) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError("n must be a positive integer")
    if not (math.isfinite(float(epsilon)) and float(epsilon) > 0):
        raise ValueError("epsilon must be a finite number > 0")


def eigen(
    kernel: Kernel, points: tuple[float, ...], rel_floor: float, cap: int | None
) -> spectral.EigenSystem:
    return spectral.eigen_system(
        kernel, domain.unit_positions(points), domain.quadrature_weights(points), rel_floor, cap
    )


def make_plan(
    method: Method,
    points: tuple[float, ...],
    eig: spectral.EigenSystem,
    n: int,
    tau: float,
    filt: NDArray[np.float64],
    shape: NDArray[np.float64],
    delta: float,
    epsilon: float | Fraction,
    smoothing: dict[str, Any],
) -> MeanPlan:
    """Float-error and magnitude bounds of the coefficients, then the lattice noise.

    |computed − exact| of ⟨x̄, v_j⟩ is at most (γ_n + γ_M + few u)·Σ_k w_k|v_j||x̄|
    <= (n + M + 8)·2^-53·τ_eff·√bessel (Cauchy–Schwarz on the mean of |X_i|), and
    twice that covers the multiplication by the filter; |ĉ_j| <= filter_j·τ_eff·√bessel.
    """
    m = len(points)
    size = float(np.sqrt(spectral.bessel_factor(eig))) * tau * TAU_SLACK
    bound = filt * size
    error = bound * (n + m + 8) * 2.0**-52
    calibrated = noise.calibrate(shape, delta, epsilon, error, bound)
    filt.setflags(write=False)
    return MeanPlan(method, np.array(points), eig, n, tau, filt, calibrated, smoothing)
