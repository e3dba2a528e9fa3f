"""The DP baselines, cross-tabs, quantiles and moments as streaming statistics (issue #30).

For each release family: (a) the partial of random batches, updated in any order and merged
in any tree shape, equals the whole columns' partial bit for bit (every pass); (b) the
release from it equals ``run`` on the whole columns with the same seeded generator,
output for output; (c) missing values and values outside the declared bounds are read
as the whole-column formulas before the port read them (recomputed here with numpy and
``math.fsum``); (d) an update allocates O(batch), not O(rows); errors do not depend on
where the batches end.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, StreamingMechanism
from mechanisms.columns import clean
from mechanisms.dp import baselines, moments, quantiles, tables
from mechanisms.statistics import Partial, compute, whole
from tests.unit.streams import batches, streamed

COLUMNS = {
    "age": ColumnMeta("age", "integer", (17, 90)),
    "wage": ColumnMeta("wage", "continuous", (-1000.0, 200_000.0)),
    "tiny": ColumnMeta("tiny", "continuous", (-1e-5, 3e-5)),
    "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
    "sex": ColumnMeta("sex", "categorical", categories=("F", "M")),
    #: 40 categories: tables beyond the dense per-chunk layout of the exact sums
    "zone": ColumnMeta("zone", "categorical", categories=tuple(f"z{i}" for i in range(40))),
}
BUDGETS = {"laplace": {"epsilon": Fraction(1, 2)}, "geometric": {"epsilon": Fraction(1, 2)},
           "gaussian": {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}}

#: (mechanism, params): every statistic family and column kind the port covers
CASES: list[tuple[str, dict[str, Any]]] = [
    ("laplace", {"statistic": "count", "condition": {"column": "wage", "op": "le", "value": 5e4}}),
    ("geometric", {"statistic": "count",
                   "condition": {"column": "race", "op": "in", "value": ["A", "C"]}}),
    ("geometric", {"statistic": "sum", "column": "age"}),
    ("geometric", {"statistic": "mean", "column": "age"}),
    ("laplace", {"statistic": "mean", "column": "age"}),
    ("laplace", {"statistic": "sum", "column": "wage"}),
    ("gaussian", {"statistic": "mean", "column": "wage"}),
    ("laplace", {"statistic": "sum", "column": "tiny"}),
    ("gaussian", {"statistic": "histogram", "column": "race"}),
    ("laplace", {"statistic": "histogram", "column": "wage", "bins": 9}),
    ("geometric", {"statistic": "histogram", "column": "age", "edges": [17, 30, 45.5, 90]}),
    ("laplace", {"statistic": "count", "group_by": ["race", "sex"], "consistency": True}),
    ("gaussian", {"statistic": "count", "group_by": ["sex"],
                  "condition": {"column": "age", "op": "gt", "value": 40}}),
    ("laplace", {"statistic": "sum", "column": "wage", "group_by": ["race", "sex"]}),
    ("geometric", {"statistic": "sum", "column": "age", "group_by": ["race"]}),
    ("gaussian", {"statistic": "mean", "column": "tiny", "group_by": ["race", "sex"]}),
    ("laplace", {"statistic": "mean", "column": "age", "group_by": ["sex"]}),
    ("laplace", {"statistic": "sum", "column": "tiny", "group_by": ["zone", "sex"]}),
    ("laplace", {"statistic": "quantile", "column": "wage", "quantiles": [0.1, 0.5, 0.9],
                 "grid_size": 50}),
    ("laplace", {"statistic": "quantile", "column": "age", "quantiles": [0.5]}),
    ("laplace", {"statistic": "variance", "column": "wage"}),
    ("gaussian", {"statistic": "std", "column": "tiny"}),
    ("laplace", {"statistic": "covariance", "columns": ["wage", "age"], "psd": True}),
]
IDS = [f"{name}-{p['statistic']}-{p.get('column', '')}{'-table' if 'group_by' in p else ''}"
       for name, p in CASES]


def _meta(n: int) -> DatasetMeta:
    return DatasetMeta(n, COLUMNS)


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Rows with what the readers must handle: NaN, values beyond the bounds, undeclared
    codes, exact bounds, subnormals and ±0 next to large values."""
    rng = np.random.default_rng(seed)
    wage = rng.uniform(-5000.0, 260_000.0, n)
    wage[rng.random(n) < 0.1] = np.nan
    wage[rng.random(n) < 0.05] = 200_000.0
    tiny = rng.normal(0.0, 2e-5, n)
    special = rng.random(n) < 0.2
    tiny[special] = rng.choice([5e-324, -0.0, 1e-300, -1e-5, 3e-5, 1.0, np.nan], special.sum())
    return {"age": rng.integers(0, 120, n), "wage": wage, "tiny": tiny,
            "race": rng.integers(-1, 4, n), "sex": rng.integers(0, 3, n),
            "zone": rng.integers(0, 41, n)}


