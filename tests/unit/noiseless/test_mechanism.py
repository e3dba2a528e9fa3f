"""The registry entries: params, costs, errors, accuracy, outputs, replay."""

from __future__ import annotations

import itertools
import json
import math
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
from mechanisms.base import ColumnMeta, DatasetMeta, Mechanism, MechanismInputError, Output

F = Fraction
N_ROWS = 500
META = DatasetMeta(
    n_rows=N_ROWS,
    columns={
        "age": ColumnMeta("age", "integer", (17, 90)),
        "flag": ColumnMeta("flag", "integer", (0, 1)),
        "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
        "wage": ColumnMeta("wage", "continuous", (0.0, 200_000.0)),
        "free": ColumnMeta("free", "continuous"),
        "inf": ColumnMeta("inf", "continuous", (0.0, math.inf)),
        "point": ColumnMeta("point", "integer", (3.2, 3.9)),
        "huge": ColumnMeta("huge", "continuous", (-1e307, 1e307)),
        "tiny": ColumnMeta("tiny", "continuous", (0.0, 1e-310)),
        "curve": ColumnMeta("curve", "functional", grid=(0.0, 1.0), norm_bound=1.0),
    },
)
#: distinctive values that must never appear in an error message
SECRET_AGE, SECRET_WAGE = 31337, 987654.125


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    age = rng.integers(0, 120, N_ROWS)
    age[0] = SECRET_AGE
    wage = rng.uniform(-5_000.0, 260_000.0, N_ROWS)
    wage[1], wage[2] = SECRET_WAGE, np.nan
    return {
        "age": age,
        "flag": rng.integers(-3, 5, N_ROWS),
        "race": rng.integers(0, 4, N_ROWS),
        "wage": wage,
        "huge": rng.uniform(-1e307, 1e307, N_ROWS),
        "tiny": rng.uniform(0, 1e-310, N_ROWS),
    }


DATA = _data()
AGG = {"statistic": "mean", "column": "wage"}
COUNT = {"statistic": "count", "condition": {"column": "race", "op": "in", "value": ["A", "C"]}}


def _mech(name: str) -> Mechanism:
    return registry.get(name)


def _budget(bits: Any) -> dict[str, Any]:
    return {"noiseless_bits": bits}


def _release(
    name: str, params: Mapping[str, Any], bits: Any = 2, data: Mapping[str, np.ndarray] = DATA
) -> tuple[dict[str, Fraction], Output]:
    mech = _mech(name)
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, _budget(bits), META)
    return cost, mech.run(data, loaded, cost, META, np.random.default_rng(0))


def _input_error(name: str, params: Mapping[str, Any], budget: Mapping[str, Any]) -> str:
    mech = _mech(name)
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params(params), budget, META)
    message = info.value.message
    assert str(SECRET_AGE) not in message and "987654" not in message
    return info.value.field


def test_registered_with_the_bits_measure() -> None:
    assert {"noiseless.aggregate", "noiseless.local"} <= set(registry.names())
    for name in ("noiseless.aggregate", "noiseless.local"):
        mech = _mech(name)
        assert mech.measures == ("noiseless_bits",)
        assert "not DP" in mech.description


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("noiseless.aggregate", {"statistic": "mode", "column": "age"}),
        ("noiseless.aggregate", {"statistic": "mean"}),
        ("noiseless.aggregate", {"statistic": "count"}),
        (
            "noiseless.aggregate",
            {"statistic": "sum", "column": "age", "condition": COUNT["condition"]},
        ),
        ("noiseless.aggregate", {**COUNT, "column": "age"}),
        ("noiseless.aggregate", {**AGG, "bins": 3}),
        ("noiseless.local", {}),
        ("noiseless.local", {"column": "age", "edges": [1, 1]}),
        ("noiseless.local", {"column": "age", "edges": [1, "x"]}),
        ("noiseless.local", {"column": "age", "edges": [1, math.nan]}),
        ("noiseless.local", {"column": "age", "edges": [1, math.inf]}),
        ("noiseless.local", {"column": "age", "edges": [1]}),
        ("noiseless.local", {"column": "age", "epsilon": 1}),
    ],
)
def test_schema_rejects(name: str, params: dict[str, Any]) -> None:
    with pytest.raises(marshmallow.ValidationError):
        _mech(name).load_params(params)


