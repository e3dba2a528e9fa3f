"""The secret per-dataset row order (mechanisms.rows) and its private key file (#17 item 7)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import rows
from service import datasets
from service.storage.dataset_files import DatasetStore
from service.storage.objects import LocalStore

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))


def test_order_is_a_keyed_prf_of_the_index() -> None:
    """Exact: the sort keys are SHAKE-256(domain ‖ key) read as little-endian uint64."""
    stream = hashlib.shake_256(rows.DOMAIN + KEY_A).digest(8 * 5)
    expected = [int.from_bytes(stream[8 * i:8 * i + 8], "little") for i in range(5)]
    assert rows.sort_keys(KEY_A, 5).tolist() == expected
    assert rows.order(KEY_A, 5).tolist() == sorted(range(5), key=expected.__getitem__)


@given(st.binary(min_size=32, max_size=32), st.integers(0, 300))
@settings(max_examples=60, deadline=None)
def test_order_is_a_permutation_and_pseudonyms_invert_it(key: bytes, n: int) -> None:
    order = rows.order(key, n)
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(rows.pseudonyms(key, n)[order], np.arange(n))


def test_same_key_same_order_prefix_consistent() -> None:
    """Deterministic for a key; the first n of m > n rows keep their relative order."""
    assert np.array_equal(rows.order(KEY_A, 1000), rows.order(KEY_A, 1000))
    long = rows.order(KEY_A, 1200)
    assert np.array_equal(long[long < 1000], rows.order(KEY_A, 1000))


def test_orders_differ_across_keys_and_from_the_input_order() -> None:
    """Two keys agree on a position with probability 1/n each: for n = 1000, a uniform pair
    of permutations shares about 1 fixed point (Poisson(1)); 20 or more has probability
    below 1e-18. Likewise for the identity (the dataset's own order)."""
    n = 1000
    a, b = rows.order(KEY_A, n), rows.order(KEY_B, n)
    assert np.count_nonzero(a == b) < 20
    assert np.count_nonzero(a == np.arange(n)) < 20
    assert np.count_nonzero(b == np.arange(n)) < 20


def test_permute_plain_table_pairs_records_across_tables() -> None:
    """Two tables of the same rows come out aligned, and the i-th record is row order[i]."""
    n = 50
    first = {"x": np.arange(n) * 10, "label": np.array([f"r{i}" for i in range(n)])}
    second = {"y": np.arange(n) + 0.5}
    p1, p2 = rows.permute(first, KEY_A, n), rows.permute(second, KEY_A, n)
    order = rows.order(KEY_A, n)
    assert np.array_equal(p1["x"], order * 10) and np.array_equal(p2["y"], order + 0.5)
    assert p1["label"].tolist() == [f"r{i}" for i in order]


def test_permute_with_row_column_uses_pseudonyms() -> None:
    """A table of some rows (a hold-out left out) gets pseudonyms, sorted, aligned with a
    full table's positions; the original indices are gone."""
    n = 40
    kept = np.arange(n)[np.arange(n) % 3 != 0]
    table = {"_row": kept, "v": kept * 2.0}
    out = rows.permute(table, KEY_A, n, row_column="_row")
    full = rows.permute({"v": np.arange(n) * 2.0}, KEY_A, n)
    assert np.all(np.diff(out["_row"]) > 0)
    assert np.array_equal(full["v"][out["_row"]], out["v"])  # same record at that position
    assert np.array_equal(np.sort(out["v"]), np.sort(kept * 2.0))
    with pytest.raises(ValueError, match="outside"):
        rows.permute({"_row": np.array([n]), "v": np.zeros(1)}, KEY_A, n, row_column="_row")


def test_bad_keys_are_refused() -> None:
    with pytest.raises(ValueError):
        rows.order(b"short", 3)


def test_statement_says_which_order() -> None:
    assert "secret per-dataset order" in rows.statement(True)
    assert "'_row'" in rows.statement(True, "_row")
    assert "dataset's row order" in rows.statement(False)


def test_private_key_file_created_once_owner_only(tmp_path: Path) -> None:
    """The upload writes 32 random bytes beside the columns (0600 on a local store); a
    stored version without one gets it on first use, and later reads return the same
    bytes."""
    store = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    with store.staging() as staged:
        staged.append({"x": np.arange(3)})
        staged.write_private(datasets.ROW_KEY, b"k" * 32)
        base = staged.commit("ds_a", 1, {"n": 3})
    assert stat.S_IMODE(os.stat(tmp_path / "o" / base / datasets.ROW_KEY).st_mode) == 0o600
    assert datasets.row_key(store, "ds_a", 1) == rows.RowKey(b"k" * 32, rows.V1)
    assert store.files_present("ds_a", 1)  # the key is no column
    assert set(store.load("ds_a", 1)[1]) == {"x"}

    store.write("ds_b", 1, {"n": 3}, {"x": np.arange(3)})
    made = datasets.row_key(store, "ds_b", 1)  # a version stored before keys: the current one
    assert made.version == rows.V2 and len(made.secret) == rows.KEY_BYTES
    assert datasets.row_key(store, "ds_b", 1) == made
    assert not any(store.staging_dir.iterdir()) and not any((tmp_path / "o" / ".tmp").iterdir())
    with pytest.raises(ValueError):
        store.private_file("ds_b", 1, "../x", rows.new_key)


def test_new_keys_are_independent() -> None:
    """os.urandom: two keys collide with probability 2**-256."""
    assert rows.new_key() != rows.new_key() and len(rows.new_key()) == 32
    assert len({rows.new_key() for _ in range(50)}) == 50


# -- v2: seekable ------------------------------------------------------------------


def test_v2_values_are_aes_ctr_words_of_a_derived_key() -> None:
    """Exact, against an independent AES (``cryptography``'s, a dev dependency through
    moto): row 2j and 2j+1 are the little-endian halves of AES-128_K(j), K the first 16
    bytes of SHAKE-256(DOMAIN_V2 ‖ key), j as 16 little-endian bytes."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = rows.RowKey(KEY_A, rows.V2)
    aes_key = hashlib.shake_256(rows.DOMAIN_V2 + KEY_A).digest(16)
    encrypt = Cipher(algorithms.AES(aes_key), modes.ECB()).encryptor()
    blocks = encrypt.update(b"".join(j.to_bytes(16, "little") for j in range(50)))
    assert rows.sort_keys(key, 100).tolist() == np.frombuffer(blocks, "<u8").tolist()
    assert not np.array_equal(rows.sort_keys(key, 100), rows.sort_keys(KEY_A, 100))


@given(st.binary(min_size=32, max_size=32), st.integers(0, 500), st.integers(0, 500))
@settings(max_examples=80, deadline=None)
def test_v2_any_range_is_the_slice_of_the_whole(secret: bytes, a: int, b: int) -> None:
    """Seekable: rows [start, stop) computed alone equal those rows of the whole stream
    (odd starts split an AES block)."""
    start, stop = min(a, b), max(a, b)
    key = rows.RowKey(secret, rows.V2)
    whole = rows.sort_keys(key, stop)
    assert np.array_equal(rows.sort_keys(key, stop, start=start), whole[start:])
    assert np.array_equal(rows.sort_keys(secret, stop, start=start),
                          rows.sort_keys(secret, stop)[start:])  # v1 slices too
    order = rows.order(key, stop)
    assert sorted(order.tolist()) == list(range(stop))
    assert np.array_equal(rows.pseudonyms(key, stop)[order], np.arange(stop))


def test_v2_order_is_uniform_on_small_permutations() -> None:
    """All 6 orders of 3 rows come up equally often over 6,000 independent keys: each
    count is Binomial(6000, 1/6) (sd 28.9), so outside 1000 ± 150 (5.2 sd) has probability
    below 1e-6 per order."""
    rng = np.random.default_rng(7)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(6000):
        key = rows.RowKey(rng.bytes(32), rows.V2)
        seen = tuple(rows.order(key, 3).tolist())
        counts[seen] = counts.get(seen, 0) + 1
    assert len(counts) == 6 and all(850 <= c <= 1150 for c in counts.values())


def test_key_files_record_their_version() -> None:
    """A bare 32-byte file is v1, as every file written before v2; a v2 file is its
    version byte and the key; anything else is refused."""
    v1, v2 = rows.RowKey(KEY_A, rows.V1), rows.RowKey(KEY_A, rows.V2)
    assert v1.to_file() == KEY_A and rows.RowKey.from_file(KEY_A) == v1
    assert v2.to_file() == b"\x02" + KEY_A and rows.RowKey.from_file(v2.to_file()) == v2
    assert v2.seekable and not v1.seekable
    assert rows.new_row_key().version == rows.V2
    for bad in (b"", KEY_A[:31], b"\x01" + KEY_A, b"\x03" + KEY_A, KEY_A + KEY_A):
        with pytest.raises(ValueError):
            rows.RowKey.from_file(bad)
    # a bare key is a v1 key everywhere, as the stored files are
    assert np.array_equal(rows.permute({"x": np.arange(9)}, KEY_A, 9)["x"],
                          rows.permute({"x": np.arange(9)}, v1, 9)["x"])


def test_old_version_keeps_its_v1_order_and_new_uploads_get_v2(tmp_path: Path) -> None:
    """A version whose key file was written before v2 (32 bytes) releases in exactly its
    old order, bit for bit; a version committed now has a v2 key."""
    store = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    with store.staging() as staged:
        staged.append({"x": np.arange(20)})
        staged.write_private(datasets.ROW_KEY, KEY_A)
        staged.commit("ds_old", 1, {"n": 20})
    key = datasets.row_key(store, "ds_old", 1)
    stream = hashlib.shake_256(rows.DOMAIN + KEY_A).digest(8 * 20)
    old = sorted(range(20), key=lambda i: stream[8 * i:8 * i + 8][::-1])
    assert rows.permute({"x": np.arange(20)}, key, 20)["x"].tolist() == old
    with store.staging() as staged:
        staged.append({"x": np.arange(20)})
        staged.write_private(datasets.ROW_KEY, rows.new_row_key().to_file())
        staged.commit("ds_new", 1, {"n": 20})
    assert datasets.row_key(store, "ds_new", 1).version == rows.V2
