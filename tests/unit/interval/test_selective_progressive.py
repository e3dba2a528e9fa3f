"""Selective collection and progressive narrowing (spec §7.5 item 10)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import interval

from .conftest import NORMAL, case1, rng

UNIFORM = interval.make_prior(None, (0.0, 1.0))


def _collect_probability(base: interval.IntervalMechanism, tau: float) -> float:
    probe = interval.Selective(base, tau, 1.0, NORMAL)
    return interval.coverage.integrate(lambda q: probe.collect_integrand(q, NORMAL), 1).value


def test_selective_ignorability_at_rho_equal_collect_probability() -> None:
    """Case-I, N(0,1), Logis(1), τ = 0.6: P(L >= τ) = 0.757, P(W = 0 | null) = 0.569."""
    p = _collect_probability(case1(), 0.6)
    assert abs(p - 0.757) < 0.005
    sel = interval.Selective(case1(), 0.6, p, NORMAL)
    n = 400_000
    y = rng(1).normal(size=n)
    rel, w = sel.release_with_w(y, rng(2))
    null = ~rel.released
    share = float(np.mean(w[null] == 0))
    # binomial SE of the share with ~170k nulls is ~0.0012; 0.01 is 8 SE
    assert share >= 0.5 and abs(share - 0.569) < 0.01
    # analytic Prop 2 value: (1 − ρ)/((1 − ρ) + ρ·P(L < τ))
    assert abs(share - (1 - p) / ((1 - p) + p * (1 - p))) < 0.01
    assert np.all(rel.coverage(NORMAL)[rel.released] >= 0.6)
    assert np.all(np.isnan(rel.anchors[null]))  # a null keeps no anchors
    # the counted coverage: collected ranges at their prior mass, a null at 1/R
    account = interval.coverage.selective_account(sel, NORMAL)
    counted = np.where(rel.released, rel.coverage(NORMAL), account.null_coverage)
    assert account.charged is account.per_output  # here the per-output bound is the larger
    # SE of the mean of 400k counted coverages (sd ~0.2) is ~3e-4
    assert abs(float(counted.mean()) - account.per_output.value) < 0.002


def test_selective_with_large_rho_loses_ignorability() -> None:
    sel = interval.Selective(case1(), 0.6, 0.984, NORMAL)
    rel, w = sel.release_with_w(rng(3).normal(size=200_000), rng(4))
    assert abs(float(np.mean(w[~rel.released] == 0)) - 0.064) < 0.01


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_progressive_bisection_coverage(rounds: int) -> None:
    """Uniform anchors on uniform data: average coverage (2/3)^h (±0.005)."""
    prog = interval.Progressive((0.0, 1.0), rounds)
    y = rng(5).random(400_000)
    rel = prog.release(y, rng(6))
    assert abs(float(rel.coverage(UNIFORM).mean()) - (2 / 3) ** rounds) < 0.005
    assert abs(interval.expected_coverage(prog, UNIFORM).value - (2 / 3) ** rounds) < 0.005
    assert np.all(rel.extra["rounds"] == rounds)


def test_progressive_anchors_follow_only_released_answers() -> None:
    """Round h's anchor is uniform on the range left by rounds < h (Remark 1)."""
    prog = interval.Progressive((0.0, 10.0), 3)
    y = rng(7).random(50_000) * 10
    rel = prog.release(y, rng(8))
    lo, hi = np.zeros(y.size), np.full(y.size, 10.0)
    for h in range(3):
        u = rel.anchors[:, h]
        assert np.all((lo <= u) & (u <= hi))
        ans = rel.extra[f"answer_{h + 1}"] == 1
        assert np.array_equal(ans, y <= u)
        lo, hi = np.where(ans, lo, u), np.where(ans, u, hi)
    assert np.allclose(rel.pieces.left[:, 0], lo) and np.allclose(rel.pieces.right[:, 0], hi)


def test_progressive_stopping_floor() -> None:
    prog = interval.Progressive((0.0, 1.0), 6, 0.2, UNIFORM)
    y = rng(9).random(100_000)
    rel = prog.release(y, rng(10))
    cover = rel.coverage(UNIFORM)
    assert np.all(cover[rel.released] >= 0.2)
    assert np.all(rel.extra["rounds"] <= 6) and rel.extra["rounds"].min() >= 0
    assert abs(float(cover.mean()) - interval.expected_coverage(prog, UNIFORM).value) < 0.005


