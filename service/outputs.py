"""Privatized microdata of releases: stored columnar beside the datasets, served as CSV.

A release's table is written (atomically, by the columnar store) before the
ledger commits the release, so a committed release always has its table; a
re-run after a crash replaces the table of the attempt that never committed.

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
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from service.store import DatasetStore

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
    """Release tables under ``root``, one immutable folder per release."""

    def __init__(self, root: Path) -> None:
        self.store = DatasetStore(root)

    def save(self, release_id: str, table: Mapping[str, np.ndarray]) -> int:
        """Store the table (replacing an uncommitted earlier attempt); returns its rows."""
        columns = {name: _plain(values) for name, values in table.items()}
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise ValueError("release table columns differ in length")
        self.store.remove(release_id, 1)
        self.store.write(release_id, 1, {"kind": "release-table"}, columns)
        return lengths.pop() if lengths else 0

    def load(self, release_id: str) -> dict[str, np.ndarray] | None:
        if not self.store.exists(release_id, 1):
            return None
        return self.store.load(release_id, 1)[1]

    def discard(self, release_id: str) -> None:
        self.store.remove(release_id, 1)


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
