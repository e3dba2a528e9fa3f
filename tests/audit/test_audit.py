"""The statistics of ``mechanisms.audit``: Clopper–Pearson bounds and the split-half bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms.audit import (
    audit,
    certified_epsilon,
    clopper_pearson_lower,
    clopper_pearson_upper,
    select_event,
)


def test_clopper_pearson_bounds_have_their_closed_forms_at_the_edges() -> None:
    n, alpha = 1000, 0.01
    assert clopper_pearson_lower(0, n, alpha) == 0.0
    assert clopper_pearson_upper(n, n, alpha) == 1.0
    # P(0 hits | p) = (1 - p)^n = alpha at the upper bound; P(n hits | p) = p^n at the lower
    assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-9)
    assert clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-9)


def test_clopper_pearson_bounds_invert_the_binomial_tails() -> None:
    n, k, alpha = 500, 137, 0.005
    lo, hi = float(clopper_pearson_lower(k, n, alpha)), float(clopper_pearson_upper(k, n, alpha))
    assert stats.binom.sf(k - 1, n, lo) == pytest.approx(alpha, rel=1e-6)  # P(X >= k | lo)
    assert stats.binom.cdf(k, n, hi) == pytest.approx(alpha, rel=1e-6)  # P(X <= k | hi)


def test_delta_is_subtracted_from_the_numerator() -> None:
    plain = float(certified_epsilon(400, 1000, 100, 1000))
    with_delta = float(certified_epsilon(400, 1000, 100, 1000, delta=0.05))
    p_lo = float(clopper_pearson_lower(400, 1000, 0.0005))
    p_hi = float(clopper_pearson_upper(100, 1000, 0.0005))
    assert plain == pytest.approx(math.log(p_lo / p_hi))
    assert with_delta == pytest.approx(math.log((p_lo - 0.05) / p_hi))
    assert certified_epsilon(10, 1000, 1, 1000, delta=0.5) == -math.inf


def test_identical_laws_certify_nothing_although_selection_is_optimistic() -> None:
    """The split half is what keeps the bound honest: choosing the best of ~2000 events on
    the runs that certify it would overstate a loss that is zero."""
    selected, certified = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        a, b = rng.laplace(size=4000), rng.laplace(size=4000)
        selected.append(select_event(a, b, alpha=0.5)[1])  # no confidence: the plug-in best
        certified.append(audit(a, b).epsilon_lb)
    assert max(selected) > 0.05
    assert max(certified) <= 0.0


def test_a_known_loss_is_certified_closely_from_below() -> None:
    """Laplace(0, 1) against Laplace(1, 1) is exactly 1-DP, attained by {x >= 1}."""
    rng = np.random.default_rng(7)
    a, b = rng.laplace(1.0, 1.0, 40_000), rng.laplace(0.0, 1.0, 40_000)
    result = audit(a, b)
    assert 0.9 < result.epsilon_lb <= 1.0
    assert math.isinf(result.event.lo) != math.isinf(result.event.hi)  # a half-line
    assert result.runs == (20_000, 20_000)
    # the test half's hits reproduce the bound
    assert result.epsilon_lb == pytest.approx(math.log(result.p_lo / result.p_hi))


def test_the_direction_is_found_both_ways() -> None:
    """P(1) = 1/2 against 1/(2e): the loss is 1 on {1} one way, only log(1.63) on {0}."""
    rng = np.random.default_rng(8)
    a = (rng.random(20_000) < 0.5).astype(float)
    b = (rng.random(20_000) < 0.5 / math.e).astype(float)
    for x, y, forward in ((a, b, True), (b, a, False)):
        result = audit(x, y)
        assert result.event.forward is forward
        assert result.event.lo <= 1.0 < result.event.hi
        assert 0.85 < result.epsilon_lb <= 1.0


def test_too_few_runs_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        audit([0.0, 1.0], [0.0, 1.0, 2.0, 3.0])
