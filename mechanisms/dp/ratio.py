"""Intervals for a ratio of two noisy totals: a cell's mean, noisy sum / noisy count.

A cell's released count is c = C + Z_c and its released sum s = S + g·Z_s + ρ, with Z_c
and Z_s independent integer noise of public law, g the sum's lattice step and |ρ| <= r
its public rounding bound. At the true mean μ = S/C, s − μ·c = ρ + g·Z_s − μ·Z_c, whose
law is public once μ is fixed (a pivot, as in Fieller's interval for a ratio). So
{μ in [lo, hi] : |s − μ·c| <= q(μ) + r}, q(μ) the level-quantile of |g·Z_s − μ·Z_c|,
holds the true mean with probability >= level whatever C >= 1 is. It spends the whole
miss on one event; the box it replaces (sum and count each within its interval at
(1 + level)/2, the union bound, and the ratio's extremes over the box's corners) spent
half on each and added their half-widths as if both noises were at their worst at once.

q is bounded on SEGMENTS equal pieces of [lo, hi]: on a piece of centre m and half-width
h, |g·Z_s − μ·Z_c| <= |g·Z_s − m·Z_c| + h·|Z_c| for each μ in it, and the tail of the
right side is summed exactly over Z_c's support, each noise's pmf truncated where its
tail is below TAIL (added to the miss). The result is the hull of the pieces' accepted
μ. The work follows from the noise scales alone (public); past MAX_SUPPORT points of
count noise the caller keeps the box.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mechanisms import sampling
from mechanisms.dp.vectors import VectorNoise

#: the pieces of [lo, hi] a quantile is bounded on
SEGMENTS = 32
#: the truncated tail of each noise's pmf (added to the miss, as is float rounding)
TAIL = 1e-7
ROUNDING = 1e-12
#: the largest count-noise support summed over (points); larger noise keeps the box
MAX_SUPPORT = 2**13
#: the largest sum-noise support held as a CDF (points)
MAX_SUM_SUPPORT = 2**21
_BISECTIONS = 16


@dataclass(frozen=True)
class Truncated:
    """A symmetric integer noise on −K..K: its pmf and CDF there, and P(|Z| > K) <= tail."""

    k: int
    pmf: NDArray[np.float64]
    cdf: NDArray[np.float64]
    tail: float

    def at_most(self, j: NDArray[np.int64]) -> NDArray[np.float64]:
        """Upper bounds on P(Z <= j)."""
        idx = np.clip(j + self.k, -1, 2 * self.k)
        inside = np.where(idx >= 0, self.cdf[np.maximum(idx, 0)], 0.0)
        return np.minimum(inside + self.tail / 2 + ROUNDING, 1.0)

    def above(self, j: NDArray[np.int64]) -> NDArray[np.float64]:
        """Upper bounds on P(Z > j) (symmetry: P(Z > j) = P(Z < −j) = P(Z <= −j − 1))."""
        return self.at_most(-j - 1)


def truncated(noise: VectorNoise, limit: int) -> Truncated | None:
    """The noise's pmf on −K..K with P(|Z| > K) <= TAIL, or None past ``limit`` points."""
    if noise.kind == "discrete_laplace":
        b = noise.scale
        p = math.exp(-1.0 / b)
        # P(|Z| > K) = 2 p^(K+1) / (1 + p)
        k = max(0, math.ceil(-b * math.log(TAIL * (1.0 + p) / 2.0)) - 1)
        tail = sampling.discrete_laplace_tail(b, k + 1)
        if 2 * k + 1 > limit:
            return None
        z = np.arange(-k, k + 1, dtype=np.float64)
        pmf = -math.expm1(-1.0 / b) / (1.0 + p) * np.exp(-np.abs(z) / b)
    else:
        sigma = noise.scale
        # the discrete Gaussian is σ²-subgaussian: P(|Z| > K) <= 2 exp(−(K+1)²/(2σ²))
        k = math.ceil(sigma * math.sqrt(2.0 * math.log(2.0 / TAIL)))
        tail = 2.0 * math.exp(-((k + 1) ** 2) / (2.0 * sigma * sigma))
        if 2 * k + 1 > limit:
            return None
        pmf = sampling.discrete_gaussian_pmf(sigma, np.arange(-k, k + 1))
    return Truncated(k, pmf, np.cumsum(pmf), tail)


