"""A secret per-dataset row order for released microdata (issue #17 item 7).

Record-level releases (subset, interval, noiseless.local, DIP, lrm, opm)
privatize each row on its own. Released in the dataset's row order, they let
anyone who knows a person's row read that person's record straight off the
table: for Adult race, the subset {White, Other} then says P(White) = 0.99.
Subset privacy's threat model (spec §1.3) assumes the adversary does not know
which record belongs to whom; a secret order is what makes that true.

The order is a keyed pseudorandom function of the row index: the dataset's 32-byte
secret key yields one 64-bit value per row index, and rows are released sorted by
those values (ties, probability below n²/2^65, by row index). So

* it is the SAME order for every release of the dataset: two releases (or a
  DIP table's pseudonymous ``_row`` column) still pair record by record;
* it differs across datasets (independent keys);
* without the key it is a uniformly random permutation to anyone, whatever the data;
* the values for indices 0..m-1 do not depend on m, so a table with extra
  records (subset.dummy's simulated ones) still puts its first rows in the
  same relative order.

Two versions of the value, recorded with the key (``RowKey``; a version keeps its
key's version for ever, so its releases keep pairing):

* v1 (versions stored before v2; a bare 32-byte key file): SHAKE-256 of a domain tag
  and the key, read as consecutive little-endian uint64. One sequential stream: row
  i's value costs the i rows before it.
* v2 (``new_row_key``): K = SHAKE-256(DOMAIN_V2 ‖ key)[:16], and row i's value is the
  i-th 64-bit word of the AES-128-CTR keystream under K (randomgen's ``AESCounter``:
  block j is AES_K(j as 16 little-endian bytes), read as two little-endian words).
  Seekable: rows [a, b) cost O(b - a) at the CPU's AES speed, so each partition of a
  distributed release computes its own rows' values (``sort_keys(key, b, start=a)``).
  A keyed PRF to anyone without the key: K is SHAKE-256 of a 256-bit secret under a
  tag no other use shares, so it is indistinguishable from a uniform AES key; AES-128
  under a uniform key is a pseudorandom permutation, so the distinct blocks AES_K(0),
  AES_K(1), ... are indistinguishable from uniform 128-bit values (PRP/PRF switching:
  advantage at most q²/2^129 for q blocks) and their 64-bit halves from i.i.d. uniform
  words. Sorting i.i.d. uniform values, ties by index, is a uniformly random
  permutation.

The key lives only in the dataset's private folder beside its columns; the
worker that reads the data applies the order to a run's table before it is
stored, which is the one place every table passes (see ``service.releases.run``).
Pure numpy, hashlib and randomgen: usable in a notebook with one's own key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from randomgen import AESCounter

KEY_BYTES = 32
#: separates this use of the key from any other
DOMAIN = b"privrelease/row-order/v1\x00"
DOMAIN_V2 = b"privrelease/row-order/v2\x00"
#: the order version of a key file of KEY_BYTES + 1 bytes is its first byte
V1, V2 = 1, 2

PERMUTED = ("records are in a secret per-dataset order (a keyed pseudorandom permutation of"
            " the rows, the same for every release of this dataset, so releases pair record"
            " by record; it does not reveal which row is whose)")
PERMUTED_ROW_COLUMN = ("; the {column!r} column holds each record's pseudonymous row number"
                       " in that order, not its row in the dataset")
KEPT = ("records are in the dataset's row order (the operator keeps row order: the"
        " collection is local by design); anyone who knows a person's row can read their"
        " record")


@dataclass(frozen=True)
class RowKey:
    """A dataset version's secret key and the order version it was made for.

    Stored as one private file, so the two can never disagree: the bare 32 bytes are a
    v1 key (every file written before v2), the version byte and 32 bytes a later one.
    """

    secret: bytes
    version: int = V2

    def __post_init__(self) -> None:
        _check(self.secret)
        if self.version not in (V1, V2):
            raise ValueError("unknown row-order version")

    def to_file(self) -> bytes:
        """The private file's bytes (a v1 key stays the bare key it always was)."""
        return self.secret if self.version == V1 else bytes([self.version]) + self.secret

    @classmethod
    def from_file(cls, data: bytes) -> RowKey:
        """The key a private file holds (ValueError for anything else)."""
        if len(data) == KEY_BYTES:
            return cls(bytes(data), V1)
        if len(data) == KEY_BYTES + 1 and data[0] != V1:
            return cls(bytes(data[1:]), data[0])
        raise ValueError("not a row-order key file")

    @property
    def seekable(self) -> bool:
        """Whether a row's value is computable from the key and its index alone (v2)."""
        return self.version == V2


