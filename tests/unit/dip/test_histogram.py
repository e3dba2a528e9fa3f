"""The `dp` reference: a noisy (joint) histogram, made monotone, then DIP with the rest of ε."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.dip import Continuous, Lattice, dp_histogram, project_simplex
from mechanisms.dip.histogram import default_bins, histogram_counts, noise_scale

DKW_DELTA = 1e-6


@settings(max_examples=150, deadline=None)
@given(
    noisy=st.lists(st.integers(-50, 200), min_size=1, max_size=40),
    total=st.integers(1, 500),
)
def test_simplex_projection(noisy: list[int], total: int) -> None:
    y = np.array(noisy, dtype=float)
    c = project_simplex(y, float(total))
    assert np.all(c >= 0)
    assert c.sum() == pytest.approx(total, rel=1e-12)
    # KKT: c = max(y − τ, 0) for one τ, so every positive entry is shifted by the same amount
    shift = (y - c)[c > 0]
    assert np.ptp(shift) <= 1e-9 * max(1.0, float(np.abs(y).max()))
    assert np.all(y[c == 0] <= shift[0] + 1e-9)
    # feasible points are left alone
    assert np.allclose(project_simplex(c, float(total)), c)


def test_noise_scale_is_two_over_epsilon_rounded_up() -> None:
    for eps in (Fraction(1, 2), Fraction(1, 3), Fraction(7, 10), Fraction(100)):
        s = noise_scale(eps)
        assert Fraction(s) >= 2 / eps and Fraction(s) < (2 / eps) * (1 + Fraction(1, 2**51))


def test_default_bins_follow_public_inputs() -> None:
    conts = [Continuous(0.0, 1.0), Lattice(0, 2), Lattice(0, 1000)]
    bins = default_bins(100_000, 0.5, conts)
    assert bins[1] == 3  # small domains: one bin per value
    assert bins[0] == bins[2] >= 2
    assert math.prod(bins) <= max(2.0, 0.02 * 100_000 * 0.5) * 1.01
    assert default_bins(100, 0.01, [Continuous(0.0, 1.0)]) == [2]


def test_counts_put_each_record_in_its_cell() -> None:
    conts = {"x": Continuous(0.0, 1.0), "k": Lattice(1, 6)}
    edges = {"x": conts["x"].edges(4), "k": conts["k"].edges(3)}
    # the ends of the range belong to the first and last bins; k 1, 2 share the bin {1, 2}
    data = {"x": np.array([0.0, 0.2, 0.3, 1.0, 7.0, np.nan]), "k": np.array([1, 2, 3, 6, 0, 9])}
    counts = histogram_counts(data, conts, edges)
    expected = np.zeros((4, 3))
    expected[0, 0] = 2  # (0, 1), (0.2, 2)
    expected[1, 1] = 1  # (0.3, 3)
    expected[3, 2] = 1  # (1, 6)
    expected[3, 0] = 1  # (7, 0): x clipped to 1, k to 1
    expected[0, 2] = 1  # (missing, 9): x counts as the lower bound, k is clipped to 6
    assert np.array_equal(counts, expected)


def test_dp_histogram_is_close_to_the_counts_at_large_epsilon() -> None:
    rng = np.random.default_rng(0)
    conts = {"x": Continuous(0.0, 1.0)}
    data = {"x": rng.random(10_000)}
    ref = dp_histogram(data, conts, {"x": 10}, Fraction(1000), rng)
    exact = histogram_counts(data, conts, {"x": conts["x"].edges(10)}) / 10_000
    # noise scale 0.002 counts: the projected masses are the exact ones to 1e-4
    assert np.allclose(ref.masses, exact, atol=1e-4)


META_ROWS = {n: DatasetMeta(n, {"z": ColumnMeta("z", "continuous", (0.0, 1.0))})
             for n in (1_000, 10_000, 100_000)}


def test_cost_is_the_budget_and_the_split_is_exact() -> None:
    mech = registry.get("dip")
    params = mech.load_params({"columns": ["z"], "reference": {"kind": "dp", "share": 0.3}})
    budget = {"epsilon": Fraction(3, 2)}
    assert mech.cost(params, budget, META_ROWS[1_000]) == budget
    plan = mech.plan(params, budget, META_ROWS[1_000])
    assert plan.epsilon_ref == Fraction(9, 20) and plan.epsilon_dip == Fraction(21, 20)
    assert plan.epsilon_ref + plan.epsilon_dip == Fraction(3, 2)


def test_output_distribution_approaches_the_data() -> None:
    """KS(output, data) <= noise TV (×2 for the projection) + one bin's mass + 2 DKW terms."""
    mech = registry.get("dip")
    params = mech.load_params({"columns": ["z"]})
    law = stats.beta(2, 5)
    distances = []
    for n, meta in META_ROWS.items():
        rng = np.random.default_rng(n)
        z = law.rvs(n, random_state=rng)
        cost = mech.cost(params, {"epsilon": Fraction(1)}, meta)
        out = mech.run({"z": z}, params, cost, meta, np.random.default_rng(n + 1))
        ks = stats.ks_2samp(out.table["z"], z).statistic
        hist = out.accuracy["histogram"]
        bin_mass = law.pdf(law.ppf(0.5 / 2.5)) / hist["bins"]["z"] * 2.5  # ≥ max density / bins
        dkw = math.sqrt(math.log(2 / DKW_DELTA) / (2 * n))
        assert ks <= 2 * hist["tv_noise_approx"] + bin_mass + 2 * dkw
        distances.append(ks)
    assert distances[-1] < distances[0] / 4


def test_joint_dp_reference_keeps_the_dependence() -> None:
    """Three columns: correlations survive binning and noise.

    The noise moves at most about twice the expected total variation of the
    noisy histogram (``tv_noise_approx``, the projection can double it), and a
    correlation moves by at most twice the mass moved; sampling adds 4.5 SE
    (1/√n each); uniform-within-cell sampling adds w²/12 to each variance of
    0.02, which lowers a correlation of 0.7 by about 0.012 at 16 bins.
    """
    n = 100_000
    rng = np.random.default_rng(3)
    x = np.clip(rng.multivariate_normal([0.5, 0.5], [[0.02, 0.014], [0.014, 0.02]], n), 0, 1)
    k = np.clip(np.round(x[:, 0] * 10 + rng.normal(0, 1, n)), 0, 10).astype(np.int64)
    meta = DatasetMeta(n, {"a": ColumnMeta("a", "continuous", (0.0, 1.0)),
                           "b": ColumnMeta("b", "continuous", (0.0, 1.0)),
                           "k": ColumnMeta("k", "integer", (0, 10))})
    mech = registry.get("dip")
    params = mech.load_params(
        {"columns": ["a", "b", "k"], "reference": {"kind": "dp", "share": 0.5, "bins": 16}}
    )
    cost = mech.cost(params, {"epsilon": Fraction(4)}, meta)
    out = mech.run({"a": x[:, 0], "b": x[:, 1], "k": k}, params, cost, meta,
                   np.random.default_rng(4))
    t = out.table
    before = np.corrcoef([x[:, 0], x[:, 1], k])
    after = np.corrcoef([t["a"], t["b"], t["k"].astype(float)])
    tv = out.accuracy["histogram"]["tv_noise_approx"]
    assert out.accuracy["histogram"]["cells"] == 16 * 16 * 11
    assert np.max(np.abs(after - before)) < 4 * tv + 2 * 4.5 / math.sqrt(n) + 0.015
