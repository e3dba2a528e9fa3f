"""Continualization: discrete and mixed values onto a continuous axis and back.

DIP needs a continuous CDF to be exactly invariant. A discrete value a_k is
spread uniformly over the cell (a_{k−1}, a_k] to its left (a_0 = a_1 − 1,
spec §3.3); for mixed data a unit interval is squeezed in to the left of
each atom (spec §3.4, with the corrected width U ~ Unif[0, 1)). The
generalized ceiling maps any point of a cell back to its value, so
``ceiling(forward(z, w)) == z`` for every w in [0, 1).

Each continualizer also cleans raw values into its domain (missing values
count as the lowest value, everything is clipped to the declared range) and
gives bin edges on the continualized axis that never split a discrete cell,
which the DP histogram reference uses.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
#: unbounded continuous values are clipped here so that no ±inf reaches a CDF
MAX_FINITE = 1e300


class Continualizer(abc.ABC):
    """Maps a column's values onto a continuous axis (``forward``) and back (``ceiling``)."""

    #: ends of the continualized domain (±inf when undeclared)
    lower: float
    upper: float
    #: True when ``ceiling`` returns integers (released as int64)
    integral: bool = False

    @abc.abstractmethod
    def clean(self, z: ArrayLike) -> NDArray[np.generic]:
        """Raw values into the domain: missing count as the lowest value, the rest clipped."""

    @abc.abstractmethod
    def forward(self, z: NDArray[np.generic], w: FloatArray) -> FloatArray:
        """Continualize clean values with uniforms w in [0, 1) (fresh per record)."""

    def draw(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        """``forward`` with fresh uniforms from ``rng``."""
        return self.forward(z, rng.random(np.shape(z)))

    @abc.abstractmethod
    def ceiling(self, v: FloatArray) -> NDArray[np.generic]:
        """The generalized ceiling: a continualized point back to its value."""

    @abc.abstractmethod
    def edges(self, bins: int) -> FloatArray:
        """At most ``bins`` + 1 increasing edges covering the domain, never splitting a cell."""

    def max_bins(self) -> int | None:
        """The most bins ``edges`` can make (None: unlimited)."""
        return None


def _above(v: FloatArray, floor: FloatArray) -> FloatArray:
    """v, but strictly above the cell's open lower end: z − w can round onto it when w -> 1."""
    return np.maximum(v, np.nextafter(floor, np.inf))


def _bound(value: float | None, default: float) -> float:
    return default if value is None else float(value)


class Continuous(Continualizer):
    """Identity on a continuous column, optionally bounded."""

    def __init__(self, lower: float | None = None, upper: float | None = None) -> None:
        self.lower = _bound(lower, -math.inf)
        self.upper = _bound(upper, math.inf)
        if not self.lower <= self.upper:
            raise ValueError("lower bound above upper bound")

    def clean(self, z: ArrayLike) -> FloatArray:
        x = np.asarray(z, dtype=np.float64)
        lo, hi = max(self.lower, -MAX_FINITE), min(self.upper, MAX_FINITE)
        out: FloatArray = np.clip(x, lo, hi)  # a new array; NaN passes through
        missing = np.isnan(out)
        if missing.any():
            out[missing] = self.lower if math.isfinite(self.lower) else 0.0
        return out

    def forward(self, z: NDArray[np.generic], w: FloatArray) -> FloatArray:
        return np.asarray(z, dtype=np.float64)

    def draw(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        return np.asarray(z, dtype=np.float64)  # nothing to spread: no draws

    def ceiling(self, v: FloatArray) -> FloatArray:
        lo, hi = max(self.lower, -MAX_FINITE), min(self.upper, MAX_FINITE)
        out: FloatArray = np.clip(v, lo, hi)  # quantiles are never NaN
        return out

    def edges(self, bins: int) -> FloatArray:
        if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
            raise ValueError("histogram edges need finite bounds")
        return np.linspace(self.lower, self.upper, bins + 1)


class Lattice(Continualizer):
    """The integers lo..hi; the cell of z is (z − 1, z] and the ceiling is ⌈v⌉."""

    integral = True

    def __init__(self, lo: int, hi: int) -> None:
        if hi < lo:
            raise ValueError("empty integer range")
        if max(abs(lo), abs(hi)) >= 2**52:
            raise ValueError("integer range beyond exact double arithmetic")
        self.lo, self.hi = int(lo), int(hi)
        self.lower, self.upper = float(lo - 1), float(hi)

    def clean(self, z: ArrayLike) -> NDArray[np.int64]:
        x = np.asarray(z)
        if x.dtype.kind == "f":
            x = np.where(np.isnan(x), self.lo, np.rint(np.clip(x, self.lo, self.hi)))
        return np.clip(x, self.lo, self.hi).astype(np.int64)

    def forward(self, z: NDArray[np.generic], w: FloatArray) -> FloatArray:
        x = np.asarray(z, dtype=np.float64)
        return _above(x - w, x - 1.0)

    def ceiling(self, v: FloatArray) -> NDArray[np.int64]:
        return np.clip(np.ceil(v), self.lo, self.hi).astype(np.int64)

    def edges(self, bins: int) -> FloatArray:
        size = self.hi - self.lo + 1
        bins = min(bins, size)
        j = np.arange(bins + 1, dtype=np.int64)
        return (self.lo - 1 + (j * size) // bins).astype(np.float64)

    def max_bins(self) -> int:
        return self.hi - self.lo + 1


class FiniteSupport(Continualizer):
    """Finitely many values a_1 < … < a_s; the cell of a_k is (a_{k−1}, a_k], a_0 = a_1 − 1."""

    def __init__(self, support: Sequence[float] | ArrayLike) -> None:
        a = np.asarray(support, dtype=np.float64)
        if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError("support must be a non-empty list of finite numbers")
        if np.any(np.diff(a) <= 0):
            raise ValueError("support must be strictly increasing")
        self.support = a
        self._cells = np.concatenate([[a[0] - 1.0], a])  # a_0, a_1, ..., a_s
        self.lower, self.upper = float(a[0] - 1.0), float(a[-1])
        self.integral = bool(np.all(a == np.round(a)))

    def clean(self, z: ArrayLike) -> FloatArray:
        """Values not in the support move up to the next support point (missing: a_1)."""
        x = np.asarray(z, dtype=np.float64)
        x = np.where(np.isnan(x), self.support[0], x)
        return self.ceiling(x)

    def forward(self, z: NDArray[np.generic], w: FloatArray) -> FloatArray:
        x = np.asarray(z, dtype=np.float64)
        k = np.searchsorted(self.support, x) + 1  # index into _cells
        below = self._cells[k - 1]
        return _above(x - w * (self._cells[k] - below), below)

    def ceiling(self, v: FloatArray) -> FloatArray:
        k = np.clip(np.searchsorted(self.support, v, side="left"), 0, self.support.size - 1)
        return self.support[k]

    def edges(self, bins: int) -> FloatArray:
        s = self.support.size
        bins = min(bins, s)
        j = np.arange(bins + 1, dtype=np.int64)
        return self._cells[(j * s) // bins]

    def max_bins(self) -> int:
        return int(self.support.size)


class Mixed(Continualizer):
    """Continuous values with atoms a_1 < … < a_s: a unit interval squeezed left of each atom.

    Non-atom z ↦ z + #{a_j < z}; atom a_k ↦ a_k + k − w ∈ (a_k + k − 1, a_k + k].
    The pieces tile the axis, so the inverse L0 is well defined (spec §3.4).
    """

    def __init__(
        self, atoms: Sequence[float] | ArrayLike, lower: float | None = None,
        upper: float | None = None,
    ) -> None:
        a = np.asarray(atoms, dtype=np.float64)
        if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError("atoms must be a non-empty list of finite numbers")
        if np.any(np.diff(a) <= 0):
            raise ValueError("atoms must be strictly increasing")
        self.base = Continuous(lower, upper)
        if a[0] < self.base.lower or a[-1] > self.base.upper:
            raise ValueError("atoms must lie inside the bounds")
        self.atoms = a
        self._bottoms = a + np.arange(a.size)  # a_k + k − 1 (k from 1)
        self.lower = self._map(self.base.lower)
        self.upper = self.base.upper + float(np.sum(a <= self.base.upper))

    def _map(self, x: float) -> float:
        return x + float(np.sum(self.atoms < x)) if math.isfinite(x) else x

    def clean(self, z: ArrayLike) -> FloatArray:
        return self.base.clean(z)

    def forward(self, z: NDArray[np.generic], w: FloatArray) -> FloatArray:
        x = np.asarray(z, dtype=np.float64)
        below = np.searchsorted(self.atoms, x, side="left")  # #{a_j < x}
        hit = np.clip(below, 0, self.atoms.size - 1)
        is_atom = self.atoms[hit] == x
        # atom a_k (k = below + 1): a_k + k − w; other values: x + below
        shifted = x + below
        return np.where(is_atom, _above(shifted + (1.0 - w), shifted), shifted)

    def ceiling(self, v: FloatArray) -> FloatArray:
        v = np.asarray(v, dtype=np.float64)
        j = np.searchsorted(self._bottoms, v, side="left")  # #{bottoms < v}
        k = np.clip(j - 1, 0, self.atoms.size - 1)
        in_atom = (j >= 1) & (v <= self._bottoms[k] + 1.0)
        return self.base.clean(np.where(in_atom, self.atoms[k], v - j))

    def edges(self, bins: int) -> FloatArray:
        """The continuous part's edges mapped to the axis, plus each atom's own unit cell."""
        cont = self.base.edges(bins)
        mapped = cont + np.searchsorted(self.atoms, cont, side="left")
        cells = np.concatenate([self._bottoms, self._bottoms + 1.0])
        return np.unique(np.concatenate([mapped, cells]))
