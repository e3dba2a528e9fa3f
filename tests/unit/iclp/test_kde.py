"""ICLP-QR densities and the Bernstein baseline: exact sensitivities, privacy loss, outputs."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import iclp
from mechanisms.iclp import bernstein, kde

BOUNDS = (0.0, 1.0)


def _mixture(rng: np.random.Generator, n: int) -> np.ndarray:
    x = np.where(rng.random(n) < 0.4, rng.normal(0.3, 0.08, n), rng.normal(0.7, 0.1, n))
    return np.clip(x, 0.0, 1.0)


def test_binning_sends_each_record_to_its_nearest_grid_point() -> None:
    counts = kde.bin_values([0.0, 0.24, 0.4, 1.0, 7.0, -3.0, np.nan], (0.0, 1.0), 5)
    np.testing.assert_array_equal(counts, [3, 1, 1, 0, 2])  # NaN -> lower bound


def test_exact_sensitivity_is_the_pairwise_maximum() -> None:
    plan = iclp.plan_iclp_kde(BOUNDS, 10, 1.0, grid_size=30, bandwidth=0.1, eta=1.5)
    v, lam = plan.eig.vectors, plan.eig.values
    w = lam**1.5 / np.sqrt(lam)
    brute = max(float(np.abs(v[a] - v[b]) @ w) for a, b in itertools.combinations(range(30), 2))
    assert iclp.kde_sensitivity(plan.eig, w, 10) == pytest.approx(brute / 10, rel=1e-12)
    assert plan.noise.sensitivity == pytest.approx(brute / 10, rel=1e-8)


@pytest.mark.parametrize(
    ("eta", "spec_mse"), [(1.25, 0.0025), (1.5, 0.0016), (2.0, 0.0010), (3.0, 0.0006)]
)
def test_spec_kde_check(eta: float, spec_mse: float) -> None:
    """Spec §3.3: n = 1000, ε = 1, h = 0.05, M = 200; privacy MSE to its two printed digits
    (±5% covers the rounding), and the exact Δ ≈ 0.56x the Cauchy–Schwarz bound."""
    plan = iclp.plan_iclp_kde(BOUNDS, 1000, 1.0, bandwidth=0.05, eta=eta)
    assert plan.accuracy()["expected_sq_l2_error"] == pytest.approx(spec_mse, rel=0.05)
    lam, v = plan.eig.values, plan.eig.vectors
    kappa = float(np.max((v**2) @ lam**eta))
    cauchy_schwarz = 2 / 1000 * math.sqrt(kappa * float(np.sum(lam ** (eta - 1))))
    triangle = 2 / 1000 * float(np.max(np.abs(v) @ lam ** (eta - 0.5)))
    assert plan.noise.sensitivity <= triangle <= cauchy_schwarz
    assert 0.5 < plan.noise.sensitivity / cauchy_schwarz < 0.65


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-0.5, 1.5), min_size=8, max_size=8), st.floats(-0.5, 1.5),
       st.integers(0, 7), st.sampled_from(["iclp", "bernstein"]))
def test_random_neighbours_lose_at_most_epsilon(values: list[float], other: float, index: int,
                                                method: str) -> None:
    if method == "iclp":
        plan: iclp.KdePlan | iclp.BernsteinPlan = iclp.plan_iclp_kde(BOUNDS, 8, Fraction(1, 2))
    else:
        plan = iclp.plan_bernstein_kde(BOUNDS, 8, Fraction(1, 2))
    a = np.array(values)
    b = a.copy()
    b[index] = other
    loss = plan.noise.max_privacy_loss(plan.noise.centre(plan.summary(a)),
                                       plan.noise.centre(plan.summary(b)))
    assert loss <= Fraction(plan.noise.epsilon) <= Fraction(1, 2)


def test_worst_case_kde_neighbours_use_the_whole_budget() -> None:
    n = 50
    plan = iclp.plan_iclp_kde(BOUNDS, n, Fraction(1), grid_size=40, bandwidth=0.08)
    v = plan.eig.vectors
    w = plan.filter / np.sqrt(plan.eig.values)
    pairs = np.abs(v[:, None, :] - v[None, :, :]) @ w
    k, k2 = np.unravel_index(np.argmax(pairs), pairs.shape)
    grid = plan.eig.positions
    rest = np.full(n - 1, 0.5)
    a, b = np.append(rest, grid[k]), np.append(rest, grid[k2])
    loss = plan.noise.max_privacy_loss(plan.noise.centre(plan.summary(a)),
                                       plan.noise.centre(plan.summary(b)))
    assert Fraction(plan.noise.epsilon) * (1 - Fraction(1, 2**9)) <= loss <= 1


def test_released_density_is_a_density_in_column_units() -> None:
    rng = np.random.default_rng(1)
    x = 10 + 20 * _mixture(rng, 5000)  # column declared on [10, 30]
    plan = iclp.plan_iclp_kde((10.0, 30.0), 5000, Fraction(1))
    out = plan.release(x, rng)
    assert out.grid[0] == 10.0 and out.grid[-1] == 30.0 and len(out.values) == 200
    assert np.all(out.values >= 0)
    assert float(np.sum(out.values * plan.eig.weights)) * 20 == pytest.approx(1.0, rel=1e-12)
    raw = iclp.plan_iclp_kde((10.0, 30.0), 5000, Fraction(1), normalize=False)
    out_raw = raw.release(x, np.random.default_rng(2))
    np.testing.assert_allclose(out_raw.values, raw.eig.synthesize(out_raw.coefficients) / 20)


def test_kde_error_is_dominated_by_smoothing_not_privacy() -> None:
    """Spec §3.3: privacy is nearly free with the PSS h and η = 1.5. Released vs non-private
    KDE at n = 10^4, ε = 1:
    the mean ISE over 200 releases is within 4.5 SE of the stated privacy MSE."""
    rng = np.random.default_rng(3)
    x = _mixture(rng, 10_000)
    plan = iclp.plan_iclp_kde(BOUNDS, 10_000, Fraction(1), eta=1.5, normalize=False)
    target = plan.eig.synthesize(plan.summary(x))
    ise = np.array([
        float(np.sum((plan.release(x, rng).values - target) ** 2 * plan.eig.weights))
        for _ in range(200)
    ])
    stated = plan.accuracy()["expected_sq_l2_error"]
    rounding = float(np.sum(plan.noise.steps**2))  # |centre − ĉ| <= g/2 per coefficient
    assert abs(ise.mean() - stated) < 4.5 * ise.std() / math.sqrt(200) + rounding
    truth = 0.4 * stats.norm.pdf(plan.grid, 0.3, 0.08) + 0.6 * stats.norm.pdf(plan.grid, 0.7, 0.1)
    smoothing = float(np.sum((target - truth) ** 2 * plan.eig.weights))
    assert stated < smoothing / 5


def test_kde_refuses_bad_inputs() -> None:
    with pytest.raises(ValueError, match="eta must be > 1"):
        iclp.plan_iclp_kde(BOUNDS, 100, 1.0, eta=1.0)
    with pytest.raises(ValueError, match="bounds"):
        iclp.plan_iclp_kde((1.0, 1.0), 100, 1.0)
    with pytest.raises(ValueError, match="values must have n_rows"):
        iclp.plan_iclp_kde(BOUNDS, 100, 1.0).summary(np.zeros(99))


def test_bernstein_basis_is_a_partition_of_unity_reproducing_lines() -> None:
    t = np.linspace(0, 1, 57)
    b = bernstein.bernstein_basis(12, t)
    np.testing.assert_allclose(b.sum(axis=1), 1.0, rtol=1e-13)
    np.testing.assert_allclose(b @ (np.arange(13) / 12), t, atol=1e-13)


def test_bernstein_noise_scale_is_the_diffpriv_calibration() -> None:
    """Laplace scale Δ_∞·(K + 1)/ε with Δ_∞ = φ_h(0)/n, up to the lattice slack (< 2^-9)."""
    n, k, eps, h = 400, 15, Fraction(1, 2), 0.05
    plan = iclp.plan_bernstein_kde(BOUNDS, n, eps, lattice_size=k, bandwidth=h)
    sup = 1 / (math.sqrt(2 * math.pi) * h) / n
    assert plan.sup_sensitivity == pytest.approx(sup, rel=1e-8)
    expected = sup * (k + 1) / float(eps)
    assert np.all(plan.noise.laplace_scales >= expected)
    assert np.all(plan.noise.laplace_scales <= expected * (1 + 2.0**-9))


def test_bernstein_release_shape() -> None:
    rng = np.random.default_rng(4)
    x = _mixture(rng, 2000)
    plan = iclp.plan_bernstein_kde(BOUNDS, 2000, Fraction(1), lattice_size=10, grid_size=50)
    out = plan.release(x, rng)
    assert len(out.coefficients) == 11 and len(out.values) == 50
    assert float(np.sum(out.values)) / 50 == pytest.approx(1.0, rel=1e-12)
    result = out.to_result()
    assert result["lattice"][0] == 0.0 and result["lattice"][-1] == 1.0
