"""A release's peak memory from public inputs (issue #30 item 6).

A worker that runs out of memory is killed, its job re-run and then charged as failed:
so the service refuses, before any data is read, a release whose bound exceeds the
worker's memory. The bound is a model of ``service.releases.run._run`` calibrated by
measurement (``tests/memory_probe.py``: tracemalloc and Arrow's pool, on stored versions):

* a mechanism that reads whole columns holds every column of the version (8 bytes a
  cell: numbers and category codes; a functional column has its grid's cells per row),
  and while loading one column a transient of ``LOAD_TRANSIENT`` times the widest column
  (Arrow's buffer and its conversion) and 8 bytes a row (list offsets);
* a streaming mechanism holds one row group (at most ``BATCH_ROWS`` rows) of the columns
  it reads instead, and its public table (cells of a cross-tab, bins, grid points);
* a record-level row map (``RecordMechanism``, ``mechanisms.record_maps``) holds one row
  group of the columns it reads at a time (with the transient of reading it), and the
  table it builds over every row;
* all add, per row held (every row, for a row map: its table), the run's own
  ``row_bytes`` (a row map: ``map_row_bytes``) plus ``cell_bytes`` per cell of the
  columns its params name, and ``fixed_bytes`` (plans, calibrations).

The per-row figures are class attributes of each mechanism, measured at 10^5 and 4x10^5
rows (the slope above the loaded columns, less the named cells' term, times 1.2, rounded
up to 8 bytes); ``tests/integration/test_memory_bounds.py`` checks each family's bound is
at least the measured peak and at most 3x it.

Only public inputs enter: the declared row count and column types of the version, and
the params; nothing the data decides changes a refusal.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from mechanisms.base import (
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    RecordMechanism,
)

#: bytes of a loaded cell: float64 numbers, int64 integers and category codes
CELL_BYTES = 8
#: rows a streamed run holds at once: a stored row group has at most this many
#: (``service.storage.dataset_files.ROW_GROUP_ROWS``, checked by a test)
BATCH_ROWS = 1 << 16
#: the transient of loading a column, in units of the widest column's bytes
LOAD_TRANSIENT = 1.5
#: bytes per cell of a streaming release's public table (exact partial sums, noise)
TABLE_CELL_BYTES = 64
#: params whose value names columns the run reads (``named_cells``)
COLUMN_PARAMS = frozenset({"column", "columns", "covariate", "covariates", "response",
                           "group_by"})


@dataclass(frozen=True)
class Memory:
    """An upper bound on a release's peak allocation in its worker, in bytes, from public
    inputs only, and the input that drives it (as :class:`mechanisms.base.Work`)."""

    bytes: float
    field: str
    #: how to fit (public words only)
    hint: str = ""


def column_cells(column: ColumnMeta) -> int:
    """Cells per row of a column: its grid's length for a functional one, else 1."""
    return len(column.grid) if column.type == "functional" and column.grid else 1


def loaded_bytes(meta: DatasetMeta) -> float:
    """The peak of loading the version (``DatasetStore.load``): every column, whole, and
    the transient of converting the widest one."""
    cells = [column_cells(c) for c in meta.columns.values()]
    per_row = (sum(cells) + LOAD_TRANSIENT * max(cells, default=0)) * CELL_BYTES + 8
    return float(max(meta.n_rows, 0)) * per_row


def _names(params: Any, key: str | None = None) -> Iterator[str]:
    """Every string held under a column-naming key, at any depth of ``params``."""
    if isinstance(params, Mapping):
        for k, v in params.items():
            yield from _names(v, str(k))
    elif isinstance(params, list | tuple):
        for v in params:
            yield from _names(v, key)
    elif isinstance(params, str) and key in COLUMN_PARAMS:
        yield params


def named_cells(params: Mapping[str, Any], meta: DatasetMeta) -> int:
    """Cells per row of the distinct columns the params name (at least 1)."""
    names = {n for n in _names(params) if n in meta.columns}
    return max(1, sum(column_cells(meta.columns[n]) for n in names))