def new_key() -> bytes:
    """A fresh secret key (os.urandom)."""
    return os.urandom(KEY_BYTES)


def new_row_key() -> RowKey:
    """A fresh key for a new dataset version: the current (seekable) order version."""
    return RowKey(new_key(), V2)


def _check(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f"a row-order key is {KEY_BYTES} bytes")


def _row_key(key: RowKey | bytes) -> RowKey:
    """A bare 32-byte key is a v1 key (as its file is)."""
    return key if isinstance(key, RowKey) else RowKey(key, V1)


def sort_keys(key: RowKey | bytes, stop: int, start: int = 0) -> NDArray[np.uint64]:
    """The pseudorandom 64-bit value of each index start..stop-1 (v1: a slice of one
    SHAKE stream, costing ``stop``; v2: the AES-CTR keystream's words, costing
    ``stop - start``)."""
    row_key = _row_key(key)
    if not 0 <= start <= stop:
        raise ValueError("indices must satisfy 0 <= start <= stop")
    if row_key.version == V1:
        stream = hashlib.shake_256(DOMAIN + row_key.secret).digest(8 * stop)
        return np.frombuffer(stream, dtype="<u8")[start:].astype(np.uint64)
    aes_key = hashlib.shake_256(DOMAIN_V2 + row_key.secret).digest(16)
    counter = AESCounter(key=int.from_bytes(aes_key, "little"))
    counter.advance(start)  # a 64-bit word per step: O(1), counter arithmetic
    words: NDArray[np.uint64] = counter.random_raw(stop - start)
    return words


def order(key: RowKey | bytes, m: int) -> NDArray[np.intp]:
    """Released position j holds record ``order[j]`` (a permutation of 0..m-1)."""
    return np.argsort(sort_keys(key, m), kind="stable")


def pseudonyms(key: RowKey | bytes, n: int) -> NDArray[np.int64]:
    """Row i's released position among all n rows: the inverse of ``order(key, n)``."""
    rank = np.empty(n, dtype=np.int64)
    rank[order(key, n)] = np.arange(n, dtype=np.int64)
    return rank


def permute(table: Mapping[str, np.ndarray], key: RowKey | bytes, n_rows: int,
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


#: rows whose values ``bucket_counts`` computes at a time (memory: 8 bytes each)
COUNT_ROWS = 1 << 20


def buckets_of(values: NDArray[np.uint64], bits: int) -> NDArray[np.int64]:
    """Each value's bucket among 2**bits: its top ``bits`` bits, so every value of bucket
    b is below every value of bucket b + 1 and the order is the buckets' in turn, each
    sorted (an engine sorts buckets apart, without gathering the rows)."""
    if not 0 <= bits <= 32:
        raise ValueError("bits must be in [0, 32]")
    if bits == 0:
        return np.zeros(values.shape, dtype=np.int64)
    return (values >> np.uint64(64 - bits)).astype(np.int64)


def bucket_counts(key: RowKey | bytes, n: int, bits: int) -> NDArray[np.int64]:
    """Rows 0..n-1 per bucket of ``buckets_of`` (from the key alone, no data: the
    released positions of each bucket start at the sum of the counts before it)."""
    counts = np.zeros(1 << bits, dtype=np.int64)
    for start in range(0, n, COUNT_ROWS):
        stop = min(n, start + COUNT_ROWS)
        counts += np.bincount(buckets_of(sort_keys(key, stop, start), bits),
                              minlength=1 << bits)
    return counts


def statement(permuted: bool, row_column: str | None = None) -> str:
    """What the guarantee and ``result.row_order`` say about the order."""
    if not permuted:
        return KEPT
    return PERMUTED + (PERMUTED_ROW_COLUMN.format(column=row_column) if row_column else "")
