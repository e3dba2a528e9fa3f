"""Dataset metadata schemas (service/metadata.py) and the numeric limits behind them.

Issue 15 items 4 and 5: priors with unknown families, non-positive scales or scipy's
parameter names used to register with 201 and break every later release; extreme but
finite bounds and priors crashed the interval calibration (NaN, ZeroDivisionError), the
DIP worker, or made the KDEs charge for an all-zero density. Every case here is now a
named 4xx, at upload or at the mechanism's cost check (which runs at POST).
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mechanisms
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError, bounds_problem
from mechanisms.interval.coverage import CalibrationError, calibrate_scale
from mechanisms.interval.priors import FAMILIES, RANGES, column_prior, make_prior
from service.ingest import IngestError, parse_metadata
from service.metadata import COLUMN_SCHEMAS, PRIOR_SCHEMAS, register_components

#: a valid example of every prior family, on the column bounds [0, 10]
EXAMPLES: dict[str, dict[str, Any]] = {
    "normal": {"family": "normal", "loc": 5, "scale": 2},
    "logistic": {"family": "logistic", "loc": 5, "scale": 2},
    "laplace": {"family": "laplace", "loc": 5, "scale": 2},
    "t": {"family": "t", "df": 3, "loc": 5, "scale": 2},
    "uniform": {"family": "uniform", "low": 0, "high": 10},
    "beta": {"family": "beta", "a": 2, "b": 3, "low": 0, "high": 10},
    "lognormal": {"family": "lognormal", "mu": 1, "sigma": 0.5},
    "gamma": {"family": "gamma", "shape": 2, "scale": 1.5},
}


def _meta(column: dict[str, Any], name: str = "x") -> dict[str, Any]:
    return {"name": "d", "budgets": {}, "columns": {name: column}}


def _with_prior(prior: Any, bounds: list[float] | None = None) -> dict[str, Any]:
    return _meta({"type": "continuous", "bounds": bounds or [0, 10], "prior": prior})


def _refused(raw: Any) -> IngestError:
    with pytest.raises(IngestError) as info:
        parse_metadata(raw)
    return info.value


# --------------------------------------------------------------------------- schemas


def test_one_schema_per_prior_family_with_the_mechanisms_parameter_names() -> None:
    """The schemas and the interval library agree on families and parameter names."""
    assert set(PRIOR_SCHEMAS) == set(FAMILIES) == set(RANGES) == set(EXAMPLES)
    for family, schema in PRIOR_SCHEMAS.items():
        required, optional = FAMILIES[family]
        fields = schema().fields
        assert set(fields) == {"family", *required, *optional}
        assert {n for n, f in fields.items() if f.required} == {"family", *required}
    assert set(COLUMN_SCHEMAS) == {"continuous", "integer", "categorical", "functional"}


@pytest.mark.parametrize("family", sorted(EXAMPLES))
def test_every_family_registers_and_builds_its_prior(family: str) -> None:
    spec = parse_metadata(_with_prior(EXAMPLES[family]))
    prior = spec.columns["x"].prior
    assert prior == EXAMPLES[family]
    built = column_prior(spec.columns["x"])
    assert 0 < built.sd < 10 and 0 <= built.median <= 10


CAUCHY = {"family": "cauchy", "loc": 0, "scale": 1}
PRIOR_ERRORS: list[tuple[str, Any, str]] = [
    ("unknown family cauchy", CAUCHY, "prior.family"),
    ("family missing", {"loc": 0, "scale": 1}, "prior.family"),
    ("family not a string", {"family": 3}, "prior.family"),
    ("not an object", "normal", "prior"),
    ("scale 0", {"family": "normal", "loc": 5, "scale": 0}, "prior.scale"),
    ("scale -1", {"family": "logistic", "loc": 5, "scale": -1}, "prior.scale"),
    ("gamma scale 0", {"family": "gamma", "shape": 2, "scale": 0}, "prior.scale"),
    ("scipy s", {"family": "lognormal", "s": 1, "mu": 0, "sigma": 1}, "prior.s"),
    ("scipy mean", {"family": "normal", "mean": 5, "sd": 1}, "prior.mean"),
    ("scipy sd", {"family": "normal", "loc": 5, "sd": 1}, "prior.sd"),
    ("required missing", {"family": "normal", "loc": 5}, "prior.scale"),
    ("string number", {"family": "beta", "a": "2", "b": 2}, "prior.a"),
    ("boolean number", {"family": "beta", "a": True, "b": 2}, "prior.a"),
    ("nan", {"family": "normal", "loc": math.nan, "scale": 1}, "prior.loc"),
    ("beta huge", {"family": "beta", "a": 1e300, "b": 1e300}, "prior.a"),
    ("beta tiny", {"family": "beta", "a": 2, "b": 1e-300}, "prior.b"),
    ("df 0", {"family": "t", "df": 0, "loc": 5, "scale": 1}, "prior.df"),
    ("lognormal mu 1e3", {"family": "lognormal", "mu": 1e3, "sigma": 1}, "prior.mu"),
    ("uniform reversed", {"family": "uniform", "low": 5, "high": 1}, "prior.high"),
    ("beta one end", {"family": "beta", "a": 2, "b": 2, "low": 0}, "prior.high"),
    ("no mass on the bounds", {"family": "normal", "loc": 1e6, "scale": 1}, "prior"),
    ("numerically a point", {"family": "normal", "loc": 5, "scale": 1e-12}, "prior"),
]


@pytest.mark.parametrize(("prior", "field"), [(p, f) for _, p, f in PRIOR_ERRORS],
                         ids=[c for c, _, _ in PRIOR_ERRORS])
def test_bad_prior_is_refused_at_upload_naming_the_field(prior: Any, field: str) -> None:
    """Catches the old upload, which took any family and any finite parameter (201)."""
    err = _refused(_with_prior(prior))
    assert err.field == f"metadata.columns.x.{field}"
    assert err.message


def test_unknown_parameter_message_lists_the_familys_names() -> None:
    err = _refused(_with_prior({"family": "lognormal", "s": 1}))
    assert err.field == "metadata.columns.x.prior.s"
    assert "mu" in err.message and "sigma" in err.message


@pytest.mark.parametrize(("family", "param"), [
    (f, p) for f, params in sorted(RANGES.items()) for p in sorted(params)])
def test_parameter_ranges_are_closed_and_enforced(family: str, param: str) -> None:
    """The documented range's ends load; just beyond them is refused naming the param."""
    low, high = RANGES[family][param]
    schema = PRIOR_SCHEMAS[family]()
    base = {k: v for k, v in EXAMPLES[family].items() if k not in ("low", "high")}
    if family in ("uniform", "beta"):
        base |= {"low": -1e100, "high": 1e100}
    for ok in (low, high):
        loaded = dict(base, **{param: ok})
        if param == "low":
            loaded["high"] = 1e100 if ok < 1e100 else None
        if param == "high":
            loaded["low"] = -1e100 if ok > -1e100 else None
        if None in loaded.values():
            continue  # low == high: refused by low < high, not by the range
        schema.load(loaded)
    for bad in (low - abs(low) * 1e-3 - 1e-300, high + abs(high) * 1e-3 + 1e-300):
        errors = schema.validate(dict(base, **{param: bad}))
        assert param in errors


