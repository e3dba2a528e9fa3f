"""Estimators (spec §3, §9.5 items 9-12): MoM, EM, one-step, standard errors.

Monte Carlo checks compare with exact or asymptotic targets within a
Bonferroni-adjusted z (``stats``) of the estimate's standard error: for a
mean, sd/√k; for a variance, var·√(2/(k−1)) (the estimator is close to
normal, whose sample variance has that standard error).
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import optimize

from mechanisms import subset
from mechanisms.subset import asymptotic, bitmask, estimation
from tests.unit.subset.stats import assert_close

W4 = np.array([0.1, 0.2, 0.3, 0.4])


def _replicates(design: subset.Design, w: NDArray[np.float64], n: int, k: int, seed: int
                ) -> NDArray[np.uint64]:
    """k independent releases of n records each (k × n masks), in one vectorised draw."""
    rng = np.random.default_rng(seed)
    x = rng.choice(len(w), size=k * n, p=w)
    return subset.privatize(x, design, rng).reshape(k, n)


def _gammas(masks: NDArray[np.uint64], p: int) -> NDArray[np.float64]:
    bits = (masks[..., None] >> np.arange(p, dtype=np.uint64)) & np.uint64(1)
    result: NDArray[np.float64] = bits.mean(axis=1)
    return result


def _counts(masks: NDArray[np.uint64], p: int) -> NDArray[np.int64]:
    """Per-replicate counts over all 2**p masks (for the batched EM)."""
    k = masks.shape[0]
    flat = (np.arange(k)[:, None] * (1 << p) + masks.astype(np.int64)).ravel()
    return np.bincount(flat, minlength=k << p).reshape(k, 1 << p)


def test_mom_is_unbiased_with_the_theoretical_variance() -> None:
    """p = 4: Var(√n ŵ_j) = (9/4)γ_j(1−γ_j), γ_j = (1+2w_j)/3 → (0.54, 0.56, 0.56, 0.54)."""
    design, n, k = subset.design_uniform(4), 1000, 2000
    target_var = np.array([0.54, 0.56, 0.56, 0.54])
    gamma = (1 + 2 * W4) / 3
    assert np.allclose(9 / 4 * gamma * (1 - gamma), target_var, atol=5e-3)
    assert np.allclose(np.diag(asymptotic.mom_covariance(design, W4)), 9 / 4 * gamma * (1 - gamma))
    w_hat = np.linalg.solve(design.Q, _gammas(_replicates(design, W4, n, k, 1), 4).T).T
    assert_close(w_hat.mean(axis=0), W4, np.sqrt(target_var / n / k), k=8)
    scaled = n * w_hat.var(axis=0, ddof=1)
    assert_close(scaled, 9 / 4 * gamma * (1 - gamma),
                 9 / 4 * gamma * (1 - gamma) * np.sqrt(2 / (k - 1)), k=8)


def test_mom_variance_under_uniform_w() -> None:
    design, n, k = subset.design_uniform(4), 500, 1000
    flat = np.full(4, 0.25)
    assert np.allclose(np.diag(asymptotic.mom_covariance(design, flat)), 0.5625)
    assert np.allclose(np.diag(asymptotic.mle_covariance(design, flat)), 0.5625)
    w_hat = np.linalg.solve(design.Q, _gammas(_replicates(design, flat, n, k, 2), 4).T).T
    assert_close(n * w_hat.var(axis=0, ddof=1), 0.5625, 0.5625 * np.sqrt(2 / (k - 1)), k=4)


def test_mle_asymptotic_variance() -> None:
    """n·Var(ŵ_MLE) → 0.525 per coordinate (trace 2.1) versus 2.2 for MoM (p = 4, W4)."""
    design = subset.design_uniform(4)
    assert np.allclose(np.diag(asymptotic.mle_covariance(design, W4)), 0.525)
    assert np.isclose(np.trace(asymptotic.mom_covariance(design, W4)), 2.2)
    n, k = 1000, 1000
    masks = _replicates(design, W4, n, k, 3)
    w_hat, _, converged = estimation.em_batch(bitmask.indicators(bitmask.all_masks(4), 4),
                                              _counts(masks, 4))
    assert converged.all()
    assert_close(n * w_hat.var(axis=0, ddof=1), 0.525, 0.525 * np.sqrt(2 / (k - 1)), k=4)


def test_em_is_monotone_on_the_simplex_and_satisfies_kkt() -> None:
    rng = np.random.default_rng(4)
    w = np.array([0.02, 0.08, 0.1, 0.2, 0.25, 0.35])
    design = subset.design_random(6, rng)
    masks = subset.privatize(rng.choice(6, 3000, p=w), design, rng)
    obs = subset.observe(masks, 6)
    plain = subset.em(obs, track=True, accelerate=False)
    fast = subset.em(obs, track=True)  # safeguarded SQUAREM: same fixed point, fewer steps
    for fit in (plain, fast):
        assert fit.converged and len(fit.trace) == fit.iterations
        steps = np.diff(fit.trace)
        assert np.all(steps >= -1e-12 * abs(fit.trace[-1]))
        assert np.isclose(fit.w.sum(), 1.0, atol=1e-12) and np.all(fit.w >= 0)
        check = subset.kkt(obs, fit.w)
        assert check.max_violation < 1e-6
        assert np.isclose(fit.w @ check.gradient, 1.0)  # Σ_j w_j g_j = 1 always
    assert np.max(np.abs(plain.w - fast.w)) < 1e-7
    assert fast.iterations * 3 < plain.iterations


def _scipy_mle(obs: estimation.Observed) -> NDArray[np.float64]:
    """An independent optimiser: SLSQP on θ = (w_1..w_{p−1}) with per-record log-likelihood."""
    p = obs.p
    rows = np.repeat(obs.rows, obs.counts, axis=0)  # one row per record: no aggregation
    d = rows[:, :-1] - rows[:, -1:]

    def negative(theta: NDArray[np.float64]) -> float:
        with np.errstate(divide="ignore"):  # SLSQP may probe the boundary: +inf there
            return float(-np.log(d @ theta + rows[:, -1]).mean())

    def gradient(theta: NDArray[np.float64]) -> NDArray[np.float64]:
        result: NDArray[np.float64] = -(d / (d @ theta + rows[:, -1])[:, None]).mean(axis=0)
        return result

    res = optimize.minimize(
        negative, np.full(p - 1, 1.0 / p), jac=gradient, method="SLSQP",
        bounds=[(0.0, 1.0)] * (p - 1),
        constraints=[{"type": "ineq", "fun": lambda t: 1.0 - t.sum(),
                      "jac": lambda t: -np.ones_like(t)}],
        options={"ftol": 1e-16, "maxiter": 1000},
    )
    return np.append(res.x, 1.0 - res.x.sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_em_agrees_with_an_independent_optimiser(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = 5
    w = rng.random(p) + 0.2
    w /= w.sum()
    design = subset.design_random(p, rng)
    obs = subset.observe(subset.privatize(rng.choice(p, 4000, p=w), design, rng), p)
    reference = _scipy_mle(obs)
    for accelerate in (False, True):
        em_w = subset.em(obs, tol=1e-13, accelerate=accelerate).w
        assert np.max(np.abs(em_w - reference)) < 1e-6


def test_em_batch_matches_single_runs() -> None:
    design = subset.design_uniform(5)
    masks = _replicates(design, np.array([0.1, 0.1, 0.2, 0.25, 0.35]), 300, 6, 5)
    batch, _, converged = estimation.em_batch(bitmask.indicators(bitmask.all_masks(5), 5),
                                              _counts(masks, 5), tol=1e-12)
    assert converged.all()
    for row, release in zip(batch, masks, strict=True):
        assert np.allclose(row, subset.em(subset.observe(release, 5), tol=1e-12).w, atol=1e-10)


def _one_step_by_hand(masks: NDArray[np.uint64], p: int, start: NDArray[np.float64],
                      sign: float) -> NDArray[np.float64]:
    """θ + sign·[∇²l]⁻¹∇l per record (no aggregation); sign −1 is Newton, +1 the paper's."""
    rows = bitmask.indicators(masks, p)
    theta = start[:-1]
    w = np.append(theta, 1.0 - theta.sum())
    d = rows[:, :-1] - rows[:, -1:]
    lik = rows @ w
    grad = (d / lik[:, None]).sum(axis=0)
    hess = -(d.T @ (d / lik[:, None] ** 2))
    new = theta + sign * np.linalg.solve(hess, grad)
    return np.append(new, 1.0 - new.sum())


