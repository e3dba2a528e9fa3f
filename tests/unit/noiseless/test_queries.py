"""Issue #17 items 10–12: exact levels and counts, order statistics, given edges, paper mode,
vector releases and ``guarantees_bits``, each against brute-forced Definition 1.

About 4 s. Every count of distinct outputs enumerates all values of the other records on a
finite domain and compares with ⌊2^ε⌋ (bits), never e^ε.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import marshmallow
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import noiseless as nl
from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.noiseless import central
from tests.unit.noiseless.brute import grid, worst_slice_count, worst_tuple_count

F = Fraction
BUDGETS = [F(1), F(1585, 1000), F(2), F(5, 2), F(3)]
META = DatasetMeta(
    n_rows=4,
    columns={
        "x": ColumnMeta("x", "continuous", (0.0, 1.0)),
        "k": ColumnMeta("k", "integer", (0, 4)),
        "g": ColumnMeta("g", "categorical", categories=("a", "b")),
    },
)


def _order(statistic: str, values: tuple[Fraction, ...]) -> Fraction:
    """Reference min/max/median (mean of the two middle values for even n), exact."""
    ordered = sorted(values)
    if statistic == "min":
        return ordered[0]
    if statistic == "max":
        return ordered[-1]
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2


# --------------------------------------------------------------------------- item 11


def test_exact_rule_gives_four_levels_at_n4_one_bit() -> None:
    """Issue #17 item 11: the old FP-safe rule gave 3 levels (bins 33 % wider) for a mean of
    n = 4 records at 1 bit; evaluation is exact, so the exact q* = (K − 1)·n = 4 is safe."""
    plan = nl.plan(nl.bounded_query("mean", (0, 1), 4), 1)
    assert plan.quantizer.levels == 4 and plan.count == 2 and plan.bits == 1
    for n, bits, levels in [(4, 2, 12), (8, 3, 56), (100, 1, 100), (100, 2, 300), (2, 2, 6)]:
        assert nl.plan(nl.bounded_query("mean", (0, 1), n), bits).quantizer.levels == levels


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 3, 7, 20])
def test_exact_levels_attain_but_never_exceed_the_count(n: int, m: int) -> None:
    """Brute force over every reachable sum of the others on {0, 1/m, …, 1}: the new, finer
    levels stay within ⌊2^ε⌋ and, on the 1/20 grid (fine enough to straddle an edge),
    reach it, so the exact rule charges no more than one record can cause."""
    domain = grid(m)
    for statistic, bits in itertools.product(("mean", "sum"), BUDGETS):
        plan = nl.plan(nl.bounded_query(statistic, (0, 1), n), bits)
        scale = n if statistic == "mean" else 1

        def out(total: Fraction, p: nl.ScalarPlan = plan, k: int = scale) -> int:
            return p.quantizer.index(total / k)

        worst = worst_slice_count(out, domain, n)
        assert worst <= plan.count <= nl.levels_for_bits(bits)
        if m == 20:
            assert worst == plan.count


def test_counts_are_exact_for_the_same_bit() -> None:
    """Issue #17 item 11: a count went into n − 1 bins; its slice image is two points, so
    one bit certifies the exact count (bins of width 1 centred on 0..n)."""
    for n in (1, 2, 7, 500):
        plan = nl.plan(nl.bounded_query("count", (0, 1), n), 1)
        assert plan.exact and plan.max_error == 0 and plan.count == 2 and plan.bits == 1
        assert plan.quantizer.levels == n + 1
        assert all(central.release(F(c), plan).value == c for c in range(n + 1))


def test_integer_queries_are_exact_once_the_budget_covers_the_domain() -> None:
    """D = hi − lo + 1 values per record: K >= D releases the exact mean/sum/median for
    log2 D bits, and brute force shows exactly D outputs (no more)."""
    for statistic in ("mean", "sum", "median", "min", "max"):
        query = nl.bounded_query(statistic, (0, 2), 4, integer=True)
        plan = nl.plan(query, 2)  # K = 4 >= D = 3
        assert plan.exact and plan.count == 3 and plan.bits == nl.bits_upper(3)

        def out(x: tuple[Fraction, ...], p: nl.ScalarPlan = plan,
                q: central.Query = query) -> float:
            value = central.evaluate(q, np.array([int(v) for v in x], dtype=np.int64))
            released = central.release(value, p)
            assert F(released.value) == value  # exact
            return released.value

        assert worst_tuple_count(out, [F(v) for v in range(3)], 4) == 3


# --------------------------------------------------------------------------- item 10: order


@pytest.mark.parametrize("statistic", ["median", "min", "max"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_order_statistics_brute_force(statistic: str, n: int) -> None:
    """S = R for min/max/odd-n median (q = K), R/2 for an even-n median (the mean of the
    two middle records: q = 2(K − 1), twice as fine); Definition 1 brute-forced, evaluation
    via the production path on float records, the count attained on a fine grid."""
    domain = grid(6, F(-1), F(2))
    for bits in BUDGETS:
        query = nl.bounded_query(statistic, (-1, 2), n)
        plan = nl.plan(query, bits)
        k = nl.levels_for_bits(bits)
        even = statistic == "median" and n % 2 == 0  # S = R/2: q* = 2(K − 1) bins
        assert plan.quantizer.levels == (max(k, 2 * (k - 1)) if even else k)
        assert plan.count == k

        def out(x: tuple[Fraction, ...], p: nl.ScalarPlan = plan,
                q: central.Query = query, s: str = statistic) -> int:
            value = central.evaluate(q, np.array([float(v) for v in x]))
            assert value == _order(s, x)
            return central.release(value, p).index

        worst = worst_tuple_count(out, domain, n)
        assert worst <= plan.count
        assert worst == min(plan.count, len(domain))


def test_order_statistics_clip_and_treat_missing_as_lower() -> None:
    q = nl.bounded_query("median", (0, 10), 4)
    assert central.evaluate(q, np.array([np.nan, 50.0, 3.0, -2.0])) == F(3, 2)
    assert central.evaluate(nl.bounded_query("max", (0, 10), 3), np.array([1, 99, 2.0])) == 10
    iq = nl.bounded_query("min", (0.5, 10.5), 3, integer=True)
    assert central.evaluate(iq, np.array([0, 5, 7])) == 1
    assert nl.bounded_query("median", (0, 3), 4, integer=True).step == F(1, 2)
    assert nl.bounded_query("median", (0, 3), 5, integer=True).step == 1


# --------------------------------------------------------------------------- item 10: edges


def test_edges_certificate_matches_brute_force_through_release() -> None:
    """Random public edges for a mean of n = 3 records on a 1/12 grid of [0, 1]: the exact
    §6.6 certificate bounds the brute-forced count, and is attained on 1/12-aligned cuts."""
    rnd = random.Random(3)
    domain = grid(12)
    attained = 0
    for _ in range(40):
        cuts = sorted({F(rnd.randint(1, 35), 36) for _ in range(rnd.randint(1, 6))})
        edges = [F(0), *cuts, F(1)]
        query = nl.bounded_query("mean", (0, 1), 3)
        count = nl.certify_scalar(nl.ExactEdgeQuantizer(edges), query)
        if count < 2:
            continue
        plan = nl.plan_edges(query, 8, edges)
        assert plan.count == count and plan.bits == nl.bits_upper(count)

        def out(x: tuple[Fraction, ...], p: nl.ScalarPlan = plan) -> int:
            return central.release(sum(x, F(0)) / 3, p).index

        worst = worst_tuple_count(out, domain, 3)
        assert worst <= count
        attained += worst == count
    assert attained >= 20


def test_edges_inside_the_range_clip_and_are_refused_when_too_many() -> None:
    query = nl.bounded_query("mean", (0, 10), 5)  # S = 2
    plan = nl.plan_edges(query, 2, [2, 5, 8])
    assert plan.count == 2 and plan.bits == 1
    assert central.release(F(0), plan).index == 0 and central.release(F(10), plan).index == 1
    assert plan.max_error == F(7, 2)  # 0 is clipped to 2 and released as 3.5
    with pytest.raises(ValueError, match="allows at most"):
        nl.plan_edges(query, 1, [0, 1, 2, 3, 10])  # one record meets 3 bins > 2
    with pytest.raises(ValueError, match="inside"):
        nl.plan_edges(query, 3, [-1, 5, 10])
    with pytest.raises(ValueError, match="constant"):
        nl.plan_edges(nl.bounded_query("count", (0, 1), 5), 3, [0, 5])
    with pytest.raises(ValueError):
        nl.ExactEdgeQuantizer([0, 0, 1])


# --------------------------------------------------------------------------- item 10: paper


def test_paper_mode_is_charged_its_true_level() -> None:
    """Spec §6.2/§11.4(3): mean, n = 4, ε = 1 nominal: q = 8, 3 outputs; the charge and the
    label are log2 3, and a 1-bit budget is refused."""
    query = nl.bounded_query("mean", (0, 1), 4)
    plan = nl.plan_paper(query, 1, 2)
    assert plan.quantizer.levels == 8 and plan.count == 3 and plan.bits == nl.bits_upper(3)
    assert plan.paper_bits == 1
    outputs = {central.release(v / 4, plan).index for v in grid(64)}
    assert len(outputs) == 3  # brute force: the true count, others at 0
    with pytest.raises(ValueError, match="true level"):
        nl.plan_paper(query, 1, 1)
    again = nl.plan_paper(query, 1, plan.bits)  # the charge re-plans to the same quantizer
    assert (again.quantizer, again.count, again.bits) == (plan.quantizer, plan.count, plan.bits)


# --------------------------------------------------------------------------- mechanisms


def _run(name: str, params: Mapping[str, Any], bits: Any,
         data: Mapping[str, np.ndarray] | None = None) -> tuple[Fraction, Any]:
    mech = registry.get(name)
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, {"noiseless_bits": bits}, META)
    data = data or {"x": np.array([0.1, 0.5, 0.7, 0.2]), "k": np.array([0, 4, 2, 3]),
                    "g": np.array([0, 1, 1, 0])}
    out = mech.run(data, loaded, cost, META, np.random.default_rng(0))
    assert mech.accuracy(loaded, cost, META) == out.accuracy
    json.dumps(out.result, allow_nan=False)
    return cost["noiseless_bits"], out


def test_guarantees_bits_in_every_payload() -> None:
    """Issue #17 item 12: the paper's bounds (Theorems 1, 2, 3, 5), each equal to the charge."""
    for name, params in [("noiseless.aggregate", {"statistic": "mean", "column": "x"}),
                         ("noiseless.local", {"column": "x"}),
                         ("noiseless.vector", {"queries": [
                             {"statistic": "min", "column": "x", "bits": 1},
                             {"statistic": "max", "column": "k", "bits": 1.5}]})]:
        charged, out = _run(name, params, F(5, 2))
        g = out.result["guarantees_bits"]
        assert set(g) == {"nonstochastic_leakage_L0", "symmetrized_leakage_L0s",
                          "maximin_information", "zero_error_capacity",
                          "hypothesis_test_performance", "maximal_leakage"}
        assert all(v == float(charged) for v in g.values())
        assert math.log2(out.result["certified_count"]) <= float(charged) + 1e-12


