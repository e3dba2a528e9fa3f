"""The registered `dip` mechanism: params, cost, accuracy, guarantee and the released table."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import marshmallow
import numpy as np
import pytest

from mechanisms import dip, registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError, Output

N = 600
META = DatasetMeta(
    n_rows=N,
    columns={
        "age": ColumnMeta("age", "integer", (17, 90)),
        "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
        "wage": ColumnMeta("wage", "continuous", (0.0, 200_000.0)),
        "score": ColumnMeta("score", "continuous"),
        "open": ColumnMeta("open", "integer"),
        "curve": ColumnMeta("curve", "functional", grid=(0.0, 1.0), norm_bound=1.0),
    },
    allow_holdout=True,
)
SECRET_AGE, SECRET_WAGE = 31337, 987654.125
EPS = {"epsilon": Fraction(1)}
MECH = registry.get("dip")


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    age = rng.integers(17, 91, N)
    age[0] = SECRET_AGE  # out of bounds: clipped
    wage = rng.gamma(2.0, 20_000.0, N)
    wage[1], wage[2], wage[3] = SECRET_WAGE, np.nan, np.inf
    race = rng.integers(0, 3, N)
    race[4] = 7  # not a declared code
    return {"age": age, "race": race, "wage": wage, "score": rng.normal(size=N),
            "open": rng.integers(0, 5, N)}


DATA = _data()


def _release(params: Mapping[str, Any], budget: Mapping[str, Fraction] = EPS,
             data: Mapping[str, np.ndarray] = DATA, seed: int = 0) -> Output:
    loaded = MECH.load_params(params)
    cost = MECH.cost(loaded, budget, META)
    return MECH.run(data, loaded, cost, META, np.random.default_rng(seed))


def _input_error(params: Mapping[str, Any], budget: Mapping[str, Any] = EPS) -> MechanismInputError:
    loaded = MECH.load_params(params)
    with pytest.raises(MechanismInputError) as info:
        MECH.cost(loaded, budget, META)
    return info.value


def test_registered_under_its_name() -> None:
    assert "dip" in registry.names()
    assert MECH is dip.mechanism and MECH.measures == ("epsilon",)


@pytest.mark.parametrize(
    "reference",
    [None, {"kind": "dp", "share": 0.25}, {"kind": "holdout", "fraction": 0.3},
     {"kind": "parametric", "family": "product", "params": {
         "age": {"family": "binomial", "params": {"n": 80, "p": 0.5}},
         "race": {"family": "categorical", "params": {"probs": [1, 2, 1]}},
         "wage": {"family": "lognormal", "params": {"mu": 10.5, "sigma": 0.8}}}}],
)
def test_table_shapes_types_and_domains(reference: dict[str, Any] | None) -> None:
    params: dict[str, Any] = {"columns": ["age", "race", "wage"]}
    if reference is not None:
        params["reference"] = reference
    out = _release(params)
    assert MECH.cost(MECH.load_params(params), EPS, META) == EPS  # cost = budget, exactly
    table = out.table
    assert table is not None
    assert list(table) == ["_row", "age", "race", "wage"]
    rows = table["_row"]
    assert rows.dtype == np.int64 and np.all(np.diff(rows) > 0)  # dataset row order
    assert len({len(v) for v in table.values()}) == 1
    assert table["age"].dtype == np.int64 and table["age"].min() >= 17 and table["age"].max() <= 90
    assert set(np.unique(table["race"])) <= {"A", "B", "C"}  # category names
    assert table["wage"].dtype == np.float64 and np.all(np.isfinite(table["wage"]))
    assert table["wage"].min() >= 0.0 and table["wage"].max() <= 200_000.0
    assert out.result["n_rows"] == rows.size and out.result["n_input_rows"] == N
    json.dumps(out.result)
    json.dumps(out.accuracy)
    assert "replaced" in out.guarantee and "n_rows public" in out.guarantee


def test_holdout_rows_are_not_released_and_the_guarantee_says_so() -> None:
    out = _release({"columns": ["wage", "age"], "reference": {"kind": "holdout",
                                                              "fraction": 0.25}})
    assert out.table is not None
    held = dip.split_holdout(N, 0.25)
    assert np.array_equal(out.table["_row"], np.flatnonzero(~held))
    assert out.result["n_rows"] == N - 150 and out.accuracy["holdout_rows"] == 150
    assert "NOT protected by differential privacy" in out.guarantee
    assert "only by not being released" in out.guarantee


def test_an_injected_split_is_used() -> None:
    loaded = MECH.load_params({"columns": ["score"], "reference": {"kind": "holdout",
                                                                   "fraction": 0.5}})
    cost = MECH.cost(loaded, EPS, META)
    mask = np.zeros(N, dtype=bool)
    mask[:300] = True
    out = MECH.run(DATA, {**loaded, "_holdout": mask}, cost, META, np.random.default_rng(0))
    assert out.table is not None and np.array_equal(out.table["_row"], np.arange(300, N))
    with pytest.raises(ValueError):
        MECH.run(DATA, {**loaded, "_holdout": mask[:-1]}, cost, META, np.random.default_rng(0))


def test_public_reference_is_injected_by_the_service() -> None:
    params = MECH.load_params({"columns": ["race", "wage"],
                               "reference": {"kind": "public", "dataset_id": "acs-2020"}})
    cost = MECH.cost(params, EPS, META)
    assert cost == EPS
    with pytest.raises(MechanismInputError, match="not provided"):
        MECH.run(DATA, params, cost, META, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    public = {"race": np.array(["A", "B", "C", "Z"] * 100),  # "Z" rows are dropped
              "wage": rng.gamma(2.0, 20_000.0, 400)}
    out = MECH.run(DATA, {**params, "_reference": public}, cost, META, np.random.default_rng(2))
    assert out.table is not None and out.table["_row"].size == N
    assert out.result["reference"] == {"kind": "public", "dataset_id": "acs-2020"}
    # released wages never leave the public sample's range (eq. 7)
    assert out.table["wage"].max() <= public["wage"].max()
    public_meta = DatasetMeta(400, {"race": ColumnMeta("race", "categorical",
                                                       categories=("A", "B")),
                                    "wage": ColumnMeta("wage", "integer", (0, 10**6))})
    MECH.check_public_reference(params, META, public_meta)
    bad = DatasetMeta(400, {"race": ColumnMeta("race", "continuous"),
                            "wage": ColumnMeta("wage", "continuous")})
    with pytest.raises(MechanismInputError) as info:
        MECH.check_public_reference(params, META, bad)
    assert info.value.field == "params.reference.columns.race"


def test_release_subset_still_costs_every_processed_column() -> None:
    out = _release({"columns": ["age", "wage"], "release": ["wage"]})
    assert out.table is not None and list(out.table) == ["_row", "wage"]
    assert out.result["epsilon"]["per_column"] == pytest.approx(0.25)  # ε_dip = 0.5 over 2


def test_random_order_is_reported() -> None:
    out = _release({"columns": ["age", "wage", "score"], "order": "random",
                    "reference": {"kind": "holdout"}}, seed=5)
    assert sorted(out.result["order"]) == ["age", "score", "wage"]


def test_accuracy_is_public_and_matches_the_spec_table() -> None:
    params = MECH.load_params({"columns": ["score"], "reference": {
        "kind": "parametric", "family": "normal", "params": {"loc": 0, "scale": 1}}})
    for eps, rho in ((1, 0.24), (2, 0.43), (3, 0.57), (4, 0.67)):
        acc = MECH.accuracy(params, {"epsilon": Fraction(eps)}, META)
        assert acc["rank_correlation"] == pytest.approx(rho, abs=0.01)
        assert acc["epsilon"]["dip"] == eps and acc["epsilon"]["reference"] == 0
    small = DatasetMeta(20, META.columns, allow_holdout=True)
    acc = MECH.accuracy(MECH.load_params({"columns": ["age", "wage", "score"], "reference": {
        "kind": "holdout", "fraction": 0.5}}), EPS, small)
    assert acc["warnings"]  # m = 10 < 5 per column


@pytest.mark.parametrize(
    ("params", "budget", "field"),
    [
        ({"columns": ["age"]}, {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}, "budget"),
        ({"columns": ["age"]}, {"epsilon": Fraction(0)}, "budget.epsilon"),
        ({"columns": ["age"]}, {"epsilon": Fraction(101)}, "budget.epsilon"),
        ({"columns": ["age"]}, {"epsilon": math.inf}, "budget.epsilon"),
        ({"columns": ["nope"]}, EPS, "params.columns"),
        ({"columns": ["curve"]}, EPS, "params.columns"),
        ({"columns": ["open"]}, EPS, "params.columns"),  # integer without bounds: no dp histogram
        ({"columns": ["score"]}, EPS, "params.columns"),  # dp needs finite bounds
        # any number of columns with a hold-out, but an integer column needs bounds
        ({"columns": ["age", "race", "wage", "score", "open"], "reference": {
            "kind": "holdout"}}, EPS, "params.columns"),
        ({"columns": ["wage"], "reference": {"kind": "holdout", "fraction": 0.0}}, EPS,
         "params.reference.fraction"),
        ({"columns": ["wage"], "reference": {"kind": "holdout", "fraction": 0.95}}, EPS,
         "params.reference.fraction"),
        ({"columns": ["wage"], "reference": {"kind": "dp", "share": 1.0}}, EPS,
         "params.reference.share"),
        ({"columns": ["wage"], "reference": {"kind": "dp", "bins": {"age": 3}}}, EPS,
         "params.reference.bins.age"),
        ({"columns": ["wage"], "reference": {"kind": "parametric", "family": "poisson",
                                             "params": {"mu": 3}}}, EPS,
         "params.reference.family"),
        ({"columns": ["age"], "reference": {"kind": "parametric", "family": "normal"}}, EPS,
         "params.reference.family"),
        ({"columns": ["race"], "reference": {"kind": "parametric", "family": "categorical",
                                             "params": {"probs": [1, 1]}}}, EPS,
         "params.reference.params.probs"),
        ({"columns": ["age"], "reference": {"kind": "parametric", "family": "poisson",
                                            "params": {"mu": -1}}}, EPS,
         "params.reference.params.mu"),
        ({"columns": ["age"], "reference": {"kind": "parametric", "family": "poisson",
                                            "params": {"lam": 3}}}, EPS,
         "params.reference.params.lam"),
        ({"columns": ["score", "wage"], "reference": {"kind": "parametric", "family":
                                                      "multivariate_normal", "params": {
            "mean": [0, 0], "cov": [[1, 0], [0, 1]]}}}, EPS, "params.reference.family"),
        ({"columns": ["score"], "reference": {"kind": "parametric", "family": "normal",
                                              "params": {"loc": 1e6, "scale": 1}}}, EPS,
         None),  # unbounded column: any location is fine
        ({"columns": ["wage"], "reference": {"kind": "parametric", "family": "normal",
                                             "params": {"loc": -1e9, "scale": 1}}}, EPS,
         "params.reference.params"),  # no mass inside the bounds
        ({"columns": ["age", "wage"], "order": ["wage"]}, EPS, "params.order"),
        ({"columns": ["age", "wage"], "release": ["score"]}, EPS, "params.release"),
        ({"columns": ["age"], "atoms": {"age": [20]}}, EPS, "params.atoms.age"),
        ({"columns": ["wage"], "atoms": {"wage": [-5]}}, EPS, "params.atoms.wage"),
        ({"columns": ["wage"], "resolution": 1000}, EPS, "params.resolution"),
        ({"columns": ["_row"]}, EPS, "params.columns"),
    ],
)
def test_bad_inputs_name_the_field(params: dict[str, Any], budget: dict[str, Any],
                                   field: str | None) -> None:
    if field is None:
        assert MECH.cost(MECH.load_params(params), budget, META) == budget
        return
    assert _input_error(params, budget).field == field


def test_holdout_needs_the_operators_consent() -> None:
    """Hold-out rows are not protected by DP (spec §7.1): only datasets that allow it."""
    params = MECH.load_params({"columns": ["wage"], "reference": {"kind": "holdout"}})
    assert MECH.cost(params, EPS, META) == EPS
    private = DatasetMeta(N, META.columns)
    with pytest.raises(MechanismInputError) as info:
        MECH.cost(params, EPS, private)
    assert info.value.field == "params.reference.kind"
    assert "allow_holdout" in info.value.message
    assert MECH.cost(MECH.load_params({"columns": ["wage"]}), EPS, private) == EPS


def test_dp_reference_beyond_four_columns_uses_the_copula() -> None:
    """Issue #16 item 6: five columns used to be refused; now the copula model takes them."""
    columns = {f"c{i}": ColumnMeta(f"c{i}", "continuous", (0.0, 1.0)) for i in range(5)}
    meta = DatasetMeta(N, columns, allow_holdout=True)
    four = MECH.load_params({"columns": list(columns)[:4]})
    assert MECH.cost(four, EPS, meta) == EPS
    assert MECH.accuracy(four, EPS, meta)["histogram"]["cells"] > 0  # joint up to 4
    five = MECH.load_params({"columns": list(columns)})
    assert MECH.cost(five, EPS, meta) == EPS
    acc = MECH.accuracy(five, EPS, meta)["copula"]
    assert acc["epsilon_per_marginal"] == pytest.approx(float(EPS["epsilon"]) / 4 / 5)
    assert acc["epsilon_correlation"] == pytest.approx(float(EPS["epsilon"]) / 4)
    joint = MECH.load_params({"columns": list(columns), "reference": {
        "kind": "dp", "model": "joint"}})
    with pytest.raises(MechanismInputError) as info:
        MECH.cost(joint, EPS, meta)
    assert info.value.field == "params.reference.model" and "at most 4" in info.value.message
    for bad in ({"model": "copula", "correlation_share": 1.0},
                {"model": "joint", "correlation_share": 0.5}):
        params = MECH.load_params({"columns": list(columns)[:2], "reference": {
            "kind": "dp", **bad}})
        with pytest.raises(MechanismInputError) as info:
            MECH.cost(params, EPS, meta)
        assert info.value.field == "params.reference.correlation_share"
    holdout = MECH.load_params({"columns": list(columns), "reference": {"kind": "holdout"}})
    assert MECH.cost(holdout, EPS, meta) == EPS


