"""Released ranges as columnar pieces, and the set algebra the mechanisms need.

A released range is a union of at most P pieces; each piece has a left and a
right end and two closedness flags (the paper's convention is (l, r]; a
piece ending at a finite bound of the support is closed there). Arrays have
shape (n, P); an unused piece has NaN ends. Everything downstream (coverage,
NPMLE, regression) reads this one representation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


class Law(Protocol):
    """What coverage needs from a prior: the mass of pieces, and quantiles."""

    def cdf(self, x: ArrayLike) -> FloatArray: ...

    def ppf(self, q: ArrayLike) -> FloatArray: ...

    def mass(
        self, left: ArrayLike, right: ArrayLike, left_closed: ArrayLike, right_closed: ArrayLike
    ) -> FloatArray: ...


@dataclass(frozen=True)
class Pieces:
    """n ranges, each a union of up to P pieces (arrays of shape (n, P))."""

    left: FloatArray
    right: FloatArray
    left_closed: BoolArray
    right_closed: BoolArray

    @classmethod
    def single(
        cls, left: ArrayLike, right: ArrayLike, left_closed: ArrayLike = False,
        right_closed: ArrayLike = True,
    ) -> Pieces:
        """One piece per range; closedness broadcasts."""
        lo = np.asarray(left, dtype=np.float64).reshape(-1, 1)
        hi = np.asarray(right, dtype=np.float64).reshape(-1, 1)
        shape = lo.shape

        def flags(x: ArrayLike) -> BoolArray:
            a = np.asarray(x, bool)
            if a.ndim == 0:
                return np.full(shape, bool(a))
            return a.reshape(-1, 1).copy()

        return cls(lo, hi, flags(left_closed), flags(right_closed))

    @classmethod
    def concat(cls, parts: Sequence[Pieces]) -> Pieces:
        """Side by side: the union of the ranges of each part, row by row."""
        return cls(
            np.concatenate([p.left for p in parts], axis=1),
            np.concatenate([p.right for p in parts], axis=1),
            np.concatenate([p.left_closed for p in parts], axis=1),
            np.concatenate([p.right_closed for p in parts], axis=1),
        )

    @property
    def n(self) -> int:
        return int(self.left.shape[0])

    @property
    def width(self) -> int:
        return int(self.left.shape[1])

    def take(self, rows: NDArray[np.bool_] | NDArray[np.int64]) -> Pieces:
        return Pieces(
            self.left[rows], self.right[rows], self.left_closed[rows], self.right_closed[rows]
        )

    def where(self, mask: ArrayLike, other: Pieces) -> Pieces:
        """Row-wise choice: self where ``mask``, ``other`` elsewhere (same width)."""
        m = np.asarray(mask, bool).reshape(-1, 1)
        return Pieces(
            np.where(m, self.left, other.left),
            np.where(m, self.right, other.right),
            np.where(m, self.left_closed, other.left_closed),
            np.where(m, self.right_closed, other.right_closed),
        )

    def empty(self) -> BoolArray:
        """Pieces holding no point (NaN, reversed, or a degenerate half-open piece)."""
        lo, hi = self.left, self.right
        out: BoolArray = (
            np.isnan(lo) | np.isnan(hi) | (lo > hi)
            | ((lo == hi) & ~(self.left_closed & self.right_closed))
        )
        return out

    def normalized(self) -> Pieces:
        """Empty pieces blanked to NaN, non-empty ones packed to the left."""
        empty = self.empty()
        if self.width == 1:
            return Pieces(np.where(empty, np.nan, self.left), np.where(empty, np.nan, self.right),
                          self.left_closed & ~empty, self.right_closed & ~empty)
        order = np.argsort(empty, axis=1, kind="stable")
        take = np.take_along_axis
        lo = np.where(empty, np.nan, self.left)
        hi = np.where(empty, np.nan, self.right)
        lc = self.left_closed & ~empty
        rc = self.right_closed & ~empty
        return Pieces(take(lo, order, 1), take(hi, order, 1), take(lc, order, 1),
                      take(rc, order, 1))

    def contains(self, y: ArrayLike) -> BoolArray:
        """Row-wise: does range i hold y[i]?"""
        v = np.asarray(y, dtype=np.float64).reshape(-1, 1)
        above = np.where(self.left_closed, v >= self.left, v > self.left)
        below = np.where(self.right_closed, v <= self.right, v < self.right)
        out: BoolArray = np.any(above & below & ~self.empty(), axis=1)
        return out

    def mass(self, law: Law) -> FloatArray:
        """L(S) = P_Y(S) of each range under ``law`` (pieces are disjoint)."""
        m = law.mass(self.left, self.right, self.left_closed, self.right_closed)
        m = np.where(self.empty(), 0.0, m)
        out: FloatArray = np.clip(m.sum(axis=1), 0.0, 1.0)
        return out

    def clip(self, lo: float, hi: float) -> Pieces:
        """Intersect with the support [lo, hi]; a piece cut at a finite bound is closed there."""
        if lo == -np.inf and hi == np.inf:
            return self
        left = np.maximum(self.left, lo)
        right = np.minimum(self.right, hi)
        lc = np.where(self.left < lo, True, self.left_closed)
        rc = np.where(self.right > hi, True, self.right_closed)
        return Pieces(left, right, lc, rc).normalized()

    def minus(self, a: float, b: float) -> Pieces:
        """Remove the closed interval [a, b] (an exact-report range A) from every range."""
        lower = Pieces(self.left, np.minimum(self.right, a), self.left_closed,
                       np.where(self.right < a, self.right_closed, False))
        upper = Pieces(np.maximum(self.left, b), self.right,
                       np.where(self.left > b, self.left_closed, False), self.right_closed)
        # a piece entirely left of a (or right of b) survives as ``lower`` (``upper``) alone
        return Pieces.concat([lower, upper]).normalized().trimmed()

    def padded(self, width: int) -> Pieces:
        """Empty columns (NaN, open) appended up to ``width``: a normalized range's
        columns to a width fixed by public inputs (what ``trimmed`` dropped)."""
        extra = width - self.width
        if extra < 0:
            raise ValueError(f"{self.width} piece columns exceed the width {width}")
        if extra == 0:
            return self
        nan = np.full((self.n, extra), np.nan)
        shut = np.zeros((self.n, extra), bool)
        return Pieces(np.hstack([self.left, nan]), np.hstack([self.right, nan]),
                      np.hstack([self.left_closed, shut]), np.hstack([self.right_closed, shut]))

    def trimmed(self) -> Pieces:
        """Drop columns that are empty in every row."""
        keep = ~np.all(self.empty(), axis=0)
        if keep.all():
            return self
        if not keep.any():
            keep[0] = True
        return Pieces(self.left[:, keep], self.right[:, keep], self.left_closed[:, keep],
                      self.right_closed[:, keep])

    def half_open(self) -> tuple[FloatArray, FloatArray]:
        """Every piece as a float half-open (l, r] holding the same floats (for the NPMLE).

        [l, ...] becomes (prev(l), ...] and [..., r) becomes [..., prev(r)]; a point
        {y} becomes (prev(y), y], an atom cell.
        """
        lo = np.where(self.left_closed, np.nextafter(self.left, -np.inf), self.left)
        hi = np.where(self.right_closed, self.right, np.nextafter(self.right, -np.inf))
        empty = self.empty()
        return np.where(empty, np.nan, lo), np.where(empty, np.nan, hi)


def points(y: ArrayLike) -> Pieces:
    """Degenerate ranges {y}: exact reports."""
    return Pieces.single(y, y, True, True)


def whole_line(n: int, lo: float = -np.inf, hi: float = np.inf) -> Pieces:
    """The trivial range (a null record): the whole support."""
    return Pieces.single(np.full(n, lo), np.full(n, hi), np.isfinite(lo), True)