def test_selective_case1_npmle_is_flagged_non_identifiable() -> None:
    """Selective Case-I with τ = 0.6 collapses the NPMLE: the analysis must warn."""
    from fractions import Fraction

    from mechanisms import registry
    from mechanisms.base import ColumnMeta, DatasetMeta, ReleaseView

    meta = DatasetMeta(2000, {"x": ColumnMeta("x", "continuous",
                                              prior={"family": "normal", "loc": 0, "scale": 1})})
    mech = registry.get("interval.selective")
    params = mech.load_params({"column": "x", "tau": 0.6,
                               "anchors": {"family": "logistic", "scale": 1}})
    cost = mech.cost(params, {"interval_leakage": Fraction(1, 2)}, meta)
    out = mech.run({"x": rng(11).normal(size=2000)}, params, cost, meta, rng(12))
    view = ReleaseView("r1", mech.name, params, out.result, out.table, meta)
    analysis = mech.analyses["npmle"]
    result = analysis.run(view, analysis.load_params({}), [], rng(13))
    assert any(w.startswith("non-identifiable") for w in result["warnings"])
    # a tau <= 1/2 design gets the weaker (unverified tau-resolvability) warning instead
    params = mech.load_params({"column": "x", "tau": 0.3,
                               "anchors": {"family": "logistic", "scale": 1}})
    cost = mech.cost(params, {"interval_leakage": Fraction(1, 2)}, meta)
    out = mech.run({"x": rng(14).normal(size=2000)}, params, cost, meta, rng(15))
    view = ReleaseView("r2", mech.name, params, out.result, out.table, meta)
    result = analysis.run(view, analysis.load_params({}), [], rng(16))
    assert result["warnings"] and not result["warnings"][0].startswith("non-identifiable")


TRUNC_NORMAL = interval.make_prior({"family": "normal", "loc": 0.5, "scale": 1.0}, (-1.0, 3.0))


@pytest.mark.parametrize("prior", [UNIFORM, TRUNC_NORMAL], ids=["uniform", "normal"])
def test_progressive_stop_keeps_def1(prior: interval.Prior) -> None:
    """Catches issue #14 finding 3: the old stop rule (stop when the side holding Y is
    narrower than tau_stop) put stopped records' values in the fifths of their range at
    39/11/0/11/39 %; Def 1 needs the prior restricted to the range, i.e. a uniform PIT
    within the range for every output class (rounds answered = 0, 1, 2, 3)."""
    from scipy import stats

    lo, hi = prior.support
    prog = interval.Progressive((lo, hi), 3, 0.2, prior)
    n = 120_000
    y = prior.ppf(rng(21).random(n))
    rel = prog.release(y, rng(22))
    left, right = rel.pieces.left[:, 0], rel.pieces.right[:, 0]
    f_lo, f_hi = prior.cdf(left), prior.cdf(right)
    pit = (prior.cdf(y) - f_lo) / (f_hi - f_lo)
    rounds = rel.extra["rounds"]
    for k in range(4):
        sel = rounds == k
        assert sel.sum() > 300  # every class is populated, nulls included
        counts = np.histogram(pit[sel], bins=5, range=(0.0, 1.0))[0]
        # Bonferroni over 4 classes at 1e-3; the old rule gives p ~ 0 for k < 3
        assert stats.chisquare(counts).pvalue > 2.5e-4, (k, counts)
    # the floor holds for every released range, and the charge is the realised coverage
    cover = rel.coverage(prior)
    assert np.all(cover[rel.released] >= 0.2 - 1e-12)
    assert abs(float(cover.mean()) - interval.expected_coverage(prog, prior).value) < 0.004


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4), st.floats(0.0, 1.0),
       st.floats(0.0, 1.0), st.floats(0.01, 0.45))
def test_progressive_release_is_a_function_of_the_final_range(
        q: list[float], y: float, t: float, tau: float) -> None:
    """Def 1 exactly: given the round uniforms, every value in the released range produces
    the identical release (anchors, answers, rounds), so P(Z = z | y) is constant on S_z.
    The old stop rule fails this: a value on the other side of the discarded anchor keeps
    going where the original stopped."""
    prog = interval.Progressive((0.0, 1.0), 4, tau, UNIFORM)
    u = np.array([q])
    first = prog.run(np.array([y]), u)
    lo, hi = first.pieces.left[0, 0], first.pieces.right[0, 0]
    other = lo + (hi - lo) * t if t > 0 else hi  # any point of (lo, hi]
    if not lo < other <= hi:
        return
    second = prog.run(np.array([other]), u)
    assert np.array_equal(first.anchors, second.anchors, equal_nan=True)
    for key in first.extra:
        assert np.array_equal(first.extra[key], second.extra[key]), key
    assert first.pieces.left[0, 0] == second.pieces.left[0, 0]
    assert first.pieces.right[0, 0] == second.pieces.right[0, 0]


def _case1_collect_given_y(y: np.ndarray, tau: float) -> np.ndarray:
    """Exact P(L(S_Z) >= τ | Y = y) for Case-I, Logis(1) anchors, N(0,1) prior (τ > 1/2):
    y's range (-inf, U] reaches τ iff U >= b = Φ⁻¹(τ); (U, inf) iff U < a = Φ⁻¹(1 − τ)."""
    from scipy import special, stats

    a, b = stats.norm.ppf(1 - tau), stats.norm.ppf(tau)
    return np.asarray(1 - special.expit(np.maximum(y, b)) + special.expit(np.minimum(y, a)))


