"""Lookups: ``Locator`` is the clipped ``np.searchsorted``; ``Bins`` groups values into cells."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.dip.search import Bins, Locator


def _segments(a: np.ndarray, x: np.ndarray, side: str) -> np.ndarray:
    return np.clip(np.searchsorted(a, x, side=side) - 1, 0, a.size - 2)  # type: ignore[call-overload]

finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(
    array=st.lists(finite, min_size=2, max_size=300),
    keys=st.lists(finite, min_size=0, max_size=300),
    ties=st.integers(0, 5),
    side=st.sampled_from(["left", "right"]),
)
def test_locator_is_clipped_searchsorted(array: list[float], keys: list[float], ties: int,
                                 side: str) -> None:
    a = np.sort(np.concatenate([array, np.repeat(array[:1], ties)]))
    # keys: random ones, every array value (exact hits), and enough of them for the table path
    x = np.concatenate([keys, a, np.linspace(a[0] - 1, a[-1] + 1, 200)])
    assert np.array_equal(Locator(a, side)(x), _segments(a, x, side))


def test_locator_on_clustered_arrays_falls_back_correctly() -> None:
    rng = np.random.default_rng(0)
    a = np.sort(np.concatenate([rng.lognormal(0, 4, 5000), np.zeros(300)]))
    x = np.concatenate([rng.lognormal(0, 4, 100_000), a])
    for side in ("left", "right"):
        assert np.array_equal(Locator(a, side)(x), _segments(a, x, side))


@settings(max_examples=100, deadline=None)
@given(
    lo=st.floats(-100, 100), width=st.floats(0.1, 1e3), size=st.integers(1, 500),
    values=st.lists(finite, min_size=1, max_size=200),
)
def test_even_bins_group_values_up_to_edge_rounding(lo: float, width: float, size: int,
                                                    values: list[float]) -> None:
    edges = np.linspace(lo, lo + width, size + 1)
    bins = Bins(edges)
    assert bins.even
    v = np.array(values)
    j = bins(v)
    assert np.all((j >= 0) & (j < size))
    # away from the edges (by a few ulps of the range) the cell is the one holding the value
    slack = 8 * np.spacing(abs(lo) + width)
    inner = (v > edges[0]) & (v < edges[-1])
    left, right = edges[j], edges[j + 1]
    assert np.all(~inner | ((v >= left - slack) & (v <= right + slack)))
    assert np.all(j[v <= edges[0]] == 0) and np.all(j[v >= edges[-1]] == size - 1)


def test_uneven_bins_are_right_closed_cells() -> None:
    edges = np.array([-1.0, 0.0, 0.5, 3.0, 10.0])
    bins = Bins(edges)
    assert not bins.even
    v = np.array([-5.0, -1.0, -0.5, 0.0, 0.1, 0.5, 2.0, 3.0, 9.0, 10.0, 11.0])
    assert bins(v).tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
