"""Dummy augmentation (Appendices B-C, §9.5 item 7), composition (§1.5, item 8), domains (§2.7)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mechanisms import subset
from mechanisms.subset import bitmask
from tests.unit.subset.stats import assert_close, gof_p_value

GOF_FLOOR = 1e-3


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_dummy_law_floor_and_indistinguishability(p: int) -> None:
    rng = np.random.default_rng(p)
    aug = subset.DummyAugmentation(subset.base_design(p), 0.15)
    w = np.arange(1, p + 1) / np.arange(1, p + 1).sum()
    x = rng.choice(p, 60_000, p=w)
    release = subset.privatize_with_dummies(x, aug, rng)
    m = aug.dummy_count(len(x))
    assert release.n_real == len(x) and release.n_dummy_per_category == m
    assert len(release.masks) == len(x) + 2 * m and release.dummy_rows.sum() == 2 * m
    assert release.alpha_effective == subset.DummyAugmentation(aug.base, 0.15).effective_alpha(
        len(x))
    # real records keep their order and stay faithful
    real = release.masks[~release.dummy_rows]
    assert np.all(bitmask.contains(real, x))
    # exactly one dummy per output
    dummies = release.masks >> np.uint64(p)
    assert set(np.unique(dummies).tolist()) <= {1, 2}
    # every record's coverage under the augmented population is ≥ α
    alpha = float(release.alpha_effective)
    coverage = bitmask.indicators(release.masks, p + 2) @ aug.population(w, alpha)
    assert coverage.min() >= alpha - 1e-12
    # both kinds follow μ'_{a∪{d}} = ν_a: real records given X = j, and dummy records
    support, mu = aug.law()
    fake = release.masks[release.dummy_rows]
    for d in (p, p + 1):
        holds = bitmask.contains(support, np.full(len(support), d))
        rows = fake[bitmask.contains(fake, np.full(len(fake), d))]
        counts = [np.count_nonzero(rows == s) for s in support[holds]]
        assert gof_p_value(counts, mu[holds] / mu[holds].sum()) > GOF_FLOOR
    j = p - 1  # the most frequent real category
    holds = bitmask.contains(support, np.full(len(support), j))
    counts = [np.count_nonzero(real[x == j] == s) for s in support[holds]]
    assert gof_p_value(counts, mu[holds]) > GOF_FLOOR
    assert np.isclose(mu[holds].sum(), 1.0)


def test_dummy_estimation_fixes_the_dummy_share() -> None:
    rng = np.random.default_rng(1)
    p, w = 4, np.array([0.1, 0.2, 0.3, 0.4])
    aug = subset.DummyAugmentation(subset.base_design(p), 0.1)
    release = subset.privatize_with_dummies(rng.choice(p, 40_000, p=w), aug, rng)
    alpha = float(release.alpha_effective)
    obs = subset.observe(subset.strip_dummies(release.masks, p), p, dummy_alpha=alpha)
    for method in ("em", "mom", "one_step"):
        fit = subset.estimate(obs, aug.base, method)
        assert fit.se is not None
        assert_close(fit.w, w, fit.se, k=12)
    # EM here equals the spec's constrained M-step on the augmented domain
    distinct, weights = np.unique(release.masks, return_counts=True)
    rows = bitmask.indicators(distinct, p + 2)
    wa = aug.population(np.full(p, 1 / p), alpha)
    for _ in range(3000):  # N_j = Σ_i P(X_i = j | â_i), dummies fixed at α
        post = rows * wa / (rows @ wa)[:, None]
        counts = weights @ post
        wa = np.concatenate([(1 - 2 * alpha) * counts[:p] / counts[:p].sum(), [alpha, alpha]])
    assert np.allclose(subset.em(obs, tol=1e-13).w, wa[:p] / (1 - 2 * alpha), atol=1e-8)
    # with the dummy mass free the augmented model is not identifiable: u = (c/2,…,−c,−c)
    q_aug = bitmask.indicators(aug.law()[0], p + 2)
    u = np.array([0.5, 0.5, 0.5, 0.5, -1.0, -1.0])
    assert np.allclose(q_aug @ u, 0.0)


def test_dummy_size_coverage_closed_form() -> None:
    w = np.array([0.1, 0.2, 0.3, 0.4])
    for p, base in ((4, subset.design_uniform(4)), (3, subset.design_proper(3))):
        aug = subset.DummyAugmentation(base, 0.2)
        ww = w[:p] / w[:p].sum()
        assert np.isclose(aug.size_coverage(ww), aug.report(ww).size_coverage)
        assert aug.report(ww).min_individual_coverage >= 0.2 - 1e-12
    with pytest.raises(subset.DesignError):
        subset.DummyAugmentation(subset.design_uniform(4), 0.5)
    cycle = subset.design_from_mu([[j, (j + 1) % 5] for j in range(5)], [0.5] * 5, 5)
    with pytest.raises(subset.DesignError, match="complement-symmetric"):
        subset.DummyAugmentation(cycle, 0.1)
    with pytest.raises(ValueError, match="exactly one dummy"):
        subset.strip_dummies(np.array([0b110011], dtype=np.uint64), 4)


def test_two_uniform_draws_disclose_two_thirds() -> None:
    design = subset.design_uniform(4)
    composed = subset.compose([design, design])
    assert np.allclose(composed.disclosure_by_category(), 2 / 3)
    masks, mu = composed.masks, composed.mu
    assert np.allclose(bitmask.indicators(masks, 4).T @ mu, 1.0)  # still a conditional law
    rng = np.random.default_rng(2)
    n = 100_000
    x = rng.integers(0, 4, n)
    first, second = (subset.privatize(x, design, rng) for _ in range(2))
    single = float(np.mean(bitmask.popcount(first & second) == 1))
    assert abs(single - 2 / 3) < 0.01
    assert_close(single, 2 / 3, np.sqrt(2 / 9 / n))
    report = composed.report(np.full(4, 0.25))
    assert report.mi_bits is not None and report.mi_bits > 1.0  # more than one draw can reveal
    assert np.isclose(composed.disclosure_probability(np.full(4, 0.25)), 2 / 3)


def test_composition_of_three_draws_and_mixed_designs() -> None:
    rng = np.random.default_rng(3)
    a, b = subset.design_uniform(5), subset.design_random(5, rng)
    composed = subset.compose([a, b, a])
    assert np.allclose(bitmask.indicators(composed.masks, 5).T @ composed.mu, 1.0)
    assert np.all(composed.disclosure_by_category() > subset.compose([a, b])
                  .disclosure_by_category())
    x = rng.integers(0, 5, 60_000)
    draws = [subset.privatize(x, d, rng) for d in (a, b, a)]
    inter = draws[0] & draws[1] & draws[2]
    probs = composed.mu[np.searchsorted(composed.masks, np.unique(inter))]
    counts = np.unique(inter, return_counts=True)[1]
    # the composed law per category: P(A* = c | X = 0) = μ*_c for c ∋ 0
    rows = x == 0
    holds = bitmask.contains(composed.masks, np.zeros(len(composed.masks), dtype=np.int64))
    seen = [np.count_nonzero(inter[rows] == c) for c in composed.masks[holds]]
    assert stats.chisquare(seen, composed.mu[holds] * rows.sum()).pvalue > GOF_FLOOR
    assert counts.sum() == len(x) and np.all(probs > 0)


def test_small_domain_strategies() -> None:
    rng = np.random.default_rng(4)
    sex = subset.Factor("sex", ("F", "M"))
    income = subset.Factor("income", ("Low", "High"))
    joint = subset.Domain((sex, income))
    assert joint.p == 4 and joint.labels == ("F&Low", "F&High", "M&Low", "M&High")
    n = 40_000
    s = rng.integers(0, 2, n)
    i = (rng.random(n) < np.where(s == 0, 0.11, 0.31)).astype(np.int64)
    codes = joint.encode([s, i])
    assert np.array_equal(codes, s * 2 + i)
    fit = subset.estimate(subset.privatize(codes, subset.design_uniform(4), rng),
                          subset.design_uniform(4), "em")
    assert fit.cov is not None
    marginal = joint.marginal(fit.w, "income")
    expected = [1 - (0.11 + 0.31) / 2, (0.11 + 0.31) / 2]
    se = np.sqrt(np.diag(joint.marginal_matrix("income").T @ fit.cov @
                         joint.marginal_matrix("income")))
    assert_close(marginal, expected, se + np.sqrt(0.25 / n))  # estimation + sampling error
    artificial = subset.Domain((sex,), artificial_levels=2)
    coded = artificial.encode([s], rng)
    assert artificial.p == 4 and np.array_equal(coded // 2, s)
    assert artificial.labels == ("F&<u1>", "F&<u2>", "M&<u1>", "M&<u2>")
    u = coded % 2
    assert_close(u.mean(), 0.5, np.sqrt(0.25 / n))
    with pytest.raises(ValueError, match="random generator"):
        artificial.encode([s])
    assert subset.Domain.from_json(artificial.describe()) == artificial
