"""Parametric MLE from released ranges (spec §3.2): score, recovery, SEs, truncation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms import interval
from mechanisms.interval import parametric
from mechanisms.interval.parametric import _Likelihood

from .conftest import rng


def _case2(y: np.ndarray, loc: float, scale: float, seed: int,
           support: tuple[float, float] = (-np.inf, np.inf)) -> tuple[np.ndarray, np.ndarray]:
    mech = interval.IntervalMechanism(
        interval.Canonical(interval.AnchorDist("logistic", loc, scale), 3), support=support)
    rel = mech.release(y, rng(seed))
    return rel.pieces.half_open()


@pytest.mark.parametrize("family", ["normal", "logistic"])
def test_score_is_the_gradient_of_the_loglik(family: str) -> None:
    """The analytic score (ranges, ring pieces, exact values, truncation) equals central
    differences of the log-likelihood: a wrong sign or term in any branch fails."""
    g = rng(0)
    left = np.array([[-np.inf, np.nan], [-0.3, np.nan], [0.4, np.inf], [-2.0, 1.0]])
    right = np.array([[0.2, np.nan], [1.1, np.nan], [0.9, np.inf], [-1.0, np.inf]])
    right[2, 1] = np.nan
    left[2, 1] = np.nan
    exact = g.normal(size=3)
    like = _Likelihood(left, right, exact, (-3.0, 4.0), family)
    theta = np.array([0.3, -0.2])
    _, score = like.value_and_score(theta)
    for i in range(2):
        e = np.zeros(2)
        e[i] = 1e-6
        num = (like.value_and_score(theta + e)[0] - like.value_and_score(theta - e)[0]) / 2e-6
        assert score[i] == pytest.approx(num, rel=1e-6, abs=1e-7)


def test_extreme_ranges_stay_finite() -> None:
    """Ranges 40 SDs out (log-space masses): the fit is finite, no 0/0."""
    left = np.array([[40.0], [-np.inf], [-1.0]])
    right = np.array([[np.inf], [-39.0], [1.0]])
    like = _Likelihood(left, right, np.array([]), (-np.inf, np.inf), "normal")
    ll, score = like.value_and_score(np.zeros(2))
    assert math.isfinite(ll) and np.all(np.isfinite(score))
    assert ll < -700  # log Φ(−40) ≈ −804: the tail terms are not rounded to 0


@pytest.mark.parametrize(("family", "draw"), [
    ("normal", lambda g, n: g.normal(3.0, 2.0, n)),
    ("logistic", lambda g, n: g.logistic(3.0, 2.0, n)),
])
def test_recovers_parameters_within_four_ses(family: str, draw: object) -> None:
    """Case-II ranges of n = 4000 draws: |θ̂ − θ| < 4·SE for loc and scale (a 6e-5 false
    alarm each under normality of the MLE)."""
    g = rng(1)
    y = draw(g, 4000)  # type: ignore[operator]
    lo, hi = _case2(y, 3.0, 2.0, 2)
    res = parametric.fit(lo, hi, family=family)
    assert res.converged and not res.warnings
    assert abs(res.params["loc"] - 3.0) < 4 * res.se["loc"]
    assert abs(res.params["scale"] - 2.0) < 4 * res.se["scale"]
    assert 0.02 < res.se["loc"] < 0.2  # ~ 2/sqrt(4000 · information share)


def test_ses_match_the_spread_across_seeds() -> None:
    """Across R = 150 seeds (n = 400, Case-II normal), the SD of θ̂ matches the mean
    reported SE: the SD's relative sampling error is 1/sqrt(2R) = 5.8 %, so ±25 % is a
    4-sigma band; an SE off by a factor (e.g. the Hessian of the wrong sign convention,
    or no delta method for the scale) fails."""
    locs, scales, se_loc, se_scale = [], [], [], []
    for seed in range(150):
        g = rng(1000 + seed)
        y = g.normal(1.0, 0.5, 400)
        lo, hi = _case2(y, 1.0, 0.5, 5000 + seed)
        res = parametric.fit(lo, hi, family="normal")
        assert res.converged
        locs.append(res.params["loc"])
        scales.append(res.params["scale"])
        se_loc.append(res.se["loc"])
        se_scale.append(res.se["scale"])
    assert np.std(locs, ddof=1) / np.mean(se_loc) == pytest.approx(1.0, abs=0.25)
    assert np.std(scales, ddof=1) / np.mean(se_scale) == pytest.approx(1.0, abs=0.25)
    # and unbiased to within 4 standard errors of the mean over seeds
    assert abs(np.mean(locs) - 1.0) < 4 * np.std(locs) / math.sqrt(150)


def test_case1_fig5_logistic() -> None:
    """Fig 5 (left): Y ~ Logistic(0, 1), Case-I with U ~ Logistic(0, 2), n = 1000; the
    logistic MLE from (u, δ) alone lies within 4 SE of (0, 1)."""
    g = rng(3)
    y = g.logistic(0, 1, 1000)
    u = g.logistic(0, 2, 1000)
    d = y <= u
    res = parametric.fit(np.where(d, -np.inf, u)[:, None], np.where(d, u, np.inf)[:, None],
                         family="logistic")
    assert abs(res.params["loc"]) < 4 * res.se["loc"]
    assert abs(res.params["scale"] - 1) < 4 * res.se["scale"]


def test_truncation_to_the_declared_support() -> None:
    """A truncated normal on [−1, 4] released with ranges cut at the bounds: the fit
    truncated to the support recovers (loc, scale) within 4 SE, while ignoring the
    truncation is biased well beyond that (what the truncation term fixes)."""
    g = rng(4)
    y = stats.truncnorm.rvs(-2, 3, loc=1.0, scale=1.0, size=6000, random_state=g)
    lo, hi = _case2(y, 1.0, 1.0, 6, support=(-1.0, 4.0))
    assert np.nanmin(lo) >= -1.0 - 1e-12
    res = parametric.fit(lo, hi, family="normal", support=(-1.0, 4.0))
    assert abs(res.params["loc"] - 1.0) < 4 * res.se["loc"]
    assert abs(res.params["scale"] - 1.0) < 4 * res.se["scale"]
    naive = parametric.fit(lo, hi, family="normal")
    assert abs(naive.params["scale"] - 1.0) > 8 * naive.se["scale"]


def test_exact_reports_and_lognormal() -> None:
    """Exact values alone: the normal MLE is the sample mean and the ML (ddof = 0) SD, and
    the observed-information SEs are σ/√n and σ/√(2n) exactly; lognormal equals normal on
    log y, with the Jacobian in the log-likelihood."""
    g = rng(5)
    y = g.lognormal(1.0, 0.5, 500)
    empty = np.zeros((0, 1))
    res = parametric.fit(empty, empty, exact=np.log(y), family="normal")
    s = np.std(np.log(y))
    assert res.params["loc"] == pytest.approx(np.mean(np.log(y)), abs=1e-6)
    assert res.params["scale"] == pytest.approx(s, rel=1e-6)
    assert res.se["loc"] == pytest.approx(s / math.sqrt(500), rel=1e-4)
    assert res.se["scale"] == pytest.approx(s / math.sqrt(1000), rel=1e-4)
    logn = parametric.fit(empty, empty, exact=y, family="lognormal", support=(0, np.inf))
    assert logn.params["meanlog"] == pytest.approx(res.params["loc"], abs=1e-6)
    assert logn.loglik == pytest.approx(
        float(np.sum(stats.lognorm.logpdf(y, s, scale=math.exp(np.mean(np.log(y)))))),
        abs=1e-6)
    with pytest.raises(ValueError, match="lognormal"):
        parametric.fit(empty, empty, exact=-y, family="lognormal")


def test_unidentified_scale_is_reported() -> None:
    """Every range is (−∞, 0]: no finite MLE; the fit says so instead of a number."""
    left = np.full((50, 1), -np.inf)
    right = np.zeros((50, 1))
    res = parametric.fit(left, right, family="normal", max_iter=50)
    assert res.warnings and not res.converged
    assert all(v is None for v in res.summary()["se"].values())  # JSON: no inf