def test_one_step_is_close_to_the_mle_and_the_paper_sign_is_not() -> None:
    rng = np.random.default_rng(6)
    design = subset.design_uniform(5)
    w = np.array([0.1, 0.15, 0.2, 0.25, 0.3])
    masks = subset.privatize(rng.choice(5, 100_000, p=w), design, rng)
    obs = subset.observe(masks, 5)
    mle = subset.em(obs, tol=1e-13).w
    mom = subset.mom(obs, design)
    one, warnings = subset.one_step(obs, mom)
    assert warnings == []
    assert np.allclose(one, _one_step_by_hand(masks, 5, mom, -1.0), atol=1e-12)
    gap_mom = np.linalg.norm(mom - mle)
    # one-step − MLE = O_p(1/n) while MoM − MLE = O_p(1/√n)
    assert np.linalg.norm(one - mle) < 0.05 * gap_mom
    paper = _one_step_by_hand(masks, 5, mom, +1.0)
    assert np.linalg.norm(paper - mle) > 1.5 * gap_mom  # the "+" sign steps away


def test_mom_forms_for_p4_and_p5() -> None:
    rng = np.random.default_rng(8)
    for p in (4, 5):
        design = subset.design_uniform(p)
        masks = subset.privatize(rng.integers(0, p, 2000), design, rng)
        obs = subset.observe(masks, p)
        raw, closed = subset.mom(obs, design), subset.mom_closed(obs, design)
        mean_size = float(bitmask.popcount(masks).mean())
        r = float(design.r_p)
        assert np.isclose(raw.sum(), mean_size / (1 + (p - 1) / r))
        assert np.isclose(closed.sum(), (r * mean_size - p) / (r - 1))
        assert np.allclose(raw, closed) == (p == 4)  # identical only when |A| is constant
    adult = np.array([311, 1039, 3124, 271, 27816]) / 32561
    five = subset.design_uniform(5)
    assert np.isclose(np.trace(asymptotic.mom_covariance(five, adult)), 2.80027, atol=5e-6)
    assert np.isclose(np.trace(asymptotic.mom_closed_covariance(five, adult)), 2.92650,
                      atol=5e-6)


