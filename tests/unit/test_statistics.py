"""The streaming contract's pieces: exact float sums, partials, passes (``mechanisms.statistics``).

Exact checks only: ``float_sums`` rounded once must equal ``math.fsum`` bit for bit (on
adversarial doubles: subnormals, huge and tiny mixed, ties), and its integers must add
over any split of the values.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mechanisms.statistics import (
    CHUNK,
    SCALE,
    Batch,
    Partial,
    Statistic,
    column_sums,
    compute,
    float_sums,
    product_sums,
    to_float,
    whole,
)

#: doubles that make summation hard: any finite double, subnormals, powers of two and ties
HARD = (st.floats(allow_nan=False, allow_infinity=False)
        | st.sampled_from([5e-324, -5e-324, 2.0**-1022, 1.0, -1.0, 2.0**-53, 3 * 2.0**-54,
                           2.0**53, 1e308, -1e308, 0.0, -0.0])
        | st.integers(-2**53, 2**53).flatmap(
            lambda m: st.integers(-1126, 960).map(lambda e: math.ldexp(float(m), e))))


def _fsum(values: Sequence[float]) -> float | None:
    try:
        return math.fsum(values)
    except OverflowError:  # an intermediate beyond the doubles: no reference to compare to
        return None


@settings(max_examples=400, deadline=None)
@given(st.lists(HARD, max_size=60))
def test_an_exact_sum_rounded_once_is_fsum(values: list[float]) -> None:
    reference = _fsum(values)
    assume(reference is not None and math.isfinite(reference))
    assert to_float(float_sums(np.array(values, dtype=np.float64))[0]) == reference


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5).flatmap(lambda k: st.lists(st.lists(HARD, min_size=k, max_size=k),
                                                    max_size=40).map(lambda r: (k, r))))
def test_column_sums_are_each_column_s_exact_sum(
        shape_rows: tuple[int, list[list[float]]]) -> None:
    width, rows = shape_rows
    values = np.array(rows, dtype=np.float64).reshape(len(rows), width)
    assert column_sums(values) == [float_sums(np.ascontiguousarray(values[:, k]))[0]
                                   for k in range(width)]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4).flatmap(lambda k: st.lists(
    st.tuples(st.lists(HARD, min_size=k, max_size=k), st.floats(0.0, 1.0)), max_size=30)))
def test_column_sums_of_scaled_rows_are_those_of_the_products(
        rows: list[tuple[list[float], float]]) -> None:
    """A factor per row (clipped curves): each product rounded as numpy rounds it."""
    width = len(rows[0][0]) if rows else 1
    values = np.array([r for r, _ in rows], dtype=np.float64).reshape(len(rows), width)
    scale = np.array([f for _, f in rows], dtype=np.float64)
    assert column_sums(values, scale) == column_sums(values * scale[:, None])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(HARD, HARD, HARD), max_size=30))
def test_product_sums_are_the_column_sums_of_the_products(
        rows: list[tuple[float, float, float]]) -> None:
    """Pairs of two columns' products (a bound from the columns' largest |x|, or their
    own largest when that bound overflows); products beyond the doubles are refused."""
    values = np.array(rows, dtype=np.float64).reshape(len(rows), 3)
    pairs = (np.array([0, 0, 1, 2]), np.array([0, 1, 2, 2]))
    with np.errstate(over="ignore"):
        products = values[:, pairs[0]] * values[:, pairs[1]]
    if not np.isfinite(products).all():
        with pytest.raises(ValueError, match="finite"):
            product_sums(values, values, pairs)
        return
    assert product_sums(values, values, pairs) == column_sums(products)


def test_column_sums_of_many_chunks_and_a_wide_range_are_exact() -> None:
    """Several chunks of rows; columns of every scale (subnormal, near the largest double:
    no extraction there), values far below their column's largest (left to float_sums)."""
    rng = np.random.default_rng(8)
    width = 70
    values = rng.normal(size=(3 * CHUNK // width + 5, width)) * \
        10.0 ** rng.integers(-320, 300, (1, width))
    values[:, :3] = rng.choice([5e-324, 1.0, -2.0**-60], (values.shape[0], 3))
    values[::2, :3] = 1.7e308  # the largest doubles, cancelling: their sums stay finite
    values[1::2, :3] = -1.7e308
    values[:, 3] = rng.normal(size=values.shape[0]) * 1e-310
    values[::5] *= 1e-300
    values[1::9] = 0.0
    values[2, :] = 5e-324
    for k, total in enumerate(column_sums(values)):
        assert Fraction(total, 1 << SCALE) == sum(map(Fraction, values[:, k].tolist()))
        assert to_float(total) == float(Fraction(total, 1 << SCALE))  # what fsum rounds to
        assert to_float(total, 3) == float(Fraction(total, 3 << SCALE))  # rounded once
    with pytest.raises(ValueError, match="finite"):
        column_sums(np.array([[1.0, np.inf]]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(HARD, st.integers(0, 4)), max_size=60), st.data())
def test_grouped_sums_are_per_group_fsums_and_add_over_any_split(
        rows: list[tuple[float, int]], data: st.DataObject) -> None:
    values = np.array([v for v, _ in rows], dtype=np.float64)
    groups = np.array([g for _, g in rows], dtype=np.int64)
    totals = float_sums(values, groups, 5)
    for g in range(5):
        reference = _fsum(values[groups == g].tolist())
        if reference is not None and math.isfinite(reference):
            assert to_float(totals[g]) == reference
    cut = data.draw(st.integers(0, len(rows)))
    left, right = (float_sums(values[s], groups[s], 5) for s in (slice(None, cut),
                                                               slice(cut, None)))
    assert [a + b for a, b in zip(left, right, strict=True)] == totals


def test_the_sparse_grouping_agrees_with_the_dense_one() -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(size=5000) * 10.0 ** rng.integers(-30, 30, 5000)
    groups = rng.integers(0, 1000, 5000)  # 1000 groups: beyond the dense table
    sparse = float_sums(values, groups, 1000)
    for g in (0, 17, 999):
        assert sparse[g] == float_sums(values[groups == g])[0]


def test_non_finite_values_are_refused_without_their_values() -> None:
    with pytest.raises(ValueError, match="finite") as refused:
        float_sums(np.array([1.5, math.nan, 987654.125]))
    assert "987654" not in str(refused.value)


class _Squares(Statistic):
    """A two-pass toy: row count and Σx, then Σ(x − mean)² exactly."""

    def __init__(self, mean: float | None = None) -> None:
        self.mean = mean

    @property
    def columns(self) -> tuple[str, ...]:
        return ("x",)

    def sizes(self) -> Mapping[str, int]:
        return {"sum": 1}

    def reduce(self, chunk: Batch) -> Mapping[str, Sequence[int] | NDArray[np.int64]]:
        x = np.asarray(chunk["x"], dtype=np.float64)
        return {"sum": float_sums(x if self.mean is None else (x - self.mean) ** 2)}

    def then(self, partial: Partial) -> Statistic | None:
        if self.mean is not None:
            return None
        return _Squares(to_float(partial.parts["sum"][0]) / partial.rows)


def test_passes_run_in_order_and_an_iterator_of_batches_is_refused_for_two() -> None:
    x = np.random.default_rng(0).normal(size=1000)
    batches = [{"x": x[:300]}, {"x": x[300:]}]
    last, partial = compute(_Squares(), batches)
    mean = math.fsum(x) / x.size
    assert isinstance(last, _Squares) and last.mean == mean
    assert to_float(partial.parts["sum"][0]) == math.fsum((x - mean) ** 2)
    assert partial == whole(_Squares(), {"x": x})
    with pytest.raises(TypeError, match="read again"):
        compute(_Squares(), iter(batches))


def test_an_update_reads_chunks_and_an_empty_batch_adds_nothing() -> None:
    x = np.random.default_rng(1).normal(size=2 * CHUNK + 5)
    statistic = _Squares()
    assert statistic.update(statistic.empty(), {"x": x[:0]}) == Partial(0, {"sum": (0,)})
    partial = statistic.update(statistic.empty(), {"x": x})
    assert partial.rows == x.size and to_float(partial.parts["sum"][0]) == math.fsum(x)
    with pytest.raises(ValueError, match="1-D"):
        statistic.update(statistic.empty(), {"x": x.reshape(-1, 1)[:4]})
    with pytest.raises(ValueError, match="1-D"):
        statistic.update(statistic.empty(), {"x": np.array(1.0)})


def test_partials_round_trip_through_json_and_pickle_and_refuse_other_shapes() -> None:
    partial = Partial(7, {"fsum": (3 << 1100, -5), "count": (0, 2)})
    assert Partial.from_json(partial.to_json()) == partial
    assert pickle.loads(pickle.dumps(partial)) == partial
    with pytest.raises(ValueError, match="do not merge"):
        partial.merge(Partial(1, {"fsum": (1, 1), "count": (1,)}))
    for text in ('{"rows": 1}', '{"rows": 1, "parts": {"a": [1.5]}}', '[]'):
        with pytest.raises(ValueError, match="not a partial"):
            Partial.from_json(text)
