"""A reference estimated from a sample: a hold-out of the data, or a public dataset.

Univariate, this is eq. (7): the piecewise-linear interpolation of the ECDF
of the continualized sample, knots (d_0, 0), (d_k, k/m). Multivariate, it is
the paper's "box" construction, eqs. (9)–(10): each sample point q spreads
its mass 1/m over the cube between its own continualized values and the
next-lower order statistics in every column. The first column's value then
selects one sample point, and every later column is uniform inside that
point's cell — so released rows are near-copies of sample rows (spec §3.7,
§7.1). With a hold-out this is the paper's method and its caveat: hold-out
rows are protected only by not being released, never by DP.

Ties (spec §7.3): a continuous column of the sample with repeated values
(rounded money, ages in whole years) would give zero-width cells, and the
released values would then BE the repeated raw values (95 % of them on
rounded data). Ties are therefore jittered before the knots are made: every
copy of a repeated value spreads uniformly over its cell between the
midpoints to the neighbouring distinct sample values (clipped to the
declared bounds), with fresh uniforms per release. Declared atoms keep their
ties (they are public values). The jitter reads the reference sample only,
never the released rows, so the DP guarantee of the released rows
(conditional on the reference) is unchanged; the hold-out itself stays
outside DP.

Typos fixed (spec §3.7): the last branch of (9) is "0 if x_l <= d_{j−1,l}".
d_0, which the paper leaves open, is the declared lower bound when there is
one and d_1 − (d_m − d_1)/(m − 1) otherwise (spec §3.5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.dip.continualize import MAX_FINITE, Continualizer, Continuous, Mixed
from mechanisms.dip.reference import Reference
from mechanisms.dip.univariate import PiecewiseLinear

FloatArray = NDArray[np.float64]
#: the fixed, public permutation seed of the default hold-out split (not privacy noise)
SPLIT_SEED = 0x5EED_D1F0


def holdout_size(n_rows: int, fraction: float) -> int:
    """m = round(fraction · N): the number of hold-out rows (public, from N and the fraction)."""
    return round(fraction * n_rows)


def split_holdout(n_rows: int, fraction: float) -> NDArray[np.bool_]:
    """Boolean mask of hold-out rows: the first m rows of a fixed permutation of 0..N−1.

    The split is independent of the data, the same for every release of a
    dataset with the same N, and nested across fractions (a smaller hold-out
    is a subset of a larger one), so repeated releases never expose a
    different set of rows. Which rows are held out is public anyway: the
    released table names its rows.
    """
    m = holdout_size(n_rows, fraction)
    order = np.random.Generator(np.random.PCG64(SPLIT_SEED)).permutation(n_rows)
    mask = np.zeros(n_rows, dtype=bool)
    mask[order[:m]] = True
    return mask


def spread_ties(
    z: NDArray[np.generic], cont: Continualizer, rng: np.random.Generator
) -> NDArray[np.generic]:
    """Clean sample values with repeated continuous values jittered over their cells.

    A value v with neighbours v⁻ < v < v⁺ among the distinct sample values
    owns ((v⁻ + v)/2, (v + v⁺)/2]; the outermost values mirror their inner
    half-gap; a single distinct value owns (v − 1/2, v + 1/2]; all cells are
    clipped to the declared bounds. Only values occurring more than once and
    not declared atoms move, each copy to an independent uniform point of its
    cell. Discrete columns are untouched: their continualization already
    spreads them.
    """
    if not isinstance(cont, Continuous | Mixed):
        return z
    x = np.asarray(z, dtype=np.float64)
    values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    tied = counts[inverse] > 1
    if isinstance(cont, Mixed):
        tied &= ~np.isin(x, cont.atoms)
    if not tied.any():
        return z
    base = cont.base if isinstance(cont, Mixed) else cont
    lo_end, hi_end = max(base.lower, -MAX_FINITE), min(base.upper, MAX_FINITE)
    if values.size == 1:
        left, right = values - 0.5, values + 0.5
    else:
        mids = values[:-1] + (values[1:] - values[:-1]) / 2.0
        left = np.concatenate([[values[0] - (mids[0] - values[0])], mids])
        right = np.concatenate([mids, [values[-1] + (values[-1] - mids[-1])]])
    left, right = np.maximum(left, lo_end), np.minimum(right, hi_end)
    k = inverse[tied]
    out = x.copy()
    out[tied] = left[k] + rng.random(k.size) * (right[k] - left[k])
    return out


def lower_knot(sorted_v: FloatArray, lower: float) -> float:
    """d_0: the declared (continualized) lower end, else one mean spacing below d_1."""
    if math.isfinite(lower) and lower <= sorted_v[0]:
        return lower
    m = sorted_v.size
    spacing = (sorted_v[-1] - sorted_v[0]) / (m - 1) if m > 1 else 0.0
    return float(sorted_v[0] - (spacing if spacing > 0 else 1.0))


class Empirical(Reference):
    """The smoothed empirical reference of a sample (hold-out or public), eqs. (7)–(10)."""

    needs_upper_tail = False  # bounded: quantiles need g only

    def __init__(
        self,
        sample: Mapping[str, ArrayLike],
        continualizers: Mapping[str, Continualizer],
        rng: np.random.Generator,
    ) -> None:
        self.columns = tuple(sample)
        self.continualizers = {c: continualizers[c] for c in self.columns}
        sizes = {np.shape(sample[c]) for c in self.columns}
        if len(sizes) != 1 or len(next(iter(sizes))) != 1:
            raise ValueError("sample columns must be 1-D and of equal length")
        m = int(next(iter(sizes))[0])
        if m < 2:
            raise ValueError("the reference sample needs at least 2 rows")
        self.m = m
        self.knots: dict[str, FloatArray] = {}
        self.ranks: dict[str, NDArray[np.int64]] = {}
        self.marginals: dict[str, PiecewiseLinear] = {}
        heights = np.arange(m + 1, dtype=np.float64) / m
        for c in self.columns:
            cont = self.continualizers[c]
            clean = spread_ties(cont.clean(sample[c]), cont, rng)  # spec §7.3: no tied knots
            v = cont.forward(clean, rng.random(m))  # fresh U per sample row
            order = np.argsort(v, kind="stable")
            d = v[order]
            rank = np.empty(m, dtype=np.int64)
            rank[order] = np.arange(1, m + 1)  # ties broken by position: ranks distinct
            knots = np.concatenate([[lower_knot(d, cont.lower)], d])
            self.knots[c], self.ranks[c] = knots, rank
            self.marginals[c] = PiecewiseLinear(knots, heights, cont)
        # owner[c][j-1] = the sample point whose rank in column c is j
        self.owner = {c: np.argsort(self.ranks[c]) for c in self.columns}

    @property
    def lower(self) -> dict[str, float]:
        """d_0 per column (released values never fall below it)."""
        return {c: float(k[0]) for c, k in self.knots.items()}

    @property
    def upper(self) -> dict[str, float]:
        """d_m per column (released values never exceed it)."""
        return {c: float(k[-1]) for c, k in self.knots.items()}

    def clean(self, column: str, z: ArrayLike) -> NDArray[np.generic]:
        return self.continualizers[column].clean(z)

    def uniformize(
        self, data: Mapping[str, NDArray[np.generic]], order: Sequence[str],
        rng: np.random.Generator,
    ) -> FloatArray:
        first = order[0]
        n = int(np.shape(data[first])[0])
        u = np.empty((n, len(order)), dtype=np.float64)
        marginal = self.marginals[first]
        v = self.continualizers[first].draw(data[first], rng)
        u[:, 0] = marginal.pit_continualized(v, rng)
        if len(order) == 1:
            return u
        # the sample point whose first-column cell (d_{k-1}, d_k] holds v: eq. (9)'s q
        knots = self.knots[first]
        inside = (v > knots[0]) & (v <= knots[-1])
        q = self.owner[first][marginal.segment(v)]
        for t, c in enumerate(order[1:], start=1):
            v = self.continualizers[c].draw(data[c], rng)
            d = self.knots[c]
            j = self.ranks[c][q]
            lo, hi = d[j - 1], d[j]
            width = hi - lo
            frac = np.clip((v - lo) / np.where(width > 0, width, 1.0), 0.0, 1.0)
            cond = np.where(v <= lo, 0.0, np.where(v > hi, 1.0, frac))
            u[:, t] = np.where(inside, cond, 0.0)  # no such q: Ĉ(x_l | prefix) = 0
            inside &= (v > lo) & (v <= hi)
        return u

    def quantile(
        self, g: FloatArray, h: FloatArray, order: Sequence[str]
    ) -> dict[str, NDArray[np.generic]]:
        first = order[0]
        marginal = self.marginals[first]
        v = marginal.quantile_continualized(g[:, 0])
        out: dict[str, NDArray[np.generic]] = {first: marginal.continualizer.ceiling(v)}
        if len(order) == 1:
            return out
        # the privatized first value's cell picks the sample point the later columns follow
        k = np.clip(np.ceil(g[:, 0] * self.m), 1, self.m).astype(np.int64)
        q = self.owner[first][k - 1]
        for t, c in enumerate(order[1:], start=1):
            d = self.knots[c]
            j = self.ranks[c][q]
            v = d[j - 1] + g[:, t] * (d[j] - d[j - 1])
            out[c] = self.continualizers[c].ceiling(v)
        return out
