"""Independence tests (spec §3.6, §4, §9.5 items 18-20): exact statistics and calibration.

Rates over R replications are binomial: a Type-I rate near 0.05 has
sd √(0.05·0.95/R) ≈ 0.015 at R = 200, so the spec's [0.01, 0.10] band is
about ±3 sd. A mean of a χ²_df statistic has sd √(2·df/R): 0.54 for df 29
and 0.30 for df 9 at R = 200, so the spec's ±2 and ±1 are ≥ 3.3 sd.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from mechanisms import subset
from mechanisms.subset import bitmask, independence, joint

WX = np.array([0.1, 0.2, 0.3, 0.4])
WY = np.full(4, 0.25)


def _null_pairs(n: int, rng: np.random.Generator) -> tuple[NDArray[np.uint64], ...]:
    design = subset.design_uniform(4)
    x, y = rng.choice(4, n, p=WX), rng.choice(4, n, p=WY)
    return subset.privatize(x, design, rng), subset.privatize(y, design, rng)


def test_type_one_error_and_null_means() -> None:
    rng = np.random.default_rng(18)
    design = subset.design_uniform(4)
    reps, n = 200, 2000
    stats_p, stats_l, reject = [], [], {"pearson": 0, "paper": 0, "lrt_mle": 0, "lrt_mom": 0,
                                        "bonferroni": 0}
    for _ in range(reps):
        a, b = _null_pairs(n, rng)
        out = subset.independence_tests(a, b, design, design, independence.TEST_METHODS)
        paper = subset.independence_tests(a, b, design, design, ["pearson"], df_mode="paper")
        assert out["pearson"].df == 29 and paper["pearson"].df == 36
        assert out["lrt_mle"].df == 9
        stats_p.append(out["pearson"].statistic)
        stats_l.append(out["lrt_mle"].statistic)
        for method in ("pearson", "lrt_mle", "lrt_mom", "bonferroni"):
            reject[method] += out[method].reject
        reject["paper"] += paper["pearson"].reject
    rates = {k: v / reps for k, v in reject.items()}
    assert 0.01 <= rates["lrt_mle"] <= 0.10, rates
    assert 0.01 <= rates["pearson"] <= 0.10, rates
    # χ²_36 at 0.95 is 51.0; P(χ²_29 > 51.0) = 0.0069, i.e. 1.4 of 200: ≤ 5 has P ≈ 0.99
    assert rates["paper"] <= 0.025, rates
    assert rates["bonferroni"] <= 0.10, rates  # Bonferroni is conservative
    assert abs(np.mean(stats_p) - 29) <= 2
    assert abs(np.mean(stats_l) - 9) <= 1


def _dependent_pairs(n: int, rho: float, rng: np.random.Generator, dependent: bool
                     ) -> tuple[NDArray[np.uint64], NDArray[np.uint64], subset.Design,
                                subset.Design]:
    """D-B: random w_X, w_Y and product design; W ∝ w_X w_Yᵀ + ρI when dependent."""
    wx, wy = rng.random(4), rng.random(4)
    wx, wy = wx / wx.sum(), wy / wy.sum()
    w = np.outer(wx, wy) + (rho * np.eye(4) if dependent else 0.0)
    cells = rng.choice(16, n, p=(w / w.sum()).ravel())
    da, db = subset.design_random(4, rng), subset.design_random(4, rng)
    return subset.privatize(cells // 4, da, rng), subset.privatize(cells % 4, db, rng), da, db


def test_power_ordering() -> None:
    """ρ = 0.05, n = 1000, 100 + 100 replications: AUC(LRT:MLE) > 0.85 and > AUC(Pearson)."""
    rng = np.random.default_rng(19)
    scores: dict[str, list[list[float]]] = {m: [[], []] for m in independence.TEST_METHODS}
    for dependent in (False, True):
        for _ in range(100):
            a, b, da, db = _dependent_pairs(1000, 0.05, rng, dependent)
            out = subset.independence_tests(a, b, da, db, independence.TEST_METHODS)
            for method, result in out.items():
                scores[method][int(dependent)].append(result.p_value)
    auc = {m: subset.auc(null, alt) for m, (null, alt) in scores.items()}
    assert auc["lrt_mle"] > 0.85, auc
    assert auc["lrt_mle"] > auc["pearson"], auc
    assert auc["lrt_mom"] > 0.8, auc


def test_permutation_p_values_are_uniform_under_h0() -> None:
    rng = np.random.default_rng(20)
    design = subset.design_uniform(4)
    p_values = {"lrt_mom": [], "pearson": []}  # type: dict[str, list[float]]
    for _ in range(200):
        a, b = _null_pairs(500, rng)
        out = subset.independence_tests(a, b, design, design, list(p_values),
                                        calibration="permutation", n_perm=199, rng=rng)
        for method, result in out.items():
            assert result.n_perm == 199 and result.p_value >= 1 / 200
            p_values[method].append(result.p_value)
    for values in p_values.values():
        assert stats.kstest(values, "uniform").pvalue > 1e-3


def test_permutation_detects_dependence_and_needs_a_generator() -> None:
    rng = np.random.default_rng(21)
    a, b, da, db = _dependent_pairs(3000, 0.2, rng, True)
    out = subset.independence_tests(a, b, da, db, independence.TEST_METHODS,
                                    calibration="permutation", n_perm=199, rng=rng)
    assert all(r.p_value == 1 / 200 for r in out.values())
    with pytest.raises(ValueError, match="random generator"):
        subset.independence_tests(a, b, da, db, calibration="permutation")


def test_pearson_equals_the_full_table_sum() -> None:
    """Σ over all s·r supported cells (empty ones included) = Σ_observed n²/e − n."""
    rng = np.random.default_rng(22)
    da, db = subset.design_uniform(5), subset.design_random(4, rng)
    x, y = rng.integers(0, 5, 300), rng.integers(0, 4, 300)
    a, b = subset.privatize(x, da, rng), subset.privatize(y, db, rng)
    out = subset.independence_tests(a, b, da, db, ["pearson"])["pearson"]
    wx = subset.em(subset.observe(a, 5), tol=joint.JOINT_TOL).w
    wy = subset.em(subset.observe(b, 4), tol=joint.JOINT_TOL).w
    sa, mu_a = da.law()
    sb, mu_b = db.law()
    pa = mu_a * (bitmask.indicators(sa, 5) @ wx)
    pb = mu_b * (bitmask.indicators(sb, 4) @ wy)
    expected = 300 * np.outer(pa, pb)
    table = np.array([[np.count_nonzero((a == i) & (b == j)) for j in sb] for i in sa])
    assert table.sum() == 300 and (table == 0).any()
    assert np.isclose(out.statistic, ((table - expected) ** 2 / expected).sum(), rtol=1e-9)
    assert out.df == da.support_size * db.support_size - 5 - 4 + 1
    assert out.warnings  # sparse table: the χ² approximation is flagged


def test_bonferroni_matches_scipy_2x2_tables() -> None:
    rng = np.random.default_rng(23)
    design = subset.design_uniform(5)
    a, b = (subset.privatize(rng.integers(0, 5, 800), design, rng) for _ in range(2))
    out = subset.independence_tests(a, b, design, design, ["bonferroni"])["bonferroni"]
    smallest = 1.0
    for x in range(5):
        for y in range(5):
            in_a, in_b = bitmask.contains(a, np.full(800, x)), bitmask.contains(b, np.full(800, y))
            table = np.array([[np.sum(in_a & in_b), np.sum(in_a & ~in_b)],
                              [np.sum(~in_a & in_b), np.sum(~in_a & ~in_b)]])
            smallest = min(smallest, stats.chi2_contingency(table, correction=False).pvalue)
    assert np.isclose(out.details["min_cell_p_value"], smallest, rtol=1e-9)
    assert np.isclose(out.p_value, min(1.0, 25 * smallest), rtol=1e-9)


def test_joint_estimators_equal_the_pq_category_view() -> None:
    """Treating (X, Y) as one pq-category variable with design μ_a μ_b and Q = Q_A ⊗ Q_B."""
    rng = np.random.default_rng(24)
    da, db = subset.design_uniform(4), subset.design_uniform(5)
    w = rng.random((4, 5)) + 0.1
    cells = rng.choice(20, 4000, p=(w / w.sum()).ravel())
    a, b = subset.privatize(cells // 5, da, rng), subset.privatize(cells % 5, db, rng)
    rows_a, rows_b = bitmask.indicators(a, 4), bitmask.indicators(b, 5)
    product = bitmask.from_indicators(np.einsum("ni,nj->nij", rows_a, rows_b).reshape(-1, 20))
    obs = subset.observe(product, 20)
    w_em = subset.estimate_joint(a, b, da, db, "em", tol=1e-13)
    assert np.allclose(w_em.ravel(), subset.em(obs, tol=1e-13).w, atol=1e-8)
    paired = subset.pair(a, b, 4, 5)
    raw = joint.mom_joint(paired.rows_a[paired.cell_a], paired.rows_b[paired.cell_b],
                          paired.cell_n, da, db)[0]
    q = np.kron(da.Q, db.Q)
    assert np.allclose(raw.ravel(), np.linalg.solve(q, obs.gamma()), atol=1e-12)
    assert np.isclose(subset.estimate_joint(a, b, da, db, "mom").sum(), 1.0)


def test_input_checks() -> None:
    design = subset.design_uniform(4)
    masks = subset.privatize(np.zeros(10, dtype=np.int64), design, np.random.default_rng(0))
    with pytest.raises(ValueError, match="same records"):
        subset.independence_tests(masks, masks[:5], design, design)
    with pytest.raises(ValueError, match="methods"):
        subset.independence_tests(masks, masks, design, design, ["chi"])
    with pytest.raises(ValueError, match="need both designs"):
        subset.independence_tests(subset.pair(masks, masks, 4, 4), None, None, None,
                                  ["lrt_mom"])
    out = subset.independence_tests(subset.pair(masks, masks, 4, 4), None, None, None,
                                    ["lrt_mle", "bonferroni"])
    assert set(out) == {"lrt_mle", "bonferroni"}
    assert out["lrt_mle"].to_json()["method"] == "lrt_mle"
