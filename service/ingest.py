"""Turn an uploaded CSV or Parquet file and its metadata into validated, typed columns.

Pure functions (no Flask, no Redis) so the upload endpoint, the CLI and the
tests share one definition of a valid dataset. Bounds and categories come
from the metadata, never from the data (DESIGN §6), and no error message ever
contains a cell value: messages name only the column, the line (CSV) or row
(Parquet) number and public metadata, because upload errors end up in HTTP
responses and logs. pyarrow's own error texts quote the offending cell, so
none is ever passed on: an Arrow error is only a signal that something is
wrong, and the report is built here.

Formats (``iter_upload``): a file that begins and ends with Parquet's magic
bytes ``PAR1`` is Parquet, anything else is CSV. The client's declared content
type is not trusted to decide, but a part declared
``application/vnd.apache.parquet`` that is not Parquet is refused, and so is a
file that begins as Parquet (``PAR1`` and binary pages) without its end: a
Parquet file cut short, named as such (read as CSV it would be "not valid UTF-8").

Parquet in bounded memory: before any page is read, each column chunk's
uncompressed size (the footer's) must fit its rows of the declared type
(``_check_sizes``) and ``MAX_CHUNK_BYTES``; text columns are read as
dictionaries, each distinct value once, and a text number is at most
``TEXT_NUMBER_BYTES``. A few KiB of compressed pages (a long value repeated)
would otherwise decompress into gigabytes.

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
- A field longer than 131,072 characters (Python's csv limit, kept) is
  malformed; so is a record spanning more than two blocks (a record of up to
  ``BLOCK_SIZE`` = 256 KiB is always read), and a quoted field left open at
  the end of the file (a cut upload). Quoting otherwise follows pyarrow's
  reader, which is lenient where Python's strict csv module was not: text
  after a closing quote is appended to the field (``"a"b`` is ``ab``) unless
  that makes a cell invalid, when the line lookup reports the malformed CSV.
  A file whose quotes all delimit fields holds an even number of them, so an
  open quote at the end is looked for (by Python's csv) only in a file with
  an odd count; one that also has a stray quote inside an unquoted field can
  hide it, a file no CSV writer produces.

How: pyarrow's streaming reader (``pyarrow.csv.open_csv``) reads blocks of
``BLOCK_SIZE`` bytes, every column as text (categorical ones
dictionary-encoded), and each block is converted and validated with
``pyarrow.compute`` and numpy. Text is converted by Arrow's parsers where they
agree with Python's (checked: Arrow also takes hexadecimal integers and
``nan(…)``, so those spellings are sent to Python's); a block column Arrow
cannot convert takes Python's per-cell path, so the rules above hold to the
letter. A line number is looked up (by re-reading the file with Python's csv
module) only when an error is reported, and an Arrow parse error is explained
the same way: its own text is dropped.

Parquet: columns are matched by name like a CSV header (a functional column
``f`` as ``f.0`` … ``f.<M-1>``); integer and floating types serve numeric
columns (a float column's values must be integral for an integer column, as
pandas writes a nullable integer column), text, dictionary or integer types
serve categorical ones, and a null is a missing value. Row groups are read in
batches of at most ``CHUNK_ROWS`` rows with buffered column reads.

``iter_csv``/``iter_parquet`` hand each chunk's arrays on, so a caller that
writes them out (the upload) holds one chunk, never the file or all its rows.
The error reported is the first one found in the earliest chunk that has one
(by column in metadata order, then by line).
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import io
import math
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
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
    #: gaussian_accounting, zcdp_delta, notions (absent: registration resolves it),
    #: allow_mixed_noiseless_dp, record_level (stored as given)
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


# --------------------------------------------------------------------------- cells


#: Python's ``str.strip()`` whitespace, so Arrow's trim removes exactly what it would
_PY_WHITESPACE = "".join(ch for ch in map(chr, range(0x110000)) if ch.isspace())
_TOKENS = pa.array(sorted(_MISSING_TOKENS), pa.string())
#: the spellings of NaN that Python's ``float()`` accepts (Arrow also takes "nan(…)")
_NAN_SPELLINGS = pa.array(["nan", "+nan", "-nan"], pa.string())
#: at most 18 digits (fits int64), optionally a zero fraction: Arrow's cast then agrees
#: with ``int()``; anything else (underscores, other scripts' digits) goes to Python
_PLAIN_INT = r"^[+-]?[0-9]{1,18}(\.0*)?$"
#: Python's csv field limit (characters), kept from the earlier parser
FIELD_LIMIT = 131_072
#: bytes pyarrow reads and parses at a time; its streaming reader reads up to 32 blocks
#: ahead, so an upload's memory is bounded by ~40 blocks whatever the file size (measured:
#: ~24 MB growth at 256 KiB); a record spanning more than two blocks is refused
BLOCK_SIZE = 1 << 18
#: rows converted and handed on at a time (a block of narrow rows holds ~30,000)
CHUNK_ROWS = 65_536
#: Parquet: the most bytes a column chunk (one column of one row group) may take
#: uncompressed, whatever its rows: Arrow decompresses a page whole, so this bounds what a
#: small hostile file makes an upload allocate (writers default to about 1 Mi rows or
#: 128 MiB a row group)
MAX_CHUNK_BYTES = 256 << 20
#: Parquet: the most bytes one cell of a text column read as numbers may take (a number
#: written longer exists only in a hostile file; the cells are decoded before parsing)
TEXT_NUMBER_BYTES = 256
#: Parquet: what a column chunk may hold beyond its cells (page headers, statistics)
CHUNK_SLACK = 1 << 16
#: and at most this many cells: a 2,000-point functional column must not make
#: chunks 30x larger
CHUNK_CELLS = 1 << 22


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


def _trimmed(text: pa.Array) -> pa.Array:
    return pc.utf8_trim(text, characters=_PY_WHITESPACE)


def _is_token(text: pa.Array) -> np.ndarray:
    """Which cells are missing markers (trimmed, case-insensitive), as a numpy mask."""
    tokens = pc.is_in(pc.utf8_lower(_trimmed(text)), value_set=_TOKENS)
    return np.asarray(tokens.to_numpy(zero_copy_only=False), dtype=bool)


class _Problem(Exception):
    """A cell that breaks a rule: its index in the chunk and a value-free message."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


