"""Sufficient statistics as exact, mergeable partials over batches of rows (issue #30).

A mechanism whose input reduces to sufficient statistics (counts, bounded sums, histograms,
cell tables, rank counts, moments) names a ``Statistic``: ``empty()`` is the partial of no
rows, ``update(partial, batch)`` adds a batch (some rows of the needed columns) and
``merge(a, b)`` adds two partials. A ``Partial`` holds only Python integers (a row count
and named integer vectors; a later pass also carries what it took from the earlier ones)
and merging adds them, so it is associative and commutative bit for bit, small (public
sizes), and pickles or goes to JSON as it is: any engine (a worker reading Parquet
batches, Spark aggregations) computes the same partial however it splits and orders the
rows, in memory bounded by its batch. ``StreamingMechanism`` (base) turns the final
partial into the release.

Sums of doubles are kept exactly (``float_sums``): a finite double is ``M·2**(e−53)`` with
``M = frexp mantissa·2**53`` an integer and ``e >= −1073`` its frexp exponent, so every
double is ``M·2**(e + 1073)`` units of ``2**−SCALE``, ``SCALE = 1073 + 53``, with
``e + 1073 >= 0``: every finite sum of doubles is an integer number of those units. Per
chunk the mantissas are added per exponent in 26-bit halves (float64 bin sums of at most
CHUNK values below 2**27: exact integers below 2**43), then shifted and added as Python
integers, so the partial holds that integer exactly. ``to_float`` rounds it once (Python's
int / int division is correctly rounded, half to even), which is what ``math.fsum``
returns on the same doubles (CPython's fsum is correctly rounded too; the unit tests check
the equality on adversarial doubles: subnormals, huge and tiny mixed, ties). So a statistic
that used ``fsum`` over whole columns gives the same bits from any batches, whereas an
fsum of per-batch fsums rounds twice and depends on the split.

A column that holds several cells per row (a functional column's grid points) comes as
(rows, width) batches (``Statistic.widths``), and ``column_sums`` gives the exact sums of
every column of such a block at once (error-free extraction, the rest by ``float_sums``).
``Joint`` reads several statistics together, each pass once for all of them.

A statistic that needs a second look at the rows with a value from the first (the
two-pass sample covariance centres on the mean; an exact median selects digit by digit,
``mechanisms.selection``) names the next pass with ``then``: the passes are a fixed,
public sequence, each an aggregation of its own.
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

Batch = Mapping[str, np.ndarray]

#: rows an update reads at a time: its scratch arrays are O(CHUNK) whatever the batch
CHUNK = 1 << 16
#: exact sums of doubles are integers in units of 2**-SCALE (see the module doc)
SCALE = 1073 + 53
_EMIN = -1073  # the smallest frexp exponent of a non-zero double (2**-1074 = 0.5·2**-1073)
_EMAX = 1024
_NEXP = _EMAX - _EMIN + 1
#: a mantissa |M| < 2**53 is summed as two halves below 2**27: CHUNK of them add up exactly
#: in the float64 accumulator of ``np.bincount`` (|total| <= 2**43 < 2**53)
_HALF = 26
#: above this many (group, exponent) cells the per-chunk table is sparse (np.unique): a
#: dense one is zeroed per chunk, so it stays below a chunk's own size
_DENSE_KEYS = 1 << 16


@dataclass(frozen=True)
class Partial:
    """Exact integer statistics of some rows: how many, and named vectors that add.

    ``carry`` is what a later pass took from the earlier ones (e.g. the selected digits of
    an order statistic): the same in every partial of the pass, kept by a merge, so the
    last pass's partial is all its release needs.
    """

    rows: int
    parts: Mapping[str, tuple[int, ...]]
    carry: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def merge(self, other: Partial) -> Partial:
        """The partial of both row sets: integers add, so any order and grouping agree."""
        if {k: len(v) for k, v in self.parts.items()} != \
                {k: len(v) for k, v in other.parts.items()} or self.carry != other.carry:
            raise ValueError("partials of different statistics or passes do not merge")
        return Partial(self.rows + other.rows, {
            name: tuple(a + b for a, b in zip(mine, other.parts[name], strict=True))
            for name, mine in self.parts.items()}, self.carry)

    def vector(self, name: str) -> NDArray[np.int64]:
        """A part as int64 (counts and sums the plans bound below 2**63)."""
        return np.array(self.parts[name], dtype=np.int64)

    def to_json(self) -> str:
        return json.dumps({"rows": self.rows,
                           "parts": {k: list(v) for k, v in self.parts.items()},
                           "carry": {k: list(v) for k, v in self.carry.items()}})

    @staticmethod
    def from_json(text: str) -> Partial:
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("rows"), int):
            raise ValueError("not a partial")
        return Partial(raw["rows"], _vectors(raw.get("parts")), _vectors(raw.get("carry", {})))


def _vectors(raw: object) -> dict[str, tuple[int, ...]]:
    """Named integer vectors read back from JSON (anything else is refused)."""
    if not isinstance(raw, dict) or not all(
            isinstance(v, list) and all(type(i) is int for i in v) for v in raw.values()):
        raise ValueError("not a partial")
    return {str(k): tuple(v) for k, v in raw.items()}


class Statistic(abc.ABC):
    """One pass of exact, mergeable statistics over the rows of ``columns``.

    A subclass gives ``sizes`` (the public length of each part) and ``reduce`` (the exact
    integers of one chunk of rows); ``update`` checks the batch and feeds it in chunks,
    so a new statistic is mergeable and memory-bounded by construction.
    """

    @property
    @abc.abstractmethod
    def columns(self) -> tuple[str, ...]:
        """The columns a batch must hold."""

    @abc.abstractmethod
    def sizes(self) -> Mapping[str, int]:
        """Name -> length of each part (public)."""

    @abc.abstractmethod
    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64] | Sequence[int]]:
        """The exact integers of ``chunk`` (at most CHUNK rows, maybe none), per part:
        int64 arrays (counts, bounded integer sums) or Python ints (exact float sums)."""

    def widths(self) -> Mapping[str, int]:
        """Cells per row of the columns that hold several (a functional column's grid
        points): their batches are (rows, width) arrays; every other column is 1-D."""
        return {}

    def then(self, partial: Partial) -> Statistic | None:
        """The next pass, given this one's merged partial (None: this was the last)."""
        return None

    def carried(self) -> Mapping[str, tuple[int, ...]]:
        """What this pass took from the earlier ones (``Partial.carry``)."""
        return {}

    def empty(self) -> Partial:
        return Partial(0, {name: (0,) * size for name, size in self.sizes().items()},
                       self.carried())

    def merge(self, a: Partial, b: Partial) -> Partial:
        return a.merge(b)

    def update(self, partial: Partial, batch: Batch) -> Partial:
        """``partial`` plus the rows of ``batch``; reads CHUNK rows at a time."""
        widths = self.widths()
        arrays = [_rows(np.asarray(batch[name]), widths.get(name)) for name in self.columns]
        rows = arrays[0].shape[0] if arrays and arrays[0].ndim >= 1 else -1
        for name, x in zip(self.columns, arrays, strict=True):
            shape = (rows,) if name not in widths else (rows, widths[name])
            if x.shape != shape:
                raise ValueError(f"column {name!r} is not a {len(shape)}-D column of the"
                                 " batch's rows")
        totals: dict[str, Any] = {}
        for start in range(0, max(rows, 1), CHUNK):  # one call on an empty batch: its types
            chunk = {name: x[start:start + CHUNK] for name, x in
                     zip(self.columns, arrays, strict=True)}
            for name, values in self.reduce(chunk).items():
                if isinstance(values, np.ndarray):  # int64 counts and bounded sums
                    totals[name] = values + totals.get(name, 0)
                else:
                    before = totals.get(name)
                    totals[name] = list(values) if before is None else \
                        [a + b for a, b in zip(before, values, strict=True)]
        sizes = self.sizes()
        for name, values in totals.items():
            if len(values) != sizes[name]:
                raise AssertionError(f"part {name!r} has the wrong length")
        added = Partial(max(rows, 0), {name: tuple(int(v) for v in totals[name].tolist())
                                       if isinstance(totals[name], np.ndarray)
                                       else tuple(totals[name]) for name in sizes},
                        partial.carry)
        return partial.merge(added)