@pytest.mark.parametrize(
    ("name", "params", "budget", "field"),
    [
        ("noiseless.aggregate", AGG, _budget(F(1, 2)), "budget.noiseless_bits"),
        ("noiseless.aggregate", AGG, _budget(0), "budget.noiseless_bits"),
        ("noiseless.local", {"column": "age"}, _budget(F(99, 100)), "budget.noiseless_bits"),
        ("noiseless.aggregate", AGG, _budget(-3), "budget.noiseless_bits"),
        ("noiseless.aggregate", AGG, _budget(2000), "budget.noiseless_bits"),
        ("noiseless.aggregate", AGG, _budget(math.inf), "budget.noiseless_bits"),
        ("noiseless.aggregate", AGG, _budget("2"), "budget.noiseless_bits"),
        ("noiseless.aggregate", AGG, _budget(True), "budget.noiseless_bits"),
        ("noiseless.aggregate", AGG, {"epsilon": F(1)}, "budget"),
        ("noiseless.aggregate", AGG, {**_budget(2), "delta": F(1, 10**6)}, "budget"),
        ("noiseless.aggregate", AGG, {}, "budget.noiseless_bits"),
        (
            "noiseless.aggregate",
            {"statistic": "mean", "column": "nope"},
            _budget(2),
            "params.column",
        ),
        (
            "noiseless.aggregate",
            {"statistic": "mean", "column": "race"},
            _budget(2),
            "params.column",
        ),
        (
            "noiseless.aggregate",
            {"statistic": "sum", "column": "free"},
            _budget(2),
            "params.column",
        ),
        ("noiseless.aggregate", {"statistic": "sum", "column": "inf"}, _budget(2), "params.column"),
        (
            "noiseless.aggregate",
            {"statistic": "sum", "column": "point"},
            _budget(2),
            "params.column",
        ),
        (
            "noiseless.aggregate",
            {"statistic": "sum", "column": "curve"},
            _budget(2),
            "params.column",
        ),
        (
            "noiseless.aggregate",
            {"statistic": "sum", "column": "huge"},
            _budget(2),
            "params.column",
        ),
        (
            "noiseless.aggregate",
            {"statistic": "count", "condition": {"column": "race", "op": "eq", "value": "Z"}},
            _budget(2),
            "params.condition.value",
        ),
        (
            "noiseless.aggregate",
            {"statistic": "count", "condition": {"column": "nope", "op": "eq", "value": 1}},
            _budget(2),
            "params.condition.column",
        ),
        ("noiseless.local", {"column": "race"}, _budget(2), "params.column"),
        ("noiseless.local", {"column": "age", "edges": [0, 50, 90]}, _budget(2), "params.edges"),
        (
            "noiseless.local",
            {"column": "age", "edges": [20, 30, 40, 50, 60, 70]},
            _budget(2),
            "params.edges",
        ),
        ("noiseless.local", {"column": "age", "edges": [20.1, 20.9]}, _budget(2), "params.edges"),
        ("noiseless.local", {"column": "age", "edges": [20, 90]}, _budget(2), "params.edges"),
    ],
)
def test_cost_errors_name_the_field(
    name: str, params: dict[str, Any], budget: dict[str, Any], field: str
) -> None:
    assert _input_error(name, params, budget) == field


def test_below_one_bit_explains_the_constant() -> None:
    mech = _mech("noiseless.aggregate")
    with pytest.raises(MechanismInputError, match="constant"):
        mech.cost(mech.load_params(AGG), _budget(F(1, 2)), META)


@pytest.mark.parametrize(
    ("name", "params", "bits", "charged", "count"),
    [
        ("noiseless.aggregate", AGG, F(2), F(2), 4),
        ("noiseless.aggregate", AGG, F(5, 2), nl.bits_upper(5), 5),
        ("noiseless.aggregate", AGG, F(1585, 1000), nl.bits_upper(3), 3),
        ("noiseless.aggregate", AGG, 3.0, F(3), 8),
        ("noiseless.aggregate", AGG, F(100), F(40), 2**40),
        ("noiseless.aggregate", COUNT, F(3), F(1), 2),
        ("noiseless.aggregate", {"statistic": "sum", "column": "flag"}, F(5), F(1), 2),
        ("noiseless.aggregate", {"statistic": "mean", "column": "tiny"}, F(2), F(2), 4),
        ("noiseless.local", {"column": "wage"}, F(3), F(3), 8),
        ("noiseless.local", {"column": "wage"}, F(64), F(20), 2**20),
        ("noiseless.local", {"column": "age"}, F(10), nl.bits_upper(74), 74),
        (
            "noiseless.local",
            {"column": "age", "edges": [17, 30, 50, 90]},
            F(2),
            nl.bits_upper(3),
            3,
        ),
        ("noiseless.local", {"column": "huge"}, F(4), F(4), 16),
    ],
)
def test_cost_is_log2_of_the_certified_count(
    name: str, params: dict[str, Any], bits: Any, charged: Fraction, count: int
) -> None:
    cost, out = _release(name, params, bits)
    assert cost == {"noiseless_bits": charged}
    assert charged <= F(bits)
    assert out.result["certified_count"] == count
    assert out.result["bits_exact"] == str(charged)
    assert f"at most {count} distinct outputs" in out.guarantee
    assert "not epsilon-DP" in out.guarantee and "replaced" in out.guarantee


