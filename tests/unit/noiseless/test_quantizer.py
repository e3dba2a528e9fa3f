"""Quantizers: half-open bins with the last closed, exact scalar indexing, float edges."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import noiseless as nl

F = Fraction
TINY = 5e-324
HUGE = 1.7976931348623157e308


def test_uniform_bins_half_open_last_closed() -> None:
    qz = nl.UniformQuantizer(F(-3), F(5), 4)  # width 2: [-3,-1) [-1,1) [1,3) [3,5]
    assert qz.width == 2
    assert qz.index(-3) == 0
    assert qz.index(5) == 3  # upper end: closed last bin
    assert [qz.index(e) for e in (-1, 1, 3)] == [1, 2, 3]  # on an edge: the upper bin
    assert [qz.index(F(e) - F(1, 10**30)) for e in (-1, 1, 3)] == [0, 1, 2]
    assert qz.index(-100) == 0 and qz.index(100) == 3  # clipped
    assert qz.bin(2) == (F(1), F(3))
    assert qz.representative(3) == 4
    with pytest.raises(IndexError):
        qz.bin(4)
    with pytest.raises(ValueError):
        nl.UniformQuantizer(F(1), F(1), 3)
    with pytest.raises(ValueError):
        qz.index(math.nan)


def test_exact_index_matches_float_formula_away_from_edges() -> None:
    rng = np.random.default_rng(3)
    lo, hi, q = -3.7, 12.1, 97
    qz = nl.UniformQuantizer(F(lo), F(hi), q)
    for y in rng.uniform(lo, hi, 2000):
        t = (y - lo) / (hi - lo) * q
        if abs(t - round(t)) > 1e-6:
            assert qz.index(float(y)) == min(q - 1, math.floor(t))


def test_exact_index_where_the_float_formula_is_wrong() -> None:
    """floor((y − lo)/(hi − lo)·q) in doubles misplaces values next to edges; exact never does."""
    disagreements = 0
    for q in range(2, 60):
        qz = nl.UniformQuantizer(F(0), F(1), q)
        for k in range(1, q):
            y = k / q  # the double nearest the edge k/q: just below, on, or just above it
            exact = qz.index(y)
            assert exact == (k if F(y) >= F(k, q) else k - 1)
            disagreements += exact != min(q - 1, math.floor(y * q))
    assert disagreements > 0


def test_edge_quantizer_matches_digitize_semantics() -> None:
    rng = np.random.default_rng(4)
    edges = np.sort(rng.uniform(-10, 10, 9))
    qz = nl.EdgeQuantizer(edges)
    x = np.concatenate([rng.uniform(-12, 12, 5000), edges, np.nextafter(edges, -np.inf)])
    expected = np.clip(np.digitize(np.clip(x, edges[0], edges[-1]), edges) - 1, 0, 7)
    assert qz.levels == 8
    assert np.array_equal(qz.index(x), expected)
    assert qz.index([edges[-1]])[0] == 7  # closed last bin
    assert qz.index([edges[3]])[0] == 3  # an edge opens its bin
    assert qz.index([math.nan])[0] == 0  # missing: the lower end
    reps = qz.quantize(x)
    assert set(np.unique(reps)) <= set(qz.outputs)


def test_edge_quantizer_validation() -> None:
    with pytest.raises(ValueError):
        nl.EdgeQuantizer([1.0])
    with pytest.raises(ValueError):
        nl.EdgeQuantizer([0.0, math.inf])
    with pytest.raises(ValueError):
        nl.EdgeQuantizer([1.0, 0.0])
    with pytest.raises(ValueError):
        nl.EdgeQuantizer([0.0, 1.0], representatives=[2.0])


@pytest.mark.parametrize(
    ("lo", "hi", "q"),
    [
        (-HUGE, HUGE, 1000),
        (0.0, HUGE, 7),
        (TINY, 100 * TINY, 64),
        (-TINY, TINY, 2),
        (1e15, 1e15 + 8, 1024),  # spacing 2^-7 below the doubles' spacing 0.125 at 1e15
        (-1e-300, 1e300, 3),
    ],
)
def test_float_edges_extreme_magnitudes(lo: float, hi: float, q: int) -> None:
    qz = nl.UniformQuantizer(F(lo), F(hi), q)
    edges = qz.float_edges()
    assert edges.shape == (q + 1,)
    assert np.all(np.isfinite(edges))
    assert edges[0] == lo and edges[-1] == hi
    assert np.all(np.diff(edges) >= 0)
    eq = nl.EdgeQuantizer(edges)
    assert np.all(np.isfinite(eq.outputs))
    assert np.all((eq.outputs >= edges[:-1]) & (eq.outputs <= edges[1:]))
    # each float edge is within one rounding of the exact edge
    for k in (0, q // 3, q):
        exact = qz.lower + (qz.upper - qz.lower) * k / q
        assert abs(F(float(edges[k])) - exact) <= abs(exact) * F(2, 2**52) + F(2 * TINY)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-1e300, 1e300),
    st.floats(1e-300, 1e300),
    st.integers(1, 5000),
    st.floats(-1e300, 1e300),
)
def test_uniform_index_property(lo: float, width: float, q: int, y: float) -> None:
    hi = lo + width
    if not lo < hi:
        return
    qz = nl.UniformQuantizer(F(lo), F(hi), q)
    k = qz.index(y)
    left, right = qz.bin(k)
    v = min(max(F(y), qz.lower), qz.upper)
    assert left <= v and (v < right or (k == q - 1 and v == right))
