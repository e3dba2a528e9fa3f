"""ICLP: pure ε-DP functional summaries with an Independent Component Laplace Process.

Lin & Reimherr, "Pure Differential Privacy for Functional Summaries with a
Laplace-like Process" (spec: specs/iclp.md). Notebook use::

    from mechanisms import iclp
    plan = iclp.plan_iclp_mean(grid, tau=1.0, n=len(curves), epsilon=1.0)
    released = plan.release(curves, secure_generator())  # from mechanisms.rng
    released.values, plan.accuracy()["expected_sq_l2_error"]

Modules: ``kernels`` (Matérn, Gaussian, exponential), ``domain`` (grids,
quadrature, clipping), ``spectral`` (cached eigen-systems), ``noise``
(float-safe weighted-ℓ1 lattice Laplace), ``pss`` (privacy-safe tuning),
``mean`` (ICLP-QR and FRL means), ``kde`` (ICLP-QR densities),
``bernstein`` (Bernstein baseline), ``plot`` (plot data), ``entries``
(the registered mechanisms ``iclp.mean``, ``iclp.kde``, ``frl.mean``,
``bernstein.kde``; importing this package registers them).
"""

from __future__ import annotations

from mechanisms.iclp import entries
from mechanisms.iclp.bernstein import (
    BernsteinPlan,
    bernstein_basis,
    bernstein_kde,
    plan_bernstein_kde,
)
from mechanisms.iclp.domain import (
    clip_curves,
    curve_norms,
    quadrature_weights,
    unit_positions,
    validate_functional_meta,
)
from mechanisms.iclp.kde import KdePlan, bin_values, iclp_kde, kde_sensitivity, plan_iclp_kde
from mechanisms.iclp.kernels import Kernel, exponential, gaussian, matern
from mechanisms.iclp.mean import (
    MeanPlan,
    frl_mean,
    frl_sensitivity,
    iclp_mean,
    plan_frl_mean,
    plan_iclp_mean,
    qr_filter,
    qr_sensitivity,
    qr_worst_case,
)
from mechanisms.iclp.noise import CoefficientNoise, calibrate, privacy_mse
from mechanisms.iclp.plot import plot_data
from mechanisms.iclp.pss import balanced_psi, default_eta, free_psi, frl_components, kde_bandwidth
from mechanisms.iclp.release import FunctionRelease
from mechanisms.iclp.spectral import EigenSystem, eigen_system

__all__ = [
    "BernsteinPlan",
    "CoefficientNoise",
    "EigenSystem",
    "FunctionRelease",
    "KdePlan",
    "Kernel",
    "MeanPlan",
    "balanced_psi",
    "bernstein_basis",
    "bernstein_kde",
    "bin_values",
    "calibrate",
    "clip_curves",
    "curve_norms",
    "default_eta",
    "eigen_system",
    "entries",
    "exponential",
    "free_psi",
    "frl_components",
    "frl_mean",
    "frl_sensitivity",
    "gaussian",
    "iclp_kde",
    "iclp_mean",
    "kde_bandwidth",
    "kde_sensitivity",
    "matern",
    "plan_bernstein_kde",
    "plan_frl_mean",
    "plan_iclp_kde",
    "plan_iclp_mean",
    "plot_data",
    "privacy_mse",
    "qr_filter",
    "qr_sensitivity",
    "qr_worst_case",
    "quadrature_weights",
    "unit_positions",
    "validate_functional_meta",
]