def _cell_error(column: str, where: str, message: str, line: int | None) -> IngestError:
    return IngestError(
        f"file.columns.{column}", f"column {_show(column)}, {where}: {message}", line=line
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


def _check_header(header: Sequence[str], spec: DatasetSpec, noun: str = "header"
                  ) -> dict[str, int]:
    """Map each declared column to its position in the header (or Parquet schema).

    A first row that names no declared column is most likely data (a file
    without a header), so that case is checked first and names nothing.
    """
    if not any(col in spec.columns for col in header):
        raise IngestError(
            "file.header",
            "the first row names none of the declared columns; a header row is required"
            if noun == "header" else f"the {noun} names none of the declared columns",
        )
    positions: dict[str, int] = {}
    for index, col in enumerate(header):
        if not col:
            raise IngestError("file.header", f"{noun} field {index + 1} is an empty column name")
        if col in positions:
            raise IngestError(
                f"file.columns.{col}", f"column {_show(col)} appears more than once in the {noun}"
            )
        positions[col] = index
    for col in spec.columns:
        if col not in positions:
            raise IngestError(
                f"file.columns.{col}", f"declared column {_show(col)} is missing from the {noun}"
            )
    for index, col in enumerate(header):
        if col in spec.columns:
            continue
        if len(col) > MAX_NAME_LENGTH or any(unicodedata.category(ch) == "Cc" for ch in col):
            raise IngestError(
                "file.header", f"{noun} field {index + 1} is not a declared column"
            )
        raise IngestError(
            f"file.columns.{col}",
            f"column {_show(col)} in the {noun} is not declared in the metadata",
        )
    return {col: positions[col] for col in spec.columns}


def _chunk_rows(width: int) -> int:
    """Rows per chunk: ``CHUNK_ROWS``, fewer for wide rows (read at call time: tests set it)."""
    return max(1, min(CHUNK_ROWS, CHUNK_CELLS // max(width, 1)))


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


# --------------------------------------------------------------------------- conversion


def _python_numbers(
    cells: Sequence[str],
    fast: Callable[[str], float | int],
    slow: Callable[[str], float | int],
    dtype: type[np.generic],
) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """Cells converted by Python: (values, missing mask or None, first malformed index).

    The exact definition of the numeric rules, taken for a chunk's column when
    Arrow's vectorised conversion does not apply; it stops at the first
    malformed cell (values after it are not read).
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


def _text_floats(text: pa.Array) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """Continuous cells from text: Arrow's parser (as ``float()``), else Python's.

    Missing cells (markers, and anything that parses to a non-finite float) are
    marked in the mask, whichever path converted them.
    """
    bad = None
    values = _arrow_floats(text)
    if values is None:
        values, missing, bad = _python_numbers(text.to_pylist(), float, float, np.float64)
        if missing is not None:
            values[missing] = np.nan
    nonfinite = ~np.isfinite(values)
    return values, (nonfinite if nonfinite.any() else None), bad


def _arrow_floats(text: pa.Array) -> np.ndarray | None:
    """Arrow's conversion of the cells (missing markers as NaN), or None where it might
    not agree with ``float()``."""
    try:
        parsed, source = pc.cast(text, pa.float64()), text
    except pa.ArrowInvalid:  # whitespace or missing markers: trim and mark them, then retry
        source = _trimmed(text)
        source = pc.if_else(_is_token(source), "nan", source)
        try:
            parsed = pc.cast(source, pa.float64())
        except pa.ArrowInvalid:
            return None
    values = np.array(parsed.to_numpy(zero_copy_only=False), dtype=np.float64)
    nan = np.isnan(values)
    if nan.any():  # Arrow reads "nan(123)", float() does not: NaN cells must be spelled as NaN
        spelled = pc.is_in(pc.utf8_lower(_trimmed(source.filter(pa.array(nan)))),
                           value_set=_NAN_SPELLINGS)
        if not pc.all(spelled).as_py():
            return None
    return values


def _has_x(text: pa.Array) -> bool:
    """Whether the cells' bytes hold an 'x' or 'X' (Arrow casts "0x10" to 16)."""
    data = text.buffers()[2]
    if data is None or len(text) == 0:
        return False
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)
    first, last = offsets[text.offset], offsets[text.offset + len(text)]
    raw = np.frombuffer(data, dtype=np.uint8)[first:last]  # this slice's cells only
    return bool(np.any((raw == ord("x")) | (raw == ord("X"))))


def _text_ints(text: pa.Array, lo: int, hi: int
               ) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """Integer cells from text: Arrow's cast where it agrees with ``int()``, else Python's."""
    if not _has_x(text):
        try:
            parsed = pc.cast(text, pa.int64())
            return np.array(parsed.to_numpy(zero_copy_only=False), dtype=np.int64), None, None
        except pa.ArrowInvalid:
            pass
    trimmed = _trimmed(text)
    missing = _is_token(trimmed)
    plain = np.asarray(pc.match_substring_regex(trimmed, _PLAIN_INT)
                       .to_numpy(zero_copy_only=False), dtype=bool)
    if np.all(plain | missing):
        digits = pc.replace_substring_regex(trimmed, r"^\+|\.0*$", "")
        parsed = pc.cast(pc.if_else(pa.array(missing), "0", digits), pa.int64())
        values = np.array(parsed.to_numpy(zero_copy_only=False), dtype=np.int64)
        return values, (missing if missing.any() else None), None
    below, above = int(lo) - 1, int(hi) + 1  # fit in int64: bounds are within 2**53

    def clamped(cell: str) -> int:
        # Beyond int64 is out of bounds anyway: keep just one past the bound.
        return max(below, min(above, _to_int(cell)))

    return _python_numbers(text.to_pylist(), int, clamped, np.int64)


def _is_text(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_string_view(kind))


def _typed_numbers(column: str, meta: ColumnMeta, values: pa.Array
                   ) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """Numeric cells of a typed (Parquet) column; nulls and non-finite floats are missing."""
    assert meta.bounds is not None
    kind = values.type
    if pa.types.is_dictionary(kind):
        # text numbers come as dictionaries (``iter_parquet``): decoded, a batch holds at
        # most TEXT_NUMBER_BYTES a cell, so a long value repeated cannot blow it up
        text = values.dictionary
        if (len(text) and _is_text(text.type)
                and pc.max(pc.binary_length(text)).as_py() > TEXT_NUMBER_BYTES):
            raise IngestError(f"file.columns.{column}",
                              f"column {_show(column)} holds text longer than "
                              f"{TEXT_NUMBER_BYTES} bytes; a {meta.type} column needs numbers")
        return _typed_numbers(column, meta, values.dictionary_decode())
    if _is_text(kind):
        text = pc.fill_null(values.cast(pa.string()), "")
        if meta.type == "integer":
            return _text_ints(text, int(meta.bounds[0]), int(meta.bounds[1]))
        return _text_floats(text)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_decimal(kind)):
        raise IngestError(f"file.columns.{column}",
                          f"column {_show(column)} has type {kind}; a {meta.type} column "
                          "needs numbers")
    nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if meta.type == "continuous" or not pa.types.is_integer(kind):
        floats = np.array(pc.cast(values, pa.float64(), safe=False)
                          .to_numpy(zero_copy_only=False), dtype=np.float64)
        missing = ~np.isfinite(floats) | nulls
        if meta.type == "continuous":
            return floats, (missing if missing.any() else None), None
        # an integer column written as floats (pandas with NaN): values must be integral
        fractional = ~missing & (floats != np.floor(np.where(missing, 0.0, floats)))
        bad = _first(fractional)
        lo, hi = meta.bounds
        ints = np.clip(np.where(missing, lo, floats), lo - 1, hi + 1).astype(np.int64)
        return ints, (missing if missing.any() else None), bad
    filled = pc.fill_null(values, 0)
    if kind == pa.uint64():  # beyond int64 is out of bounds anyway: keep one past it
        filled = pc.min_element_wise(filled, pa.scalar(2**63 - 1, pa.uint64()))
    ints = np.array(pc.cast(filled, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    return ints, (nulls if nulls.any() else None), None


def _check_numeric(column: str, meta: ColumnMeta, spec: DatasetSpec, values: np.ndarray,
                   missing: np.ndarray | None, bad: int | None) -> np.ndarray:
    """Apply the missing-value rule and the bounds policy; raise the chunk's first problem."""
    assert meta.bounds is not None
    lo, hi = meta.bounds
    malformed = "not an integer" if meta.type == "integer" else "not a number"
    # Collect the first problem of each kind and report the earliest in this chunk.
    read = len(values) if bad is None else bad
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
        raise _Problem(*min(problems))
    np.clip(values, lo, hi, out=values)
    return values


def _category_codes(column: str, meta: ColumnMeta, spec: DatasetSpec, cells: pa.Array
                    ) -> np.ndarray:
    """int64 codes of a categorical column (text, dictionary-encoded text or integers).

    Each distinct value is looked up once (through the dictionary), so the cost
    per cell is one gather; a null or missing marker takes the fill if allowed.
    """
    assert meta.categories is not None
    kind = cells.type
    if pa.types.is_integer(kind):  # integer-typed Parquet categories: their decimal text
        cells = cells.cast(pa.string())
    elif not (pa.types.is_dictionary(kind) or _is_text(kind)):
        raise IngestError(f"file.columns.{column}",
                          f"column {_show(column)} has type {kind}; a categorical column "
                          "needs text")
    if not pa.types.is_dictionary(cells.type):
        cells = pc.dictionary_encode(cells.cast(pa.string()))
    dictionary = cells.dictionary.cast(pa.string())
    known = np.asarray(pc.fill_null(pc.index_in(
        dictionary, value_set=pa.array(meta.categories, pa.string())), -1)
        .to_numpy(zero_copy_only=False), dtype=np.int64)
    # per distinct value: its code, -2 for a missing marker, -1 for anything else
    table = np.where(known >= 0, known, np.where(_is_token(dictionary), -2, -1))
    indices = cells.indices
    positions = np.asarray(pc.fill_null(indices, 0).to_numpy(zero_copy_only=False),
                           dtype=np.int64)
    codes = table[positions] if len(table) else np.full(len(cells), -2, dtype=np.int64)
    if indices.null_count:
        codes[np.asarray(indices.is_null().to_numpy(zero_copy_only=False), dtype=bool)] = -2
    index = _first(codes < 0)
    if index is None:
        return codes
    if column in spec.fill:
        invalid = _first(codes == -1)
        if invalid is not None:
            raise _Problem(invalid, "value is not one of the declared categories")
        codes[codes == -2] = meta.categories.index(cast(str, spec.fill[column]))
        return codes
    if codes[index] == -2:
        raise _Problem(index, "missing value")
    raise _Problem(index, "value is not one of the declared categories")


def _too_long(cells: pa.Array) -> int | None:
    """Index of the first cell longer than ``FIELD_LIMIT`` characters, or None."""
    text = cells.dictionary if pa.types.is_dictionary(cells.type) else cells
    if len(text) == 0 or pc.max(pc.binary_length(text)).as_py() <= FIELD_LIMIT:
        return None  # bytes bound characters: most chunks stop here
    long = np.asarray(pc.greater(pc.utf8_length(text), FIELD_LIMIT)
                      .to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_dictionary(cells.type):
        long = long[np.asarray(cells.indices.to_numpy(zero_copy_only=False), dtype=np.int64)]
    return _first(long)


def _convert(column: str, meta: ColumnMeta, spec: DatasetSpec, cells: pa.Array,
             typed: bool) -> np.ndarray:
    """One chunk of one column as its stored numpy array; ``_Problem`` for a bad cell."""
    if meta.type == "categorical":
        return _category_codes(column, meta, spec, cells)
    assert meta.bounds is not None
    if typed:
        values, missing, bad = _typed_numbers(column, meta, cells)
    elif meta.type == "integer":
        values, missing, bad = _text_ints(cells, int(meta.bounds[0]), int(meta.bounds[1]))
    else:
        values, missing, bad = _text_floats(cells)
    return _check_numeric(column, meta, spec, values, missing, bad)


# --------------------------------------------------------------------------- chunks


@dataclass
class _Source:
    """How a format names a record in errors: CSV lines (looked up) or Parquet rows."""

    #: record index (0-based, data rows) -> ("line 12", 12) or ("row 12", None)
    where: Callable[[int], tuple[str, int | None]]
    #: whether the columns are typed (Parquet) rather than text (CSV)
    typed: bool


def _validated(batches: Iterator[pa.RecordBatch], declared: DatasetSpec, spec: DatasetSpec,
               source: _Source, *, max_rows: int, empty: str | None
               ) -> Iterator[dict[str, np.ndarray]]:
    """Convert and validate record batches chunk by chunk, in metadata column layout
    (no rows at all: IngestError ``empty``, unless None)."""
    width = len(spec.columns)
    seen = 0
    for batch in batches:
        if seen + batch.num_rows > max_rows:
            raise IngestError("file", f"more than {max_rows} data rows")
        step = _chunk_rows(width)
        for offset in range(0, batch.num_rows, step):
            chunk = batch.slice(offset, step)
            flat: dict[str, np.ndarray] = {}
            if not source.typed:  # structural first, as a CSV reader would find it
                long = [i for i in (_too_long(chunk.column(c)) for c in spec.columns)
                        if i is not None]
                if long:
                    where, line = source.where(seen + offset + min(long))
                    field = f"file.{where}" if line is not None else "file"
                    raise IngestError(field, "malformed CSV: a field is larger than the "
                                      "field size limit", line=line)
            for col, meta in spec.columns.items():
                try:
                    flat[col] = _convert(col, meta, spec, chunk.column(col), source.typed)
                except _Problem as problem:
                    where, line = source.where(seen + offset + problem.index)
                    raise _cell_error(col, where, problem.message, line) from None
            yield {
                name: np.column_stack([flat[cell] for cell in functional_cells(col)])
                if col.type == "functional" else flat[name]
                for name, col in declared.columns.items()
            }
        seen += batch.num_rows
    if seen == 0 and empty is not None:
        raise IngestError("file", empty)


@contextlib.contextmanager
def _seekable(data: bytes | BinaryIO) -> Iterator[BinaryIO]:
    """The upload as a seekable binary file (bytes wrapped, a pipe spooled to disk).

    Errors are explained by re-reading the file, and Parquet is read from its end.
    """
    if isinstance(data, bytes | bytearray):
        yield io.BytesIO(data)
        return
    if data.seekable():
        yield data
        return
    with tempfile.TemporaryFile() as spool:
        shutil.copyfileobj(data, spool, BLOCK_SIZE)
        spool.seek(0)
        yield cast(BinaryIO, spool)


# --------------------------------------------------------------------------- CSV


def _records(source: BinaryIO, start: int) -> Generator[tuple[int, list[str]], None, None]:
    """(first line, fields) of each non-blank record, read by Python's csv module.

    The reference reading of the CSV rules: it finds the header, numbers lines
    and explains what Arrow refused (structure errors raise ``IngestError``).
    """
    source.seek(start)
    # Decoded as it is read: a decoded copy of the whole file would be up to 4x its size.
    lines = io.TextIOWrapper(source, encoding="utf-8-sig", newline="")
    reader = csv.reader(lines, strict=True)
    previous_end = 0
    error: IngestError | None = None
    try:
        for row in reader:
            first, previous_end = previous_end + 1, reader.line_num
            if row:
                yield first, row
    except csv.Error as err:
        line = reader.line_num
        error = IngestError(f"file.line {line}", _csv_error_message(err), line=line)
    except UnicodeDecodeError:
        # decoding runs ahead of the reader by a buffer, so no exact line can be named
        error = IngestError("file", "not valid UTF-8")
    finally:
        with contextlib.suppress(ValueError):  # leave the caller's file open
            lines.detach()
    if error is not None:  # raised outside the handler: no chained error quotes a byte
        raise error


def _header(source: BinaryIO, start: int) -> list[str] | None:
    with contextlib.closing(_records(source, start)) as records:
        return next((row for _, row in records), None)


def _structure_error(source: BinaryIO, start: int, width: int) -> IngestError | None:
    """The first structure error Python's csv module finds (ragged record, open quote,
    bad UTF-8...), or None."""
    with contextlib.closing(_records(source, start)) as records:
        for index, (line, row) in enumerate(records):
            if index and len(row) != width:
                return IngestError(f"file.line {line}",
                                   f"line {line} has {len(row)} fields, the header has {width}",
                                   line=line)
    return None


def _explain(source: BinaryIO, start: int, width: int) -> IngestError:
    """What Arrow refused, found by Python's csv module (Arrow's message quotes cells)."""
    error = _structure_error(source, start, width)
    if error is not None:
        return error
    return IngestError("file", f"malformed CSV (or a record longer than {BLOCK_SIZE} bytes)")


class _QuoteCounter(io.RawIOBase):
    """The upload as Arrow reads it, counting quote characters on the way.

    Arrow closes a quoted field left open at the end of the file (a cut upload
    would pass); an even count of quotes rules that out for every file whose
    quotes all delimit fields, so only an odd count costs a strict re-read.
    ``bytes.count`` runs at memory speed, so the count is free beside parsing.
    """

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self.quotes = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        data = self._raw.read(-1 if size is None else size)
        self.quotes += data.count(b'"')
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:  # the caller's file stays open
        super().close()


def _line_of(source: BinaryIO, start: int, record: int) -> tuple[str, int | None]:
    """The line on which data record ``record`` (0-based) starts: only asked for an error."""
    position = source.tell()
    try:
        with contextlib.closing(_records(source, start)) as records:
            for index, (line, _) in enumerate(records):
                if index == record + 1:
                    return f"line {line}", line
    finally:
        source.seek(position)
    return f"record {record + 1}", None


def _csv_batches(source: BinaryIO, start: int, header: list[str], spec: DatasetSpec
                 ) -> Iterator[pa.RecordBatch]:
    """Arrow's streaming reader over the file: every column as text, categories encoded."""
    text = {col: pa.dictionary(pa.int32(), pa.string()) if meta.type == "categorical"
            else pa.string() for col, meta in spec.columns.items()}
    source.seek(start)
    counted = _QuoteCounter(source)
    try:
        reader = pa_csv.open_csv(
            counted,
            read_options=pa_csv.ReadOptions(block_size=BLOCK_SIZE),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True, ignore_empty_lines=True),
            convert_options=pa_csv.ConvertOptions(column_types=text, strings_can_be_null=False,
                                                  quoted_strings_can_be_null=False,
                                                  null_values=[]))
        readable = reader.schema.names == header
    except pa.ArrowException:
        readable = False
    # Raised outside the handlers: Arrow's messages quote cells, so no error chains to one.
    if not readable:
        raise _explain(source, start, len(header))
    while True:
        failed = False
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowException:
            failed = True
        if failed:
            raise _explain(source, start, len(header))
        yield batch
    if counted.quotes % 2:  # perhaps a quote left open at the end: Python's csv decides
        error = _structure_error(source, start, len(header))
        if error is not None:
            raise error


def iter_csv(
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int = MAX_CSV_FIELDS
) -> Iterator[dict[str, np.ndarray]]:
    """Parse and validate the CSV against ``spec``, yielding arrays chunk by chunk.

    ``data`` is the file's bytes or a binary file read as it is parsed (the
    caller keeps it open; one that cannot seek is spooled to a temporary file).
    Each chunk has one array per declared column, in metadata order, with the
    dtypes and shapes of ``parse_csv``; an error raises ``IngestError`` from
    the iteration, possibly after earlier chunks were yielded, so a caller
    must be able to discard what it wrote.
    """
    declared, spec = spec, _csv_spec(spec)
    with _seekable(data) as source:
        start = source.tell()
        header = _header(source, start)
        if header is None:
            raise IngestError("file", "the file is empty: a header row is required")
        if len(header) > max_columns:
            raise IngestError("file", f"the header has more than {max_columns} columns")
        _check_header(header, spec)
        located = _Source(lambda record: _line_of(source, start, record), typed=False)
        yield from _validated(_csv_batches(source, start, header, spec), declared, spec,
                              located, max_rows=max_rows,
                              empty="the file has a header but no data rows")


def parse_csv(
    data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int, max_columns: int = MAX_CSV_FIELDS
) -> tuple[int, dict[str, np.ndarray]]:
    """Parse and validate the uploaded CSV against ``spec``, in memory.

    Returns the row count and one array per declared column, in metadata
    order: float64 for continuous, int64 for integer, int64 category codes for
    categorical columns, and for a functional column ``f`` (CSV columns
    ``f.0`` ... ``f.<M-1>``) a float64 array of shape (n_rows, M) — the layout
    mechanisms expect, see ``Mechanism.run``.
    The error reported is the first found in the earliest chunk that has one,
    by column in metadata order, then by line. The upload streams
    ``iter_upload`` to disk instead.
    """
    return _collect(iter_csv(data, spec, max_rows=max_rows, max_columns=max_columns), spec)


def _collect(chunks: Iterator[dict[str, np.ndarray]], spec: DatasetSpec
             ) -> tuple[int, dict[str, np.ndarray]]:
    parts: dict[str, list[np.ndarray]] = {col: [] for col in spec.columns}
    for chunk in chunks:
        for col, values in chunk.items():
            parts[col].append(values)
    columns = {col: np.concatenate(arrays) for col, arrays in parts.items()}
    return len(next(iter(columns.values()))), columns


# --------------------------------------------------------------------------- Parquet

PARQUET_MAGIC = b"PAR1"
PARQUET_TYPE = "application/vnd.apache.parquet"


def is_parquet(source: BinaryIO) -> bool:
    """Whether the (seekable) file begins and ends with Parquet's magic bytes."""
    start = source.tell()
    try:
        head = source.read(4)
        source.seek(0, io.SEEK_END)
        if source.tell() - start < 12:
            return False
        source.seek(-4, io.SEEK_END)
        return head == PARQUET_MAGIC and source.read(4) == PARQUET_MAGIC
    finally:
        source.seek(start)


def is_cut_parquet(source: BinaryIO) -> bool:
    """Whether the (seekable) file begins with Parquet's magic bytes and binary pages but
    lacks Parquet's end: a Parquet file cut short (its footer is at the end). A CSV whose
    header happens to begin with ``PAR1`` is text, so it is not taken for one."""
    start = source.tell()
    try:
        head = source.read(4096)
    finally:
        source.seek(start)
    if not head.startswith(PARQUET_MAGIC):
        return False
    try:  # a multi-byte character cut at the 4096th byte is still text
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return True
    return b"\x00" in head


def _parquet_batches(parquet: pq.ParquetFile, columns: list[str], rows: int
                     ) -> Iterator[pa.RecordBatch]:
    batches = parquet.iter_batches(batch_size=rows, columns=columns, use_threads=False)
    while True:
        failed = False
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError):  # their messages may quote data: never passed on
            failed = True
        if failed:
            raise IngestError("file", "the Parquet file is corrupt or unreadable")
        yield batch


def _open_parquet(source: BinaryIO, dictionaries: list[str] | None = None) -> pq.ParquetFile:
    """The file's reader (its footer read), text columns among ``dictionaries`` read as
    dictionaries; IngestError if it is not a readable Parquet file."""
    parquet: pq.ParquetFile | None = None
    try:
        parquet = pq.ParquetFile(source, buffer_size=BLOCK_SIZE, pre_buffer=False,
                                 read_dictionary=dictionaries)
        if parquet.schema_arrow is None or parquet.metadata is None:  # read now: errors here
            parquet = None
    except (pa.ArrowException, OSError, ValueError, KeyError):
        parquet = None
    if parquet is None:  # outside the handler: no chained error quotes the file
        raise IngestError("file", "not a readable Parquet file")
    return parquet


def _cell_bytes(meta: ColumnMeta, kind: pa.DataType) -> int:
    """The most bytes one valid cell of ``meta`` takes uncompressed as stored (``kind``,
    the file's Arrow type): a declared category or missing marker (text), a number as
    text (``TEXT_NUMBER_BYTES``), or a fixed-width number; with its length prefix and
    definition level. Public: the metadata and the file's schema."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not _is_text(kind):
        return 40  # fixed width: at most a 256-bit decimal, with its levels
    if meta.type == "categorical":
        assert meta.categories is not None
        return max([4, *(len(c.encode("utf-8")) for c in meta.categories)]) + 8
    return TEXT_NUMBER_BYTES + 8


def _check_sizes(parquet: pq.ParquetFile, spec: DatasetSpec) -> None:
    """Refuse a file whose column chunks hold more bytes (uncompressed, as its footer
    says) than their rows of the declared types can, or more than ``MAX_CHUNK_BYTES``,
    before a page is read: a few KiB of compressed pages can otherwise decompress into
    gigabytes (a long value repeated). Also refuses nested columns (a declared column
    is one flat Parquet column)."""
    schema = parquet.schema_arrow
    metadata = parquet.metadata
    paths = [metadata.schema.column(j).path for j in range(metadata.num_columns)]
    for name in spec.columns:
        kind = schema.field(name).type
        if pa.types.is_nested(kind) or name not in paths:
            raise IngestError(f"file.columns.{name}",
                              f"column {_show(name)} has type {kind}; declared columns are "
                              "flat (numbers or text)")
        j, cell = paths.index(name), _cell_bytes(spec.columns[name], kind)
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group)
            size = rows.column(j).total_uncompressed_size
            if size > min(MAX_CHUNK_BYTES, rows.num_rows * cell + CHUNK_SLACK):
                raise IngestError(
                    f"file.columns.{name}",
                    f"column {_show(name)}: row group {group + 1} is larger uncompressed than"
                    f" its {rows.num_rows} rows of the declared type can be (or than "
                    f"{MAX_CHUNK_BYTES >> 20} MiB); write the file with smaller row groups,"
                    " or check that its values are the declared ones")


def iter_parquet(data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int,
                 max_columns: int = MAX_CSV_FIELDS, empty_ok: bool = False
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Validate a Parquet file against ``spec``, yielding arrays chunk by chunk.

    The same contract as ``iter_csv``: columns are matched by name (the
    schema plays the header), errors name the column and the 1-based data row.
    Column chunks are read with a bounded buffer, so memory holds a batch of
    ``CHUNK_ROWS`` rows and a read buffer per column, not a row group. ``data`` may be
    a pyarrow file (an object of a store, read by byte ranges); ``empty_ok``: a file of
    no rows yields nothing (one part of a dataset of several files) instead of failing.
    """
    declared, spec = spec, _csv_spec(spec)
    with _seekable(data) as source:
        parquet = _open_parquet(source)
        names, n_rows = parquet.schema_arrow.names, parquet.metadata.num_rows
        with contextlib.closing(parquet):
            if len(names) > max_columns:
                raise IngestError("file", f"the file has more than {max_columns} columns")
            _check_header(names, spec, noun="Parquet schema")
            if n_rows > max_rows:
                raise IngestError("file", f"more than {max_rows} data rows")
            _check_sizes(parquet, spec)
        # text columns read as dictionaries: each distinct value once, never repeated per
        # row (a categorical column is coded through its dictionary, numbers parsed once)
        parquet = _open_parquet(source, list(spec.columns))
        with contextlib.closing(parquet):
            batches = _parquet_batches(parquet, list(spec.columns), _chunk_rows(len(spec.columns)))
            located = _Source(lambda record: (f"row {record + 1}", None), typed=True)
            yield from _validated(batches, declared, spec, located, max_rows=max_rows,
                                  empty=None if empty_ok else "the file has no data rows")


def parse_parquet(data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int
                  ) -> tuple[int, dict[str, np.ndarray]]:
    """``parse_csv`` for a Parquet file: the row count and the columns, in memory."""
    return _collect(iter_parquet(data, spec, max_rows=max_rows), spec)


def iter_upload(data: bytes | BinaryIO, spec: DatasetSpec, *, max_rows: int,
                content_type: str | None = None) -> Iterator[dict[str, np.ndarray]]:
    """An uploaded file's chunks, CSV or Parquet as its magic bytes say.

    The client's content type is not trusted to choose (a CSV sent as
    ``application/octet-stream`` is still a CSV), but one declared Parquet that
    is not is refused rather than read as text.
    """
    with _seekable(data) as source:
        if is_parquet(source):
            yield from iter_parquet(source, spec, max_rows=max_rows)
            return
        if is_cut_parquet(source):  # not read as CSV: "not valid UTF-8" would mislead
            raise IngestError("file", "the file begins as Parquet but its end is missing (a "
                              "Parquet file ends with its footer): was the upload cut short?")
        if (content_type or "").split(";")[0].strip().lower() == PARQUET_TYPE:
            raise IngestError("file", "declared as Parquet but is not a Parquet file")
        yield from iter_csv(source, spec, max_rows=max_rows)


__all__ = [
    "BLOCK_SIZE",
    "PARQUET_TYPE",
    "DatasetSpec",
    "IngestError",
    "is_cut_parquet",
    "is_parquet",
    "iter_csv",
    "iter_parquet",
    "iter_upload",
    "parse_csv",
    "parse_metadata",
    "parse_parquet",
]
