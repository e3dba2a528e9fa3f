"""Plotting data of released functions and surfaces, for the service's plot endpoint
(no matplotlib here: ``service.plotting`` draws a ``PlotSpec``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from mechanisms.target import band95


def plot_data(result: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """(grid, values) of a stored functional release, checked for a drawable shape.

    Raises ValueError when ``result`` is not a function release (no ``grid`` /
    ``values`` lists of equal length >= 2, or non-numeric entries). Non-finite
    values become NaN so a plotting library leaves a gap.
    """
    grid, values = result.get("grid"), result.get("values")
    if not isinstance(grid, list | tuple) or not isinstance(values, list | tuple):
        raise ValueError("result has no grid and values to plot")
    if len(grid) != len(values) or len(grid) < 2:
        raise ValueError("result grid and values must have the same length (at least 2)")
    try:
        xs = [float(x) for x in grid]
        ys = [math.nan if v is None else float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError("result grid and values must be numbers") from None
    if not all(math.isfinite(x) for x in xs):
        raise ValueError("result grid must be finite")
    return xs, [y if math.isfinite(y) else math.nan for y in ys]


# --------------------------------------------------------------------------- plot specs
#: what a drawing shows: one curve with its band, several curves, or a surface (heat map)
PlotKind = Literal["curve", "curves", "surface"]


@dataclass(frozen=True)
class PlotSpec:
    """Everything a drawing of one release needs, from its public document only.

    ``band`` is the half-width of the 95 % band drawn around each curve (from the
    release's accuracy statement: ``band95`` or 1.96 × ``rmse``), or None.
    """

    kind: PlotKind
    title: str
    xlabel: str
    ylabel: str
    x: list[float]
    #: curve: [values]; curves: one list per curve; surface: rows over x, columns over y
    values: list[list[float]]
    y: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    bands: list[float | None] = field(default_factory=list)
    zlabel: str = ""


def plot_spec(mechanism: str, params: Mapping[str, Any], result: Mapping[str, Any],
              accuracy: Mapping[str, Any], cost: Mapping[str, Any]) -> PlotSpec:
    """The drawing of a stored release: labels from the params, ε from the cost, the band
    from the accuracy statement. Raises ValueError when there is nothing to draw."""
    title = f"{mechanism}, epsilon = {_epsilon(cost)}"
    kind = result.get("kind")
    if kind == "surface":
        x = _axis(result.get("grid"))
        y = _axis(result.get("grid_y", result.get("grid")))
        z = _matrix(result.get("values"), len(x), len(y))
        if mechanism == "iclp.kde2d":
            cols = list(params.get("columns", ["x", "y"]))
            return PlotSpec("surface", title, str(cols[0]), str(cols[1]), x, z, y,
                            zlabel="density")
        column = str(params.get("column", "f"))
        what = "covariance" if result.get("centred", True) else "second moment"
        return PlotSpec("surface", title, f"s (grid of {column})", f"t (grid of {column})",
                        x, z, y, zlabel=f"{what} of {column}")
    if kind == "curves":
        x = _axis(result.get("grid"))
        raw = result.get("values")
        if not isinstance(raw, list) or not raw:
            raise ValueError("result has no curves to plot")
        curves = [_curve(row, len(x)) for row in raw]
        names = [str(n) for n in result.get("names", [])] or [str(i) for i in range(len(raw))]
        bands = [_half_width(b) for b in result.get("band95", [None] * len(curves))]
        response = str(params.get("response", "Y"))
        return PlotSpec("curves", title, f"t (grid of {response})", f"beta_k(t) of {response}",
                        x, curves, labels=names[: len(curves)], bands=bands[: len(curves)])
    grid, values = plot_data(result)
    band = band95(mechanism, accuracy)
    if mechanism == "iclp.erm":
        response = str(params.get("response", "y"))
        ylabel = (f"log-odds of {response} = 1" if params.get("loss") == "logistic"
                  else f"E[{response} | {params.get('covariate', 'x')}]")
        xlabel = str(params.get("covariate", "x"))
    elif "column" in params and mechanism.endswith(".kde"):
        xlabel, ylabel = str(params["column"]), "density"
    else:
        column = str(params.get("column", "f"))
        xlabel, ylabel = f"t (grid of {column})", f"mean of {column}"
    return PlotSpec("curve", title, xlabel, ylabel, grid, [values], bands=[band])


def _epsilon(cost: Mapping[str, Any]) -> str:
    raw = cost.get("epsilon")
    try:
        value = Fraction(str(raw))
    except (TypeError, ValueError, ZeroDivisionError):
        return "?"
    return str(value) if value.denominator <= 1000 else f"{float(value):.4g}"


def _half_width(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _axis(raw: Any) -> list[float]:
    if not isinstance(raw, list | tuple) or len(raw) < 2:
        raise ValueError("result has no grid to plot on")
    try:
        xs = [float(v) for v in raw]
    except (TypeError, ValueError):
        raise ValueError("result grid must be numbers") from None
    if not all(math.isfinite(v) for v in xs):
        raise ValueError("result grid must be finite")
    return xs


def _curve(raw: Any, size: int) -> list[float]:
    if not isinstance(raw, list | tuple) or len(raw) != size:
        raise ValueError("each curve must have one value per grid point")
    try:
        ys = [math.nan if v is None else float(v) for v in raw]
    except (TypeError, ValueError):
        raise ValueError("curve values must be numbers") from None
    return [y if math.isfinite(y) else math.nan for y in ys]


def _matrix(raw: Any, rows: int, cols: int) -> list[list[float]]:
    if not isinstance(raw, list | tuple) or len(raw) != rows:
        raise ValueError("surface values must have one row per grid point")
    return [_curve(row, cols) for row in raw]
