"""``noiseless.aggregate`` as streaming statistics, and exact order statistics by selection.

Oracles: ``central.evaluate`` (the whole-column evaluation, still the notebook entry
point) for every statistic, ``sorted`` for the selected ranks; the partials of random
batches merged in any tree shape must equal the whole columns' bit for bit, and the
release from them ``run``'s, output for output.
"""

from __future__ import annotations

import math
import tracemalloc
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, StreamingMechanism
from mechanisms.dp.baselines import resolve_condition
from mechanisms.noiseless import central, passes
from mechanisms.selection import PASSES, Selection, Source, keys, value_of
from mechanisms.statistics import Batch, compute, whole
from tests.unit.streams import batches, streamed

COLUMNS = {
    "age": ColumnMeta("age", "integer", (17, 90)),
    "big": ColumnMeta("big", "integer", (-2**40, 2**40)),
    "wage": ColumnMeta("wage", "continuous", (-1000.0, 200_000.0)),
    "tiny": ColumnMeta("tiny", "continuous", (-1e-5, 3e-5)),
    "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
}
QUERIES: list[dict[str, Any]] = [
    {"statistic": s, "column": c} for s in ("mean", "sum", "median", "min", "max")
    for c in ("age", "big", "wage", "tiny")
] + [{"statistic": "count", "condition": {"column": "race", "op": "in", "value": ["A", "C"]}},
     {"statistic": "count", "condition": {"column": "wage", "op": "ge", "value": 1e5}}]


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    """NaN, floats in an integer column, uint64, subnormals, ±0 and values past the bounds."""
    rng = np.random.default_rng(seed)
    wage = rng.uniform(-5000.0, 260_000.0, n)
    wage[rng.random(n) < 0.1] = np.nan
    tiny = rng.normal(0.0, 2e-5, n)
    tiny[::3] = rng.choice([5e-324, -0.0, 0.0, -5e-324, 1e-300], tiny[::3].size)
    age: np.ndarray = rng.integers(0, 120, n)
    if seed % 3 == 0:
        age = rng.uniform(0.0, 120.0, n)
        age[::4] = np.nan
    big = rng.integers(-2**45, 2**45, n) if seed % 2 else \
        rng.integers(0, 2**50, n).astype(np.uint64)
    return {"age": age, "big": big, "wage": wage, "tiny": tiny, "race": rng.integers(-1, 4, n)}


def _records(raw: dict[str, Any], n: int) -> passes.Records:
    mech = registry.get("noiseless.aggregate")
    params = mech.load_params(raw)
    meta = DatasetMeta(n, COLUMNS)
    plan = mech._plan(params, Fraction(40), meta)  # type: ignore[attr-defined]
    if "condition" in params:
        spec = params["condition"]
        return passes.Records(plan.query, spec["column"],
                              resolve_condition(spec, COLUMNS[spec["column"]]))
    return passes.Records(plan.query, params["column"])


@pytest.mark.parametrize("raw", QUERIES, ids=[
    f"{q['statistic']}-{q.get('column', q.get('condition', {}).get('column'))}"
    for q in QUERIES])
@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 120), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_streamed_values_and_releases_equal_the_whole_column_evaluation(
        raw: dict[str, Any], n: int, seed: int, data: st.DataObject) -> None:
    columns = _data(n, seed)
    records = _records(raw, n)
    pieces = batches(columns, data.draw(st.lists(st.integers(0, n), max_size=6)))
    order = data.draw(st.permutations(range(len(pieces))))
    picks = data.draw(st.lists(st.integers(0, 10**6), max_size=10))
    statistic = passes.statistic(records)
    _, partial = streamed(statistic, pieces, order, picks)
    assert partial == whole(statistic, columns)
    x = columns[records.column]
    reading = records.condition.mask(x) if records.condition is not None else x
    assert passes.value(records, partial) == central.evaluate(records.query, reading)
    mech = registry.get("noiseless.aggregate")
    assert isinstance(mech, StreamingMechanism)
    meta = DatasetMeta(n, COLUMNS)
    params = mech.load_params(raw)
    cost = mech.cost(params, {"noiseless_bits": Fraction(7)}, meta)
    assert repr(mech.release(params, partial, cost, meta, np.random.default_rng(0))) == \
        repr(mech.run(columns, params, cost, meta, np.random.default_rng(0)))


