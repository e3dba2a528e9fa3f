"""Plotting data of a released function, for the service's plot endpoint (no matplotlib here)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


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
