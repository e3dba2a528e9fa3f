"""Quantiles by permute-and-flip with exact coins: distribution, sensitivity, accuracy."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import marshmallow
import numpy as np
import pytest

from mechanisms import flip, registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.dp import quantiles

Z = 4.5
META = DatasetMeta(200, {"x": ColumnMeta("x", "continuous", bounds=(0.0, 10.0)),
                         "c": ColumnMeta("c", "categorical", categories=("a", "b"))})


def _plan(raw: dict[str, Any], epsilon: Fraction = Fraction(1),
          meta: DatasetMeta = META) -> quantiles.QuantilePlan:
    mech = registry.get("laplace")
    return quantiles.plan("laplace", mech.load_params({"statistic": "quantile", "column": "x",
                                                       **raw}), {"epsilon": epsilon}, meta)


def _pf_probabilities(gaps: list[Fraction], epsilon: Fraction) -> list[float]:
    """Permute-and-flip's output law by enumerating the orders (McKenna & Sheldon 2020)."""
    p = [math.exp(-float(epsilon * g / 2)) for g in gaps]
    out = [0.0] * len(gaps)
    orders = list(itertools.permutations(range(len(gaps))))
    for order in orders:
        reach = 1.0
        for j in order:
            out[j] += reach * p[j] / len(orders)
            reach *= 1 - p[j]
    return out


def test_choose_follows_the_permute_and_flip_law() -> None:
    """Catches a coin of exp(−ε·gap) (missing the ½ of sensitivity-1 PF) or a biased order."""
    plan = _plan({"quantiles": [0.5], "grid_size": 4}, Fraction(3, 2))
    gaps = [Fraction(0), Fraction(1), Fraction(5, 2), Fraction(1, 2)]
    expected = _pf_probabilities(gaps, plan.epsilon)
    rng = np.random.default_rng(7)
    runs = 10_000
    exact = quantiles.Gaps.of(gaps)
    assert exact == quantiles.Gaps([0, 2, 5, 1], 2)
    counts = np.bincount([plan.choose(rng, exact) for _ in range(runs)], minlength=4)
    for c, p in zip(counts, expected, strict=True):
        assert abs(c / runs - p) <= Z * math.sqrt(p * (1 - p) / runs)


def test_utility_has_sensitivity_one_by_brute_force() -> None:
    """Replacing one record moves every candidate's rank by at most 1 (n public)."""
    meta = DatasetMeta(6, {"x": ColumnMeta("x", "integer", bounds=(0, 4))})
    plan = _plan({"quantiles": [0.3], "grid_size": 9}, meta=meta)
    rng = np.random.default_rng(0)
    worst = 0
    for _ in range(20):
        x = rng.integers(0, 5, 6)
        base = plan.ranks({"x": x})
        for v in range(5):
            y = x.copy()
            y[int(rng.integers(6))] = v
            worst = max(worst, int(np.max(np.abs(plan.ranks({"x": y}) - base))))
    assert worst == 1


def test_rank_error_bound_holds_at_95_percent() -> None:
    rng = np.random.default_rng(4)
    data = {"x": rng.gamma(2.0, 1.5, 200), "c": np.zeros(200, dtype=np.int64)}
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "quantile", "column": "x",
                               "quantiles": [0.1, 0.5, 0.9], "grid_size": 201})
    budget = {"epsilon": Fraction(3, 4)}
    plan = quantiles.plan("laplace", params, budget, META)
    assert plan.epsilon == Fraction(1, 4)
    bound = mech.accuracy(params, budget, META)["ci95_rank_error"]
    assert bound == flip.worst_case_gap(Fraction(1, 4), 201, 0.95)
    ranks = plan.ranks(data)
    grid = np.asarray(plan.grid)
    hits = runs = 0
    for _ in range(150):
        out = mech.run(data, params, budget, META, rng).result
        for q, value in zip(out["quantiles"], out["values"], strict=True):
            loss = np.abs(ranks - q * 200)
            hits += int(loss[int(np.flatnonzero(grid == value)[0])] <= loss.min() + bound)
            runs += 1
    assert hits / runs >= 0.95 - Z * math.sqrt(0.95 * 0.05 / runs)


