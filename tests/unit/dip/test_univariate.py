"""Known-F DIP (Theorem 1): the output follows F exactly, for continuous, discrete and mixed F.

Tolerances: KS statistics against the exact Kolmogorov quantiles (1e-6
level); means of KS statistics against the exact finite-n mean of the
Kolmogorov–Smirnov distribution ± 4.5 standard errors; frequencies ± 4.5
binomial standard errors sqrt(p(1 − p)/n).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms.dip import (
    FinitePMF,
    Mixture,
    Normal,
    ParametricContinuous,
    ParametricDiscrete,
    privatize_univariate,
)

Z = 4.5
KS_QUANTILE = float(stats.kstwobign.isf(1e-6))

CONTINUOUS = {
    "uniform": stats.uniform(),
    "beta": stats.beta(2, 5),
    "normal": stats.norm(),
    "exponential": stats.expon(),
}


def _dist(name: str) -> ParametricContinuous:
    return Normal() if name == "normal" else ParametricContinuous(CONTINUOUS[name])


def test_mean_ks_at_n_1000_is_the_papers_0_027() -> None:
    """Spec §5.2: n = 1000, Unif/Beta/Normal/Exp, ε = 1..4: mean KS ≈ 0.027 (paper 26.9–27.6e-3).

    Exact invariance means each KS statistic follows the Kolmogorov–Smirnov
    law for n = 1000 (mean 0.0274, sd 0.0082); 400 replications give a mean
    within 4.5·0.0082/20 = 0.0019 of it, inside the spec's [0.025, 0.030].
    """
    n, reps = 1000, 25
    rng = np.random.default_rng(2024)
    ks, pvalues = [], []
    for name, law in CONTINUOUS.items():
        dist = _dist(name)
        for eps in (1.0, 2.0, 3.0, 4.0):
            for _ in range(reps):
                out = privatize_univariate(law.rvs(n, random_state=rng), dist, eps, rng)
                result = stats.kstest(out, law.cdf)
                ks.append(result.statistic)
                pvalues.append(result.pvalue)
    null = stats.kstwo(n)
    mean = float(np.mean(ks))
    assert abs(mean - null.mean()) <= Z * null.std() / math.sqrt(len(ks))
    assert 0.025 <= mean <= 0.030
    # pooled p-values are uniform (KS at the 1e-6 level over 400 values)
    assert stats.kstest(pvalues, "uniform").statistic < KS_QUANTILE / math.sqrt(len(pvalues))


@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_large_n_output_follows_f(name: str) -> None:
    n = 200_000
    rng = np.random.default_rng(5)
    law = CONTINUOUS[name]
    # the data follow F, so the output is an exact F-sample: its KS statistic is a null one
    out = privatize_univariate(law.rvs(n, random_state=rng), _dist(name), 1.0, rng)
    assert stats.kstest(out, law.cdf).statistic < KS_QUANTILE / math.sqrt(n)


@pytest.mark.parametrize(("eps", "rho"), [(1, 0.24), (2, 0.43), (3, 0.57), (4, 0.67)])
def test_record_level_spearman_matches_the_spec(eps: int, rho: float) -> None:
    """Spec §3.2: Spearman(Z, Z̃) ≈ 0.24/0.43/0.57/0.67 (±0.03) at ε = 1..4, any continuous F."""
    n = 20_000
    rng = np.random.default_rng(eps)
    z = rng.exponential(size=n)
    out = privatize_univariate(z, ParametricContinuous(stats.expon()), eps, rng)
    assert stats.spearmanr(z, out).statistic == pytest.approx(rho, abs=0.03)


DISCRETE = {
    "bernoulli": stats.bernoulli(0.1),
    "binomial": stats.binom(5, 0.5),
    "poisson": stats.poisson(3.0),
    "geometric": stats.geom(0.2),
}


@pytest.mark.parametrize("name", list(DISCRETE))
def test_discrete_output_pmf_equals_f(name: str) -> None:
    n = 100_000
    rng = np.random.default_rng(8)
    law = DISCRETE[name]
    out = privatize_univariate(law.rvs(n, random_state=rng), ParametricDiscrete(law), 1.0, rng)
    assert out.dtype == np.int64
    values = np.arange(out.min(), out.max() + 1)
    p = law.pmf(values)
    assert np.all(p > 0)  # the output never leaves the support
    freq = np.array([np.mean(out == v) for v in values])
    assert np.all(np.abs(freq - p) <= Z * np.sqrt(p * (1 - p) / n) + 1e-12)


def test_discrete_mean_error_equals_the_non_private_one() -> None:
    """Spec §5.1: with known F the output is an F-sample, so its mean errs like NP's."""
    n, reps = 1000, 200
    rng = np.random.default_rng(9)
    law = stats.poisson(3.0)
    dist = ParametricDiscrete(law)
    dip_err, np_err = [], []
    for _ in range(reps):
        z = law.rvs(n, random_state=rng)
        dip_err.append(abs(privatize_univariate(z, dist, 1.0, rng).mean() - 3.0))
        np_err.append(abs(z.mean() - 3.0))
    # both are |mean of n Poisson(3)| − 3: E = sqrt(2·3/(π n)) = 0.0437, sd 0.033;
    # the difference of two means of 200 has sd 0.0033 → 4.5 SE = 0.015
    assert np.mean(dip_err) == pytest.approx(np.mean(np_err), abs=0.015)