@settings(max_examples=40, deadline=None)
@given(
    st.fractions(min_value=1, max_value=60, max_denominator=10**4),
    st.sampled_from(
        [AGG, COUNT, {"statistic": "sum", "column": "age"}, {"statistic": "mean", "column": "huge"}]
    ),
)
def test_charge_replans_to_the_same_release(bits: Fraction, params: dict[str, Any]) -> None:
    """The service hands ``cost`` (not the request) to accuracy and run: same quantizer."""
    mech = _mech("noiseless.aggregate")
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, _budget(bits), META)
    assert mech.cost(loaded, cost, META) == cost
    assert mech.accuracy(loaded, cost, META) == mech.accuracy(loaded, _budget(bits), META)


def test_aggregate_output_shape_and_accuracy() -> None:
    cost, out = _release("noiseless.aggregate", AGG, F(2))
    json.dumps(out.result, allow_nan=False)
    json.dumps(out.accuracy, allow_nan=False)
    r = out.result
    assert out.table is None
    assert r["statistic"] == "mean" and r["column"] == "wage"
    assert (
        r["quantizer"]["kind"] == "uniform" and r["quantizer"]["levels"] == (4 - 1) * N_ROWS
    )  # the exact corrected rule q* = (K − 1)·R/S
    assert r["bin"][0] <= r["value"] <= r["bin"][1]
    clipped = np.clip(np.nan_to_num(DATA["wage"], nan=0.0), 0.0, 200_000.0)
    exact = nl.exact_float_sum(clipped) / N_ROWS
    assert abs(F(r["value"]) - exact) <= F(out.accuracy["max_error"]) * (1 + F(1, 10**9))
    assert out.accuracy["deterministic"] is True
    assert out.accuracy["certified_count"] == 4 and out.accuracy["warnings"] == []
    assert out.accuracy == _mech("noiseless.aggregate").accuracy(
        _mech("noiseless.aggregate").load_params(AGG), cost, META
    )


def test_count_is_released_exactly_for_one_bit() -> None:
    """A count's slice image is two points, so 1 bit certifies any quantizer: the count is
    released exactly (one bin per value). Catches the old n − 1 bins of width n/(n − 1)."""
    _, out = _release("noiseless.aggregate", COUNT, F(3))
    truth = int(np.count_nonzero(np.isin(DATA["race"], [0, 2])))
    assert out.result["value"] == truth and out.accuracy["max_error"] == 0
    assert out.result["column"] == "race" and out.result["certified_count"] == 2
    assert out.accuracy["warnings"] and "exactly" in out.accuracy["warnings"][0]
    q = out.result["quantizer"]
    assert q["kind"] == "exact" and q["levels"] == N_ROWS + 1 and "edges" not in q
    assert (q["lower"], q["upper"], q["width"]) == (-0.5, N_ROWS + 0.5, 1.0)
    small = DatasetMeta(n_rows=10, columns=META.columns)
    mech = _mech("noiseless.aggregate")
    loaded = mech.load_params(COUNT)
    cost = mech.cost(loaded, _budget(1), small)
    assert cost == {"noiseless_bits": 1}
    run = mech.run({"race": DATA["race"][:10]}, loaded, cost, small, np.random.default_rng(0))
    listed = run.result["quantizer"]["edges"]
    assert listed == [k - 0.5 for k in range(12)]  # 11 unit bins centred on 0..10
    assert run.result["value"] == int(np.count_nonzero(np.isin(DATA["race"][:10], [0, 2])))


def test_local_output_table_in_row_order() -> None:
    cost, out = _release("noiseless.local", {"column": "wage"}, F(3))
    assert cost == {"noiseless_bits": 3}
    assert out.table is not None and set(out.table) == {"wage"}
    column = out.table["wage"]
    assert column.shape == (N_ROWS,) and column.dtype == np.float64
    clipped = np.clip(np.nan_to_num(DATA["wage"], nan=0.0), 0.0, 200_000.0)
    k = np.minimum(np.floor(clipped / 25_000.0).astype(int), 7)
    assert np.array_equal(column, 12_500.0 + 25_000.0 * k)  # row i -> bin of record i
    q = out.result["quantizer"]
    assert q["edges"] == [25_000.0 * i for i in range(9)]
    assert q["representatives"] == [12_500.0 + 25_000.0 * i for i in range(8)]
    json.dumps(out.result, allow_nan=False)
    assert out.accuracy["max_error"] == 12_500.0 and "whole released column" in out.guarantee


