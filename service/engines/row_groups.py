"""Parquet row groups as the units of a distributed pass: planned from footers, read alone.

A row group of one file is what a worker reads at a time; ``pack`` puts consecutive ones
into Spark tasks. The plan reads only footers (row counts and column names: public sizes,
never values), so it runs on the driver before any data is read; a read takes only the
columns the statistic needs, from one row group, through a ``pyarrow.fs`` filesystem (a
local one, or ``S3FileSystem``: object storage without Hadoop's jars), so a worker's
memory is bounded by the row group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from mechanisms.statistics import Batch


@dataclass(frozen=True)
class Footer:
    """What a file's footer says: its row groups' row counts and its column names."""

    path: str
    rows: tuple[int, ...]
    names: frozenset[str]


@dataclass(frozen=True)
class RowGroup:
    """Row group ``index`` (``rows`` rows) of the file at ``path``."""

    path: str
    index: int
    rows: int


def footers(files: Iterable[str], filesystem: pafs.FileSystem) -> list[Footer]:
    """The footers of ``files`` (paths in ``filesystem``), in order."""
    out = []
    for path in files:
        metadata = pq.read_metadata(path, filesystem=filesystem)
        # the top-level names (a list column's Parquet leaf is its item, not the column)
        out.append(Footer(path, tuple(metadata.row_group(i).num_rows
                                      for i in range(metadata.num_row_groups)),
                          frozenset(metadata.schema.to_arrow_schema().names)))
    return out


def plan(files: Sequence[Footer], columns: Iterable[str]) -> list[RowGroup]:
    """The non-empty row groups of ``files``; ValueError naming the first of ``columns``
    (Parquet names) a file lacks."""
    needed = list(columns)
    for footer in files:
        for name in needed:
            if name not in footer.names:
                raise ValueError(f"column {name!r} is not in the Parquet file {footer.path!r}")
    return [RowGroup(footer.path, index, rows) for footer in files
            for index, rows in enumerate(footer.rows) if rows > 0]


def read(group: RowGroup, columns: Mapping[str, str], filesystem: pafs.FileSystem) -> Batch:
    """The batch of ``group``: statistic column name -> numpy array of the Parquet column
    ``columns`` maps it to (only those columns are read). Stored columns have no missing
    cells (ingest codes them), so a null is refused as a foreign file."""
    with pq.ParquetFile(group.path, filesystem=filesystem) as parquet:
        table = parquet.read_row_group(group.index, columns=sorted(set(columns.values())),
                                       use_threads=False)
    batch: dict[str, np.ndarray] = {}
    for name, source in columns.items():
        column = table.column(source)
        if column.null_count:
            raise ValueError(f"column {source!r} of {group.path!r} has null cells:"
                             " not a stored dataset column")
        if pa.types.is_fixed_size_list(column.type):  # a functional column: (rows, width)
            cells = column.combine_chunks()
            values = cells.flatten()
            if values.null_count:
                raise ValueError(f"column {source!r} of {group.path!r} has null cells:"
                                 " not a stored dataset column")
            batch[name] = values.to_numpy(zero_copy_only=False).reshape(
                len(cells), column.type.list_size)
        else:
            batch[name] = column.to_numpy()
    return batch


def pack(groups: Sequence[RowGroup], rows: int) -> list[tuple[RowGroup, ...]]:
    """Consecutive row groups in tasks of at most ``rows`` rows (a larger group alone):
    a task costs Spark tens of milliseconds whatever it reads, so small row groups are
    read a few to a task (still one at a time: memory stays one row group's)."""
    if rows < 1:
        raise ValueError("a task must be allowed at least one row")
    tasks: list[tuple[RowGroup, ...]] = []
    current: list[RowGroup] = []
    total = 0
    for group in groups:
        if current and total + group.rows > rows:
            tasks.append(tuple(current))
            current, total = [], 0
        current.append(group)
        total += group.rows
    if current:
        tasks.append(tuple(current))
    return tasks
