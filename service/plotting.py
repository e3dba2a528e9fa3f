"""PNG drawings of released functions: made from the release's public output only."""

from __future__ import annotations

import io
from collections.abc import Sequence


def function_png(grid: Sequence[float], values: Sequence[float], title: str) -> bytes:
    """A line plot of a released function on its grid, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")  # no display; safe in any worker thread
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 3.5), dpi=100)
    axes = figure.add_subplot()
    axes.plot(list(grid), list(values), color="#1f5fa8", linewidth=1.8)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()
