"""Tolerances from sampling error, shared by the subset tests.

Every Monte Carlo check compares an estimate with its target within ``z``
standard errors, where ``z`` is the two-sided normal quantile for a family
false-alarm rate of ``FAMILY_ALPHA`` split (Bonferroni) over the ``k``
comparisons the test makes. With fixed seeds the tests are deterministic;
the rate says how unlucky a seed would have to be to fail a correct
implementation.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

FAMILY_ALPHA = 1e-3


def z_for(k: int = 1, family_alpha: float = FAMILY_ALPHA) -> float:
    """Two-sided normal quantile for ``k`` simultaneous comparisons."""
    return float(stats.norm.isf(family_alpha / (2 * k)))


def assert_close(estimate: ArrayLike, target: ArrayLike, se: ArrayLike, k: int | None = None
                 ) -> None:
    """|estimate − target| ≤ z·se elementwise, z Bonferroni-adjusted over the elements."""
    est, tgt, err = (np.atleast_1d(np.asarray(v, float)) for v in (estimate, target, se))
    z = z_for(k if k is not None else est.size)
    gap = np.abs(est - tgt)
    assert np.all(gap <= z * err), f"gap {gap} exceeds {z:.2f} x se {err}"


def gof_p_value(observed: ArrayLike, probabilities: ArrayLike) -> float:
    """Pearson goodness-of-fit p-value of counts against cell probabilities."""
    obs = np.asarray(observed, float)
    expected = np.asarray(probabilities, float) * obs.sum()
    return float(stats.chisquare(obs, expected).pvalue)
