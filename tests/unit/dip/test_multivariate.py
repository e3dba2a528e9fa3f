"""The sequential (Rosenblatt) chain: exact joint invariance, order invariance, per-record privacy.

Tolerances: a sample covariance entry of n Gaussian rows has standard error
sqrt((σ_ii σ_jj + σ_ij²)/n) <= sqrt(2/n)·max σ²; means sqrt(σ_ii/n); cell
frequencies sqrt(p(1 − p)/n); all at 4.5 standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms.dip import (
    Continuous,
    FinitePMF,
    Gaussian,
    Histogram,
    Lattice,
    NoiseStep,
    ParametricContinuous,
    ParametricDiscrete,
    Product,
    privatize,
    rank_correlation_at_scale,
)

Z = 4.5
COLUMNS = ("a", "b", "c", "d")
SIGMA = np.array([
    [1.0, 0.6, 0.3, -0.2],
    [0.6, 2.0, 0.5, 0.1],
    [0.3, 0.5, 1.5, 0.4],
    [-0.2, 0.1, 0.4, 1.0],
])
MU = np.array([1.0, -2.0, 0.0, 5.0])


def _gaussian_data(n: int, seed: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).multivariate_normal(MU, SIGMA, n)
    return {c: x[:, i] for i, c in enumerate(COLUMNS)}


def _matrix(out: dict[str, np.ndarray]) -> np.ndarray:
    return np.column_stack([out[c] for c in COLUMNS])


@pytest.mark.parametrize("order", [COLUMNS, ("d", "c", "b", "a"), ("c", "a", "d", "b")])
def test_known_gaussian_joint_is_kept_in_any_order(order: tuple[str, ...]) -> None:
    """Spec §8.5(6): p = 4, n = 2e5, ε = 1: covariance and mean of the output match Σ, μ."""
    n = 200_000
    ref = Gaussian(COLUMNS, MU, SIGMA)
    out = _matrix(privatize(_gaussian_data(n, 1), ref, 1.0, np.random.default_rng(2),
                            order=order))
    se_cov = np.sqrt((np.outer(np.diag(SIGMA), np.diag(SIGMA)) + SIGMA**2) / n)
    assert np.all(np.abs(np.cov(out, rowvar=False) - SIGMA) <= Z * se_cov)
    assert np.all(np.abs(out.mean(axis=0) - MU) <= Z * np.sqrt(np.diag(SIGMA) / n))
    # the spec's target (observed 0.42% there); the 4.5-SE bound above allows 1.4%, so this
    # stricter figure holds for this fixed seed rather than by construction
    assert np.max(np.abs(np.cov(out, rowvar=False) - SIGMA)) / np.max(np.abs(SIGMA)) < 0.01


def test_order_changes_records_but_not_the_distribution() -> None:
    n = 100_000
    data = _gaussian_data(n, 3)
    ref = Gaussian(COLUMNS, MU, SIGMA)
    one = _matrix(privatize(data, ref, 2.0, np.random.default_rng(4)))
    two = _matrix(privatize(data, ref, 2.0, np.random.default_rng(4), order=COLUMNS[::-1]))
    assert not np.allclose(one, two)  # different chains, different records ...
    # ... same law: two-sample KS per column and per random projection at the 1e-6 level
    bound = float(stats.kstwobign.isf(1e-6)) * math.sqrt(2.0 / n)
    rng = np.random.default_rng(5)
    for direction in [*np.eye(4), *rng.normal(size=(4, 4))]:
        assert stats.ks_2samp(one @ direction, two @ direction).statistic < bound


def test_rosenblatt_forward_gives_independent_uniforms() -> None:
    n = 100_000
    ref = Gaussian(COLUMNS, MU, SIGMA)
    u = ref.uniformize(_gaussian_data(n, 6), COLUMNS[::-1], np.random.default_rng(0))
    corr = np.corrcoef(u, rowvar=False)
    assert np.max(np.abs(corr - np.eye(4))) < Z / math.sqrt(n)  # se of a null correlation 1/√n
    bound = float(stats.kstwobign.isf(1e-6)) / math.sqrt(n)
    for col in u.T:
        assert stats.kstest(col, "uniform").statistic < bound


def test_product_of_mixed_families() -> None:
    n = 100_000
    rng = np.random.default_rng(7)
    laws = {"x": stats.gamma(2.0), "k": stats.poisson(4.0)}
    ref = Product({"x": ParametricContinuous(laws["x"]), "k": ParametricDiscrete(laws["k"]),
                   "c": FinitePMF([0, 1, 2], [0.2, 0.5, 0.3])})
    data = {"x": laws["x"].rvs(n, random_state=rng), "k": laws["k"].rvs(n, random_state=rng),
            "c": rng.choice(3, n, p=[0.2, 0.5, 0.3])}
    out = privatize(data, ref, 3.0, rng)
    assert stats.kstest(out["x"], laws["x"].cdf).statistic < 5.3 / math.sqrt(n)
    for v, p in enumerate([0.2, 0.5, 0.3]):
        assert np.mean(out["c"] == v) == pytest.approx(p, abs=Z * math.sqrt(p * (1 - p) / n))
    for v in range(12):
        p = laws["k"].pmf(v)
        assert np.mean(out["k"] == v) == pytest.approx(p, abs=Z * math.sqrt(p * (1 - p) / n))


def _histogram_reference() -> Histogram:
    conts = {"x": Continuous(0.0, 10.0), "k": Lattice(0, 5), "c": Lattice(0, 2)}
    edges = {"x": conts["x"].edges(4), "k": conts["k"].edges(3), "c": conts["c"].edges(3)}
    masses = np.random.default_rng(0).random((4, 3, 3)) ** 3  # uneven, some cells nearly empty
    masses[0, 0, :] = 0.0  # an empty prefix cell
    return Histogram(conts, edges, masses)


@pytest.mark.parametrize("order", [("x", "k", "c"), ("c", "x", "k"), ("k", "c", "x")])
def test_histogram_reference_keeps_its_joint_in_any_order(order: tuple[str, ...]) -> None:
    """Records drawn from the histogram come out with its cell frequencies, whatever the order."""
    n = 200_000
    ref = _histogram_reference()
    rng = np.random.default_rng(8)
    # sample records from the reference itself (uniform inside each cell)
    p = ref.masses.ravel()
    cells = np.unravel_index(rng.choice(p.size, n, p=p), ref.masses.shape)
    data = {}
    for axis, c in enumerate(ref.columns):
        e = ref.edges[c]
        v = e[cells[axis]] + rng.random(n) * np.diff(e)[cells[axis]]
        data[c] = ref.continualizers[c].ceiling(v)
    out = privatize(data, ref, 1.0, rng, order=order)
    counts = np.zeros(ref.masses.shape)
    index = tuple(
        ref.bin_of(c, ref.continualizers[c].forward(out[c], np.full(n, 0.5))) for c in ref.columns
    )
    np.add.at(counts, index, 1.0)
    freq = counts / n
    se = np.sqrt(ref.masses * (1 - ref.masses) / n)
    assert np.all(np.abs(freq - ref.masses) <= Z * se + 1e-12)


def test_per_record_audit_of_the_chain() -> None:
    """Two columns with ε/2 each: records (0, 0) and (1, 1) — the worst pair on Unif(0,1)²."""
    eps, n, bins = 1.0, 1_000_000, 6
    uniform = ParametricContinuous(stats.uniform())
    ref = Product({"a": uniform, "b": uniform})
    counts = []
    for value in (0.0, 1.0):
        data = {"a": np.full(n, value), "b": np.full(n, value)}
        out = privatize(data, ref, eps, np.random.default_rng(int(value) + 20))
        cell = np.minimum((out["a"] * bins).astype(int), bins - 1) * bins + np.minimum(
            (out["b"] * bins).astype(int), bins - 1)
        counts.append(np.bincount(cell, minlength=bins * bins).astype(float))
    c0, c1 = counts
    ratio = np.abs(np.log(c0 / c1))
    se = np.sqrt(1 / c0 + 1 / c1)
    assert np.all(ratio - 5 * se <= eps)
    assert np.max(ratio) > 0.7 * eps  # the pair really is far apart: the bound is nearly met


def test_budget_is_split_evenly_over_columns() -> None:
    """p columns each get ε/p: the chain's noise scale per column is the univariate one at ε/p."""
    step = NoiseStep.calibrate(0.25)
    uniform = ParametricContinuous(stats.uniform())
    n = 200_000
    ref = Product({c: uniform for c in COLUMNS})
    rng = np.random.default_rng(30)
    data = {c: rng.random(n) for c in COLUMNS}
    out = privatize(data, ref, 1.0, np.random.default_rng(31))
    rho = stats.spearmanr(data["a"], out["a"]).statistic
    assert rho == pytest.approx(rank_correlation_at_scale(step.b), abs=Z * 1.06 / math.sqrt(n))
