"""A secret per-dataset row order for released microdata (issue #17 item 7).

Record-level releases (subset, interval, noiseless.local, DIP, lrm, opm)
privatize each row on its own. Released in the dataset's row order, they let
anyone who knows a person's row read that person's record straight off the
table: for Adult race, the subset {White, Other} then says P(White) = 0.99.
Subset privacy's threat model (spec §1.3) assumes the adversary does not know
which record belongs to whom; a secret order is what makes that true.

The order is a keyed pseudorandom function of the row index: SHAKE-256 of a
domain tag and the dataset's 32-byte secret key yields one 64-bit value per
row index, and rows are released sorted by those values. So

* it is the SAME order for every release of the dataset: two releases (or a
  DIP table's pseudonymous ``_row`` column) still pair record by record;
* it differs across datasets (independent keys);
* without the key it is a uniformly random permutation to anyone (SHAKE-256
  is a PRF when keyed), whatever the data;
* the values for indices 0..m-1 do not depend on m, so a table with extra
  records (subset.dummy's simulated ones) still puts its first rows in the
  same relative order.

The key lives only in the dataset's private folder beside its columns; the
worker that reads the data applies the order to a run's table before it is
stored, which is the one place every table passes (see ``service.releases.run``).
Pure numpy + hashlib: usable in a notebook with one's own key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

KEY_BYTES = 32
#: separates this use of the key from any other
DOMAIN = b"privrelease/row-order/v1\x00"

PERMUTED = ("records are in a secret per-dataset order (a keyed pseudorandom permutation of"
            " the rows, the same for every release of this dataset, so releases pair record"
            " by record; it does not reveal which row is whose)")
PERMUTED_ROW_COLUMN = ("; the {column!r} column holds each record's pseudonymous row number"
                       " in that order, not its row in the dataset")
KEPT = ("records are in the dataset's row order (the operator keeps row order: the"
        " collection is local by design); anyone who knows a person's row can read their"
        " record")


def new_key() -> bytes:
    """A fresh secret key (os.urandom)."""
    return os.urandom(KEY_BYTES)


def _check(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f"a row-order key is {KEY_BYTES} bytes")


def sort_keys(key: bytes, m: int) -> NDArray[np.uint64]:
    """The pseudorandom 64-bit value of each index 0..m-1 (a prefix of one SHAKE stream)."""
    _check(key)
    if m < 0:
        raise ValueError("m must be non-negative")
    stream = hashlib.shake_256(DOMAIN + key).digest(8 * m)
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64)


def order(key: bytes, m: int) -> NDArray[np.intp]:
    """Released position j holds record ``order[j]`` (a permutation of 0..m-1)."""
    return np.argsort(sort_keys(key, m), kind="stable")


def pseudonyms(key: bytes, n: int) -> NDArray[np.int64]:
    """Row i's released position among all n rows: the inverse of ``order(key, n)``."""
    rank = np.empty(n, dtype=np.int64)
    rank[order(key, n)] = np.arange(n, dtype=np.int64)
    return rank


def permute(table: Mapping[str, np.ndarray], key: bytes, n_rows: int,
            row_column: str | None = None) -> dict[str, np.ndarray]:
    """The table in the dataset's secret order.

    Without ``row_column`` the table's i-th record is row i (records past n_rows,
    e.g. simulated ones, take the positions the same stream gives them). With it,
    that column holds each record's dataset row (any subset of 0..n_rows-1,
    e.g. after a hold-out): it is replaced by the row's pseudonym and the
    records are sorted by it, so they line up with a full table's positions.
    """
    columns = {name: np.asarray(values) for name, values in table.items()}
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError("table columns differ in length")
    m = lengths.pop() if lengths else 0
    if row_column is None:
        idx = order(key, m)
        return {name: values[idx] for name, values in columns.items()}
    rows = columns[row_column].astype(np.int64, copy=False)
    if m and (rows.min() < 0 or rows.max() >= n_rows):
        raise ValueError("row column holds indices outside the dataset")
    names = pseudonyms(key, n_rows)[rows]
    idx = np.argsort(names, kind="stable")
    out = {name: values[idx] for name, values in columns.items()}
    out[row_column] = names[idx]
    return out


def statement(permuted: bool, row_column: str | None = None) -> str:
    """What the guarantee and ``result.row_order`` say about the order."""
    if not permuted:
        return KEPT
    return PERMUTED + (PERMUTED_ROW_COLUMN.format(column=row_column) if row_column else "")
