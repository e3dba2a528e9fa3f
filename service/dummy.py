"""Dummy rows to develop against: drawn from a dataset's public metadata only.

An analyst writes and tests requests, notebooks and local ``mechanisms`` calls on rows of
the dataset's shape before spending anything (as the Lomas platform offers). Every value
is drawn uniformly from what the metadata declares (integers and reals in their bounds,
a category among the declared ones, a curve within the declared norm), so the rows are
the same in law whatever the data: they cost no budget, reveal nothing of it, and are
marked as not data wherever they are served. ``n_rows`` is not used either: the caller
asks for a number of rows.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.iclp.domain import curve_norms, quadrature_weights

#: the most rows one request may ask for (its work is linear in them)
MAX_ROWS = 10_000
DEFAULT_ROWS = 100
#: what every copy says about itself
NOTICE = "dummy rows drawn from the public metadata only: not data"


def columns(meta: DatasetMeta, n: int, rng: np.random.Generator) -> dict[str, list[str]]:
    """``n`` dummy rows as CSV cells per header name (a functional column as its ``.i``
    cells, as an upload lays it out)."""
    out: dict[str, list[str]] = {}
    for name, column in meta.columns.items():
        out.update(_cells(name, column, n, rng))
    return out


def csv_text(meta: DatasetMeta, n: int, rng: np.random.Generator) -> str:
    """``columns`` as a CSV file with a header row, ready to upload or read."""
    cells = columns(meta, n, rng)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(cells)
    writer.writerows(zip(*cells.values(), strict=True))
    return buffer.getvalue()


def _cells(name: str, column: ColumnMeta, n: int,
           rng: np.random.Generator) -> dict[str, list[str]]:
    if column.type == "categorical":
        assert column.categories is not None
        picks = rng.integers(0, len(column.categories), size=n)
        return {name: [column.categories[i] for i in picks]}
    if column.type == "functional":
        assert column.grid is not None and column.norm_bound is not None
        weights = quadrature_weights(column.grid)
        curves = rng.standard_normal((n, len(column.grid)))
        norms = np.maximum(curve_norms(curves, weights), np.finfo(float).tiny)
        radius = column.norm_bound * rng.uniform(0.0, 1.0, size=n)
        curves *= (radius / norms)[:, None]
        return {f"{name}.{i}": [repr(float(v)) for v in curves[:, i]]
                for i in range(len(column.grid))}
    assert column.bounds is not None
    low, high = column.bounds
    if column.type == "integer":
        values = rng.integers(int(np.ceil(low)), int(np.floor(high)) + 1, size=n)
        return {name: [str(int(v)) for v in values]}
    return {name: [repr(float(v)) for v in rng.uniform(low, high, size=n)]}
