"""Cross-tabulations: count, bounded sum and mean per cell of ``group_by`` columns.

The cells are the product of the group-by columns' DECLARED categories, so
the cell set (and its size, refused above ``MAX_CELLS``) is public; a record
whose code is not a declared category falls in no cell.

Sensitivity under replace-one (DESIGN §3), exact. A replaced record leaves
cell a (or no cell) and enters cell b (or no cell), with value x before and y
after, x, y in the declared [lo, hi] (after clipping), M = max(|lo|, |hi|),
w = hi − lo:

* counts: cell a loses 1 and cell b gains 1, so L1 = 2 and L2 = √2 (a = b,
  or a record entering/leaving the cells, changes less);
* sums: a ≠ b changes two cells by −x and +y: L1 = |x| + |y| <= 2M and
  L2 = √(x² + y²) <= √2·M, both attained at x = y = ±M (the end of largest
  magnitude); a = b changes one cell by y − x: |y − x| <= w <= 2M. So
  L1 = 2M and L2 = max(√2·M, w) (w wins when lo < 0 < hi, e.g. [−1, 1]:
  L2 = 2). Cell sums cannot be centred at lo as the global sum is: the cell
  counts are private.
* means: the count table and the sum table, each with half of the budget
  (ε/2 each; for ``gaussian`` (ε/2, δ/2) each, basic composition); the mean of a
  cell is noisy sum / noisy count, clipped to [lo, hi] (post-processing; the
  true counts are never used). ``result.intervals`` holds, per cell, the
  means μ in [lo, hi] at which s − μ·c is within its noise's 95 % quantile (a
  pivot: ``ratio``): it contains the exact mean of a non-empty cell with
  probability >= 95 %, narrower than the box of the two 97.5 % intervals it
  replaced (kept when the count noise is too wide to sum over).

Lattice (DESIGN §6): counts and integer sums are exact integers (grid 1);
real sums are ``math.fsum`` of clipped doubles (|error| <= 2^-53·n·M, we
charge 2^-51·n·M; ``CellStatistic`` keeps them exact over batches of rows and rounds
once at release, which is fsum's value) rounded to a power-of-two grid g, and an entry moving by D
in real terms moves by at most floor((D + 2 err)/g) + 1 lattice units.

``consistency: true`` (free post-processing, stated in the result): counts
are projected in least squares onto {c >= 0, Σc <= n} (clip at 0; if the sum
still exceeds n, the projection onto the simplex of total n), then rounded to
integers by largest remainder keeping the rounded total; sums are clipped to
the sign the bounds force; margins are the sums of the released table, so
they agree with it by construction.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms import zcdp
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.columns import Condition, clean, declared_bounds
from mechanisms.dp import baselines, confidence, ratio, vectors
from mechanisms.dp.confidence import Confidence, percent
from mechanisms.dp.vectors import VectorNoise
from mechanisms.exact import float_down
from mechanisms.statistics import (
    Batch,
    Partial,
    Statistic,
    check_rows,
    float_sums,
    to_float,
    whole,
)

MAX_CELLS = 10_000
MAX_GROUP_BY = 4
#: a real sum's fsum error bound, per row and unit of M (2^-53 with a factor 4 to spare)
SUM_ERROR = Fraction(1, 2**51)


@dataclass(frozen=True)
class Part:
    """One noisy vector over the cells: the counts or the sums."""

    name: str  # "count" | "sum"
    grid: float  # lattice step (1 for counts and integer sums)
    integer: bool
    l1: int  # lattice L1 sensitivity
    l2sq: int  # lattice squared L2 sensitivity
    sensitivity_l1: Fraction  # statistic units, exact
    sensitivity_l2: float  # statistic units, rounded up
    err: Fraction  # public bound on each cell's floating-point error (statistic units)
    noise: VectorNoise
    epsilon: Fraction | None
    delta: Fraction | None
    #: this part's ρ on a zcdp dataset (then epsilon and delta are None)
    rho: Fraction | None = None

    def halfwidth(self, level: float = vectors.CI_LEVEL) -> float:
        """Half-width, statistic units, of the per-cell interval at ``level``."""
        rounding = 0.0 if self.integer else 0.5
        return (self.noise.halfwidth(level) + rounding) * self.grid + float(self.err)

    def accuracy(self) -> dict[str, Any]:
        l2 = self.noise.kind == "discrete_gaussian"
        out: dict[str, Any] = {
            "noise": self.noise.kind,
            "scale": self.noise.scale * self.grid,
            "sensitivity": self.sensitivity_l2 if l2 else float(self.sensitivity_l1),
            "sensitivity_norm": "l2" if l2 else "l1",
            "grid": self.grid,
            "grid_sensitivity": self.l2sq if l2 else self.l1,
            "ci95_halfwidth": self.halfwidth(),
        }
        if self.epsilon is not None:
            out["epsilon"] = float(self.epsilon)
        if self.delta is not None:
            out["delta"] = float(self.delta)
        if self.rho is not None:
            out["rho"] = float(self.rho)
        return out


@dataclass(frozen=True)
class TablePlan:
    """Everything about a cross-tab release that follows from public inputs."""

    statistic: str
    group_by: tuple[ColumnMeta, ...]
    shape: tuple[int, ...]
    n: int
    condition: Condition | None
    column: ColumnMeta | None
    bounds: tuple[Fraction, Fraction] | None
    consistency: bool
    count: Part | None
    sum: Part | None
    #: per-cell intervals (the default) or simultaneous ones (``mechanisms.dp.confidence``)
    confidence: Confidence = field(default_factory=Confidence)

    @property
    def cell_level(self) -> float:
        """The level each cell's interval is computed at."""
        return self.confidence.per_entry(self.cells)

    @property
    def cells(self) -> int:
        return math.prod(self.shape)

    def labels(self) -> list[list[str]]:
        cats = [list(c.categories or ()) for c in self.group_by]
        return [list(t) for t in itertools.product(*cats)]

    # -- data

    def first_pass(self) -> CellStatistic:
        return CellStatistic(self)

    def exact_from(self, partial: Partial) -> dict[str, NDArray[np.int64]]:
        """The lattice values of each part (no noise) from the merged partial: counts and
        integer sums as they are, real sums (exact, see ``CellStatistic``) rounded once to
        a double, as ``math.fsum`` of the cell's values gave, then to the grid."""
        check_rows(partial, self.n, self.group_by[0].name)
        out: dict[str, NDArray[np.int64]] = {}
        if self.count is not None:
            out["count"] = partial.vector("count")
        if self.sum is not None:
            if self.sum.integer:
                out["sum"] = partial.vector("sum")
            else:
                grid = self.sum.grid
                out["sum"] = np.array([round(to_float(t) / grid)
                                       for t in partial.parts["fsum"]], dtype=np.int64)
        return out

    def exact(self, data: Mapping[str, np.ndarray]) -> dict[str, NDArray[np.int64]]:
        """The lattice values of each part (no noise): what the noise is added to."""
        return self.exact_from(whole(self.first_pass(), data))

    # -- release

    def run(self, data: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, Any]:
        return self.release_from(whole(self.first_pass(), data), rng)

    def release_from(self, partial: Partial, rng: np.random.Generator) -> dict[str, Any]:
        exact = self.exact_from(partial)
        noisy: dict[str, NDArray[np.int64]] = {
            name: exact[name] + self._part(name).noise.sample(rng, self.cells)
            for name in ("count", "sum") if name in exact}
        return self.release(noisy)

    def _part(self, name: str) -> Part:
        part = self.count if name == "count" else self.sum
        assert part is not None
        return part

    def release(self, noisy: Mapping[str, NDArray[np.int64]]) -> dict[str, Any]:
        """Noisy lattice values -> the published table (post-processing only)."""
        counts = None if self.count is None else noisy["count"].astype(np.float64)
        sums = None
        if self.sum is not None:
            sums = noisy["sum"].astype(np.float64) * self.sum.grid  # exact: |v| < 2^52
        labels = self.labels()
        result: dict[str, Any] = {
            "group_by": [c.name for c in self.group_by],
            "shape": list(self.shape),
            "cells": labels,
            "categories": [" / ".join(t) for t in labels],
            "consistency": self.consistency,
        }
        if self.statistic == "mean":
            assert counts is not None and sums is not None
            result.update(self._means(counts, sums))
            return result
        raw = counts if counts is not None else sums
        assert raw is not None
        values = self._consistent(raw) if self.consistency else raw
        integer = self.statistic == "count" or self._part("sum").integer
        result["values"] = _out(values, integer)
        if self.consistency:
            result["noisy_values"] = _out(raw, integer)
        part = self._part(self.statistic)
        result["errors"] = [part.halfwidth(self.cell_level)] * self.cells
        result["margins"] = self._margins(values, integer)
        return result

    def _consistent(self, values: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.statistic == "count":
            return _round_keeping_total(project_counts(values, float(self.n)))
        assert self.bounds is not None
        lo, hi = self.bounds
        if lo >= 0:
            return np.maximum(values, 0.0)
        if hi <= 0:
            return np.minimum(values, 0.0)
        return values

    def _margins(self, values: NDArray[np.float64], integer: bool) -> dict[str, list[Any]]:
        table = values.reshape(self.shape)
        out = {}
        for axis, col in enumerate(self.group_by):
            others = tuple(a for a in range(len(self.shape)) if a != axis)
            out[col.name] = _out(table.sum(axis=others) if others else table, integer)
        return out

    def _means(self, counts: NDArray[np.float64], sums: NDArray[np.float64]) -> dict[str, Any]:
        assert self.bounds is not None and self.count is not None and self.sum is not None
        lo, hi = float(self.bounds[0]), float(self.bounds[1])
        base = _round_keeping_total(project_counts(counts, float(self.n))) \
            if self.consistency else counts
        means: list[float | None] = []
        for c, s in zip(base, sums, strict=True):
            means.append(None if c < 1 else float(min(max(s / c, lo), hi)))
        intervals = self._mean_intervals(counts, sums, lo, hi)
        out: dict[str, Any] = {
            "values": means,
            "counts": _out(counts, True),
            "sums": _out(sums, self.sum.integer),
            "intervals": intervals,
            "errors": [None if m is None else [max(m - a, 0.0), max(b - m, 0.0)]
                       for m, (a, b) in zip(means, intervals, strict=True)],
        }
        if self.consistency:
            out["consistent_counts"] = _out(base, True)
        return out

    def _mean_intervals(self, counts: NDArray[np.float64], sums: NDArray[np.float64],
                        lo: float, hi: float) -> list[list[float]]:
        """Each cell's interval at ``cell_level``: the pivot's (``ratio``), or, when the
        count noise is too wide to sum over, the box (sum and count each within theirs at
        (1 + level)/2, a union bound)."""
        assert self.count is not None and self.sum is not None
        pivot = ratio.quantiles(self.count.noise, self.sum.noise, self.sum.grid, lo, hi,
                                self.cell_level)
        if pivot is not None:
            edges, q = pivot
            slack = (0.0 if self.sum.integer else 0.5 * self.sum.grid) + float(self.sum.err)
            return [ratio.interval(float(c), float(s), edges, q, slack)
                    for c, s in zip(counts, sums, strict=True)]
        each = (1 + self.cell_level) / 2
        hc, hs = self.count.halfwidth(each), self.sum.halfwidth(each)
        return [mean_interval(c, s, hc, hs, lo, hi) for c, s in zip(counts, sums, strict=True)]

    def accuracy(self) -> dict[str, Any]:
        label = "count" if self.statistic == "count" else f"{self.statistic} of {self.column_name}"
        if self.statistic == "mean":
            assert self.count is not None and self.sum is not None
            level = percent(self.confidence.level)
            holds = (f"all {self.cells} intervals contain the exact means of their non-empty"
                     f" cells at once with probability at least {level}"
                     if self.confidence.simultaneous and self.cells > 1 else
                     f"each cell's interval contains the exact mean of the data clipped to"
                     f" the declared bounds with probability at least {level} when the cell"
                     f" is not empty{self.confidence.joint(self.cells, 'cell')}")
            statement = (
                f"Per-cell means are noisy sums / noisy counts (each of the two tables spends"
                f" half of the budget); result.intervals: {holds}. Noisy counts are"
                f" within ±{self.count.halfwidth():.6g} and noisy sums within"
                f" ±{self.sum.halfwidth():.6g} of the exact ones, each cell's with probability"
                f" at least 95%."
            )
            return {"cells": self.cells, "epsilon_split": "half to counts, half to sums",
                    "count": self.count.accuracy(), "sum": self.sum.accuracy(),
                    "confidence": self.confidence.document(self.cells),
                    "statement": statement, **self._consistency_note()}
        part = self._part(self.statistic)
        width = part.halfwidth(self.cell_level)
        level = percent(self.confidence.level)
        noise = (f"{'data clipped to the declared bounds, ' if self.statistic == 'sum' else ''}"
                 f"{part.noise.kind.replace('_', ' ')} noise of scale"
                 f" {part.noise.scale * part.grid:.6g} per cell")
        if self.confidence.simultaneous and self.cells > 1:
            statement = (
                f"With probability at least {level}, all {self.cells} noisy cells are at once"
                f" within ±{width:.6g} of the exact {label} of their cells (simultaneous"
                f" intervals, each at level {self.cell_level:.4%}; {noise}).")
        else:
            statement = (
                f"With probability at least {level}, each of the {self.cells} noisy cells is"
                f" within ±{width:.6g} of the exact {label} of its cell ({noise})"
                f"{self.confidence.joint(self.cells, 'cell')}.")
        return {"cells": self.cells, **part.accuracy(), "halfwidth": width,
                "confidence": self.confidence.document(self.cells), "statement": statement,
                **self._consistency_note()}

    @property
    def column_name(self) -> str:
        return self.column.name if self.column is not None else ""

    def _consistency_note(self) -> dict[str, Any]:
        if not self.consistency:
            return {}
        return {"consistency": (
            "values are post-processed (free): counts projected in least squares onto"
            " {c >= 0, sum <= n} and rounded to integers keeping the total, sums clipped to"
            " the sign the bounds force; the intervals above are for the noisy values"
            " (result.noisy_values), and the projection never increases the table's L2"
            " error")}


@dataclass(frozen=True)
class CellStatistic(Statistic):
    """The data pass of a cross-tab: per cell of the declared categories (row-major; a row
    with an undeclared code is in no cell), ``count`` (rows meeting the condition, if any),
    and ``sum`` (integer columns: the int sum of the clipped values, below 2**62 by
    ``_sum_part``) or ``fsum`` (real columns: the exact sum of the clipped doubles in units
    of 2**-SCALE, ``statistics.float_sums``)."""

    plan: TablePlan

    @property
    def columns(self) -> tuple[str, ...]:
        p = self.plan
        names = [c.name for c in p.group_by]
        if p.condition is not None:
            names.append(p.condition.column)
        if p.column is not None:
            names.append(p.column.name)
        return tuple(dict.fromkeys(names))

    def sizes(self) -> Mapping[str, int]:
        p = self.plan
        out = {}
        if p.count is not None:
            out["count"] = p.cells
        if p.sum is not None:
            out["sum" if p.sum.integer else "fsum"] = p.cells
        return out

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64] | Sequence[int]]:
        """One row-sized array per chunk (the cell index, built in place; a row in no
        cell is in the overflow cell ``cells``): a chunk's temporaries are what a
        10^8-row cross-tab allocates 1,500 times, and each one of 512 KiB may be mapped
        and faulted afresh by malloc (3x the CPU of the counts, measured)."""
        p = self.plan
        index: NDArray[np.int64] | None = None
        valid: NDArray[np.bool_] | None = None
        for col, k in zip(p.group_by, p.shape, strict=True):
            given = np.asarray(chunk[col.name])
            codes = given.astype(np.int64, copy=False)
            inside = (codes >= 0) & (codes < k)
            if index is None or valid is None:  # the first column: the index starts as it
                index, valid = codes.copy() if codes is given else codes, inside
            else:
                valid &= inside
                index *= k
                index += codes
        assert index is not None and valid is not None
        index[~valid] = p.cells
        out: dict[str, NDArray[np.int64] | Sequence[int]] = {}
        if p.count is not None:
            counted = index
            if p.condition is not None:
                keep = p.condition.mask(np.asarray(chunk[p.condition.column]))
                counted = np.where(keep, index, p.cells)
            out["count"] = np.bincount(counted, minlength=p.cells + 1)[:p.cells].astype(
                np.int64)
        if p.sum is not None:
            assert p.column is not None and p.bounds is not None
            x = np.asarray(chunk[p.column.name])
            lo, hi = p.bounds
            cell_rows = np.flatnonzero(valid)
            if p.sum.integer:
                if x.dtype.kind not in "iu":
                    raise TypeError(f"integer column {p.column.name!r} must hold integers")
                v = np.clip(x[cell_rows].astype(np.int64), int(lo), int(hi))
                sums = np.zeros(p.cells, dtype=np.int64)
                np.add.at(sums, index[cell_rows], v)
                out["sum"] = sums
            else:
                out["fsum"] = float_sums(clean(x[cell_rows], float(lo), float(hi)),
                                         index[cell_rows], p.cells)
        return out