def _setup(case: tuple[str, dict[str, Any]], n: int
           ) -> tuple[StreamingMechanism, dict[str, Any], dict[str, Fraction], DatasetMeta]:
    name, raw = case
    mech = registry.get(name)
    assert isinstance(mech, StreamingMechanism)
    meta = _meta(n)
    params = mech.load_params(raw)
    return mech, params, mech.cost(params, BUDGETS[name], meta), meta


@pytest.mark.parametrize("case", CASES, ids=IDS)
@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 150), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_streamed_partials_and_releases_equal_the_whole_columns(
        case: tuple[str, dict[str, Any]], n: int, seed: int, data: st.DataObject) -> None:
    mech, params, cost, meta = _setup(case, n)
    columns = _data(n, seed)
    cuts = data.draw(st.lists(st.integers(0, n), max_size=8), label="cuts")
    pieces = batches(columns, cuts)
    order = data.draw(st.permutations(range(len(pieces))), label="order")
    picks = data.draw(st.lists(st.integers(0, 10**6), max_size=12), label="picks")
    statistic = mech.statistic(params, cost, meta)
    _, partial = streamed(statistic, pieces, order, picks)
    assert partial == whole(statistic, columns)  # (a): bit for bit, every pass
    released = mech.release(params, partial, cost, meta, np.random.default_rng(seed))
    ran = mech.run(columns, params, cost, meta, np.random.default_rng(seed))
    assert repr(released) == repr(ran)  # (b): output for output (NaN-safe, exact floats)
    restored = Partial.from_json(partial.to_json())
    again = mech.release(params, restored, cost, meta, np.random.default_rng(seed))
    assert repr(again) == repr(ran)
    assert repr(mech.stream(pieces, params, cost, meta, np.random.default_rng(seed))) \
        == repr(ran)


# --------------------------------------------------------------------------- (c) as before


def _lattice(name: str, raw: dict[str, Any], columns: Mapping[str, np.ndarray]) -> Any:
    mech, params, cost, meta = _setup((name, raw), len(columns["age"]))
    statistic = mech.statistic(params, cost, meta)
    partial = whole(statistic, columns)
    amounts = mech._amounts(cost, meta)  # type: ignore[attr-defined]
    if baselines.extended(params):
        return baselines.extended_plan(name, params, amounts, meta), partial
    plan = mech._plan(params, amounts, meta)  # type: ignore[attr-defined]
    return plan, baselines.lattice_from(plan, partial)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 200), seed=st.integers(0, 2**32 - 1))
def test_missing_and_out_of_bounds_values_are_read_as_the_whole_column_formulas_read_them(
        n: int, seed: int) -> None:
    columns = _data(n, seed)
    for column in ("wage", "tiny"):
        lo, hi = COLUMNS[column].bounds  # type: ignore[misc]
        x = np.where(np.isnan(columns[column]), lo, np.clip(columns[column], lo, hi))
        for statistic in ("sum", "mean"):
            plan, value = _lattice("laplace", {"statistic": statistic, "column": column},
                                   columns)
            total = math.fsum(x - plan.center)
            expected = total if statistic == "sum" else total / n
            assert value.tolist() == [round(expected / plan.grid)]
        plan, partial = _lattice("laplace", {"statistic": "quantile", "column": column,
                                             "quantiles": [0.5], "grid_size": 40}, columns)
        ranks = np.searchsorted(np.sort(x), np.asarray(plan.grid), side="right")
        assert plan.ranks_from(partial).tolist() == ranks.tolist()
        plan, partial = _lattice("laplace", {"statistic": "variance", "column": column},
                                 columns)
        z = x - lo
        z -= math.fsum(z) / n
        assert plan.exact_from(partial).tolist() == [
            round(math.fsum(z * z) / (n - 1) / plan.grid)]
    age = np.clip(columns["age"], 17, 90)
    plan, value = _lattice("geometric", {"statistic": "sum", "column": "age"}, columns)
    assert value.tolist() == [int((age - 17).sum())]
    lo, hi = COLUMNS["wage"].bounds  # type: ignore[misc]
    wage = np.where(np.isnan(columns["wage"]), lo, np.clip(columns["wage"], lo, hi))
    plan, partial = _lattice("laplace", {"statistic": "sum", "column": "wage",
                                         "group_by": ["race", "sex"]}, columns)
    race, sex = columns["race"], columns["sex"]
    cells = [round(math.fsum(wage[(race == r) & (sex == s)]) / plan.sum.grid)
             for r in range(3) for s in range(2)]
    assert plan.exact_from(partial)["sum"].tolist() == cells
    plan, partial = _lattice("laplace", {"statistic": "histogram", "column": "race"}, columns)
    assert partial.tolist() == [int(np.sum(race == r)) for r in range(3)]


