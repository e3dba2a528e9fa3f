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
import itertools
import math
import re
import threading
import unicodedata
from array import array
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import BinaryIO, Literal, cast

import numpy as np

from mechanisms.base import ColumnMeta, ColumnType, DatasetMeta

BoundsPolicy = Literal["reject", "clip"]
FillValue = float | int | str

MAX_NAME_LENGTH = 200
MAX_CATEGORIES = 10_000
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_TOP_KEYS = frozenset({"name", "columns", "budgets", "bounds_policy", "public", "allow_holdout"})
_COLUMN_KEYS = frozenset(
    {"type", "bounds", "categories", "allow_missing", "fill", "prior", "grid", "norm_bound"}
)
_TYPES: tuple[ColumnType, ...] = ("continuous", "integer", "categorical", "functional")
MAX_GRID = 2000  # the functional mechanisms refuse larger grids
_POLICIES: tuple[BoundsPolicy, ...] = ("reject", "clip")
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

    def allows_missing(self, column: str) -> bool:
        """Whether empty/NaN cells of ``column`` are replaced by its fill."""
        return column in self.fill

    def meta(self, n_rows: int) -> DatasetMeta:
        """The public metadata mechanisms see, once the row count is known."""
        return DatasetMeta(n_rows=n_rows, columns=dict(self.columns),
                           allow_holdout=self.allow_holdout)


# --------------------------------------------------------------------------- metadata


def _show(name: str) -> str:
    """Quote a (public) name for a message, shortened so messages stay small."""
    return repr(name if len(name) <= 80 else name[:77] + "...")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite(value: object) -> bool:
    return _is_number(value) and math.isfinite(value)  # type: ignore[arg-type]


def _parse_bounds(raw: object, kind: ColumnType, field: str) -> tuple[float, float]:
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise IngestError(field, "must be a list [lo, hi] of two numbers")
    lo, hi = raw
    if not (_is_number(lo) and _is_number(hi)):
        raise IngestError(field, "must be a list [lo, hi] of two numbers")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise IngestError(field, "bounds must be finite")
    if kind == "integer":
        if not all(isinstance(b, int) or float(b).is_integer() for b in (lo, hi)):
            raise IngestError(field, "bounds of an integer column must be integers")
        lo, hi = int(lo), int(hi)
        # strictly inside int64, so one past either bound is still an int64
        if lo <= _INT64_MIN or hi >= _INT64_MAX:
            raise IngestError(field, "bounds of an integer column must fit in 64 bits")
    else:
        lo, hi = float(lo), float(hi)
    if not lo < hi:
        raise IngestError(field, f"lower bound {lo} must be less than upper bound {hi}")
    return lo, hi


def _parse_categories(raw: object, field: str) -> tuple[str, ...]:
    if not isinstance(raw, list | tuple) or not raw:
        raise IngestError(field, "must be a non-empty list of strings")
    if len(raw) > MAX_CATEGORIES:
        raise IngestError(field, f"at most {MAX_CATEGORIES} categories are allowed")
    if not all(isinstance(c, str) for c in raw):
        raise IngestError(field, "must be a non-empty list of strings")
    seen: set[str] = set()
    for cat in raw:
        if cat in seen:
            raise IngestError(field, f"category {_show(cat)} is listed more than once")
        seen.add(cat)
    return tuple(raw)


def _parse_fill(raw: object, meta: ColumnMeta, field: str) -> FillValue:
    if meta.type == "categorical":
        assert meta.categories is not None
        if not isinstance(raw, str) or raw not in meta.categories:
            raise IngestError(field, "must be one of the column's categories")
        return raw
    assert meta.bounds is not None
    lo, hi = meta.bounds
    if not _is_number(raw) or not math.isfinite(cast(float, raw)):
        raise IngestError(field, "must be a finite number")
    value = cast(float, raw)
    if meta.type == "integer":
        if not (isinstance(value, int) or float(value).is_integer()):
            raise IngestError(field, "must be an integer for an integer column")
        value = int(value)
    else:
        value = float(value)
    if not lo <= value <= hi:
        raise IngestError(field, f"must lie within the column's bounds [{lo}, {hi}]")
    return value


