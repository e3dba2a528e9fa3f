"""Distribution-invariant differential privacy (DIP; Bi & Shen, J. Econometrics 2023).

Pure ε-DP privatized microdata whose distribution equals a reference F: each
record's values are mapped to uniforms through F (the Rosenblatt chain for
several columns), perturbed with exact discrete Laplace noise, and mapped
back through F. Notebook use::

    from mechanisms import dip
    from scipy import stats
    rng = secure_generator()  # from mechanisms.rng: AES-CTR keyed from OS entropy
    # a public F: the output is an exact F-sample, for any epsilon
    out = dip.privatize_univariate(z, dip.ParametricContinuous(stats.gamma(2.0)), 1.0, rng)
    # several columns: the sequential chain, epsilon/p per column
    ref = dip.Gaussian(["a", "b"], mean=[0, 0], cov=[[1, 0.5], [0.5, 1]])
    out = dip.privatize({"a": a, "b": b}, ref, 2.0, rng, order=["b", "a"])
    # unknown F: a DP histogram of the data (spend part of the budget) or a sample
    ref = dip.dp_histogram({"x": x}, {"x": dip.Continuous(0, 1)}, {"x": 32}, 0.5, rng)
    out = dip.privatize({"x": x}, ref, 0.5, rng)

Importing this package registers the ``dip`` service mechanism. The method
is the subject of US patent US12248613B2 (Bi and Shen, Regents of the
University of Minnesota).
"""

from __future__ import annotations

from mechanisms.dip.accuracy import rank_correlation, rank_correlation_at_scale
from mechanisms.dip.audit import (
    max_privacy_loss,
    pit_intervals,
    transition_matrix_continuous,
    transition_matrix_discrete,
)
from mechanisms.dip.chain import privatize, privatize_univariate
from mechanisms.dip.continualize import (
    Continualizer,
    Continuous,
    FiniteSupport,
    Lattice,
    Mixed,
)
from mechanisms.dip.empirical import Empirical, holdout_size, split_holdout
from mechanisms.dip.g import g_cdf, g_pdf, g_ppf, g_sf, gk_cdf, gk_pmf, gk_sf
from mechanisms.dip.histogram import Histogram, dp_histogram, project_simplex
from mechanisms.dip.mechanism import DipMechanism
from mechanisms.dip.noise import DEFAULT_RESOLUTION, NoiseStep, privatize_uniform
from mechanisms.dip.reference import Gaussian, Product, Reference
from mechanisms.dip.univariate import (
    FinitePMF,
    Mixture,
    Normal,
    ParametricContinuous,
    ParametricDiscrete,
    PiecewiseLinear,
    Univariate,
)
from mechanisms.registry import register

mechanism = register(DipMechanism())

__all__ = [
    "DEFAULT_RESOLUTION",
    "Continualizer",
    "Continuous",
    "DipMechanism",
    "Empirical",
    "FinitePMF",
    "FiniteSupport",
    "Gaussian",
    "Histogram",
    "Lattice",
    "Mixed",
    "Mixture",
    "NoiseStep",
    "Normal",
    "ParametricContinuous",
    "ParametricDiscrete",
    "PiecewiseLinear",
    "Product",
    "Reference",
    "Univariate",
    "dp_histogram",
    "g_cdf",
    "g_pdf",
    "g_ppf",
    "g_sf",
    "gk_cdf",
    "gk_pmf",
    "gk_sf",
    "holdout_size",
    "max_privacy_loss",
    "mechanism",
    "pit_intervals",
    "privatize",
    "privatize_uniform",
    "privatize_univariate",
    "project_simplex",
    "rank_correlation",
    "rank_correlation_at_scale",
    "split_holdout",
    "transition_matrix_continuous",
    "transition_matrix_discrete",
]