def test_aggregate_median_and_paper_mode_through_the_registry() -> None:
    charged, out = _run("noiseless.aggregate", {"statistic": "median", "column": "x"}, 2)
    assert charged == 2 and out.result["quantizer"]["levels"] == 6  # n = 4 even: S = R/2
    assert out.result["value"] == 5 / 12  # median 0.35 lies in [2/6, 3/6)
    charged, paper = _run("noiseless.aggregate", {"statistic": "mean", "column": "x",
                                                  "paper_mode": True, "paper_bits": 1}, 2)
    assert charged == nl.bits_upper(3) and paper.result["certified_count"] == 3
    label = paper.result["paper_mode"]
    assert label["nominal_bits"] == 1 and label["true_bits"] == math.log2(3)
    assert label["corrected_levels"] == 4 and paper.result["quantizer"]["levels"] == 8
    assert "paper mode" in paper.guarantee and "true" in paper.accuracy["warnings"][-1]
    mech = registry.get("noiseless.aggregate")
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params({"statistic": "mean", "column": "x", "paper_mode": True,
                                    "paper_bits": 1}), {"noiseless_bits": 1}, META)
    assert info.value.field == "budget.noiseless_bits" and "log2" not in info.value.message


def test_aggregate_edges_through_the_registry() -> None:
    """S = 1/4: a slice starting just below 0.1 meets [0, .1), [.1, .2) and [.2, .6)."""
    params = {"statistic": "mean", "column": "x", "edges": [0, 0.1, 0.2, 0.6, 1]}
    charged, out = _run("noiseless.aggregate", params, 2)
    assert charged == nl.bits_upper(3) and out.result["quantizer"]["kind"] == "edges"
    assert out.result["bin"] == [0.2, 0.6] and out.result["value"] == 0.4  # mean 0.375
    assert out.result["certified_count"] == 3
    mech = registry.get("noiseless.aggregate")
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params(params), {"noiseless_bits": 1}, META)
    assert info.value.field == "params.edges"
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params({**params, "edges": [0, 2]}), {"noiseless_bits": 2}, META)
    assert info.value.field == "params.edges"


