"""G (Unif + Laplace CDF) and G_K (its discrete analogue): closed forms, stability, inverses.

Monte Carlo tolerances come from the DKW inequality: with n draws,
P(sup |F_n − F| > t) <= 2 exp(−2 n t²), so t = sqrt(log(2/δ)/(2n)) bounds the
error of the empirical CDF everywhere with probability 1 − δ (δ = 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.dip import g_cdf, g_pdf, g_ppf, g_sf, gk_cdf, gk_pmf, gk_sf

SCALES = [1e-3, 1e-2, 0.25, 1.0, 4.0, 250.0, 1e6]
DKW_DELTA = 1e-6

log_scales = st.floats(min_value=-3.0, max_value=6.0).map(lambda e: 10.0**e)
xs = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False)


def _dkw(n: int) -> float:
    return math.sqrt(math.log(2.0 / DKW_DELTA) / (2.0 * n))


@pytest.mark.parametrize("b", [0.01, 0.25, 1.0, 4.0, 250.0])
def test_g_matches_monte_carlo(b: float) -> None:
    n = 400_000
    rng = np.random.default_rng(7)
    w = rng.random(n) + rng.laplace(0.0, b, n)  # float Laplace is fine for checking G
    grid = np.quantile(w, np.linspace(0.001, 0.999, 81))
    empirical = np.searchsorted(np.sort(w), grid, side="right") / n
    assert np.max(np.abs(empirical - g_cdf(grid, b))) < _dkw(n)


@pytest.mark.parametrize("b", SCALES)
def test_g_is_finite_monotone_and_symmetric_across_scales(b: float) -> None:
    x = np.concatenate([np.linspace(-1e4, 1e4, 2001), np.linspace(-3, 4, 7001)])
    x.sort()
    cdf, sf = g_cdf(x, b), g_sf(x, b)
    for values in (cdf, sf, g_pdf(x, b)):
        assert np.all(np.isfinite(values))
    assert np.all((cdf >= 0) & (cdf <= 1))
    assert np.all(np.diff(cdf) >= 0)
    assert np.all(np.diff(sf) <= 0)
    # the symmetry G(x) + G(1 − x) = 1 holds to one rounding of 1 − G
    assert np.max(np.abs(cdf + g_cdf(1.0 - x, b) - 1.0)) <= 2.3e-16
    assert np.max(np.abs(cdf + sf - 1.0)) <= 2.3e-16
    assert g_cdf(-1e4, b)[()] <= 0.5 and g_cdf(1e4, b)[()] >= 0.5


@settings(max_examples=200, deadline=None)
@given(x=xs, b=log_scales)
def test_g_symmetry_and_range(x: float, b: float) -> None:
    value = float(g_cdf(x, b))
    assert 0.0 <= value <= 1.0
    assert abs(value + float(g_cdf(1.0 - x, b)) - 1.0) <= 2.3e-16
    # 1 − G(x) = G(1 − x) up to the rounding of 1 − x
    assert float(g_sf(x, b)) == pytest.approx(float(g_cdf(1.0 - x, b)), rel=1e-15, abs=1e-16)


def test_g_tails_keep_relative_precision() -> None:
    # exact tails: G(x) = (b/2) e^{x/b}(1 − e^{−1/b}) for x < 0, mirrored for x > 1
    for b in (0.01, 1.0, 50.0):
        c = -math.expm1(-1.0 / b)
        for x in (-0.5, -3.0, -20.0):
            exact = 0.5 * b * math.exp(x / b) * c
            if exact > 1e-300:
                assert float(g_cdf(x, b)) == pytest.approx(exact, rel=1e-13)
                assert float(g_sf(1.0 - x, b)) == pytest.approx(exact, rel=1e-13)


def test_g_large_scale_tends_to_half_and_small_scale_to_identity() -> None:
    x = np.linspace(0.0, 1.0, 11)
    assert np.max(np.abs(g_cdf(x, 1e6) - 0.5)) < 1e-6
    # b -> 0: U + e -> U, so G(x) -> x on [0, 1] (error about b/2 at the ends)
    assert np.max(np.abs(g_cdf(x, 1e-3) - x)) <= 5e-4 + 1e-12


@pytest.mark.parametrize("b", [1e-3, 0.3, 1.0, 20.0, 1e4])
def test_g_pdf_is_the_derivative(b: float) -> None:
    x = np.linspace(-2.0, 3.0, 501)
    step = 1e-6 * max(b, 1e-2)
    numeric = (g_cdf(x + step, b) - g_cdf(x - step, b)) / (2.0 * step)
    assert np.max(np.abs(numeric - g_pdf(x, b))) <= 1e-6 * np.max(g_pdf(x, b)) + 1e-9


@settings(max_examples=60, deadline=None)
@given(y=st.floats(min_value=1e-12, max_value=1.0 - 1e-12), b=log_scales.filter(lambda v: v < 1e5))
def test_g_ppf_inverts_g(y: float, b: float) -> None:
    x = g_ppf(np.array([y]), b)
    assert float(g_cdf(x, b)[0]) == pytest.approx(y, rel=1e-9, abs=1e-15)


def _gk_brute(w: int, k: int, a: float) -> float:
    """(1/K) Σ_{j=w−K}^{w−1} S(j) with S the CDF of P(D = d) ∝ e^{−a|d|}."""
    alpha = math.exp(-a)

    def s(j: int) -> float:
        if j < 0:
            return alpha ** (-j) / (1.0 + alpha)
        return 1.0 - alpha ** (j + 1) / (1.0 + alpha)

    return math.fsum(s(j) for j in range(w - k, w)) / k


@pytest.mark.parametrize(("k", "a"), [(1, 0.7), (2, 0.01), (16, 0.5), (64, 3.0), (64, 0.002)])
def test_gk_closed_form_matches_direct_sum(k: int, a: float) -> None:
    w = np.arange(-3 * k - 5, 4 * k + 6)
    brute = np.array([_gk_brute(int(v), k, a) for v in w])
    assert np.max(np.abs(gk_cdf(w, k, a) - brute)) <= 2e-15
    assert np.max(np.abs(gk_sf(w, k, a) - (1.0 - brute))) <= 2e-15
    pmf = np.diff(np.concatenate([[_gk_brute(int(w[0]) - 1, k, a)], brute]))
    assert np.max(np.abs(gk_pmf(w, k, a) - pmf)) <= 4e-15


@settings(max_examples=100, deadline=None)
@given(
    w=st.integers(min_value=-(10**7), max_value=10**7),
    k=st.sampled_from([1, 2, 16, 1024, 2**20]),
    a=st.floats(min_value=1e-9, max_value=5.0),
)
def test_gk_symmetry_and_finiteness(w: int, k: int, a: float) -> None:
    cdf, sf = float(gk_cdf(w, k, a)), float(gk_sf(w, k, a))
    assert 0.0 <= cdf <= 1.0 and math.isfinite(sf)
    assert abs(cdf + float(gk_cdf(k - w, k, a)) - 1.0) <= 2.3e-16
    assert sf == float(gk_cdf(k - w, k, a))
    assert 0.0 <= float(gk_pmf(w, k, a)) <= 1.0 / k + 1e-15


def test_gk_approaches_g_as_k_grows() -> None:
    # k + D on the grid 1/K is U + e up to the lattice step: |G_K(xK) − G(x)| = O(1/K)
    k, b = 2**16, 0.7
    a = 1.0 / (b * k)
    x = np.linspace(-3.0, 4.0, 71)
    w = np.round(x * k)
    assert np.max(np.abs(gk_cdf(w, k, a) - g_cdf(w / k, b))) < 4.0 / k