# --------------------------------------------------------------------------- selection


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=40))
def test_float_keys_keep_the_order_and_invert(values: list[float]) -> None:
    k = keys(np.array(values, dtype=np.float64))
    assert [value_of(int(v), False) for v in k] == [v + 0.0 for v in values]
    order = np.argsort(k, kind="stable")
    assert [values[i] for i in order] == sorted(values)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=40))
def test_integer_keys_keep_the_order_and_invert(values: list[int]) -> None:
    k = keys(np.array(values, dtype=np.int64))
    assert [value_of(int(v), True) for v in k] == values
    assert sorted(values) == [values[i] for i in np.argsort(k, kind="stable")]


class _Column(Source):
    def __init__(self, integer: bool) -> None:
        self._integer = integer

    @property
    def integer(self) -> bool:
        return self._integer

    @property
    def columns(self) -> tuple[str, ...]:
        return ("x",)

    def values(self, chunk: Batch) -> Any:
        return np.asarray(chunk["x"])


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1,
                          max_size=50),
                 st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=50)),
       st.data())
def test_selection_picks_the_ranked_values_from_any_batches(
        values: list[Any], data: st.DataObject) -> None:
    integer = isinstance(values[0], int)
    x = np.array(values, dtype=np.int64 if integer else np.float64)
    ranks = tuple(data.draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=3)))
    selection = Selection(_Column(integer), ranks, len(values))
    pieces = batches({"x": x}, data.draw(st.lists(st.integers(0, len(values)), max_size=5)))
    last, partial = streamed(selection, pieces, data.draw(st.permutations(range(len(pieces)))),
                             data.draw(st.lists(st.integers(0, 10**6), max_size=8)))
    assert isinstance(last, Selection) and last.level == PASSES - 1
    assert selection.finish(partial) == [sorted(v + 0 for v in values)[r] for r in ranks]


def test_a_short_column_is_refused_by_the_selection_without_its_values() -> None:
    mech = registry.get("noiseless.aggregate")
    meta = DatasetMeta(11, COLUMNS)
    params = mech.load_params({"statistic": "median", "column": "wage"})
    cost = mech.cost(params, {"noiseless_bits": Fraction(7)}, meta)
    with pytest.raises(ValueError, match="n_rows") as refused:
        mech.run({"wage": np.full(10, 98765.4321)}, params, cost, meta,
                 np.random.default_rng(0))
    assert "98765" not in str(refused.value)


def test_a_median_of_a_million_rows_allocates_in_proportion_to_its_batch() -> None:
    """Six passes over 10^6 rows in batches of 10^4: the peak stays far below one whole
    float column (8 MB), and the value is the whole column's median."""
    rows, batch = 10**6, 10**4
    records = _records({"statistic": "median", "column": "wage"}, rows)
    columns = {"wage": np.random.default_rng(5).uniform(-5000.0, 260_000.0, rows)}
    pieces = batches(columns, range(batch, rows, batch))
    statistic = passes.statistic(records)
    tracemalloc.start()
    try:
        _, partial = compute(statistic, pieces)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < rows * 8 / 8, peak
    clipped = np.clip(columns["wage"], -1000.0, 200_000.0)
    middle = np.sort(clipped)[rows // 2 - 1: rows // 2 + 1]
    assert passes.value(records, partial) == (Fraction(middle[0]) + Fraction(middle[1])) / 2
    assert math.isfinite(float(middle[0]))
