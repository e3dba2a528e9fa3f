"""Functionals of F from the NPMLE with a bootstrap interval (spec §3.5, Example 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms import interval
from mechanisms.interval import functionals
from mechanisms.interval.npmle import NPMLEResult

from .conftest import rng


def _toy() -> NPMLEResult:
    """Cells (−∞, 0], (1, 2], (3, ∞) with masses 0.2, 0.5, 0.3."""
    inf = math.inf
    return NPMLEResult(np.array([-inf, 1.0, 3.0]), np.array([0.0, 2.0, inf]),
                       np.array([0.2, 0.5, 0.3]), 0.0, 1, 0.0, True, "cnm", 10)


def test_values_are_exact_on_a_known_estimate() -> None:
    """Hand-computed answers under the right and midpoint conventions with support
    [−1, 5] (infinite ends placed at the support bound)."""
    res = _toy()
    specs = [{"type": "cdf", "t": 1.5}, {"type": "cdf", "t": 2.0},
             {"type": "probability", "low": 0.0, "high": 4.0},
             {"type": "truncated_mean"}, {"type": "truncated_mean", "low": 0.5},
             {"type": "truncated_mean", "low": 2.5, "high": 2.9},
             {"type": "quantile", "p": 0.5}, {"type": "quantile", "p": 0.2},
             {"type": "quantile", "p": 0.71}]
    right = functionals.values(res, specs, "right", (-1.0, 5.0))
    expected = [0.2, 0.7, 0.5, 0.2 * 0 + 0.5 * 2 + 0.3 * 5, (0.5 * 2 + 0.3 * 5) / 0.8,
                np.nan, 2.0, 0.0, 5.0]
    np.testing.assert_allclose(right, expected, rtol=1e-12)
    mid = functionals.values(res, specs[:4], "midpoint", (-1.0, 5.0))
    np.testing.assert_allclose(mid, [0.7, 0.7, 0.8, 0.2 * -0.5 + 0.5 * 1.5 + 0.3 * 4],
                               rtol=1e-12)
    # every NPMLE: F(1.5) is anywhere in [0.2, 0.7]; the median anywhere in (1, 2]
    assert functionals.identified_range(res, specs[0], (-1.0, 5.0)) == (0.2, 0.7)
    assert functionals.identified_range(res, specs[6], (-1.0, 5.0)) == (1.0, 2.0)
    assert functionals.identified_range(res, specs[2], (-1.0, 5.0)) is None


def test_weighted_refit_equals_the_duplicated_rows() -> None:
    """The bootstrap refits a resample as distinct rows with multiplicity weights: the
    same NPMLE (log-likelihood and masses) as fitting the duplicated rows."""
    g = rng(1)
    mech = interval.IntervalMechanism(
        interval.Canonical(interval.AnchorDist("logistic", 0.0, 1.0), 3))
    pieces = mech.release(g.normal(size=300), g).pieces
    rows = g.integers(0, 300, 300)
    dup = interval.npmle(pieces.take(rows))
    counts = np.bincount(rows, minlength=300)
    keep = np.nonzero(counts)[0]
    weighted = interval.npmle(pieces.take(keep), weights=counts[keep].astype(float))
    assert dup.converged and weighted.converged
    assert weighted.loglik == pytest.approx(dup.loglik, abs=1e-6)
    grid = np.linspace(-3, 3, 61)
    np.testing.assert_allclose(weighted.cdf(grid), dup.cdf(grid), atol=1e-4)


def test_bootstrap_interval_covers() -> None:
    """Y ~ Beta(2, 3), Case-I with U ~ U[0, 1], n = 200, B = 100, 60 repetitions: the 95 %
    percentile interval of the NPMLE mean (midpoint convention) covers 0.4 in at least
    51 of 60 (Binomial(60, 0.95) falls below that with probability < 0.5 %); F(0.4)
    too. A bootstrap that does not resample, or resamples anchors apart from answers,
    covers far less."""
    specs = [{"type": "truncated_mean"}, {"type": "cdf", "t": 0.4}]
    truth = [0.4, float(stats.beta(2, 3).cdf(0.4))]
    covered = np.zeros(2)
    widths = []
    for r in range(60):
        g = rng(100 + r)
        y = g.beta(2, 3, 200)
        u = g.random(200)
        d = (y <= u).astype(float)

        def fit(rows: np.ndarray | None, u: np.ndarray = u, d: np.ndarray = d
                ) -> NPMLEResult:
            return interval.npmle_case1(u if rows is None else u[rows],
                                        d if rows is None else d[rows])

        draws, failed = functionals.bootstrap(fit, 200, specs, 100, g, "midpoint", (0.0, 1.0))
        assert failed == 0
        cis = functionals.percentile_interval(draws, 0.95)
        for i, ci in enumerate(cis):
            assert ci is not None
            covered[i] += ci[0] <= truth[i] <= ci[1]
        widths.append(cis[0][1] - cis[0][0])  # type: ignore[index]
    assert covered[0] >= 51 and covered[1] >= 51
    # and not trivially wide: the Case-I mean's SE at n = 200 is ~0.03
    assert 0.05 < float(np.mean(widths)) < 0.25


def test_cramer_distance_exact_values() -> None:
    """Closed forms: a step at 0.5 against U[0, 1] gives 2·∫_0^{1/2} y² dy = 1/12 (Simpson
    is exact on quadratics); two steps give the area between them exactly; the integer
    grid sums squared differences at 0..3."""
    x, f = np.array([0.5]), np.array([1.0])
    uniform = functionals.cramer_distance(x, f, lambda y: np.clip(y, 0, 1), 0.0, 1.0)
    assert uniform == pytest.approx(1 / 12, rel=1e-12)
    ox, of = np.array([0.25, 0.75]), np.array([0.5, 1.0])

    def other(y: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(ox, y, side="right") - 1
        return np.where(idx >= 0, of[np.clip(idx, 0, None)], 0.0)

    # F̂ − F is −0.5 on [0.25, 0.5) and +0.5 on [0.5, 0.75), 0 elsewhere: 2 · 0.25 · 0.25
    assert functionals.cramer_distance(x, f, other, 0.0, 1.0, ox) == pytest.approx(0.125)
    grid = functionals.cramer_distance(x, f, lambda y: y / 3, 0.0, 3.0, integer_grid=True)
    assert grid == pytest.approx(0 + (1 - 1 / 3) ** 2 + (1 - 2 / 3) ** 2 + 0)
    with pytest.raises(ValueError, match="finite"):
        functionals.cramer_distance(x, f, other, 0.0, math.inf)


def test_table_iii_round_x_beats_round_1() -> None:
    """Table III's pattern on synthetic salaries (U[0, 150], n = 300, progressive
    uniform bisection, 3 rounds): over 20 seeds the ED of the final ranges' NPMLE is
    below the first answers' (the paper: 1.38 -> 0.71), and the coverage is (2/3)^h."""
    first, final, cover = [], [], []
    for seed in range(20):
        g = rng(500 + seed)
        y = g.uniform(0, 150, 300)
        design = interval.Progressive((0.0, 150.0), 3)
        rel = design.release(y, g)
        table = rel.table()
        u1 = np.asarray(table["anchor_1"])
        d1 = np.asarray(table["answer_1"], dtype=float)
        truth = lambda t: np.clip(t / 150, 0, 1)  # noqa: E731
        fit1 = interval.npmle_case1(u1, d1)
        fitx = interval.npmle(rel.pieces)
        first.append(functionals.cramer_distance(*functionals.step_cdf(fit1), truth, 0, 150))
        final.append(functionals.cramer_distance(*functionals.step_cdf(fitx), truth, 0, 150))
        lo, hi = rel.pieces.left[:, 0], rel.pieces.right[:, 0]
        cover.append(float(np.mean((hi - lo) / 150)))
    assert np.mean(final) < 0.8 * np.mean(first)
    assert np.mean(cover) == pytest.approx((2 / 3) ** 3, abs=0.01)
