"""PNG drawings of released functions and tables: made from the release's public output only."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any


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


def bar_png(labels: Sequence[str], values: Sequence[float | None], errors: Sequence[Any],
            title: str) -> bytes:
    """Bars with 95 % error bars for a released table (cells in release order).

    ``errors[i]`` is a half-width, a ``[below, above]`` pair, or None (no bar drawn,
    e.g. a mean whose noisy count is below 1).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    drawn = [i for i, v in enumerate(values) if v is not None]
    heights = [float(values[i]) for i in drawn]  # type: ignore[arg-type]
    below, above = [], []
    for i in drawn:
        e = errors[i]
        lo, hi = (e, e) if not isinstance(e, list | tuple) else (e[0], e[1])
        below.append(float(lo or 0.0))
        above.append(float(hi or 0.0))
    figure = Figure(figsize=(max(6.0, 0.35 * len(labels)), 3.5), dpi=100)
    axes = figure.add_subplot()
    axes.bar(drawn, heights, yerr=[below, above], color="#1f5fa8", ecolor="#333333",
             capsize=3)
    axes.set_xticks(range(len(labels)), [str(x) for x in labels], rotation=60 if len(labels) > 8
                    else 0, fontsize=8)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()
