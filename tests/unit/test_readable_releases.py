"""Releases a person can read (issue #31 items 2-3), for every registered mechanism.

Each mechanism runs once on a small fixed-seed dataset; its release document is drawn
(``service.plotting.release_document_figure``: the PNG decoded, the SVG twin's text read
for the axis titles, the statistic, its column and the budget) and read as a DataFrame
(``frames.release_to_pandas``: ``lower``/``upper`` and the level). A mechanism whose
result holds no released statistic must be named in ``RECORD_LEVEL``; a new mechanism
that is neither drawn nor listed fails here.
"""

from __future__ import annotations

import html
import io
import re
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from matplotlib import image as mpimg
from privrelease_client import frames
from privrelease_client.objects import Release
from privrelease_client.reading import Z95, read_release

import mechanisms
from mechanisms import target
from mechanisms.base import ColumnMeta, DatasetMeta
from service.plotting import release_document_figure, render

N = 240
GRID = tuple(float(t) for t in np.linspace(0.0, 1.0, 12))
META = DatasetMeta(N, {
    "x": ColumnMeta("x", "continuous", bounds=(0.0, 10.0)),
    "k": ColumnMeta("k", "integer", bounds=(0.0, 5.0)),
    "u": ColumnMeta("u", "continuous", bounds=(0.0, 10.0)),
    "g": ColumnMeta("g", "categorical", categories=("a", "b", "c", "d")),
    "h": ColumnMeta("h", "categorical", categories=("p", "q", "r", "s")),
    "f": ColumnMeta("f", "functional", grid=GRID, norm_bound=2.0),
})
EPS = {"epsilon": 1}
LEAK = {"interval_leakage": 0.6}

