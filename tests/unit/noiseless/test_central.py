"""Aggregates: Definition 1 brute-forced, float fuzz through the production path, exact sums.

Every count of distinct outputs here is taken over *all* values of the
other records (finite domains) or over adversarial alignments of the slice
with the bin edges (real domains), and compared with ⌊2^ε⌋ — never e^ε.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import noiseless as nl
from mechanisms.noiseless import central
from tests.unit.noiseless.brute import grid, worst_slice_count, worst_tuple_count

F = Fraction
BUDGETS = [F(1), F(1585, 1000), F(2), F(5, 2), F(3)]


def _index(quantizer: nl.UniformQuantizer, scale: int, total: Fraction) -> int:
    """Bin of the query value total / scale (scale n for a mean, 1 for a sum)."""
    return quantizer.index(total / scale)


# --------------------------------------------------------------------------- finite domains


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 3, 7, 20])
def test_definition_1_brute_force_mean_and_sum(n: int, m: int) -> None:
    domain = grid(m)
    for statistic, bits in itertools.product(("mean", "sum"), BUDGETS):
        plan = nl.plan(nl.bounded_query(statistic, (0, 1), n), bits)
        scale = n if statistic == "mean" else 1
        worst = worst_slice_count(partial(_index, plan.quantizer, scale), domain, n)
        assert worst <= plan.count <= nl.levels_for_bits(bits)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 50])
def test_definition_1_brute_force_count(n: int) -> None:
    for bits in BUDGETS:
        plan = nl.plan(nl.bounded_query("count", (0, 1), n), bits)
        worst = worst_slice_count(plan.quantizer.index, [F(0), F(1)], n)
        assert worst <= plan.count == 2  # a record meets the condition or not
        assert plan.bits == 1 and plan.vacuous


def test_sumset_shortcut_agrees_with_literal_definition() -> None:
    domain = grid(3)
    for n, bits in itertools.product((2, 3), BUDGETS):
        plan = nl.plan(nl.bounded_query("mean", (0, 1), n), bits)

        def mean_out(t: F, p: nl.ScalarPlan = plan, k: int = n) -> int:
            return p.quantizer.index(t / k)

        def tuple_out(x: tuple[F, ...], p: nl.ScalarPlan = plan, k: int = n) -> int:
            return p.quantizer.index(sum(x, F(0)) / k)

        assert worst_slice_count(mean_out, domain, n) == worst_tuple_count(tuple_out, domain, n)


def test_values_exactly_on_bin_edges_production_path() -> None:
    """Integer records 0..12, n = 4, ε = 2: q* = 3·4 = 12 puts every edge on an integer mean."""
    query = nl.bounded_query("mean", (0, 12), 4, integer=True)
    plan = nl.plan(query, 2)
    assert plan.quantizer.levels == 12 and plan.quantizer.width == 1
    worst, on_edge = 0, 0
    for rest in itertools.product(range(13), repeat=3):
        outs = set()
        for v in range(13):
            value = central.evaluate(query, np.array((v, *rest), dtype=np.int64))
            on_edge += value.denominator == 1
            outs.add(central.release(value, plan).index)
        worst = max(worst, len(outs))
    assert on_edge > 0
    assert worst == plan.count == 4  # the worst case is attained, never exceeded


def test_integer_domain_caps_the_count() -> None:
    """A mean of 0/1 records has 2 values per record: more bits buy nothing, charge 1."""
    plan = nl.plan(nl.bounded_query("mean", (0, 1), 10, integer=True), 5)
    assert plan.allowed == 32 and plan.count == 2 and plan.bits == 1 and plan.vacuous
    wide = nl.plan(nl.bounded_query("mean", (0, 1000), 10, integer=True), 5)
    assert wide.count == 32 and wide.bits == 5 and not wide.vacuous


def test_huge_budgets_are_capped() -> None:
    plan = nl.plan(nl.bounded_query("mean", (0, 1), 7), 100)
    assert plan.count == nl.MAX_COUNT and plan.bits == 40
    again = nl.plan(nl.bounded_query("mean", (0, 1), 7), plan.bits)
    assert again.quantizer == plan.quantizer  # the charge re-plans to the same quantizer


# --------------------------------------------------------------------------- real domains


def _random_bounds(rnd: random.Random) -> tuple[float, float]:
    scale = 10.0 ** rnd.uniform(-300, 300)
    lo = rnd.uniform(-1, 1) * scale
    width = scale * 10.0 ** rnd.uniform(-12, 0.3)
    return lo, lo + width


def _fuzz_one(rnd: random.Random, n: int, bounds: tuple[float, float], bits: Fraction) -> int:
    """Align the slice with edges in every way floats allow; count outputs via ``evaluate``.

    Returns how many slices reached the certified count (the adversary's success).
    """
    lo, hi = bounds
    statistic = rnd.choice(["mean", "sum"])
    try:
        query = nl.bounded_query(statistic, bounds, n)
    except ValueError:
        return 0  # n·bounds overflow: refused, nothing to check
    plan = nl.plan(query, bits)
    qz = plan.quantizer
    scale = n if statistic == "mean" else 1  # query value = (others' sum + x_i) / scale
    attained = 0
    for _ in range(4):
        k = rnd.randint(0, qz.levels)
        edge = qz.lower + qz.width * k
        target = float(edge * scale - F(lo))  # others' sum putting x_i = lo on the edge
        target += rnd.choice([0.0, 1.0, -1.0]) * abs(target) * 2.0**-52
        each = min(max(target / max(n - 1, 1), lo), hi)
        others = np.full(n - 1, each)
        s = nl.exact_float_sum(others)
        candidates = [lo, hi, rnd.uniform(lo, hi)]
        for j in range(k, min(k + plan.count + 2, qz.levels + 1)):
            pre = float((qz.lower + qz.width * j) * scale - s)
            candidates += [pre, math.nextafter(pre, math.inf), math.nextafter(pre, -math.inf)]
        outs = set()
        for v in candidates:
            if not math.isfinite(v):
                continue
            value = central.evaluate(query, np.append(others, v))
            assert value == (s + F(min(max(v, lo), hi))) / scale
            outs.add(qz.index(value))
        assert len(outs) <= plan.count <= nl.levels_for_bits(bits)
        attained += len(outs) == plan.count
        released = central.release(value, plan)
        assert released.index == qz.index(value)
        assert released.bin[0] <= released.value <= released.bin[1]
    return attained


def test_float_fuzz_random_bounds_seeded() -> None:
    rnd = random.Random(11)
    attained = 0
    for _ in range(60):
        n = rnd.randint(1, 40)
        bits = F(rnd.randint(100, 600), 100)
        attained += _fuzz_one(rnd, n, _random_bounds(rnd), bits)
    assert attained >= 60  # the alignments really are worst cases: the bound is tight


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 30),
    st.floats(-1e300, 1e300),
    st.floats(1e-300, 1e300),
    st.fractions(min_value=1, max_value=6, max_denominator=1000),
    st.randoms(use_true_random=False),
)
def test_float_fuzz_property(
    n: int, lo: float, width: float, bits: Fraction, rnd: random.Random
) -> None:
    hi = lo + width
    if not (lo < hi and math.isfinite(hi)):
        return
    _fuzz_one(rnd, n, (lo, hi), bits)


def test_exact_evaluation_beats_float_mean() -> None:
    """Catastrophic cancellation: the float mean is 0, the exact mean 1/3."""
    x = np.array([1e16, 1.0, -1e16])
    query = nl.bounded_query("mean", (-1e16, 1e16), 3)
    assert central.evaluate(query, x) == F(1, 3)
    assert float(np.mean(x)) == 0.0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=60))
def test_exact_float_sum_is_exact(values: list[float]) -> None:
    assert nl.exact_float_sum(np.array(values, dtype=np.float64)) == sum(map(F, values), F(0))


def test_exact_sums_extremes() -> None:
    x = np.array([5e-324, 1.7976931348623157e308, -1.7976931348623157e308, 2.0**-1074, 1.5])
    assert nl.exact_float_sum(x) == sum(map(F, x.tolist()), F(0))
    big = np.full(1000, 2**62, dtype=np.int64)
    big[::2] = -(2**63)
    assert nl.exact_int_sum(big) == sum(int(v) for v in big)
    with pytest.raises(ValueError):
        nl.exact_float_sum(np.array([np.inf]))


def test_clipping_and_missing_values() -> None:
    query = nl.bounded_query("sum", (0, 10), 4)
    assert central.evaluate(query, np.array([-5.0, np.nan, 3.5, 99.0])) == F(0 + 0 + 7, 2) + 10
    iq = nl.bounded_query("sum", (0.5, 10.5), 3, integer=True)  # bounds round in: [1, 10]
    assert iq.record_bounds == (1, 10) and iq.domain_size == 10
    assert central.evaluate(iq, np.array([0, 5, 50])) == 16
    assert central.evaluate(iq, np.array([0.2, 5.4, np.nan])) == 1 + 5 + 1  # rounded, clipped
    with pytest.raises(ValueError):
        central.evaluate(query, np.zeros(3))


# --------------------------------------------------------------------------- plans


def test_aggregate_notebook_entry_point() -> None:
    x = np.random.default_rng(5).uniform(0, 100, 300)
    plan, out = nl.aggregate(x, "mean", 2, (0, 100))
    assert plan.quantizer.levels == 900 and plan.count == 4 and plan.bits == 2  # (K − 1)·n
    exact = nl.exact_float_sum(x) / 300
    assert abs(F(out.value) - exact) <= plan.max_error * (1 + F(1, 10**12))
    assert out.bin[0] <= float(exact) <= out.bin[1]
    assert out.as_dict()["bin_index"] == out.index
    _, count = nl.aggregate(x > 50, "count", 3)
    assert abs(count.value - int(np.count_nonzero(x > 50))) <= 0.51


def test_bounded_query_table_and_refusals() -> None:
    q = nl.bounded_query("sum", (-2, 3), 7)
    assert (q.lower, q.upper, q.sensitivity, q.span / q.sensitivity) == (-14, 21, 5, 7)
    q = nl.bounded_query("mean", (-2, 3), 7)
    assert (q.lower, q.upper, q.sensitivity) == (-2, 3, F(5, 7))
    with pytest.raises(ValueError):
        nl.bounded_query("sum", (0, 1e308), 10)  # n·hi overflows the output's double
    with pytest.raises(ValueError):
        nl.bounded_query("mode", (0, 1), 3)
    with pytest.raises(ValueError):
        nl.bounded_query("mean", (1, 1), 3)
    with pytest.raises(ValueError):
        nl.bounded_query("mean", (0, 1), 0)
    with pytest.raises(ValueError):
        nl.bounded_query("mean", (0.2, 0.8), 3, integer=True)  # no integer inside


def test_vector_budget_split_and_composition() -> None:
    queries = [nl.bounded_query("mean", (0, 1), 10), nl.bounded_query("sum", (0, 5), 10)]
    vec = nl.plan_vector(queries, 4)
    assert [p.bits for p in vec.plans] == [2, 2] and vec.bits == 4 and vec.count == 16
    uneven = nl.plan_vector(queries, 4, shares=[F(3), F(1)])
    assert uneven.bits == 4 and uneven.count == 16
    out = nl.release_vector([F(1, 2), F(5, 2)], vec)
    assert [o.index for o in out] == [
        p.quantizer.index(v) for p, v in zip(vec.plans, [F(1, 2), F(5, 2)], strict=True)
    ]
    odd = nl.plan_vector(queries, 5)  # 2.5 bits each: 5 outputs each, charged log2 5 each
    assert odd.count == 25 and odd.bits == 2 * nl.bits_upper(5) <= 5
    with pytest.raises(ValueError):
        nl.plan_vector(queries, 4, shares=[F(3), F(2)])
    with pytest.raises(ValueError):
        nl.release_vector([1], vec)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 10**6), st.fractions(min_value=1, max_value=50, max_denominator=10**4))
def test_plan_is_a_fixed_point_of_its_charge(n: int, bits: Fraction) -> None:
    plan = nl.plan(nl.bounded_query("mean", (-1, 1), n), bits)
    again = nl.plan(nl.bounded_query("mean", (-1, 1), n), plan.bits)
    assert again.quantizer == plan.quantizer and again.count == plan.count
    assert again.bits == plan.bits <= bits