@dataclass(frozen=True)
class Joint(Statistic):
    """Several statistics read together: each pass updates every unfinished member from
    the same batch, so the rows are read once per pass of the longest member, not once per
    member. A member that has finished keeps its last partial in the carry until the last
    one finishes (``member`` gives each its own last partial back)."""

    members: tuple[Statistic | None, ...]  # None: finished, its partial in ``done``
    done: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def _active(self) -> Iterator[tuple[int, Statistic]]:
        return ((i, m) for i, m in enumerate(self.members) if m is not None)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for _, m in self._active() for c in m.columns))

    def widths(self) -> Mapping[str, int]:
        return {name: w for _, m in self._active() for name, w in m.widths().items()}

    def sizes(self) -> Mapping[str, int]:
        return {f"{i}/{k}": v for i, m in self._active() for k, v in m.sizes().items()}

    def carried(self) -> Mapping[str, tuple[int, ...]]:
        return {**self.done, **{f"{i}/{k}": v for i, m in self._active()
                                for k, v in m.carried().items()}}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64] | Sequence[int]]:
        return {f"{i}/{k}": v for i, m in self._active()
                for k, v in m.reduce({c: chunk[c] for c in m.columns}).items()}

    def then(self, partial: Partial) -> Statistic | None:
        members: list[Statistic | None] = []
        done = dict(self.done)
        for i, m in enumerate(self.members):
            following = None if m is None else m.then(self.member(partial, i))
            if m is not None and following is None:
                mine = self.member(partial, i)
                done.update({f"done/{i}/parts/{k}": v for k, v in mine.parts.items()})
                done.update({f"done/{i}/carry/{k}": v for k, v in mine.carry.items()})
            members.append(following)
        if all(m is None for m in members):
            return None
        return Joint(tuple(members), done)

    @staticmethod
    def member(partial: Partial, i: int) -> Partial:
        """Member ``i``'s own partial of its last pass so far (``partial``: a pass's)."""
        finished = f"done/{i}/"
        if any(k.startswith(finished) for k in partial.carry):
            def kept(kind: str) -> dict[str, tuple[int, ...]]:
                head = f"{finished}{kind}/"
                return {k[len(head):]: v for k, v in partial.carry.items()
                        if k.startswith(head)}
            return Partial(partial.rows, kept("parts"), kept("carry"))
        head = f"{i}/"
        return Partial(partial.rows,
                       {k[len(head):]: v for k, v in partial.parts.items() if k.startswith(head)},
                       {k[len(head):]: v for k, v in partial.carry.items() if k.startswith(head)})