def test_mixed_zero_inflated_exponential() -> None:
    """Spec §8.5(4): atoms 0 (0.3) and 2 (0.1) on Exp(1): masses within 4.5 SE, KS on the rest."""
    n = 200_000
    rng = np.random.default_rng(10)
    kind = rng.random(n)
    z = rng.exponential(size=n)
    z[kind < 0.3] = 0.0
    z[(kind >= 0.3) & (kind < 0.4)] = 2.0
    dist = Mixture([0.0, 2.0], [0.3, 0.1], ParametricContinuous(stats.expon()))
    out = privatize_univariate(z, dist, 1.0, rng)
    for atom, mass in ((0.0, 0.3), (2.0, 0.1)):
        assert np.mean(out == atom) == pytest.approx(mass, abs=Z * math.sqrt(mass * (1 - mass) / n))
    rest = out[(out != 0.0) & (out != 2.0)]
    assert stats.kstest(rest, "expon").statistic < KS_QUANTILE / math.sqrt(rest.size)


def test_truncation_keeps_outputs_in_bounds_and_f_truncated() -> None:
    n = 100_000
    rng = np.random.default_rng(12)
    law = stats.truncnorm(-1.0, 2.0)
    out = privatize_univariate(law.rvs(n, random_state=rng), Normal(0.0, 1.0, -1.0, 2.0), 1.0, rng)
    assert out.min() >= -1.0 and out.max() <= 2.0
    assert stats.kstest(out, law.cdf).statistic < KS_QUANTILE / math.sqrt(n)


def test_far_tail_truncation_uses_the_accurate_side() -> None:
    """N(0, 1) truncated to [6, 7]: mass 1e-9, where 1 − cdf keeps only 7 digits; sf keeps all."""
    n = 50_000
    rng = np.random.default_rng(13)
    law = stats.truncnorm(6.0, 7.0)
    for dist in (Normal(0.0, 1.0, 6.0, 7.0), ParametricContinuous(stats.norm(), 6.0, 7.0)):
        out = privatize_univariate(law.rvs(n, random_state=rng), dist, 2.0, rng)
        assert stats.kstest(out, law.cdf).statistic < KS_QUANTILE / math.sqrt(n)


@pytest.mark.parametrize("eps", [1e-3, 1.0, 100.0])
def test_outputs_stay_finite_in_the_tails(eps: float) -> None:
    rng = np.random.default_rng(14)
    z = np.concatenate([rng.standard_cauchy(10_000), [1e300, -1e300, np.inf, -np.inf, np.nan]])
    for dist in (Normal(), ParametricContinuous(stats.t(1)), ParametricContinuous(stats.expon())):
        out = privatize_univariate(z, dist, eps, rng)
        assert np.all(np.isfinite(out))


def test_normal_fast_path_equals_scipy() -> None:
    fast, slow = Normal(3.0, 2.0, -1.0, None), ParametricContinuous(stats.norm(3.0, 2.0), -1.0)
    x = np.linspace(-1.0, 40.0, 2001)
    rng = np.random.default_rng(0)
    assert np.allclose(fast.pit(x, rng), slow.pit(x, rng), rtol=1e-12, atol=1e-15)
    g = np.concatenate([np.logspace(-300, -1, 300), np.linspace(0.1, 0.9, 81)])
    for lo, hi in ((g, 1.0 - g), (1.0 - g, g)):
        assert np.allclose(fast.quantile(lo, hi), slow.quantile(lo, hi), rtol=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    # probabilities are 0 or resolvable in double precision (>= 1e-9 of the total)
    probs=st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 1.0)), min_size=1, max_size=10)
    .filter(lambda p: sum(p) > 0),
    seed=st.integers(0, 2**32 - 1),
)
def test_finite_pmf_quantile_undoes_the_pit(probs: list[float], seed: int) -> None:
    support = np.arange(len(probs)) * 1.5 - 2.0
    dist = FinitePMF(support, probs)
    z = support[np.asarray(probs) > 0]
    u = dist.pit(z, np.random.default_rng(seed))
    assert np.array_equal(dist.quantile(u, 1.0 - u), z)
