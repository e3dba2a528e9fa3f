"""``noiseless.aggregate``'s data pass as streaming statistics (``mechanisms.statistics``).

The exact query value ``central.evaluate`` computes on whole columns, from batches of
rows: a count, an integer sum and an exact float sum are integers that add (``Total``);
min, max and a median are exact order statistics by radix selection over a fixed number
of passes (``mechanisms.selection``). The records are read as ``evaluate`` reads them
(the condition's mask, or the column clipped to the query's bounds with missing values at
the lower bound), element by element, so the batches never change the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from mechanisms.columns import Condition
from mechanisms.noiseless import exact
from mechanisms.noiseless.central import ORDER_STATISTICS, Query
from mechanisms.selection import Selection, Source
from mechanisms.statistics import SCALE, Batch, Partial, Statistic, check_rows, float_sums


@dataclass(frozen=True)
class Records(Source):
    """A query's records in a batch: ``condition``'s mask (a count), else ``column``
    clipped to the query's record bounds."""

    query: Query
    column: str
    condition: Condition | None = None

    @property
    def integer(self) -> bool:
        return self.query.integer

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.column,)

    def values(self, chunk: Batch) -> NDArray[np.int64] | NDArray[np.float64]:
        x = np.asarray(chunk[self.column])
        assert self.query.record_bounds is not None
        lo, hi = self.query.record_bounds
        if self.query.integer:
            return exact.clip_integer(x, int(lo), int(hi))
        return exact.clip_float(x, float(lo), float(hi))


@dataclass(frozen=True)
class Total(Statistic):
    """Part ``total``: rows meeting the condition, the int sum of the clipped records, or
    the exact sum of the clipped doubles in units of 2**-SCALE."""

    records: Records

    @property
    def columns(self) -> tuple[str, ...]:
        return self.records.columns

    def sizes(self) -> Mapping[str, int]:
        return {"total": 1}

    def reduce(self, chunk: Batch) -> Mapping[str, Sequence[int]]:
        if self.records.condition is not None:
            mask = self.records.condition.mask(np.asarray(chunk[self.records.column]))
            return {"total": [int(np.count_nonzero(mask))]}
        values = self.records.values(chunk)
        if self.records.query.integer:
            return {"total": [exact.exact_int_sum(np.asarray(values, dtype=np.int64))]}
        return {"total": float_sums(np.asarray(values, dtype=np.float64))}


def _ranks(query: Query) -> tuple[int, ...]:
    n = query.n
    return {"min": (0,), "max": (n - 1,)}.get(query.statistic, ((n - 1) // 2, n // 2))


def statistic(records: Records) -> Statistic:
    """The (first pass of the) statistic the query's value is computed from."""
    if records.query.statistic in ORDER_STATISTICS:
        return Selection(records, _ranks(records.query), records.query.n)
    return Total(records)


def value(records: Records, partial: Partial) -> Fraction:
    """The exact query value from the last pass's merged partial (= ``central.evaluate``)."""
    query = records.query
    if query.statistic in ORDER_STATISTICS:
        chosen = Selection(records, _ranks(query), query.n).finish(partial)
        if query.statistic == "median":
            return (Fraction(chosen[0]) + Fraction(chosen[1])) / 2
        return Fraction(chosen[0])
    check_rows(partial, query.n, records.column)
    total = partial.parts["total"][0]
    if query.statistic == "count" or query.integer:
        exact_total = Fraction(total)
    else:
        exact_total = Fraction(total, 1 << SCALE)
    return exact.exact_mean(exact_total, query.n) if query.statistic == "mean" else exact_total