def _rows(x: np.ndarray, width: int | None) -> np.ndarray:
    """A wide column as (rows, width): Arrow gives a list column's rows as a 1-D array of
    arrays (``to_numpy``), the store as a 2-D array."""
    if width is None or x.dtype != object or x.ndim != 1:
        return x
    cells = [np.asarray(row, dtype=np.float64) for row in x]
    if any(row.shape != (width,) for row in cells):
        raise ValueError("a row of a list column does not have the column's width")
    return np.stack(cells) if cells else np.zeros((0, width))


def compute(statistic: Statistic, batches: Iterable[Batch]) -> tuple[Statistic, Partial]:
    """The last pass and its partial over ``batches`` (read once per pass: a
    collection, not an iterator, when the statistic has several passes)."""
    read = 0

    def again(columns: Sequence[str]) -> Iterable[Batch]:
        nonlocal read
        read += 1
        if read > 1 and isinstance(batches, Iterator):
            raise TypeError("a statistic of several passes needs batches it can read again")
        return batches

    return compute_over(statistic, again)


def compute_over(statistic: Statistic, read: Callable[[Sequence[str]], Iterable[Batch]]
                 ) -> tuple[Statistic, Partial]:
    """``compute`` over a source read afresh by each pass, of that pass's columns only
    (``read(columns)``: a stored version streamed by row groups), so a worker holds one
    batch of the columns a pass needs, whatever the rows."""
    while True:
        partial = statistic.empty()
        for batch in read(statistic.columns):
            partial = statistic.update(partial, batch)
        following = statistic.then(partial)
        if following is None:
            return statistic, partial
        statistic = following


def whole(statistic: Statistic, data: Batch) -> Partial:
    """The last pass's partial over whole columns: one update per pass."""
    return compute(statistic, [data])[1]


def float_sums(values: NDArray[np.float64], groups: NDArray[np.int64] | None = None,
               size: int = 1) -> list[int]:
    """Exact sum of finite ``values`` per group (0 <= groups < size; None: one group),
    each in units of 2**-SCALE (see the module doc): integers, so they merge exactly."""
    if not np.isfinite(values).all():
        raise ValueError("exact sums need finite values")
    if values.shape[0] <= CHUNK:
        return _chunk_sums(values, groups, size)
    out = [0] * size
    for start in range(0, values.shape[0], CHUNK):  # CHUNK rows: exact float64 bin sums
        part = _chunk_sums(values[start:start + CHUNK],
                           None if groups is None else groups[start:start + CHUNK], size)
        out = [a + b for a, b in zip(out, part, strict=True)]
    return out