def test_clean_is_what_the_readers_apply() -> None:
    """The readers share ``columns.clean``: NaN is lo, the rest clipped (a guard on (c))."""
    x = np.array([np.nan, -1e9, 0.5, 1e9])
    assert clean(x, 0.0, 1.0).tolist() == [0.0, 0.0, 0.5, 1.0]


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("cut", [0, 1, 5, 9])
def test_a_short_column_is_refused_wherever_the_batches_end(cut: int) -> None:
    mech, params, cost, meta = _setup(("laplace", {"statistic": "sum", "column": "wage"}), 11)
    columns = {"wage": np.linspace(0.0, 987654.125, 10)}
    with pytest.raises(ValueError, match="n_rows") as refused:
        mech.stream(batches(columns, [cut]), params, cost, meta, np.random.default_rng(0))
    assert "987654" not in str(refused.value)
    with pytest.raises(ValueError, match="n_rows"):
        mech.run(columns, params, cost, meta, np.random.default_rng(0))


@pytest.mark.parametrize("cut", [0, 4, 10])
def test_an_integer_column_of_floats_is_refused_wherever_the_batches_end(cut: int) -> None:
    for raw in ({"statistic": "sum", "column": "age"},
                {"statistic": "sum", "column": "age", "group_by": ["sex"]}):
        mech, params, cost, meta = _setup(("geometric", raw), 10)
        columns = {"age": np.full(10, 31337.5), "sex": np.zeros(10, dtype=np.int64)}
        with pytest.raises(TypeError, match="integers") as refused:
            mech.stream(batches(columns, [cut]), params, cost, meta, np.random.default_rng(0))
        assert "31337" not in str(refused.value)


# --------------------------------------------------------------------------- (d) memory

ROWS, BATCH = 10**6, 10**4


@pytest.mark.parametrize("case", [
    ("laplace", {"statistic": "mean", "column": "wage"}),
    ("laplace", {"statistic": "histogram", "column": "wage", "bins": 100}),
    ("laplace", {"statistic": "sum", "column": "wage", "group_by": ["race", "sex"]}),
    ("laplace", {"statistic": "quantile", "column": "wage", "quantiles": [0.5]}),
    ("laplace", {"statistic": "variance", "column": "wage"}),
], ids=["mean", "histogram", "table", "quantile", "variance"])
def test_an_update_allocates_in_proportion_to_its_batch_not_to_the_rows(
        case: tuple[str, dict[str, Any]]) -> None:
    """10^6 rows in batches of 10^4: the peak of all the updates (every pass) stays far
    below one whole float column (8 MB): O(batch) scratch, partials of public size."""
    mech, params, cost, meta = _setup(case, ROWS)
    columns = _data(ROWS, 7)
    pieces = batches(columns, range(BATCH, ROWS, BATCH))
    statistic = mech.statistic(params, cost, meta)
    tracemalloc.start()
    try:
        _, partial = compute(statistic, pieces)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    whole_column = ROWS * 8
    assert peak < whole_column / 8, peak  # 1 MB: ~12 batch-sized float arrays at most
    assert partial.rows == ROWS


def test_the_ported_plans_say_which_statistic_they_read() -> None:
    """Each family's plan hands out its first pass; the moments have a second."""
    meta = _meta(50)
    amounts = {"epsilon": Fraction(1)}
    table = tables.plan("laplace", {"statistic": "count", "group_by": ["race"]}, amounts, meta)
    assert isinstance(table.first_pass(), tables.CellStatistic)
    quantile = quantiles.plan("laplace", {"statistic": "quantile", "column": "wage",
                                          "quantiles": [0.5]}, amounts, meta)
    assert isinstance(quantile.first_pass(), quantiles.RankStatistic)
    moment = moments.plan("laplace", {"statistic": "variance", "column": "wage"}, amounts, meta)
    first = moment.first_pass()
    second = first.then(first.update(first.empty(), _data(50, 0)))
    assert isinstance(second, moments.ScatterStatistic)
    assert second.then(second.empty()) is None