#: every registered mechanism: (params, budget); extra statistics of the baselines below
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "bernstein.kde": ({"column": "x"}, EPS),
    "bernstein.mean": ({"column": "f"}, EPS),
    "dip": ({"columns": ["x"]}, EPS),
    "exm": ({"column": "g", "draws": 3}, EPS),
    "frl.kde": ({"column": "x"}, EPS),
    "frl.mean": ({"column": "f"}, EPS),
    "gaussian": ({"statistic": "histogram", "column": "x", "bins": 4},
                 {"epsilon": 1, "delta": 1e-6}),
    "geometric": ({"statistic": "count", "condition": {"column": "x", "op": "ge",
                                                       "value": 5}}, EPS),
    "gp.adp": ({"column": "f"}, {"epsilon": 1, "delta": 1e-6}),
    "iclp.ar": ({"column": "f"}, EPS),
    "iclp.cov": ({"column": "f"}, EPS),
    "iclp.erm": ({"covariate": "x", "response": "k"}, EPS),
    "iclp.fos": ({"response": "f", "covariates": ["x"]}, EPS),
    "iclp.kde": ({"column": "x"}, EPS),
    "iclp.kde2d": ({"columns": ["x", "u"]}, EPS),
    "iclp.mean": ({"column": "f"}, EPS),
    "interval.case1": ({"column": "k", "calibrate": True, "transform": "exp"},
                       {"interval_leakage": 0.15}),
    "interval.case2": ({"column": "k", "calibrate": True, "transform": "exp"},
                       {"interval_leakage": 0.15}),
    "interval.casek": ({"column": "k", "calibrate": True, "transform": "exp", "m": 3},
                       {"interval_leakage": 0.15}),
    "interval.progressive": ({"column": "k", "rounds": 2}, {"interval_leakage": 0.9}),
    "interval.progressive_categorical": ({"column": "g", "rounds": 1}, LEAK),
    "interval.ring": ({"column": "k", "calibrate": True, "transform": "exp"},
                      {"interval_leakage": 0.15}),
    "interval.selective": ({"column": "k", "calibrate": True, "transform": "exp",
                            "tau": 0.5}, {"interval_leakage": 0.15}),
    "laplace": ({"statistic": "mean", "column": "x"}, EPS),
    "lrm": ({"columns": ["x"]}, EPS),
    "noiseless.aggregate": ({"statistic": "median", "column": "x"}, {"noiseless_bits": 3}),
    "noiseless.local": ({"column": "x"}, {"noiseless_bits": 3}),
    "noiseless.vector": ({"queries": [{"statistic": "mean", "column": "x", "bits": 1},
                                      {"statistic": "max", "column": "k", "bits": 2}]},
                         {"noiseless_bits": 3}),
    "opm.l2ball": ({"column": "x"}, EPS),
    "opm.mean": ({"columns": ["x", "k"]}, EPS),
    "subset.custom": ({"column": "g", "design": {
        "type": "mu", "subsets": [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"],
                                  ["a", "d"], ["b", "c"]],
        "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]}}, {"subset_draws": 1}),
    "subset.dummy": ({"column": "g", "alpha": 0.3}, {"subset_draws": 1}),
    "subset.product": ({"columns": ["g", "h"]}, {"subset_draws": 1}),
    "subset.uniform": ({"column": "g"}, {"subset_draws": 1}),
}
#: the baselines' other statistics, each its own shape
BASELINES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "laplace.histogram": ("laplace", {"statistic": "histogram", "column": "k", "bins": 3}, EPS),
    # a categorical column's histogram: one bar a category (it had no reading, so no
    # plot and no interval in its frame)
    "laplace.category_histogram": ("laplace", {"statistic": "histogram", "column": "g"}, EPS),
    "geometric.category_histogram": ("geometric", {"statistic": "histogram", "column": "h"},
                                     EPS),
    "laplace.quantile": ("laplace", {"statistic": "quantile", "column": "x",
                                     "quantiles": [0.1, 0.5, 0.9, 0.99]}, EPS),
    "laplace.covariance": ("laplace", {"statistic": "covariance", "columns": ["x", "u"]}, EPS),
    "laplace.count_table": ("laplace", {"statistic": "count", "group_by": ["g", "h"]}, EPS),
    "laplace.consistent": ("laplace", {"statistic": "count", "group_by": ["g"],
                                       "consistency": True}, EPS),
    "laplace.mean_table": ("laplace", {"statistic": "mean", "column": "x",
                                       "group_by": ["g"]}, EPS),
    "laplace.sum": ("laplace", {"statistic": "sum", "column": "x"}, EPS),
    "laplace.std": ("laplace", {"statistic": "std", "column": "x"}, EPS),
}
#: results with no released statistic: record-level data (numbers in /data and analyses)
RECORD_LEVEL = {"dip", "noiseless.local", "interval.case1", "interval.case2",
                "interval.casek", "interval.progressive", "interval.progressive_categorical",
                "interval.ring", "interval.selective"}


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    phase = rng.uniform(0, 3, N)
    return {"x": rng.uniform(0, 10, N), "k": rng.integers(0, 6, N).astype(np.int64),
            "u": rng.uniform(0, 10, N), "g": rng.integers(0, 4, N).astype(np.int64),
            "h": rng.integers(0, 4, N).astype(np.int64),
            "f": np.sin(np.outer(phase, np.asarray(GRID)))}


def release_doc(name: str, params: dict[str, Any], budget: dict[str, Any]) -> dict[str, Any]:
    """A stored-release document as the service renders it (cost as plain numbers)."""
    mech = mechanisms.get(name)
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, {k: Fraction(str(v)) for k, v in budget.items()}, META)
    out = mech.run(_data(), loaded, cost, META, np.random.default_rng(3))
    return {"id": f"rel_{name}", "status": "succeeded", "mechanism": name, "params": params,
            "result": out.result, "accuracy": out.accuracy,
            "cost": {k: float(v) for k, v in cost.items()}}


def _all_cases() -> dict[str, tuple[str, dict[str, Any], dict[str, Any]]]:
    out = {name: (name, p, b) for name, (p, b) in CASES.items()}
    out.update(BASELINES)
    return out


ALL = _all_cases()


def svg_texts(svg: bytes) -> list[str]:
    """The SVG's texts: drawn as paths, each preceded by its text as an XML comment."""
    return [html.unescape(t) for t in re.findall(r"<!-- (.*?) -->", svg.decode())]


def test_every_registered_mechanism_has_a_case() -> None:
    """A new mechanism fails here until it is drawn (a case) or is record-level."""
    assert set(CASES) == set(mechanisms.names())
    assert set(CASES) >= RECORD_LEVEL


