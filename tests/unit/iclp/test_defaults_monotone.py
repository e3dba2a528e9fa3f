"""Default tuning that buys accuracy with the budget (issue #32 items 5, 6, 7).

* More ε never costs accuracy: at default params the expected error of every functional
  and density mechanism on a fixed smooth dataset (``monotone_cases``) does not rise
  along an ε grid, within the Monte Carlo error (exact for the mean plans).
* ``iclp.kde2d``'s default bandwidth falls with n, and so does its error.
* ``iclp.erm``'s logistic ψ is chosen for error (it no longer halves the slope), and its
  statement states the ridge bias.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from mechanisms import iclp, target
from mechanisms.iclp import cov, erm, fos, kde2d, mean, pss, spectral
from tests.unit.iclp.monotone_cases import CASES
from tests.unit.iclp.sim import GRID, SCENARIO_TAU, SCENARIOS, expected_sq_error

EPSILONS = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1), Fraction(2),
            Fraction(4))
#: noise seeds per ε in CI (the bench runs 200: tests/bench/test_iclp_accuracy_bench.py)
SEEDS = 40
#: a rise larger than this many standard errors of the difference fails
Z = 3.0
#: every case. On main iclp.fos (7.6 -> 17.7 from ε = 1/8 to 1/2), iclp.cov (0.171 ->
#: 0.177 from ε = 1/4 to 1/2) and the square-loss iclp.erm (0.226 -> 0.319 from 1/8 to
#: 3/16) rose and were left out: their ψ minimised privacy + a worst-case bias ψR²/4
MONOTONE = tuple(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", MONOTONE)
def test_expected_error_does_not_rise_with_epsilon(name: str) -> None:
    """For every pair ε < ε' of the grid, the mean over seeds of err(ε') − err(ε) (the
    same noise seeds at both: paired) is at most Z of its standard errors."""
    case = CASES[name]
    errors = np.stack([case.errors(eps, SEEDS) for eps in EPSILONS])
    for i, j in itertools.combinations(range(len(EPSILONS)), 2):
        diff = errors[j] - errors[i]
        slack = Z * float(diff.std(ddof=1)) / math.sqrt(SEEDS)
        assert float(diff.mean()) <= slack, (name, EPSILONS[i], EPSILONS[j],
                                             errors.mean(axis=1))


#: on a fine ε grid the integer M of FRL (and of ICLP-QR's J) steps up where the
#: reference risk says so; a mean unlike the reference then pays up to ~2 % more for one
#: step (S1, n = 500, ε ≈ 4-7.5; S2, n = 500, ε 1/8 -> 1/4: 1.4 %), far from main's 35 %
STEP_SLACK = 1.03


@pytest.mark.parametrize("n", [500, 10_000])
@pytest.mark.parametrize("scenario", ["S1", "S2"])
def test_mean_exact_error_falls_with_epsilon(n: int, scenario: str) -> None:
    """Exact E‖released − μ‖² (sim.expected_sq_error) of ICLP-QR and FRL along the doubling
    grid and a fine grid, within one component step. On main, S1 at n = 500 rose from 0.099
    (ε = 1/8) to 0.133 (ε = 1) for ICLP-QR."""
    mu = SCENARIOS[scenario]
    fine = [Fraction(k, 16) for k in range(2, 129, 3)]
    for plan_for in (iclp.plan_iclp_mean, iclp.plan_frl_mean):
        for grid in (EPSILONS, fine):
            errors = [expected_sq_error(plan_for(GRID, SCENARIO_TAU, n, e), mu) for e in grid]
            rises = [(float(a), float(b)) for (a, x), (b, y)
                     in itertools.pairwise(zip(grid, errors, strict=True)) if y > x * STEP_SLACK]
            assert not rises, rises


def test_frl_default_components_rise_with_epsilon_and_minimise_its_risk() -> None:
    share = np.full(50, 1.0 / 50)
    ms = [pss.frl_min_risk_components(share, 500, e) for e in EPSILONS]
    assert ms == sorted(ms)
    for e, m in zip(EPSILONS, ms, strict=True):
        risk = pss.frl_risk(share, 500, e)
        assert risk[m - 1] == risk.min()


def _stated(name: str, eps: Fraction) -> float:
    found = target.stated(CASES[name].mechanism, CASES[name].stated(eps))
    assert found is not None
    return found.half_width


#: mechanisms whose stated half-width is non-increasing in ε at default params; the tuned
#: ICLP designs state their privacy error only, which may rise with ε while the total
#: falls (a larger ε buys less bias), so the target search refuses them on such ranges
STATED_MONOTONE = ("bernstein.mean", "bernstein.kde")


@pytest.mark.parametrize("name", STATED_MONOTONE)
def test_stated_half_width_does_not_rise_with_epsilon(name: str) -> None:
    grid = [Fraction(k, 16) for k in range(1, 129)]
    widths = [_stated(name, e) for e in grid]
    assert all(b <= a for a, b in itertools.pairwise(widths))


#: the min-risk designs that state their predicted error for the reference
#: (``smoothing.risk``: privacy + smoothing bias + sampling)
PREDICTED = ("iclp.mean", "iclp.kde", "iclp.kde2d", "iclp.cov", "iclp.fos", "iclp.erm.square",
             "iclp.erm.logistic")


@pytest.mark.parametrize("name", PREDICTED)
def test_predicted_total_error_does_not_rise_with_epsilon(name: str) -> None:
    """The total a min-risk design states for its reference (``smoothing.risk.total``) is
    non-increasing along a fine ε grid (exact: each is a minimum over a fixed candidate set
    of a(choice)/ε² + b(choice)), unlike their stated half-widths (privacy alone, above).
    On main iclp.cov, iclp.fos and the square-loss iclp.erm stated no total."""
    grid = [Fraction(k, 8) for k in range(1, 65)]
    totals = []
    for eps in grid:
        smoothing = CASES[name].stated(eps)["smoothing"]
        assert "risk" in smoothing, (name, eps)
        totals.append(smoothing["risk"]["total"])
    rises = [(float(a), float(b)) for (a, x), (b, y)
             in itertools.pairwise(zip(grid, totals, strict=True)) if y > x]
    assert not rises, (name, rises)


def _kde2d_relative_error(n: int, seeds: int) -> float:
    d = stats.beta(2.0, 4.0)
    rng = np.random.default_rng(0)
    x, z = d.rvs(n, random_state=rng), d.rvs(n, random_state=rng)
    plan = kde2d.plan_iclp_kde2d(((0.0, 1.0), (0.0, 1.0)), n, 1)
    summary = plan.summary(x, z)
    gx, gy = plan.grids
    truth = np.outer(d.pdf(gx), d.pdf(gy))
    errors = [np.mean((plan.publish(summary, np.random.default_rng(s))["values"] - truth) ** 2)
              for s in range(seeds)]
    return math.sqrt(float(np.mean(errors)) / float(np.mean(truth**2)))


def test_kde2d_default_error_falls_with_n() -> None:
    """On main the bandwidth sat at its floor of 2 spacings: 0.187 at n = 10^4 and 0.183 at
    10^5 (relative RMS error, ε = 1); the min-risk default halves it (0.19 -> 0.10)."""
    small, large = _kde2d_relative_error(10_000, 10), _kde2d_relative_error(100_000, 10)
    assert large <= 0.7 * small


def test_kde2d_bandwidth_is_the_risk_minimiser_and_shrinks_with_n() -> None:
    hs = []
    for n in (500, 5_000, 50_000):
        plan = kde2d.plan_iclp_kde2d(((0.0, 1.0), (0.0, 1.0)), n, 1)
        h, sm = plan.smoothing["bandwidth_fraction"], plan.smoothing
        assert sm["bandwidth_rule"] == "min-risk"
        best = sm["risk"]["total"]
        assert best == pytest.approx(kde2d.risk(n, 1.0, 32, h, sm["eta"])["total"], rel=1e-12)
        for k in kde2d.BANDWIDTH_SPACINGS:
            for e in kde2d.ETA_CANDIDATES:
                assert kde2d.risk(n, 1.0, 32, k / 31, e)["total"] >= best * (1 - 1e-12)
        hs.append(h)
    assert hs == sorted(hs, reverse=True) and hs[-1] < hs[0]
    # the privacy term is the plan's own (continuous ICLP) error
    plan = kde2d.plan_iclp_kde2d(((0.0, 1.0), (0.0, 1.0)), 5_000, 1)
    assert plan.smoothing["risk"]["privacy"] == pytest.approx(
        plan.accuracy()["expected_sq_l2_error"], rel=0.05)


def _logistic(n: int, eps: Fraction) -> tuple[float, erm.ErmPlan]:
    rng = np.random.default_rng(0)
    u = rng.uniform(0.0, 1.0, n)
    b = (rng.uniform(0.0, 1.0, n) < 1.0 / (1.0 + np.exp(-4.0 * (u - 0.5)))).astype(float)
    plan = erm.plan_iclp_erm("logistic", (0.0, 1.0), (0.0, 1.0), n, eps)
    fit = plan.eig.synthesize(plan.summary(u, b))
    return float(np.polyfit(plan.grid, fit, 1)[0]), plan


@pytest.mark.parametrize(("n", "eps", "least"), [(10_000, Fraction(1), 0.8),
                                                 (2_000, Fraction(4), 0.8),
                                                 (50_000, Fraction(1, 2), 0.85)])
def test_logistic_default_keeps_the_slope(n: int, eps: Fraction, least: float) -> None:
    """The non-private fit of the default ψ on log-odds 4(x − 1/2): on main the slope was
    shrunk by 49 %, 49 % and 36 % in these cells; now by 14 %, 14 % and 8 %."""
    slope, _ = _logistic(n, eps)
    assert least * 4.0 <= slope <= 4.0


def test_logistic_statement_states_the_ridge_bias() -> None:
    _, plan = _logistic(10_000, Fraction(1))
    acc = plan.accuracy()
    risk = acc["smoothing"]["risk"]
    assert plan.smoothing["psi_rule"] == "min-risk"
    assert risk["bias"] > 0 and risk["total"] == pytest.approx(
        risk["privacy"] + risk["bias"] + risk["sampling"], rel=1e-12)
    assert "ridge bias" in acc["statement"] and f"{risk['bias']:.3g}" in acc["statement"]
    # ψ minimises the stated risk over the public grid (recomputed here)
    trace, lam = plan.eig.trace, plan.eig.values

    def total(psi: float) -> float:
        delta = erm.erm_sensitivity(lam, plan.kappa, 1.0, plan.n, plan.eta, psi)
        return erm.logistic_risk(plan.eig, mean.prior_share(plan.eig), plan.n, 1.0, plan.eta,
                                 psi, 2.0 * delta**2 * trace)["total"]

    assert plan.psi == min(erm.PSI_GRID, key=total)
    assert total(plan.psi) == pytest.approx(risk["total"], rel=1e-9)


@pytest.mark.parametrize("eps", [Fraction(1, 8), Fraction(3, 16), Fraction(1), Fraction(4)])
def test_square_loss_psi_minimises_its_reference_risk(eps: Fraction) -> None:
    """The square loss's default ψ is the argmin over ``PSI_GRID`` of privacy + ridge bias +
    sampling for the public reference (recomputed here at B = 2: the terms scale as B²),
    and its statement states that bias; on main ψ minimised privacy + ψB²/4."""
    plan = erm.plan_iclp_erm("square", (0.0, 1.0), (-2.0, 2.0), 500, eps)
    share, lam = mean.prior_share(plan.eig), plan.eig.values

    def total(psi: float) -> float:
        lip = erm.lipschitz("square", plan.kappa, 2.0, psi)
        delta = erm.erm_sensitivity(lam, plan.kappa, lip, 500, plan.eta, psi)
        privacy = 2.0 * delta**2 * plan.eig.trace / float(eps) ** 2
        filt = lam**plan.eta / (lam**plan.eta + psi)
        s, r = 2.0 * erm.SQUARE_REFERENCE_SD, 2.0 * erm.SQUARE_RESIDUAL_SD
        bias = s**2 * (float(np.sum((1 - filt) ** 2 * share)) + max(0.0, 1 - float(share.sum())))
        return privacy + bias + r**2 * float(np.sum(filt**2)) / 500

    assert plan.smoothing["psi_rule"] == "min-risk"
    assert plan.psi == min(erm.PSI_GRID, key=total)
    risk = plan.smoothing["risk"]
    assert risk["total"] == pytest.approx(total(plan.psi), rel=1e-9)
    assert f"ridge bias {risk['bias']:.3g}" in plan.accuracy()["statement"]


@pytest.mark.parametrize("n", [500, 5_000, 50_000])
def test_cov_psi_minimises_its_reference_risk(n: int) -> None:
    """iclp.cov's default ψ is the argmin over ``erm.PSI_GRID`` of its stated privacy error
    + one-smoother bias + sampling for the reference covariance (τ = 3: terms scale as τ⁴)."""
    grid = np.linspace(0.0, 1.0, 50)
    for eps in (Fraction(1, 4), Fraction(2)):
        plan = cov.plan_iclp_cov(grid, 3.0, n, eps)
        assert plan.smoothing["psi_rule"] == "min-risk"
        risks = {}
        for psi in erm.PSI_GRID:
            candidate = cov.plan_iclp_cov(grid, 3.0, n, eps, psi=psi)
            f = candidate.filter
            p = mean.prior_share(candidate.eig)
            s4 = (cov.COV_REFERENCE_ENERGY * 9.0) ** 2
            bias = s4 * (float(np.sum((1 - f**2) ** 2 * p**2))
                         + max(0.0, 1 - float(p.sum())) ** 2)
            sampling = s4 * (float(np.sum(f**2 * p)) ** 2 + float(np.sum(f**4 * p**2))) / n
            risks[psi] = candidate.accuracy()["expected_sq_l2_error"] + bias + sampling
        best = min(risks, key=lambda q: risks[q])
        # the rule's privacy term is the continuous-Laplace approximation of the stated one
        assert risks[plan.smoothing["psi"]] <= risks[best] * 1.05, (eps, best)


def _fos_total(plan: fos.FosPlan, eps: float, psi: float, inverse: NDArray[np.float64],
               c: NDArray[np.float64]) -> float:
    """fos's reference risk at τ = 3, n = 500 and ε₂ = 3ε/4, from its definition."""
    share, lam, eta = mean.prior_share(plan.eig), plan.eig.values, plan.smoothing["eta"]
    delta = (mean.qr_sensitivity(lam, 500, 3.0 * float(c.sum()), eta, psi)
             * math.sqrt(spectral.bessel_factor(plan.eig)))
    v = 2.0 * delta**2 * float(lam.sum()) / (0.75 * eps) ** 2
    f = lam**eta / (lam**eta + psi)
    bias = pss.PRIOR_ENERGY * 9.0 * float(np.sum(c**-2.0)) * (
        float(np.sum((1 - f) ** 2 * share)) + max(0.0, 1 - float(share.sum())))
    return (float(np.sum(inverse**2)) * v + bias
            + 9.0 * float(np.trace(inverse)) * float(np.sum(f**2 * share)) / 500)


