"""Release drawings: real PNGs of the given size, with labels, ε and the accuracy band."""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.iclp.plot import plot_spec
from service.plotting import bar_png, release_png


@pytest.mark.parametrize(("cells", "width"), [(3, 600), (40, 1400)])
def test_bar_png_has_the_expected_size(cells: int, width: int) -> None:
    """Tables are bars, wider for many cells; a null cell (no noisy count) has no bar."""
    values = [float(i) for i in range(cells - 1)] + [None]
    png = bar_png([f"c{i}" for i in range(cells)], values, [0.5] * cells, "laplace · rel_x")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (width, 350)


# --------------------------------------------------------------------------- release plots


def release_docs() -> dict[str, dict[str, Any]]:
    """One stored-release document per plot kind, made by the registered mechanisms."""
    rng = np.random.default_rng(0)
    n, m = 400, 30
    grid = tuple(float(t) for t in np.linspace(0.0, 10.0, m))
    t = np.asarray(grid) / 10
    z = rng.normal(size=(n, 1))
    curves = np.sin(2 * np.pi * t) + 0.5 * z * np.cos(np.pi * t) + 0.1 * rng.normal(size=(n, m))
    age = rng.uniform(20, 70, n)
    income = np.clip(10 + 0.5 * age + rng.normal(0, 5, n), 0, 60)
    meta = DatasetMeta(n, {
        "curve": ColumnMeta("curve", "functional", grid=grid, norm_bound=2.0),
        "age": ColumnMeta("age", "continuous", bounds=(20.0, 70.0)),
        "income": ColumnMeta("income", "continuous", bounds=(0.0, 60.0)),
        "z": ColumnMeta("z", "continuous", bounds=(-3.0, 3.0)),
    })
    data = {"curve": curves, "age": age, "income": income, "z": np.clip(z[:, 0], -3, 3)}
    requests = {
        "mean": ("iclp.mean", {"column": "curve"}),
        "kde": ("iclp.kde", {"column": "age"}),
        "erm": ("iclp.erm", {"covariate": "age", "response": "income"}),
        "cov": ("iclp.cov", {"column": "curve"}),
        "fos": ("iclp.fos", {"response": "curve", "covariates": ["z"]}),
        "kde2d": ("iclp.kde2d", {"columns": ["age", "income"]}),
    }
    docs = {}
    for key, (name, raw) in requests.items():
        mech = registry.get(name)
        params = mech.load_params(raw)
        cost = mech.cost(params, {"epsilon": Fraction(2)}, meta)
        out = mech.run(data, params, cost, meta, np.random.default_rng(1))
        docs[key] = {"mechanism": name, "params": raw, "result": out.result,
                     "accuracy": out.accuracy, "cost": {k: str(v) for k, v in cost.items()}}
    return docs


def test_release_plots_have_labels_epsilon_and_bands(tmp_path: Path) -> None:
    """Issue 16 item 4: every kind is drawn with axis labels naming the grid variable /
    columns, ε in the title and (curves) the 95 % band of the accuracy statement."""
    docs = release_docs()
    specs = {k: plot_spec(d["mechanism"], d["params"], d["result"], d["accuracy"], d["cost"])
             for k, d in docs.items()}
    for key, spec in specs.items():
        assert "epsilon = 2" in spec.title, key
        png = release_png(spec)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (600, 350)
        (tmp_path / f"{key}.png").write_bytes(png)
    assert (specs["mean"].xlabel, specs["mean"].ylabel) == ("t (grid of curve)", "mean of curve")
    # a mean function's band is its pointwise band's widest half-width (issue #32)
    mean_accuracy = docs["mean"]["accuracy"]
    assert specs["mean"].bands == [mean_accuracy["band95"]] == [
        max(mean_accuracy["band95_pointwise"])]
    assert (specs["kde"].xlabel, specs["kde"].ylabel) == ("age", "density")
    # a density's band is its pointwise band's widest half-width (issue #32), not the
    # L2 error spread over the 50-year range
    kde = docs["kde"]["accuracy"]
    assert specs["kde"].bands == [kde["band95"]] == [max(kde["band95_pointwise"])]
    assert (specs["erm"].xlabel, specs["erm"].ylabel) == ("age", "E[income | age]")
    assert specs["erm"].bands == [docs["erm"]["accuracy"]["band95"]]
    assert specs["cov"].kind == "surface" and specs["cov"].zlabel == "covariance of curve"
    assert len(specs["cov"].values) == 30 and len(specs["cov"].values[0]) == 30
    assert specs["fos"].kind == "curves" and specs["fos"].labels == ["(intercept)", "z"]
    assert all(b is not None and b > 0 for b in specs["fos"].bands)
    assert (specs["kde2d"].xlabel, specs["kde2d"].ylabel) == ("age", "income")


def test_plot_spec_refuses_what_it_cannot_draw() -> None:
    with pytest.raises(ValueError):
        plot_spec("laplace", {}, {"value": 3.0}, {}, {"epsilon": "1"})
    with pytest.raises(ValueError):
        plot_spec("iclp.cov", {}, {"kind": "surface", "grid": [0, 1], "values": [[1, 2]]}, {},
                  {})
    spec = plot_spec("iclp.mean", {}, {"grid": [0, 1], "values": [1, None]}, {}, {})
    assert spec.title.endswith("epsilon = ?") and spec.bands == [None]


def test_table_bars_with_error_bars_are_a_png() -> None:
    """Symmetric half-widths, [below, above] pairs and missing cells (None) all draw."""
    from service.plotting import bar_png

    for values, errors in (([3.0, 5.0, 1.0], [1.5, 1.5, 1.5]),
                           ([0.2, None, 0.7], [[0.1, 0.2], None, [0.3, 0.1]])):
        png = bar_png(["a / x", "a / y", "b / x"], values, errors, "laplace · rel_x")
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (600, 350)


def test_the_budget_chart_leaves_out_measures_nobody_enabled_and_ticks_say_the_time(
        ) -> None:
    """#31 item 6: an empty panel per measure nobody enabled, and ticks reading
    "30, 17:51, 30" (seconds drawn as bare numbers, like days)."""
    from datetime import UTC, datetime, timedelta

    from service.plotting import budget_figure

    start = datetime(2026, 11, 30, 17, 51, 2, tzinfo=UTC)
    times = [start + timedelta(seconds=0.3 * i) for i in range(7)] + [
        start + timedelta(seconds=40)]
    used = {"committed": [0, 1, 2, 3, 4, 5, 6, 6], "reserved": [1, 1, 1, 1, 1, 1, 0, 0],
            "cap": [10] * 8}
    unused = {"committed": [0] * 8, "reserved": [0] * 8, "cap": [0] * 8}
    figure = budget_figure({"epsilon": (times, used), "delta": (times, unused)}, "budget")
    assert [a.get_ylabel() for a in figure.axes] == ["epsilon"]
    figure.canvas.draw()
    ticks = [t.get_text() for t in figure.axes[-1].get_xticklabels() if t.get_text()]
    assert len(ticks) >= 3 and all(":" in t for t in ticks), ticks
    assert figure.axes[-1].get_xlabel() == "time (UTC)"