@pytest.mark.parametrize("case", sorted(ALL))
def test_every_release_with_numbers_is_drawn_readably(case: str) -> None:
    """PNG decoded; the SVG twin names both axes, the statistic, its column and the
    budget; the interval drawn is named; a record-level release has nothing to draw."""
    name, params, budget = ALL[case]
    doc = release_doc(name, params, budget)
    reading = read_release(doc)
    if name in RECORD_LEVEL:
        assert reading is None
        with pytest.raises(ValueError, match="no released statistic"):
            release_document_figure(doc)
        return
    assert reading is not None, case
    png = render(release_document_figure(doc), "png")
    pixels = mpimg.imread(io.BytesIO(png), format="png")
    assert pixels.ndim == 3 and pixels.shape[1] >= 600 and pixels.shape[0] >= 350
    assert float(pixels[..., :3].std()) > 0.05  # something is drawn, not a blank image
    texts = svg_texts(render(release_document_figure(doc), "svg"))
    title = next(t for t in texts if reading.title in t)
    symbol = {"epsilon": "ε = 1"}.get(next(iter(budget)), next(iter(budget)))
    assert symbol in title, (case, title)
    columns = [c for c in (params.get("column"), params.get("covariate"), params.get(
        "response"), *(params.get("columns") or []), *(params.get("group_by") or []))
        if c]
    assert all(c in title for c in columns[:1]), (case, title)
    assert reading.label_name in texts and reading.value_name in texts, (case, texts[-8:])
    if reading.kind in ("bars", "points"):
        caption = " ".join(texts[texts.index(title) + 1:])
        assert reading.interval.split(":")[0] in caption, (case, caption)
        assert all(label in texts for label in reading.labels if len(label) < 40)


@pytest.mark.parametrize("case", sorted(set(ALL) - RECORD_LEVEL))
def test_every_frame_carries_its_interval_and_level(case: str) -> None:
    """``Release.to_pandas()``: ``lower``/``upper`` around each estimate at the stated
    level (a column, and ``attrs`` saying where the interval comes from); polars too."""
    name, params, budget = ALL[case]
    doc = release_doc(name, params, budget)
    frame = Release(None, doc).to_pandas()  # type: ignore[arg-type]
    assert {"estimate", "lower", "upper", "level"} <= set(frame.columns), case
    reading = read_release(doc)
    assert reading is not None
    assert frame.attrs["level"] == reading.level and frame.attrs["interval"]
    assert frame.attrs["statistic"] == reading.statistic
    levels = set(frame["level"].dropna())
    assert levels == ({reading.level} if reading.level is not None else set())
    held = frame.dropna(subset=["lower", "upper"])
    if reading.level is not None:
        assert len(held) > 0, case
    centre = held["noisy_estimate"] if "noisy_estimate" in held else held["estimate"]
    assert (held["lower"] <= centre + 1e-12).all() and (centre <= held["upper"] + 1e-12).all()
    polars = Release(None, doc).to_polars()  # type: ignore[arg-type]
    assert polars.columns == list(frame.columns)


def test_intervals_are_the_stated_ones_exactly() -> None:
    """Half-widths come from the accuracy statement, nothing else: a scalar's and a
    histogram's ± ci95_halfwidth, a consistent table's around its noisy cells, a mean
    table's stated errors, shares' 1.96 × the stated standard error."""
    mean = release_doc("laplace", {"statistic": "mean", "column": "x"}, EPS)
    frame = frames.release_to_pandas(mean)
    half = mean["accuracy"]["ci95_halfwidth"]
    assert frame["upper"][0] - frame["estimate"][0] == pytest.approx(half, rel=1e-12)
    assert frame["estimate"][0] - frame["lower"][0] == pytest.approx(half, rel=1e-12)
    assert frame["level"].tolist() == [0.95]
    hist = release_doc("gaussian", {"statistic": "histogram", "column": "x", "bins": 4},
                       {"epsilon": 1, "delta": 1e-6})
    frame = frames.release_to_pandas(hist)
    half = hist["accuracy"]["ci95_halfwidth"]
    assert (frame["upper"] - frame["estimate"]).tolist() == [half] * 4
    assert frame["bin"].tolist() == ["[0, 2.5)", "[2.5, 5)", "[5, 7.5)", "[7.5, 10)"]
    assert frame["left"].tolist() == [0.0, 2.5, 5.0, 7.5]
    table = release_doc("laplace", {"statistic": "count", "group_by": ["g"],
                                    "consistency": True}, EPS)
    frame = frames.release_to_pandas(table)
    noisy, errors = table["result"]["noisy_values"], table["result"]["errors"]
    assert frame["noisy_estimate"].tolist() == noisy
    assert frame["lower"].tolist() == [v - e for v, e in zip(noisy, errors, strict=True)]
    assert "noisy" in frame.attrs["interval"] and "post-processed" in frame.attrs["interval"]
    means = release_doc("laplace", {"statistic": "mean", "column": "x", "group_by": ["g"]},
                        EPS)
    frame = frames.release_to_pandas(means)
    stated = means["result"]["intervals"]
    assert frame["lower"].tolist() == pytest.approx([i[0] for i in stated], rel=1e-12)
    assert frame["upper"].tolist() == pytest.approx([i[1] for i in stated], rel=1e-12)
    shares = release_doc("subset.uniform", {"column": "g"}, {"subset_draws": 1})
    frame = frames.release_to_pandas(shares)
    se = shares["accuracy"]["variables"][0]["standard_errors_under_uniform_prior"]["em"]
    assert (frame["upper"] - frame["estimate"]).tolist() == pytest.approx(
        [Z95 * s for s in se], rel=1e-12)


