"""Turn an uploaded CSV and its metadata into validated, typed columns.

Pure functions (no Flask, no Redis) so the upload endpoint, the CLI and the
tests share one definition of a valid dataset. Bounds and categories come
from the metadata, never from the data (DESIGN §6), and no error message ever
contains a cell value: messages name only the column, the line number and
public metadata, because upload errors end up in HTTP responses and logs.

CSV rules, decided here once:

- UTF-8, a leading BOM is ignored; the first non-blank record is the header,
  checked before any data is read. A first row naming none of the declared
  columns is taken for a missing header and reported without its contents.
- Fully blank lines are skipped (as pandas does); they still count for line
  numbers. ``line N`` is the physical line on which a record starts, the
  header being on line 1 in a file without leading blank lines.
- Header names match metadata column names exactly (case and whitespace
  included); order is free.
- Numbers (continuous and integer columns) may carry surrounding whitespace.
  Continuous cells use Python ``float()`` syntax. Integer cells use ``int()``
  syntax, and a decimal with only zeros after the point ("3.0", "3.") is
  accepted as that integer, because exports that passed through a float
  column (pandas with NaN, R) write integers that way; "3.5" or "3e2" are
  rejected.
- Missing cells: empty or whitespace, or (case-insensitively) ``nan``,
  ``na``, ``n/a``, ``null``, ``none``; in numeric columns also anything that
  parses to a non-finite float (``inf``, ``-infinity``, ``1e999``). They are
  an error unless the column has ``allow_missing``; then the column's fill is
  used. In categorical columns a cell equal to a declared category is always
  that category, even if it looks like a missing marker.
- Categorical cells must equal a declared category exactly; the column holds
  int64 codes, the index into ``categories``.
- Records are read from a binary file as they are decoded and converted in
  chunks (``CHUNK_ROWS``); ``iter_csv`` hands each chunk's arrays on, so a
  caller that writes them out (the upload) holds one chunk, never the file
  or all its rows. The error reported is the first one found in the
  earliest chunk that has one (by column in metadata order, then by line).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gc
import io
import math
import re
import threading
import unicodedata
from array import array
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any, BinaryIO, Literal, cast

import numpy as np
from marshmallow import ValidationError

from mechanisms.base import ColumnMeta, DatasetMeta
from service.metadata import (
    MAX_COLUMNS,
    MAX_CSV_FIELDS,
    MAX_NAME_LENGTH,
    MetadataSchema,
    accounting_fields,
    first_error,
)

BoundsPolicy = Literal["reject", "clip"]
FillValue = float | int | str

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_MISSING_TOKENS = frozenset({"", "nan", "na", "n/a", "null", "none"})
_INT_WITH_ZERO_FRACTION = re.compile(r"([+-]?[0-9]+)\.0*")


class IngestError(ValueError):
    """A dataset upload that cannot be accepted.

    ``field`` names what is wrong (``metadata.columns.age.bounds``, ``file``,
    ``file.line 12``, ``file.columns.age``); ``line`` is set for errors tied
    to one CSV record. The message never contains a data value.
    """

    def __init__(self, field: str, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.line = line


@dataclass(frozen=True)
class DatasetSpec:
    """Validated upload metadata.

    ``fill`` has an entry exactly for the columns declared ``allow_missing``;
    ``budgets`` is the raw JSON object, validated by the budget module.
    """

    name: str
    columns: dict[str, ColumnMeta]
    fill: dict[str, FillValue]
    bounds_policy: BoundsPolicy
    budgets: dict[str, object]
    #: public reference data (e.g. for DIP): its values are not private
    public: bool = False
    #: DIP may use a hold-out of these rows, unprotected by DP, as its reference
    allow_holdout: bool = False
    #: gaussian_accounting, zcdp_delta, notions, allow_mixed_noiseless_dp (stored as given)
    accounting: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: dataset-wide subset-design thresholds; microdata in the dataset's own row order
    subset_policy: dict[str, float] | None = None
    keep_row_order: bool = False

    def allows_missing(self, column: str) -> bool:
        """Whether empty/NaN cells of ``column`` are replaced by its fill."""
        return column in self.fill

    def meta(self, n_rows: int) -> DatasetMeta:
        """The public metadata mechanisms see, once the row count is known."""
        return DatasetMeta(n_rows=n_rows, columns=dict(self.columns),
                           allow_holdout=self.allow_holdout,
                           gaussian_accounting=self.accounting.get("gaussian_accounting",
                                                                   "approx_dp"),
                           subset_policy=self.subset_policy, keep_row_order=self.keep_row_order)


# --------------------------------------------------------------------------- metadata


def _show(name: str) -> str:
    """Quote a (public) name for a message, shortened so messages stay small."""
    return repr(name if len(name) <= 80 else name[:77] + "...")


def _column(name: str, loaded: dict[str, Any]) -> tuple[ColumnMeta, FillValue | None]:
    """A loaded column object as the ColumnMeta mechanisms see, and its fill (if missing
    cells are allowed; a numeric column's default fill is its lower bound)."""
    kind = loaded["type"]
    if kind == "functional":
        return ColumnMeta(name, kind, grid=loaded["grid"],
                          norm_bound=loaded["norm_bound"]), None
    if kind == "categorical":
        meta = ColumnMeta(name, kind, categories=loaded["categories"],
                          subset_policy=loaded.get("subset_policy"))
    else:
        meta = ColumnMeta(name, kind, bounds=loaded["bounds"], prior=loaded.get("prior"))
    if not loaded["allow_missing"]:
        return meta, None
    default = None if meta.bounds is None else meta.bounds[0]
    return meta, loaded.get("fill", default)


def functional_cells(column: ColumnMeta) -> list[str]:
    """The CSV header names of a functional column: ``f.0`` ... ``f.<M-1>``."""
    assert column.grid is not None
    return [f"{column.name}.{i}" for i in range(len(column.grid))]


def _csv_spec(spec: DatasetSpec) -> DatasetSpec:
    """The spec as the CSV sees it: each functional column as M unbounded numbers."""
    if all(c.type != "functional" for c in spec.columns.values()):
        return spec
    big = float(np.finfo(np.float64).max)
    columns: dict[str, ColumnMeta] = {}
    for name, col in spec.columns.items():
        if col.type != "functional":
            columns[name] = col
            continue
        for cell in functional_cells(col):
            if cell in spec.columns:
                raise IngestError(f"metadata.columns.{cell}",
                                  f"clashes with functional column {_show(name)}")
            columns[cell] = ColumnMeta(cell, "continuous", bounds=(-big, big))
    return dataclasses.replace(spec, columns=columns)


def parse_metadata(raw: object, *, max_columns: int = MAX_COLUMNS) -> DatasetSpec:
    """Validate the upload's metadata object (already JSON-decoded).

    The rules are the marshmallow schemas of ``service.metadata`` (also in the
    OpenAPI document); the first error becomes ``IngestError`` naming its full
    path (``metadata.columns.x.prior.scale``). Unknown keys are errors at every
    level, so a typo ("bound") is reported instead of silently meaning "no
    bounds". Integer bounds and fills may be written as integral floats (17.0)
    and are stored as ``int``; continuous ones as ``float``. Column names are
    unique because they are JSON object keys (a caller that must reject
    duplicate keys in the raw JSON has to do so when decoding it).
    """
    if not isinstance(raw, dict):
        raise IngestError("metadata", "must be a JSON object")
    try:
        loaded = MetadataSchema(max_columns=max_columns).load(raw)
    except ValidationError as err:
        raise IngestError(*first_error(err.messages)) from None
    columns: dict[str, ColumnMeta] = {}
    fill: dict[str, FillValue] = {}
    for name, col in loaded["columns"].items():
        columns[name], col_fill = _column(name, col)
        if col_fill is not None:
            fill[name] = col_fill
    return DatasetSpec(
        name=loaded["name"],
        columns=columns,
        fill=fill,
        bounds_policy=cast(BoundsPolicy, loaded["bounds_policy"]),
        budgets=loaded["budgets"],
        public=loaded["public"],
        allow_holdout=loaded["allow_holdout"],
        accounting=accounting_fields(loaded),
        subset_policy=loaded.get("subset_policy"),
        keep_row_order=loaded["keep_row_order"],
    )


# --------------------------------------------------------------------------- CSV


def _is_missing(cell: str) -> bool:
    return cell.strip().lower() in _MISSING_TOKENS


def _is_missing_number(cell: str) -> bool:
    """A missing marker, or a number that is not finite ("inf", "1e999")."""
    if _is_missing(cell):
        return True
    try:
        return not math.isfinite(float(cell))
    except ValueError:
        return False


def _cell_error(column: str, line: int, message: str) -> IngestError:
    return IngestError(
        f"file.columns.{column}", f"column {_show(column)}, line {line}: {message}", line=line
    )


_CSV_ERRORS = (
    ("field larger than field limit", "a field is larger than the field size limit"),
    ("new-line character seen in unquoted field", "a line break inside an unquoted field"),
    ("line contains nul", "a NUL character"),
    ("expected after", "a quote character inside a quoted field must be doubled"),
    ("unexpected end of data", "a quoted field is not closed"),
)


def _csv_error_message(err: csv.Error) -> str:
    """A fixed description of a csv.Error; its own text is never passed on."""
    text = str(err).lower()
    for needle, description in _CSV_ERRORS:
        if needle in text:
            return f"malformed CSV: {description}"
    return "malformed CSV"


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_restore = False


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of row lists are built.

    Every kept row is a tracked container, so collections run thousands of
    times during a large parse and make it about three times slower. The rows
    form no cycles, so nothing is lost by pausing; concurrent pauses (threads)
    share a depth counter and the last one out restores the collector's state.
    """
    global _gc_depth, _gc_restore
    with _gc_lock:
        if _gc_depth == 0:
            _gc_restore = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_restore:
                gc.enable()


def _check_header(header: Sequence[str], spec: DatasetSpec) -> dict[str, int]:
    """Map each declared column to its position in the header.

    A first row that names no declared column is most likely data (a file
    without a header), so that case is checked first and names nothing.
    """
    if not any(col in spec.columns for col in header):
        raise IngestError(
            "file.header",
            "the first row names none of the declared columns; a header row is required",
        )
    positions: dict[str, int] = {}
    for index, col in enumerate(header):
        if not col:
            raise IngestError("file.header", f"header field {index + 1} is an empty column name")
        if col in positions:
            raise IngestError(
                f"file.columns.{col}", f"column {_show(col)} appears more than once in the header"
            )
        positions[col] = index
    for col in spec.columns:
        if col not in positions:
            raise IngestError(
                f"file.columns.{col}", f"declared column {_show(col)} is missing from the header"
            )
    for index, col in enumerate(header):
        if col in spec.columns:
            continue
        if len(col) > MAX_NAME_LENGTH or any(unicodedata.category(ch) == "Cc" for ch in col):
            raise IngestError(
                "file.header", f"header field {index + 1} is not a declared column"
            )
        raise IngestError(
            f"file.columns.{col}",
            f"column {_show(col)} in the header is not declared in the metadata",
        )
    return {col: positions[col] for col in spec.columns}


#: rows converted at a time: bounds the Python objects alive during a parse
#: (a row list and its cell strings cost ~20x the row's final numpy size)
CHUNK_ROWS = 65_536
#: and at most this many cells (about 55 bytes of Python objects each while a chunk
#: is alive): a 2,000-point functional column must not make chunks 30x larger
CHUNK_CELLS = 1 << 22


def _read_chunks(
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int
) -> Generator[tuple[dict[str, int], list[list[str]], array[int]], None, None]:
    """Yield (header positions of declared columns, records, each record's first line).

    The header is checked as soon as it is read, so a wrong file fails before
    its data is parsed; records come in chunks of at most ``CHUNK_ROWS`` rows and
    ``CHUNK_CELLS`` cells (at least one row).
    """
    # Decoded as it is read: a decoded copy of the whole file would be up to 4x its size.
    binary = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    lines = io.TextIOWrapper(binary, encoding="utf-8-sig", newline="")
    try:
        yield from _chunks_of(lines, spec, max_rows=max_rows, max_columns=max_columns)
    finally:
        with contextlib.suppress(ValueError):  # leave the caller's file open
            lines.detach()


def _chunks_of(
    lines: io.TextIOWrapper, spec: DatasetSpec, *, max_rows: int, max_columns: int
) -> Generator[tuple[dict[str, int], list[list[str]], array[int]], None, None]:
    reader = csv.reader(lines, strict=True)
    positions: dict[str, int] | None = None
    rows: list[list[str]] = []
    starts: array[int] = array("q")
    n_rows = 0
    previous_end = 0
    width = 0
    chunk_rows = CHUNK_ROWS
    try:
        for row in reader:
            start, previous_end = previous_end + 1, reader.line_num
            if not row:
                continue
            if positions is None:
                if len(row) > max_columns:
                    raise IngestError("file", f"the header has more than {max_columns} columns")
                positions, width = _check_header(row, spec), len(row)
                chunk_rows = max(1, min(CHUNK_ROWS, CHUNK_CELLS // width))
                continue
            if len(row) != width:
                raise IngestError(
                    f"file.line {start}",
                    f"line {start} has {len(row)} fields, the header has {width}",
                    line=start,
                )
            if n_rows >= max_rows:
                raise IngestError("file", f"more than {max_rows} data rows")
            n_rows += 1
            rows.append(row)
            starts.append(start)
            if len(rows) == chunk_rows:
                yield positions, rows, starts
                rows, starts = [], array("q")
    except csv.Error as err:
        line = reader.line_num
        raise IngestError(f"file.line {line}", _csv_error_message(err), line=line) from None
    except UnicodeDecodeError:
        # decoding runs ahead of the reader by a buffer, so no exact line can be named
        raise IngestError("file", "not valid UTF-8") from None
    if positions is None:
        raise IngestError("file", "the file is empty: a header row is required")
    if n_rows == 0:
        raise IngestError("file", "the file has a header but no data rows")
    if rows:
        yield positions, rows, starts


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _numeric_column(
    cells: Sequence[str],
    fast: Callable[[str], float | int],
    slow: Callable[[str], float | int],
    dtype: type[np.generic],
) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """Convert cells: (values, missing mask or None, index of the first malformed cell).

    The fast path converts the whole column with one C-level ``map``; only a
    column with a missing, malformed or huge cell takes the per-cell path,
    which stops at the first malformed cell (values after it are not read).
    """
    try:
        return np.fromiter(map(fast, cells), dtype=dtype, count=len(cells)), None, None
    except (ValueError, OverflowError):
        pass
    values = np.zeros(len(cells), dtype=dtype)
    missing = np.zeros(len(cells), dtype=bool)
    for i, cell in enumerate(cells):
        try:
            values[i] = slow(cell)
        except ValueError:
            if not _is_missing_number(cell):
                return values, missing, i
            missing[i] = True
    return values, missing, None


def _to_int(cell: str) -> int:
    """``int()`` syntax, plus integers written with a zero fraction ("3.0")."""
    try:
        return int(cell)
    except ValueError:
        match = _INT_WITH_ZERO_FRACTION.fullmatch(cell.strip())
        if match is None:
            raise
        return int(match.group(1))


def _convert_numeric(
    column: str, meta: ColumnMeta, cells: Sequence[str], spec: DatasetSpec, starts: array[int]
) -> np.ndarray:
    assert meta.bounds is not None
    lo, hi = meta.bounds
    if meta.type == "integer":
        below, above = int(lo) - 1, int(hi) + 1  # fit in int64: bounds are within 2**53

        def clamped(cell: str) -> int:
            # Beyond int64 is out of bounds anyway: keep just one past the bound.
            return max(below, min(above, _to_int(cell)))

        values, missing, bad = _numeric_column(cells, int, clamped, np.int64)
        malformed = "not an integer"
    else:
        values, missing, bad = _numeric_column(cells, float, float, np.float64)
        malformed = "not a number"
        nonfinite = ~np.isfinite(values)
        if nonfinite.any():
            missing = nonfinite if missing is None else (missing | nonfinite)

    # Collect the first problem of each kind and report the earliest in this chunk.
    read = len(cells) if bad is None else bad
    problems: list[tuple[int, str]] = [] if bad is None else [(bad, malformed)]
    if missing is not None:
        if column in spec.fill:
            values[missing] = spec.fill[column]
        else:
            index = _first(missing[:read])
            if index is not None:
                problems.append((index, "missing or non-finite value"))
    outside = (values[:read] < lo) | (values[:read] > hi)
    if missing is not None:
        outside &= ~missing[:read]
    if spec.bounds_policy == "reject":
        index = _first(outside)
        if index is not None:
            problems.append((index, f"value outside declared bounds [{lo}, {hi}]"))
    if problems:
        index, message = min(problems)
        raise _cell_error(column, starts[index], message)
    np.clip(values, lo, hi, out=values)
    return values


def _convert_categorical(
    column: str, meta: ColumnMeta, cells: Sequence[str], spec: DatasetSpec, starts: array[int]
) -> np.ndarray:
    assert meta.categories is not None
    codes_of = {cat: code for code, cat in enumerate(meta.categories)}
    codes = np.fromiter(map(codes_of.get, cells, repeat(-1)), dtype=np.int64, count=len(cells))
    for index in map(int, np.flatnonzero(codes < 0)):
        cell = cells[index]
        if _is_missing(cell):
            if column not in spec.fill:
                raise _cell_error(column, starts[index], "missing value")
            codes[index] = codes_of[cast(str, spec.fill[column])]
        else:
            raise _cell_error(column, starts[index], "value is not one of the declared categories")
    return codes


def iter_csv(
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int = MAX_CSV_FIELDS
) -> Iterator[dict[str, np.ndarray]]:
    """Parse and validate the CSV against ``spec``, yielding arrays chunk by chunk.

    ``data`` is the file's bytes or a binary file read as it is parsed (the
    caller keeps it open). Each chunk has one array per declared column, in
    metadata order, with the dtypes and shapes of ``parse_csv``; an error
    raises ``IngestError`` from the iteration, possibly after earlier chunks
    were yielded, so a caller must be able to discard what it wrote.
    """
    declared, spec = spec, _csv_spec(spec)
    # Row lists are the only containers built here and they form no cycles.
    chunks = _read_chunks(data, spec, max_rows=max_rows, max_columns=max_columns)
    with _gc_paused(), contextlib.closing(chunks):
        for positions, rows, starts in chunks:
            flat: dict[str, np.ndarray] = {}
            for col, meta in spec.columns.items():
                cells = list(map(itemgetter(positions[col]), rows))
                convert = _convert_categorical if meta.type == "categorical" else _convert_numeric
                flat[col] = convert(col, meta, cells, spec, starts)
                del cells
            rows.clear()  # the chunk's strings go before the consumer runs
            yield {
                name: np.column_stack([flat[cell] for cell in functional_cells(col)])
                if col.type == "functional" else flat[name]
                for name, col in declared.columns.items()
            }


def parse_csv(
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int = MAX_CSV_FIELDS
) -> tuple[int, dict[str, np.ndarray]]:
    """Parse and validate the uploaded CSV against ``spec``, in memory.

    Returns the row count and one array per declared column, in metadata
    order: float64 for continuous, int64 for integer, int64 category codes for
    categorical columns, and for a functional column ``f`` (CSV columns
    ``f.0`` ... ``f.<M-1>``) a float64 array of shape (n_rows, M) — the layout
    mechanisms expect, see ``Mechanism.run``.
    Records are converted in chunks of ``CHUNK_ROWS``; the error reported is
    the first found in the earliest chunk that has one, by column in metadata
    order, then by line. The upload streams ``iter_csv`` to disk instead.
    """
    parts: dict[str, list[np.ndarray]] = {col: [] for col in spec.columns}
    for chunk in iter_csv(data, spec, max_rows=max_rows, max_columns=max_columns):
        for col, values in chunk.items():
            parts[col].append(values)
    columns = {col: np.concatenate(arrays) for col, arrays in parts.items()}
    return len(next(iter(columns.values()))), columns


__all__ = [
    "DatasetSpec",
    "IngestError",
    "iter_csv",
    "parse_csv",
    "parse_metadata",
]