def test_rank_error_bound_is_the_worst_case_and_holds_there() -> None:
    """Issue #32 item 3: the stated rank error is permute-and-flip's exact worst case, not a
    union bound. Data whose ranks jump by G at the median's grid point (every other candidate
    G below the best, G the first integer past the bound) fail it as often as the bound's
    level allows (the exact law, ``flip.probabilities``) and no more than 5 %; the union
    bound (2/ε)(ln m + ln 20) stated before is never exceeded on them (it is > G)."""
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "quantile", "column": "x", "quantiles": [0.5],
                               "grid_size": 11})
    eps = Fraction(99, 400)  # the bound, 36.96, is just below G = 37
    budget = {"epsilon": eps}
    bound = mech.accuracy(params, budget, META)["ci95_rank_error"]
    gap = math.floor(bound) + 1
    assert gap < 2 / float(eps) * (math.log(11) + math.log(20))
    # grid 0, 1, ..., 10: #{x <= c} is 100 − G below 5, 100 at 5, 100 + G from 6 to 9
    x = np.repeat([0.0, 4.5, 5.5, 10.0], [100 - gap, gap, gap, 100 - gap])
    data = {"x": x, "c": np.zeros(200, dtype=np.int64)}
    plan = quantiles.plan("laplace", params, budget, META)
    loss = np.abs(plan.ranks(data) - 100)
    assert loss.min() == 0 and sorted(set(loss.tolist())) == [0, gap, 100]
    law = flip.probabilities([float(plan.epsilon) * g / 2 for g in loss])
    exact = float(law[loss > bound].sum())
    assert 0.044 <= exact <= 0.05
    assert plan.epsilon == eps
    rng = np.random.default_rng(32)
    runs = 4000
    grid = np.asarray(plan.grid)
    fails = 0
    for _ in range(runs):
        value = mech.run(data, params, budget, META, rng).result["values"][0]
        fails += int(loss[int(np.flatnonzero(grid == value)[0])] > bound)
    se = math.sqrt(exact * (1 - exact) / runs)
    assert abs(fails / runs - exact) <= Z * se
    assert fails / runs <= 0.05 + Z * math.sqrt(0.05 * 0.95 / runs)


@pytest.mark.parametrize("m", [2, 3, 11, 201, 1001])
def test_rank_error_bound_solves_the_worst_case_law(m: int) -> None:
    """At the bound, the worst case (one best, m − 1 at the bound's gap) fails 5 % exactly,
    by permute-and-flip's exact law."""
    eps = Fraction(1, 2)
    bound = flip.worst_case_gap(eps, m, 0.95)
    law = flip.probabilities([0.0] + [float(eps) * bound / 2] * (m - 1))
    assert 1 - law[0] == pytest.approx(0.05, rel=1e-6)
    assert 1 - law[0] <= 0.05


def test_large_budget_finds_the_exact_quantile() -> None:
    """With ε large the best grid point wins: the empirical median of a known sample."""
    data = {"x": np.arange(200, dtype=np.float64) / 20.0, "c": np.zeros(200, dtype=np.int64)}
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "quantile", "column": "x", "quantiles": [0.5],
                               "grid_size": 101})
    out = mech.run(data, params, {"epsilon": Fraction(100)}, META, np.random.default_rng(0))
    assert out.result["values"] == [pytest.approx(4.9, abs=0.1)]
    assert "pure epsilon-DP" in out.guarantee