def _parse_prior(raw: object, field: str) -> dict[str, object]:
    """A public prior: a family name and numeric parameters (mechanisms check the family)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("family"), str):
        raise IngestError(field, 'must be an object with a "family" name and numeric parameters')
    if not 0 < len(raw["family"]) <= 50:
        raise IngestError(f"{field}.family", "must be 1 to 50 characters")
    for key, value in raw.items():
        if key != "family" and not _is_finite(value):
            raise IngestError(f"{field}.{key}", "must be a finite number")
    return dict(raw)


def _parse_functional(name: str, raw: dict[str, object], field: str) -> ColumnMeta:
    """A functional column: a public increasing grid and an L2 norm bound."""
    for key in ("bounds", "categories", "allow_missing", "fill"):
        if key in raw:
            raise IngestError(f"{field}.{key}", "not allowed for a functional column")
    raw_grid = raw.get("grid")
    if (not isinstance(raw_grid, list) or not 2 <= len(raw_grid) <= MAX_GRID
            or not all(map(_is_finite, raw_grid))):
        raise IngestError(f"{field}.grid", f"required: a list of 2 to {MAX_GRID} finite numbers")
    grid = tuple(float(g) for g in raw_grid)
    if any(b <= a for a, b in itertools.pairwise(grid)):
        raise IngestError(f"{field}.grid", "must be strictly increasing")
    bound = raw.get("norm_bound")
    if not _is_finite(bound) or float(bound) <= 0:  # type: ignore[arg-type]
        raise IngestError(f"{field}.norm_bound", "required: a finite number > 0")
    return ColumnMeta(name, "functional", grid=grid, norm_bound=float(bound))  # type: ignore[arg-type]


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


def _parse_column(
    name: str, raw: object, field: str
) -> tuple[ColumnMeta, FillValue | None, bool]:
    """One column's metadata, its fill and whether it allows missing cells."""
    if not isinstance(raw, dict):
        raise IngestError(field, "must be a JSON object")
    for key in raw:
        if key not in _COLUMN_KEYS:
            raise IngestError(f"{field}.{key}", f"unknown key {_show(str(key))}")
    kind = raw.get("type")
    if kind not in _TYPES:
        raise IngestError(f"{field}.type", f"must be one of {', '.join(map(repr, _TYPES))}")
    kind = cast(ColumnType, kind)
    for key in ("grid", "norm_bound"):
        if key in raw and kind != "functional":
            raise IngestError(f"{field}.{key}", f"not allowed for a {kind} column")
    if "prior" in raw and kind != "continuous":
        raise IngestError(f"{field}.prior", "only allowed for a continuous column")
    if kind == "functional":
        return _parse_functional(name, raw, field), None, False
    if kind == "categorical":
        if "bounds" in raw:
            raise IngestError(f"{field}.bounds", "not allowed for a categorical column")
        if "categories" not in raw:
            raise IngestError(f"{field}.categories", "required for a categorical column")
        meta = ColumnMeta(
            name, kind, categories=_parse_categories(raw["categories"], f"{field}.categories")
        )
    else:
        if "categories" in raw:
            raise IngestError(f"{field}.categories", f"not allowed for a {kind} column")
        if "bounds" not in raw:
            raise IngestError(f"{field}.bounds", f"required for a {kind} column")
        meta = ColumnMeta(name, kind, bounds=_parse_bounds(raw["bounds"], kind, f"{field}.bounds"),
                          prior=_parse_prior(raw["prior"], f"{field}.prior")
                          if "prior" in raw else None)
    allow_missing = raw.get("allow_missing", False)
    if not isinstance(allow_missing, bool):
        raise IngestError(f"{field}.allow_missing", "must be true or false")
    fill: FillValue | None = None
    if "fill" in raw:
        if not allow_missing:
            raise IngestError(f"{field}.fill", "only allowed with allow_missing: true")
        fill = _parse_fill(raw["fill"], meta, f"{field}.fill")
    elif allow_missing:
        if kind == "categorical":
            raise IngestError(
                f"{field}.fill", "required for a categorical column with allow_missing"
            )
        assert meta.bounds is not None
        fill = meta.bounds[0]
    return meta, fill, allow_missing


