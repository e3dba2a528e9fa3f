"""The paper's competitors: ICLP-AR, GP-ADP, FRL densities and the Bernstein mean.

Sensitivities are checked against worst-case neighbours (exact or attained to
a relative 1e-9), privacy losses exactly (``max_privacy_loss`` / the zCDP
shift), calibrations against their closed forms; Monte Carlo checks use fixed
seeds and tolerances of Z standard errors.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mechanisms import iclp, registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.dp.baselines import analytic_gaussian_delta, analytic_gaussian_sigma
from mechanisms.iclp import ar, bernstein, gp, kde, spectral
from tests.unit.iclp.sim import GRID, MU, gp_curves, l2

Z = 4.5
EPS = Fraction(1)


def _loss(plan: object, a: np.ndarray, b: np.ndarray) -> Fraction:
    nz = plan.noise  # type: ignore[attr-defined]
    return nz.max_privacy_loss(nz.centre(plan.summary(a)),  # type: ignore[attr-defined]
                               nz.centre(plan.summary(b)))  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- ICLP-AR


@pytest.mark.parametrize(("nu", "n", "eps", "j", "delta"), [
    (1.5, 100, 1.0, 8, 2.0668e-1), (1.5, 500, 1.0, 13, 9.2452e-2),
    (1.5, 1000, 0.5, 11, 3.3997e-2), (2.5, 500, 1.0, 12, 8.8641e-2)])
def test_ar_golden_table(nu: float, n: int, eps: float, j: int, delta: float) -> None:
    """Spec §5.6 (J_AR, Δ_AR), printed to 5 significant digits."""
    kernel = iclp.matern(nu, 0.1)
    eig = spectral.eigen_system(kernel, GRID)
    eta = iclp.default_eta(kernel)
    psi = ar.ar_psi(n, eps, 1.0, eta, kernel.beta)
    assert ar.ar_components(eig.values, 1.0, eta, psi) == j
    assert ar.ar_sensitivity(eig.values, n, 1.0, j) == pytest.approx(delta, abs=5e-5 * delta)
    plan = ar.plan_iclp_ar_mean(GRID, 1.0, n, Fraction(eps), kernel, psi=psi)
    assert plan.components == j and plan.noise.size == j


def test_ar_summary_is_soft_thresholding_of_the_clipped_mean() -> None:
    kernel = iclp.matern(1.5, 0.1)
    psi = ar.ar_psi(200, EPS, 1.0, iclp.default_eta(kernel), kernel.beta)  # the paper's
    plan = ar.plan_iclp_ar_mean(GRID, 1.0, 200, EPS, psi=psi)
    x = gp_curves(np.random.default_rng(0), 200)
    raw = plan.eig.coefficients(iclp.clip_curves(x, plan.eig.weights, 1.0).mean(axis=0))
    expected = np.sign(raw) * np.maximum(np.abs(raw) - plan.thresholds, 0.0)
    np.testing.assert_allclose(plan.summary(x), expected, atol=1e-15)
    assert np.any(plan.summary(x) == 0.0) and np.any(plan.summary(x) != 0.0)
    np.testing.assert_allclose(plan.thresholds, plan.smoothing["psi"]
                               / (2 * plan.eig.values ** (plan.smoothing["eta"] / 2)))


def test_ar_one_component_worst_case_attains_epsilon() -> None:
    """All records τv_1, one flipped: the first coefficient moves 2τ/n above θ_1."""
    n = 50
    eig = spectral.eigen_system(iclp.matern(1.5, 0.1), GRID)
    psi = 1.4 * float(eig.values[0]) ** 5  # θ_1 = 0.7τ, θ_2 > τ
    plan = ar.plan_iclp_ar_mean(GRID, 1.0, n, EPS, eta=10.0, psi=psi)
    assert plan.components == 1
    a = np.tile(eig.vectors[:, 0] * (1 - 1e-12), (n, 1))
    b = a.copy()
    b[0] *= -1
    loss = _loss(plan, a, b)
    assert Fraction(plan.noise.epsilon) * (1 - Fraction(1, 2**9)) <= loss
    assert loss <= Fraction(plan.noise.epsilon)


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float64, (6, 100), elements=st.floats(-1e3, 1e3, width=64)),
       hnp.arrays(np.float64, 100, elements=st.floats(-1e3, 1e3, width=64)),
       st.sampled_from([Fraction(1, 8), Fraction(1), 7]), st.floats(0.1, 10.0))
def test_ar_random_neighbours_lose_at_most_epsilon(data: np.ndarray, other: np.ndarray,
                                                   eps: Fraction, tau: float) -> None:
    plan = ar.plan_iclp_ar_mean(GRID, tau, 6, eps, psi=1e-3 * tau)
    swapped = data.copy()
    swapped[4] = other
    assert _loss(plan, data, swapped) <= Fraction(plan.noise.epsilon) <= Fraction(eps)


def test_ar_refuses_bad_tuning() -> None:
    with pytest.raises(ValueError, match="eta must be >= 1"):
        ar.plan_iclp_ar_mean(GRID, 1.0, 100, EPS, eta=0.8)
    # θ_1 >= τ: the estimator is 0 for every dataset; one always-zero coefficient is kept
    zero = ar.plan_iclp_ar_mean(GRID, 1.0, 100, EPS, psi=10.0)
    assert zero.components == 1 and zero.smoothing["all_thresholded"]
    assert zero.summary(gp_curves(np.random.default_rng(9), 100)).tolist() == [0.0]


# --------------------------------------------------------------------------- GP-ADP


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0, 16.0])
@pytest.mark.parametrize("delta", [1e-6, 1e-3])
def test_zcdp_sigma_is_valid_and_close_to_the_analytic_gaussian(eps: float, delta: float
                                                                ) -> None:
    """The zCDP conversion can never beat the exact continuous curve (Balle & Wang): a
    formula slip that made it optimistic would show as δ_exact(σ) > δ."""
    sigma = gp.zcdp_sigma(eps, delta)
    assert analytic_gaussian_delta(sigma, 1.0, eps) <= delta
    assert gp.zcdp_delta(0.5 / sigma**2, eps) <= delta * (1 + 1e-9)
    assert gp.zcdp_delta(0.5 / (sigma * 0.99) ** 2, eps) > delta  # the smallest such σ
    assert sigma <= 1.2 * analytic_gaussian_sigma(eps, delta)


def test_classical_c_delta_is_invalid_beyond_epsilon_one() -> None:
    """Why the classical √(2 log(1.25/δ))/ε is not used: at ε = 16 it is below the exact σ."""
    classical = math.sqrt(2 * math.log(1.25 / 1e-6)) / 16
    assert analytic_gaussian_delta(classical, 1.0, 16.0) > 1e-6


def test_gp_sensitivity_is_attained_and_the_shift_is_within_the_zcdp_budget() -> None:
    n = 200
    plan = gp.plan_gp_mean(GRID, 1.0, n, EPS, Fraction(1, 10**6), psi=1e-3)
    nz = plan.gaussian
    lam = plan.eig.values
    exact = gp.cm_sensitivity(lam, n, 1.0, 1.0, 1e-3)
    assert exact == pytest.approx(2.0 / n * float(np.max(np.sqrt(lam) / (lam + 1e-3))))
    assert exact <= 1.0 / (n * math.sqrt(1e-3))  # Δ_CM <= τ/(n√ψ) at η = 1 (spec §4)
    j = int(np.argmax(plan.filter / np.sqrt(lam)))
    a = np.zeros((n, GRID.size))
    b = a.copy()
    a[0], b[0] = plan.eig.vectors[:, j] * (1 - 1e-12), -plan.eig.vectors[:, j] * (1 - 1e-12)
    diff = (plan.summary(a) - plan.summary(b)) / np.sqrt(lam)
    assert float(np.linalg.norm(diff)) == pytest.approx(exact, rel=1e-9)
    d = nz.centre(plan.summary(a)) - nz.centre(plan.summary(b))
    rho_shift = 0.5 * float(np.sum((d / nz.scales) ** 2))
    assert 0.99 * nz.rho <= rho_shift <= nz.rho
    assert nz.lattice_sensitivity <= exact * 1.01


def test_gp_noise_is_sigma_sqrt_lambda() -> None:
    plan = gp.plan_gp_mean(GRID, 1.0, 100, EPS, Fraction(1, 10**5), psi=1e-2)
    nz = plan.gaussian
    np.testing.assert_allclose(nz.scales * nz.steps, nz.sigma * np.sqrt(plan.eig.values),
                               rtol=1e-9)
    draws = nz.sample(np.random.default_rng(3), 4000)[:, :5] * nz.steps[:5]
    var = draws.var(axis=0)
    expected = nz.variances()[:5]
    se = expected * math.sqrt(2 / 4000)
    assert np.all(np.abs(var - expected) < Z * se)
    assert nz.expected_sq_error() == pytest.approx(nz.sigma**2 * plan.eig.values.sum(),
                                                   rel=1e-3)


def test_gp_entry_charges_epsilon_and_delta() -> None:
    mech = registry.get("gp.adp")
    meta = DatasetMeta(50, {"f": ColumnMeta("f", "functional", grid=tuple(GRID),
                                            norm_bound=1.0)})
    params = mech.load_params({"column": "f"})
    budget = {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}
    assert mech.measures == ("epsilon", "delta")
    assert mech.cost(params, budget, meta) == budget
    for bad in ({"epsilon": Fraction(1)}, {"epsilon": Fraction(1), "delta": Fraction(1)}):
        with pytest.raises(MechanismInputError):
            mech.cost(params, bad, meta)
    x = gp_curves(np.random.default_rng(0), 50)
    out = mech.run({"f": x}, params, budget, meta, np.random.default_rng(1))
    again = mech.run({"f": x}, params, budget, meta, np.random.default_rng(1))
    assert out.result["values"] == again.result["values"]
    assert out.guarantee.startswith("approximate (epsilon, delta)-DP")
    assert out.accuracy["sensitivity_norm"] == "cameron_martin_H_C"


# --------------------------------------------------------------------------- FRL KDE


def test_frl_kde_sensitivity_is_the_exact_pairwise_maximum() -> None:
    n = 40
    plan = kde.plan_frl_kde((0.0, 1.0), n, EPS, grid_size=32, components=6)
    assert plan.noise.size == 6 and np.all(plan.noise.shape == 1.0)
    v, lam = plan.eig.vectors, plan.eig.values
    brute = max(float(np.sum(lam * np.abs(v[k] - v[q]))) for k in range(32) for q in range(32))
    assert plan.noise.sensitivity == pytest.approx(brute / n, rel=1e-9)
    grid = plan.grid
    base = np.full(n, grid[16])
    losses = []
    for p in range(32):
        for q in range(32):
            a, b = base.copy(), base.copy()
            a[0], b[0] = grid[p], grid[q]
            losses.append(_loss(plan, a, b))
    assert max(losses) <= Fraction(plan.noise.epsilon)
    assert max(losses) >= Fraction(plan.noise.epsilon) * (1 - Fraction(1, 2**9))


def test_frl_kde_default_components_and_accuracy() -> None:
    plan = kde.plan_frl_kde((0.0, 1.0), 400, Fraction(1, 2))
    m = plan.smoothing["components"]
    assert m == plan.noise.size and plan.smoothing["components_rule"] == "auto"
    ms = [kde.plan_frl_kde((0.0, 1.0), 400, e).smoothing["components"]
          for e in (Fraction(1, 8), Fraction(1, 2), Fraction(2), Fraction(8))]
    assert ms[1] == m and ms == sorted(ms)  # min-risk: non-decreasing in ε (issue #32)
    paper = kde.plan_frl_kde((0.0, 1.0), 400, Fraction(1, 2), components=10)  # ⌊√400·½⌋
    assert paper.noise.size == 10
    acc = plan.accuracy()
    assert acc["laplace_scales"] == "Delta/epsilon" and acc["sensitivity_norm"] == "l1"
    with pytest.raises(ValueError, match="components must be between"):
        kde.plan_frl_kde((0.0, 1.0), 400, EPS, components=10**4)


# --------------------------------------------------------------------------- Bernstein mean


def test_bernstein_mean_calibration_and_basis() -> None:
    n, k, tau = 80, 6, 2.0
    plan = bernstein.plan_bernstein_mean(GRID, tau, n, EPS, lattice_size=k)
    # diffpriv: scale = Δ_∞·(K+1)/ε with Δ_∞ = 2τ_∞/n; the lattice slack is < 0.2%
    assert plan.sup_sensitivity == pytest.approx(2 * tau / n, rel=1e-8)
    np.testing.assert_allclose(plan.noise.laplace_scales, 2 * tau / n * (k + 1), rtol=2e-3)
    assert np.all(plan.noise.laplace_scales >= 2 * tau / n * (k + 1))
    np.testing.assert_allclose(plan.basis.sum(axis=1), 1.0, atol=1e-12)
    line = 0.3 + 1.7 * GRID
    np.testing.assert_allclose(line @ plan.interpolation, 0.3 + 1.7 * np.arange(k + 1) / k,
                               atol=1e-12)


def test_bernstein_mean_worst_case_and_clipping() -> None:
    n = 30
    plan = bernstein.plan_bernstein_mean(GRID, 1.5, n, EPS, lattice_size=4)
    a, b = np.zeros((n, 100)), np.zeros((n, 100))
    a[0], b[0] = 1.5, -1.5
    loss = _loss(plan, a, b)
    assert Fraction(plan.noise.epsilon) * (1 - Fraction(1, 2**9)) <= loss
    assert loss <= Fraction(plan.noise.epsilon)
    wild = a.copy()
    wild[0] = np.inf
    wild[1, :50] = np.nan
    wild[2] = -1e300
    # +inf -> +1.5, NaN -> 0, -1e300 -> -1.5: the clipped mean is 0 at every lattice point
    np.testing.assert_allclose(plan.summary(wild), 0.0, atol=1e-15)


def test_bernstein_mean_error_matches_its_accuracy_statement() -> None:
    plan = bernstein.plan_bernstein_mean(GRID, 3.0, 500, EPS)
    x = gp_curves(np.random.default_rng(5), 500)
    centre = plan.noise.centre(plan.summary(x))
    coefs = (centre + plan.noise.sample(np.random.default_rng(6), 4000)) * plan.noise.steps
    target = plan.basis @ (centre * plan.noise.steps)
    sq = l2(coefs @ plan.basis.T - target, plan.weights)
    assert abs(sq.mean() - plan.accuracy()["expected_sq_l2_error"]) < Z * sq.std() / 63.2
    assert MU.shape == GRID.shape