BOUNDS_ERRORS: list[tuple[str, dict[str, Any]]] = [
    ("±1e308", {"type": "continuous", "bounds": [-1e308, 1e308]}),
    ("beyond 1e100", {"type": "continuous", "bounds": [0, 2e100]}),
    ("span below 1e-100", {"type": "continuous", "bounds": [0, 1e-200]}),
    ("span below float resolution", {"type": "continuous", "bounds": [1e6, 1e6 + 1e-6]}),
    ("integer beyond 2**53", {"type": "integer", "bounds": [0, 2**53 + 2]}),
    ("integer beyond int64", {"type": "integer", "bounds": [0, 2**63]}),
]


@pytest.mark.parametrize("column", [c for _, c in BOUNDS_ERRORS],
                         ids=[n for n, _ in BOUNDS_ERRORS])
def test_unusable_bounds_are_refused_at_upload(column: dict[str, Any]) -> None:
    """Catches the old upload, which took any finite bounds (±1e308 broke dip, iclp)."""
    assert _refused(_meta(column)).field == "metadata.columns.x.bounds"


def test_norm_bound_beyond_the_limit_is_refused() -> None:
    """A 1e308 norm bound made the functional mechanisms' sensitivity infinite (a 422
    naming budget.epsilon at POST); now the upload names the metadata field."""
    column = {"type": "functional", "grid": [0, 0.5, 1], "norm_bound": 1e308}
    assert _refused(_meta(column, "f")).field == "metadata.columns.f.norm_bound"
    parse_metadata(_meta({**column, "norm_bound": 1e100}, "f"))


