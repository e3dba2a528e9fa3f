"""Quantizers: the deterministic maps that make a release noiselessly private.

Two shapes of one idea (Definition 3 of the paper): ``q`` bins
[e_0, e_1), …, [e_{q-2}, e_{q-1}), [e_{q-1}, e_q] (half-open, the last one
closed), each bin released as its midpoint. ``UniformQuantizer`` holds its
edges as exact fractions and indexes a scalar exactly (the aggregate query is
one number, so exactness is cheap and no float rounding can move a value to a
neighbouring bin). ``EdgeQuantizer`` holds float64 edges and indexes whole
arrays with ``np.searchsorted`` (the local release of a column of records):
its bins *are* the float intervals, so there is nothing to round.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

Number = Fraction | int | float


def _exact(x: Number, name: str) -> Fraction:
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"{name} must be finite")
    return Fraction(x)


@dataclass(frozen=True, init=False)
class UniformQuantizer:
    """``levels`` equal bins on [lower, upper], exact rational edges."""

    lower: Fraction
    upper: Fraction
    levels: int

    def __init__(self, lower: Number, upper: Number, levels: int) -> None:
        object.__setattr__(self, "lower", _exact(lower, "lower"))
        object.__setattr__(self, "upper", _exact(upper, "upper"))
        object.__setattr__(self, "levels", int(levels))
        if not self.lower < self.upper:
            raise ValueError("lower must be < upper")
        if self.levels < 1:
            raise ValueError("levels must be >= 1")

    @property
    def width(self) -> Fraction:
        return (self.upper - self.lower) / self.levels

    @property
    def edges(self) -> tuple[Fraction, ...]:
        """The ``levels + 1`` exact edges (a tuple of fractions: keep ``levels`` small)."""
        return tuple(self.lower + self.width * k for k in range(self.levels + 1))

    def index(self, y: Number) -> int:
        """0-based bin of ``y`` after clipping to [lower, upper]; exact."""
        v = min(max(_exact(y, "y"), self.lower), self.upper)
        return min(
            self.levels - 1, math.floor((v - self.lower) * self.levels / (self.upper - self.lower))
        )

    def bin(self, k: int) -> tuple[Fraction, Fraction]:
        """[left, right) of bin k (closed on the right for the last bin)."""
        if not 0 <= k < self.levels:
            raise IndexError("bin index out of range")
        span = self.upper - self.lower
        return self.lower + span * k / self.levels, self.lower + span * (k + 1) / self.levels

    def representative(self, k: int) -> Fraction:
        """The value released for bin k: its midpoint (any injective choice is free)."""
        left, right = self.bin(k)
        return (left + right) / 2

    def float_edges(self) -> NDArray[np.float64]:
        """The ``levels + 1`` edges as nondecreasing finite doubles, ends exact.

        Computed as lower + (k/q)·(upper − lower) with the span halved when it
        would overflow; each step is a monotone rounding, so the edges never
        decrease (a run of equal edges is an empty bin, which only lowers the
        number of outputs).
        """
        lo, hi = float(self.lower), float(self.upper)
        t = np.arange(self.levels + 1, dtype=np.float64) / self.levels
        span = hi - lo
        if math.isfinite(span):
            edges = lo + t * span
        else:
            edges = 2.0 * (lo / 2.0 + t * (hi / 2.0 - lo / 2.0))
        edges = np.clip(edges, lo, hi)
        edges[0], edges[-1] = lo, hi
        return np.maximum.accumulate(edges)


@dataclass(frozen=True, init=False)
class ExactEdgeQuantizer:
    """Bins between strictly increasing exact edges; indexes one scalar exactly.

    The non-uniform counterpart of ``UniformQuantizer`` for an aggregate: the
    query value is a fraction, the edges are fractions, so the bin is decided
    by exact comparisons (half-open bins, the last one closed, values clipped
    to [edges[0], edges[-1]]).
    """

    edges: tuple[Fraction, ...]

    def __init__(self, edges: tuple[Number, ...] | list[Number]) -> None:
        exact = tuple(_exact(e, "edges") for e in edges)
        if len(exact) < 2 or any(b <= a for a, b in itertools.pairwise(exact)):
            raise ValueError("edges must be strictly increasing, at least two")
        object.__setattr__(self, "edges", exact)

    @property
    def levels(self) -> int:
        return len(self.edges) - 1

    @property
    def lower(self) -> Fraction:
        return self.edges[0]

    @property
    def upper(self) -> Fraction:
        return self.edges[-1]

    @property
    def width(self) -> Fraction:
        """The widest bin."""
        return max(b - a for a, b in itertools.pairwise(self.edges))

    def index(self, y: Number) -> int:
        """0-based bin of ``y`` after clipping to [lower, upper]; exact."""
        v = min(max(_exact(y, "y"), self.lower), self.upper)
        return min(self.levels - 1, bisect.bisect_right(self.edges, v) - 1)

    def bin(self, k: int) -> tuple[Fraction, Fraction]:
        """[left, right) of bin k (closed on the right for the last bin)."""
        if not 0 <= k < self.levels:
            raise IndexError("bin index out of range")
        return self.edges[k], self.edges[k + 1]

    def representative(self, k: int) -> Fraction:
        """The value released for bin k: its midpoint."""
        left, right = self.bin(k)
        return (left + right) / 2


def _midpoints(edges: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each bin's midpoint, inside the bin, without overflow (a/2 + b/2 is always finite).

    Where the rounded midpoint of a half-open bin [a, b) lands on b (bins one
    ulp wide), the bin releases a instead, so bins never share an output.
    """
    left, right = edges[:-1], edges[1:]
    mids: NDArray[np.float64] = np.clip(left / 2.0 + right / 2.0, left, right)
    mids[:-1] = np.where(mids[:-1] >= right[:-1], left[:-1], mids[:-1])
    return mids


