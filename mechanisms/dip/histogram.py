"""A reference from a differentially private histogram of the data itself (beyond the paper).

Spec §7.1(c): spend ε_ref on a DP estimate of F, then run DIP with the rest.
The estimate is a noisy (joint) histogram on the declared bounds: counts get
discrete Laplace noise of scale 2/ε_ref (replace-one moves one record between
two cells, L1 sensitivity 2), then are projected onto {c >= 0, Σc = N} (N is
public), which makes the CDF monotone. Within a cell the density is uniform
on the continualized axis, so each column's conditional CDF given earlier
columns is piecewise linear and depends on the prefix only through its
cell; integer columns are binned by whole integers, so a cell's mass is
spread evenly over the integers in it.

Both steps use the same rows, so the release is (ε_ref + ε_dip)-DP by
sequential composition, with no unprotected rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize

from mechanisms import sampling
from mechanisms.dip.continualize import Continualizer
from mechanisms.dip.reference import Reference
from mechanisms.dip.search import Bins
from mechanisms.dip.univariate import PiecewiseLinear
from mechanisms.exact import float_up
from mechanisms.statistics import Batch, Partial, Statistic

FloatArray = NDArray[np.float64]
#: the most cells a joint histogram may have (memory: a few float64 arrays of this size)
MAX_CELLS = 2**20
#: default bins per column are capped here
MAX_DEFAULT_BINS = 1024
#: rows counted together (their arrays stay in cache)
CHUNK_ROWS = 2**14
#: rows compared at once when searching per-record conditional CDFs
_CHUNK_ELEMENTS = 2**22


def mean_abs_noise(scale: float) -> float:
    """E|η| for discrete Laplace noise of ``scale``: 2α/(1 − α²), α = e^{−1/scale}."""
    alpha = math.exp(-1.0 / scale)
    return 2.0 * alpha / -math.expm1(-2.0 / scale)


def abs_noise_bound(scale: float, cells: int, level: float = 0.95) -> float:
    """t with P(Σ_cells |η| > t) <= 1 − level: a Chernoff bound (|η| has a closed-form MGF).

    E[e^{λ|η|}] = (1 − α)/(1 + α) · (1 + αe^λ)/(1 − αe^λ) for αe^λ < 1, so
    P(Σ|η| >= t) <= exp(C·log M(λ) − λt) for every such λ; the bound is the
    best t over λ, and never below the mean C·E|η|.
    """
    if not (0.0 < level < 1.0 and cells >= 1):
        raise ValueError("level must be in (0, 1) and cells at least 1")
    log_alpha = -1.0 / scale
    base = math.log(-math.expm1(log_alpha)) - math.log1p(math.exp(log_alpha))
    log_tail = math.log1p(-level)

    def t_of(lam: float) -> float:
        x = math.exp(log_alpha + lam)  # αe^λ < 1
        log_m = base + math.log1p(x) - math.log1p(-x)
        return (cells * log_m - log_tail) / lam

    top = -log_alpha
    res = optimize.minimize_scalar(
        t_of, bounds=(top * 1e-9, top * (1.0 - 1e-9)), method="bounded",
        options={"xatol": top * 1e-9},
    )
    return max(float(res.fun), cells * mean_abs_noise(scale))


def default_bins(
    n_rows: int, epsilon_ref: Fraction | float, continualizers: Sequence[Continualizer]
) -> list[int]:
    """Bins per column from public inputs (N, ε_ref, domains): the minimiser of the mean bound.

    For a column with range R and B bins of width R/B, the reference's mean
    is off the data's by at most R·(TV + 1/(2B)) (``mean_error_bound``):
    1/(2B) from spreading each bin's mass evenly, and TV <= C·E|η|/N from the
    noise of the C cells (expected). With k columns binned freely (each B)
    and the small finite domains' cells C_f fixed, C = C_f·B^k and the bound
    is smallest at B^{k+1} = N / (2·k·C_f·E|η|); for one column
    B = √(N/(2E|η|)), about √(N·ε_ref/4). More bins put noise mass into cells
    the data leave empty, which the projection keeps: a heavy-tailed column
    on wide bounds then gets a biased mean (issue #16: +3 % with 1,024 bins
    at N = 252,540, ε_ref = 0.5; 178 bins here). Columns with a small finite
    domain (categorical, narrow integer ranges) take one bin per value.
    """
    a = mean_abs_noise(noise_scale(epsilon_ref))
    fixed = [c.max_bins() for c in continualizers]
    small = [b for b in fixed if b is not None and b <= 64]
    free = sum(1 for b in fixed if b is None or b > 64)
    fixed_cells = math.prod(small) if small else 1
    if free:
        best = (n_rows / (2.0 * free * fixed_cells * a)) ** (1.0 / (free + 1))
        each = max(2, min(MAX_DEFAULT_BINS, math.floor(best)))
    else:
        each = 0
    out = []
    for b in fixed:
        if b is not None and b <= 64:
            out.append(b)
        else:
            out.append(each if b is None else min(each, b))
    return out


def project_simplex(noisy: ArrayLike, total: float) -> FloatArray:
    """Euclidean projection onto {c >= 0, Σc = total}: c = max(noisy − τ, 0)."""
    y = np.asarray(noisy, dtype=np.float64).ravel()
    if total <= 0:
        raise ValueError("total must be positive")
    s = np.sort(y)[::-1]
    cum = np.cumsum(s) - total
    idx = np.arange(1, s.size + 1)
    rho = int(np.flatnonzero(s - cum / idx > 0)[-1])
    tau = cum[rho] / (rho + 1)
    return np.maximum(y - tau, 0.0).reshape(np.shape(noisy))


class Histogram(Reference):
    """A joint histogram on the continualized axes: uniform density inside each cell."""

    needs_upper_tail = False  # bounded: quantiles need g only

    def __init__(
        self,
        continualizers: Mapping[str, Continualizer],
        edges: Mapping[str, ArrayLike],
        masses: ArrayLike,
    ) -> None:
        self.columns = tuple(continualizers)
        self.continualizers = dict(continualizers)
        self.edges = {c: np.asarray(edges[c], dtype=np.float64) for c in self.columns}
        mass = np.asarray(masses, dtype=np.float64)
        shape = tuple(e.size - 1 for e in self.edges.values())
        if mass.shape != shape:
            raise ValueError("masses must have one axis per column, one entry per bin")
        if np.any(mass < 0) or not np.all(np.isfinite(mass)) or not mass.sum() > 0:
            raise ValueError("masses must be finite, non-negative and not all zero")
        for e in self.edges.values():
            if e.size < 2 or np.any(np.diff(e) <= 0):
                raise ValueError("edges must be strictly increasing")
        self.masses = mass / mass.sum()
        self._tables: dict[tuple[str, ...], list[tuple[FloatArray, FloatArray]]] = {}
        self._marginals: dict[str, PiecewiseLinear] = {}
        self._bins = {c: Bins(e) for c, e in self.edges.items()}

    def clean(self, column: str, z: ArrayLike) -> NDArray[np.generic]:
        return self.continualizers[column].clean(z)

    def bin_of(self, column: str, v: FloatArray) -> NDArray[np.intp]:
        """Bin index of continualized values (see ``search.Bins`` for values on an edge)."""
        return self._bins[column](v)

    def _conditionals(self, order: tuple[str, ...]) -> list[tuple[FloatArray, FloatArray]]:
        """Per column in ``order``: (cell masses, cumulative masses) as (prefix cells, bins).

        Prefix cells without mass fall back to the column's marginal.
        """
        if order not in self._tables:
            axes = [self.columns.index(c) for c in order]
            joint = np.transpose(self.masses, axes)
            tables = []
            for t in range(len(order)):
                table = joint.sum(axis=tuple(range(t + 1, len(order))))
                table = table.reshape(-1, joint.shape[t])
                marginal = table.sum(axis=0)
                empty = table.sum(axis=1) <= 0
                table = np.where(empty[:, None], marginal[None, :], table)
                cum = np.concatenate(
                    [np.zeros((table.shape[0], 1)), np.cumsum(table, axis=1)], axis=1
                )
                tables.append((table, cum))
            self._tables[order] = tables
        return self._tables[order]

    def marginal(self, column: str) -> PiecewiseLinear:
        """The column's marginal CDF (the chain's first step), piecewise linear on the edges."""
        if column not in self._marginals:
            axis = self.columns.index(column)
            others = tuple(i for i in range(len(self.columns)) if i != axis)
            mass = self.masses.sum(axis=others)
            heights = np.concatenate([[0.0], np.cumsum(mass)])
            heights /= heights[-1]
            heights[-1] = 1.0
            self._marginals[column] = PiecewiseLinear(
                self.edges[column], heights, self.continualizers[column]
            )
        return self._marginals[column]

    def uniformize(
        self, data: Mapping[str, NDArray[np.generic]], order: Sequence[str],
        rng: np.random.Generator,
    ) -> FloatArray:
        order = tuple(order)
        first = self.marginal(order[0])
        v = self.continualizers[order[0]].draw(data[order[0]], rng)
        u0 = first.pit_continualized(v, rng)
        if len(order) == 1:
            return u0[:, None]
        u = np.empty((u0.size, len(order)), dtype=np.float64)
        u[:, 0] = u0
        prefix = self.bin_of(order[0], v)
        tables = self._conditionals(order)
        for t in range(1, len(order)):
            c = order[t]
            table, cum = tables[t]
            v = self.continualizers[c].draw(data[c], rng)
            j = self.bin_of(c, v)
            e = self.edges[c]
            frac = np.clip((v - e[j]) / (e[j + 1] - e[j]), 0.0, 1.0)
            before, mass, total = cum[prefix, j], table[prefix, j], cum[prefix, -1]
            u[:, t] = np.clip((before + frac * mass) / total, 0.0, 1.0)
            prefix = prefix * table.shape[1] + j
        return u

    def quantile(
        self, g: FloatArray, h: FloatArray, order: Sequence[str]
    ) -> dict[str, NDArray[np.generic]]:
        order = tuple(order)
        first = self.marginal(order[0])
        v = first.quantile_continualized(g[:, 0])
        out: dict[str, NDArray[np.generic]] = {order[0]: first.continualizer.ceiling(v)}
        if len(order) == 1:
            return out
        prefix = self.bin_of(order[0], v)
        tables = self._conditionals(order)
        for t in range(1, len(order)):
            c = order[t]
            table, cum = tables[t]
            bins = table.shape[1]
            target = g[:, t] * cum[prefix, -1]
            # first bin whose right cumulative mass reaches the target (it has mass)
            j = np.clip(_row_search(cum[:, 1:], prefix, target), 0, bins - 1)
            before, mass = cum[prefix, j], table[prefix, j]
            frac = np.clip((target - before) / np.where(mass > 0, mass, 1.0), 0.0, 1.0)
            e = self.edges[c]
            v = e[j] + frac * (e[j + 1] - e[j])
            out[c] = self.continualizers[c].ceiling(v)
            prefix = prefix * bins + j
        return out


def _row_search(
    right: FloatArray, rows: NDArray[np.int64], target: FloatArray
) -> NDArray[np.int64]:
    """For each record, the count of entries of its row of ``right`` below its target."""
    n, bins = rows.size, right.shape[1]
    out = np.empty(n, dtype=np.int64)
    step = max(1, _CHUNK_ELEMENTS // bins)
    for start in range(0, n, step):
        sl = slice(start, start + step)
        out[sl] = np.count_nonzero(right[rows[sl]] < target[sl, None], axis=1)
    return out


def histogram_counts(
    data: Mapping[str, NDArray[np.generic]],
    continualizers: Mapping[str, Continualizer],
    edges: Mapping[str, FloatArray],
) -> NDArray[np.int64]:
    """The exact joint histogram of the data, cleaned into each column's domain.

    A record's cell is the one holding the midpoint of its continualized
    cell (its value, for continuous columns); rows are counted in blocks.
    """
    counter = CellCounter(continualizers, edges)
    n = int(np.shape(data[counter.columns[0]])[0])
    counts = np.zeros(math.prod(counter.shape), dtype=np.int64)
    for start in range(0, n, CHUNK_ROWS):
        block = slice(start, start + CHUNK_ROWS)
        counts += counter({c: data[c][block] for c in counter.columns})
    return counts.reshape(counter.shape)


class CellCounter:
    """Counts of rows per joint cell (row-major), a block of rows at a time: the exact
    part of the histogram reference, so any engine counts it (``DipCells``)."""

    def __init__(self, continualizers: Mapping[str, Continualizer],
                 edges: Mapping[str, FloatArray]) -> None:
        self.columns = tuple(continualizers)
        self.continualizers = dict(continualizers)
        self.shape = tuple(int(edges[c].size) - 1 for c in self.columns)
        self.bins = {c: Bins(edges[c]) for c in self.columns}

    def __call__(self, block: Mapping[str, NDArray[np.generic]]) -> NDArray[np.int64]:
        flat: NDArray[np.intp] | None = None
        for c, size in zip(self.columns, self.shape, strict=True):
            cont = self.continualizers[c]
            z = cont.clean(block[c])
            j = self.bins[c](cont.forward(z, np.full(z.shape, 0.5)))
            flat = j if flat is None else flat * size + j
        assert flat is not None
        return np.bincount(flat, minlength=math.prod(self.shape)).astype(np.int64)


def noise_scale(epsilon_ref: Fraction | float) -> float:
    """Discrete Laplace scale 2/ε_ref, rounded up (histogram L1 sensitivity 2)."""
    return float_up(Fraction(2) / Fraction(epsilon_ref))


def dp_histogram(
    data: Mapping[str, NDArray[np.generic]],
    continualizers: Mapping[str, Continualizer],
    bins: Mapping[str, int],
    epsilon_ref: Fraction | float,
    rng: np.random.Generator,
) -> Histogram:
    """An ε_ref-DP histogram reference of ``data`` on the declared bounds (values are cleaned)."""
    edges = histogram_edges(continualizers, bins)
    return noisy_histogram(histogram_counts(data, continualizers, edges), continualizers,
                           edges, epsilon_ref, rng)


def histogram_edges(continualizers: Mapping[str, Continualizer], bins: Mapping[str, int]
                    ) -> dict[str, FloatArray]:
    """Each column's bin edges on its continualized axis (public)."""
    return {c: continualizers[c].edges(bins[c]) for c in continualizers}