def _chunk_sums(values: NDArray[np.float64], groups: NDArray[np.int64] | None,
                size: int) -> list[int]:
    """``float_sums`` of at most CHUNK values. Five row-sized arrays, the rest in place:
    a streamed pass allocates these per chunk, and malloc may map and fault each afresh."""
    mantissa, exponent = np.frexp(values)
    np.ldexp(mantissa, 53, out=mantissa)
    whole = mantissa.astype(np.int64)  # |M| < 2**53, exact
    high = np.right_shift(whole, _HALF, out=mantissa, casting="unsafe")  # < 2**27: exact
    low = np.bitwise_and(whole, (1 << _HALF) - 1, out=whole).astype(np.float64)
    key = exponent.astype(np.int64)
    key -= _EMIN
    if groups is not None:
        key += groups.astype(np.int64) * _NEXP
    if size * _NEXP <= _DENSE_KEYS:
        highs = np.bincount(key, weights=high, minlength=size * _NEXP)
        lows = np.bincount(key, weights=low, minlength=size * _NEXP)
        keys = np.flatnonzero((highs != 0) | (lows != 0))
        highs, lows = highs[keys], lows[keys]
    else:
        keys, inverse = np.unique(key, return_inverse=True)
        highs = np.bincount(inverse, weights=high, minlength=keys.size)
        lows = np.bincount(inverse, weights=low, minlength=keys.size)
    out = [0] * size
    for k, h, lo in zip(keys.tolist(), highs.tolist(), lows.tolist(), strict=True):
        group, shift = divmod(k, _NEXP)
        # M·2**(e−53) = M·2**(shift − SCALE): in units of 2**-SCALE, M shifted left
        out[group] += ((int(h) << _HALF) + int(lo)) << shift
    return out


def column_sums(values: NDArray[np.float64], scale: NDArray[np.float64] | None = None
                ) -> list[int]:
    """Exact sum of each column of a finite (rows, K) array, in units of 2**-SCALE: the
    ``float_sums`` of every column at once (a functional column's cells). ``scale``: a
    factor per row, each product rounded as ``values * scale[:, None]`` rounds it (clipped
    curves, without a copy of the rows)."""
    if values.ndim != 2:
        raise ValueError("column sums need a 2-D array")

    def block(start: int, stop: int) -> NDArray[np.float64]:
        chunk = values[start:stop]
        return chunk if scale is None else chunk * scale[start:stop, None]

    return _exact_columns(block, values.shape[0], values.shape[1])


def product_sums(left: NDArray[np.float64], right: NDArray[np.float64],
                 pairs: tuple[NDArray[np.intp], NDArray[np.intp]]) -> list[int]:
    """Exact sums over the rows of left[:, a]·right[:, b] for each pair (a, b) of
    ``pairs``, each product rounded per row as numpy rounds it (second moments, cross
    products), in units of 2**-SCALE; the products are formed a chunk at a time."""
    if left.ndim != 2 or right.ndim != 2 or left.shape[0] != right.shape[0]:
        raise ValueError("product sums need two 2-D arrays of the same rows")

    def block(start: int, stop: int) -> NDArray[np.float64]:
        with np.errstate(over="ignore"):  # an infinite product is refused as not finite
            out: NDArray[np.float64] = left[start:stop, pairs[0]] * right[start:stop,
                                                                         pairs[1]]
        return out

    top = None
    if left.shape[0]:  # |fl(a·b)| <= fl(max|a|·max|b|): a bound without forming them twice
        with np.errstate(over="ignore", invalid="ignore"):
            bound = np.abs(left).max(axis=0)[pairs[0]] * np.abs(right).max(axis=0)[pairs[1]]
        top = bound if np.isfinite(bound).all() else None
    return _exact_columns(block, left.shape[0], int(pairs[0].size), top)