# --------------------------------------------------------------------------- planning


def plan(mechanism: str, params: Mapping[str, Any], amounts: Mapping[str, Fraction],
         meta: DatasetMeta) -> TablePlan:
    """Resolve a cross-tab request against the metadata and calibrate its noise."""
    statistic = params["statistic"]
    names = list(params["group_by"])
    if len(set(names)) != len(names):
        raise MechanismInputError("params.group_by", "group_by names a column twice")
    group_by = []
    for name in names:
        col = meta.column(name, "params.group_by")
        if col.type != "categorical" or not col.categories:
            raise MechanismInputError(
                "params.group_by", f"column {name!r} is not categorical with declared categories")
        group_by.append(col)
    shape = tuple(len(c.categories or ()) for c in group_by)
    cells = math.prod(shape)
    if cells > MAX_CELLS:
        raise MechanismInputError(
            "params.group_by", f"the table would have {cells} cells; at most {MAX_CELLS}")
    n = meta.n_rows
    epsilon, delta, rho = amounts.get("epsilon"), amounts.get("delta"), amounts.get("rho")
    condition = column = bounds = count = total = None
    if statistic == "count":
        if "condition" in params:
            spec = params["condition"]
            condition = baselines.resolve_condition(
                spec, meta.column(spec["column"], "params.condition.column"))
        count = _count_part(mechanism, epsilon, delta, rho)
    else:
        column = meta.column(params["column"])
        bounds = declared_bounds(column, statistic)
        if mechanism == "geometric" and column.type != "integer":
            raise MechanismInputError(
                "params.column",
                f"geometric needs an integer column; {column.name!r} is {column.type}")
        if statistic == "mean":
            if n < 1:
                raise MechanismInputError("params.statistic", "mean of an empty dataset")
            # two releases compose: ε and δ add (approx DP), or ρ adds (zCDP)
            epsilon = None if epsilon is None else epsilon / 2
            delta = None if delta is None else delta / 2
            rho = None if rho is None else rho / 2
            count = _count_part(mechanism, epsilon, delta, rho)
        total = _sum_part(mechanism, column, bounds, n, epsilon, delta, rho)
    return TablePlan(statistic, tuple(group_by), shape, n, condition, column, bounds,
                     bool(params.get("consistency", False)), count, total,
                     confidence.read(params))