def _miss(t: NDArray[np.float64], m: NDArray[np.float64], h: NDArray[np.float64], g: float,
          count: Truncated, total: Truncated, z: NDArray[np.int64]) -> NDArray[np.float64]:
    """Per piece (rows: t, centre m, half-width h), an upper bound on
    P(|g·Z_s − m·Z_c| + h·|Z_c| > t)."""
    u = t[:, None] - h[:, None] * np.abs(z)[None, :]
    x = m[:, None] * z[None, :]
    hi = np.floor((x + u) / g).astype(np.int64)
    lo = np.ceil((x - u) / g).astype(np.int64)
    inner = np.where(u < 0, 1.0, np.minimum(total.above(hi) + total.at_most(lo - 1), 1.0))
    out: NDArray[np.float64] = inner @ count.pmf + count.tail + ROUNDING
    return out


@functools.lru_cache(maxsize=64)
def quantiles(count: VectorNoise, total: VectorNoise, grid: float, lo: float, hi: float,
              level: float) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    """The pieces' edges and, per piece, a q with P(|g·Z_s − μ·Z_c| <= q) >= level for
    every μ in it; None when the count noise is too wide to sum over (keep the box).
    The pieces are bisected together (``_BISECTIONS`` halvings of each one's bracket)."""
    c = truncated(count, MAX_SUPPORT)
    s = truncated(total, MAX_SUM_SUPPORT)
    if c is None or s is None:
        return None
    alpha = 1.0 - level
    # the box's bound holds by the union bound: the search never goes past it
    each = (1.0 + level) / 2.0
    hs, hc = total.halfwidth(each) * grid, count.halfwidth(each)
    z = np.arange(-c.k, c.k + 1, dtype=np.int64)
    edges = np.linspace(lo, hi, SEGMENTS + 1)
    a, b = edges[:-1], edges[1:]
    m, h = (a + b) / 2.0, (b - a) / 2.0
    top = np.nextafter(hs + np.maximum(np.abs(a), np.abs(b)) * hc, np.inf)
    searched = _miss(top, m, h, grid, c, s, z) <= alpha  # else the box's bound stays
    bottom = np.zeros(SEGMENTS)
    for _ in range(_BISECTIONS):
        mid = (bottom + top) / 2.0
        fits = _miss(mid, m, h, grid, c, s, z) <= alpha
        top = np.where(searched & fits, mid, top)
        bottom = np.where(searched & ~fits, mid, bottom)
    return edges, top


def interval(c: float, s: float, edges: NDArray[np.float64], q: NDArray[np.float64],
             slack: float) -> list[float]:
    """The hull of {μ in the pieces : |s − μ·c| <= q(piece) + slack}; all of [lo, hi] when
    no μ qualifies (the miss event: the interval then says nothing)."""
    a, b = edges[:-1], edges[1:]
    width = q + slack
    if c == 0.0:
        keep = abs(s) <= width
        low, high = a, b
    else:
        ends = np.sort(np.stack([(s - width) / c, (s + width) / c]), axis=0)
        # the divisions round: widen by a few ulps so a μ on the boundary stays in
        pad = 4.0 * np.spacing(np.abs(ends) + np.abs(edges).max())
        low, high = np.maximum(a, ends[0] - pad[0]), np.minimum(b, ends[1] + pad[1])
        keep = low <= high
    if not np.any(keep):
        return [float(edges[0]), float(edges[-1])]
    return [float(np.min(low[keep])), float(np.max(high[keep]))]