@pytest.mark.parametrize(
    "params",
    [
        {"columns": []},
        {"columns": ["age", "age"]},
        {"columns": ["age"], "extra": 1},
        {"columns": ["age"], "reference": {"kind": "holdout", "share": 0.5}},
        {"columns": ["age"], "reference": {"kind": "parametric"}},
        {"columns": ["age"], "reference": {"kind": "public"}},
        {"columns": ["age"], "reference": {"kind": "oracle"}},
        {"columns": ["age"], "reference": {"kind": "parametric", "family": "zipf"}},
        {"columns": ["age"], "reference": {"kind": "dp", "bins": 0}},
        {"columns": ["age"], "order": "sideways"},
        {"columns": ["age"], "_reference": {"age": [1, 2]}},  # injected by the service only
    ],
)
def test_schema_rejects_malformed_params(params: dict[str, Any]) -> None:
    with pytest.raises(marshmallow.ValidationError):
        MECH.load_params(params)


def test_messages_never_contain_data_values() -> None:
    params = MECH.load_params({"columns": ["age", "wage", "race"], "reference": {
        "kind": "public", "dataset_id": "p"}})
    cost = MECH.cost(params, EPS, META)
    with pytest.raises(MechanismInputError) as info:
        MECH.run(DATA, {**params, "_reference": {"age": np.array([SECRET_AGE])}}, cost, META,
                 np.random.default_rng(0))
    text = f"{info.value.field} {info.value.message}"
    assert str(SECRET_AGE) not in text and "987654" not in text
    out = _release({"columns": ["age", "wage", "race"]})
    assert str(SECRET_AGE) not in json.dumps([out.result, out.accuracy, out.guarantee])
    assert "987654" not in json.dumps([out.result, out.accuracy, out.guarantee])