@dataclass(frozen=True, eq=False, init=False)
class EdgeQuantizer:
    """Bins between float64 edges (nondecreasing, at least two) and one output per bin.

    ``representatives`` default to the bins' midpoints; any other choice (one
    value per bin, inside it) is free post-processing (Theorem 7).
    """

    edges: NDArray[np.float64]
    representatives: NDArray[np.float64]

    def __init__(self, edges: ArrayLike, representatives: ArrayLike | None = None) -> None:
        array = np.array(edges, dtype=np.float64)
        if array.ndim != 1 or array.shape[0] < 2:
            raise ValueError("edges must be a 1-D list of at least two values")
        if not np.all(np.isfinite(array)):
            raise ValueError("edges must be finite")
        if np.any(np.diff(array) < 0) or not array[0] < array[-1]:
            raise ValueError("edges must be nondecreasing with edges[0] < edges[-1]")
        array.setflags(write=False)
        if representatives is None:
            reps = _midpoints(array)
        else:
            reps = np.array(representatives, dtype=np.float64)
            if reps.shape != (array.shape[0] - 1,) or not (
                np.all(reps >= array[:-1]) and np.all(reps <= array[1:])
            ):
                raise ValueError("one representative per bin, inside its bin")
        reps.setflags(write=False)
        object.__setattr__(self, "edges", array)
        object.__setattr__(self, "representatives", reps)

    @classmethod
    def uniform(cls, lower: Number, upper: Number, levels: int) -> EdgeQuantizer:
        """The float form of ``UniformQuantizer(lower, upper, levels)``."""
        return cls(UniformQuantizer(Fraction(lower), Fraction(upper), levels).float_edges())

    @property
    def levels(self) -> int:
        return int(self.edges.shape[0]) - 1

    @property
    def lower(self) -> float:
        return float(self.edges[0])

    @property
    def upper(self) -> float:
        return float(self.edges[-1])

    def index(self, x: ArrayLike) -> NDArray[np.intp]:
        """Bin of each value: clipped to [edges[0], edges[-1]], NaN as the lower end.

        A value equal to an edge goes to the bin on its right (half-open
        bins); the upper end goes to the last bin (closed).
        """
        values = np.asarray(x, dtype=np.float64)
        lo, hi = self.edges[0], self.edges[-1]
        nan = np.isnan(values)
        if nan.any():
            values = np.where(nan, lo, values)
        values = np.clip(values, lo, hi)
        idx = np.searchsorted(self.edges, values, side="right")
        idx -= 1
        np.minimum(idx, self.levels - 1, out=idx)
        return idx

    @property
    def outputs(self) -> NDArray[np.float64]:
        """The value released for each bin (the representatives)."""
        return self.representatives

    def quantize(self, x: ArrayLike) -> NDArray[np.float64]:
        """Each value replaced by its bin's representative (the released record)."""
        return self.outputs[self.index(x)]

    def nonempty_bins(self) -> NDArray[np.bool_]:
        """Which bins some real value in [edges[0], edges[-1]] falls in."""
        nonempty = self.edges[:-1] < self.edges[1:]
        nonempty[-1] = True  # the closed last bin holds at least edges[-1]
        return nonempty
