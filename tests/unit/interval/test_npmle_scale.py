"""The NPMLE's O(n) set-up at scale (issue #17 item 5): the sort-once reduction to
Turnbull cells and the loop-free stabbing agree with their brute-force definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import interval
from mechanisms.interval.npmle import IntervalData, _stab_general, _stab_single
from mechanisms.interval.ranges import Pieces

from .conftest import rng


def _brute(left: np.ndarray, right: np.ndarray) -> tuple[list[tuple[float, float]],
                                                         list[list[int]]]:
    """Innermost intervals (l, r]: l a left end, r a right end, no end strictly between;
    and per range the candidate cells inside it."""
    ends = np.union1d(left, right)
    cells = [(lo, hi) for lo, hi in itertools.pairwise(ends)
             if lo in set(left) and hi in set(right)]
    inside = [[k for k, (lo, hi) in enumerate(cells) if lo >= a and hi <= b]
              for a, b in zip(left, right, strict=True)]
    return cells, inside


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-6, 6), st.integers(1, 5)), min_size=1, max_size=25))
def test_cells_match_the_brute_force(spans: list[tuple[int, int]]) -> None:
    """Catches an off-by-one in the gathers that replaced searchsorted/isin: candidate
    cells and each range's block of them equal Turnbull's definition, ties included."""
    left = np.array([a for a, _ in spans], float)
    right = np.array([a + w for a, w in spans], float)
    data = IntervalData.from_pieces(Pieces.single(left, right))
    cells, inside = _brute(left, right)
    assert list(zip(data.cell_left, data.cell_right, strict=True)) == cells
    for j in range(len(spans)):
        assert list(range(data.start[j], data.stop[j])) == inside[j]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-6, 6), st.integers(1, 5)), min_size=1, max_size=25))
def test_loop_free_stabbing_equals_the_greedy(spans: list[tuple[int, int]]) -> None:
    """The suffix-minimum stabbing picks exactly the greedy's cells (and hits every
    range), so CNM starts where it did before."""
    left = np.array([a for a, _ in spans], float)
    right = np.array([a + w for a, w in spans], float)
    data = IntervalData.from_pieces(Pieces.single(left, right))
    fast = _stab_single(data)
    np.testing.assert_array_equal(fast, _stab_general(data))
    p = np.zeros(data.k)
    p[fast] = 1.0
    assert np.all(data.mass(p) > 0)


def test_case2_at_scale_is_certified() -> None:
    """n = 10^5 Case-II (a tenth of the bench): KKT certificate <= 1e-6, masses on the
    simplex (the bench times n = 10^6)."""
    g = rng(8)
    mech = interval.IntervalMechanism(
        interval.Canonical(interval.AnchorDist("logistic", 0.0, 1.0), 3))
    fit = interval.npmle(mech.release(g.normal(size=100_000), g).pieces)
    assert fit.method == "cnm" and fit.converged and fit.kkt_gap <= 1e-6
    assert fit.mass.sum() == pytest.approx(1.0) and np.all(fit.mass >= 0)
