"""Record-level releases on Spark: partition maps, the secret order by buckets, parts.

Stage 1 (``mapInArrow`` over tasks of row groups, as ``spark.compute_on_spark`` plans
them): a Python worker reads each of its row groups, privatizes its rows with the row
group's own generator (``record_maps.MapJob.privatize``: partition p is the p-th row
group, so the records are the embedded run's bit for bit) and computes each row's sort
value from the dataset's v2 key and the row's index alone (``rows.sort_keys``, seekable),
and its bucket, the value's top bits (``rows.buckets_of``). Stage 2 (a shuffle by
bucket, a sort within partitions by (bucket, value, row)): a worker writes each bucket's
rows, in order, as one Parquet part through the output store's filesystem, replacing the
row column by the record's released position (the rows of the buckets before it, which
the driver counts from the key alone, plus its place in the bucket), and computes the
summary statistic's exact partial of what it wrote. The driver receives one small row
per part, merges the partials, and the run commits the parts' list
(``release_tables.OutputStore.commit_parts``). No row reaches the driver.

The bucket count is a power of two from the public row count (``BUCKET_ROWS`` rows a
bucket on average), never from the data. The order is exactly ``rows.permute``'s: by
value, ties by row index; ``keep_row_order`` sorts by the row index instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from mechanisms import rows
from mechanisms.base import Output
from mechanisms.record_maps import MapJob
from mechanisms.statistics import Partial
from service.engines import code_stamp, row_groups
from service.engines.row_groups import RowGroup
from service.engines.spark import TASK_ROWS, SparkEngineError
from service.storage.release_tables import part_name

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession

#: rows of a bucket (a part of the stored table) on average
BUCKET_ROWS = 1 << 20
#: the helper columns stage 1 adds: bucket, sort value (signed: value - 2**63), row index
_BUCKET, _VALUE, _ROW = "_pr_bucket", "_pr_value", "_pr_row"
_SIGN = np.uint64(1 << 63)
_PARTS = pa.schema([("bucket", pa.int64()), ("rows", pa.int64()), ("partial", pa.string()),
                    ("code", pa.string())])
_SPARK_TYPES = {pa.int64(): "bigint", pa.int32(): "int", pa.int16(): "smallint",
                pa.int8(): "tinyint", pa.float64(): "double", pa.float32(): "float",
                pa.string(): "string", pa.large_string(): "string", pa.bool_(): "boolean"}


@dataclass(frozen=True)
class Order:
    """How the released records are ordered: by the key's values (None: by row index,
    the operator keeps row order) in 2**bits buckets, ``offsets[b]`` records before
    bucket b; the row column (if any) gets each record's released position."""

    key: rows.RowKey | None
    n_rows: int
    bits: int
    offsets: tuple[int, ...]
    row_column: str | None

    def values(self, start: int, stop: int) -> np.ndarray:
        """The sort values of rows start..stop-1 (uint64)."""
        if self.key is None:
            return np.arange(start, stop, dtype=np.uint64)
        return rows.sort_keys(self.key, stop, start)

    def buckets(self, values: np.ndarray) -> np.ndarray:
        if self.key is not None:
            return rows.buckets_of(values, self.bits)
        return (values // np.uint64(self.width)).astype(np.int64)

    @property
    def width(self) -> int:
        """Rows of a bucket in row order (the last one fewer)."""
        return max(1, -(-self.n_rows // (1 << self.bits)))


def plan_order(key: rows.RowKey | None, n_rows: int, row_column: str | None,
               bucket_rows: int = BUCKET_ROWS) -> Order:
    """The buckets of ``n_rows`` rows (public; ``bucket_rows`` a bucket on average) and
    the records before each (from the key alone, or the row count in row order); a key
    must be seekable (v2)."""
    if key is not None and not key.seekable:
        raise ValueError("a v1 row order is one sequential stream: it has no partitions")
    buckets = max(1, -(-n_rows // bucket_rows))
    bits = max(0, math.ceil(math.log2(buckets)))
    if key is not None:
        counts = rows.bucket_counts(key, n_rows, bits)
    else:
        width = max(1, -(-n_rows // (1 << bits)))
        counts = np.array([max(0, min(width, n_rows - b * width)) for b in range(1 << bits)])
    offsets = tuple(int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]]))
    return Order(key, n_rows, bits, offsets, row_column)


def release_on_spark(session: SparkSession, job: MapJob, files: Sequence[str],
                     columns: Mapping[str, str], filesystem: pafs.FileSystem, order: Order,
                     place: tuple[pafs.FileSystem, str], task_rows: int = TASK_ROWS
                     ) -> tuple[Output, list[tuple[str, int]]]:
    """The release's output (no table) and its parts (name, rows) in released order,
    written under ``place`` (a filesystem and folder). ``columns`` maps each column the
    map reads to its Parquet column; the partitions are the files' row groups."""
    from pyspark.errors import PySparkException

    needed = {name: columns[name] for name in job.columns}
    groups = row_groups.plan(row_groups.footers(files, filesystem), needed.values())
    starts = np.concatenate([[0], np.cumsum([g.rows for g in groups])]).tolist()
    if starts[-1] != job.meta.n_rows:
        raise ValueError("the stored rows are not the version's n_rows")
    numbered = [(index, starts[index], group) for index, group in enumerate(groups)]
    tasks = _pack(numbered, task_rows)
    schema = _released_schema(job, needed, groups, filesystem)
    ddl = ", ".join([f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in schema]
                    + [f"{_BUCKET} bigint", f"{_VALUE} bigint", f"{_ROW} bigint"])
    summary = job.summary()
    released = None if summary is None else summary.empty()
    parts: dict[int, tuple[str, int]] = {}
    try:
        mapped = session.range(0, max(len(tasks), 1), 1, max(len(tasks), 1)).mapInArrow(
            functools.partial(_map, job, tasks, needed, filesystem, order, schema), ddl)
        ordered = mapped.repartition(1 << order.bits, _BUCKET).sortWithinPartitions(
            _BUCKET, _VALUE, _ROW)
        written = ordered.mapInArrow(functools.partial(_write, job, order, schema, place),
                                     "bucket bigint, rows bigint, partial string,"
                                     " code string")
        for row in written.toLocalIterator():
            code_stamp.check(row.code)  # privatized by this worker's code, or refused
            parts[int(row.bucket)] = (part_name(int(row.bucket)), int(row.rows))
            if summary is not None and released is not None:
                released = summary.merge(released, Partial.from_json(row.partial))
    except PySparkException as exc:
        raise SparkEngineError(f"the Spark job over {len(groups)} row groups failed") from exc
    listed = [parts[b] for b in sorted(parts)]
    if sum(count for _, count in listed) != job.meta.n_rows:
        raise SparkEngineError("the parts do not hold one record per row")
    return job.describe(released), listed


def _pack(numbered: list[tuple[int, int, RowGroup]], task_rows: int
          ) -> list[tuple[tuple[int, int, RowGroup], ...]]:
    """Consecutive row groups in tasks of at most ``task_rows`` rows (``row_groups.pack``)."""
    packed = row_groups.pack([group for _, _, group in numbered], task_rows)
    out, at = [], 0
    for task in packed:
        out.append(tuple(numbered[at:at + len(task)]))
        at += len(task)
    return out


def _released_schema(job: MapJob, columns: Mapping[str, str], groups: Sequence[RowGroup],
                     filesystem: pafs.FileSystem) -> pa.Schema:
    """The released table's Arrow schema: the map run on no rows of the stored types."""
    if not groups:
        raise ValueError("the version has no rows")
    stored = pq.read_schema(groups[0].path, filesystem=filesystem)
    empty = {name: pa.array([], type=stored.field(source).type).to_numpy()
             for name, source in columns.items()}
    table = job.privatize(0, 0, empty)
    return pa.schema([(name, pa.array(np.asarray(values)).type)
                      for name, values in table.items()])


def _map(job: MapJob, tasks: Sequence[tuple[tuple[int, int, RowGroup], ...]],
         columns: Mapping[str, str], filesystem: pafs.FileSystem, order: Order,
         schema: pa.Schema, numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stage 1 (a Spark Python worker): each row group of its tasks privatized with its
    own generator, with each row's bucket, sort value and index."""
    for batch_of_numbers in numbers:
        for number in batch_of_numbers.column(0).to_pylist():
            if number >= len(tasks):
                continue
            for partition, start, group in tasks[number]:
                batch = row_groups.read(group, columns, filesystem)
                table = job.privatize(partition, start, batch)
                values = order.values(start, start + group.rows)
                arrays = [pa.array(np.asarray(table[f.name]), type=f.type) for f in schema]
                arrays += [pa.array(order.buckets(values)),
                           pa.array((values ^ _SIGN).view(np.int64)),
                           pa.array(np.arange(start, start + group.rows, dtype=np.int64))]
                yield pa.RecordBatch.from_arrays(
                    arrays, names=[*schema.names, _BUCKET, _VALUE, _ROW])


def _write(job: MapJob, order: Order, schema: pa.Schema, place: tuple[pafs.FileSystem, str],
           batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stage 2 (a Spark Python worker): its buckets' rows, sorted, each bucket written as
    one part (a batch at a time), with the summary's partial of the rows written."""
    fs, base = place
    if isinstance(getattr(fs, "base_fs", fs), pafs.LocalFileSystem):
        fs.create_dir(base, recursive=True)
    summary = job.summary()
    current: tuple[int, pq.ParquetWriter, pa.NativeFile] | None = None
    written = 0
    partial = None if summary is None else summary.empty()

    def close() -> pa.RecordBatch:
        assert current is not None
        current[1].close()
        current[2].close()
        text = "" if partial is None else partial.to_json()
        return pa.RecordBatch.from_pylist(
            [{"bucket": current[0], "rows": written, "partial": text,
              "code": code_stamp.stamp()}], schema=_PARTS)

    for batch in batches:
        buckets = batch.column(_BUCKET).to_numpy()
        cuts = np.flatnonzero(np.diff(buckets)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(buckets)], strict=True):
            if a == b:
                continue
            bucket = int(buckets[a])
            if current is None or current[0] != bucket:
                if current is not None:
                    yield close()
                stream = fs.open_output_stream(f"{base}/{part_name(bucket)}")
                # written as the store writes versions: plain pages, no statistics
                current = (bucket, pq.ParquetWriter(stream, schema, compression="NONE",
                                                    use_dictionary=False,
                                                    write_statistics=False), stream)
                written = 0
                partial = None if summary is None else summary.empty()
            piece = batch.slice(a, b - a)
            out = {f.name: piece.column(f.name).cast(f.type) for f in schema}
            if order.row_column is not None:
                position = order.offsets[bucket] + written
                out[order.row_column] = pa.array(
                    np.arange(position, position + (b - a), dtype=np.int64))
            part = pa.RecordBatch.from_arrays([out[f.name] for f in schema], schema=schema)
            current[1].write_batch(part)
            if summary is not None and partial is not None:
                partial = summary.update(partial, {name: part.column(name).to_numpy(
                    zero_copy_only=False) for name in summary.columns})
            written += b - a
    if current is not None:
        yield close()
