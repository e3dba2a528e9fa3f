"""The noise step: exact calibration, exact uniformity, and the privacy loss it really has.

Tolerances: KS statistics are compared with the Kolmogorov distribution's
1e-6 upper quantile (so a correct sampler fails with probability 1e-6 per
check); empirical log-ratios with 5 standard errors sqrt(1/c1 + 1/c2) of the
two bin counts (delta method).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms.dip import (
    NoiseStep,
    gk_cdf,
    gk_pmf,
    gk_sf,
    max_privacy_loss,
    pit_intervals,
    privatize_uniform,
    rank_correlation,
    transition_matrix_continuous,
    transition_matrix_discrete,
)

KS_QUANTILE = float(stats.kstwobign.isf(1e-6))


def _ks_bound(n: int) -> float:
    return KS_QUANTILE / math.sqrt(n)


@settings(max_examples=100, deadline=None)
@given(
    num=st.integers(min_value=1, max_value=10**6),
    den=st.integers(min_value=1, max_value=10**6),
    log_k=st.integers(min_value=4, max_value=30),
)
def test_calibration_never_exceeds_the_budget(num: int, den: int, log_k: int) -> None:
    eps = Fraction(num, den)
    if (2**log_k - 1) / eps > 2.0**46:
        with pytest.raises(ValueError):
            NoiseStep.calibrate(eps, 2**log_k)
        return
    step = NoiseStep.calibrate(eps, 2**log_k)
    # exp((K − 1)/s) <= e^ε exactly, in rationals: s >= (K − 1)/ε
    assert Fraction(step.scale) >= Fraction(2**log_k - 1) / eps
    assert Fraction(step.scale) < Fraction(2**log_k - 1) / eps * (1 + Fraction(1, 2**50))


@pytest.mark.parametrize("resolution", [0, 3, 8, 100, 2**31])
def test_calibration_rejects_bad_resolutions(resolution: int) -> None:
    with pytest.raises(ValueError):
        NoiseStep.calibrate(1, resolution)


def test_quantize_is_exact() -> None:
    step = NoiseStep.calibrate(1, 16)
    u = np.array([0.0, 1e-300, 1 / 16, 1 / 16 + 1e-16, 0.5, 1.0, np.nan, -0.1, 1.5])
    # cells [(k − 1)/K, k/K); 1.0 joins the last cell, NaN and out-of-range values are clipped
    with np.errstate(invalid="ignore"):
        assert step.quantize(u).tolist() == [1, 1, 2, 2, 9, 16, 1, 1, 16]


@pytest.mark.parametrize(("eps", "k"), [(1, 2**20), (1e-3, 2**20), (100, 2**20), (1, 16), (50, 16)])
def test_uniformize_matches_the_closed_form(eps: float, k: int) -> None:
    """g = G_K(W − 1) + V P(W) (or its mirror), against the reference G_K functions."""
    step = NoiseStep.calibrate(eps, k)
    a = 1.0 / step.scale
    w = np.concatenate(
        [np.arange(-5 * k, 6 * k, max(1, k // 256)), np.arange(-3, 5), np.arange(k - 3, k + 5),
         [-(10**9), 10**9]]
    ).astype(np.int64)
    v = np.random.default_rng(3).random(w.shape)
    g, h = step.uniformize(w, np.random.default_rng(3))
    upper = (w - 1) > (k - w)
    tail = np.where(upper, gk_sf(w, k, a), gk_cdf(w - 1, k, a)) + v * gk_pmf(w, k, a)
    g_ref = np.where(upper, 1.0 - tail, tail)
    # absolute error a few 1e-16 at any ε (1 − E from expm1), relative in the tails
    assert np.max(np.abs(g - g_ref)) <= 1e-15
    assert np.max(np.abs(g + h - 1.0)) <= 2.3e-16
    # beyond the support of k (W <= 0 or W > K) the small tail keeps full relative precision
    outside = ((w <= 0) | (w > k)) & (tail > 1e-290)
    small = np.minimum(g, h)[outside]
    assert np.max(np.abs(small - tail[outside]) / tail[outside]) <= 1e-13


@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0])
def test_output_is_uniform_when_input_is(eps: float) -> None:
    n = 200_000
    rng = np.random.default_rng(11)
    g, h = privatize_uniform(rng.random(n), eps, rng)
    assert stats.kstest(g, "uniform").statistic < _ks_bound(n)
    assert np.all((g >= 0) & (g <= 1)) and np.all(np.isfinite(h))


def test_output_is_uniform_for_a_discrete_input_law_too() -> None:
    """Uniformity needs only u uniform: u from a randomized PIT of Poisson data."""
    n = 200_000
    rng = np.random.default_rng(12)
    z = rng.poisson(3.0, n)
    dist = stats.poisson(3.0)
    u = dist.cdf(z - 1) + rng.random(n) * dist.pmf(z)
    g, _ = privatize_uniform(u, 1.0, rng)
    assert stats.kstest(g, "uniform").statistic < _ks_bound(n)


@pytest.mark.parametrize(("eps", "spec"), [(1, 0.24), (2, 0.43), (3, 0.57), (4, 0.67)])
def test_rank_correlation_matches_the_spec_and_the_simulation(eps: int, spec: float) -> None:
    assert rank_correlation(eps) == pytest.approx(spec, abs=0.01)
    n = 100_000
    rng = np.random.default_rng(eps)
    u = rng.random(n)
    g, _ = privatize_uniform(u, eps, rng)
    rho = stats.spearmanr(u, g).statistic
    # SE of Spearman's rho is at most (1 − ρ²)·1.06/√n (Fieller); 5 SE
    assert rho == pytest.approx(rank_correlation(eps), abs=5 * 1.06 * (1 - spec**2) / math.sqrt(n))


def _audit(step: NoiseStep, seed: int, n: int = 1_000_000, bins: int = 40) -> tuple[float, float]:
    """Largest |log ratio| − 5 SE over equal-mass output bins, for u = 0 against u = 1."""
    rng = np.random.default_rng(seed)
    counts = []
    for u in (0.0, 1.0):
        g, _ = step(np.full(n, u), rng)
        counts.append(np.bincount(np.minimum((g * bins).astype(np.int64), bins - 1),
                                  minlength=bins).astype(float))
    c0, c1 = counts
    assert np.all(c0 > 0) and np.all(c1 > 0)
    ratio = np.abs(np.log(c0 / c1))
    se = np.sqrt(1 / c0 + 1 / c1)
    return float(np.max(ratio - 5 * se)), float(np.max(ratio + 5 * se))


@pytest.mark.parametrize("eps", [0.5, 1.0])
def test_black_box_audit_worst_pair(eps: float) -> None:
    lower, _ = _audit(NoiseStep.calibrate(eps), seed=int(eps * 10))
    assert lower <= eps


def test_black_box_audit_catches_a_miscalibrated_scale() -> None:
    eps = 1.0
    good = NoiseStep.calibrate(eps)
    bad = NoiseStep(good.resolution, good.scale / 2)  # really 2ε
    lower, _ = _audit(bad, seed=3)
    assert lower > eps


def test_exact_loss_of_the_paper_step_matches_spec_values() -> None:
    """Spec §8.5(3): exact output pmfs through G^{-1}, invariance and loss per ε."""
    cases = {
        "bernoulli": ([0.9, 0.1], {0.5: 0.2417, 1.0: 0.4669, 4.0: 1.5153}),
        "binomial": (stats.binom(5, 0.5).pmf(np.arange(6)), {0.5: 0.4844, 1.0: 0.9687,
                                                               4.0: 3.8750}),
    }
    for pmf, losses in cases.values():
        cells = pit_intervals(pmf)
        for eps, expected in losses.items():
            m = transition_matrix_continuous(cells, cells, 1.0 / eps)
            assert np.max(np.abs(np.asarray(pmf) @ m - pmf)) <= 1e-12
            assert max_privacy_loss(m) == pytest.approx(expected, abs=1e-4)
            assert max_privacy_loss(m) <= eps


def test_exact_loss_of_a_continuous_input_through_g() -> None:
    """Point inputs u in [0, 1], 200 output cells in g: loss ε at the extremes, never more."""
    eps = 1.0
    inputs = np.repeat(np.linspace(0.0, 1.0, 21)[:, None], 2, axis=1)
    edges = np.linspace(0.0, 1.0, 201)
    outputs = np.stack([edges[:-1], edges[1:]], axis=1)
    m = transition_matrix_continuous(inputs, outputs, 1.0 / eps)
    assert np.allclose(m.sum(axis=1), 1.0, atol=1e-12)
    loss = max_privacy_loss(m)
    assert 0.95 * eps <= loss <= eps + 1e-9
    # negative control: Laplace scale 0.5/ε is a 2ε mechanism
    assert max_privacy_loss(transition_matrix_continuous(inputs, outputs, 0.5 / eps)) > eps


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_exact_loss_and_invariance_of_the_discrete_step(eps: float) -> None:
    """The step that runs: 64 equal cells reach ε exactly; Binomial(5) stays below; pmf kept."""
    step = NoiseStep.calibrate(eps, 64)
    binomial = stats.binom(5, 0.5).pmf(np.arange(6))
    cells = pit_intervals(binomial)
    m, lost = transition_matrix_discrete(cells, cells, step)
    assert lost < 1e-15
    assert np.max(np.abs(binomial @ m - binomial)) <= 1e-12
    assert max_privacy_loss(m) <= eps + 1e-12
    flat = np.full(64, 1 / 64)
    uniform = pit_intervals(flat)
    m, _ = transition_matrix_discrete(uniform, uniform, step)
    assert np.max(np.abs(flat @ m - flat)) <= 1e-12
    assert max_privacy_loss(m) == pytest.approx(eps, abs=1e-9)
    # negative control: the same step with a scale 20% too small
    bad = NoiseStep(step.resolution, step.scale / 1.2)
    m, _ = transition_matrix_discrete(uniform, uniform, bad)
    assert max_privacy_loss(m) > eps * 1.1


def _zero_noise_reproducible(step: NoiseStep, g: np.ndarray, k: int) -> np.ndarray:
    """For each released g: could W = k (zero noise from cell k) with a V on the old
    coarse grid have produced g bit for bit?

    The old sampler recycled V = A / (z/2) when D = 0, A a multiple of 2^-53 in
    [0, z/2] (z = P(D = 0)); this inverts g to V and tries the nearby grid points.
    """
    half_zero = 0.5 * math.tanh(0.5 / step.scale)
    t = np.full(g.shape, k - 1.0)
    lo = step._uniformize(t.copy(), np.zeros(g.shape), True)[0]
    hi = step._uniformize(t.copy(), np.ones(g.shape), True)[0]
    v = (g - lo) / (hi - lo)
    centre = np.rint(v * half_zero * 2.0**53)
    found = np.zeros(g.shape, dtype=bool)
    for j in range(-3, 4):
        a = (centre + j) * 2.0**-53
        grid_v = a / half_zero
        inside = (a >= 0) & (a <= half_zero)
        again = step._uniformize(t.copy(), np.clip(grid_v, 0.0, 1.0), True)[0]
        found |= inside & (again == g)
    return found


def test_released_floats_do_not_tell_zero_noise_apart() -> None:
    """Catches issue #14 item 1: V recycled from D's uniform lay on a grid ~z⁻¹ times
    coarser when D = 0, so 'g is a zero-noise output of cell 1' happened with probability
    >= P(D = 0) from cell 1 and almost never from cell 16 (certified ε >= 4.5 at K = 16,
    ε = 1). With V drawn afresh the event is post-processing of W: the Clopper–Pearson
    (1e-6) lower bound on the ratio of its two frequencies stays below e^ε, and its
    frequency from cell 1 is far below P(D = 0)."""
    eps, n = 1.0, 200_000
    step = NoiseStep.calibrate(eps, 16)
    zero = math.tanh(0.5 / step.scale)
    rng = np.random.default_rng(31)
    counts = []
    for u in (0.0, 1.0):  # cells 1 and 16: the neighbours furthest apart
        g, _ = step(np.full(n, u), rng)
        counts.append(int(np.count_nonzero(_zero_noise_reproducible(step, g, 1))))
    near, far = counts
    alpha = 1e-6
    near_lo = stats.beta.ppf(alpha / 2, near, n - near + 1) if near else 0.0
    far_hi = stats.beta.ppf(1 - alpha / 2, far + 1, n - far)
    assert near_lo <= math.exp(eps) * far_hi
    near_hi = stats.beta.ppf(1 - alpha / 2, near + 1, n - near)
    assert near_hi < zero / 2