@pytest.mark.parametrize(("name", "raw", "field"), [
    ("gaussian", {"column": "x", "quantiles": [0.5]}, "params.statistic"),
    ("geometric", {"column": "x", "quantiles": [0.5]}, "params.statistic"),
    ("laplace", {"column": "c", "quantiles": [0.5]}, "params.column"),
])
def test_quantile_input_errors_name_the_field(name: str, raw: dict[str, Any],
                                              field: str) -> None:
    mech = registry.get(name)
    budget = {"epsilon": Fraction(1)}
    if name == "gaussian":
        budget["delta"] = Fraction(1, 10**6)
    with pytest.raises(MechanismInputError) as err:
        mech.cost(mech.load_params({"statistic": "quantile", **raw}), budget, META)
    assert err.value.field == field


@pytest.mark.parametrize(("raw", "key"), [
    ({"column": "x"}, "quantiles"),
    ({"column": "x", "quantiles": [1.5]}, "quantiles"),
    ({"column": "x", "quantiles": []}, "quantiles"),
    ({"column": "x", "quantiles": [0.5], "grid_size": 10**6}, "grid_size"),
    ({"column": "x", "quantiles": [0.5], "grid_size": 1}, "grid_size"),
    ({"column": "x", "quantiles": [0.5], "bins": 3}, "bins"),
])
def test_schema_rejects_bad_quantile_params(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(marshmallow.ValidationError) as err:
        registry.get("laplace").load_params({"statistic": "quantile", **raw})
    assert key in err.value.messages


def test_work_counts_the_coins_of_many_quantiles_on_a_fine_grid() -> None:
    """Few rows but 99 quantiles on 10^4 candidates: the coins dominate, and the field a
    caller can lower is grid_size (the default estimate would say 4 passes over 200 rows)."""
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "quantile", "column": "x", "grid_size": 10_000,
                               "quantiles": [i / 100 for i in range(1, 100)]})
    work = mech.work(params, META)
    assert work.field == "params.grid_size"
    assert work.units >= 99 * 10_000 * quantiles.COIN_UNITS
    small = mech.work(mech.load_params({"statistic": "quantile", "column": "x",
                                        "quantiles": [0.5], "grid_size": 5}), META)
    assert small.units == 200 * 4 and small.field == "dataset_id"


def test_choose_law_across_blocks() -> None:
    """One best candidate among 600 others whose coins accept with p = e^-6.2: PF outputs it
    with probability (1/601) Σ_k (1 − p)^k, mostly after a block of 256 rejections; and a
    lone winner among huge gaps is always found (rejections skip correctly past blocks)."""
    plan = _plan({"quantiles": [0.5], "grid_size": 11}, Fraction(2))
    m = 601
    gaps = quantiles.Gaps([0] + [31] * (m - 1), 5)  # gap 31/5: γ = ε·gap/2 = 6.2
    p = math.exp(-6.2)
    expected = (1 - (1 - p) ** m) / (m * p)
    rng = np.random.default_rng(3)
    runs = 1500
    hits = sum(plan.choose(rng, gaps) == 0 for _ in range(runs))
    assert abs(hits / runs - expected) <= Z * math.sqrt(expected * (1 - expected) / runs)
    lone = [Fraction(10**6)] * 999 + [Fraction(0)]
    assert all(plan.choose(rng, lone) == 999 for _ in range(20))


def test_choose_flips_every_coin_whatever_the_ranks() -> None:
    """Issue #27: permute-and-flip stopping at the first head read as many random words as
    coins it flipped, a number that depends on the ranks (the data), and so did its run
    time. Now every candidate's coin is flipped: the same seed on neighbours (one record
    moved from lo to hi) reads exactly the same words, whatever the release (at ε = 40 few
    coins come up, so the old sampler's stopping block told the neighbours apart)."""
    plan = _plan({"quantiles": [0.5, 0.9], "grid_size": 1001}, Fraction(80))
    d = {"x": np.linspace(0.0, 10.0, META.n_rows)}
    d2 = {"x": d["x"].copy()}
    d2["x"][0] = 10.0
    ranks = [plan.ranks(d), plan.ranks(d2)]
    for seed in range(10):
        states = []
        for r in ranks:
            rng = np.random.default_rng(seed)
            for q in plan.quantiles:
                plan.choose(rng, plan.gaps(r, q))
            states.append(rng.bit_generator.state)
        assert states[0] == states[1]


