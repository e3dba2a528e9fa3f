"""Functionals from regularised ERM with ICLP-QR noise (spec §3.4, eq. 13, Thm 18).

A bounded response y is regressed (square loss: kernel ridge) or classified
(logistic loss, binary y) on one bounded scalar covariate x. Each record's x
is binned to the nearest of M equally spaced points of its declared range (a
per-record, data-independent map), and the estimator lives in the span of
the retained discrete eigenfunctions v_j of the noise kernel C on that grid
(coefficient space is the exact problem: no orthonormality is assumed):

    f̂ = argmin_f (1/n)Σ_i ℓ(f(t_{k_i}), y_i) + ψ‖f‖²_{H_{C^η}},  ‖f‖²_{H_{C^η}} = Σ_j c_j²/λ_j^η.

With a_j = c_j/λ_j^{η/2} the penalty is ψ‖a‖², the objective is 2ψ-strongly
convex in a, and Thm 18's argument gives ‖â_D − â_D'‖₂ <= Lκ/(nψ) with
κ² = max_k Σ_j λ_j^η v_j(t_k)² (the discrete sup of C^η(x, x)). By
Cauchy–Schwarz the weighted-ℓ1 sensitivity of ĉ is

    Δ = (Lκ/(nψ))·(Σ_j λ_j^{η−1})^{1/2}.

Loss constants: logistic L = 1; square loss with |y − mid| <= B (y centred at
the midpoint of its declared bounds, a public shift added back afterwards)
has ‖â‖ <= B/√ψ, so |f̂| <= κB/√ψ and L = 2(B + κB/√ψ). The objective uses
ψ‖f‖² (not ψ/2). The computed minimiser differs from the exact one; an a
posteriori bound ‖a − a*‖₂ <= ‖∇J(a)‖₂/(2ψ) (strong convexity), with the
gradient's own rounding bounded, is checked against a public tolerance
``SOLVE_TOLERANCE``·Lκ/(nψ) that the lattice slack absorbs (Newton steps; a fixed,
public number of them, so that the run time does not depend on the data).
The rows enter only through per-grid-point records and response sums, so the data pass
is an exact streaming statistic (``sums``) and the solve works on M public-size bins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.iclp import domain, mean, noise, pss, spectral, sums
from mechanisms.iclp.kernels import Kernel, matern
from mechanisms.iclp.release import FunctionRelease
from mechanisms.statistics import Partial, check_rows, float_sums, whole

Loss = Literal["square", "logistic"]
DEFAULT_GRID_SIZE = 100
DEFAULT_KERNEL = matern(1.5, 0.1)
#: the computed minimiser is within this fraction of Lκ/(nψ) of the exact one (checked)
SOLVE_TOLERANCE = 2.0**-14
SENSITIVITY_SAFETY = 1.0 + 2.0**-30
#: candidate ψ of the default rule: a log grid (public)
PSI_GRID = tuple(10.0 ** (k / 4) for k in range(-40, 9))
#: Newton steps of every solve, whatever the data (issue #27: an early exit made the run
#: time a function of the data). The square loss is quadratic: one step is exact up to
#: rounding, certified at the second check (measured: always 2). The logistic loss took
#: 3–6 steps on ordinary data (n up to 10^5, grid up to 500) and at most 19 on nearly
#: separable data at ψ down to 10^-12; 50 leaves a margin, and a solve still uncertified
#: after them fails as before (charged, the fixed message).
SQUARE_ITERATIONS = 4
LOGISTIC_ITERATIONS = 50
#: step sizes of the damped Newton line search, all tried every step (the old loop halved
#: from 1 while J did not decrease and stopped at 2^-30)
LINE_SEARCH = tuple(2.0**-k for k in range(30))
#: exact per-bin response sums (2^30 lattice units per B, 2^53 exact) and a certifiable solve
MAX_ROWS = 2**22
_U = 2.0**-53


#: the reference log-odds of the logistic default: a Gaussian process with the mean's
#: reference covariance (``mean.prior_share``, Matérn(3/2, 0.1)) and this sd
LOGIT_REFERENCE_SD = 2.0


def mean_curvature(sd: float) -> float:
    """w̄ = E σ(f)(1 − σ(f)) for f ~ N(0, sd²): the logistic loss's mean curvature
    (Gauss–Hermite, 40 nodes)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    p = 0.5 * (1.0 + np.tanh(0.5 * sd * nodes))
    return float(np.sum(weights * p * (1.0 - p)) / np.sum(weights))


