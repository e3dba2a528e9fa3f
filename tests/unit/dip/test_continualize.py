"""Continualization: each value's cell, the generalized ceiling back, and the supports DIP outputs.

The round trips are exact (deterministic) checks; the support checks run
DIP end to end with an empirical (hold-out style) reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.dip import (
    Continuous,
    Empirical,
    FiniteSupport,
    Lattice,
    Mixed,
    PiecewiseLinear,
    Product,
    privatize,
)

#: w in [0, 1), including values next to 1 where z − w can round onto the cell's end
unit = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@settings(max_examples=80, deadline=None)
@given(lo=st.integers(-10**6, 10**6), width=st.integers(0, 1000), data=st.data())
def test_lattice_round_trip(lo: int, width: int, data: st.DataObject) -> None:
    lattice = Lattice(lo, lo + width)
    z = np.array(data.draw(st.lists(st.integers(lo, lo + width), min_size=1, max_size=8)))
    w = np.array(data.draw(st.lists(unit, min_size=z.size, max_size=z.size)))
    v = lattice.forward(z, w)
    assert np.all((v > z - 1) & (v <= z))  # the cell (z − 1, z]
    assert np.array_equal(lattice.ceiling(v), z)
    assert lattice.ceiling(v).dtype == np.int64


@settings(max_examples=80, deadline=None)
@given(
    support=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=12, unique=True)
    .filter(lambda s: min(np.diff(sorted(s)), default=1.0) > 1e-3),
    data=st.data(),
)
def test_finite_support_round_trip(support: list[float], data: st.DataObject) -> None:
    a = np.sort(np.array(support))
    fs = FiniteSupport(a)
    cells = np.concatenate([[a[0] - 1.0], a])
    k = np.array(data.draw(st.lists(st.integers(0, a.size - 1), min_size=1, max_size=8)))
    w = np.array(data.draw(st.lists(unit, min_size=k.size, max_size=k.size)))
    v = fs.forward(a[k], w)
    assert np.all((v > cells[k]) & (v <= cells[k + 1]))  # the cell (a_{k−1}, a_k], a_0 = a_1 − 1
    assert np.array_equal(fs.ceiling(v), a[k])


@settings(max_examples=80, deadline=None)
@given(
    atoms=st.lists(st.integers(-50, 50), min_size=1, max_size=6, unique=True),
    values=st.lists(st.floats(-60, 60), min_size=1, max_size=8),
    data=st.data(),
)
def test_mixed_round_trip_and_tiling(atoms: list[int], values: list[float],
                                     data: st.DataObject) -> None:
    a = np.sort(np.array(atoms, dtype=float))
    mixed = Mixed(a)
    z = np.concatenate([np.array(values), a])
    w = np.array(data.draw(st.lists(unit, min_size=z.size, max_size=z.size)))
    v = mixed.forward(z, w)
    back = mixed.ceiling(v)
    is_atom = np.isin(z, a)
    # atoms come back exactly; other values up to the rounding of z + k − k
    assert np.array_equal(back[is_atom], z[is_atom])
    spacing = np.spacing(np.abs(z) + a.size)
    assert np.all(np.abs(back[~is_atom] - z[~is_atom]) <= 2 * spacing[~is_atom])
    # atom a_k (k from 1) lands in (a_k + k − 1, a_k + k]; other values outside every such cell
    k = np.searchsorted(a, z[is_atom]) + 1
    assert np.all((v[is_atom] > z[is_atom] + k - 1) & (v[is_atom] <= z[is_atom] + k))
    bottoms = a + np.arange(a.size)
    inside = (v[~is_atom, None] > bottoms) & (v[~is_atom, None] < bottoms + 1)
    assert not inside.any()


def test_clean_handles_missing_and_out_of_range_values() -> None:
    cont = Continuous(0.0, 10.0)
    assert cont.clean([np.nan, -5.0, 3.0, 50.0, np.inf]).tolist() == [0.0, 0.0, 3.0, 10.0, 10.0]
    assert np.all(np.isfinite(Continuous().clean([np.inf, -np.inf, np.nan])))
    lattice = Lattice(17, 90)
    assert lattice.clean(np.array([0, 17, 50, 200])).tolist() == [17, 17, 50, 90]
    assert lattice.clean(np.array([np.nan, 20.4])).tolist() == [17, 20]


@pytest.mark.parametrize(
    "cont",
    [Lattice(0, 9), Lattice(-3, 1000), FiniteSupport([0.5, 1.0, 2.5, 7.0]),
     Mixed([0.0, 5.0], 0.0, 10.0)],
)
def test_edges_never_split_a_cell(cont: Lattice | FiniteSupport | Mixed) -> None:
    edges = cont.edges(7)
    assert np.all(np.diff(edges) > 0)
    assert edges[0] == cont.lower and edges[-1] == cont.upper
    if isinstance(cont, Lattice):
        assert np.array_equal(edges, np.round(edges))  # cells (z − 1, z] stay whole
    if isinstance(cont, Mixed):
        bottoms = cont.atoms + np.arange(cont.atoms.size)
        assert set(bottoms) <= set(edges) and set(bottoms + 1) <= set(edges)


def _sample_dip(cont: Lattice | Mixed | FiniteSupport, sample: np.ndarray, data: np.ndarray,
                seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    reference = Empirical({"x": sample}, {"x": cont}, rng)
    return privatize({"x": data}, reference, 1.0, rng)["x"]


def test_integer_column_output_stays_on_the_integers() -> None:
    rng = np.random.default_rng(0)
    sample, data = rng.poisson(4, 500), rng.poisson(4, 3000)
    out = _sample_dip(Lattice(0, 39), sample, data, 1)
    assert out.dtype == np.int64
    # the hold-out's continualized range is (min − 1, max]: outputs are its integers
    assert out.min() >= sample.min() and out.max() <= sample.max()
    # every released value is a value of the hold-out's range, with about the same frequencies
    freq_out = np.bincount(out, minlength=40) / out.size
    freq_ref = np.bincount(sample, minlength=40) / sample.size
    assert np.max(np.abs(freq_out - freq_ref)) < 0.04  # ~4.5 SE of a 500-row hold-out frequency


def test_finite_support_output_stays_on_the_support() -> None:
    support = np.array([0.5, 1.0, 1.5, 2.0, 3.5, 5.0])
    rng = np.random.default_rng(2)
    sample = rng.choice(support, 400, p=[0.1, 0.1, 0.2, 0.3, 0.2, 0.1])
    data = rng.choice(support, 2000)
    out = _sample_dip(FiniteSupport(support), sample, data, 3)
    assert set(np.unique(out)) <= set(support)


def test_mixed_output_keeps_atoms_and_continuous_values_apart() -> None:
    rng = np.random.default_rng(4)

    def draw(n: int) -> np.ndarray:
        x = rng.exponential(1.0, n)
        kind = rng.random(n)
        x[kind < 0.3] = 0.0
        x[(kind >= 0.3) & (kind < 0.4)] = 2.0
        return x

    cont = Mixed([0.0, 2.0], 0.0, None)
    out = _sample_dip(cont, draw(2000), draw(20000), 5)
    # atoms are released exactly with about their mass (0.3 and 0.1; 4.5 SE of the hold-out)
    for atom, mass in ((0.0, 0.3), (2.0, 0.1)):
        assert np.mean(out == atom) == pytest.approx(mass, abs=4.5 * math.sqrt(mass / 2000) + 0.01)
    assert np.all(out >= 0.0)


def test_piecewise_linear_cdf_and_quantile_are_inverse() -> None:
    xs = np.array([0.0, 1.0, 1.0, 2.0, 4.0, 4.0, 5.0])  # two jumps (ties)
    ys = np.array([0.0, 0.1, 0.3, 0.3, 0.8, 0.9, 1.0])  # one flat stretch (no mass on (1, 2])
    cdf = PiecewiseLinear(xs, ys, Continuous())
    g = np.linspace(0.001, 0.999, 999)
    q = cdf.quantile_continualized(g)
    assert np.all(cdf.cdf(q) >= g - 1e-12)
    assert not np.any((q > 1.0) & (q < 2.0))  # the flat stretch is never returned
    assert np.mean(q == 1.0) == pytest.approx(0.2, abs=0.002)  # the jump at 1 is an atom
    rng = np.random.default_rng(0)
    u = cdf.pit(cdf.quantile_continualized(rng.random(100_000)), rng)
    # the randomized PIT undoes the quantile in law: uniform again (KS 1e-6 quantile)
    assert np.max(np.abs(np.sort(u) - np.arange(1, u.size + 1) / u.size)) < 2.7 / math.sqrt(u.size)


def test_product_reference_cleans_every_column() -> None:
    ref = Product({"a": PiecewiseLinear([0.0, 1.0], [0.0, 1.0], Continuous(0.0, 1.0))})
    out = privatize({"a": np.array([np.nan, -1.0, 0.5, 9.0])}, ref, 1.0, np.random.default_rng(0))
    assert np.all((out["a"] >= 0) & (out["a"] <= 1))