def _kth(x: np.ndarray, q: float) -> float:
    """x_q: the ⌈q·n⌉-th smallest clipped value (the first when q·n = 0)."""
    k = max(1, math.ceil(Fraction(q) * x.size))
    return float(np.sort(np.clip(x, 0.0, 10.0))[k - 1])


@pytest.mark.parametrize("shape", ["gamma", "all_at_hi", "all_at_lo"])
def test_units_interval_covers_the_quantile(shape: str) -> None:
    """Issue #32 item 3: ``interval: true`` gives each quantile an interval in the column's
    units that holds x_q at >= 95 %, also on the data whose point release is a uniform grid
    point (every value at hi, or at lo: no interval read off the point could cover)."""
    rng = np.random.default_rng(11)
    x = {"gamma": np.clip(rng.gamma(2.0, 1.5, 200), 0, 10), "all_at_hi": np.full(200, 10.0),
         "all_at_lo": np.zeros(200)}[shape]
    data = {"x": x, "c": np.zeros(200, dtype=np.int64)}
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "quantile", "column": "x",
                               "quantiles": [0.1, 0.5, 0.9], "grid_size": 101,
                               "interval": True})
    budget = {"epsilon": Fraction(9, 2)}
    acc = mech.accuracy(params, budget, META)
    assert acc["epsilon_per_quantile"] == 0.5  # 3 quantiles × 3 draws
    assert acc["interval_rank_margin"] > acc["ci95_rank_error"]
    hits = runs = 0
    widths = []
    for _ in range(200):
        out = mech.run(data, params, budget, META, rng).result
        assert out["interval_level"] == 0.95
        for q, (low, high) in zip(out["quantiles"], out["intervals"], strict=True):
            assert 0.0 <= low <= high <= 10.0
            hits += int(low <= _kth(x, q) <= high)
            runs += 1
            widths.append(high - low)
    assert hits / runs >= 0.95 - Z * math.sqrt(0.95 * 0.05 / runs)
    if shape == "gamma":
        assert float(np.median(widths)) < 5.0  # informative, not [lo, hi]


def test_cell_gaps_have_sensitivity_one_and_a_zero() -> None:
    """Cells (c_{j−1}, c_j]: loss = distance from the target rank to [F(c_{j−1}), F(c_j)];
    replacing one record moves each loss by at most 1, and one cell has loss 0."""
    meta = DatasetMeta(6, {"x": ColumnMeta("x", "integer", bounds=(0, 4))})
    plan = _plan({"quantiles": [0.3], "grid_size": 9}, meta=meta)
    rng = np.random.default_rng(5)
    for target in (Fraction(0), Fraction(9, 5), Fraction(6)):
        worst = 0
        for _ in range(30):
            x = rng.integers(0, 5, 6)
            base = quantiles.cell_gaps(plan.ranks({"x": x}), target)
            assert min(base.numerators) == 0
            y = x.copy()
            y[int(rng.integers(6))] = int(rng.integers(5))
            other = quantiles.cell_gaps(plan.ranks({"x": y}), target)
            # before the shift by the best (0 on both sides: target in [0, n])
            worst = max(worst, max(abs(a - b) for a, b in zip(base.numerators,
                                                               other.numerators, strict=True)))
        assert worst <= base.denominator


def test_interval_is_a_quantile_parameter_only() -> None:
    mech = registry.get("laplace")
    with pytest.raises(marshmallow.ValidationError):
        mech.load_params({"statistic": "mean", "column": "x", "interval": True})