def noisy_histogram(
    counts: NDArray[np.int64],
    continualizers: Mapping[str, Continualizer],
    edges: Mapping[str, FloatArray],
    epsilon_ref: Fraction | float,
    rng: np.random.Generator,
) -> Histogram:
    """The ε_ref-DP reference from the exact joint ``counts`` (shape: one axis per column)."""
    scale = noise_scale(epsilon_ref)
    if scale > sampling.MAX_SCALE:
        raise ValueError("epsilon too small for the histogram noise")
    noisy = counts + sampling.discrete_laplace(rng, scale, counts.shape)
    total = int(counts.sum())
    masses = project_simplex(noisy, float(total)) if total > 0 else np.ones(counts.shape)
    return Histogram(continualizers, edges, masses)


class CellStatistic(Statistic):
    """The joint histogram's exact counts (``counts``, row-major) as a mergeable pass:
    the same integers as ``histogram_counts`` however the rows are split."""

    def __init__(self, continualizers: Mapping[str, Continualizer],
                 edges: Mapping[str, FloatArray]) -> None:
        self.counter = CellCounter(continualizers, edges)

    @property
    def columns(self) -> tuple[str, ...]:
        return self.counter.columns

    def sizes(self) -> Mapping[str, int]:
        return {"counts": math.prod(self.counter.shape)}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64]]:
        return {"counts": self.counter(chunk)}

    def counts(self, partial: Partial) -> NDArray[np.int64]:
        """The counts as an array of one axis per column."""
        return partial.vector("counts").reshape(self.counter.shape)