def test_quantiles_are_labelled_by_their_levels_and_say_they_have_no_value_interval(
) -> None:
    """Issue #31 item 2: quantile bars were labelled 0..3; the ticks are the levels and the
    caption says the statement bounds ranks, not values (no error bars drawn)."""
    doc = release_doc(*BASELINES["laplace.quantile"])
    texts = svg_texts(render(release_document_figure(doc), "svg"))
    assert {"0.1", "0.5", "0.9", "0.99"} <= set(texts)
    assert "quantile level" in texts and "x" in texts
    assert any("no error bars" in t for t in texts)
    frame = frames.release_to_pandas(doc)
    assert frame["quantile"].tolist() == [0.1, 0.5, 0.9, 0.99]
    assert frame["lower"].isna().all() and frame.attrs["level"] is None
    assert (frame["rank_error_95"] == doc["accuracy"]["ci95_rank_error"]).all()


def test_a_quantile_units_interval_is_carried_by_the_frame() -> None:
    """Issue #32 item 3: with ``interval: true`` the quantile frame's lower/upper are the
    released intervals in the column's units, at their level; the target search still
    reads no public half-width from a quantile (its widths come from the draws)."""
    name, params, budget = BASELINES["laplace.quantile"]
    doc = release_doc(name, {**params, "interval": True}, budget)
    frame = frames.release_to_pandas(doc)
    lows, highs = zip(*doc["result"]["intervals"], strict=True)
    assert frame["lower"].tolist() == list(lows) and frame["upper"].tolist() == list(highs)
    assert frame.attrs["level"] == 0.95
    assert (frame["lower"] <= frame["upper"]).all()
    assert target.stated(name, doc["accuracy"]) is None
    render(release_document_figure(doc), "svg")


def test_a_band_is_drawn_and_its_half_width_named() -> None:
    """Issue #31 item 2: a KDE's legend named a band nobody could see; the legend gives
    its half-width (from the statement) and the band is a filled region in the SVG."""
    doc = release_doc("iclp.kde", {"column": "x"}, EPS)
    reading = read_release(doc)
    assert reading is not None and reading.level == 0.95
    band = reading.upper[0] - reading.estimates[0]  # type: ignore[operator]
    stated = doc["accuracy"]["band95"]  # the pointwise band's widest half-width (issue #32)
    assert stated == max(doc["accuracy"]["band95_pointwise"])
    assert band == pytest.approx(stated, rel=1e-12)
    svg = render(release_document_figure(doc), "svg")
    assert f"95 % band ± {stated:.3g}" in svg_texts(svg)
    assert b'id="FillBetweenPolyCollection' in svg or b'id="PolyCollection' in svg


def test_the_band_the_service_draws_is_the_one_frames_state() -> None:
    """``mechanisms`` stays importable without the client (DESIGN §1), so the drawing's
    band formula (``mechanisms.target.band95``, which ``mechanisms.iclp.plot`` draws) and
    the frames' (``reading.band95``) are two copies: they must agree."""
    from privrelease_client.reading import band95

    from mechanisms.target import band95 as _band

    cases = [("iclp.mean", {"band95": 0.3}),
             ("iclp.mean", {"expected_sq_l2_error": 0.04}),
             ("iclp.kde", {"expected_sq_l2_error": 0.5, "kernel": {"domain": [0, 5]}}),
             ("frl.kde", {"expected_sq_l2_error": 0.5, "kernel": {"domain": [2, 2]}}),
             ("iclp.kde", {"expected_sq_l2_error": 0.5}),
             ("iclp.mean", {"expected_sq_l2_error": -1}),
             ("iclp.mean", {})]
    for mechanism, accuracy in cases:
        assert _band(mechanism, accuracy) == band95(mechanism, accuracy), (mechanism, accuracy)