def test_local_integer_vacuous_release_is_exact_and_warned() -> None:
    _, out = _release("noiseless.local", {"column": "age"}, F(10))
    assert out.table is not None
    assert np.array_equal(out.table["age"], np.clip(DATA["age"], 17, 90))
    assert out.accuracy["warnings"]


def test_run_is_deterministic_and_ignores_rng() -> None:
    for name, params in (("noiseless.aggregate", AGG), ("noiseless.local", {"column": "age"})):
        mech = _mech(name)
        loaded = mech.load_params(params)
        cost = mech.cost(loaded, _budget(F(7, 2)), META)
        a = mech.run(DATA, loaded, cost, META, np.random.default_rng(1))
        b = mech.run(DATA, loaded, cost, META, np.random.default_rng(2))
        assert a.result == b.result and a.accuracy == b.accuracy
        if a.table is not None and b.table is not None:
            assert all(np.array_equal(a.table[c], b.table[c]) for c in a.table)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.sampled_from([F(1), F(2), F(9, 2)]))
def test_public_parameters_do_not_depend_on_the_data(
    seed_a: int, seed_b: int, bits: Fraction
) -> None:
    for name, params in (("noiseless.aggregate", AGG), ("noiseless.local", {"column": "wage"})):
        _, a = _release(name, params, bits, _data(seed_a))
        _, b = _release(name, params, bits, _data(seed_b))
        for key in ("quantizer", "certified_count", "bits", "bits_exact"):
            assert a.result[key] == b.result[key]
        assert a.accuracy == b.accuracy and a.guarantee == b.guarantee


def test_extreme_magnitudes_release_finite_values() -> None:
    for params in (
        {"statistic": "mean", "column": "huge"},
        {"statistic": "mean", "column": "tiny"},
    ):
        _, out = _release("noiseless.aggregate", params, F(6))
        json.dumps(out.result, allow_nan=False)
        assert out.result["bin"][0] <= out.result["value"] <= out.result["bin"][1]
    for column in ("huge", "tiny"):
        _, out = _release("noiseless.local", {"column": column}, F(5))
        assert out.table is not None and np.all(np.isfinite(out.table[column]))
        assert len(np.unique(out.table[column])) <= out.result["certified_count"]


def test_wrong_column_length_is_an_internal_error_without_values() -> None:
    mech = _mech("noiseless.local")
    loaded = mech.load_params({"column": "age"})
    cost = mech.cost(loaded, _budget(2), META)
    with pytest.raises(ValueError) as info:
        mech.run({"age": DATA["age"][:10]}, loaded, cost, META, np.random.default_rng(0))
    assert str(SECRET_AGE) not in str(info.value)


@pytest.mark.parametrize(
    ("name", "params", "bits"),
    [
        ("noiseless.aggregate", {"statistic": "mean", "column": "small"}, F(2)),
        ("noiseless.aggregate", {"statistic": "sum", "column": "small"}, F(5, 2)),
        ("noiseless.aggregate", {"statistic": "mean", "column": "small"}, F(9)),
        (
            "noiseless.aggregate",
            {"statistic": "count", "condition": {"column": "small", "op": "ge", "value": 3}},
            F(4),
        ),
        ("noiseless.local", {"column": "small"}, F(2)),
        ("noiseless.local", {"column": "small", "edges": [0, 0.5, 4.5, 5]}, F(2)),
    ],
)
def test_certify_bounds_brute_force_through_run(name: str, params: dict[str, Any], bits: F) -> None:
    """Definition 1 end to end: every dataset of 3 records in {0..5}, outputs from ``run``."""
    meta = DatasetMeta(n_rows=3, columns={"small": ColumnMeta("small", "integer", (0, 5))})
    mech = _mech(name)
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, _budget(bits), meta)
    certified = nl.certify(mech, loaded, _budget(bits), meta)
    assert nl.certify(mech, loaded, cost, meta) == certified
    assert nl.at_most_power(certified, cost["noiseless_bits"])
    rng = np.random.default_rng(0)
    worst = 0
    for rest in itertools.product(range(6), repeat=2):
        outputs = set()
        for v in range(6):
            data = {"small": np.array([v, *rest], dtype=np.int64)}
            out = mech.run(data, loaded, cost, meta, rng)
            table = out.table["small"].tolist() if out.table is not None else None
            outputs.add(json.dumps([out.result, table], sort_keys=True))
        worst = max(worst, len(outputs))
    assert worst <= certified <= nl.levels_for_bits(bits)
    assert worst == certified  # the certificate is attained: it charges no more than needed


def test_certify_refuses_other_mechanisms() -> None:
    with pytest.raises(TypeError):
        nl.certify(_mech("laplace"), {}, _budget(2), META)