def test_projection_onto_the_simplex() -> None:
    assert np.allclose(subset.project_simplex([0.5, 0.6, -0.1]), [0.45, 0.55, 0.0])
    assert np.allclose(subset.project_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])
    rng = np.random.default_rng(9)
    for _ in range(50):
        v = rng.normal(size=6)
        proj = subset.project_simplex(v)
        assert np.isclose(proj.sum(), 1.0) and proj.min() >= 0
        # the projection is the closest simplex point: no vertex is closer
        assert all(np.linalg.norm(v - proj) <= np.linalg.norm(v - e) + 1e-12 for e in np.eye(6))


def test_estimate_reports_ses_and_warnings() -> None:
    rng = np.random.default_rng(10)
    design = subset.design_uniform(4)
    masks = subset.privatize(rng.choice(4, 5000, p=W4), design, rng)
    results = {m: subset.estimate(masks, design, m) for m in estimation.METHODS}
    for fit in results.values():
        assert fit.se is not None and fit.n == 5000
        assert np.isclose(fit.w.sum(), 1.0)
        doc = fit.to_json(["a", "b", "c", "d"])
        assert doc["categories"] == ["a", "b", "c", "d"] and len(doc["w"]) == 4
    # expected-information SE at ŵ ≈ √(0.525/n)
    em_se = results["em"].se
    assert em_se is not None and np.allclose(em_se, np.sqrt(0.525 / 5000), rtol=0.05)
    assert results["em"].se_basis == "expected Fisher information"
    assert results["em"].kkt_max_violation is not None
    assert results["em"].kkt_max_violation < 1e-6
    with pytest.raises(ValueError, match="needs the design"):
        subset.estimate(masks, None, "mom", p=4)
    with pytest.raises(ValueError, match="uniform design"):
        subset.estimate(masks, subset.design_random(4, rng), "mom_closed")
    tiny = subset.estimate(masks[:1], design, "em")
    assert any("not unique" in w for w in tiny.warnings)
    empty = subset.estimate(masks[:0], design, "em")
    assert empty.warnings == ["no released records"] and empty.se is None


def test_boundary_estimates_are_flagged() -> None:
    rng = np.random.default_rng(11)
    design = subset.design_uniform(5)
    w = np.array([0.0, 0.2, 0.2, 0.3, 0.3])
    masks = subset.privatize(rng.choice(5, 20_000, p=w), design, rng)
    obs = subset.observe(masks, 5)
    fit = subset.estimate(obs, design, "em", tol=1e-12)
    assert any("boundary" in m for m in fit.warnings)
    check = subset.kkt(obs, fit.w)
    assert check.gradient[0] <= 1 + 1e-6  # g_j ≤ 1 where ŵ_j = 0
    mom = subset.estimate(obs, design, "mom")
    if np.any(mom.w_raw < 0):
        assert any("left the simplex" in m for m in mom.warnings)
    assert mom.w.min() >= 0


def test_observed_information_approaches_the_expected() -> None:
    rng = np.random.default_rng(12)
    design = subset.design_uniform(5)
    w = np.array([0.1, 0.15, 0.2, 0.25, 0.3])
    obs = subset.observe(subset.privatize(rng.choice(5, 200_000, p=w), design, rng), 5)
    observed = estimation.observed_information(obs, w)
    expected = asymptotic.fisher_information(design, w)
    assert np.allclose(observed, expected, rtol=0.03)


def test_uniform_prior_size_classes_match_enumeration() -> None:
    for p in (5, 8, 11):
        design = subset.design_uniform(p)
        flat = np.full(p, 1.0 / p)
        for f in (lambda v: v, lambda v: 1.0 / v):
            assert np.allclose(asymptotic.weighted_gram(design, flat, f),
                               asymptotic.size_class_gram(p, f), rtol=1e-12)
    big = subset.design_uniform(40)
    cov = asymptotic.mom_covariance(big, np.full(40, 1 / 40))
    assert cov.shape == (40, 40) and np.all(np.diag(cov) > 0)