def parse_metadata(raw: object, *, max_columns: int = 1000) -> DatasetSpec:
    """Validate the upload's metadata object (already JSON-decoded).

    Unknown keys are errors at every level, so a typo ("bound") is reported
    instead of silently meaning "no bounds". Integer bounds and fills may be
    written as integral floats (17.0) and are stored as ``int``; continuous
    ones are stored as ``float``. Column names are unique because they are
    JSON object keys (a caller that must reject duplicate keys in the raw
    JSON has to do so when decoding it).
    """
    if not isinstance(raw, dict):
        raise IngestError("metadata", "must be a JSON object")
    for key in raw:
        if key not in _TOP_KEYS:
            raise IngestError(f"metadata.{key}", f"unknown key {_show(str(key))}")

    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise IngestError("metadata.name", "required, a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise IngestError("metadata.name", f"at most {MAX_NAME_LENGTH} characters")

    raw_columns = raw.get("columns")
    if not isinstance(raw_columns, dict) or not raw_columns:
        raise IngestError("metadata.columns", "required, a non-empty JSON object")
    if len(raw_columns) > max_columns:
        raise IngestError("metadata.columns", f"at most {max_columns} columns are allowed")
    columns: dict[str, ColumnMeta] = {}
    fill: dict[str, FillValue] = {}
    for col, col_raw in raw_columns.items():
        if not isinstance(col, str) or not col:
            raise IngestError("metadata.columns", "column names must be non-empty strings")
        if len(col) > MAX_NAME_LENGTH:
            raise IngestError(
                "metadata.columns", f"column names must be at most {MAX_NAME_LENGTH} characters"
            )
        if any(unicodedata.category(ch) == "Cc" for ch in col):
            # names appear in error fields, logs and CSV headers: no line breaks or tabs
            raise IngestError(
                "metadata.columns", "column names must not contain control characters"
            )
        meta, col_fill, allow_missing = _parse_column(col, col_raw, f"metadata.columns.{col}")
        columns[col] = meta
        if allow_missing:
            assert col_fill is not None
            fill[col] = col_fill

    if "budgets" not in raw:
        raise IngestError("metadata.budgets", "required")
    budgets = raw["budgets"]
    if not isinstance(budgets, dict):
        raise IngestError("metadata.budgets", "must be a JSON object")

    public = raw.get("public", False)
    if not isinstance(public, bool):
        raise IngestError("metadata.public", "must be true or false")
    allow_holdout = raw.get("allow_holdout", False)
    if not isinstance(allow_holdout, bool):
        raise IngestError("metadata.allow_holdout", "must be true or false")

    policy = raw.get("bounds_policy", "reject")
    if policy not in _POLICIES:
        raise IngestError("metadata.bounds_policy", "must be 'reject' or 'clip'")

    return DatasetSpec(
        name=name,
        columns=columns,
        fill=fill,
        bounds_policy=cast(BoundsPolicy, policy),
        budgets=budgets,
        public=public,
        allow_holdout=allow_holdout,
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


def _read_chunks(
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int
) -> Generator[tuple[dict[str, int], list[list[str]], array[int]], None, None]:
    """Yield (header positions of declared columns, records, each record's first line).

    The header is checked as soon as it is read, so a wrong file fails before
    its data is parsed; records come in chunks of at most ``CHUNK_ROWS``.
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
    try:
        for row in reader:
            start, previous_end = previous_end + 1, reader.line_num
            if not row:
                continue
            if positions is None:
                if len(row) > max_columns:
                    raise IngestError("file", f"the header has more than {max_columns} columns")
                positions, width = _check_header(row, spec), len(row)
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
            if len(rows) == CHUNK_ROWS:
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
        below, above = int(lo) - 1, int(hi) + 1  # fit in int64: see _parse_bounds

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
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int = 1000
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
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int = 1000
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

