"""Pre-image transforms g for the pullback mechanism (Theorem 5).

The mechanism runs on g(Y): anchors live on the g-scale, and each released
range is the pre-image g⁻¹(R) on the data scale. Coverage on Y is at least
coverage on g(Y) (equal without an exact-report range), so charging the
g-scale leakage is never an undercharge.

Pre-image ends are computed in floating point and then widened outwards by a
data-independent few ulps, so a range always holds the value whose g-image
fell in R (widening is a function of the released anchors only: free
post-processing).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.base import MAX_ABS_BOUND, MechanismInputError, bounds_problem
from mechanisms.interval.ranges import FloatArray, Law, Pieces

EPS = 2.0**-52
NAMES = ("identity", "square", "abs", "log", "exp")


def _widen(x: FloatArray, direction: float, rel: FloatArray | float, absolute: float) -> FloatArray:
    step = np.abs(x) * rel + absolute
    out: FloatArray = np.where(np.isfinite(x), x + direction * step, x)
    return out


@dataclass(frozen=True)
class Transform:
    """A named measurable map with a pre-image for half-lines and pieces."""

    name: str = "identity"

    @property
    def identity(self) -> bool:
        return self.name == "identity"

    @property
    def domain(self) -> tuple[float, float]:
        """Where g is defined (open at a finite end for log)."""
        return (0.0, math.inf) if self.name == "log" else (-math.inf, math.inf)

    def forward(self, y: ArrayLike) -> FloatArray:
        y = np.asarray(y, dtype=np.float64)
        out: FloatArray
        if self.name == "identity":
            out = y
        elif self.name == "square":
            out = y * y
        elif self.name == "abs":
            out = np.abs(y)
        elif self.name == "log":
            with np.errstate(divide="ignore", invalid="ignore"):
                out = np.log(y)
        elif self.name == "exp":
            with np.errstate(over="ignore"):
                out = np.exp(y)
        else:  # pragma: no cover - names are validated by the schema
            raise ValueError(self.name)
        return out

    def image_support(self, lo: float, hi: float) -> tuple[float, float]:
        """g([lo, hi]) as an interval (g is monotone on each side of 0)."""
        if self.name in ("square", "abs"):
            ends = self.forward(np.array([lo, hi]))
            top = float(np.max(ends))
            bottom = 0.0 if lo <= 0.0 <= hi else float(np.min(ends))
            return bottom, top
        a, b = self.forward(np.array([lo, hi]))
        return float(a), float(b)

    def checked_image(self, lo: float, hi: float, column: str,
                      field: str = "params.transform") -> tuple[float, float]:
        """g([lo, hi]), refused unless it is itself a usable domain (``bounds_problem``).

        The mechanism runs on g(Y): an image that overflows (exp beyond 709, square
        beyond 1e50) or collapses to a point (exp far below 0) has no calibration or
        coverage, so it is a 4xx at POST rather than a NaN in the integrator.
        """
        if self.identity:
            return lo, hi
        with np.errstate(over="ignore", invalid="ignore"):
            image = self.image_support(lo, hi)
            if math.isfinite(lo) and math.isfinite(hi):
                problem = bounds_problem(*image)
            else:  # a prior without bounds: its tails are fine, finite ends must stay so
                ends = self.forward(np.array([x for x in (lo, hi) if math.isfinite(x)]))
                problem = None if image[0] < image[1] else "the image is empty"
                if not np.all(np.abs(ends) <= MAX_ABS_BOUND):
                    problem = f"bounds must lie within [-{MAX_ABS_BOUND:g}, {MAX_ABS_BOUND:g}]"
        if problem is not None:
            raise MechanismInputError(
                field, f"{self.name} maps the bounds of column {column!r} beyond what float64 "
                       f"can work with ({problem}); declare narrower bounds or another transform")
        return image

    def preimage(self, p: Pieces) -> Pieces:
        """g⁻¹ of every piece, on the data scale (square and abs double the width)."""
        if self.name == "identity":
            return p
        if self.name in ("log", "exp"):
            return self._monotone(p)
        return self._even(p)

    def _monotone(self, p: Pieces) -> Pieces:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.name == "log":  # y = exp(t); fl(log y) errs by |t|·eps at most
                lo, hi = np.exp(p.left), np.exp(p.right)
                lo = _widen(lo, -1.0, 4 * EPS * (np.abs(p.left) + 1.0), 0.0)
                hi = _widen(hi, 1.0, 4 * EPS * (np.abs(p.right) + 1.0), 0.0)
                left_open_at_zero = p.left == -np.inf
                lo = np.where(left_open_at_zero, 0.0, lo)
                lc = np.where(left_open_at_zero, False, p.left_closed)
                return Pieces(lo, hi, lc, p.right_closed).normalized()
            # exp: y = log(t) for t > 0; nothing below 0 is in the image
            lo = np.where(p.left <= 0.0, -np.inf, np.log(np.maximum(p.left, 0.0)))
            # fl(exp(y)) = 0 for y below log(2**-1075): the piece (l, 0] holds those y
            underflow = np.where((p.right == 0.0) & p.right_closed, -744.0, np.nan)
            hi = np.where(p.right <= 0.0, underflow, np.log(np.maximum(p.right, 0.0)))
            lo = _widen(lo, -1.0, 4 * EPS, 4 * EPS)
            hi = _widen(hi, 1.0, 4 * EPS, 4 * EPS)
            lc = np.where(p.left <= 0.0, False, p.left_closed)
            return Pieces(lo, hi, lc, p.right_closed).normalized()

    def _even(self, p: Pieces) -> Pieces:
        """square / abs: {y : l < g(y) <= r} = [-s(r), -s(l)) ∪ (s(l), s(r)] (s = g⁻¹ on y >= 0)."""
        root = np.sqrt if self.name == "square" else np.abs
        # y*y errs by a relative eps, and underflows to 0 below |y| = 2**-537
        rel, absolute = (4 * EPS, 2.0**-536) if self.name == "square" else (0.0, 0.0)
        with np.errstate(invalid="ignore"):
            s_hi = _widen(root(np.where(p.right >= 0.0, p.right, np.nan)), 1.0, rel, absolute)
            # l < 0 means every y with g(y) <= r: one closed piece [-s(r), s(r)]
            below_zero = (p.left < 0.0) | ((p.left == 0.0) & p.left_closed)
            s_lo = root(np.where(below_zero, 0.0, p.left))
            s_lo = np.where(below_zero, 0.0,
                            np.maximum(_widen(s_lo, -1.0, rel, absolute), 0.0))
        inner_closed = np.where(below_zero, True, p.left_closed)
        positive = Pieces(s_lo, s_hi, inner_closed, p.right_closed)
        negative = Pieces(-s_hi, -s_lo, p.right_closed, inner_closed)
        # l < 0: both halves meet at 0; keep one piece [-s(r), s(r)]
        merged = Pieces(-s_hi, s_hi, p.right_closed, p.right_closed)
        none = Pieces(np.full_like(s_hi, np.nan), np.full_like(s_hi, np.nan),
                      np.zeros_like(inner_closed), np.zeros_like(inner_closed))
        first = _choose(below_zero, merged, negative)
        second = _choose(below_zero, none, positive)
        return Pieces.concat([first, second]).normalized().trimmed()


def _choose(mask: NDArray[np.bool_], a: Pieces, b: Pieces) -> Pieces:
    return Pieces(
        np.where(mask, a.left, b.left),
        np.where(mask, a.right, b.right),
        np.where(mask, a.left_closed, b.left_closed),
        np.where(mask, a.right_closed, b.right_closed),
    )


@dataclass(frozen=True)
class PushforwardLaw:
    """The law of g(Y) when Y follows ``base``: mass of a g-piece = base mass of its pre-image."""

    base: Law
    transform: Transform
    support: tuple[float, float]

    def mass(self, left: ArrayLike, right: ArrayLike, left_closed: ArrayLike,
             right_closed: ArrayLike) -> FloatArray:
        lo = np.asarray(left, dtype=np.float64)
        hi = np.asarray(right, dtype=np.float64)
        shape = lo.shape
        flat = Pieces(lo.reshape(-1, 1), hi.reshape(-1, 1),
                      np.broadcast_to(np.asarray(left_closed, bool), shape).reshape(-1, 1),
                      np.broadcast_to(np.asarray(right_closed, bool), shape).reshape(-1, 1))
        out: FloatArray = self.transform.preimage(flat).mass(self.base).reshape(shape)
        return out

    def cdf(self, x: ArrayLike) -> FloatArray:
        t = np.asarray(x, dtype=np.float64)
        return self.mass(np.full_like(t, -np.inf), t, False, True)

    def ppf(self, q: ArrayLike) -> FloatArray:
        """Quantiles by vectorised bisection on the cdf (monotone maps: exactly g(ppf))."""
        q = np.asarray(q, dtype=np.float64)
        if self.transform.name in ("identity", "log", "exp"):
            out: FloatArray = self.transform.forward(self.base.ppf(q))
            return out
        lo_end, hi_end = self.support
        if not math.isfinite(hi_end):
            far = self.base.ppf(np.array([1e-15, 1.0 - 1e-15]))
            hi_end = float(np.max(self.transform.forward(far)))
        lo = np.full_like(q, lo_end)
        hi = np.full_like(q, hi_end)
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            below = self.cdf(mid) < q
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return hi

    @functools.cached_property
    def median(self) -> float:
        return float(self.ppf(np.array([0.5]))[0])

    @functools.cached_property
    def sd(self) -> float:
        from mechanisms.interval.priors import quantile_sd

        return quantile_sd(self.ppf, 1 << 12)
