"""One-dimensional reference distributions F as DIP uses them.

DIP needs two things from F (spec §3.4): the randomized probability
integral transform u = F(z−) + W·(F(z) − F(z−)), W ~ Unif(0, 1), which is
exactly uniform for z ~ F whether F is continuous, discrete or mixed; and
the generalized quantile F^←(g) = inf{z : F(z) >= g}, which maps a uniform
g back to an exact F-sample. Quantiles take both g and h = 1 − g so that
the upper tail is computed from h (``isf``) and never rounds to ±inf.

Parametric families are truncated to the column's declared bounds, so the
output always lies in the column's domain and still follows (truncated) F
exactly.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special, stats

from mechanisms.dip.continualize import MAX_FINITE, Continualizer, Continuous
from mechanisms.dip.search import Locator

FloatArray = NDArray[np.float64]
#: probabilities are kept at least this far from 0 so that no quantile is infinite
TINY = float(np.finfo(np.float64).tiny)
#: a truncation that keeps less mass than this is refused as numerically meaningless
MIN_MASS = 1e-12


class Univariate(abc.ABC):
    """A reference CDF for one column: randomized PIT forward, generalized quantile back."""

    #: True when values are integers (released as int64)
    integral: bool = False

    @abc.abstractmethod
    def clean(self, z: ArrayLike) -> NDArray[np.generic]:
        """Raw values into the domain (missing values count as the lowest value)."""

    @abc.abstractmethod
    def pit(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        """u = F(z−) + W·(F(z) − F(z−)) in [0, 1], W fresh; uniform when z ~ F."""

    @abc.abstractmethod
    def quantile(self, g: FloatArray, h: FloatArray) -> NDArray[np.generic]:
        """F^←(g), with h = 1 − g used for the upper tail; always finite."""


def _clip_unit(u: FloatArray) -> FloatArray:
    return np.clip(np.nan_to_num(u, nan=0.5), 0.0, 1.0)


# --------------------------------------------------------------------------- piecewise linear


class PiecewiseLinear(Univariate):
    """A CDF linear between knots (x_k, y_k) on a continualized axis, then the ceiling.

    Knots may repeat an x (a jump: ties in a hold-out act as atoms) or a y
    (a gap with no mass: empty histogram bins). This is eq. (7) for a
    hold-out or public sample, and the DP histogram's CDF.
    """

    def __init__(self, xs: ArrayLike, ys: ArrayLike, continualizer: Continualizer) -> None:
        x = np.asarray(xs, dtype=np.float64)
        y = np.asarray(ys, dtype=np.float64)
        if x.ndim != 1 or x.shape != y.shape or x.size < 2:
            raise ValueError("knots must be two 1-D arrays of the same length >= 2")
        if not (np.all(np.isfinite(x)) and np.all(np.diff(x) >= 0) and np.all(np.diff(y) >= 0)):
            raise ValueError("knots must be finite and non-decreasing")
        if y[0] != 0.0 or y[-1] != 1.0:
            raise ValueError("knot heights must run from 0 to 1")
        self.xs, self.ys, self.continualizer = x, y, continualizer
        self.integral = continualizer.integral
        dx, dy = np.diff(x), np.diff(y)
        # per segment k (knots k, k+1): slopes both ways, zero where a segment is degenerate
        self._dx, self._dy = dx, dy
        self._slope = np.divide(dy, dx, out=np.zeros_like(dx), where=dx > 0)
        self._inverse_slope = np.divide(dx, dy, out=np.zeros_like(dy), where=dy > 0)
        self._jumps = bool(np.any(dx == 0))
        # equal-width knots (histogram edges) are located by arithmetic: the CDF is continuous,
        # so a segment off by one at a boundary (rounding) gives the same value
        width = (x[-1] - x[0]) / dx.size
        self._even = bool(width > 0 and np.all(np.abs(dx - width) <= 1e-9 * width))
        self._inv_width = 1.0 / width if self._even else 0.0
        # knots spanning the continualizer's whole domain (a histogram on the declared bounds):
        # continualized clean values are inside already, so they need no clipping
        self._covers = bool(x[0] <= continualizer.lower and x[-1] >= continualizer.upper)

    # lookups are built on first use: a chain's later columns never need most of them
    @functools.cached_property
    def _x_right(self) -> Locator:
        return Locator(self.xs, "right")

    @functools.cached_property
    def _x_left(self) -> Locator:
        return Locator(self.xs, "left") if self._jumps else self._x_right

    @functools.cached_property
    def _y_left(self) -> Locator:
        return Locator(self.ys, "left")

    def clean(self, z: ArrayLike) -> NDArray[np.generic]:
        return self.continualizer.clean(z)

    def _interp(self, v: FloatArray, locate: Locator, inside: bool = False) -> FloatArray:
        # clipped into [x_0, x_m] a value lies in its located segment, so no further clipping
        # is needed; a search never lands on a zero-width segment (it skips ties)
        vv = v if inside else np.clip(v, self.xs[0], self.xs[-1])
        if self._even:
            # v = x_0 + (seg + frac)·width: the segment and the fraction of it by arithmetic
            frac = vv - self.xs[0]
            frac *= self._inv_width
            seg = frac.astype(np.intp)
            np.minimum(seg, self._dx.size - 1, out=seg)
            frac -= seg
            frac *= self._dy.take(seg)
            frac += self.ys.take(seg)
            return frac
        seg = locate(vv)
        out = vv - self.xs.take(seg)
        out *= self._slope.take(seg)
        out += self.ys.take(seg)
        return out  # in [0, 1] up to one rounding at the top knot (the noise step clamps)

    def cdf(self, v: FloatArray) -> FloatArray:
        """Ĉ(v) on the continualized axis (right-continuous)."""
        return self._interp(np.asarray(v, dtype=np.float64), self._x_right)

    def pit_continualized(self, v: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Ĉ(v−) + W·(Ĉ(v) − Ĉ(v−)) for continualized clean values (randomized at jumps)."""
        upper = self._interp(v, self._x_right, self._covers)
        if not self._jumps:
            return upper
        lower = self._interp(v, self._x_left)
        return lower + rng.random(v.shape) * (upper - lower)

    def pit(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        return self.pit_continualized(self.continualizer.draw(z, rng), rng)

    def quantile_continualized(self, g: FloatArray) -> FloatArray:
        """inf{v : Ĉ(v) >= g} for g in [0, 1]; a flat stretch (no mass) is never returned."""
        seg = self._y_left(g)
        out = g - self.ys.take(seg)
        out *= self._inverse_slope.take(seg)
        out += self.xs.take(seg)
        if not self._covers:  # else the ceiling clips to the domain, which the knots span
            np.clip(out, self.xs[0], self.xs[-1], out=out)
        return out

    def segment(self, v: FloatArray) -> NDArray[np.int64]:
        """Index of the segment (x_k, x_{k+1}] holding v (the first one for v <= x_0)."""
        return self._x_left(v)

    def quantile(self, g: FloatArray, h: FloatArray) -> NDArray[np.generic]:
        return self.continualizer.ceiling(self.quantile_continualized(g))


# --------------------------------------------------------------------------- scipy families


class _Truncated:
    """Mass of a scipy distribution below lo and above hi, from the accurate side."""

    def __init__(self, dist: stats.rv_continuous | stats.rv_discrete, lo: float, hi: float,
                 discrete: bool) -> None:
        self.dist = dist
        below = lo - 1.0 if discrete else lo  # P(Z < lo) for integer support
        self.f_lo = float(dist.cdf(below)) if math.isfinite(lo) else 0.0
        self.s_lo = float(dist.sf(below)) if math.isfinite(lo) else 1.0
        self.s_hi = float(dist.sf(hi)) if math.isfinite(hi) else 0.0
        self.f_hi = float(dist.cdf(hi)) if math.isfinite(hi) else 1.0
        # the mass inside [lo, hi], from whichever side has no cancellation
        self.mass = (self.f_hi - self.f_lo) if self.f_lo <= 0.5 else (self.s_lo - self.s_hi)
        if not self.mass > MIN_MASS:
            raise ValueError("the family puts (almost) no mass inside the declared bounds")
        self.lo, self.hi = lo, hi

    def cdf(self, x: FloatArray) -> FloatArray:
        """F_T(x) = P(Z <= x | lo <= Z <= hi)."""
        if self.f_lo <= 0.5:
            return (np.asarray(self.dist.cdf(x)) - self.f_lo) / self.mass
        return (self.s_lo - np.asarray(self.dist.sf(x))) / self.mass

    def quantile(self, g: FloatArray, h: FloatArray) -> FloatArray:
        p = np.clip(self.f_lo + g * self.mass, TINY, 1.0)
        q = np.clip(self.s_hi + h * self.mass, TINY, 1.0)
        low = p <= 0.5
        z = np.empty_like(p)
        with np.errstate(invalid="ignore"):
            z[low] = self.dist.ppf(p[low])
            z[~low] = self.dist.isf(q[~low])
        return z


class ParametricContinuous(Univariate):
    """A continuous scipy distribution truncated to [lower, upper]."""

    def __init__(self, dist: stats.rv_continuous, lower: float | None = None,
                 upper: float | None = None) -> None:
        self.domain = Continuous(lower, upper)
        self._t = _Truncated(dist, self.domain.lower, self.domain.upper, discrete=False)

    def clean(self, z: ArrayLike) -> FloatArray:
        return self.domain.clean(z)

    def cdf(self, x: FloatArray) -> FloatArray:
        return _clip_unit(self._t.cdf(x))

    def pit(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        return self.cdf(np.asarray(z, dtype=np.float64))

    def quantile(self, g: FloatArray, h: FloatArray) -> FloatArray:
        z = self._t.quantile(g, h)
        return self.domain.clean(np.where(np.isnan(z), np.where(g <= 0.5, -np.inf, np.inf), z))


class Normal(ParametricContinuous):
    """N(loc, scale²) truncated to [lower, upper], through ``special.ndtr``/``ndtri``.

    The same law as ``ParametricContinuous(stats.norm(loc, scale))`` without
    scipy's per-call overhead; the quantile inverts the smaller tail only,
    so one ``ndtri`` per value keeps both tails exact.
    """

    def __init__(self, loc: float = 0.0, scale: float = 1.0, lower: float | None = None,
                 upper: float | None = None) -> None:
        if not (math.isfinite(loc) and math.isfinite(scale) and scale > 0):
            raise ValueError("loc must be finite and scale positive")
        super().__init__(stats.norm(loc, scale), lower, upper)
        self.loc, self.scale = float(loc), float(scale)

    def cdf(self, x: FloatArray) -> FloatArray:
        z = (np.asarray(x, dtype=np.float64) - self.loc) / self.scale
        t = self._t
        if t.f_lo <= 0.5:
            u = special.ndtr(z)
            u -= t.f_lo
        else:
            u = special.ndtr(-z)
            np.subtract(t.s_lo, u, out=u)
        u /= t.mass
        return _clip_unit(u)

    def quantile(self, g: FloatArray, h: FloatArray) -> FloatArray:
        t = self._t
        p = t.f_lo + g * t.mass
        q = t.s_hi + h * t.mass
        upper = p > q
        tail = np.minimum(p, q)
        np.maximum(tail, TINY, out=tail)
        z = special.ndtri(tail)  # <= 0: the smaller tail's quantile
        z *= 1.0 - 2.0 * upper  # mirror for the upper tail
        z *= self.scale
        z += self.loc
        return self.domain.clean(z)


class ParametricDiscrete(Univariate):
    """An integer-valued scipy distribution truncated to the integers in [lower, upper]."""

    integral = True

    def __init__(self, dist: stats.rv_discrete, lower: float | None = None,
                 upper: float | None = None) -> None:
        lo, hi = dist.support()
        lo = max(float(lo), -math.inf if lower is None else math.ceil(lower))
        hi = min(float(hi), math.inf if upper is None else math.floor(upper))
        if not lo <= hi:
            raise ValueError("the family's support misses the declared bounds")
        self.lo, self.hi = lo, hi
        self._t = _Truncated(dist, lo, hi, discrete=True)

    def clean(self, z: ArrayLike) -> NDArray[np.int64]:
        x = np.asarray(z)
        lo = self.lo if math.isfinite(self.lo) else -(2.0**62)
        hi = self.hi if math.isfinite(self.hi) else 2.0**62
        if x.dtype.kind == "f":
            x = np.where(np.isnan(x), lo, np.rint(np.clip(x, lo, hi)))
        return np.clip(x, lo, hi).astype(np.int64)

    def pit(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        x = np.asarray(z, dtype=np.float64)
        left, right = self._t.cdf(x - 1.0), self._t.cdf(x)
        return _clip_unit(left + rng.random(x.shape) * (right - left))

    def quantile(self, g: FloatArray, h: FloatArray) -> NDArray[np.int64]:
        z = self._t.quantile(g, h)
        z = np.where(np.isnan(z), np.where(g <= 0.5, self.lo, self.hi), z)
        lo = self.lo if math.isfinite(self.lo) else -(2.0**62)
        hi = self.hi if math.isfinite(self.hi) else 2.0**62
        return np.clip(z, lo, hi).astype(np.int64)


class FinitePMF(Univariate):
    """Finitely many values with given probabilities (categorical codes, explicit pmfs)."""

    def __init__(self, support: Sequence[float] | ArrayLike, probs: Sequence[float] | ArrayLike
                 ) -> None:
        a = np.asarray(support, dtype=np.float64)
        p = np.asarray(probs, dtype=np.float64)
        if a.ndim != 1 or a.shape != p.shape or a.size == 0:
            raise ValueError("support and probs must be 1-D of the same length")
        if np.any(np.diff(a) <= 0) or not np.all(np.isfinite(a)):
            raise ValueError("support must be finite and strictly increasing")
        if np.any(p < 0) or not np.all(np.isfinite(p)) or not p.sum() > 0:
            raise ValueError("probs must be non-negative with a positive sum")
        self.support, self.probs = a, p / p.sum()
        self._right = np.cumsum(self.probs)
        self._right[-1] = 1.0
        self._left = self._right - self.probs
        self._last = int(np.flatnonzero(self.probs > 0)[-1])
        self.integral = bool(np.all(a == np.round(a)))

    def clean(self, z: ArrayLike) -> NDArray[np.generic]:
        x = np.asarray(z, dtype=np.float64)
        x = np.where(np.isnan(x), self.support[0], x)
        k = np.clip(np.searchsorted(self.support, x, side="left"), 0, self.support.size - 1)
        out = self.support[k]
        return out.astype(np.int64) if self.integral else out

    def pit(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        k = np.searchsorted(self.support, np.asarray(z, dtype=np.float64))
        k = np.clip(k, 0, self.support.size - 1)
        return _clip_unit(self._left[k] + rng.random(k.shape) * self.probs[k])

    def quantile(self, g: FloatArray, h: FloatArray) -> NDArray[np.generic]:
        k = np.minimum(np.searchsorted(self._right, g, side="left"), self._last)
        out = self.support[k]
        return out.astype(np.int64) if self.integral else out


class Mixture(Univariate):
    """Atoms a_j with masses w_j plus a continuous part (weight 1 − Σw), truncated to bounds.

    F(z) = w_c·F_c(z) + Σ_{a_j <= z} w_j; the quantile finds the atom whose
    jump contains g, or inverts the continuous part between atoms.
    """

    def __init__(self, atoms: Sequence[float], weights: Sequence[float],
                 continuous: ParametricContinuous | None) -> None:
        a = np.asarray(atoms, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        if a.ndim != 1 or a.shape != w.shape or a.size == 0:
            raise ValueError("atoms and weights must be 1-D of the same length")
        if np.any(np.diff(a) <= 0) or not np.all(np.isfinite(a)):
            raise ValueError("atoms must be finite and strictly increasing")
        if np.any(w <= 0) or w.sum() > 1.0 + 1e-12:
            raise ValueError("atom weights must be positive with sum at most 1")
        wc = max(0.0, 1.0 - float(w.sum()))
        if continuous is None and wc > 1e-12:
            raise ValueError("atom weights must sum to 1 without a continuous part")
        if continuous is not None and wc <= 1e-12:
            raise ValueError("atom weights leave no mass for the continuous part")
        self.atoms, self.weights, self.wc, self.cont = a, w, wc, continuous
        if continuous is not None:
            dom = continuous.domain
            if a[0] < dom.lower or a[-1] > dom.upper:
                raise ValueError("atoms must lie inside the declared bounds")
            fc = continuous.cdf(a)
        else:
            fc = np.zeros_like(a)
        cum_before = np.concatenate([[0.0], np.cumsum(w)[:-1]])
        self._left = wc * fc + cum_before  # F(a_j−)
        self._right = self._left + w  # F(a_j)
        self._below = cum_before  # atom mass below a_j
        self._above = float(w.sum()) - cum_before  # atom mass at or above a_j

    def clean(self, z: ArrayLike) -> FloatArray:
        if self.cont is not None:
            return self.cont.clean(z)
        return FinitePMF(self.atoms, self.weights).clean(z).astype(np.float64)

    def pit(self, z: NDArray[np.generic], rng: np.random.Generator) -> FloatArray:
        x = np.asarray(z, dtype=np.float64)
        below = np.searchsorted(self.atoms, x, side="left")  # #{a_j < x}
        k = np.clip(below, 0, self.atoms.size - 1)
        is_atom = self.atoms[k] == x
        mass_below = np.concatenate([self._below, [float(self.weights.sum())]])[below]
        cont = self.wc * self.cont.cdf(x) if self.cont is not None else np.zeros_like(x)
        jump = rng.random(x.shape) * self.weights[k]
        return _clip_unit(np.where(is_atom, self._left[k] + jump, cont + mass_below))

    def quantile(self, g: FloatArray, h: FloatArray) -> FloatArray:
        k = np.searchsorted(self._right, g, side="left")  # first atom with F(a_k) >= g
        kk = np.clip(k, 0, self.atoms.size - 1)
        at_atom = (k < self.atoms.size) & (g > self._left[kk])
        if self.cont is None:
            return self.atoms[np.minimum(k, self.atoms.size - 1)]
        below = np.concatenate([self._below, [float(self.weights.sum())]])[k]
        above = np.concatenate([self._above, [0.0]])[k]
        pc = np.clip((g - below) / self.wc, 0.0, 1.0)
        qc = np.clip((h - above) / self.wc, 0.0, 1.0)
        z = self.cont.quantile(pc, qc)
        return np.where(at_atom, self.atoms[kk], z)


def finite(x: FloatArray) -> FloatArray:
    """Replace any ±inf or NaN by the nearest finite extreme (outputs are always finite)."""
    return np.clip(np.nan_to_num(x, nan=0.0, posinf=MAX_FINITE, neginf=-MAX_FINITE),
                   -MAX_FINITE, MAX_FINITE)