#: the square loss's reference: a regression function from the same Gaussian process with
#: sd SQUARE_REFERENCE_SD·B and residuals of sd SQUARE_RESIDUAL_SD·B (B half the declared
#: response range): a response of sd ~0.3B, well inside ±B. A signal of sd B/4 chose
#: too little ridge for smoother, smaller regression functions (n = 2·10⁴, ε = 2, f =
#: sin(2πx)/2 on ±2: twice main's error); B·0.15 matched or beat main there and at n = 2000
SQUARE_REFERENCE_SD = 0.15
SQUARE_RESIDUAL_SD = 0.25


def ridge_risk(eig: spectral.EigenSystem, share: ArrayLike, n: int, eta: float, psi: float,
               privacy: float, reference_sd: float, curvature: float, information: float
               ) -> dict[str, float]:
    """Predicted E‖released − f‖² of a ridge fit for a reference f ~ GP(0, s²·C_ref).

    Near f the objective is (w/2)‖c − c_f‖² + ψΣ c_j²/λ_j^η (w the loss's mean curvature:
    2 for the square loss), so the fit keeps F_j = λ_j^η/(λ_j^η + 2ψ/w) of each
    coefficient: bias s²·Σ_j (1 − F_j)²·p_j (plus the reference's energy outside the
    retained components), sampling Σ_j F_j²/(n·I) (I: the Fisher information of one
    record), and the exact privacy error of the plan's noise. Public inputs only.
    """
    p = np.asarray(share, dtype=np.float64)
    lam_eta = eig.values**eta
    filt = lam_eta / (lam_eta + 2.0 * psi / curvature)
    energy = reference_sd**2
    bias = energy * (float(np.sum((1.0 - filt) ** 2 * p)) + max(0.0, 1.0 - float(p.sum())))
    sampling = float(np.sum(filt**2)) / (n * information)
    return {"privacy": privacy, "bias": bias, "sampling": sampling,
            "total": privacy + bias + sampling, "kept_share": float(np.sum(filt * p)
                                                                   / max(float(p.sum()), 1e-300))}


def logistic_risk(eig: spectral.EigenSystem, share: ArrayLike, n: int, epsilon: float,
                  eta: float, psi: float, privacy: float) -> dict[str, float]:
    """``ridge_risk`` for reference log-odds of sd ``LOGIT_REFERENCE_SD``: the logistic
    loss's mean curvature w̄, and a 0/1 response's Fisher information w̄ per record."""
    w = mean_curvature(LOGIT_REFERENCE_SD)
    return ridge_risk(eig, share, n, eta, psi, privacy, LOGIT_REFERENCE_SD, w, w)


def square_risk(eig: spectral.EigenSystem, share: ArrayLike, n: int, eta: float, psi: float,
                privacy: float) -> dict[str, float]:
    """``ridge_risk`` of the square loss at B = 1 (every term scales as B²): the reference
    of ``SQUARE_REFERENCE_SD``, curvature 2, information 1/``SQUARE_RESIDUAL_SD``²."""
    return ridge_risk(eig, share, n, eta, psi, privacy, SQUARE_REFERENCE_SD, 2.0,
                      SQUARE_RESIDUAL_SD**-2)


@dataclass(frozen=True)
class SolveWork:
    """What one solve computed: Newton steps and line-search objective evaluations (both
    functions of the loss only), and the step at which the answer was certified (data-
    dependent, never observable: the work after it is the same)."""

    steps: int
    evaluations: int
    certified_at: int


class SolveError(ArithmeticError):
    """The minimiser could not be certified to the public tolerance (no noise was drawn)."""


