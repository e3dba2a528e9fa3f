"""A metadata template drafted from a CSV or Parquet file, for the operator to complete.

What the file can say without harm is drafted: column names, a type per column, and the
categories of a column with few distinct values. Bounds are never read from the data:
its own minimum and maximum move when one person's value does, so a release calibrated
to them would not be differentially private; they are left ``null`` for the operator to
set from what is known about the column (a codebook, the instrument's range), and the
service refuses a numeric column without them. Budgets are left empty: nothing is
allowed unless the operator writes it down.

The file is read locally, in batches (memory: one batch and at most ``max_categories``
+ 1 distinct values per column), and nothing is sent anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privrelease_client.frames import _module

#: the most distinct values a column may have to be drafted as categorical
MAX_CATEGORIES = 50
BOUNDS_NOTE = ("bounds are not read from the data: its own minimum and maximum move when one "
               "person's value does, so noise calibrated to them would not protect that "
               "person; set each numeric column's bounds from what you know about it (a "
               "codebook, the instrument's range)")
CATEGORIES_NOTE = ("the category lists were read from the file and become public metadata: "
                   "remove any value that alone points at someone (a rare diagnosis), or list "
                   "the categories from the codebook instead")
BUDGETS_NOTE = ("budgets are empty: write the caps you allow, e.g. {\"epsilon\": 1}; nothing "
                "is allowed that the metadata does not name")


@dataclass
class _Column:
    """What a pass has seen of one column."""

    integer: bool = True  # every non-empty value so far is a whole number
    number: bool = True  # every non-empty value so far is a number
    native: str | None = None  # the Parquet type's kind, when the file has types
    values: set[str] = field(default_factory=set)  # distinct values, up to the cap + 1
    empty: int = 0


@dataclass(frozen=True)
class Draft:
    metadata: dict[str, Any]
    notes: list[str]


def draft(path: str | Path, max_categories: int = MAX_CATEGORIES) -> Draft:
    """The metadata template of the CSV or Parquet file at ``path`` and what the operator
    must still decide (``notes``)."""
    pa = _module("pyarrow", "parquet", "drafting metadata from a file")
    source = Path(path)
    columns: dict[str, _Column] = {}
    for batch in _batches(source):
        for name, array in zip(batch.schema.names, batch.columns, strict=True):
            _see(columns.setdefault(name, _Column()), array, pa, max_categories)
    meta: dict[str, Any] = {"name": source.stem, "columns": {}, "budgets": {}}
    notes, listed = [BOUNDS_NOTE], False
    for name, seen in columns.items():
        kind = _kind(seen, max_categories)
        if kind == "categorical":
            meta["columns"][name] = {"type": "categorical",
                                     "categories": sorted(seen.values)}
            listed = True
        elif kind == "text":
            notes.append(f"{name!r} has more than {max_categories} distinct values: declare "
                         "its categories, or leave the column out of the file")
        else:
            meta["columns"][name] = {"type": kind, "bounds": [None, None]}
        if seen.empty:
            notes.append(f"{name!r} has empty cells: fill or drop them before uploading")
    if listed:
        notes.append(CATEGORIES_NOTE)
    notes.append(BUDGETS_NOTE)
    return Draft(meta, notes)


def _batches(path: Path) -> Iterator[Any]:
    """The file's record batches: Parquet by its magic bytes (typed), else CSV read as
    text (types are decided over every value, not a first block)."""
    with path.open("rb") as fh:
        parquet = fh.read(4) == b"PAR1"
    if parquet:
        pq = _module("pyarrow.parquet", "parquet", "drafting metadata from a Parquet file")
        yield from pq.ParquetFile(path).iter_batches(batch_size=65_536)
        return
    pa = _module("pyarrow", "parquet", "drafting metadata from a file")
    csv = _module("pyarrow.csv", "parquet", "drafting metadata from a CSV file")
    names = csv.open_csv(path).schema.names
    reader = csv.open_csv(path, convert_options=csv.ConvertOptions(
        column_types={n: pa.string() for n in names}, strings_can_be_null=True))
    yield from reader


def _see(seen: _Column, array: Any, pa: Any, cap: int) -> None:
    pc = _module("pyarrow.compute", "parquet", "drafting metadata from a file")
    seen.empty += array.null_count
    kind = array.type
    if pa.types.is_integer(kind):
        seen.native = "integer"
    elif pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        seen.native = "continuous"
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pc.utf8_trim_whitespace(array)
        seen.empty += pc.sum(pc.equal(text, "")).as_py() or 0
        present = pc.drop_null(pc.if_else(pc.equal(text, ""), None, text))
        if seen.native is None and len(present):
            seen.integer = seen.integer and _all(pc, present, pa.int64())
            seen.number = seen.number and (seen.integer or _all(pc, present, pa.float64()))
        array = present
    else:
        seen.native = "text"
    if len(seen.values) <= cap:
        seen.values.update(str(v) for v in pc.unique(pc.drop_null(array)).to_pylist())


def _all(pc: Any, text: Any, to: Any) -> bool:
    """Whether every value of ``text`` reads as ``to`` (a whole number, a number)."""
    try:
        pc.cast(text, to)
    except (ValueError, TypeError, NotImplementedError):  # ArrowInvalid is a ValueError
        return False
    return True


def _kind(seen: _Column, cap: int) -> str:
    if seen.native in ("integer", "continuous"):
        return seen.native
    if seen.native is None and seen.values and seen.number:
        return "integer" if seen.integer else "continuous"
    return "categorical" if len(seen.values) <= cap else "text"