def test_selective_charge_covers_the_null_leakage() -> None:
    """Catches issue #14 finding 4: a selective release was charged as if a null were the
    whole line (leakage 0.067 here), but P(null | y) depends on y, so a null reweights
    the prior by up to R = sup_y P(null | y)/P(null) = 1.56. The charge must cover the
    collected ranges at their Def-1 leakage plus each null at 1 − 1/R, and rho times the
    base design's leakage (0.181; the old charge was below both)."""
    from scipy import integrate, stats

    tau = 0.6
    p = _collect_probability(case1(), tau)
    sel = interval.Selective(case1(), tau, p, NORMAL)
    # exact null ratio: P(null | y) = 1 − ρ·P(collect | y), sup at y -> ±inf
    y = np.linspace(-12, 12, 24001)
    pi = 1 - p * _case1_collect_given_y(y, tau)
    p_null = integrate.quad(lambda v: (1 - p * _case1_collect_given_y(np.array(v), tau))
                            * stats.norm.pdf(v), -np.inf, np.inf)[0]
    ratio = float(pi.max() / p_null)
    assert ratio > 1.5 and float(pi.min() / p_null) < 0.95  # a null is information
    account = interval.coverage.selective_account(sel, NORMAL)
    assert account.null_ratio >= ratio - 1e-3 and account.null_ratio < ratio + 0.01
    assert abs(account.null_probability - p_null) < 1e-4
    # leakage of the outputs: collected at 1 − L (exact Def 1), nulls at 1 − 1/R
    n = 400_000
    rel = sel.release(rng(31).normal(size=n), rng(32))
    per_record = np.where(rel.released, 1 - rel.coverage(NORMAL), 1 - 1 / ratio)
    leak = float(per_record.mean()) + 3 * float(per_record.std()) / np.sqrt(n)
    charged = 1 - interval.expected_coverage(sel, NORMAL).value
    assert charged >= leak - 0.002 and charged > 0.2
    base = 1 - interval.expected_coverage(case1(), NORMAL).value
    assert charged >= p * base
    # the old charge counted nulls as coverage 1: far below what the outputs reveal
    old = float(np.mean(np.where(rel.released, 1 - rel.coverage(NORMAL), 0.0)))
    assert old < 0.08 < leak - 0.1


def test_selective_collect_floor_is_exact_for_case1() -> None:
    """inf_y P(collect | y) by the anchor sweep matches the closed form min(P(U >= b),
    P(U < a)) (a Case-I tail limit), and never exceeds it by more than QMC noise."""
    tau = 0.6
    sel = interval.Selective(case1(), tau, 0.5, NORMAL)
    exact = float(_case1_collect_given_y(np.array([-40.0, 40.0]), tau).min())
    floor = interval.coverage.selective_account(sel, NORMAL).collect_floor
    assert abs(floor - exact) < 2e-3


def test_selective_without_nulls_from_the_rule_costs_the_subsampled_base() -> None:
    """A ring with floor 0.3 collects every range at tau = 0.3: a null is then W = 0 only,
    independent of y (ratio 1), and the charge is exactly ρ times the ring's leakage."""
    ring = interval.IntervalMechanism(interval.Ring(NORMAL, 0.3))
    sel = interval.Selective(ring, 0.3, 0.8, NORMAL)
    account = interval.coverage.selective_account(sel, NORMAL)
    assert account.collect_floor == 1.0 and account.null_ratio == pytest.approx(1.0)
    tau_ring = interval.ring_coverage(0.3)
    assert account.charged.value == pytest.approx(1 - 0.8 * (1 - tau_ring), abs=1e-6)


def test_selective_registry_charge_and_guarantee() -> None:
    """Through the registry: the ledger charge is the account's bound (>= 0.2 here, was
    0.067), the table shows a null at the coverage its charge counts, and the guarantee
    says that nulls are not Def 1."""
    from fractions import Fraction

    from mechanisms import registry
    from mechanisms.base import ColumnMeta, DatasetMeta

    meta = DatasetMeta(5000, {"x": ColumnMeta("x", "continuous",
                                              prior={"family": "normal", "loc": 0, "scale": 1})})
    mech = registry.get("interval.selective")
    params = mech.load_params({"column": "x", "tau": 0.6,
                               "anchors": {"family": "logistic", "scale": 1}})
    cost = mech.cost(params, {"interval_leakage": Fraction(1, 2)}, meta)["interval_leakage:x"]
    assert 0.2 < cost < 0.25
    out = mech.run({"x": rng(41).normal(size=5000)}, params, {"interval_leakage": cost}, meta,
                   rng(42))
    assert out.table is not None
    null = out.table["released"] == 0
    ratio = out.accuracy["null_posterior_ratio_bound"]
    assert 1.5 < ratio < 1.6
    assert np.allclose(out.table["coverage"][null], 1 / ratio)
    assert "A null is NOT Def. 1" in out.guarantee
    assert out.accuracy["leakage_charged"] == float(cost)
