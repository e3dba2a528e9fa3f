"""A record-level release run over partitions of the rows (issue #30 item 4).

A ``RecordMechanism`` is a row map given a fitted model, so a release is: the fit
statistic's exact partials over all rows (any engine), the model fitted with noise from
the job's generator, then each partition of consecutive rows mapped on its own, with
its own generator (``rng.partition_generator(secret, p)``), and the summary statistic
of the released records. A partition's records depend only on (public inputs, the
model, its rows, its generator), so an engine may map the partitions anywhere and in
any order: the same job secret and the same partitions (a version's row groups) give
the same records bit for bit, embedded or on Spark.

Pure library code: a notebook runs ``release`` over its own list of batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mechanisms.base import Budget, DatasetMeta, Output, RecordMechanism
from mechanisms.rng import partition_generator
from mechanisms.statistics import Batch, Partial, Statistic, compute_over


@dataclass(frozen=True)
class MapJob:
    """What every partition needs (picklable: it travels to an engine's workers)."""

    mechanism: RecordMechanism
    params: Mapping[str, Any]
    cost: Budget
    meta: DatasetMeta
    model: Any
    #: the job's fresh secret, from which each partition's generator is derived
    secret: bytes

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset columns the map reads."""
        return self.mechanism.mapped_columns(self.params, self.meta)

    def privatize(self, partition: int, start: int, rows: Batch) -> dict[str, np.ndarray]:
        """Partition ``partition``'s released records: dataset rows ``start, ...``."""
        return self.mechanism.privatize(rows, start, self.params, self.cost, self.meta,
                                        self.model, partition_generator(self.secret, partition))

    def summary(self) -> Statistic | None:
        return self.mechanism.summary(self.params, self.cost, self.meta, self.model)

    def describe(self, released: Partial | None) -> Output:
        """The output around the table (the summary's partial over all released records)."""
        return self.mechanism.describe(self.params, self.cost, self.meta, self.model, released)


def fit(mechanism: RecordMechanism, read: Callable[[Sequence[str]], Iterable[Batch]],
        params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
        rng: np.random.Generator, secret: bytes) -> MapJob:
    """``fit_from`` with the fit statistic's passes over ``read(columns)`` (the rows
    afresh for each pass: ``statistics.compute_over``)."""
    return fit_from(mechanism, lambda statistic: compute_over(statistic, read)[1], params,
                    cost, meta, rng, secret)


def fit_from(mechanism: RecordMechanism, partial_of: Callable[[Statistic], Partial],
             params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
             rng: np.random.Generator, secret: bytes) -> MapJob:
    """The fit statistic's last partial (``partial_of``: all its passes, on any engine),
    the model with noise from ``rng``, and the refit's pass and noise if the mechanism has
    one: the job every partition runs."""
    statistic = mechanism.fit_statistic(params, cost, meta)
    partial = None if statistic is None else partial_of(statistic)
    model = mechanism.fit(params, partial, cost, meta, rng)
    second = mechanism.refit_statistic(params, cost, meta, model)
    if second is not None:
        model = mechanism.refit(params, model, partial_of(second), cost, meta, rng)
    return MapJob(mechanism, params, cost, meta, model, secret)


def release(job: MapJob, partitions: Iterable[Batch]) -> Output:
    """The release over ``partitions`` (consecutive rows, partition p the p-th batch),
    its table the partitions' records in row order (memory: the table being built)."""
    summary = job.summary()
    released = None if summary is None else summary.empty()
    parts: list[dict[str, np.ndarray]] = []
    start = 0
    for index, rows in enumerate(partitions):
        table = job.privatize(index, start, rows)
        start += _rows(rows)
        if summary is not None and released is not None:
            released = summary.update(released, table)
        parts.append(table)
    if start != job.meta.n_rows:  # the rows read are the public count, or it was not whole
        raise ValueError("the partitions do not hold n_rows rows")
    output = job.describe(released)
    if output.row_column != job.mechanism.record_row_column:
        raise AssertionError("the output's row column is not the one the mechanism declares")
    return dataclasses.replace(output, table=concatenate(parts))


def concatenate(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The parts' columns end to end (an empty table of no parts)."""
    if not parts:
        return {}
    return {name: np.concatenate([np.asarray(part[name]) for part in parts])
            for name in parts[0]}


def _rows(batch: Batch) -> int:
    lengths = {len(np.asarray(values)) for values in batch.values()}
    if len(lengths) != 1:
        raise ValueError("a partition's columns differ in length")
    return lengths.pop()
