"""Integer noise samplers: exact distributions, tails, half-widths and the lattice.

Reference pmfs are recomputed here from their definitions (not from the module
under test) and every tolerance comes from the sampling error of the test
itself: chi-square p-values, or 4.5 binomial standard errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import sampling

N = 200_000
Z = 4.5  # two-sided standard-normal quantile for a per-check false alarm of ~7e-6


def _laplace_pmf(scale: float, k: np.ndarray) -> np.ndarray:
    p = math.exp(-1.0 / scale)
    return (1.0 - p) / (1.0 + p) * np.exp(-np.abs(k) / scale)


def _gaussian_pmf(sigma: float, k: np.ndarray) -> np.ndarray:
    support = np.arange(-math.ceil(40 * sigma) - 40, math.ceil(40 * sigma) + 41)
    z = np.exp(-(support.astype(float) ** 2) / (2 * sigma**2)).sum()
    return np.exp(-(k.astype(float) ** 2) / (2 * sigma**2)) / z


def _chisquare(draws: np.ndarray, pmf: np.ndarray, support: np.ndarray) -> float:
    """p-value against ``pmf`` on ``support``; each tail is pooled into its neighbour.

    The cells with expected count >= 5 form an interval (the pmfs are
    unimodal); everything outside it is added to the interval's end cells.
    """
    n = draws.size
    inside = pmf * n >= 5
    lo, hi = int(support[inside].min()), int(support[inside].max())
    assert hi > lo, "need at least two cells"
    expected = pmf[inside] * n
    expected[0] += pmf[support < lo].sum() * n
    expected[-1] += pmf[support > hi].sum() * n
    observed = np.bincount(np.clip(draws, lo, hi) - lo, minlength=hi - lo + 1)
    return float(stats.chisquare(observed, expected * n / expected.sum()).pvalue)


@pytest.mark.parametrize("scale", [0.3, 1.0, 2.5, 40.0])
def test_discrete_laplace_matches_exact_pmf(scale: float) -> None:
    draws = sampling.discrete_laplace(np.random.default_rng(11), scale, N)
    support = np.arange(-math.ceil(60 * scale) - 5, math.ceil(60 * scale) + 6)
    assert _chisquare(draws, _laplace_pmf(scale, support), support) > 1e-3


@pytest.mark.parametrize("sigma", [0.35, 0.8, 3.7, 40.0, 300.0])
def test_discrete_gaussian_matches_exact_pmf(sigma: float) -> None:
    draws = sampling.discrete_gaussian(np.random.default_rng(12), sigma, N)
    support = np.arange(-math.ceil(12 * sigma) - 5, math.ceil(12 * sigma) + 6)
    assert _chisquare(draws, _gaussian_pmf(sigma, support), support) > 1e-3


@pytest.mark.parametrize(
    "draw",
    [
        lambda rng: sampling.discrete_laplace(rng, 3.0, N),
        lambda rng: sampling.discrete_gaussian(rng, 3.0, N),
    ],
    ids=["laplace", "gaussian"],
)
def test_samplers_are_symmetric(draw: Callable[[np.random.Generator], np.ndarray]) -> None:
    x = draw(np.random.default_rng(13))
    positive, negative = np.count_nonzero(x > 0), np.count_nonzero(x < 0)
    assert stats.binomtest(positive, positive + negative).pvalue > 1e-3
    assert abs(x.mean()) <= Z * x.std() / math.sqrt(x.size)


def test_outputs_are_int64_of_the_requested_shape() -> None:
    rng = np.random.default_rng(14)
    for x in (
        sampling.discrete_laplace(rng, 2.0, (3, 4)),
        sampling.discrete_gaussian(rng, 2.0, (3, 4)),
        sampling.discrete_laplace(rng, 2.0, 0),
        sampling.discrete_gaussian(rng, 2.0, 7),
    ):
        assert x.dtype == np.int64
    assert sampling.discrete_laplace(rng, 2.0, (3, 4)).shape == (3, 4)
    assert sampling.discrete_gaussian(rng, 2.0, (2, 5)).shape == (2, 5)
    assert sampling.discrete_gaussian(rng, 2.0, 0).shape == (0,)
    # a vector of scales adds a trailing axis, one scale per coordinate
    assert sampling.discrete_laplace(rng, np.array([1.0, 2.0, 8.0]), (4, 5)).shape == (4, 5, 3)
    spread = sampling.discrete_laplace(rng, np.array([0.01, 1e6]), 2000)
    assert not spread[:, 0].any()  # scale 0.01: P(X != 0) = 2e-43
    assert np.std(spread[:, 1]) > 1e6


def test_float_draws_are_exact_integers() -> None:
    x = sampling.discrete_laplace_float(np.random.default_rng(16), 2.0**40, 100_000)
    assert x.dtype == np.float64 and np.array_equal(x, np.rint(x))
    assert np.array_equal(
        sampling.discrete_laplace_float(np.random.default_rng(17), 3.0, 1000),
        sampling.discrete_laplace(np.random.default_rng(17), 3.0, 1000),
    )


def test_extreme_scales_stay_sane() -> None:
    rng = np.random.default_rng(15)
    assert not sampling.discrete_laplace(rng, 1e-300, 1000).any()
    assert not sampling.discrete_gaussian(rng, 1e-300, 1000).any()
    huge = sampling.discrete_laplace(rng, sampling.MAX_SCALE, 10_000)
    assert np.all(np.abs(huge) < 2**53)
    assert np.std(huge) > sampling.MAX_SCALE  # sd is √2 · scale
    wide = sampling.discrete_gaussian(rng, sampling.MAX_SIGMA, 10_000)
    assert np.all(np.abs(wide) < 2**53)
    assert 0.9 < np.std(wide) / sampling.MAX_SIGMA < 1.1


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, 2 * sampling.MAX_SCALE])
def test_bad_scales_are_refused(bad: float) -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        sampling.discrete_laplace(rng, bad, 3)
    with pytest.raises(ValueError):
        sampling.discrete_gaussian(rng, bad, 3)
    with pytest.raises(ValueError):
        sampling.discrete_laplace(rng, np.array([1.0, bad]), 3)


def test_discrete_laplace_tail_formula() -> None:
    for scale in (0.4, 3.0, 250.0):
        k = np.arange(-math.ceil(80 * scale) - 5, math.ceil(80 * scale) + 6)
        pmf = _laplace_pmf(scale, k)
        for j in (0, 1, 2, 5, math.ceil(scale) + 1):
            assert sampling.discrete_laplace_tail(scale, j) == pytest.approx(
                pmf[np.abs(k) >= j].sum(), rel=1e-9
            )


@pytest.mark.parametrize("scale", [0.05, 0.7, 3.0, 33.3, 5000.0])
@pytest.mark.parametrize("level", [0.5, 0.95, 0.999])
def test_discrete_laplace_halfwidth_is_the_smallest(scale: float, level: float) -> None:
    k = sampling.discrete_laplace_halfwidth(scale, level)
    assert 1.0 - sampling.discrete_laplace_tail(scale, k + 1) >= level
    if k > 0:
        assert 1.0 - sampling.discrete_laplace_tail(scale, k) < level


@pytest.mark.parametrize("sigma", [0.3, 1.0, 5.5, 300.0, 4000.0, 5000.0, 60000.0])
def test_discrete_gaussian_halfwidth_is_the_smallest(sigma: float) -> None:
    k = sampling.discrete_gaussian_halfwidth(sigma, 0.95)
    if sigma <= 5000:
        support = np.arange(-k - 1, k + 2)
        central = _gaussian_pmf(sigma, support)
        assert central[1:-1].sum() >= 0.95
        assert central[2:-2].sum() < 0.95
    else:  # beyond brute force: the continuous quantile to within one unit
        assert abs(k - sigma * stats.norm.ppf(0.975)) <= 1.5


@pytest.mark.parametrize(
    ("draw", "halfwidth", "exact"),
    [
        (
            lambda rng: sampling.discrete_laplace(rng, 2.5, N),
            sampling.discrete_laplace_halfwidth(2.5),
            lambda k: 1 - sampling.discrete_laplace_tail(2.5, k + 1),
        ),
        (
            lambda rng: sampling.discrete_gaussian(rng, 2.5, N),
            sampling.discrete_gaussian_halfwidth(2.5),
            lambda k: _gaussian_pmf(2.5, np.arange(-k, k + 1)).sum(),
        ),
    ],
    ids=["laplace", "gaussian"],
)
def test_halfwidth_coverage_monte_carlo(
    draw: Callable[[np.random.Generator], np.ndarray],
    halfwidth: int,
    exact: Callable[[int], float],
) -> None:
    x = draw(np.random.default_rng(16))
    covered = np.count_nonzero(np.abs(x) <= halfwidth) / x.size
    p = exact(halfwidth)
    assert p >= 0.95
    assert abs(covered - p) <= Z * math.sqrt(p * (1 - p) / x.size)


@pytest.mark.parametrize("sigma", [0.25, 0.9, 7.0, 4000.0, 4100.0, 20000.0])
def test_discrete_gaussian_tail_bounds_contain_the_exact_tail(sigma: float) -> None:
    support = np.arange(-math.ceil(14 * sigma) - 20, math.ceil(14 * sigma) + 21)
    pmf = _gaussian_pmf(sigma, support)
    upper_tail = np.cumsum(pmf[::-1])[::-1]  # P(X >= support[i])
    points = (-3 * sigma, -1, 0, 1, 2, sigma / 2, sigma, 2.5 * sigma, 5 * sigma, 9 * sigma)
    for k in (math.floor(point) for point in points):
        lo, hi = sampling.discrete_gaussian_sf_bounds(sigma, k)
        exact = upper_tail[k - support[0]]
        tol = 1e-11 * exact  # the brute-force reference itself rounds
        assert lo - tol <= exact <= hi + tol
        assert hi - lo <= 1e-5 * exact + 1e-300


def test_normalizer_and_pmf() -> None:
    for sigma in (0.1, 0.6, 1.0, 2.0, 50.0):
        k = np.arange(-math.ceil(40 * sigma) - 5, math.ceil(40 * sigma) + 6)
        assert sampling.discrete_gaussian_pmf(sigma, k).sum() == pytest.approx(1.0, rel=1e-12)
        assert np.allclose(sampling.discrete_gaussian_pmf(sigma, k), _gaussian_pmf(sigma, k))


powers = st.integers(min_value=-40, max_value=40).map(lambda e: math.ldexp(1.0, e))
values = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)


@given(values, powers)
def test_snap_returns_exact_multiples_of_the_grid(x: float, grid: float) -> None:
    s = sampling.snap(x, grid)
    assert (s / grid).is_integer()
    assert abs(s - x) <= grid / 2
    assert sampling.snap(s, grid) == s


@given(st.lists(values, min_size=1, max_size=20), powers)
def test_snap_vectorized_matches_scalar(xs: list[float], grid: float) -> None:
    snapped = sampling.snap(np.array(xs), grid)
    assert snapped.tolist() == [sampling.snap(x, grid) for x in xs]


@given(st.floats(min_value=1e-200, max_value=1e200))
def test_grid_for_is_the_largest_power_of_two_below(scale: float) -> None:
    g = sampling.grid_for(scale)
    assert sampling.is_power_of_two(g)
    assert g <= scale / sampling.GRID_RESOLUTION < 2 * g


def test_snap_refuses_a_grid_that_is_not_a_power_of_two() -> None:
    with pytest.raises(ValueError):
        sampling.snap(1.0, 0.3)
    with pytest.raises(ValueError):
        sampling.grid_for(1.0, resolution=1000)


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=0.01, max_value=1e6), st.integers(min_value=0, max_value=2**31))
def test_discrete_laplace_is_integer_and_scaled(scale: float, seed: int) -> None:
    x = sampling.discrete_laplace(np.random.default_rng(seed), scale, 64)
    assert x.dtype == np.int64
    assert np.all(np.abs(x) <= 60 * scale + 60)