def table_cells(params: Mapping[str, Any], meta: DatasetMeta) -> int:
    """Cells of a streaming release's public table: the cross-tab of its ``group_by``
    columns (categories, and one for undeclared codes) times its bins or grid points."""
    cells = 1
    for name in params.get("group_by") or ():
        column = meta.columns.get(name)
        cells *= len(column.categories or ()) + 1 if column is not None else 1
    sizes = [params.get(k) for k in ("bins", "grid_size")]
    edges = params.get("edges")
    if isinstance(edges, list | tuple):
        sizes.append(len(edges))
    return cells * max([1, *(s for s in sizes if isinstance(s, int) and not isinstance(s, bool))])


def bound(params: Mapping[str, Any], meta: DatasetMeta, *, streaming: bool,
          row_bytes: float, cell_bytes: float, fixed_bytes: float,
          mapped: bool = False) -> Memory:
    """The model above for one release; the field is the rows (``dataset_id``: its
    version's declared row count) or, when the table dominates, ``params.group_by`` /
    the size param. ``mapped``: a record-level row map (``row_bytes`` per row of its
    table)."""
    rows = float(max(meta.n_rows, 0))
    cells = named_cells(params, meta)
    per_row = row_bytes + cell_bytes * cells
    if mapped:
        held = min(rows, float(BATCH_ROWS))
        batch = held * (cells * CELL_BYTES * (1 + LOAD_TRANSIENT) + 8)
        return Memory(batch + rows * per_row + fixed_bytes, "dataset_id",
                      "a version with fewer rows")
    if not streaming:
        total = loaded_bytes(meta) + rows * per_row + fixed_bytes
        return Memory(total, "dataset_id", "a version with fewer rows or columns")
    held = min(rows, float(BATCH_ROWS))
    table = float(table_cells(params, meta)) * TABLE_CELL_BYTES
    total = held * per_row + table + fixed_bytes
    if table > held * per_row:
        field = "params.group_by" if params.get("group_by") else _size_field(params)
        return Memory(total, field, "a smaller table")
    return Memory(total, "dataset_id", "fewer or narrower columns")


def held(mechanism: Mechanism, params: Mapping[str, Any], meta: DatasetMeta, *,
         distributed: bool, held_rows: int) -> Memory:
    """The bound of the worker that runs ``mechanism``: ``Mechanism.memory``, or, for a
    record-level row map whose rows an engine maps (``distributed``: Spark privatizes
    every row group and stores the table as parts), the bound of at most ``held_rows``
    rows: what the worker reads back of the stored table to show inline. Whether the map
    runs distributed is the operator's setting and the stored format: public."""
    if (distributed and isinstance(mechanism, RecordMechanism)
            and mechanism.mappable(params, meta)):
        return mechanism.memory(params, replace(meta, n_rows=min(meta.n_rows, held_rows)))
    return mechanism.memory(params, meta)


def _size_field(params: Mapping[str, Any]) -> str:
    for name in ("bins", "grid_size", "edges"):
        if name in params:
            return f"params.{name}"
    return "params"



class MemoryLimit(MechanismInputError):
    """A release whose memory bound exceeds its worker's (answered 422 ``memory_limit``)."""

    code = "memory_limit"


def check(memory: Memory, limit: float, what: str) -> None:
    """Refuse a release whose bound exceeds the worker's memory (``limit`` bytes): a
    ``MemoryLimit`` naming the input that drives it and the limit."""
    if memory.bytes > limit:
        hint = f"; {memory.hint}" if memory.hint else ""
        raise MemoryLimit(memory.field, f"{what} would need up to {_size(memory.bytes)} of"
                          f" memory, above this server's worker memory of {_size(limit)}"
                          f"{hint}", memory=memory.bytes, limit=limit)


def _size(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"