def _noise(mechanism: str, epsilon: Fraction | None, delta: Fraction | None, l1: int,
           l2sq: int, count_table: bool = False, rho: Fraction | None = None) -> VectorNoise:
    if mechanism == "gaussian":
        return vectors.gaussian_noise(epsilon, delta, l2sq, count_table=count_table, rho=rho)
    assert epsilon is not None
    return vectors.laplace_noise(epsilon, l1)


def _count_part(mechanism: str, epsilon: Fraction | None, delta: Fraction | None,
                rho: Fraction | None = None) -> Part:
    noise = _noise(mechanism, epsilon, delta, 2, 2, count_table=True, rho=rho)
    return Part("count", 1.0, True, 2, 2, Fraction(2), math.nextafter(math.sqrt(2), 3.0),
                Fraction(0), noise, epsilon, delta, rho)


def sum_sensitivity(lo: Fraction, hi: Fraction) -> tuple[Fraction, Fraction]:
    """Exact (L1, L2²) of a sum table with values in [lo, hi] (see the module doc)."""
    m = max(abs(lo), abs(hi))
    return 2 * m, max(2 * m * m, (hi - lo) ** 2)


def _sum_part(mechanism: str, column: ColumnMeta, bounds: tuple[Fraction, Fraction], n: int,
              epsilon: Fraction | None, delta: Fraction | None,
              rho: Fraction | None = None) -> Part:
    lo, hi = bounds
    m, w = max(abs(lo), abs(hi)), hi - lo
    l1_exact, l2sq_exact = sum_sensitivity(lo, hi)
    l2_exact = math.nextafter(math.sqrt(float(l2sq_exact)), math.inf)
    if column.type == "integer":
        if n * m >= baselines.INT_SUM_LIMIT:
            raise MechanismInputError("params.column", "declared bounds too wide for an exact sum")
        grid, err, um, uw = 1.0, Fraction(0), int(m), int(w)
    else:
        if rho is not None:  # a zcdp dataset (mechanisms.zcdp)
            scale = zcdp.sigma_real(l2_exact, rho)
        elif mechanism == "gaussian":
            assert epsilon is not None and delta is not None
            scale = baselines.analytic_gaussian_sigma(
                float_down(epsilon), float_down(delta), l2_exact)
        else:
            assert epsilon is not None
            scale = float_down(l1_exact / epsilon)
        grid = vectors.grid_for(float_down(w), scale)
        err = n * m * SUM_ERROR
        if n * m / Fraction(grid) >= baselines.LATTICE_LIMIT:
            raise MechanismInputError("params.column",
                                      "too many rows for exact lattice arithmetic")
        um, uw = vectors.units(m, err, grid), vectors.units(w, err, grid)
    l1, l2sq = max(2 * um, uw), max(2 * um * um, uw * uw)
    noise = _noise(mechanism, epsilon, delta, l1, l2sq, rho=rho)
    return Part("sum", grid, column.type == "integer", l1, l2sq, l1_exact, l2_exact, err,
                noise, epsilon, delta, rho)


