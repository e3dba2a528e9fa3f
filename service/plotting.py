"""Drawings of released functions and analyses, as PNG or SVG from the same figure code:
made from the release's (or analysis's) public output only."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.analysis_plot import AnalysisPlot
from mechanisms.iclp.plot import PlotSpec


def _figure(width: float = 6.0, height: float = 3.5) -> Any:
    """A headless matplotlib figure, 100 dpi, 3.5 inches high unless told."""
    import matplotlib

    matplotlib.use("Agg")  # no display; safe in any worker thread
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


#: the formats a drawing is served in, and their media types
FORMATS = {"png": "image/png", "svg": "image/svg+xml"}


def render(figure: Any, fmt: str = "png") -> bytes:
    """``figure`` as PNG or SVG bytes (matplotlib picks the format's own backend); the SVG
    has text as paths (no markup from labels) and no date or random ids, so the same
    figure gives the same bytes."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown image format {fmt!r}")
    import matplotlib

    figure.tight_layout()
    out = io.BytesIO()
    # a fixed salt: the SVG's element ids are otherwise random on every call
    with matplotlib.rc_context({"svg.hashsalt": "privrelease"}):
        figure.savefig(out, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    return out.getvalue()


def _png(figure: Any) -> bytes:
    return render(figure, "png")


def release_png(spec: PlotSpec) -> bytes:
    """``release_figure`` as PNG."""
    return _png(release_figure(spec))


def release_figure(spec: PlotSpec) -> Any:
    """A release drawn from its ``PlotSpec``: a curve with its 95 % band, several curves
    (each with its band), or a heat map of a surface; axis labels and ε in the title."""
    figure = _figure()
    axes = figure.add_subplot()
    if spec.kind == "surface":
        z = np.array(spec.values, dtype=np.float64).T  # rows over y, columns over x
        image = axes.pcolormesh(spec.x, spec.y, np.ma.masked_invalid(z), shading="nearest",
                                cmap="viridis")
        figure.colorbar(image, ax=axes, label=spec.zlabel)
    else:
        colours = ["#1f5fa8", "#c0392b", "#27ae60", "#8e44ad", "#d35400", "#16a085",
                   "#2c3e50", "#7f8c8d", "#f39c12", "#e84393"]
        x = np.array(spec.x)
        labels = spec.labels or [""] * len(spec.values)
        bands = spec.bands or [None] * len(spec.values)
        for i, (values, label, band) in enumerate(zip(spec.values, labels, bands,
                                                      strict=True)):
            colour = colours[i % len(colours)]
            y = np.array(values, dtype=np.float64)
            axes.plot(x, y, color=colour, linewidth=1.8, label=label or None)
            if band is not None:
                axes.fill_between(x, y - band, y + band, color=colour, alpha=0.18, linewidth=0,
                                  label="95% band (accuracy)" if i == 0 and not label else None)
        if any(labels) or any(b is not None for b in bands):
            axes.legend(fontsize=7, loc="best")
        axes.grid(alpha=0.3)
    axes.set_xlabel(spec.xlabel, fontsize=9)
    axes.set_ylabel(spec.ylabel, fontsize=9)
    axes.set_title(spec.title, fontsize=10)
    return figure


def bar_png(labels: Sequence[str], values: Sequence[float | None], errors: Sequence[Any],
            title: str) -> bytes:
    """``bar_figure`` as PNG."""
    return _png(bar_figure(labels, values, errors, title))


def bar_figure(labels: Sequence[str], values: Sequence[float | None], errors: Sequence[Any],
               title: str, ylabel: str = "") -> Any:
    """Bars with 95 % error bars for a released table (cells in release order).

    ``errors[i]`` is a half-width, a ``[below, above]`` pair, or None (no bar drawn,
    e.g. a mean whose noisy count is below 1).
    """
    drawn = [i for i, v in enumerate(values) if v is not None]
    heights = [float(values[i]) for i in drawn]  # type: ignore[arg-type]
    below, above = [], []
    for i in drawn:
        e = errors[i]
        lo, hi = (e, e) if not isinstance(e, list | tuple) else (e[0], e[1])
        below.append(float(lo or 0.0))
        above.append(float(hi or 0.0))
    figure = _figure(max(6.0, 0.35 * len(labels)))
    axes = figure.add_subplot()
    axes.bar(drawn, heights, yerr=[below, above], color="#1f5fa8", ecolor="#333333",
             capsize=3)
    axes.set_xticks(range(len(labels)), [str(x) for x in labels], rotation=60 if len(labels) > 8
                    else 0, fontsize=8)
    axes.set_title(title, fontsize=10)
    if ylabel:
        axes.set_ylabel(ylabel, fontsize=9)
    axes.grid(alpha=0.3, axis="y")
    return figure


def budget_png(series: dict[str, tuple[list[Any], dict[str, list[float]]]],
               title: str) -> bytes:
    """``budget_figure`` as PNG."""
    return _png(budget_figure(series, title))


#: tick labels by the locator's level (years, months, days, hours, minutes, seconds): each
#: says what it is (a second is 17:51:05, not 05)
TICK_FORMATS = ["%Y", "%b %Y", "%d %b", "%H:%M", "%H:%M", "%H:%M:%S"]


def budget_figure(series: dict[str, tuple[list[Any], dict[str, list[float]]]],
                  title: str) -> Any:
    """A dataset's budget over time, one panel per measure: committed and reserved
    stacked as steps under the cap (``service.console.burndown``). A measure nobody
    enabled (no cap, nothing ever held) gets no panel; ticks are clock times (seconds
    when the events span less than minutes), never bare numbers that read as days."""
    series = {m: (times, rows) for m, (times, rows) in series.items()
              if any(any(rows[k]) for k in ("cap", "committed", "reserved"))}
    # an inch per panel beyond three: names like interval_leakage:age stay apart
    figure = _figure(height=max(3.5, 0.8 + 0.9 * len(series)))
    if not series:
        axes = figure.add_subplot()
        axes.text(0.5, 0.5, "no budget events yet", ha="center", va="center")
        axes.set_axis_off()
        return figure
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    for i, (measure, (times, rows)) in enumerate(sorted(series.items())):
        axes = figure.add_subplot(len(series), 1, i + 1,
                                  sharex=figure.axes[0] if i else None)
        committed = np.array(rows["committed"])
        held = committed + np.array(rows["reserved"])
        axes.fill_between(times, 0, committed, step="post", color="#1f5fa8", alpha=0.8,
                          label="committed")
        axes.fill_between(times, committed, held, step="post", color="#f39c12", alpha=0.6,
                          label="reserved")
        axes.step(times, rows["cap"], where="post", color="#c0392b", label="cap")
        axes.set_ylabel(measure, fontsize=8, rotation=0, ha="right", va="center")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.tick_params(labelsize=7)
        locator = AutoDateLocator()  # readable ticks from seconds to years of events
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(ConciseDateFormatter(
            locator, formats=TICK_FORMATS, zero_formats=TICK_FORMATS[:1] + TICK_FORMATS[:-1]))
        axes.xaxis.get_offset_text().set_fontsize(7)
        axes.xaxis.get_offset_text().set_visible(i == len(series) - 1)  # one date line
        if i == 0:
            axes.set_title(title, fontsize=10)
            axes.legend(fontsize=7, loc="upper left")
    figure.axes[-1].set_xlabel("time (UTC)", fontsize=8)
    figure.autofmt_xdate()
    return figure


def analysis_figure(spec: AnalysisPlot) -> Any:
    """An analysis drawn from its ``AnalysisPlot``: bars with 95 % intervals, or the CDF
    plane with a step function and its cells, a fitted curve, or points with intervals."""
    if spec.kind == "bars":
        values = [None if math.isnan(v) else v for v in spec.values]
        errors = [None if i is None or v is None else [v - i[0], i[1] - v]
                  for v, i in zip(values, spec.intervals, strict=True)]
        figure = bar_figure(spec.labels, values, errors, spec.title, spec.ylabel)
        figure.axes[0].set_xlabel(spec.xlabel, fontsize=9)
        return figure
    from matplotlib.patches import Rectangle

    figure = _figure()
    axes = figure.add_subplot()
    for i, (left, right, below, above) in enumerate(spec.boxes):
        axes.add_patch(Rectangle((left, below), right - left, above - below,
                                 facecolor="#f39c12", alpha=0.35, linewidth=0,
                                 label="cells carrying mass" if i == 0 else None))
    if spec.steps:
        x = [spec.boxes[0][0] if spec.boxes else spec.steps[0][0]] + [p[0] for p in spec.steps]
        y = [0.0] + [p[1] for p in spec.steps]
        axes.step(x, y, where="post", color="#1f5fa8", linewidth=1.6,
                  label="F̂, mass at cell right ends")
    if spec.curve is not None:
        axes.plot(*spec.curve, color="#c0392b", linewidth=1.8, label=spec.curve_label or None)
    if spec.points is not None:
        pts = spec.points
        xerr = [[x - i[0] if i else 0.0 for x, i in zip(pts.x, pts.x_interval, strict=True)],
                [i[1] - x if i else 0.0 for x, i in zip(pts.x, pts.x_interval, strict=True)]]
        yerr = [[y - i[0] if i else 0.0 for y, i in zip(pts.y, pts.y_interval, strict=True)],
                [i[1] - y if i else 0.0 for y, i in zip(pts.y, pts.y_interval, strict=True)]]
        axes.errorbar(pts.x, pts.y, xerr=xerr, yerr=yerr, fmt="o", color="#1f5fa8",
                      ecolor="#333333", capsize=3, markersize=4, label=pts.label)
    axes.set_ylim(-0.02, 1.02)
    axes.autoscale(axis="x")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    if spec.notes:
        axes.text(0.01, 0.98, "; ".join(spec.notes), transform=axes.transAxes, fontsize=7,
                  va="top")
    axes.set_xlabel(spec.xlabel, fontsize=9)
    axes.set_ylabel(spec.ylabel, fontsize=9)
    axes.set_title(spec.title, fontsize=10)
    return figure
