"""Functionals of F from its NPMLE (spec §3.5, Example 1), with a bootstrap interval.

A functional is evaluated on the NPMLE's cell masses placed by a stated
convention (spec §3.3: the NPMLE fixes only each innermost cell's mass):

* ``cdf`` P(Y ≤ t) and ``probability`` P(a < Y ≤ b): linear, ∫ 1{·} dF̂;
* ``truncated_mean`` E[Y | a < Y ≤ b]: a ratio of two linear functionals;
* ``quantile`` inf{x : F̂(x) ≥ p} over the placed masses.

``cdf`` and ``quantile`` also get the range every NPMLE attains (mass anywhere in its
cell): the part of the answer the ranges cannot identify.

The interval is the percentile bootstrap over released records (refit the NPMLE on
a resample with replacement). It is consistent for smooth functionals ∫φ dF with
√n-rate (means over windows wider than the cells); pointwise F(t) and quantiles
converge at a cube-root rate where the plain bootstrap is known to be inconsistent
(Sen, Banerjee & Woodroofe 2010), so their intervals come with that warning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.interval.npmle import NPMLEResult
from mechanisms.interval.ranges import FloatArray

KINDS = ("cdf", "probability", "truncated_mean", "quantile")
#: the kinds whose percentile-bootstrap interval is not guaranteed (cube-root asymptotics)
NONSMOOTH = ("cdf", "quantile")


def _placed(res: NPMLEResult, convention: str, support: tuple[float, float]
            ) -> tuple[FloatArray, FloatArray]:
    """Positions and masses of the cells carrying mass (positions ascending)."""
    x, _ = res.atoms(convention, support)
    pos = res.mass > 0
    return x[pos], res.mass[pos]


def _window(spec: Mapping[str, Any]) -> tuple[float, float]:
    low = spec.get("low")
    high = spec.get("high")
    return (-math.inf if low is None else float(low), math.inf if high is None else float(high))


def values(res: NPMLEResult, specs: Sequence[Mapping[str, Any]], convention: str,
           support: tuple[float, float]) -> FloatArray:
    """Point estimates of ``specs`` under ``convention`` (NaN where undefined)."""
    x, m = _placed(res, convention, support)
    cum = np.cumsum(m)
    out = np.full(len(specs), np.nan)
    for i, spec in enumerate(specs):
        kind = spec["type"]
        if kind == "cdf":
            out[i] = float(m[x <= spec["t"]].sum())
        elif kind == "probability":
            a, b = _window(spec)
            out[i] = float(m[(x > a) & (x <= b)].sum())
        elif kind == "truncated_mean":
            a, b = _window(spec)
            inside = (x > a) & (x <= b)
            total = float(m[inside].sum())
            if total > 0:
                out[i] = float(np.dot(m[inside], x[inside]) / total)
        elif kind == "quantile":
            k = int(np.searchsorted(cum, spec["p"] * cum[-1] - 1e-12, side="left"))
            out[i] = float(x[min(k, x.shape[0] - 1)])
        else:
            raise ValueError(f"unknown functional {kind!r}")
    return out


def identified_range(res: NPMLEResult, spec: Mapping[str, Any],
                     support: tuple[float, float]) -> tuple[float, float] | None:
    """What every NPMLE gives for a cdf or quantile (None for other kinds)."""
    if spec["type"] == "cdf":
        lo, hi = res.cdf_bounds(np.array([spec["t"]]))
        return float(lo[0]), float(hi[0])
    if spec["type"] == "quantile":
        pos = res.mass > 0
        cum = np.cumsum(res.mass[pos])
        k = min(int(np.searchsorted(cum, spec["p"] * cum[-1] - 1e-12, side="left")),
                cum.shape[0] - 1)
        left = max(float(res.cell_left[pos][k]), support[0])
        right = min(float(res.cell_right[pos][k]), support[1])
        return left, right
    return None


def bootstrap(fit: Callable[[NDArray[np.int64]], NPMLEResult], n: int,
              specs: Sequence[Mapping[str, Any]], replicates: int, rng: np.random.Generator,
              convention: str, support: tuple[float, float]) -> tuple[FloatArray, int]:
    """``replicates`` × len(specs) bootstrap estimates (rows resampled with replacement;
    ``fit`` refits on row indices) and how many refits did not certify (their rows are
    NaN)."""
    out = np.full((replicates, len(specs)), np.nan)
    failed = 0
    for b in range(replicates):
        idx = rng.integers(0, n, n)
        res = fit(idx)
        if not res.converged:
            failed += 1
            continue
        out[b] = values(res, specs, convention, support)
    return out, failed


def percentile_interval(draws: FloatArray, level: float) -> list[tuple[float, float] | None]:
    """Per column: the (1 − level)/2 and (1 + level)/2 quantiles of the finite draws."""
    out: list[tuple[float, float] | None] = []
    for col in draws.T:
        ok = col[np.isfinite(col)]
        if ok.size < 2:
            out.append(None)
            continue
        lo, hi = np.quantile(ok, [(1 - level) / 2, (1 + level) / 2])
        out.append((float(lo), float(hi)))
    return out


# --------------------------------------------------------------------------- Table III


def cramer_distance(step_x: FloatArray, step_f: FloatArray,
                    other: Callable[[FloatArray], FloatArray], lo: float, hi: float,
                    other_steps: FloatArray | None = None, integer_grid: bool = False
                    ) -> float:
    """ED(F̂, F) = ∫_lo^hi (F̂(y) − F(y))² dy (Table III's "energy distance"; strictly the
    Cramér distance, half the energy distance).

    F̂ is the right-continuous step function with value ``step_f[i]`` from ``step_x[i]``
    on (0 before the first step). ``other`` is a CDF; when it is a step function too,
    pass its jump points as ``other_steps`` and the integral is exact; otherwise each
    piece where F̂ is constant is split into at most 4096 parts over [lo, hi] and
    integrated by Simpson's rule. ``integer_grid`` sums over the integers of [lo, hi]
    instead (the authors' code).
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError("the distance needs a finite domain")

    def f_hat(y: FloatArray) -> FloatArray:
        idx = np.searchsorted(step_x, y, side="right") - 1
        out: FloatArray = np.where(idx >= 0, step_f[np.clip(idx, 0, None)], 0.0)
        return out

    if integer_grid:
        grid = np.arange(math.ceil(lo), math.floor(hi) + 1, dtype=np.float64)
        return float(np.sum((f_hat(grid) - other(grid)) ** 2))
    breaks = [step_x[(step_x > lo) & (step_x < hi)]]
    if other_steps is not None:
        breaks.append(other_steps[(other_steps > lo) & (other_steps < hi)])
    edges = np.unique(np.concatenate([[lo, hi], *breaks]))
    if other_steps is not None:  # both constant on every piece: exact
        left = edges[:-1]
        diff = f_hat(left) - other(left)
        return float(np.sum(diff * diff * np.diff(edges)))
    fine = np.linspace(lo, hi, 4097)
    edges = np.union1d(edges, fine)
    a, b = edges[:-1], edges[1:]
    c = f_hat(a)  # F̂ is constant on [a, b)
    mid = 0.5 * (a + b)
    g = (c - other(a)) ** 2 + 4 * (c - other(mid)) ** 2 + (c - other(np.nextafter(b, a))) ** 2
    return float(np.sum(g * (b - a) / 6.0))


def step_cdf(res: NPMLEResult) -> tuple[FloatArray, FloatArray]:
    """The NPMLE's CDF as steps (mass at each cell's right end, the spec's convention)."""
    pos = res.mass > 0
    x = res.cell_right[pos]
    f = np.clip(np.cumsum(res.mass[pos]), 0.0, 1.0)
    keep = np.isfinite(x)
    return x[keep], f[keep]