# --------------------------------------------------------------------------- post-processing


def project_counts(values: NDArray[np.float64], total: float) -> NDArray[np.float64]:
    """Least-squares projection onto {c >= 0, Σc <= total}."""
    clipped = np.maximum(values, 0.0)
    if clipped.sum() <= total:
        return clipped
    if total <= 0:
        return np.zeros_like(clipped)
    # the sum constraint is active: project onto the simplex {c >= 0, Σc = total}
    u = np.sort(values)[::-1]
    cumulative = np.cumsum(u) - total
    k = np.arange(1, u.size + 1)
    positive = np.nonzero(u - cumulative / k > 0)[0]
    rho = int(positive[-1]) if positive.size else 0  # index 0 always qualifies, bar rounding
    theta = cumulative[rho] / (rho + 1)
    return np.maximum(values - theta, 0.0)


def _round_keeping_total(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Integers by largest remainder: non-negative inputs stay non-negative."""
    floors = np.floor(values)
    short = round(float(values.sum()) - float(floors.sum()))
    if short > 0:
        order = np.argsort(-(values - floors), kind="stable")[:short]
        floors[order] += 1.0
    return floors


def mean_interval(c: float, s: float, hc: float, hs: float, lo: float,
                  hi: float) -> list[float]:
    """All s'/c' with |s' − s| <= hs, |c' − c| <= hc, c' >= 1, within [lo, hi]."""
    c1, c2 = max(1.0, c - hc), c + hc
    if c2 < 1.0:
        return [lo, hi]
    ratios = [a / b for a in (s - hs, s + hs) for b in (c1, c2)]
    if max(ratios) < lo:  # the boxes missed the exact value: report the nearer end
        return [lo, lo]
    if min(ratios) > hi:
        return [hi, hi]
    return [max(min(ratios), lo), min(max(ratios), hi)]


def _out(values: NDArray[np.float64], integer: bool) -> list[Any]:
    if integer:
        return [int(v) for v in values]
    return [float(v) for v in values]
