"""Lattice Laplace on coefficients: calibration, exact privacy loss, and the noise law.

Statistical checks: fixed seeds; a Kolmogorov–Smirnov statistic of N draws
exceeds 1.95/√N with probability 1e-3 under the null, and the lattice moves
the discrete CDF from the continuous Laplace CDF by at most one atom,
P(X = k) <= g/(2b)·(1 + g/b) for step g and scale b; moment checks use
4.5 standard errors estimated from the same draws.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import sampling
from mechanisms.iclp import kernels, noise, spectral

Z = 4.5
LAM = spectral.eigen_system(kernels.matern(1.5, 0.1), np.linspace(0, 1, 100)).values


def _plan(delta: float = 0.08, eps: float | Fraction = 1.0) -> noise.CoefficientNoise:
    return noise.calibrate(np.sqrt(LAM), delta, eps, np.full(LAM.size, 1e-15), np.ones(LAM.size))


def _is_pow2(x: np.ndarray) -> bool:
    mant, _ = np.frexp(x)
    return bool(np.all(mant == 0.5))


@pytest.mark.parametrize("eps", [Fraction(1, 100), Fraction(1), Fraction(50)])
def test_calibration_is_exact_and_tight(eps: Fraction) -> None:
    delta = 0.08
    nz = _plan(delta, eps)
    assert _is_pow2(nz.steps)
    pairs = zip(nz.steps, nz.shape, strict=True)
    slack = sum(Fraction(float(g)) / Fraction(float(a)) for g, a in pairs)
    slack += sum(2 * Fraction(1e-15) / Fraction(float(a)) for a in nz.shape)
    assert Fraction(nz.lattice_sensitivity) >= Fraction(delta) + slack
    assert nz.lattice_sensitivity <= delta * (1 + 2.0**-9)  # the lattice costs ~0.1%
    # s_j·g_j >= Δ_lat·a_j/ε, exactly
    for s, g, a in zip(nz.scales, nz.steps, nz.shape, strict=True):
        assert Fraction(float(s)) * Fraction(float(g)) >= (
            Fraction(nz.lattice_sensitivity) * Fraction(float(a)) / eps
        )
    np.testing.assert_allclose(nz.laplace_scales, nz.lattice_sensitivity * nz.shape / float(eps))


def test_epsilon_fraction_is_rounded_down() -> None:
    third = Fraction(1, 3)
    assert Fraction(_plan(eps=third).epsilon) <= third


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-0.2, 0.2), min_size=100, max_size=100),
    st.lists(st.floats(-1.0, 1.0), min_size=100, max_size=100),
    st.floats(1e-3, 50.0),
)
def test_lattice_loss_is_at_most_epsilon(base: list[float], direction: list[float],
                                         eps: float) -> None:
    """Any two coefficient vectors whose weighted-ℓ1 distance is <= Δ: loss <= ε exactly."""
    delta = 0.08
    nz = _plan(delta, eps)
    a = np.array(base)
    d = np.array(direction) * nz.shape
    norm = float(np.sum(np.abs(d) / nz.shape))
    if norm == 0:
        return
    b = a + d * (delta / norm) * (1 - 1e-12)
    assert nz.max_privacy_loss(nz.centre(a), nz.centre(b)) <= Fraction(nz.epsilon)


def test_sampled_privacy_loss_never_exceeds_epsilon() -> None:
    nz = _plan(0.08, 1.0)
    a = np.zeros(LAM.size)
    b = 0.08 * np.sqrt(LAM) * (np.arange(LAM.size) == 0)  # the whole budget on coefficient 1
    ka, kb = nz.centre(a), nz.centre(b)
    y = ka + nz.sample(np.random.default_rng(5), 10_000)
    loss = nz.privacy_loss(y, ka, kb)
    assert loss.max() <= nz.epsilon and (-loss).max() <= nz.epsilon
    assert loss.max() > 0.99 * nz.epsilon  # and it is attained (far tail of coefficient 1)


@pytest.mark.parametrize("j", range(5))
def test_coefficient_noise_is_laplace_with_the_stated_scale(j: int) -> None:
    nz = _plan(0.08, 1.0)
    n = 40_000
    draws = sampling.discrete_laplace(np.random.default_rng(100 + j), nz.scales[j:j + 1], n)[:, 0]
    x = draws * nz.steps[j]
    b = float(nz.laplace_scales[j])
    ks = stats.kstest(x, stats.laplace(scale=b).cdf)
    atom = nz.steps[j] / (2 * b) * (1 + nz.steps[j] / b)
    assert ks.statistic < 1.95 / math.sqrt(n) + atom
    var = x.var()
    assert abs(var - nz.variances()[j]) < Z * np.std(x**2) / math.sqrt(n)
    # unit-variance Z_j: the variance is σ²λ_j with σ = √2Δ_lat/ε (discrete: −g²/6)
    assert nz.variances()[j] == pytest.approx(nz.sigma**2 * LAM[j], rel=1e-6)
    kurt = stats.kurtosis(x)  # Laplace: 3; SE ≈ √(var of 4th moment)/… ≈ 0.11 at 40k → 4.5 SE
    assert abs(kurt - 3.0) < 0.9


def test_coefficients_are_uncorrelated_and_total_variance_matches() -> None:
    nz = _plan(0.08, 1.0)
    n = 20_000
    x = nz.sample(np.random.default_rng(9), n) * nz.steps
    corr = np.corrcoef(x[:, :6], rowvar=False)
    off = corr[~np.eye(6, dtype=bool)]
    assert np.max(np.abs(off)) < Z / math.sqrt(n)  # SE of a null correlation is 1/√n
    sq = np.sum(x * x, axis=1)
    assert abs(sq.mean() - nz.expected_sq_error()) < Z * sq.std() / math.sqrt(n)
    assert nz.expected_sq_error() == pytest.approx(
        noise.privacy_mse(nz.lattice_sensitivity, nz.epsilon, LAM), rel=1e-6
    )


def test_vector_scales_give_the_scalar_law() -> None:
    """A vector of scales (one per coefficient) draws the law of a scalar scale: compare pmfs."""
    rng = np.random.default_rng(11)
    n = 200_000
    ours = sampling.discrete_laplace(rng, np.array([0.7]), n)[:, 0]
    ref = sampling.discrete_laplace(np.random.default_rng(12), 0.7, n)
    for k in range(-2, 3):
        p = (1 - math.exp(-1 / 0.7)) / (1 + math.exp(-1 / 0.7)) * math.exp(-abs(k) / 0.7)
        se = math.sqrt(p * (1 - p) / n)
        assert abs(np.mean(ours == k) - p) < Z * se
        assert abs(np.mean(ref == k) - p) < Z * se
    var = noise.discrete_laplace_variance(np.array([0.7]))[0]
    assert abs(ours.var() - var) < Z * np.std(ours.astype(float) ** 2) / math.sqrt(n)


def test_release_is_on_the_lattice_and_reproducible() -> None:
    nz = _plan()
    c = np.random.default_rng(1).uniform(-0.5, 0.5, LAM.size)
    out = nz.release(c, np.random.default_rng(2))
    assert np.array_equal(out, nz.release(c, np.random.default_rng(2)))
    units = out / nz.steps
    assert np.array_equal(units, np.rint(units))


def test_coarse_lattice_when_coefficients_are_large() -> None:
    """A huge coefficient bound forces coarser steps; Δ_lat grows but stays exact."""
    nz = noise.calibrate(np.ones(3), 1e-12, 1.0, np.zeros(3), np.full(3, 1e6))
    assert np.all(1e6 / nz.steps <= noise.CENTRE_LIMIT)
    assert nz.lattice_sensitivity >= 1e-12 + float(np.sum(nz.steps))


@pytest.mark.parametrize("top", [2.0**106, 2.0**60, 1e6, 3.0 * 2.0**70])
def test_a_coefficient_at_its_bound_has_a_centre(top: float) -> None:
    """Catches the sweep's iclp.fos failure: a Gram entry equal to its bound 2^106
    (covariate bounds up to 2^53) landed exactly on CENTRE_LIMIT and the release failed
    after reading the data (charged, no output)."""
    error = top * 2.0**-40
    nz = noise.calibrate(np.ones(2), 1e-3, 1.0, np.full(2, error), np.full(2, top))
    centres = nz.centre(np.array([top + error, -(top + error)]))
    assert np.all(np.abs(centres) < noise.CENTRE_LIMIT)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.ones(3), 0.0, 1.0, 0.0, 1.0), "sensitivity"),
        ((np.ones(3), math.inf, 1.0, 0.0, 1.0), "sensitivity"),
        ((np.array([1.0, 0.0]), 1.0, 1.0, 0.0, 1.0), "shape"),
        ((np.ones(3), 1.0, 0.0, 0.0, 1.0), "epsilon"),
        ((np.ones(3), 1.0, 1e-12, 0.0, 1.0), "sampler's range"),
    ],
)
def test_calibration_refuses(args: tuple, message: str) -> None:
    with pytest.raises(noise.CalibrationError, match=message):
        noise.calibrate(*args)


def test_centre_refuses_out_of_range_coefficients() -> None:
    nz = _plan()
    with pytest.raises(ValueError, match="wrong length"):
        nz.centre(np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        nz.centre(np.full(LAM.size, np.nan))
    with pytest.raises(ValueError, match="calibrated bound"):
        nz.centre(np.full(LAM.size, 1e300))