def test_bounds_at_the_limits_are_accepted() -> None:
    for column in ({"type": "continuous", "bounds": [-1e100, 1e100]},
                   {"type": "continuous", "bounds": [1e6, 1e6 + 1e-3]},
                   {"type": "continuous", "bounds": [0, 1e-100]},
                   {"type": "integer", "bounds": [-(2**53), 2**53]}):
        parse_metadata(_meta(column))


@settings(max_examples=150, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(lo=st.floats(allow_nan=False, allow_infinity=False),
       hi=st.floats(allow_nan=False, allow_infinity=False))
def test_bounds_rule_is_the_documented_one(lo: float, hi: float) -> None:
    """Accepted exactly when finite, lo < hi, |.| <= 1e100 and the span is representable;
    accepted bounds give a finite span and a finite, strictly increasing 2000-point grid."""
    raw = _meta({"type": "continuous", "bounds": [lo, hi]})
    expected = (lo < hi and max(abs(lo), abs(hi)) <= 1e100
                and hi - lo >= max(1e-100, 1e-9 * max(abs(lo), abs(hi))))
    if expected:
        parse_metadata(raw)
        grid = np.linspace(lo, hi, 2000)
        assert math.isfinite(hi - lo) and np.all(np.diff(grid) > 0)
    else:
        assert _refused(raw).field == "metadata.columns.x.bounds"
        assert bounds_problem(lo, hi) is not None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8)
COLUMN_KEYS = ["type", "bounds", "categories", "allow_missing", "fill", "prior", "grid",
               "norm_bound", "family", "loc", "scale", "a", "b"]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.dictionaries(st.sampled_from(COLUMN_KEYS), JSON, max_size=5),
       st.sampled_from(["continuous", "integer", "categorical", "functional", None]),
       st.sampled_from([*sorted(FAMILIES), None]))
def test_any_json_is_accepted_or_refused_with_a_metadata_field(
        column: dict[str, Any], kind: str | None, family: str | None) -> None:
    """No input makes the parser raise anything but IngestError naming a metadata field."""
    if kind is not None:
        column["type"] = kind
    if family is not None and isinstance(column.get("prior"), dict):
        column["prior"]["family"] = family
    try:
        spec = parse_metadata(_meta(column))
    except IngestError as err:
        assert err.field.startswith("metadata") and err.message
        return
    col = spec.columns["x"]
    if col.type in ("continuous", "integer"):
        column_prior(col)  # an accepted numeric column always has a usable prior


def test_components_describe_every_type_and_family() -> None:
    spec = APISpec("t", "1", "3.0.3", plugins=[MarshmallowPlugin()])
    register_components(spec)
    doc = spec.to_dict()["components"]["schemas"]
    columns = doc["DatasetMetadata"]["properties"]["columns"]["additionalProperties"]["oneOf"]
    assert {c["$ref"].rsplit("/", 1)[1] for c in columns} == {
        "ContinuousColumn", "IntegerColumn", "CategoricalColumn", "FunctionalColumn"}
    priors = doc["ContinuousColumn"]["properties"]["prior"]["oneOf"]
    names = {p["$ref"].rsplit("/", 1)[1] for p in priors}
    assert names == {cls.__name__.removesuffix("Schema") for cls in PRIOR_SCHEMAS.values()}
    for name in names:
        family = doc[name]["properties"]["family"]["enum"]
        assert len(family) == 1 and family[0] in FAMILIES
        assert doc[name]["additionalProperties"] is False
    assert doc["NormalPrior"]["properties"]["scale"]["minimum"] == 1e-100
    json.dumps(doc)


# --------------------------------------------------------------------------- mechanisms

