"""Privatized microdata of releases: stored columnar beside the datasets, served as CSV.

Each run of a release writes its table (a version of the columnar store,
``dataset_files``: immutable Parquet objects, committed by a conditional put) under
its own attempt number, ``tables/<release_id>/v<attempt>`` in the object store,
before the ledger commits; the commit script records which attempt's table is the
release's, in the same step that checks the run still holds the job's lease.
So a committed release always has its table, no run ever replaces another's
(an object is never rewritten), and ``/data`` serves exactly the run whose
output is the release's result. A run that loses the commit removes its own
table; the winner removes those of runs that died before committing. Tables
stored before (``.npy`` folders under ``releases/<release_id>/v<attempt>``) are
read in place.

A table an engine wrote in order without gathering it (a record-level release on Spark,
``service.engines.spark_records``) is a list of parts under the same folder: the engine's
workers write ``part-<bucket>.parquet`` objects, then the run commits ``parts.json``
(each part's key, rows, size and ETag, in released order) with a conditional put, which
makes the table exist. ``load`` reads the parts end to end, each checked against its pin,
so every reader (the rows' GET, CSV export, analyses) sees one table.

The CSV is for spreadsheets as much as for code, and its text cells carry
operator-chosen names (categories, column names), so it follows the OWASP
CSV-injection advice: a text cell starting with ``= + - @``, a tab or a
carriage return gets a leading single quote, and lines end in CRLF (RFC 4180),
which makes the writer quote any cell holding a line break. Numeric columns
are written as they are: ``-3`` is a number, not a formula.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from service.storage.dataset_files import ChangedObject, DatasetStore
from service.storage.objects import AlreadyExists, NotFound, ObjectStore
from service.storage.room import PREFLIGHT_BYTES

#: the store's key prefix of release tables, and where the ``.npy`` folders were
PREFIX, LEGACY_PREFIX = "tables", "releases"

#: the list of a table stored as parts, and the names its parts may have
PARTS, PART = "parts.json", re.compile(r"part-[0-9]{5}\.parquet")
#: tables up to this many rows are also copied into ``result.records``
INLINE_ROWS = 100
CSV_CHUNK = 10_000
#: first characters that make a spreadsheet evaluate a cell (OWASP CSV injection)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise(cell: str) -> str:
    """A text cell a spreadsheet shows instead of running: formula starters get a quote."""
    return "'" + cell if cell.startswith(FORMULA_START) else cell


def _is_text(values: np.ndarray) -> bool:
    return np.asarray(values).dtype.kind in "USO"


def _plain(values: np.ndarray) -> np.ndarray:
    """A column numpy can save without pickling (strings become fixed-width unicode)."""
    array = np.asarray(values)
    if array.dtype == object:
        array = array.astype(str)
    if array.ndim != 1:
        raise ValueError("release table columns must be 1-D")
    return array


class OutputStore:
    """Release tables in ``objects``: one immutable version per run of a release
    (``staging_dir``: the local folder a table is written to before it is stored)."""

    def __init__(self, objects: ObjectStore, staging_dir: Path | None = None) -> None:
        self.store = DatasetStore(objects, PREFIX, legacy_prefix=LEGACY_PREFIX,
                                  staging_dir=staging_dir)

    def save(self, release_id: str, attempt: int, table: Mapping[str, np.ndarray]) -> int:
        """Store run ``attempt``'s table; returns its rows. FileExistsError if that run
        already stored one: a stored table is never replaced."""
        columns = {name: _plain(values) for name, values in table.items()}
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise ValueError("release table columns differ in length")
        self.store.write(release_id, attempt, {"kind": "release-table"}, columns)
        return lengths.pop() if lengths else 0

    def check_room(self) -> None:
        """Raise what storing a table would meet now (the POST of a release that writes
        one asks first: 507/503, nothing held)."""
        self.store.objects.check_room(PREFLIGHT_BYTES)

    def preflight(self) -> None:
        """Before a run that writes a table reads its data: the store takes a probe (a
        store that cannot fails the run while it is refunded)."""
        self.store.objects.preflight(PREFLIGHT_BYTES)

    def parts_place(self, release_id: str, attempt: int) -> tuple[pafs.FileSystem, str]:
        """Where an engine's workers write run ``attempt``'s parts: the store's pyarrow
        filesystem and the run's folder (``part_name`` names each part in it)."""
        return self.store.objects.filesystem, self.store.key(release_id, attempt)

    def commit_parts(self, release_id: str, attempt: int, parts: Sequence[tuple[str, int]]
                     ) -> int:
        """Make run ``attempt``'s table the ``parts`` (name, rows), in this order, each
        pinned as it is now; returns the rows. FileExistsError if that run stored a table
        already (a stored table is never replaced)."""
        base = self.store.key(release_id, attempt)
        listed: list[dict[str, Any]] = []
        for name, rows in parts:
            if PART.fullmatch(name) is None:
                raise ValueError("not a part's name")
            info = self.store.objects.head(f"{base}/{name}")
            listed.append({"key": name, "rows": int(rows), "size": info.size,
                           "etag": info.etag})
        total = sum(part["rows"] for part in listed)
        document = {"kind": "release-table-parts", "rows": total, "parts": listed}
        if self.store.exists(release_id, attempt):
            raise FileExistsError(f"{base} already holds a table")
        try:
            self.store.objects.put_new(f"{base}/{PARTS}", json.dumps(document).encode())
        except AlreadyExists:
            raise FileExistsError(f"{base} already holds a table") from None
        return total

    def load(self, release_id: str, attempt: int) -> dict[str, np.ndarray] | None:
        """The table run ``attempt`` stored (the committed run's, as the ledger says)."""
        parted = self._parts(release_id, attempt)
        if parted is not None:
            return parted
        if not self.store.exists(release_id, attempt):
            return None
        return self.store.load(release_id, attempt)[1]

    def _parts(self, release_id: str, attempt: int) -> dict[str, np.ndarray] | None:
        """A table stored as parts, read end to end (None: it is not one)."""
        base = self.store.key(release_id, attempt)
        try:
            document = json.loads(self.store.objects.get(f"{base}/{PARTS}"))
        except NotFound:
            return None
        tables = []
        for part in document["parts"]:
            key = f"{base}/{part['key']}"
            if PART.fullmatch(str(part["key"])) is None:
                raise ValueError(f"corrupt parts list in {base}")
            pinned = (int(part["size"]), str(part["etag"]))
            if tuple(self.store.objects.head(key)) != pinned:
                raise ChangedObject(f"the part {key} is not the one its list pinned")
            with self.store.objects.open(key) as fh:
                tables.append(pq.read_table(fh, use_threads=False))
            if tuple(self.store.objects.head(key)) != pinned or \
                    tables[-1].num_rows != part["rows"]:
                raise ChangedObject(f"the part {key} changed while it was read")
        if not tables:
            return {}
        table = pa.concat_tables(tables)
        return {name: _numpy(table.column(name)) for name in table.column_names}

    def discard(self, release_id: str, attempt: int) -> None:
        """Remove one run's table (a run whose output is not the release's)."""
        self.store.remove(release_id, attempt)

    def prune(self, release_id: str, keep: int | None) -> list[int]:
        """Remove every run's table but ``keep`` (None: all); returns the attempts removed."""
        return [attempt for attempt in self.store.versions(release_id)
                if attempt != keep and self.store.remove(release_id, attempt)]