@pytest.mark.parametrize("params", [
    {"statistic": "mean", "column": "x", "paper_mode": True},
    {"statistic": "mean", "column": "x", "paper_bits": 1},
    {"statistic": "mean", "column": "x", "paper_mode": True, "paper_bits": 1, "edges": [0, 1]},
    {"statistic": "mean", "column": "x", "edges": [0.5, 0.5]},
    {"statistic": "mean", "column": "x", "paper_mode": True, "paper_bits": 41},
])
def test_aggregate_schema_refusals(params: dict[str, Any]) -> None:
    with pytest.raises(marshmallow.ValidationError):
        registry.get("noiseless.aggregate").load_params(params)


def test_vector_charges_add_and_each_coordinate_keeps_its_plan() -> None:
    params = {"queries": [{"statistic": "mean", "column": "x", "bits": 1},
                          {"statistic": "count", "condition": {"column": "g", "op": "eq",
                                                               "value": "b"}, "bits": 1},
                          {"statistic": "median", "column": "k", "bits": 1.585}]}
    charged, out = _run("noiseless.vector", params, 5)
    assert charged == 2 + nl.bits_upper(3)
    assert out.result["certified_count"] == 2 * 2 * 3
    assert out.result["values"] == [c["value"] for c in out.result["coordinates"]]
    assert out.result["values"][1] == 2  # the count is exact
    single = _run("noiseless.aggregate", {"statistic": "mean", "column": "x"}, 1)[1]
    assert out.result["coordinates"][0] == single.result
    mech = registry.get("noiseless.vector")
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params(params), {"noiseless_bits": 3}, META)
    assert info.value.field == "budget.noiseless_bits"
    bad = {"queries": [{"statistic": "mean", "column": "x", "bits": 1, "edges": [0, 0.1, 0.2,
                                                                                0.3, 1]}]}
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params(bad), {"noiseless_bits": 3}, META)
    assert info.value.field == "params.queries.0.edges"
    for refused in ({"queries": []}, {"queries": [{"statistic": "mean", "column": "x"}]},
                    {"queries": [{"statistic": "mean", "column": "x", "bits": 0.5}]}):
        with pytest.raises(marshmallow.ValidationError):
            mech.load_params(refused)


