"""The default ICLP-QR tuning (issue 16 item 1): the data-free risk and what it buys.

Expected errors here are exact (``sim.expected_sq_error``: lattice noise
variance + bias + sampling variance), so the comparisons with FRL are
deterministic, not Monte Carlo.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from mechanisms import iclp
from mechanisms.iclp import kde, noise, pss
from tests.unit.iclp.sim import GRID, SCENARIO_TAU, SCENARIOS, expected_sq_error, gp_curves

EPSILONS = (Fraction(1, 8), Fraction(1, 2), Fraction(1), Fraction(2), Fraction(4),
            Fraction(8), Fraction(16))
SIZES = (100, 500, 10_000)


def _ratio(n: int, eps: Fraction) -> float:
    """max over S1-S4 of RMSE(ICLP-QR default) / RMSE(FRL default)."""
    qr = iclp.plan_iclp_mean(GRID, SCENARIO_TAU, n, eps)
    frl = iclp.plan_frl_mean(GRID, SCENARIO_TAU, n, eps)
    return max(math.sqrt(expected_sq_error(qr, mu) / expected_sq_error(frl, mu))
               for mu in SCENARIOS.values())


def test_risk_terms_are_the_plans_own_numbers() -> None:
    plan = iclp.plan_iclp_mean(GRID, 2.0, 700, Fraction(3))
    sm = plan.smoothing
    exact = iclp.qr_sensitivity(plan.eig.values, 700, 2.0, sm["eta"], sm["psi"])
    assert sm["risk"]["privacy"] == pytest.approx(
        noise.privacy_mse(exact, 3.0, plan.eig.values), rel=1e-12)
    # the lattice release's exact variance is the continuous one up to its ~0.1-0.2% slack
    assert plan.noise.expected_sq_error() == pytest.approx(sm["risk"]["privacy"], rel=5e-3)
    assert plan.components == sm["components"] == plan.noise.size


def test_chosen_psi_minimises_the_risk() -> None:
    """A local minimum in log ψ, and no worse than the paper's balanced ψ."""
    n, eps, tau = 500, 2.0, 3.0
    plan = iclp.plan_iclp_mean(GRID, tau, n, Fraction(eps))
    sm = plan.smoothing
    share = iclp.mean._prior_share(iclp.mean._eigen(plan.eig.kernel, tuple(GRID),
                                                    plan.eig.rel_floor, None))
    lam, p = plan.eig.values, share[: plan.components]

    def risk(psi: float) -> float:
        r = pss.qr_risk(lam, p, n, eps, tau, sm["eta"], psi)
        assert isinstance(r, pss.QrRisk)
        return r.total

    best = risk(sm["psi"])
    assert best == pytest.approx(sm["risk"]["total"], rel=1e-12)
    for step in (0.9, 1.1, 0.5, 2.0):
        assert risk(sm["psi"] * step) >= best * (1 - 1e-9)
    assert risk(pss.balanced_psi(n, eps, sm["eta"], 4.0)) > best


def test_prior_share_of_the_reference_kernel_is_its_spectrum() -> None:
    eig = iclp.mean._eigen(iclp.matern(1.5, 0.1), tuple(GRID), 1e-10, None)
    share = iclp.mean._prior_share(eig)
    np.testing.assert_allclose(share, eig.values / eig.values.sum(), rtol=1e-12)
    other = iclp.mean._prior_share(iclp.mean._eigen(iclp.matern(1.5, 0.02), tuple(GRID),
                                                    1e-10, None))
    assert other.sum() == pytest.approx(1.0, abs=1e-8) and np.all(other > -1e-12)


def test_component_ladder() -> None:
    assert pss.component_candidates(1) == [1]
    assert pss.component_candidates(100) == [1, 2, 3, 5, 7, 11, 17, 27, 43, 69, 100]


def test_default_privacy_error_falls_with_epsilon() -> None:
    """Catches the flat privacy error of the balanced ψ (0.0126 at ε = 1/8, 0.0111 at 16).

    Now 0.0084, 0.0025, 0.00014: the risk spends large budgets on less smoothing.
    """
    errs = [iclp.plan_iclp_mean(GRID, 1.0, 500, e).accuracy()["expected_sq_l2_error"]
            for e in (Fraction(1, 8), Fraction(1), Fraction(16))]
    assert errs[0] > 3 * errs[1] > 50 * errs[2]


@pytest.mark.parametrize(("n", "eps"), [(10_000, Fraction(4)), (10_000, Fraction(2)),
                                        (500, Fraction(8)), (500, Fraction(16)),
                                        (100, Fraction(16))])
def test_default_is_no_worse_than_frl_where_the_balanced_psi_lost(n: int, eps: Fraction) -> None:
    """Cells where the old default had 1.3-3.3x FRL's RMSE on S1-S4 (issue 16 item 1)."""
    assert _ratio(n, eps) <= 1.0


def test_whole_grid_against_frl() -> None:
    """All 21 (n, ε) cells x S1-S4: QR <= FRL except three corners, each within 1.35x.

    The corners are structural, not the criterion's: an oracle search over
    (ρ, J, η, ψ) on the true means still gives 1.09x at (10^4, 1/8) and 1.03x at
    (10^4, 16). ICLP's noise shape a_j = √λ_j costs (Σ F_j²/λ_j)(Σ λ_j) >= (Σ F_j)²
    (Cauchy–Schwarz), which FRL's flat shape attains when all its components
    are kept. The balanced ψ reached 9.7x.
    """
    ratios = {(n, e): _ratio(n, e) for n in SIZES for e in EPSILONS}
    losing = {cell for cell, r in ratios.items() if r > 1.0}
    assert losing <= {(500, Fraction(1, 8)), (10_000, Fraction(1, 8)), (10_000, Fraction(16))}
    assert max(ratios.values()) <= 1.35


