"""What a drawing of an analysis shows, from the analysis's public result only
(no matplotlib here: ``service.plotting`` draws an ``AnalysisPlot``).

* ``npmle``: F̂ as a step function (mass at each cell's right end, the result's
  ``cdf_convention``) and each cell carrying mass as a box from F̂ before it to F̂
  after it: inside a cell the ranges do not say where the mass lies, so every NPMLE's
  CDF passes through those boxes (the support, marked).
* ``mle``: the fitted CDF of the family truncated to ``truncated_to``.
* ``functionals``: the ``cdf`` and ``quantile`` functionals as points of the CDF plane
  with their bootstrap intervals (a quantile's interval is horizontal).
* subset ``estimate``: ŵ as bars with 95 % intervals ŵ ± 1.96·se.

A result with nothing of these to draw raises ValueError (the route answers 404).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Points:
    """Estimates drawn as points with intervals: ``x ± (x_lo, x_hi)`` along x
    (quantiles) or ``y`` within ``(y_lo, y_hi)`` (CDF values); None: no interval."""

    label: str
    x: list[float]
    y: list[float]
    x_interval: list[tuple[float, float] | None]
    y_interval: list[tuple[float, float] | None]


@dataclass(frozen=True)
class AnalysisPlot:
    """Everything a drawing of one analysis needs.

    ``cdf``: ``steps`` (x, F̂ after the jump at x) ascending, ``boxes`` (left, right,
    F before, F after) per cell carrying mass, ``curve`` (x, y) a continuous CDF,
    ``points``. ``bars``: ``labels``, ``values`` and 95 % ``intervals`` (None: none).
    """

    kind: Literal["cdf", "bars"]
    title: str
    xlabel: str
    ylabel: str
    steps: list[tuple[float, float]] = field(default_factory=list)
    boxes: list[tuple[float, float, float, float]] = field(default_factory=list)
    curve: tuple[list[float], list[float]] | None = None
    curve_label: str = ""
    points: Points | None = None
    labels: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    intervals: list[tuple[float, float] | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _num(x: Any) -> float | None:
    """A finite float, or None (JSON null stands for ±∞ or undefined)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _npmle(result: Mapping[str, Any], title: str) -> AnalysisPlot:
    cells, cdf = result.get("cells"), result.get("cdf")
    if not isinstance(cells, list) or not isinstance(cdf, list) or not cells \
            or len(cells) != len(cdf):
        raise ValueError("no NPMLE cells to draw")
    finite = [v for c in cells for v in (_num(c[0]), _num(c[1])) if v is not None]
    if not finite:
        raise ValueError("every NPMLE cell is unbounded")
    lo, hi = min(finite), max(finite)
    pad = 0.05 * (hi - lo) if hi > lo else 1.0
    steps, boxes, before = [], [], 0.0
    for (left, right), after in zip(cells, cdf, strict=True):
        a, b, f = _num(left), _num(right), float(after)
        boxes.append((lo - pad if a is None else a, hi + pad if b is None else b, before, f))
        if b is not None:
            steps.append((b, f))
        before = f
    notes = []
    tail = result.get("tail_mass") or {}
    for side, where in (("below_all_ends", "below every range end"),
                        ("above_all_ends", "above every range end")):
        mass = _num(tail.get(side))
        if mass:
            notes.append(f"mass {mass:.3g} {where}")
    return AnalysisPlot("cdf", title, "value", "F̂ (NPMLE)", steps=steps, boxes=boxes,
                        notes=notes)


