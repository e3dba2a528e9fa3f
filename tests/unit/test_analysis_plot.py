"""``mechanisms.analysis_plot``: what a drawing of an analysis shows, checked exactly."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from mechanisms.analysis_plot import Z95, analysis_plot, truncated_cdf
from service.plotting import analysis_figure, render


def test_npmle_steps_and_boxes_follow_the_cells() -> None:
    """Each cell is a box from F̂ before it to F̂ after it; F̂ jumps at finite right ends;
    an unbounded end is drawn 5 % of the finite span beyond it."""
    result = {"cells": [[None, 1.0], [2.0, 3.0], [4.0, None]], "cdf": [0.25, 0.75, 1.0],
              "tail_mass": {"below_all_ends": 0.25, "above_all_ends": 0.0}}
    spec = analysis_plot("npmle", result, "t")
    assert spec.steps == [(1.0, 0.25), (3.0, 0.75)]
    assert spec.boxes == [(1.0 - 0.15, 1.0, 0.0, 0.25), (2.0, 3.0, 0.25, 0.75),
                          (4.0, 4.0 + 0.15, 0.75, 1.0)]
    assert spec.notes == ["mass 0.25 below every range end"]


@given(st.lists(st.tuples(st.floats(-100, 100), st.floats(0, 10), st.floats(0.01, 1)),
                min_size=1, max_size=20))
def test_npmle_boxes_tile_zero_to_one(cells: list[tuple[float, float, float]]) -> None:
    """Whatever the cells, the boxes stack: each starts where the last ended, from 0."""
    cells = sorted(cells)
    total = sum(m for *_, m in cells)
    cum = np.cumsum([m / total for *_, m in cells]).tolist()
    result = {"cells": [[a, a + w] for a, w, _ in cells], "cdf": cum}
    spec = analysis_plot("npmle", result, "t")
    assert [b[2] for b in spec.boxes] == [0.0, *cum[:-1]]
    assert [b[3] for b in spec.boxes] == cum
    assert all(b[0] <= b[1] for b in spec.boxes)


@pytest.mark.parametrize(("family", "params", "law"), [
    ("normal", {"loc": 1.0, "scale": 2.0}, stats.norm(1.0, 2.0)),
    ("logistic", {"loc": -1.0, "scale": 0.5}, stats.logistic(-1.0, 0.5)),
    ("lognormal", {"meanlog": 0.3, "sdlog": 0.7}, stats.lognorm(0.7, scale=math.exp(0.3))),
])
def test_truncated_cdf_is_the_renormalised_law(family: str, params: dict[str, float],
                                               law: stats.rv_frozen) -> None:
    """(G(x) − G(a)) / (G(b) − G(a)) inside, 0 below a and 1 above b."""
    a, b = 0.5, 3.0
    x = np.array([0.0, 0.5, 1.0, 2.0, 3.0, 9.0])
    expected = np.clip((law.cdf(np.clip(x, a, b)) - law.cdf(a)) / (law.cdf(b) - law.cdf(a)),
                       0, 1)
    got = truncated_cdf(family, params, (a, b), x)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    assert got[0] == 0.0 and got[-1] == 1.0


def test_mle_curve_spans_the_support_and_is_a_cdf() -> None:
    result = {"family": "normal", "params": {"loc": 40.0, "scale": 10.0},
              "truncated_to": [0.0, 100.0]}
    spec = analysis_plot("mle", result, "t")
    assert spec.curve is not None
    x, y = spec.curve
    assert x[0] == 0.0 and x[-1] == 100.0
    assert y[0] == 0.0 and y[-1] == pytest.approx(1.0, abs=1e-12)
    assert all(b >= a for a, b in itertools.pairwise(y))


def test_functionals_draw_cdf_and_quantile_points_only() -> None:
    """A cdf at t is (t, F̂) with a vertical interval; a quantile at p is (q̂, p) with a
    horizontal one; other kinds (different scales) are left out."""
    result = {"functionals": [
        {"type": "cdf", "t": 40, "estimate": 0.3, "ci": [0.2, 0.4]},
        {"type": "quantile", "p": 0.5, "estimate": 44.0, "ci": [35.0, 47.0]},
        {"type": "truncated_mean", "low": 0, "high": 50, "estimate": 38.0, "ci": [37, 39]},
        {"type": "cdf", "t": 60, "estimate": None, "ci": None}],
        "bootstrap": {"level": 0.9}}
    points = analysis_plot("functionals", result, "t").points
    assert points is not None
    assert (points.x, points.y) == ([40.0, 44.0], [0.3, 0.5])
    assert points.y_interval == [(0.2, 0.4), None]
    assert points.x_interval == [None, (35.0, 47.0)]
    assert "90 %" in points.label


def test_subset_bars_have_clipped_95_intervals() -> None:
    result = {"w": [0.02, 0.5, 0.48], "se": [0.05, 0.1, None], "categories": ["a", "b", "c"],
              "column": "c"}
    spec = analysis_plot("estimate", result, "t")
    assert spec.labels == ["a", "b", "c"] and spec.values == [0.02, 0.5, 0.48]
    assert spec.intervals[0] == (0.0, 0.02 + Z95 * 0.05)
    assert spec.intervals[1] == pytest.approx((0.5 - Z95 * 0.1, 0.5 + Z95 * 0.1))
    assert spec.intervals[2] is None


@pytest.mark.parametrize(("name", "result"), [
    ("moments", {"moments": {"1": 3.0}}),
    ("npmle", {"cells": [], "cdf": []}),
    ("npmle", {"cells": [[None, None]], "cdf": [1.0]}),
    ("functionals", {"functionals": [{"type": "probability", "estimate": 0.5}]}),
    ("mle", {"family": "normal", "params": {"loc": 0.0}}),
    ("estimate", {"statistic": 3.0}),
    ("npmle", None),
])
def test_results_with_nothing_to_draw_raise(name: str, result: object) -> None:
    """The route turns this ValueError into its 404."""
    with pytest.raises(ValueError):
        analysis_plot(name, result, "t")  # type: ignore[arg-type]


def test_one_figure_renders_as_png_and_svg() -> None:
    """The SVG comes from the same figure as the PNG (no second drawing code), and has no
    date in it: the same figure gives the same bytes."""
    spec = analysis_plot("npmle", {"cells": [[0.0, 1.0], [2.0, 3.0]], "cdf": [0.4, 1.0]}, "t")
    png = render(analysis_figure(spec), "png")
    svg = render(analysis_figure(spec), "svg")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert svg.startswith(b"<?xml") and b"<svg" in svg
    assert render(analysis_figure(spec), "svg") == svg
    with pytest.raises(ValueError):
        render(analysis_figure(spec), "gif")
