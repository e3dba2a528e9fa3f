"""Functional metadata validation, quadrature weights and clipping to the norm bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mechanisms.iclp import domain


def test_valid_metadata_is_normalised() -> None:
    grid, tau = domain.validate_functional_meta([0, 0.5, 2], 3)
    assert grid == (0.0, 0.5, 2.0) and tau == 3.0


@pytest.mark.parametrize(
    ("grid", "tau", "message"),
    [
        ([0.0, 0.5, 0.5, 1.0], 1.0, "strictly increasing"),
        ([0.0, 1.0, 0.5], 1.0, "strictly increasing"),
        ([0.0], 1.0, "at least 2"),
        ([], 1.0, "at least 2"),
        ([[0.0, 1.0]], 1.0, "flat list"),
        ([0.0, math.nan], 1.0, "finite"),
        ([0.0, math.inf], 1.0, "finite"),
        (["a", "b"], 1.0, "numbers"),
        ([0.0, 1.0], 0.0, "norm_bound"),
        ([0.0, 1.0], -2.0, "norm_bound"),
        ([0.0, 1.0], math.inf, "norm_bound"),
        ([0.0, 1.0], math.nan, "norm_bound"),
        ([0.0, 1.0], True, "norm_bound"),
        ([0.0, 1.0], "1", "norm_bound"),
        ([-1e308, 1e308], 1.0, "span must be finite"),
    ],
)
def test_bad_metadata_is_rejected(grid: list, tau: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        domain.validate_functional_meta(grid, tau)  # type: ignore[arg-type]


def test_uniform_weights_are_exactly_one_over_m() -> None:
    w = domain.quadrature_weights(np.linspace(3.0, 7.0, 50))
    assert np.all(w == 1.0 / 50)


def test_voronoi_weights_on_a_non_uniform_grid() -> None:
    w = domain.quadrature_weights([0.0, 1.0, 3.0])
    cells = np.array([1.0, 1.5, 2.0])  # end cells mirror their inner gap
    np.testing.assert_allclose(w, cells / cells.sum(), rtol=1e-15)
    u = domain.unit_positions([2.0, 3.0, 6.0])
    np.testing.assert_array_equal(u, [0.0, 0.25, 1.0])


@settings(max_examples=50, deadline=None)
@given(
    hnp.arrays(np.float64, (7, 12), elements=st.floats(allow_nan=True, allow_infinity=True,
                                                        width=64)),
    st.floats(1e-3, 1e3),
)
def test_clipped_curves_respect_the_bound(curves: np.ndarray, tau: float) -> None:
    w = domain.quadrature_weights(np.linspace(0, 1, 12))
    clipped = domain.clip_curves(curves, w, tau)
    assert np.all(np.isfinite(clipped))
    assert np.all(domain.curve_norms(clipped, w) <= tau * (1 + 2.0**-30))
    finite = np.where(np.isfinite(curves), curves, 0.0)
    short = domain.curve_norms(finite, w) <= tau
    np.testing.assert_array_equal(clipped[short], finite[short])  # short curves untouched


@pytest.mark.parametrize(("rows", "uniform"), [(1, True), (513, True), (1, False), (513, False)])
def test_norms_and_mean_match_the_definition(rows: int, uniform: bool) -> None:
    """The faster norm (issue 16 item 3: equal weights factored out of the sum) agrees
    with Σ_k w_k X_ik² and (1/n)Σ_i f_i X_i computed in extended precision, on equally
    and unequally spaced grids, for C- and Fortran-ordered input and a single curve."""
    rng = np.random.default_rng(rows)
    grid = np.linspace(0, 3, 37) if uniform else np.sort(rng.uniform(0, 3, size=37))
    w = domain.quadrature_weights(grid)
    x = rng.normal(size=(rows, grid.size)) * rng.uniform(0.1, 3, size=(rows, 1))
    exact = np.sqrt(np.sum(x.astype(np.longdouble) ** 2 * w, axis=1)).astype(np.float64)
    for form in (x, np.asfortranarray(x)):
        np.testing.assert_allclose(domain.curve_norms(form, w), exact, rtol=1e-14)
    assert domain.curve_norms(x[0], w) == pytest.approx(exact[0], rel=1e-14)
    tau = float(np.median(exact))
    factor = np.minimum(1.0, tau / exact.astype(np.longdouble))
    want = (np.sum(factor[:, None] * x, axis=0) / rows).astype(np.float64)
    scale = float(np.max(np.abs(x))) * 1e-14
    np.testing.assert_allclose(domain.clipped_mean(x, w, tau), want, rtol=0, atol=scale)
