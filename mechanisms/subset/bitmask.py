"""Subsets of a categorical domain as ``uint64`` bitmasks (bit ``j`` ↔ category ``j``).

A released subset is one machine word, so privatizing, aggregating and
counting a million records are single vectorised numpy passes. Category
codes are 0-based indices into the declared category list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: largest domain: bit 63 stays clear, so masks are also valid non-negative int64
MAX_P = 63
#: domains up to this size are aggregated with ``bincount`` over all 2**p masks
BINCOUNT_P = 20
SEPARATOR = "|"
#: records per block when counting bits (bounds the m × 64 byte matrix)
CHUNK = 1 << 18

Masks = NDArray[np.uint64]


def check_p(p: int) -> int:
    """A domain size a bitmask can hold."""
    if not 1 <= p <= MAX_P:
        raise ValueError(f"domain size must be between 1 and {MAX_P}, got {p}")
    return int(p)


def full(p: int) -> np.uint64:
    """The mask of the whole domain [p]."""
    return np.uint64((1 << check_p(p)) - 1)


def as_masks(values: ArrayLike) -> Masks:
    """Integer masks of any integer dtype (int64 table columns included) as uint64."""
    array = np.asarray(values)
    if array.dtype.kind not in "iu":
        raise TypeError("subset masks must be integers")
    if array.dtype.kind == "i" and array.size and int(array.min()) < 0:
        raise ValueError("subset masks must be non-negative")
    return array.astype(np.uint64, copy=False)


def popcount(masks: ArrayLike) -> NDArray[np.int64]:
    """Subset sizes |a|."""
    return np.bitwise_count(as_masks(masks)).astype(np.int64)


def bit(codes: ArrayLike) -> Masks:
    """The singleton masks {x} of category codes."""
    return np.left_shift(np.uint64(1), np.asarray(codes).astype(np.uint64))


def contains(masks: ArrayLike, codes: ArrayLike) -> NDArray[np.bool_]:
    """Whether each subset contains the matching category code."""
    shifted = np.right_shift(as_masks(masks), np.asarray(codes).astype(np.uint64))
    return (shifted & np.uint64(1)).astype(bool)


def bits(masks: ArrayLike, p: int) -> NDArray[np.uint8]:
    """Indicator rows as 0/1 bytes (m × p): one ``unpackbits`` of the little-endian words."""
    words = np.ascontiguousarray(as_masks(masks), dtype="<u8").reshape(-1)
    unpacked = np.unpackbits(words.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
    return unpacked[:, :check_p(p)]


def indicators(masks: ArrayLike, p: int) -> NDArray[np.float64]:
    """Indicator rows 1_a (m × p floats), the design matrices of the estimators."""
    return bits(masks, p).astype(np.float64)


def from_indicators(rows: ArrayLike) -> Masks:
    """Masks of 0/1 indicator rows (inverse of ``indicators``)."""
    matrix = np.asarray(rows).astype(bool)
    weights = np.left_shift(np.uint64(1), np.arange(matrix.shape[1], dtype=np.uint64))
    return (matrix.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)


def from_members(subsets: Iterable[Iterable[int]]) -> Masks:
    """Masks of subsets given as collections of category codes."""
    out = [sum(1 << int(j) for j in set(members)) for members in subsets]
    return np.asarray(out, dtype=np.uint64)


def members(mask: int | np.integer) -> list[int]:
    """The category codes of one subset, increasing."""
    value = int(mask)
    return [j for j in range(value.bit_length()) if value >> j & 1]


def complement(masks: ArrayLike, p: int) -> Masks:
    """a^c within [p]."""
    return as_masks(masks) ^ full(p)


def all_masks(p: int) -> Masks:
    """Every subset of [p] (2**p masks; callers keep p small)."""
    return np.arange(1 << check_p(p), dtype=np.uint64)


def aggregate(masks: ArrayLike, p: int) -> tuple[Masks, NDArray[np.int64]]:
    """Distinct subsets (increasing) and their counts.

    Estimators depend on the data only through these (the likelihood of a
    record is a function of its subset), so EM costs O(m·p) per iteration
    with m ≤ min(n, 2**p) instead of O(n·p).
    """
    values = as_masks(masks)
    if check_p(p) <= BINCOUNT_P:
        counts = np.bincount(values.astype(np.intp), minlength=1 << p)
        distinct = np.flatnonzero(counts)
        return distinct.astype(np.uint64), counts[distinct].astype(np.int64)
    distinct, counts = np.unique(values, return_counts=True)
    return distinct.astype(np.uint64), counts.astype(np.int64)


def inclusion_counts(masks: ArrayLike, p: int) -> NDArray[np.int64]:
    """How many subsets contain each category (n·γ̂ of the method of moments)."""
    values = as_masks(masks).reshape(-1)
    out = np.zeros(check_p(p), dtype=np.int64)
    for start in range(0, len(values), CHUNK):
        out += bits(values[start:start + CHUNK], p).sum(axis=0, dtype=np.int64)
    return out


def labels(masks: ArrayLike, categories: Sequence[str], sep: str = SEPARATOR) -> NDArray[np.str_]:
    """Subsets as category names joined by ``sep`` (one string per record).

    Names are built once per distinct subset and gathered, so the cost is
    one ``unique`` pass rather than a Python loop over records.
    """
    values = as_masks(masks)
    distinct, inverse = np.unique(values, return_inverse=True)
    names = [sep.join(categories[j] for j in members(m)) for m in distinct]
    table = np.asarray(names if names else [""], dtype=np.str_)
    return table[inverse.reshape(values.shape)]


def parse_labels(strings: ArrayLike, categories: Sequence[str], sep: str = SEPARATOR) -> Masks:
    """Masks of ``labels`` output; unknown names raise (without echoing them)."""
    values = np.asarray(strings).astype(str)
    distinct, inverse = np.unique(values, return_inverse=True)
    index = {name: j for j, name in enumerate(categories)}
    out = np.empty(len(distinct), dtype=np.uint64)
    for k, text in enumerate(distinct):
        mask = 0
        for name in str(text).split(sep) if text else []:
            if name not in index:
                raise ValueError("a subset names a category that is not in the domain")
            mask |= 1 << index[name]
        out[k] = mask
    return out[inverse.reshape(values.shape)]