def truncated_cdf(family: str, params: Mapping[str, float], support: tuple[float, float],
                  x: np.ndarray[Any, np.dtype[np.float64]]
                  ) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The fitted law's CDF truncated to ``support``, as ``mechanisms.interval.parametric``
    fits it: (G(x) − G(a)) / (G(b) − G(a)), clipped to [0, 1]."""
    if family == "lognormal":
        law = stats.lognorm(s=params["sdlog"], scale=math.exp(params["meanlog"]))
    elif family == "logistic":
        law = stats.logistic(loc=params["loc"], scale=params["scale"])
    elif family == "normal":
        law = stats.norm(loc=params["loc"], scale=params["scale"])
    else:
        raise ValueError(f"unknown family {family!r}")
    ga, gb = law.cdf(support[0]), law.cdf(support[1])
    if not gb > ga:
        raise ValueError("the fitted law has no mass on the support")
    out: np.ndarray[Any, np.dtype[np.float64]] = np.clip(
        (law.cdf(np.clip(x, *support)) - ga) / (gb - ga), 0.0, 1.0)
    return out


def _mle(result: Mapping[str, Any], title: str) -> AnalysisPlot:
    family, params = result.get("family"), result.get("params")
    if not isinstance(family, str) or not isinstance(params, Mapping):
        raise ValueError("no fitted family to draw")
    ends = result.get("truncated_to") or [None, None]
    a, b = _num(ends[0]), _num(ends[1])
    try:
        centre, spread = ((float(params["meanlog"]), float(params["sdlog"]))
                          if family == "lognormal"
                          else (float(params["loc"]), float(params["scale"])))
    except (KeyError, TypeError, ValueError):
        raise ValueError("the fitted parameters are incomplete") from None
    if family == "lognormal":
        lo, hi = math.exp(centre - 4 * spread), math.exp(centre + 4 * spread)
    else:
        lo, hi = centre - 4 * spread, centre + 4 * spread
    lo, hi = (lo if a is None else a), (hi if b is None else b)
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError("no finite range to draw the fit over")
    x = np.linspace(lo, hi, 400)
    support = (-math.inf if a is None else a, math.inf if b is None else b)
    y = truncated_cdf(family, {k: float(v) for k, v in params.items()}, support, x)
    shown = ", ".join(f"{k} = {float(v):.4g}" for k, v in params.items())
    return AnalysisPlot("cdf", title, "value", "F (fitted)",
                        curve=([float(v) for v in x], [float(v) for v in y]),
                        curve_label=f"{family} ({shown})")


def _interval(ci: Any) -> tuple[float, float] | None:
    if not isinstance(ci, Sequence) or len(ci) != 2:
        return None
    lo, hi = _num(ci[0]), _num(ci[1])
    return None if lo is None or hi is None else (lo, hi)


def _functionals(result: Mapping[str, Any], title: str) -> AnalysisPlot:
    xs: list[float] = []
    ys: list[float] = []
    x_int: list[tuple[float, float] | None] = []
    y_int: list[tuple[float, float] | None] = []
    for item in result.get("functionals") or []:
        value = _num(item.get("estimate"))
        if value is None:
            continue
        if item.get("type") == "cdf" and _num(item.get("t")) is not None:
            xs.append(float(item["t"]))
            ys.append(value)
            x_int.append(None)
            y_int.append(_interval(item.get("ci")))
        elif item.get("type") == "quantile" and _num(item.get("p")) is not None:
            xs.append(value)
            ys.append(float(item["p"]))
            x_int.append(_interval(item.get("ci")))
            y_int.append(None)
    if not xs:
        raise ValueError("no cdf or quantile functional to draw")
    level = (result.get("bootstrap") or {}).get("level", 0.95)
    points = Points(f"estimate, {100 * float(level):g} % bootstrap interval", xs, ys, x_int,
                    y_int)
    return AnalysisPlot("cdf", title, "value", "F̂", points=points)


def _bars(result: Mapping[str, Any], title: str) -> AnalysisPlot:
    w, labels, se = result.get("w"), result.get("categories"), result.get("se")
    if not isinstance(w, list) or not w:
        raise ValueError("no estimate to draw")
    if not isinstance(labels, list) or len(labels) != len(w):
        labels = [str(i) for i in range(len(w))]
    values = [float(v) if _num(v) is not None else math.nan for v in w]
    intervals: list[tuple[float, float] | None] = []
    for i, v in enumerate(values):
        s = _num(se[i]) if isinstance(se, list) and len(se) == len(w) else None
        intervals.append(None if s is None or math.isnan(v) else
                         (max(0.0, v - Z95 * s), min(1.0, v + Z95 * s)))
    column = result.get("column")
    return AnalysisPlot("bars", title, str(column) if column else "category",
                        "estimated share ŵ", labels=[str(x) for x in labels], values=values,
                        intervals=intervals)


def analysis_plot(analysis: str, result: Mapping[str, Any] | None,
                  title: str) -> AnalysisPlot:
    """The drawing of a succeeded ``analysis``'s ``result``; ValueError: nothing to draw."""
    if not isinstance(result, Mapping):
        raise ValueError("the analysis has no result")
    if analysis == "npmle":
        return _npmle(result, title)
    if analysis == "mle":
        return _mle(result, title)
    if analysis == "functionals":
        return _functionals(result, title)
    if analysis == "estimate" and "w" in result:
        return _bars(result, title)
    raise ValueError(f"{analysis} has no drawing")