@pytest.mark.parametrize("eps", [Fraction(1), Fraction(8)])
def test_headline_qr_no_worse_than_frl_on_s2(eps: Fraction) -> None:
    """S2, n = 500, 20 seeds (one dataset and one release each, paired): QR's mean
    squared error is at most FRL's plus Z standard errors of the paired difference.

    With the balanced ψ this failed at ε = 8 (QR 1.5x FRL's RMSE, exact).
    """
    n, mu = 500, SCENARIOS["S2"]
    qr = iclp.plan_iclp_mean(GRID, SCENARIO_TAU, n, eps)
    frl = iclp.plan_frl_mean(GRID, SCENARIO_TAU, n, eps)
    weights = qr.eig.weights
    diffs = []
    for seed in range(20):
        rng = np.random.default_rng([seed, 77])
        curves = gp_curves(rng, n, mu=mu)
        errs = [float(np.sum(weights * (p.release(curves, rng).values - mu) ** 2))
                for p in (qr, frl)]
        diffs.append(errs[0] - errs[1])
    d = np.array(diffs)
    assert d.mean() <= 4.5 * d.std(ddof=1) / math.sqrt(d.size)
    assert d.mean() < 0  # and in fact QR is better on average (exact: 0.41x / 0.28x RMSE)


# --------------------------------------------------------------------------- KDE default


def _mixture_cdf(t: np.ndarray) -> np.ndarray:
    """0.4·TN(0.3, 0.08²) + 0.6·TN(0.7, 0.1²) on [0, 1] (the spec §5.2 d = 1 stand-in)."""
    from scipy import stats

    return (0.4 * stats.truncnorm.cdf(t, -0.3 / 0.08, 0.7 / 0.08, loc=0.3, scale=0.08)
            + 0.6 * stats.truncnorm.cdf(t, -0.7 / 0.1, 0.3 / 0.1, loc=0.7, scale=0.1))


def _exact_mise(plan: kde.KdePlan) -> float:
    """E∫(f̃ − p)² on the grid, exactly: noise variance + squared bias + binned variance
    (before the optional clip/renormalise, on the unit domain)."""
    t = plan.eig.positions
    half = 0.5 / (t.size - 1)
    edges = np.clip(np.concatenate([t - half, [1.0]]), 0.0, 1.0)
    edges[0] = 0.0
    prob = np.diff(_mixture_cdf(edges))
    coef = plan.eig.vectors * plan.filter  # ĉ_j of one record in bin k
    mean_c = prob @ coef
    var = (prob @ coef**2 - mean_c**2) / plan.n
    dens = np.diff(_mixture_cdf(edges)) / np.diff(edges)  # cell-average density
    bias = float(np.sum(plan.eig.weights * (plan.eig.synthesize(mean_c) - dens) ** 2))
    return float(plan.noise.expected_sq_error()) + bias + float(var.sum())


def test_kde_default_tuning_is_reported_and_overridable() -> None:
    plan = kde.plan_iclp_kde((0.0, 1.0), 1000, Fraction(1))
    sm = plan.smoothing
    assert sm["eta_rule"] == sm["bandwidth_rule"] == "min-risk"
    assert sm["eta"] in pss.KDE_ETA_CANDIDATES
    assert sm["risk"]["total"] == pytest.approx(sm["risk"]["privacy"]
                                                + sm["risk"]["estimation_amise"])
    given = kde.plan_iclp_kde((0.0, 1.0), 1000, Fraction(1), eta=1.5).smoothing
    assert given["eta"] == 1.5 and given["bandwidth_rule"] == "auto"
    assert given["bandwidth_fraction"] == pytest.approx(pss.kde_bandwidth(1000, 200))
    small = kde.plan_iclp_kde((0.0, 1.0), 100, Fraction(1, 8)).smoothing
    large = kde.plan_iclp_kde((0.0, 1.0), 10_000, Fraction(16)).smoothing
    assert small["bandwidth_fraction"] > large["bandwidth_fraction"]


@pytest.mark.parametrize(("n", "eps"), [(10_000, Fraction(1)), (10_000, Fraction(16)),
                                        (1000, Fraction(4)), (100, Fraction(16))])
def test_kde_default_beats_the_fixed_rule_and_frl(n: int, eps: Fraction) -> None:
    """Exact MISE on the mixture: the old default (h = 0.2 n^(-1/5), η = 1.5) had a bias
    floor above FRL's truncated plain KDE at large n·ε² (0.094 vs 0.068 RMSE at 10^4)."""
    new = _exact_mise(kde.plan_iclp_kde((0.0, 1.0), n, eps, normalize=False))
    old = _exact_mise(kde.plan_iclp_kde((0.0, 1.0), n, eps, eta=1.5, normalize=False))
    frl = _exact_mise(kde.plan_frl_kde((0.0, 1.0), n, eps, normalize=False))
    assert new < old and new < frl
