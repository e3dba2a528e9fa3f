"""Local quantization: exactly ⌊2^ε⌋ reachable outputs per record, whatever the floats."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import noiseless as nl
from mechanisms.noiseless import local

F = Fraction
HUGE = 1.7976931348623157e308


def _probe(lo: float, hi: float, edges: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Values an adversary would try: every edge and its neighbours, the bounds, beyond, NaN."""
    with np.errstate(over="ignore"):  # the neighbours of ±HUGE are ±inf: also worth a try
        around = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf)])
        beyond = [
            lo,
            hi,
            -np.inf,
            np.inf,
            np.nan,
            np.nextafter(lo, -np.inf),
            np.nextafter(hi, np.inf),
        ]
    inside = 2.0 * (lo / 2 + rng.uniform(0.0, 1.0, 2000) * (hi / 2 - lo / 2))
    return np.concatenate([around, inside, beyond])


@pytest.mark.parametrize("bits", [F(1), F(1585, 1000), F(2), F(5, 2), F(3), F(8), F(12)])
@pytest.mark.parametrize(
    "bounds",
    [(0.0, 1.0), (-3.7, 12.1), (-HUGE, HUGE), (5e-324, 1e-320), (1e15, 1e15 + 1e3), (-1e-300, 0.0)],
)
def test_continuous_count_is_levels(bits: Fraction, bounds: tuple[float, float]) -> None:
    plan = nl.plan_local(bits, bounds)
    k = nl.levels_for_bits(bits)
    assert plan.count == plan.quantizer.levels
    assert plan.count <= k
    assert plan.bits == min(bits, nl.bits_upper(plan.count))
    rng = np.random.default_rng(0)
    out = nl.quantize(_probe(*bounds, plan.quantizer.edges, rng), plan)
    assert np.all(np.isfinite(out))
    assert len(np.unique(out)) <= plan.count
    if plan.count == k:  # ordinary ranges: every bin is reachable and reached
        assert len(np.unique(out)) == k


def test_degenerate_range_shrinks_levels_to_what_floats_can_reach() -> None:
    """[1, 1 + 16 ulp] cannot hold 2^12 distinct bins; the plan charges only the reachable ones."""
    lo = 1.0
    hi = lo + 16 * math.ulp(1.0)
    plan = nl.plan_local(12, (lo, hi))
    assert plan.count == plan.quantizer.levels <= 17
    values = np.array([lo + k * math.ulp(1.0) for k in range(17)])
    out = nl.quantize(values, plan)
    assert len(np.unique(out)) == plan.count  # one-ulp bins still release distinct values
    assert np.all((out >= lo) & (out <= hi))
    again = nl.plan_local(plan.bits, (lo, hi))  # re-planned from its charge: same quantizer
    assert np.array_equal(again.quantizer.edges, plan.quantizer.edges)


def test_integer_column_counts_whole_numbers() -> None:
    plan = nl.plan_local(3, (17, 90), integer=True)
    assert plan.count == 8 and plan.bits == 3 and not plan.vacuous
    values = np.arange(0, 120)
    out = nl.quantize(values, plan)
    assert len(np.unique(out)) == 8
    assert np.all(np.abs(np.clip(values, 17, 90) - out) <= plan.max_error)
    exact = nl.plan_local(10, (17, 90), integer=True)  # 1024 levels, 74 values: identity
    assert exact.count == 74 and exact.vacuous and exact.max_error == 0
    assert np.array_equal(nl.quantize(values, exact), np.clip(values, 17, 90))
    assert exact.bits == nl.bits_upper(74)


def test_custom_edges() -> None:
    plan = nl.plan_local(2, (0, 100), edges=[0, 10, 50, 100])
    assert plan.count == 3 and plan.bits == nl.bits_upper(3) and not plan.uniform
    x = np.array([-1.0, 0.0, 9.99, 10.0, 49.0, 50.0, 100.0, 1e9, np.nan])
    assert nl.quantize(x, plan).tolist() == [5, 5, 5, 30, 30, 75, 75, 75, 5]
    inner = nl.plan_local(2, (0, 100), edges=[20, 30, 80])  # outer records clip onto the edges
    assert nl.quantize(np.array([0.0, 25.0, 100.0]), inner).tolist() == [25, 25, 55]
    assert inner.max_error == 45  # 100 -> 55
    with pytest.raises(ValueError, match="allows at most 4"):
        nl.plan_local(2, (0, 100), edges=[0, 1, 2, 3, 4, 5])
    with pytest.raises(ValueError):
        nl.plan_local(2, (0, 100), edges=[-1, 50])
    with pytest.raises(ValueError):
        nl.plan_local(2, (0, 100), edges=[0, 50, 50, 100])


def test_integer_edges_count_only_bins_holding_integers() -> None:
    plan = nl.plan_local(2, (0, 10), edges=[0, 0.2, 0.4, 3, 10], integer=True)
    # [0, .2) holds 0; [.2, .4) nothing; [.4, 3) holds 1, 2; [3, 10] holds 3..10
    assert plan.count == 3
    out = nl.quantize(np.arange(-2, 13), plan)
    assert len(np.unique(out)) == 3
    assert set(out.tolist()) == {0.0, 1.5, 6.5}


def test_brute_force_every_integer_record() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        lo = int(rng.integers(-50, 50))
        hi = lo + int(rng.integers(1, 60))
        bits = F(int(rng.integers(100, 800)), 100)
        plan = nl.plan_local(bits, (lo, hi), integer=True)
        out = nl.quantize(np.arange(lo - 3, hi + 4), plan)
        assert len(np.unique(out)) == plan.count <= nl.levels_for_bits(bits)
        assert plan.vacuous == (plan.count == hi - lo + 1)


def test_theorem_4_sanity_uniform_prior() -> None:
    """E|X − X̂|² for uniform X on [0, 1] is 2^(−2ε)/12 >= the bound 2^(−3ε)/64 (spec §4)."""
    x = np.random.default_rng(2).uniform(0, 1, 200_000)
    for bits in range(1, 7):
        plan = nl.plan_local(bits, (0, 1))
        mse = float(np.mean((x - nl.quantize(x, plan)) ** 2))
        assert mse == pytest.approx(2.0 ** (-2 * bits) / 12, rel=0.03)
        assert mse >= 2.0 ** (-3 * bits) / 64


def test_levels_cap_and_describe() -> None:
    plan = nl.plan_local(30, (0, 1))
    assert plan.count == local.MAX_LEVELS and plan.bits == 20
    doc = local.describe(plan)
    assert doc["levels"] == 2**20 and "edges" not in doc
    small = local.describe(nl.plan_local(2, (0, 1)))
    assert small["edges"] == [0, 0.25, 0.5, 0.75, 1] and small["kind"] == "uniform"


@settings(max_examples=80, deadline=None)
@given(
    st.floats(-1e300, 1e300),
    st.floats(1e-300, 1e300),
    st.fractions(min_value=1, max_value=16, max_denominator=100),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=200),
)
def test_local_property(lo: float, width: float, bits: Fraction, data: list[float]) -> None:
    hi = lo + width
    if not (lo < hi and math.isfinite(hi)):
        return
    plan, out = nl.local_release(np.array(data), bits, (lo, hi))
    assert plan.count <= nl.levels_for_bits(bits)
    assert len(np.unique(out)) <= plan.count
    assert np.all((out >= lo) & (out <= hi))
    clipped = np.clip(np.nan_to_num(np.array(data), nan=lo), lo, hi)
    assert np.all(np.abs(clipped - out) <= plan.max_error)