def _exact_columns(block: Callable[[int, int], NDArray[np.float64]], rows: int,
                   width: int, top: NDArray[np.float64] | None = None) -> list[int]:
    """Exact column sums of the (rows, width) array ``block(start, stop)`` gives by rows,
    read max(1, CHUNK // width) rows at a time (twice, unless ``top`` bounds each
    column's |x|: the largest |x|, then the sums).

    Error-free extraction (Rump, Ogita & Oishi 2008, ExtractVector): with σ = 2**e a power
    of two, |x| <= 2**-b·σ and 2**b >= rows + 2, q = (σ + x) − σ is a multiple of 2**-53·σ
    with x − q exact, so any sum of the rows' q is exact in float64 (below σ). Two levels
    per column (σ from its largest |x|, then 2**(b − 53) times that) take its top 2·(53 − b)
    bits, the whole of nearly every value; what is left (values far below their column's
    largest, or columns near the top of the doubles) goes to ``float_sums``.
    """
    out = [0] * width
    if rows == 0 or width == 0:
        return out
    step = max(1, CHUNK // width)
    if top is None:
        top = np.zeros(width)
        for start in range(0, rows, step):
            np.maximum(top, np.abs(block(start, start + step)).max(axis=0), out=top)
    if not np.isfinite(top).all():  # the largest |x| of a column with NaN or ±inf
        raise ValueError("exact sums need finite values")
    bits = (rows + 1).bit_length()  # 2**bits >= rows + 2
    first = np.frexp(top)[1].astype(np.int64) + bits  # σ = 2**first: |x| < 2**-bits·σ
    # σ must be a normal double that σ + x cannot overflow: else the level keeps nothing
    usable = [(first - level * (53 - bits) <= 1023) & (first - level * (53 - bits) >= -960)
              for level in range(_LEVELS)]
    for level in range(1, _LEVELS):  # a level reads the rest of the one before
        usable[level] &= usable[level - 1]
    sigmas = [np.where(ok, np.ldexp(1.0, np.where(ok, first - level * (53 - bits), 0)), 0.0)
              for level, ok in enumerate(usable)]
    extracted, rest = (np.empty((min(step, rows), width)) for _ in range(2))
    kept = np.zeros((_LEVELS, width))
    for start in range(0, rows, step):
        chunk = block(start, start + step)
        q, left = extracted[:chunk.shape[0]], rest[:chunk.shape[0]]
        for level in range(_LEVELS):
            np.add(chunk, sigmas[level], out=q)
            q -= sigmas[level]
            if not usable[level].all():
                q[:, ~usable[level]] = 0.0
            kept[level] += q.sum(axis=0)  # exact: multiples of 2**-53·σ, below σ
            chunk = np.subtract(chunk, q, out=left)  # exact
        if chunk.any():
            where = np.flatnonzero(chunk)
            left_over = float_sums(chunk.ravel()[where], (where % width).astype(np.int64),
                                   width)
            out = [a + b for a, b in zip(out, left_over, strict=True)]
    for level in range(_LEVELS):
        out = [a + _units(v) for a, v in zip(out, kept[level].tolist(), strict=True)]
    return out


#: extraction levels of ``_exact_columns`` before the rest goes to ``float_sums``
_LEVELS = 2


def _units(value: float) -> int:
    """A double exactly, in units of 2**-SCALE (frexp: value = m·2**e, e >= −1073)."""
    mantissa, exponent = math.frexp(value)
    return int(mantissa * 2.0**53) << (exponent - _EMIN) if value else 0


def to_float(total: int, divisor: int = 1) -> float:
    """An exact ``float_sums`` total (over a positive integer ``divisor``: a mean) rounded
    once to a double (= ``math.fsum`` of the values, over the divisor exactly)."""
    return total / (divisor << SCALE)


def check_rows(partial: Partial, n: int, column: str) -> None:
    """The rows seen are the dataset's ``n`` (public): else the column was not whole."""
    if partial.rows != n:
        raise ValueError(f"column {column!r} does not have n_rows entries")


@dataclass(frozen=True)
class ColumnSums(Statistic):
    """The exact sum of each of ``names`` (``sums``, units of 2**-SCALE): a released
    table's means (``RecordMechanism.summary``) the same from any partitions. Integer
    columns must hold values below 2**53 in magnitude (their doubles are then exact)."""

    names: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.names

    def sizes(self) -> Mapping[str, int]:
        return {"sums": len(self.names)}

    def reduce(self, chunk: Batch) -> Mapping[str, Sequence[int]]:
        return {"sums": [float_sums(np.asarray(chunk[name], dtype=np.float64))[0]
                         for name in self.names]}

    def means(self, partial: Partial) -> dict[str, float]:
        """Each column's mean, correctly rounded (NaN for no rows)."""
        n = partial.rows
        return {name: (total / (n << SCALE) if n else math.nan)
                for name, total in zip(self.names, partial.parts["sums"], strict=True)}
