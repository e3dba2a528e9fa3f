"""Interval privacy (Ding & Ding, IEEE TSP 2022) as a plain numpy/scipy library.

Each value Y is released as a random range that contains it, cut by anchors
drawn independently of Y; privacy is the coverage τ = E[P_Y(S_Z)] under a
declared prior, and leakage 1 − τ composes additively (Thm 4).

Notebook use::

    from mechanisms import interval
    prior = interval.make_prior({"family": "normal", "loc": 0, "scale": 1})
    mech = interval.IntervalMechanism(interval.Canonical(interval.AnchorDist("logistic", 0, 1)))
    interval.expected_coverage(mech, prior)            # τ ≈ 0.7605
    rel = mech.release(y, secure_generator())          # mechanisms.rng; anchors, then y's range
    fit = interval.npmle(rel.pieces)                   # or npmle_case1(u, delta)

Importing the package registers the service mechanisms ``interval.*``.
"""

from __future__ import annotations

from mechanisms.interval import registration as _registration  # noqa: F401  (registers)
from mechanisms.interval.anchors import AnchorDist, optimal, uniform
from mechanisms.interval.coverage import (
    Estimate,
    calibrate_increasing,
    calibrate_scale,
    case1_coverage,
    composed_leakage,
    ensemble_coverage,
    expected_coverage,
    monte_carlo_coverage,
    partition_coverage,
    ring_coverage,
    uniform_case1_coverage,
)
from mechanisms.interval.designs import (
    Canonical,
    IntervalMechanism,
    Progressive,
    Release,
    Ring,
    Selective,
    clean,
    pieces_from_table,
)
from mechanisms.interval.estimators import MeanEstimate, example2_mean, moments
from mechanisms.interval.npmle import (
    IntervalData,
    NPMLEResult,
    case1_pieces,
    npmle,
    npmle_case1,
    pava,
)
from mechanisms.interval.priors import Prior, column_prior, make_prior
from mechanisms.interval.ranges import Pieces, points
from mechanisms.interval.regression import (
    LeastSquares,
    RegressionResult,
    algorithm1,
    conditional_mean,
    interval_mle,
    sklearn_learner,
)
from mechanisms.interval.transforms import PushforwardLaw, Transform

__all__ = [
    "AnchorDist",
    "Canonical",
    "Estimate",
    "IntervalData",
    "IntervalMechanism",
    "LeastSquares",
    "MeanEstimate",
    "NPMLEResult",
    "Pieces",
    "Prior",
    "Progressive",
    "PushforwardLaw",
    "RegressionResult",
    "Release",
    "Ring",
    "Selective",
    "Transform",
    "algorithm1",
    "calibrate_increasing",
    "calibrate_scale",
    "case1_coverage",
    "case1_pieces",
    "clean",
    "column_prior",
    "composed_leakage",
    "conditional_mean",
    "ensemble_coverage",
    "example2_mean",
    "expected_coverage",
    "interval_mle",
    "make_prior",
    "moments",
    "monte_carlo_coverage",
    "npmle",
    "npmle_case1",
    "optimal",
    "partition_coverage",
    "pava",
    "pieces_from_table",
    "points",
    "ring_coverage",
    "sklearn_learner",
    "uniform",
    "uniform_case1_coverage",
]
