"""Exact order statistics over batches of rows: radix selection in a fixed number of passes.

The k-th smallest of n values (min: k = 0, max: k = n − 1, a median: the middle one or
two) is not a sum, but it is found from counts, which add: map each value to a 64-bit key
whose unsigned order is the values' order (``keys``), then pick the key DIGIT bits at a
time. Pass p counts, among the rows whose higher digits equal the ones chosen so far,
how many have each value of the next digit; the cumulative counts say which digit holds
rank k and what rank it has inside it. After PASSES passes every bit is chosen: the key,
hence the value, exactly. The passes are a fixed, public number (the data decide which
digits, never how many passes), partials are 2**DIGIT counts per target rank, and the
digits chosen so far ride in ``Partial.carry``, so the last partial is all ``finish`` needs.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mechanisms.statistics import Batch, Partial, Statistic, check_rows

DIGIT = 11
#: ceil(64 / DIGIT): the last pass reads the 9 lowest bits
PASSES = -(-64 // DIGIT)
_SIGN = np.uint64(1 << 63)


def keys(values: NDArray[np.int64] | NDArray[np.float64]) -> NDArray[np.uint64]:
    """Order-preserving 64-bit keys: int64 by flipping the sign bit; finite doubles by
    flipping the sign bit of non-negatives and every bit of negatives (−0.0 is read as
    0.0 first, so equal values have equal keys)."""
    if values.dtype.kind == "i":
        return values.astype(np.int64).view(np.uint64) ^ _SIGN
    bits = (values.astype(np.float64) + 0.0).view(np.uint64)
    negative = (bits & _SIGN) != 0
    return np.where(negative, ~bits, bits | _SIGN)


def value_of(key: int, integer: bool) -> int | float:
    """The value whose key is ``key`` (the inverse of ``keys``)."""
    if integer:
        return int(np.array([key ^ (1 << 63)], dtype=np.uint64).view(np.int64)[0])
    bits = key ^ (1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def _span(level: int) -> tuple[int, int]:
    """The shift and width of pass ``level``'s digit (bits from the top down)."""
    top = 64 - DIGIT * level
    shift = max(top - DIGIT, 0)
    return shift, top - shift


class Source(abc.ABC):
    """How a selection reads its values from a batch (the mechanism's clipping rule)."""

    @property
    @abc.abstractmethod
    def integer(self) -> bool:
        """Whether the values are int64 (else finite doubles)."""

    @property
    @abc.abstractmethod
    def columns(self) -> tuple[str, ...]:
        """The columns a batch must hold."""

    @abc.abstractmethod
    def values(self, chunk: Batch) -> NDArray[np.int64] | NDArray[np.float64]:
        """The chunk's values, as the whole-column statistic reads them."""


@dataclass(frozen=True)
class Selection(Statistic):
    """Pass ``level`` of selecting the values of rank ``ranks`` (0-based, public) among the
    ``n`` rows' values; ``chosen`` holds each target's digits so far (a key prefix) and
    ``within`` its rank among the rows sharing that prefix."""

    source: Source
    ranks: tuple[int, ...]
    n: int
    level: int = 0
    chosen: tuple[int, ...] = ()
    within: tuple[int, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        return self.source.columns

    def sizes(self) -> Mapping[str, int]:
        width = _span(self.level)[1]
        return {f"rank{t}": 1 << width for t in range(len(self.ranks))}

    def carried(self) -> Mapping[str, tuple[int, ...]]:
        return {"level": (self.level,), "chosen": self._chosen(), "within": self._within()}

    def _chosen(self) -> tuple[int, ...]:
        return self.chosen or (0,) * len(self.ranks)

    def _within(self) -> tuple[int, ...]:
        return self.within or self.ranks

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64]]:
        k = keys(self.source.values(chunk))
        shift, width = _span(self.level)
        digits = (k >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        out = {}
        for t, prefix in enumerate(self._chosen()):
            if self.level:
                mine = digits[(k >> np.uint64(shift + width)) == np.uint64(prefix)]
            else:
                mine = digits
            out[f"rank{t}"] = np.bincount(mine.astype(np.int64),
                                          minlength=1 << width).astype(np.int64)
        return out

    def then(self, partial: Partial) -> Statistic | None:
        check_rows(partial, self.n, self.columns[0])
        if self.level == PASSES - 1:
            return None
        chosen, within = _step(partial, self.ranks)
        return Selection(self.source, self.ranks, self.n, self.level + 1, chosen, within)

    def finish(self, partial: Partial) -> list[int | float]:
        """The selected values from the last pass's merged partial."""
        check_rows(partial, self.n, self.columns[0])
        if partial.carry["level"][0] != PASSES - 1:
            raise ValueError("the selection has passes left")
        chosen, _ = _step(partial, self.ranks)
        return [value_of(key, self.source.integer) for key in chosen]


def _step(partial: Partial, ranks: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each target's next digit and its rank inside it, from one pass's merged counts."""
    level = partial.carry["level"][0]
    width = _span(level)[1]
    chosen, within = [], []
    for t, (prefix, rank) in enumerate(zip(partial.carry["chosen"], partial.carry["within"],
                                           strict=True)):
        cumulative = np.cumsum(partial.vector(f"rank{t}"))
        if not 0 <= rank < int(cumulative[-1]):
            raise ValueError("the rows do not hold the rank selected")
        digit = int(np.searchsorted(cumulative, rank, side="right"))
        chosen.append((prefix << width) | digit)
        within.append(rank - (int(cumulative[digit - 1]) if digit else 0))
    assert len(chosen) == len(ranks)
    return tuple(chosen), tuple(within)