def test_vector_brute_force_joint_count() -> None:
    """Definition 1 for the joint output of min, max and mean of 3 integer records in
    {0..4}: never above the product certificate; above the largest coordinate count."""
    meta = DatasetMeta(n_rows=3, columns={"k": ColumnMeta("k", "integer", (0, 4))})
    params = {"queries": [{"statistic": s, "column": "k", "bits": 1}
                          for s in ("min", "max", "mean")]}
    mech = registry.get("noiseless.vector")
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, {"noiseless_bits": 3}, meta)
    certified = nl.certify(mech, loaded, cost, meta)
    assert certified == 8 and cost == {"noiseless_bits": 3}

    def out(x: tuple[Fraction, ...]) -> str:
        run = mech.run({"k": np.array([int(v) for v in x])}, loaded, cost, meta,
                       np.random.default_rng(0))
        return json.dumps(run.result, sort_keys=True)

    worst = worst_tuple_count(out, [F(v) for v in range(5)], 3)
    assert 2 < worst <= certified


@settings(max_examples=30, deadline=None)
@given(st.fractions(min_value=1, max_value=40, max_denominator=10**4),
       st.sampled_from(["median", "min", "max", "mean", "sum", "count"]),
       st.integers(1, 10**6), st.booleans())
def test_charge_replans_to_the_same_plan(bits: Fraction, statistic: str, n: int,
                                         integer: bool) -> None:
    """The service hands the charge back as the budget: same quantizer, same count."""
    query = nl.bounded_query(statistic, (-3, 9), n, integer=integer)
    plan = nl.plan(query, bits)
    again = nl.plan(query, plan.bits)
    assert (again.quantizer, again.count, again.bits, again.exact) == (
        plan.quantizer, plan.count, plan.bits, plan.exact)
    assert plan.bits <= bits
    assert math.log2(plan.count) <= plan.bits