INTERVAL = ["interval.case1", "interval.case2", "interval.casek", "interval.selective",
            "interval.ring"]
EXTRA = {"interval.casek": {"m": 4}, "interval.selective": {"tau": 0.5}}
LEAKAGE = {"interval_leakage": Fraction(1, 2)}


def _dataset(column: ColumnMeta) -> DatasetMeta:
    return DatasetMeta(n_rows=100, columns={column.name: column})


def _cost(name: str, params: dict[str, Any], budget: dict[str, Fraction],
          meta: DatasetMeta) -> dict[str, Fraction]:
    mech = mechanisms.get(name)
    return mech.cost(mech.load_params(params), budget, meta)


@pytest.mark.parametrize("name", INTERVAL)
@pytest.mark.parametrize("bounds", [(-1000.0, 1000.0), (-800.0, -750.0)])
def test_exp_transform_that_overflows_or_collapses_is_a_param_error(
        name: str, bounds: tuple[float, float]) -> None:
    """Catches ``ValueError: cannot convert float NaN to integer`` in calibrate_scale:
    exp of bounds beyond 709 is inf, below -745 it is 0 (an empty image)."""
    meta = _dataset(ColumnMeta("x", "continuous", bounds=bounds))
    with pytest.raises(MechanismInputError) as info:
        _cost(name, {"column": "x", "calibrate": True, "transform": "exp",
                     **EXTRA.get(name, {})}, LEAKAGE, meta)
    assert info.value.field == "params.transform"


def test_exp_and_square_transforms_inside_the_limits_still_cost() -> None:
    meta = _dataset(ColumnMeta("x", "continuous", bounds=(-5.0, 5.0)))
    for transform in ("exp", "square"):
        cost = _cost("interval.case1", {"column": "x", "calibrate": True,
                                        "transform": transform}, LEAKAGE, meta)
        assert 0 < cost["interval_leakage:x"] <= Fraction(1, 2)


@pytest.mark.parametrize("prior", [
    {"family": "beta", "a": 1e300, "b": 1e300},
    {"family": "beta", "a": 1e-300, "b": 1},
    {"family": "normal", "loc": 0.5, "scale": 1e-14},
])
def test_degenerate_priors_built_by_hand_are_a_param_error(prior: dict[str, Any]) -> None:
    """Catches the ZeroDivisionError of calibrating against a prior whose SD is 0
    (hand-built metadata in a notebook skips the upload's schema)."""
    meta = _dataset(ColumnMeta("x", "continuous", bounds=(0.0, 1.0), prior=prior))
    with pytest.raises(MechanismInputError) as info:
        _cost("interval.case1", {"column": "x", "calibrate": True}, LEAKAGE, meta)
    assert info.value.field == "params.column"


def test_calibrate_scale_refuses_a_degenerate_scale_range() -> None:
    """Catches ZeroDivisionError (lo = 0) and NaN steps (hi = inf)."""
    for lo, hi in [(0.0, 1.0), (1.0, math.inf), (math.nan, 1.0), (2.0, 1.0)]:
        with pytest.raises(CalibrationError):
            calibrate_scale(lambda s: 0.0, 0.5, lo, hi)


@pytest.mark.parametrize(("name", "params"), [
    ("dip", {"columns": ["x"]}),
    ("iclp.kde", {"column": "x"}),
    ("bernstein.kde", {"column": "x"}),
    ("frl.kde", {"column": "x"}),
])
def test_density_mechanisms_refuse_overflowing_bounds(name: str, params: dict[str, Any]) -> None:
    """Catches the DIP worker failure and the KDEs charging ε for an all-zero density on
    ±1e308 bounds (hi - lo overflows)."""
    meta = _dataset(ColumnMeta("x", "continuous", bounds=(-1e308, 1e308)))
    with pytest.raises(MechanismInputError) as info:
        _cost(name, params, {"epsilon": Fraction(1)}, meta)
    assert info.value.field in ("params.column", "params.columns")


def test_make_prior_refuses_unusable_bounds() -> None:
    with pytest.raises(MechanismInputError):
        make_prior(None, (-1e308, 1e308))
    assert make_prior(None, (-1e100, 1e100)).sd > 0
