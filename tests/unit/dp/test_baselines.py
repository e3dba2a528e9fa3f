"""The laplace, geometric and gaussian baselines: budgets, errors, accuracy, privacy curve.

Statistical checks use fixed seeds and tolerances of 4.5 standard errors of
the Monte Carlo estimate; exact statistics are recomputed here with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import marshmallow
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import registry, sampling
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError, Output
from mechanisms.dp import baselines

Z = 4.5
N_ROWS = 400
META = DatasetMeta(
    n_rows=N_ROWS,
    columns={
        "age": ColumnMeta("age", "integer", (17, 90)),
        "flag": ColumnMeta("flag", "integer", (0, 1)),
        "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
        "wage": ColumnMeta("wage", "continuous", (0.0, 200_000.0)),
        "free": ColumnMeta("free", "continuous"),
    },
)
#: distinctive values that must never show up in an error message
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
        "race": rng.integers(0, 4, N_ROWS),  # code 3 is not a declared category
        "wage": wage,
        "free": rng.normal(size=N_ROWS),
    }


DATA = _data()
EPS = {"epsilon": Fraction(1, 2)}
EPS_DELTA = {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}
BUDGET = {"laplace": EPS, "geometric": EPS, "gaussian": EPS_DELTA}


def _clipped(column: str) -> np.ndarray:
    lo, hi = META.columns[column].bounds or (0, 0)
    x = DATA[column].astype(float)
    return np.clip(np.where(np.isnan(x), lo, x), lo, hi)


def _release(
    name: str,
    params: Mapping[str, Any],
    budget: Mapping[str, Fraction] | None = None,
    seed: int = 0,
    data: Mapping[str, np.ndarray] = DATA,
) -> Output:
    mech = registry.get(name)
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, BUDGET[name] if budget is None else budget, META)
    return mech.run(data, loaded, cost, META, np.random.default_rng(seed))


def _input_error(
    name: str, params: Mapping[str, Any], budget: Mapping[str, Any] | None = None
) -> MechanismInputError:
    mech = registry.get(name)
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params(params), BUDGET[name] if budget is None else budget, META)
    return info.value


SCALARS: list[dict[str, Any]] = [
    {"statistic": "count", "condition": {"column": "race", "op": "in", "value": ["A", "C"]}},
    {"statistic": "sum", "column": "age"},
    {"statistic": "mean", "column": "age"},
]


# --------------------------------------------------------------------------- budget


def test_registered_names_and_measures() -> None:
    assert {"laplace", "geometric", "gaussian"} <= set(registry.names())
    assert registry.get("laplace").measures == ("epsilon",)
    assert registry.get("geometric").measures == ("epsilon",)
    assert registry.get("gaussian").measures == ("epsilon", "delta")


@pytest.mark.parametrize("name", ["laplace", "geometric", "gaussian"])
@pytest.mark.parametrize("params", SCALARS, ids=["count", "sum", "mean"])
def test_cost_equals_budget(name: str, params: dict[str, Any]) -> None:
    mech = registry.get(name)
    cost = mech.cost(mech.load_params(params), BUDGET[name], META)
    assert cost == BUDGET[name]
    assert all(isinstance(v, Fraction) for v in cost.values())


@pytest.mark.parametrize(
    ("name", "budget", "field"),
    [
        ("laplace", {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}, "budget"),
        ("laplace", {"noiseless_bits": Fraction(1)}, "budget"),
        ("geometric", {"epsilon": Fraction(1), "subset_draws:age": Fraction(1)}, "budget"),
        ("laplace", {}, "budget.epsilon"),
        ("gaussian", {"epsilon": Fraction(1)}, "budget.delta"),
        ("gaussian", {"delta": Fraction(1, 10**6)}, "budget.epsilon"),
        ("gaussian", {**EPS_DELTA, "epsilon:age": Fraction(1)}, "budget"),
    ],
)
def test_wrong_measures_are_rejected(name: str, budget: dict[str, Any], field: str) -> None:
    assert _input_error(name, SCALARS[0], budget).field == field


@pytest.mark.parametrize(
    ("name", "budget", "field"),
    [
        ("laplace", {"epsilon": Fraction(0)}, "budget.epsilon"),
        ("laplace", {"epsilon": Fraction(-1)}, "budget.epsilon"),
        ("laplace", {"epsilon": baselines.MAX_EPSILON + 1}, "budget.epsilon"),
        ("laplace", {"epsilon": True}, "budget.epsilon"),
        ("laplace", {"epsilon": "1"}, "budget.epsilon"),
        ("laplace", {"epsilon": math.nan}, "budget.epsilon"),
        ("gaussian", {"epsilon": Fraction(1), "delta": Fraction(0)}, "budget.delta"),
        ("gaussian", {"epsilon": Fraction(1), "delta": Fraction(1)}, "budget.delta"),
        ("gaussian", {"epsilon": Fraction(1), "delta": Fraction(1, 10**40)}, "budget.delta"),
    ],
)
def test_absurd_amounts_are_rejected(name: str, budget: dict[str, Any], field: str) -> None:
    assert _input_error(name, SCALARS[0], budget).field == field


@pytest.mark.parametrize(
    ("name", "budget"),
    [
        ("laplace", {"epsilon": Fraction(1, 10**15)}),
        ("geometric", {"epsilon": Fraction(1, 10**15)}),
        ("gaussian", {"epsilon": Fraction(1, 10**15), "delta": Fraction(1, 10**15)}),
    ],
)
def test_noise_beyond_the_sampler_range_is_an_input_error(
    name: str, budget: dict[str, Fraction]
) -> None:
    assert _input_error(name, {"statistic": "sum", "column": "age"}, budget).field == (
        "budget.epsilon"
    )


# --------------------------------------------------------------------------- params


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("laplace", {"statistic": "sum", "column": "salary"}, "params.column"),
        (
            "laplace",
            {"statistic": "count", "condition": {"column": "salary", "op": "eq", "value": 1}},
            "params.condition.column",
        ),
        ("laplace", {"statistic": "mean", "column": "race"}, "params.column"),
        ("gaussian", {"statistic": "sum", "column": "free"}, "params.column"),
        (
            "laplace",
            {"statistic": "count", "condition": {"column": "race", "op": "lt", "value": "B"}},
            "params.condition.op",
        ),
        (
            "laplace",
            {"statistic": "count", "condition": {"column": "race", "op": "eq", "value": "Z"}},
            "params.condition.value",
        ),
        (
            "geometric",
            {"statistic": "count", "condition": {"column": "race", "op": "in", "value": ["A", 1]}},
            "params.condition.value",
        ),
        (
            "laplace",
            {"statistic": "count", "condition": {"column": "age", "op": "ge", "value": "old"}},
            "params.condition.value",
        ),
        ("laplace", {"statistic": "histogram", "column": "race", "bins": 3}, "params.bins"),
        ("laplace", {"statistic": "histogram", "column": "race", "edges": [0, 1]}, "params.edges"),
        ("gaussian", {"statistic": "histogram", "column": "wage"}, "params.bins"),
        (
            "laplace",
            {"statistic": "histogram", "column": "wage", "edges": [-1.0, 5.0]},
            "params.edges",
        ),
        ("geometric", {"statistic": "sum", "column": "wage"}, "params.column"),
        ("geometric", {"statistic": "mean", "column": "wage"}, "params.column"),
        ("geometric", {"statistic": "mean", "column": "race"}, "params.column"),
    ],
)
def test_metadata_errors_name_the_field(name: str, params: dict[str, Any], field: str) -> None:
    assert _input_error(name, params).field == field


def test_error_messages_contain_no_data_values() -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("laplace", {"statistic": "mean", "column": "race"}),
        ("geometric", {"statistic": "sum", "column": "wage"}),
        (
            "laplace",
            {"statistic": "count", "condition": {"column": "race", "op": "eq", "value": "Z"}},
        ),
        ("laplace", {"statistic": "histogram", "column": "wage", "edges": [-1.0, 5.0]}),
    ]
    secrets = {str(SECRET_AGE), "987654", *(f"{v:g}" for v in DATA["wage"][3:50])}
    for name, params in cases:
        with pytest.raises(MechanismInputError) as info:
            _release(name, params)
        assert not any(secret in info.value.message for secret in secrets)
        assert info.value.field.startswith("params.")


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"statistic": "median", "column": "age"}, "statistic"),
        ({"statistic": "sum", "column": "age", "colour": "red"}, "colour"),
        ({"statistic": "sum"}, "column"),
        ({"statistic": "count"}, "condition"),
        (
            {
                "statistic": "count",
                "column": "age",
                "condition": {"column": "race", "op": "eq", "value": "A"},
            },
            "column",
        ),
        (
            {"statistic": "count", "condition": {"column": "race", "op": "in", "value": "A"}},
            "condition",
        ),
        (
            {"statistic": "count", "condition": {"column": "race", "op": "eq", "value": ["A"]}},
            "condition",
        ),
        (
            {"statistic": "count", "condition": {"column": "race", "op": "eq", "value": True}},
            "condition",
        ),
        (
            {"statistic": "count", "condition": {"column": "race", "op": "like", "value": "A"}},
            "condition",
        ),
        ({"statistic": "sum", "column": "age", "bins": 3}, "bins"),
        ({"statistic": "histogram", "column": "wage", "bins": 0}, "bins"),
        ({"statistic": "histogram", "column": "wage", "bins": 10_001}, "bins"),
        ({"statistic": "histogram", "column": "wage", "bins": 2.0}, "bins"),
        ({"statistic": "histogram", "column": "wage", "edges": [0, 5, 5]}, "edges"),
        ({"statistic": "histogram", "column": "wage", "bins": 2, "edges": [0, 5]}, "edges"),
        ({"statistic": "histogram", "column": "wage", "edges": [0, math.inf]}, "edges"),
    ],
)
def test_schema_rejects_bad_params(params: dict[str, Any], key: str) -> None:
    with pytest.raises(marshmallow.ValidationError) as info:
        registry.get("laplace").load_params(params)
    assert key in info.value.messages_dict


# --------------------------------------------------------------------------- releases


def _exact(params: Mapping[str, Any]) -> float:
    """The statistic on the clipped data, recomputed independently."""
    statistic = params["statistic"]
    if statistic == "count":
        condition = params["condition"]
        assert condition["column"] == "race" and condition["op"] == "in"
        codes = [META.columns["race"].categories.index(v) for v in condition["value"]]  # type: ignore[union-attr]
        return float(np.isin(DATA["race"], codes).sum())
    x = _clipped(params["column"])
    return float(x.sum() if statistic == "sum" else x.mean())


def _coverage_probability(accuracy: Mapping[str, Any], k: int) -> float:
    scale = accuracy["scale"] / accuracy["grid"]
    if accuracy["noise"] == "discrete_laplace":
        return 1.0 - sampling.discrete_laplace_tail(scale, k + 1)
    support = np.arange(-k, k + 1)
    return float(sampling.discrete_gaussian_pmf(scale, support).sum())


#: (mechanism, params, rounding): real-valued statistics are rounded to the grid
#: (at most half a step); integer-valued ones sit on it already
COVERAGE_CASES = [
    ("laplace", {"statistic": "mean", "column": "wage"}, 0.5),
    ("laplace", {"statistic": "sum", "column": "wage"}, 0.5),
    ("laplace", SCALARS[0], 0.0),
    ("geometric", {"statistic": "mean", "column": "age"}, 0.0),
    ("gaussian", {"statistic": "mean", "column": "wage"}, 0.5),
    ("gaussian", {"statistic": "sum", "column": "age"}, 0.0),
]


@pytest.mark.parametrize(("name", "params", "rounding"), COVERAGE_CASES)
def test_release_is_unbiased_and_covers_as_stated(
    name: str, params: dict[str, Any], rounding: float
) -> None:
    runs = 2000
    mech = registry.get(name)
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, BUDGET[name], META)
    accuracy = mech.accuracy(loaded, cost, META)
    rng = np.random.default_rng(7)
    released = [mech.run(DATA, loaded, cost, META, rng).result["value"] for _ in range(runs)]
    errors = np.array(released) - _exact(params)
    grid = accuracy["grid"]
    # unbiased up to the deterministic rounding of the statistic to the grid
    assert abs(errors.mean()) <= Z * errors.std() / math.sqrt(runs) + rounding * grid
    # the stated half-width is (k + rounding) grid steps; coverage is exactly P(|noise| <= k)
    k = round(accuracy["ci95_halfwidth"] / grid - rounding)
    assert accuracy["ci95_halfwidth"] == pytest.approx((k + rounding) * grid)
    p = _coverage_probability(accuracy, k)
    assert p >= baselines.CI_LEVEL > _coverage_probability(accuracy, k - 1)
    covered = np.mean(np.abs(errors) <= accuracy["ci95_halfwidth"] * (1 + 1e-12))
    assert abs(covered - p) <= Z * math.sqrt(p * (1 - p) / runs)


def test_accuracy_statement_keys_and_units() -> None:
    out = _release("laplace", {"statistic": "mean", "column": "wage"})
    acc = out.accuracy
    assert set(acc) >= {"noise", "scale", "sensitivity", "grid", "ci95_halfwidth", "statement"}
    assert acc["noise"] == "discrete_laplace"
    assert acc["sensitivity"] == 200_000 / N_ROWS
    assert sampling.is_power_of_two(acc["grid"])
    assert acc["grid"] <= min(acc["sensitivity"], acc["scale"]) / sampling.GRID_RESOLUTION
    # noise is calibrated to the lattice sensitivity, which covers rounding of neighbours
    assert acc["grid_sensitivity"] >= acc["sensitivity"] / acc["grid"] + 1 - 1e-9
    assert acc["scale"] == pytest.approx(acc["grid_sensitivity"] * acc["grid"] / 0.5)
    assert "95%" in acc["statement"]
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "mean", "column": "wage"})
    assert mech.accuracy(params, EPS, META) == acc  # public inputs only
    gauss = _release("gaussian", {"statistic": "histogram", "column": "race"}).accuracy
    assert gauss["noise"] == "discrete_gaussian"
    assert gauss["sensitivity"] == pytest.approx(math.sqrt(2))


def test_guarantee_names_the_notion_and_the_unit() -> None:
    lap = _release("laplace", SCALARS[0]).guarantee
    assert "pure epsilon-DP" in lap and "epsilon=0.5 nats" in lap
    assert "one record replaced" in lap and "n_rows public" in lap
    gauss = _release("gaussian", SCALARS[0]).guarantee
    assert "(epsilon, delta)-DP" in gauss and "delta=1e-06" in gauss


@pytest.mark.parametrize("name", ["laplace", "geometric", "gaussian"])
def test_histogram_shapes(name: str) -> None:
    cat = _release(name, {"statistic": "histogram", "column": "race"}).result
    assert cat["categories"] == ["A", "B", "C"]
    assert len(cat["values"]) == 3 and all(type(v) is int for v in cat["values"])
    binned = _release(name, {"statistic": "histogram", "column": "wage", "bins": 4}).result
    assert binned["bins"] == [
        [0.0, 50_000.0],
        [50_000.0, 100_000.0],
        [100_000.0, 150_000.0],
        [150_000.0, 200_000.0],
    ]
    assert len(binned["values"]) == 4 and all(type(v) is int for v in binned["values"])
    edged = _release(name, {"statistic": "histogram", "column": "age", "edges": [20, 30, 65]})
    assert edged.result["bins"] == [[20.0, 30.0], [30.0, 65.0]]
    assert len(edged.result["values"]) == 2


def _noiseless(params: dict[str, Any]) -> dict[str, Any]:
    """geometric at ε = 100 on a sensitivity-1 or -2 statistic: noise is 0 w.p. 1 − 4e-22."""
    return _release("geometric", params, {"epsilon": Fraction(100)}).result


def test_histograms_bin_the_clipped_data() -> None:
    race = _noiseless({"statistic": "histogram", "column": "race"})["values"]
    assert race == [int(np.sum(DATA["race"] == code)) for code in range(3)]  # code 3: no bin
    edges = [0.0, 1_000.0, 150_000.0, 200_000.0]
    wage = _noiseless({"statistic": "histogram", "column": "wage", "edges": edges})["values"]
    assert wage == np.histogram(_clipped("wage"), bins=edges)[0].tolist()
    inner = [1_000.0, 150_000.0]  # values outside the edges fall in no bin
    part = _noiseless({"statistic": "histogram", "column": "wage", "edges": inner})["values"]
    assert part == np.histogram(_clipped("wage"), bins=inner)[0].tolist()


@pytest.mark.parametrize(
    ("column", "op", "value"),
    [
        ("race", "eq", "B"),
        ("race", "ne", "B"),
        ("race", "in", ["A", "C"]),
        ("age", "lt", 30),
        ("age", "le", 90),
        ("age", "gt", 89.5),
        ("age", "ge", 17),
        ("age", "eq", 17),
        ("wage", "in", [0.0, 200_000.0]),
        ("wage", "ne", 0.0),
    ],
)
def test_count_conditions(column: str, op: str, value: Any) -> None:
    params = {"statistic": "count", "condition": {"column": column, "op": op, "value": value}}
    result = _noiseless(params)["value"]
    assert type(result) is int
    if column == "race":
        x = DATA["race"].astype(float)
        names = value if isinstance(value, list) else [value]
        target = [float(META.columns["race"].categories.index(v)) for v in names]  # type: ignore[union-attr]
        value = target if op == "in" else target[0]
    else:
        x = _clipped(column)
    compare = {
        "eq": np.equal,
        "ne": np.not_equal,
        "lt": np.less,
        "le": np.less_equal,
        "gt": np.greater,
        "ge": np.greater_equal,
    }
    expected = np.isin(x, value) if op == "in" else compare[op](x, value)
    assert result == int(expected.sum())


def test_integer_sums_and_means_are_clipped_and_exact_on_the_integer_lattice() -> None:
    flag = np.clip(DATA["flag"], 0, 1)
    total = _noiseless({"statistic": "sum", "column": "flag"})["value"]
    assert type(total) is int and total == int(flag.sum())
    mean = _noiseless({"statistic": "mean", "column": "flag"})["value"]
    assert mean == flag.sum() / N_ROWS


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6) | st.just(math.nan), min_size=1),
    st.integers(min_value=1, max_value=10_000).map(lambda k: Fraction(k, 100)),
    st.sampled_from(["sum", "mean"]),
    st.sampled_from(["laplace", "gaussian"]),
    st.integers(min_value=0, max_value=2**32),
)
def test_real_valued_outputs_are_grid_points(
    wages: list[float], epsilon: Fraction, statistic: str, name: str, seed: int
) -> None:
    meta = DatasetMeta(n_rows=len(wages), columns={"wage": META.columns["wage"]})
    budget = {"epsilon": epsilon}
    if name == "gaussian":
        budget["delta"] = Fraction(1, 10**9)
    mech = registry.get(name)
    params = mech.load_params({"statistic": statistic, "column": "wage"})
    cost = mech.cost(params, budget, meta)
    out = mech.run({"wage": np.array(wages)}, params, cost, meta, np.random.default_rng(seed))
    grid = out.accuracy["grid"]
    assert sampling.is_power_of_two(grid)
    assert (out.result["value"] / grid).is_integer()


class _Spy(dict[str, np.ndarray]):
    """A data mapping that records which columns were read."""

    def __init__(self, data: Mapping[str, np.ndarray]) -> None:
        super().__init__(data)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> np.ndarray:
        self.read.add(key)
        return super().__getitem__(key)


@pytest.mark.parametrize(
    ("params", "column"),
    [
        ({"statistic": "mean", "column": "wage"}, "wage"),
        ({"statistic": "histogram", "column": "race"}, "race"),
        (SCALARS[0], "race"),
    ],
)
def test_run_reads_only_the_needed_column(params: dict[str, Any], column: str) -> None:
    spy = _Spy(DATA)
    _release("gaussian", params, data=spy)
    assert spy.read == {column}


def test_randomness_comes_only_from_the_passed_generator() -> None:
    params = {"statistic": "mean", "column": "wage"}
    for name in ("laplace", "gaussian"):
        assert _release(name, params, seed=5).result == _release(name, params, seed=5).result
        values = {_release(name, params, seed=s).result["value"] for s in range(6)}
        assert len(values) > 1


# --------------------------------------------------------------------------- privacy curve


def _brute_delta(sigma: float, epsilon: float, shift: int, pair: bool) -> float:
    """δ(ε) of the discrete Gaussian mechanism by summing the privacy-loss definition.

    Scalar: Σ_y max(0, p(y) − e^ε p(y − a)). Histogram (one unit moved between two
    bins): the same over the 2-D product pmf with shift (a, −a).
    """
    half = math.ceil(15 * sigma) + 2 * shift + 5
    y = np.arange(-half, half + 1)
    weights = np.exp(-(y.astype(float) ** 2) / (2 * sigma**2))
    norm = sampling.discrete_gaussian_normalizer(sigma)
    p = weights / norm
    shifted = np.exp(-((y - shift).astype(float) ** 2) / (2 * sigma**2)) / norm
    if not pair:
        return float(np.maximum(p - math.exp(epsilon) * shifted, 0.0).sum())
    back = np.exp(-((y + shift).astype(float) ** 2) / (2 * sigma**2)) / norm
    joint = np.outer(p, p) - math.exp(epsilon) * np.outer(shifted, back)
    return float(np.maximum(joint, 0.0).sum())


@pytest.mark.parametrize(
    ("epsilon", "delta", "shift", "pair"),
    [
        (1.0, 1e-6, 1, False),
        (1.0, 1e-6, 1, True),
        (0.1, 1e-6, 1, True),
        (10.0, 1e-3, 1, False),
        (3.0, 1e-9, 2, True),
        (0.5, 1e-9, 73, False),
        (1.0, 1e-6, 1601, False),  # above EXACT_SIGMA: Euler–Maclaurin bounds
        (0.2, 1e-10, 900, False),
    ],
)
def test_sigma_calibration_is_safe_and_tight(
    epsilon: float, delta: float, shift: int, pair: bool
) -> None:
    sigma = baselines.discrete_gaussian_sigma(epsilon, delta, shift, pair)
    assert _brute_delta(sigma, epsilon, shift, pair) <= delta
    assert _brute_delta(0.99 * sigma, epsilon, shift, pair) > delta
    assert baselines.discrete_gaussian_delta(sigma, epsilon, shift, pair) <= delta
    continuous = baselines.analytic_gaussian_sigma(
        epsilon, delta, shift * (math.sqrt(2) if pair else 1)
    )
    if sigma > 50:  # the lattice is fine: the discrete curve is the continuous one
        assert sigma == pytest.approx(continuous, rel=2e-3)


def test_analytic_gaussian_sigma_solves_the_balle_wang_curve() -> None:
    for epsilon, delta in ((0.1, 1e-5), (1.0, 1e-6), (8.0, 1e-12)):
        sigma = baselines.analytic_gaussian_sigma(epsilon, delta, 3.0)
        assert baselines.analytic_gaussian_delta(sigma, 3.0, epsilon) == pytest.approx(
            delta, rel=1e-6
        )


@pytest.mark.parametrize(
    "params",
    [
        SCALARS[0],
        {"statistic": "histogram", "column": "race"},
        {"statistic": "sum", "column": "age"},
        {"statistic": "mean", "column": "wage"},
    ],
    ids=["count", "histogram", "int-sum", "mean"],
)
def test_gaussian_release_meets_its_delta(params: dict[str, Any]) -> None:
    """The σ actually used, in lattice units, against the brute-force curve."""
    mech = registry.get("gaussian")
    loaded = mech.load_params(params)
    acc = mech.accuracy(loaded, EPS_DELTA, META)
    sigma = acc["scale"] / acc["grid"]
    shift = acc["grid_sensitivity"]
    pair = params["statistic"] == "histogram"
    assert shift * acc["grid"] >= acc["sensitivity"] / (math.sqrt(2) if pair else 1) - 1e-12
    assert _brute_delta(sigma, 1.0, shift, pair) <= 1e-6


@pytest.mark.parametrize("name", ["laplace", "geometric"])
@pytest.mark.parametrize(
    "params",
    [
        *SCALARS,
        {"statistic": "histogram", "column": "race"},
        {"statistic": "histogram", "column": "age", "bins": 7},
    ],
    ids=["count", "sum", "mean", "histogram", "binned"],
)
def test_laplace_noise_is_calibrated_to_the_budget(name: str, params: dict[str, Any]) -> None:
    """Scale = lattice sensitivity / ε, and the lattice sensitivity covers Δ."""
    mech = registry.get(name)
    acc = mech.accuracy(mech.load_params(params), EPS, META)
    assert acc["grid_sensitivity"] * acc["grid"] >= acc["sensitivity"] * (1 - 1e-12)
    assert acc["scale"] >= acc["grid_sensitivity"] * acc["grid"] / EPS["epsilon"] * (1 - 1e-12)


neighbour_values = st.floats(min_value=-1e3, max_value=3e5) | st.just(math.nan)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(neighbour_values, min_size=1, max_size=30),
    st.data(),
    st.sampled_from(["laplace", "gaussian"]),
    st.sampled_from(["sum", "mean"]),
    st.integers(min_value=1, max_value=10_000).map(lambda k: Fraction(k, 100)),
)
def test_neighbours_move_the_lattice_value_by_at_most_its_sensitivity(
    wages: list[float], draw: st.DataObject, name: str, statistic: str, epsilon: Fraction
) -> None:
    """Replace-one neighbours, computed in floating point, stay within the lattice sensitivity."""
    i = draw.draw(st.integers(min_value=0, max_value=len(wages) - 1))
    other = list(wages)
    other[i] = draw.draw(neighbour_values)
    meta = DatasetMeta(n_rows=len(wages), columns={"wage": META.columns["wage"]})
    mech = registry.get(name)
    budget = (
        {"epsilon": epsilon, "delta": Fraction(1, 10**6)}
        if name == "gaussian"
        else {"epsilon": epsilon}
    )
    plan = mech._plan({"statistic": statistic, "column": "wage"}, budget, meta)  # type: ignore[attr-defined]
    a = baselines.lattice_values(plan, {"wage": np.array(wages)})
    b = baselines.lattice_values(plan, {"wage": np.array(other)})
    assert abs(int(a[0]) - int(b[0])) <= plan.lattice_sensitivity
