"""Fast segment lookups of many keys among one fixed sorted array of knots.

Binary search costs tens of nanoseconds per key (branch misses), which made
bin and knot lookups the most expensive part of DIP on large columns. A
lookup table over equal-width slots of the array's range gives each key a
lower-bound candidate; a couple of vectorised steps forward finish the
search, and the rare key that still needs more falls back to
``np.searchsorted``. Results are identical to the clipped ``np.searchsorted``
that every caller wants: the segment (knot pair) holding each key.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
MAX_SLOTS = 2**21
MIN_SLOTS = 1024
#: slots per array element: uneven arrays (a CDF's heights, dense where the mass is) need
#: many so that most keys land right; 64 (a 512 KB table for 1000 knots) measured fastest
SLOTS_PER_KEY = 64
#: vectorised correction steps before falling back to binary search
STEPS = 3


class Locator:
    """``locate(keys) == clip(np.searchsorted(array, keys, side) − 1, 0, len(array) − 2)``.

    That is the segment [a_s, a_{s+1}] holding each key, the first or last
    one for keys beyond the ends (with ``side="left"`` a key equal to a knot
    belongs to the segment on its left, with ``"right"`` to the one on its
    right).
    """

    def __init__(self, array: ArrayLike, side: str = "left") -> None:
        a = np.asarray(array, dtype=np.float64)
        if a.ndim != 1 or a.size < 2 or not np.all(np.isfinite(a)):
            raise ValueError("array must be 1-D, finite and have at least two knots")
        if side not in ("left", "right"):
            raise ValueError("side must be 'left' or 'right'")
        self.array, self.side = a, side
        self._last = a.size - 2
        self._lut: NDArray[np.intp] | None = None
        # probe[s] = a[s + 1], the knot a key must pass to be in a later segment; +inf for the
        # last segment, so stepping forward never leaves the array
        self._probe = np.append(a[1:-1], np.inf)
        span = float(a[-1] - a[0])
        if a.size < 8 or not (span > 0 and math.isfinite(span)):
            return
        slots = int(min(MAX_SLOTS, max(MIN_SLOTS, SLOTS_PER_KEY * a.size)))
        self._scale = slots / span
        # slot s covers keys from a[0] + s/scale; one slot back (the +1 below) keeps every
        # candidate at or before the answer despite rounding in the slot computation
        self._offset = float(a[0]) * self._scale + 1.0
        self._top = float(slots - 1)
        starts = float(a[0]) + np.arange(slots, dtype=np.float64) / self._scale
        # left-side candidates are lower bounds for either side
        self._lut = self._exact(starts, "left")

    def _exact(self, x: FloatArray, side: str) -> NDArray[np.intp]:
        seg: NDArray[np.intp] = np.searchsorted(self.array, x, side=side)  # type: ignore[call-overload]
        seg -= 1
        np.clip(seg, 0, self._last, out=seg)
        return seg

    def __call__(self, keys: ArrayLike) -> NDArray[np.intp]:
        """Segment of each key (finite values: clean data and probabilities)."""
        x = np.asarray(keys, dtype=np.float64)
        if self._lut is None or x.size < 64:
            return self._exact(x, self.side)
        slot = x * self._scale
        slot -= self._offset
        np.clip(slot, 0.0, self._top, out=slot)
        seg = self._lut.take(slot.astype(np.intp))
        step = np.less if self.side == "left" else np.less_equal
        # most candidates are already right: test all once, then step only the few behind
        todo = np.flatnonzero(step(self._probe.take(seg), x))
        for _ in range(STEPS):
            if todo.size == 0:
                return seg
            seg[todo] += 1
            todo = todo[step(self._probe.take(seg[todo]), x[todo])]
        if todo.size:
            seg[todo] = self._exact(x[todo], self.side)
        return seg


class Bins:
    """The cell index 0..B−1 of values among fixed edges e_0 < … < e_B (clipped at the ends).

    Equal-width edges (the usual histogram) are binned by arithmetic, with no
    search at all; a value within rounding of an inner edge may then land on
    either side of it, which is harmless wherever bins only group values
    (counts, and CDFs that are continuous across edges). Other edges use
    ``Locator``: cells (e_j, e_{j+1}], the first one closed.
    """

    def __init__(self, edges: ArrayLike) -> None:
        e = np.asarray(edges, dtype=np.float64)
        if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0) or not np.all(np.isfinite(e)):
            raise ValueError("edges must be finite and strictly increasing")
        self.edges, self.size = e, e.size - 1
        width = float(e[-1] - e[0]) / self.size
        self.even = bool(np.all(np.abs(np.diff(e) - width) <= 1e-9 * width))
        self._lo, self._inv = float(e[0]), 1.0 / width
        self._locate = None if self.even else Locator(e, "left")

    def __call__(self, values: ArrayLike) -> NDArray[np.intp]:
        """Cell of each (finite) value."""
        v = np.asarray(values, dtype=np.float64)
        if self._locate is not None:
            return self._locate(v)
        scaled = v - self._lo
        scaled *= self._inv
        j: NDArray[np.intp] = scaled.astype(np.intp)  # truncation: −1 < x < 0 gives 0
        np.clip(j, 0, self.size - 1, out=j)
        return j