@pytest.mark.parametrize("bounds", [[(0.0, 1.0)], [(0.0, 1.0), (-2.0, 3.0)]])
def test_fos_psi_minimises_its_reference_risk(bounds: list[tuple[float, float]]) -> None:
    """iclp.fos's default ψ is the argmin over ``erm.PSI_GRID`` of the privacy error of S̃
    through G⁻¹ + the filter's bias + the OLS sampling error, G the Gram of covariates
    uniform on their bounds (recomputed here, τ = 3). On main ψ minimised privacy + ψR²/4
    and the error at n = 500 rose from 7.6 (ε = 1/8) to 17.7 (ε = 1/2)."""
    names = [f"x{k}" for k in range(len(bounds))]
    box = [(1.0, 1.0), *bounds]
    g = np.array([[(lo * lo + lo * hi + hi * hi) / 3.0 if a == b else
                   0.25 * (lo + hi) * (box[b][0] + box[b][1])
                   for b in range(len(box))] for a, (lo, hi) in enumerate(box)])
    inverse = np.linalg.inv(g)
    c = np.array([max(abs(lo), abs(hi)) for lo, hi in box])
    for eps in (Fraction(1, 8), Fraction(1), Fraction(8)):
        plan = fos.plan_iclp_fos(names, bounds, np.linspace(0, 1, 30), 3.0, 500, eps)

        def total(psi: float, plan: fos.FosPlan = plan, eps: Fraction = eps) -> float:
            return _fos_total(plan, float(eps), psi, inverse, c)

        assert plan.smoothing["psi_rule"] == "min-risk"
        assert plan.smoothing["psi"] == min(erm.PSI_GRID, key=total)
        assert plan.smoothing["risk"]["total"] == pytest.approx(total(plan.smoothing["psi"]),
                                                                rel=1e-9)