def bin_index(values: ArrayLike, bounds: tuple[float, float], grid_size: int) -> NDArray[
    np.intp
]:
    """Nearest of ``grid_size`` equally spaced points of [lo, hi] per record (NaN -> lo)."""
    lo, hi = bounds
    x = np.asarray(values, dtype=np.float64)
    x = np.where(np.isnan(x), lo, x)
    u = (np.clip(x, lo, hi) - lo) * ((grid_size - 1) / (hi - lo))
    out: NDArray[np.intp] = np.clip(np.rint(u).astype(np.intp), 0, grid_size - 1)
    return out


def lipschitz(loss: Loss, kappa: float, bound: float, psi: float) -> float:
    """L of Thm 18: 1 (logistic) or 2(B + κB/√ψ) (square loss, |y| <= B)."""
    return 1.0 if loss == "logistic" else 2.0 * (bound + kappa * bound / math.sqrt(psi))


def erm_sensitivity(eigenvalues: ArrayLike, kappa: float, lip: float, n: int, eta: float,
                    psi: float) -> float:
    """Δ = (Lκ/(nψ))·(Σ_j λ_j^{η−1})^{1/2} (weighted ℓ1, shape √λ_j)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    return lip * kappa / (n * psi) * math.sqrt(float(np.sum(lam ** (eta - 1.0))))


@dataclass(frozen=True, eq=False)
class ErmPlan:
    """A calibrated ERM release; built by ``plan_iclp_erm``."""

    loss: Loss
    bounds: tuple[float, float]  # the covariate's declared range
    centre: float  # public shift of the response (square loss), 0 for logistic
    bound: float  # B (square loss) or 1
    eig: spectral.EigenSystem
    n: int
    eta: float
    psi: float
    kappa: float
    lip: float
    noise: noise.CoefficientNoise
    smoothing: dict[str, Any]

    @property
    def grid(self) -> NDArray[np.float64]:
        lo, hi = self.bounds
        return lo + (hi - lo) * self.eig.positions

    @property
    def features(self) -> NDArray[np.float64]:
        """B_kj = v_j(t_k)·λ_j^{η/2}: f(t_k) = (B a)_k."""
        out: NDArray[np.float64] = self.eig.vectors * self.eig.values ** (self.eta / 2.0)
        return out

    @property
    def radius(self) -> float:
        """Lκ/(nψ): the exact bound on ‖â_D − â_D'‖₂."""
        return self.lip * self.kappa / (self.n * self.psi)

    def sizes(self) -> dict[str, int]:
        """The data pass (``sums.PlanPass``): per grid point, records and the exact sum of
        their responses."""
        m = int(self.eig.positions.size)
        return {"counts": m, "sums": m}

    def widths(self) -> tuple[int | None, ...]:
        return (None, None)

    def reduce(self, *columns: np.ndarray) -> dict[str, NDArray[np.int64] | list[int]]:
        """Per grid point: records, and Σ response — square loss: centred y rounded to the
        lattice g·ℤ and clipped to ±B; logistic: the count of y = 1 (y is 0/1 after
        clipping and rounding)."""
        m = int(self.eig.positions.size)
        index = bin_index(columns[0], self.bounds, m)
        ys = np.asarray(columns[1], dtype=np.float64)
        ys = np.where(np.isnan(ys), self.centre, ys)
        if self.loss == "logistic":
            resp = (np.clip(ys, 0.0, 1.0) >= 0.5).astype(np.float64)
        else:
            # g a power of two <= B·2^-30: the sums are exact, and were in float64 up to
            # n = 2^22 when the objective summed them there
            step = 2.0 ** (math.floor(math.log2(self.bound)) - 30)
            resp = np.clip(np.rint((ys - self.centre) / step) * step, -self.bound, self.bound)
        return {"counts": np.bincount(index, minlength=m),
                "sums": float_sums(resp, index.astype(np.int64), m)}

    def statistic(self, columns: Sequence[str]) -> sums.PlanPass:
        return sums.PlanPass(self, tuple(columns))

    def coefficients(self, partial: Partial) -> NDArray[np.float64]:
        """Non-private coefficients ĉ_j = λ_j^{η/2}·â_j of the partial's bin statistics."""
        check_rows(partial, self.n, "covariate")
        counts = partial.vector("counts").astype(np.float64)
        a = self.solve(counts, sums.totals(partial, "sums", 1))
        out: NDArray[np.float64] = a * self.eig.values ** (self.eta / 2.0)
        return out

    def bin_stats(self, x: ArrayLike, y: ArrayLike) -> tuple[NDArray[np.float64],
                                                             NDArray[np.float64]]:
        """Per grid point: (records, Σ response), as ``reduce`` reads them."""
        partial = self._pass(x, y)
        return partial.vector("counts").astype(np.float64), sums.totals(partial, "sums", 1)

    def _pass(self, x: ArrayLike, y: ArrayLike) -> Partial:
        xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if xs.shape != (self.n,) or ys.shape != (self.n,):
            raise ValueError("covariate and response must have n_rows entries")
        return whole(self.statistic(("x", "y")), {"x": xs, "y": ys})

    def solve(self, counts: NDArray[np.float64], sums: NDArray[np.float64]) -> NDArray[
        np.float64
    ]:
        """â, certified within SOLVE_TOLERANCE·Lκ/(nψ) of the exact minimiser (ℓ2)."""
        return self.solve_traced(counts, sums)[0]

    def solve_traced(self, counts: NDArray[np.float64], sums: NDArray[np.float64]
                     ) -> tuple[NDArray[np.float64], SolveWork]:
        """``solve`` and its work.

        The work is a function of public inputs (issue #27): exactly ``iterations`` Newton
        steps, each with a full backtracking line search for the logistic loss (all
        ``LINE_SEARCH`` step sizes tried), whatever the data. The first certified iterate is
        returned; the steps after it are computed on it and discarded, so the answer is
        the one an early exit would give. Not certified after ``iterations`` steps: a
        ``SolveError``, after the same work.
        """
        b = self.features
        psi = self.psi
        a = np.zeros(b.shape[1])
        found: NDArray[np.float64] | None = None
        evaluations, certified_at = 0, -1
        for k in range(self.iterations):
            grad, slack, hess = self._gradient(b, counts, sums, a)
            # ‖a − a*‖ <= ‖∇J(a)‖/(2ψ); the computed gradient errs by at most ``slack``
            certified = (float(np.linalg.norm(grad)) + slack) / (2.0 * psi) * (1.0 + 1e-6) <= (
                SOLVE_TOLERANCE * self.radius)
            if certified and found is None:
                found, certified_at = a, k
            step = np.linalg.solve(hess, grad)
            if self.loss == "logistic":  # damped Newton: the largest 2^-k with J decreasing
                base = self._objective(b, counts, sums, a)
                decreases = [self._objective(b, counts, sums, a - t * step) <= base
                             for t in LINE_SEARCH]
                evaluations += 1 + len(LINE_SEARCH)
                step = LINE_SEARCH[decreases.index(True)] * step if any(decreases) else (
                    LINE_SEARCH[-1] / 2.0 * step)
            if found is None:
                a = a - step
        if found is None:
            raise SolveError("the ERM minimiser did not reach the certified tolerance")
        return found, SolveWork(self.iterations, evaluations, certified_at)

    @property
    def iterations(self) -> int:
        """Newton steps of every solve (public: the loss only)."""
        return SQUARE_ITERATIONS if self.loss == "square" else LOGISTIC_ITERATIONS

    def _objective(self, b: NDArray[np.float64], counts: NDArray[np.float64],
                   sums: NDArray[np.float64], a: NDArray[np.float64]) -> float:
        """J(a) of the logistic loss (for the line search only)."""
        f = b @ a
        terms = sums * np.logaddexp(0.0, -f) + (counts - sums) * np.logaddexp(0.0, f)
        return float(terms.sum()) / self.n + self.psi * float(a @ a)

    def _gradient(self, b: NDArray[np.float64], counts: NDArray[np.float64],
                  sums: NDArray[np.float64], a: NDArray[np.float64]) -> tuple[
        NDArray[np.float64], float, NDArray[np.float64]
    ]:
        """∇J(a), a bound on its rounding error (ℓ2), and the Hessian ∇²J(a).

        J(a) = (1/n)Σ_k [loss terms at f_k = (Ba)_k] + ψ‖a‖². Each gradient entry
        is a sum of at most M + J + 4 products of terms bounded entrywise by
        |B|ᵀ(r_abs)/n + 2ψ|a|, so γ_{M+J+8} of that bounds its error (the
        transcendental functions of the logistic loss err by a few ulps, folded
        in as 8 more).
        """
        n, psi = float(self.n), self.psi
        f = b @ a
        if self.loss == "square":
            r = 2.0 * (counts * f - sums) / n  # d/df_k of (1/n)Σ (f_k − y_i)²
            r_abs = 2.0 * (counts * np.abs(f) + np.abs(sums)) / n
            curv = 2.0 * counts / n
        else:
            p = 0.5 * (1.0 + np.tanh(0.5 * f))  # σ(f), no overflow
            r = (counts * p - sums) / n
            r_abs = (counts * p + sums) / n
            curv = counts * p * (1.0 - p) / n
        grad = b.T @ r + 2.0 * psi * a
        scale = np.abs(b).T @ r_abs + 2.0 * psi * np.abs(a)
        m, j = b.shape
        gamma = (m + j + 16) * _U / (1.0 - (m + j + 16) * _U)
        slack = gamma * float(np.linalg.norm(scale))
        hess = (b.T * curv) @ b + 2.0 * psi * np.eye(j)
        return grad, slack, hess

    def summary(self, x: ArrayLike, y: ArrayLike) -> NDArray[np.float64]:
        """Non-private coefficients ĉ_j = λ_j^{η/2}·â_j."""
        return self.coefficients(self._pass(x, y))

    def release(self, x: ArrayLike, y: ArrayLike, rng: np.random.Generator) -> FunctionRelease:
        return self.publish(self.summary(x, y), rng)

    def publish(self, summary: NDArray[np.float64], rng: np.random.Generator
                ) -> FunctionRelease:
        """The release of non-private coefficients: noise, then the function they span."""
        coefficients = self.noise.release(summary, rng)
        values = self.eig.synthesize(coefficients) + self.centre
        return FunctionRelease(
            grid=self.grid,
            values=values,
            coefficients=coefficients,
            kernel=self.kernel_info(),
            smoothing=self.smoothing,
            extra={
                "basis": {"eigenvalues": self.eig.values},
                "response_shift": self.centre,
                "scale": "log-odds of y = 1" if self.loss == "logistic" else "response units",
            },
        )

    def kernel_info(self) -> dict[str, Any]:
        return {
            **self.eig.kernel.describe(),
            "domain": list(self.bounds),
            "length_units": "fraction of the covariate's declared range",
        }

    def accuracy(self) -> dict[str, Any]:
        nz = self.noise
        mse = nz.expected_sq_error()
        return {
            "noise": "ICLP-QR: discrete Laplace per eigen-coefficient on power-of-two lattices",
            "laplace_scales": "Delta*sqrt(lambda_j)/epsilon",
            "sensitivity": nz.sensitivity,
            "sensitivity_lattice": nz.lattice_sensitivity,
            "sensitivity_norm": "weighted_l1_K_C",
            "lipschitz": self.lip,
            "kappa": self.kappa,
            "sigma": nz.sigma,
            "expected_sq_l2_error": mse,
            "rmse": math.sqrt(mse),
            "band95": 1.96 * math.sqrt(mse),
            "kernel": self.kernel_info(),
            "smoothing": self.smoothing,
            "truncation": {"components": self.eig.size,
                           "grid_points": int(self.eig.positions.size)},
            "statement": (
                f"E||released - regularised ERM fit||^2 = {mse:.6g} (mean square over the"
                f" covariate's range, {'log-odds' if self.loss == 'logistic' else 'response'}"
                " units), the privacy error only. band95 is 1.96 x the RMS privacy error."
                + self._bias_statement()
            ),
        }


    def _bias_statement(self) -> str:
        """What the ridge penalty ψ costs against the unpenalised target (its bias)."""
        risk = self.smoothing.get("risk")
        if risk is None:
            return (f" The ridge penalty psi={self.psi:.3g} biases the fit towards 0: for a"
                    " target f of norm R in H_{C^eta} the squared shrinkage per"
                    f" eigen-direction is at most psi*R^2/4 = {self.psi / 4:.3g}*R^2; the"
                    " binning of the covariate to the grid is excluded.")
        if self.loss == "logistic":
            what = ("the log-odds towards 0: for a reference log-odds (a Matern(1.5, 0.1)"
                    f" Gaussian process of sd {risk['reference_sd']:g})")
            truth, whose = "true log-odds", "true log-odds'"
        else:
            what = ("the fit towards the response's midpoint: for a reference regression"
                    " function (a Matern(1.5, 0.1) Gaussian process of sd"
                    f" {risk['reference_sd']:.3g}, residual sd {risk['residual_sd']:.3g})")
            truth, whose = "regression function", "regression function's"
        return (f" The ridge penalty psi={self.psi:.3g} shrinks {what} it keeps"
                f" {risk['kept_share']:.0%} of its energy and the predicted E||released -"
                f" {truth}||^2 is {risk['total']:.3g} (ridge bias {risk['bias']:.3g}, sampling"
                f" {risk['sampling']:.3g}, privacy {risk['privacy']:.3g}); the actual bias"
                f" depends on the {whose} size and smoothness, and the binning of the"
                " covariate to the grid is excluded.")


