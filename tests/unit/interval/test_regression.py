"""Algorithm 1 and the corrected conditional means (spec §7.5 item 9)."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from scipy import integrate, stats

from mechanisms import interval
from mechanisms.interval import regression

from .conftest import rng


def _linear_case1(seed: int, n: int = 200) -> tuple[np.ndarray, interval.Pieces]:
    """Sec IV-B: y = x + ε, x, ε ~ N(0,1); Case-I with U ~ Logistic(5)."""
    g = rng(seed)
    x = g.normal(size=n)
    y = x + g.normal(size=n)
    u = g.logistic(0, 5, n)
    return x, interval.case1_pieces(u, y <= u)


def test_algorithm1_converges_to_the_mle() -> None:
    """Squared loss + linear learner + Gaussian noise: Algorithm 1 is EM, so its fixed
    point is the MLE; a direct BFGS fit is the oracle."""
    for seed in range(3):
        x, pieces = _linear_case1(seed)
        fit = interval.algorithm1(x, pieces, interval.LeastSquares(1), tol=1e-10)
        assert fit.converged and fit.iterations > 20  # 20 iterations are not enough
        mle = interval.interval_mle(x, pieces)
        assert fit.learner.coef is not None
        assert np.max(np.abs(fit.learner.coef - mle)) < 1e-4
        assert np.all(np.diff(fit.history) >= -1e-9)  # EM never lowers the likelihood


def test_slope_over_seeds() -> None:
    """Mean β̂ over 100 seeds in [0.90, 1.08] (per-seed SD ≈ 0.25, SE of the mean 0.025)."""
    slopes = []
    for seed in range(100):
        x, pieces = _linear_case1(1000 + seed)
        fit = interval.algorithm1(x, pieces, interval.LeastSquares(1), tol=1e-8)
        assert fit.learner.coef is not None
        slopes.append(fit.learner.coef[1])
    assert 0.90 <= np.mean(slopes) <= 1.08


def test_polynomial_learner_and_case2() -> None:
    """Quadratic IV-B with a least-squares learner on [1, x, x²] and Case-II ranges."""
    g = rng(5)
    n = 2000
    x = g.normal(size=n)
    y = x**2 - 2 * x + 3 + g.normal(size=n)
    mech = interval.IntervalMechanism(interval.Canonical(interval.AnchorDist("logistic", 3, 5), 3))
    rel = mech.release(y, g)
    fit = interval.algorithm1(x, rel.pieces, interval.LeastSquares(2), tol=1e-8)
    assert fit.converged and fit.learner.coef is not None
    # n = 2000 with coverage ~0.8: coefficient SEs are ~0.05-0.1; 0.35 is > 3.5 SE
    assert np.allclose(fit.learner.coef, [3.0, -2.0, 1.0], atol=0.35)


def test_noise_scale_estimate_and_exact_values() -> None:
    g = rng(6)
    n = 3000
    x = g.normal(size=n)
    y = 1 + 2 * x + 1.5 * g.normal(size=n)
    mech = interval.IntervalMechanism(interval.Canonical(interval.AnchorDist("logistic", 1, 2),
                                                         3, (-1.0, 1.0)), exact_cells=(2,))
    rel = mech.release(y, g)
    fit = interval.algorithm1(x, rel.pieces, interval.LeastSquares(1), scale=None,
                              exact=rel.exact, tol=1e-9)
    assert fit.converged and fit.learner.coef is not None
    # SE of σ̂ with n = 3000 and partly exact data is ~0.03; 0.15 is 5 SE
    assert abs(fit.scale - 1.5) < 0.15
    assert np.allclose(fit.learner.coef, [1.0, 2.0], atol=0.15)
    with pytest.raises(ValueError, match="Gaussian"):
        interval.algorithm1(x, rel.pieces, interval.LeastSquares(1), "logistic", None)


@pytest.mark.parametrize("c", [-3.0, 0.0, 1.5, 10.0, -10.0])
def test_logistic_conditional_mean_matches_quadrature(c: float) -> None:
    pdf = stats.logistic.pdf
    lower = integrate.quad(lambda t: t * pdf(t), -np.inf, c, epsabs=1e-13)[0]
    upper = integrate.quad(lambda t: t * pdf(t), c, np.inf, epsabs=1e-13)[0]
    assert interval.conditional_mean(-np.inf, c, "logistic") == pytest.approx(
        lower / stats.logistic.cdf(c), abs=1e-8)
    assert interval.conditional_mean(c, np.inf, "logistic") == pytest.approx(
        upper / stats.logistic.sf(c), abs=1e-8)
    inner = integrate.quad(lambda t: t * pdf(t), c - 1, c + 2, epsabs=1e-13)[0]
    mass = stats.logistic.cdf(c + 2) - stats.logistic.cdf(c - 1)
    assert interval.conditional_mean(c - 1, c + 2, "logistic") == pytest.approx(
        inner / mass, abs=1e-8)


def test_corrected_formula_28() -> None:
    """E[ε | ε > 0] = 2 ln 2 for the standard logistic (the paper's (28) gives 3.386)."""
    assert interval.conditional_mean(0.0, np.inf, "logistic") == pytest.approx(2 * math.log(2),
                                                                               abs=1e-12)
    # scale s multiplies the mean (s is the logistic scale, not the SD: erratum 5)
    assert interval.conditional_mean(0.0, np.inf, "logistic", 3.0) == pytest.approx(
        6 * math.log(2), abs=1e-12)


def test_extreme_cut_points_are_finite_and_asymptotic() -> None:
    for c in (-40.0, -20.0, 40.0):
        low = float(interval.conditional_mean(-np.inf, c, "logistic"))
        high = float(interval.conditional_mean(c, np.inf, "logistic"))
        with localcontext() as ctx:  # G(c) = −H(F(c)) with 50 significant digits
            ctx.prec = 50
            f = 1 / (1 + (-Decimal(c)).exp())
            h = -(f * f.ln() + (1 - f) * (1 - f).ln())
            exact_low, exact_high = float(-h / f), float(h / (1 - f))
        assert low == pytest.approx(exact_low, abs=1e-8)
        assert high == pytest.approx(exact_high, abs=1e-8)
    assert interval.conditional_mean(-np.inf, -40.0, "logistic") == pytest.approx(-41.0, abs=1e-9)
    assert interval.conditional_mean(40.0, np.inf, "logistic") == pytest.approx(41.0, abs=1e-9)
    # Gaussian tails agree with scipy's truncated normal
    for a, b in [(-40.0, -39.0), (8.0, np.inf), (-np.inf, -30.0), (2.0, 2.5)]:
        assert interval.conditional_mean(a, b) == pytest.approx(stats.truncnorm.mean(a, b),
                                                                abs=1e-9)
    grid = np.linspace(-800, 800, 4001)
    values = interval.conditional_mean(grid, grid + 0.5, "logistic")
    assert np.all(np.isfinite(values)) and np.all((values > grid) & (values <= grid + 0.5))
    values = interval.conditional_mean(grid, grid + 0.5)
    assert np.all(np.isfinite(values)) and np.all((values > grid) & (values <= grid + 0.5))


def test_learners() -> None:
    x = rng(7).normal(size=(50, 2))
    design = regression.polynomial_features(x, 2)
    assert design.shape == (50, 6)
    names = interval.LeastSquares(2).term_names(["a", "b"])
    assert names == ["1", "a", "b", "a*a", "a*b", "b*b"]
    if regression.sklearn_available():  # not a dependency: only named regressors load
        assert hasattr(interval.sklearn_learner("LinearRegression"), "fit")
        with pytest.raises(ValueError):
            interval.sklearn_learner("KMeans")
    else:
        with pytest.raises(ValueError, match="not installed"):
            interval.sklearn_learner("RandomForestRegressor")