def test_missing_and_invalid_values_are_released_as_valid_ones() -> None:
    for reference in ({"kind": "dp"}, {"kind": "holdout"}):
        out = _release({"columns": ["wage", "race", "age"], "reference": reference})
        assert out.table is not None
        assert np.all(np.isfinite(out.table["wage"]))
        assert set(np.unique(out.table["race"])) <= {"A", "B", "C"}


def test_fresh_randomness_gives_fresh_noise() -> None:
    one = _release({"columns": ["wage"]}, seed=1).table
    two = _release({"columns": ["wage"]}, seed=2).table
    assert one is not None and two is not None
    assert not np.array_equal(one["wage"], two["wage"])
    again = _release({"columns": ["wage"]}, seed=1).table
    assert again is not None and np.array_equal(one["wage"], again["wage"])


def test_many_columns_are_planned_with_bounded_work() -> None:
    """Issue #16 item 8: Table 1 has p = 250 columns; the schema stopped at 64.

    The work estimate reads only public inputs and grows with p (chain),
    p² (copula correlation sums) and the joint histogram's cells.
    """
    columns = {f"x{i}": ColumnMeta(f"x{i}", "continuous", (-10.0, 10.0)) for i in range(250)}
    meta = DatasetMeta(200, columns, allow_holdout=True)
    params = MECH.load_params({"columns": list(columns), "reference": {
        "kind": "holdout", "fraction": 0.25}})
    assert MECH.cost(params, EPS, meta) == EPS
    work = MECH.work(params, meta)
    assert work.units == 200 * 250 * (64 + 16) and work.field == "params.columns"
    small = DatasetMeta(10_000, dict(list(columns.items())[:20]))
    copula = MECH.work(MECH.load_params({"columns": list(small.columns)}), small)
    wider = DatasetMeta(10_000, dict(list(columns.items())[:40]))
    copula40 = MECH.work(MECH.load_params({"columns": list(wider.columns)}), wider)
    assert copula40.units > 3.5 * copula.units  # ~p² growth
    joint = MECH.work(MECH.load_params({"columns": ["x0", "x1"], "reference": {
        "kind": "dp", "bins": 1000}}), small)
    assert joint.field == "params.reference.bins" and joint.units >= 1000**2 * 2 * 4
    with pytest.raises(marshmallow.ValidationError):
        MECH.load_params({"columns": [f"c{i}" for i in range(1001)]})