def plan_iclp_erm(
    loss: Loss,
    covariate_bounds: tuple[float, float],
    response_bounds: tuple[float, float],
    n: int,
    epsilon: float | Fraction,
    grid_size: int = DEFAULT_GRID_SIZE,
    kernel: Kernel = DEFAULT_KERNEL,
    eta: float | None = None,
    psi: float | None = None,
    rel_floor: float = spectral.REL_FLOOR,
) -> ErmPlan:
    """Calibrate an ERM release. Defaults: Matérn(3/2, 0.1), η = 1 + 2/β, M = 100, and ψ
    minimising ``square_risk`` or ``logistic_risk`` (its reference risk)."""
    lo, hi = (float(v) for v in covariate_bounds)
    ylo, yhi = (float(v) for v in response_bounds)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError("covariate bounds must be finite with lower < upper")
    if not (math.isfinite(ylo) and math.isfinite(yhi) and ylo <= yhi):
        raise ValueError("response bounds must be finite with lower <= upper")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError("n must be a positive integer")
    if not (math.isfinite(float(epsilon)) and float(epsilon) > 0):
        raise ValueError("epsilon must be a finite number > 0")
    if n > MAX_ROWS:
        raise ValueError(f"ERM releases support at most {MAX_ROWS} rows")
    if grid_size < 3:
        raise ValueError("grid_size must be at least 3")
    if loss == "logistic":
        if not (ylo >= 0.0 and yhi <= 1.0):
            raise ValueError("the logistic loss needs a 0/1 response (bounds within [0, 1])")
        centre, bound = 0.0, 1.0
    else:
        centre, bound = 0.5 * (ylo + yhi), max(0.5 * (yhi - ylo), 2.0**-30)
    eta_rule = "given" if eta is not None else "auto"
    eta = pss.default_eta(kernel) if eta is None else float(eta)
    if not (math.isfinite(eta) and eta > 1.0):
        raise ValueError("eta must be > 1 for ERM functionals (spec §7.2)")
    eig = spectral.eigen_system(kernel, domain.uniform_grid(grid_size), None, rel_floor, None)
    # κ² = max_k Σ_j λ_j^η v_j(t_k)², rounded up (the sum errs by ≤ γ_J relatively)
    kappa = math.sqrt(float(np.max((eig.vectors**2) @ eig.values**eta))
                      * (1.0 + (eig.size + 4) * 2.0**-52)) * (1.0 + 2.0**-40)

    def delta(p: float) -> float:
        lip = lipschitz(loss, kappa, bound, p)
        return erm_sensitivity(eig.values, kappa, lip, n, eta, p)

    psi_rule = "given" if psi is not None else "min-risk"
    trace, eps2 = eig.trace, float(epsilon) ** 2
    share = mean.prior_share(eig)

    def unit_delta(p: float) -> float:
        return erm_sensitivity(eig.values, kappa, lipschitz(loss, kappa, 1.0, p), n, eta, p)

    def reference(p: float) -> dict[str, float]:
        """The reference risk at B = 1 (square loss: every term scales as B², no overflow)."""
        privacy = 2.0 * unit_delta(p) ** 2 * trace / eps2
        if loss == "logistic":
            return logistic_risk(eig, share, n, float(epsilon), eta, p, privacy)
        return square_risk(eig, share, n, eta, p, privacy)

    if psi is None:
        # ψ for error (issue #32): the worst-case bias ψB²/4 took the target to be tiny (a
        # logistic slope of 4 shrunk by 27-70 %, a square-loss error that rose with ε);
        # the reference risk is a(ψ)/ε² + b(ψ) on a fixed grid, so its minimum is
        # non-increasing in ε
        psi = min(PSI_GRID, key=lambda p: reference(p)["total"])
    psi = float(psi)
    if not (math.isfinite(psi) and psi > 0):
        raise ValueError("psi must be a finite number > 0")
    lip = lipschitz(loss, kappa, bound, psi)
    sens = delta(psi) * SENSITIVITY_SAFETY
    root = np.sqrt(eig.values)
    lam_half = eig.values ** (eta / 2.0)
    radius = lip * kappa / (n * psi)
    # |ĉ_j| <= λ_j^{η/2}·‖â‖ <= λ_j^{η/2}·√(J(0)/ψ); the certified solve adds ≤ tol·radius,
    # and multiplying by λ_j^{η/2} one rounding
    a_bound = (bound if loss == "square" else math.sqrt(math.log(2.0))) / math.sqrt(psi)
    error = lam_half * (SOLVE_TOLERANCE * radius + 4 * _U * (a_bound + radius))
    top = lam_half * (a_bound + radius)
    calibrated = noise.calibrate(root, sens, epsilon, error, top)
    smoothing: dict[str, Any] = {
        "method": "iclp-qr erm",
        "loss": loss,
        "eta": eta,
        "eta_rule": eta_rule,
        "psi": psi,
        "psi_rule": psi_rule,
        "penalty": "psi * ||f||^2 in H_{C^eta} (not psi/2)",
        "beta": kernel.beta,
        "components": eig.size,
        "grid_size": grid_size,
        "response_bound": bound,
    }
    if loss == "logistic":
        smoothing["risk"] = {**reference(psi), "reference_sd": LOGIT_REFERENCE_SD,
                             "criterion": (
            "min over psi of the exact privacy error + s^2*sum((1-F_j)^2 p_j) +"
            " sum(F_j^2)/(n*w), F_j = lambda_j^eta/(lambda_j^eta + 2 psi/w), for a reference"
            " log-odds ~ GP(0, s^2 Matern(1.5, 0.1)), w its mean logistic curvature")}
    else:
        unit = reference(psi)
        smoothing["risk"] = {
            **{k: v * bound * bound if k != "kept_share" else v for k, v in unit.items()},
            "reference_sd": SQUARE_REFERENCE_SD * bound,
            "residual_sd": SQUARE_RESIDUAL_SD * bound,
            "criterion": (
                "min over psi of the exact privacy error + s^2*sum((1-F_j)^2 p_j) +"
                " r^2*sum(F_j^2)/n, F_j = lambda_j^eta/(lambda_j^eta + psi), for a reference"
                f" regression function ~ GP(0, s^2 Matern(1.5, 0.1)), s = {SQUARE_REFERENCE_SD:g}B,"
                f" and residuals of sd r = {SQUARE_RESIDUAL_SD:g}B (B half the response range)")}
    return ErmPlan(loss, (lo, hi), centre, bound, eig, n, eta, psi, kappa, lip, calibrated,
                   smoothing)