def part_name(bucket: int) -> str:
    """The name of the part holding bucket ``bucket`` of a table stored as parts."""
    return f"part-{bucket:05d}.parquet"


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A part's column as ``save`` keeps one: text as fixed-width unicode."""
    values = column.to_numpy()
    return values.astype(str) if values.dtype == object else values


def records(table: Mapping[str, np.ndarray]) -> list[dict[str, object]]:
    """Rows as JSON objects, for small tables inlined into the result."""
    names = list(table)
    cols = [np.asarray(table[n]).tolist() for n in names]
    return [dict(zip(names, row, strict=True)) for row in zip(*cols, strict=True)]


def csv_chunks(table: Mapping[str, np.ndarray]) -> Iterator[str]:
    """The table as CSV text (header, then one row per record), in bounded chunks.

    Text cells and the header are neutralised (see the module docstring).
    """
    names = list(table)
    text = [_is_text(table[name]) for name in names]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow([neutralise(str(name)) for name in names])
    n = len(next(iter(table.values()))) if names else 0
    for start in range(0, n, CSV_CHUNK):
        cols = [np.asarray(table[name][start:start + CSV_CHUNK]).tolist() for name in names]
        cols = [list(map(neutralise, map(str, col))) if is_text else col
                for col, is_text in zip(cols, text, strict=True)]
        writer.writerows(zip(*cols, strict=True))
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():  # the header of an empty table
        yield buffer.getvalue()
