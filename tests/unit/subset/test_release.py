"""The registered mechanisms and analyses: the contract with the service (mechanisms.base)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import marshmallow
import numpy as np
import pytest

from mechanisms import registry, subset
from mechanisms.base import (
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
    ReleaseView,
)
from mechanisms.subset import asymptotic, bitmask, release

#: the instances the package registers; used directly so these tests do not depend on
#: the other mechanism families importing cleanly (the registry test covers the lookup)
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (release.uniform, release.custom,
                                                          release.dummy, release.product)}

N = 3000
RACE = ("AIE", "API", "Black", "Other", "White")
META = DatasetMeta(N, {
    "race": ColumnMeta("race", "categorical", categories=RACE),
    "sex": ColumnMeta("sex", "categorical", categories=("F", "M")),
    "income": ColumnMeta("income", "categorical", categories=("Low", "High")),
    "c4": ColumnMeta("c4", "categorical", categories=("a", "b", "c", "d")),
    "pipe": ColumnMeta("pipe", "categorical", categories=("x|y", "z", "u", "v")),
    "wide": ColumnMeta("wide", "categorical", categories=tuple(f"k{i}" for i in range(17))),
    "age": ColumnMeta("age", "integer", (0, 100)),
})
DRAW = {"subset_draws": Fraction(1)}
PAIRS6 = [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"], ["a", "d"], ["b", "c"]]


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sex = rng.integers(0, 2, N)
    return {
        "race": rng.choice(5, N, p=[0.01, 0.03, 0.1, 0.01, 0.85]),
        "sex": sex,
        "income": (rng.random(N) < np.where(sex == 0, 0.11, 0.31)).astype(np.int64),
        "c4": rng.integers(0, 4, N),
        "pipe": rng.integers(0, 4, N),
        "wide": rng.integers(0, 17, N),
        "age": rng.integers(0, 100, N),
    }


def _release(name: str, raw: Mapping[str, Any], seed: int = 1, data: dict[str, np.ndarray]
             | None = None) -> tuple[Output, ReleaseView]:
    """Run a mechanism and view its output as the service stores it (JSON round trip)."""
    mech = MECHANISMS[name]
    params = mech.load_params(raw)
    cost = mech.cost(params, DRAW, META)
    out = mech.run(data or _data(), params, cost, META, np.random.default_rng(seed))
    assert out.table is not None
    view = ReleaseView(f"rel-{seed}", name, json.loads(json.dumps(params)),
                       json.loads(json.dumps(out.result)), out.table, META)
    return out, view


def _table(out: Output) -> Mapping[str, np.ndarray]:
    assert out.table is not None
    return out.table


def test_registered_names_and_analyses() -> None:
    assert "mechanisms.subset" in registry.BUILTIN
    for name, mech in MECHANISMS.items():
        assert registry.get(name) is mech and name in registry.names()
        assert mech.measures == ("subset_draws",)
        assert "estimate" in mech.analyses
    assert "independence_test" not in MECHANISMS["subset.dummy"].analyses
    assert MECHANISMS["subset.product"].analyses["independence_test"].n_others == 0
    assert MECHANISMS["subset.uniform"].analyses["independence_test"].n_others == 1


def test_library_imports_no_service_code() -> None:
    code = ("import sys, mechanisms.subset; bad = [m for m in ('flask', 'celery', 'redis',"
            " 'service', 'workers') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("name", "raw", "field"), [
    ("subset.uniform", {"column": "race", "colour": 1}, "colour"),
    ("subset.uniform", {}, "column"),
    ("subset.uniform", {"column": "race", "format": "csv"}, "format"),
    ("subset.uniform", {"column": "race", "prior_draws": 9}, "prior_draws"),
    ("subset.dummy", {"column": "sex", "alpha": 0.5}, "alpha"),
    ("subset.dummy", {"column": "sex"}, "alpha"),
    ("subset.custom", {"column": "c4", "design": {"type": "nu", "subsets": [["a", "b"]],
                                                  "probabilities": [0.5, 0.5]}}, "design"),
    ("subset.product", {"columns": ["race"]}, "columns"),
    ("subset.product", {"columns": ["race", "race"]}, "columns"),
    ("subset.product", {"columns": ["race", "c4"], "designs": {"c4": {"type": "nu"}}},
     "designs"),
])
def test_schema_rejects(name: str, raw: dict[str, Any], field: str) -> None:
    with pytest.raises(marshmallow.ValidationError) as info:
        MECHANISMS[name].load_params(raw)
    assert field in info.value.messages


def test_cost_is_one_draw_per_column() -> None:
    uniform = MECHANISMS["subset.uniform"]
    params = uniform.load_params({"column": "race"})
    assert uniform.cost(params, DRAW, META) == {"subset_draws:race": Fraction(1)}
    assert uniform.cost(params, {"subset_draws:race": Fraction(2)}, META) == {
        "subset_draws:race": Fraction(1)}
    combined = uniform.load_params({"column": "sex", "combine_with": ["income"]})
    assert uniform.cost(combined, DRAW, META) == {"subset_draws:sex": Fraction(1),
                                                  "subset_draws:income": Fraction(1)}
    product = MECHANISMS["subset.product"]
    pp = product.load_params({"columns": ["race", "c4"]})
    assert product.cost(pp, {"subset_draws": Fraction(1)}, META) == {
        "subset_draws:race": 1, "subset_draws:c4": 1}


@pytest.mark.parametrize(("budget", "field"), [
    ({"epsilon": Fraction(1)}, "budget"),
    ({"subset_draws:sex": Fraction(1)}, "budget"),
    ({}, "budget.subset_draws"),
    ({"subset_draws": Fraction(1, 2)}, "budget.subset_draws"),
    ({"subset_draws:race": Fraction(0)}, "budget.subset_draws:race"),
    ({"subset_draws": True}, "budget.subset_draws"),
    ({"subset_draws": float("nan")}, "budget.subset_draws"),
])
def test_budget_errors(budget: dict[str, Any], field: str) -> None:
    mech = MECHANISMS["subset.uniform"]
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params({"column": "race"}), budget, META)
    assert info.value.field == field


@pytest.mark.parametrize(("name", "raw", "field", "match"), [
    ("subset.uniform", {"column": "nope"}, "params.column", "unknown column"),
    ("subset.uniform", {"column": "age"}, "params.column", "categorical"),
    ("subset.uniform", {"column": "sex"}, "params.column", "combine_with"),
    ("subset.uniform", {"column": "sex", "combine_with": ["sex"]}, "params.combine_with",
     "itself"),
    ("subset.uniform", {"column": "sex", "combine_with": ["age"]}, "params.combine_with.0",
     "categorical"),
    ("subset.uniform", {"column": "race", "combine_with": ["wide"]}, "params.column", "63"),
    ("subset.uniform", {"column": "pipe", "format": "categories"}, "params.format", "'|'"),
    ("subset.custom", {"column": "c4", "design": {"type": "mu", "subsets": [["a", "b"], ["q"]],
                                                  "probabilities": [1, 1]}},
     "params.design.subsets.1", "does not declare"),
    ("subset.custom", {"column": "c4", "design": {"type": "nu", "subsets": PAIRS6,
                                                  "probabilities": [0.2] * 6}},
     "params.design.probabilities", "sum to 1"),
    ("subset.custom", {"column": "c4", "design": {"type": "nu", "subsets": [["a"], ["b", "c"]],
                                                  "probabilities": [0.5, 0.5]}},
     "params.design.subsets", "size 2..2"),
    ("subset.custom", {"column": "c4", "design": {"type": "mu",
                                                  "subsets": [["a", "b"], ["c", "d"]],
                                                  "probabilities": [1, 1]}},
     "params.design.subsets", "not identifiable"),
    ("subset.custom", {"column": "wide", "design": {"type": "nu", "subsets": [["k0", "k1"]],
                                                    "probabilities": [1]}},
     "params.column", "limited to 16"),
    ("subset.dummy", {"column": "sex", "alpha": 0.1, "base": "uniform"}, "params.base",
     "at least 4"),
    ("subset.product", {"columns": ["race", "c4"], "designs": {"sex": {}}},
     "params.designs.sex", "not one of"),
    ("subset.product", {"columns": ["race", "sex"]}, "params.columns.1", "at least 4"),
])
def test_metadata_errors_name_the_field(name: str, raw: dict[str, Any], field: str,
                                        match: str) -> None:
    mech = MECHANISMS[name]
    with pytest.raises(MechanismInputError, match=match) as info:
        mech.cost(mech.load_params(raw), DRAW, META)
    assert info.value.field == field


def test_small_domain_message_points_to_the_strategies() -> None:
    mech = MECHANISMS["subset.uniform"]
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params({"column": "sex"}), DRAW, META)
    for hint in ("at least 4", "combine_with", "artificial_levels", "subset.dummy"):
        assert hint in info.value.message


def test_accuracy_from_public_inputs() -> None:
    mech = MECHANISMS["subset.uniform"]
    params = mech.load_params({"column": "race", "prior_draws": 1})
    acc = mech.accuracy(params, mech.cost(params, DRAW, META), META)
    assert acc == mech.accuracy(params, {}, META)  # no data, no randomness
    json.dumps(acc)
    var = acc["variables"][0]
    design = subset.design_uniform(5)
    flat = np.full(5, 0.2)
    q = float(1 / design.r_p)
    assert np.isclose(var["privacy_under_uniform_prior"]["size_coverage"], q + (1 - q) / 5)
    assert np.isclose(var["expected_subset_size"], 1 + 4 / 2.5)
    assert var["subset_size_range"] == [2, 3]
    assert np.allclose(var["standard_errors_under_uniform_prior"]["em"],
                       np.sqrt(np.diag(asymptotic.mle_covariance(design, flat)) / N))
    assert var["composed"]["draws"] == 2
    assert var["composed"]["disclosure_probability_under_uniform_prior"] > 0.3
    c4 = mech.load_params({"column": "c4", "prior_draws": 1})
    composed = mech.accuracy(c4, DRAW, META)["variables"][0]["composed"]
    assert np.isclose(composed["disclosure_probability_under_uniform_prior"], 2 / 3)
    dummy = MECHANISMS["subset.dummy"]
    dp = dummy.load_params({"column": "sex", "alpha": 0.1})
    dacc = dummy.accuracy(dp, DRAW, META)["variables"][0]
    m = round(0.1 * N / 0.8)
    assert dacc["dummy"]["dummy_records_per_category"] == m
    assert dacc["dummy"]["released_records"] == N + 2 * m
    assert np.isclose(dacc["coverage_floor"], m / (N + 2 * m))
    assert "statement" in acc and "true category" in acc["statement"]
    big = DatasetMeta(10, {"big": ColumnMeta("big", "categorical",
                                             categories=tuple(str(i) for i in range(40)))})
    bp = mech.load_params({"column": "big"})
    bacc = mech.accuracy(bp, DRAW, big)["variables"][0]  # p = 40: closed forms, no 2**40 list
    assert bacc["privacy_under_uniform_prior"]["mi_bits"] is not None


def test_uniform_release_table_and_result() -> None:
    data = _data()
    out, view = _release("subset.uniform", {"column": "race", "format": "both"}, data=data)
    masks = _table(out)["race"]
    assert masks.dtype == np.int64 and masks.shape == (N,)
    assert np.all(bitmask.contains(masks, data["race"]))
    assert np.array_equal(_table(out)["race_categories"], bitmask.labels(masks, RACE))
    assert "not epsilon-DP" in out.guarantee and "one draw per record" in out.guarantee
    result = view.result
    var = result["variables"][0]
    assert result["n_records"] == N and var["table"] == {"bitmask": "race",
                                                         "categories": "race_categories"}
    assert var["counts"]["records"] == N and sum(var["counts"]["subset_sizes"].values()) == N
    assert set(var["counts"]["subset_sizes"]) <= {"2", "3"}
    assert np.isclose(sum(var["estimate"]["w"]), 1.0)
    assert var["privacy"]["computed_from"].startswith("the distribution estimated")
    assert out.accuracy == MECHANISMS["subset.uniform"].accuracy(view.params, DRAW, META)


def test_same_seed_same_release() -> None:
    one, _ = _release("subset.product", {"columns": ["race", "c4"]}, seed=5)
    two, _ = _release("subset.product", {"columns": ["race", "c4"]}, seed=5)
    three, _ = _release("subset.product", {"columns": ["race", "c4"]}, seed=6)
    for column in ("race", "c4"):
        assert _table(one)[column].tobytes() == _table(two)[column].tobytes()
        assert _table(one)[column].tobytes() != _table(three)[column].tobytes()
    assert json.dumps(one.result) == json.dumps(two.result)
    assert not np.array_equal(_table(one)["race"], _table(one)["c4"])


def test_combined_and_artificial_variables() -> None:
    data = _data()
    out, view = _release("subset.uniform", {"column": "sex", "combine_with": ["income"],
                                            "format": "categories"}, data=data)
    labels = _table(out)["sex+income"]
    assert labels.dtype.kind == "U"
    masks = bitmask.parse_labels(labels, ("F&Low", "F&High", "M&Low", "M&High"))
    assert np.all(bitmask.contains(masks, data["sex"] * 2 + data["income"]))
    fit = MECHANISMS["subset.uniform"].analyses["estimate"].run(view, {}, [], np.random
                                                                  .default_rng(0))
    income = fit["marginals"]["income"]
    truth = np.bincount(data["income"], minlength=2) / N
    assert np.all(np.abs(np.array(income["w"]) - truth) <= 4.5 * np.array(income["se"]))
    out, view = _release("subset.uniform", {"column": "sex", "artificial_levels": 2}, data=data)
    # the released subset holds (sex, u) for the record's sex and its (unpublished) u
    masks = _table(out)["sex"]
    assert np.all(bitmask.contains(masks, data["sex"] * 2)
                  | bitmask.contains(masks, data["sex"] * 2 + 1))
    fit = MECHANISMS["subset.uniform"].analyses["estimate"].run(view, {"method": "mom"}, [],
                                                                  np.random.default_rng(0))
    assert fit["marginals"]["sex"]["categories"] == ["F", "M"]


def test_dummy_release() -> None:
    data = _data()
    out, view = _release("subset.dummy", {"column": "sex", "alpha": 0.1}, data=data)
    m = round(0.1 * N / 0.8)
    masks = _table(out)["sex"]
    assert len(masks) == N + 2 * m
    dummies = bitmask.as_masks(masks) >> np.uint64(2)
    assert set(np.unique(dummies).tolist()) == {1, 2}
    var = view.result["variables"][0]
    assert var["categories"] == ["F", "M", "<dummy 1>", "<dummy 2>"]
    assert var["dummy"]["n_real"] == N and var["dummy"]["dummy_records_per_category"] == m
    assert view.result["n_records"] == N + 2 * m
    fit = MECHANISMS["subset.dummy"].analyses["estimate"].run(view, {}, [],
                                                                np.random.default_rng(0))
    truth = np.bincount(data["sex"], minlength=2) / N
    assert np.all(np.abs(np.array(fit["w"]) - truth) <= 4.5 * np.array(fit["se"]))
    assert fit["privacy"]["min_individual_coverage"] >= var["dummy"]["alpha_effective"] - 1e-12


def test_custom_release() -> None:
    data = _data()
    design = {"type": "mu", "subsets": PAIRS6, "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25,
                                                                 0.25]}
    out, view = _release("subset.custom", {"column": "c4", "design": design}, data=data)
    assert np.all(bitmask.contains(_table(out)["c4"], data["c4"]))
    var = view.result["variables"][0]
    assert var["design"]["type"] == "mu" and var["design"]["subsets"][0] == ["a", "b"]
    fit = MECHANISMS["subset.custom"].analyses["estimate"].run(
        view, {"method": "one_step"}, [], np.random.default_rng(0))
    assert fit["method"] == "one_step" and np.isclose(sum(fit["w"]), 1.0)
    with pytest.raises(MechanismInputError, match="uniform design"):
        MECHANISMS["subset.custom"].analyses["estimate"].run(
            view, {"method": "mom_closed"}, [], np.random.default_rng(0))


def test_independence_analyses() -> None:
    data = _data()
    _, race = _release("subset.uniform", {"column": "race"}, seed=1, data=data)
    _, joint = _release("subset.uniform", {"column": "sex", "artificial_levels": 2}, seed=2,
                        data=data)
    test = MECHANISMS["subset.uniform"].analyses["independence_test"]
    params = test.load_params({"methods": ["lrt_mle", "bonferroni"]})
    out = test.run(race, params, [joint], np.random.default_rng(0))
    assert out["columns"] == ["race", "sex"] and out["n"] == N
    assert set(out["tests"]) == {"lrt_mle", "bonferroni"}
    json.dumps(out)
    _, both = _release("subset.product", {"columns": ["c4", "sex"], "designs": {
        "sex": {"artificial_levels": 2}}}, data=data)
    ptest = MECHANISMS["subset.product"].analyses["independence_test"]
    res = ptest.run(both, ptest.load_params({"calibration": "permutation", "n_perm": 99}), [],
                    np.random.default_rng(0))
    assert res["tests"]["lrt_mom"]["n_perm"] == 99
    # sex and income are dependent (P(High | F) = 0.11 vs 0.31): detected at n = 3000
    _, si = _release("subset.product", {"columns": ["sex", "income"], "designs": {
        "sex": {"artificial_levels": 2}, "income": {"artificial_levels": 2}}}, data=data)
    res = ptest.run(si, ptest.load_params({"methods": ["lrt_mle"]}), [],
                    np.random.default_rng(0))
    assert res["tests"]["lrt_mle"]["reject"]


def test_analysis_errors() -> None:
    _, dummy = _release("subset.dummy", {"column": "c4", "alpha": 0.2})
    _, race = _release("subset.uniform", {"column": "race"})
    _, prod = _release("subset.product", {"columns": ["race", "c4"]})
    test = MECHANISMS["subset.uniform"].analyses["independence_test"]
    rng = np.random.default_rng(0)
    with pytest.raises(MechanismInputError, match="dummy") as info:
        test.run(race, test.load_params({}), [dummy], rng)
    assert info.value.field == "releases.0"
    with pytest.raises(MechanismInputError, match="several variables") as info:
        test.run(race, test.load_params({}), [prod], rng)
    assert info.value.field == "params.other_column"
    assert test.run(race, test.load_params({"other_column": "c4"}), [prod], rng)["n"] == N
    other = ReleaseView("x", "laplace", {}, {"value": 1.0}, None, META)
    with pytest.raises(MechanismInputError, match="not a subset-privacy release"):
        test.run(race, test.load_params({}), [other], rng)
    estimate = MECHANISMS["subset.product"].analyses["estimate"]
    with pytest.raises(MechanismInputError) as info:
        estimate.run(prod, estimate.load_params({}), [], rng)
    assert info.value.field == "params.column"
    with pytest.raises(MechanismInputError, match="only"):
        estimate.run(prod, estimate.load_params({"column": "sex"}), [], rng)
    fit = estimate.run(prod, estimate.load_params({"column": "c4", "method": "mom"}), [], rng)
    assert fit["column"] == "c4" and len(fit["w"]) == 4
    with pytest.raises(marshmallow.ValidationError):
        estimate.load_params({"method": "cvxpy"})
    no_table = ReleaseView("y", "subset.uniform", race.params, race.result, None, META)
    with pytest.raises(MechanismInputError, match="no stored table"):
        MECHANISMS["subset.uniform"].analyses["estimate"].run(no_table, {}, [], rng)


def test_public_limits() -> None:
    """Refusals decided from metadata alone: label width, composition size, p ≤ 63."""
    names = tuple(f"category-{i:02d}" for i in range(63))
    big = DatasetMeta(10**7, {"big": ColumnMeta("big", "categorical", categories=names)})
    mech = MECHANISMS["subset.uniform"]
    with pytest.raises(MechanismInputError, match="MiB") as info:
        mech.cost(mech.load_params({"column": "big", "format": "categories"}), DRAW, big)
    assert info.value.field == "params.format"
    params = mech.load_params({"column": "big", "prior_draws": 1})
    var = mech.accuracy(params, DRAW, big)["variables"][0]
    assert var["composed"]["note"].startswith("not computed")
    assert var["subset_size_range"] == [2, 61]
