"""Dataset store: immutable Parquet versions committed by conditional puts, on both
object-store backends (a local directory, and a real S3-protocol server on loopback)."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, StreamingMechanism
from mechanisms.statistics import compute, whole
from service.ingest import parse_csv, parse_metadata
from service.storage import dataset_files as store_module
from service.storage.dataset_files import SMALL_BYTES, ChangedObject, DatasetStore
from service.storage.objects import (
    Credentials,
    LocalStore,
    ObjectStore,
    ObjectStoreError,
    S3Store,
)
from tests.conftest import S3Server
from tests.integration.test_objects import Peak


def s3_objects(s3: S3Server) -> S3Store:
    """A fresh prefix of the session's bucket (tests do not see each other)."""
    return S3Store(s3.bucket, "t-" + uuid.uuid4().hex, s3.endpoint_url,
                   Credentials(s3.access_key, s3.secret_key), "us-east-1")


@pytest.fixture(params=["local", "s3"])
def objects(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    return s3_objects(request.getfixturevalue("s3_server"))


@pytest.fixture()
def store(objects: ObjectStore, tmp_path: Path) -> DatasetStore:
    return DatasetStore(objects, staging_dir=tmp_path / "staging")


def sample() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    manifest = {"name": "adult", "n_rows": 3, "budgets": {"epsilon": 5}}
    columns = {
        "age": np.array([17, 45, 90], dtype=np.int64),
        "wage": np.array([0.5, 1e5, 2e5], dtype=np.float64),
        "race": np.array([0, 2, 1], dtype=np.int64),
    }
    return manifest, columns


def keys(store: DatasetStore) -> list[str]:
    return list(store.objects.list())


def staged_files(store: DatasetStore) -> list[Path]:
    return list(store.staging_dir.iterdir()) if store.staging_dir.exists() else []


def leftovers(store: DatasetStore) -> list[Any]:
    """Every object and staging file."""
    return [*keys(store), *staged_files(store)]


def document(store: DatasetStore, dataset_id: str, version: int) -> dict[str, Any]:
    raw = store.objects.get(f"{store.key(dataset_id, version)}/manifest.json")
    out: dict[str, Any] = json.loads(raw)
    return out


def test_round_trip(store: DatasetStore) -> None:
    """A version is a data object and a manifest; its columns come back with their
    dtypes, read-only."""
    manifest, columns = sample()
    assert store.write("ds_1", 1, manifest, columns) == "datasets/ds_1/v1"
    assert keys(store) == ["datasets/ds_1/v1/data.parquet", "datasets/ds_1/v1/manifest.json"]
    assert store.exists("ds_1", 1) and not store.exists("ds_1", 2)
    assert store.files_present("ds_1", 1) and not store.files_present("ds_1", 2)
    got_manifest, got = store.load("ds_1", 1)
    assert got_manifest == manifest
    assert list(got) == ["age", "wage", "race"]
    for name, values in columns.items():
        assert got[name].dtype == values.dtype
        np.testing.assert_array_equal(got[name], values)
    with pytest.raises(ValueError):
        got["age"][0] = 1  # read-only: workers can never alter a stored version
    assert staged_files(store) == []


#: every kind of column the store keeps exactly: numbers of each width, booleans, text,
#: bytes, times, a non-native byte order and complex numbers (raw bytes), trailing shapes
KINDS: dict[str, np.ndarray] = {
    "i8": np.array([-(2**63), 0, 2**63 - 1]), "u1": np.array([0, 7, 255], np.uint8),
    "f8": np.array([np.nan, -0.0, np.inf]), "f4": np.array([1.5, -2, 3], np.float32),
    "f2": np.array([1, 0.5, -8], np.float16), "b": np.array([True, False, True]),
    "U": np.array(["a", "naïve ☃", ""]), "S": np.array([b"x\x00y", b"", b"zz"]),
    "t": np.array([0, 10**15, -5], "datetime64[us]"), "d": np.array([0, 3, -1], "datetime64[D]"),
    "m": np.array([1, 2, 3], "timedelta64[ns]"), "be": np.array([1, 256, -1], ">i4"),
    "c": np.array([1 + 2j, 0, -1j]), "grid": np.arange(18.0).reshape(3, 2, 3),
    "codes": np.arange(6, dtype=np.int16).reshape(3, 2),
}


def test_every_kind_of_column_round_trips_exactly(store: DatasetStore) -> None:
    store.write("kinds", 1, {}, KINDS)
    _, got = store.load("kinds", 1)
    for name, values in KINDS.items():
        assert (got[name].dtype, got[name].shape) == (values.dtype, values.shape), name
        np.testing.assert_array_equal(got[name], values)
    batch, = store.batches("kinds", 1)
    for name, values in KINDS.items():
        assert batch[name].dtype == values.dtype
        np.testing.assert_array_equal(batch[name], values)


_DTYPES = st.one_of(hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(),
                    hnp.floating_dtypes(), hnp.boolean_dtypes(),
                    hnp.unicode_string_dtypes(max_len=4), hnp.byte_string_dtypes(max_len=4),
                    hnp.complex_number_dtypes(), hnp.datetime64_dtypes(max_period="D"))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_numpy_column_round_trips_bit_for_bit(tmp_path_factory: pytest.TempPathFactory,
                                                  data: st.DataObject) -> None:
    """Property: whatever the dtype (either byte order), rows and trailing shape, the
    loaded column is the stored array, byte for byte, in any batch size."""
    dtype = data.draw(_DTYPES)
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    rows = data.draw(st.integers(0, 9))
    values = data.draw(hnp.arrays(dtype, (rows, *shape[1:])))
    root = tmp_path_factory.mktemp("kinds")
    store = DatasetStore(LocalStore(root / "o"), staging_dir=root / "s")
    store.write("p", 1, {}, {"v": values})
    got = store.load("p", 1)[1]["v"]
    assert (got.dtype, got.shape) == (values.dtype, values.shape)
    assert got.tobytes() == values.tobytes()
    size = data.draw(st.integers(1, 4))
    pieces = [b["v"] for b in store.batches("p", 1, rows=size)]
    assert b"".join(p.tobytes() for p in pieces) == values.tobytes()


def test_manifest_pins_a_positional_plain_parquet_object(store: DatasetStore) -> None:
    """The manifest names the columns, pins the data object's size and ETag; the Parquet
    file has positional names only, plain pages and no statistics (no value in its
    footer)."""
    manifest, columns = sample()
    store.write("a", 3, manifest, columns)
    doc = document(store, "a", 3)
    assert doc["manifest"] == manifest and doc["rows"] == 3
    assert [(c["name"], c["column"], c["dtype"]) for c in doc["columns"]] == [
        ("age", "c0", "<i8"), ("wage", "c1", "<f8"), ("race", "c2", "<i8")]
    info = store.objects.head("datasets/a/v3/data.parquet")
    body = store.objects.get("datasets/a/v3/data.parquet")
    assert doc["data"] == {"key": "data.parquet", "size": info.size, "etag": info.etag,
                           "sha256": hashlib.sha256(body).hexdigest()}
    with store.objects.open("datasets/a/v3/data.parquet") as fh:
        meta = pq.ParquetFile(fh).metadata
        assert meta.schema.names == ["c0", "c1", "c2"]
        chunk = meta.row_group(0).column(1)
        assert chunk.compression == "UNCOMPRESSED" and not chunk.is_stats_set
        assert not {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(chunk.encodings)


def test_hostile_column_names_never_become_keys(store: DatasetStore) -> None:
    names = ["../../escape", "/etc/passwd", "a\x00b", "..", "ü ñ"]
    columns = {name: np.arange(3, dtype=np.int64) for name in names}
    store.write("x", 1, {}, columns)
    assert keys(store) == ["datasets/x/v1/data.parquet", "datasets/x/v1/manifest.json"]
    with store.objects.open("datasets/x/v1/data.parquet") as fh:
        assert pq.ParquetFile(fh).schema_arrow.names == ["c0", "c1", "c2", "c3", "c4"]
    _, got = store.load("x", 1)
    assert list(got) == names


def test_refuses_to_overwrite(store: DatasetStore) -> None:
    manifest, columns = sample()
    store.write("ds", 1, manifest, columns)
    with pytest.raises(FileExistsError):
        store.write("ds", 1, {"other": True}, {"z": np.zeros(2)})
    with pytest.raises(FileExistsError), store.staging() as staged:  # past the early check
        staged.append({"z": np.zeros(2)})
        staged.commit("ds", 1, {"other": True})
    got_manifest, got = store.load("ds", 1)
    assert got_manifest == manifest and list(got) == list(columns)
    assert staged_files(store) == []
    store.write("ds", 2, {"other": True}, {"z": np.zeros(2)})
    assert store.exists("ds", 1) and store.exists("ds", 2)


def test_commit_that_lost_its_number_commits_under_the_next(store: DatasetStore) -> None:
    """``datasets.add_version``: FileExistsError touches nothing, the staged rows stay."""
    store.write("ds", 1, {"first": True}, {"a": np.zeros(1)})
    with store.staging() as staged:
        staged.append({"a": np.arange(4.0)})
        staged.write_private("row_key", b"k" * 32)
        with pytest.raises(FileExistsError):
            staged.commit("ds", 1, {"second": True})
        assert staged.commit("ds", 2, {"second": True}) == "datasets/ds/v2"
    assert store.load("ds", 1)[0] == {"first": True}
    assert store.load("ds", 2)[1]["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert store.objects.get("datasets/ds/v2/row_key") == b"k" * 32
    assert not store.objects.exists("datasets/ds/v1/row_key")


def test_conditional_write_race_one_wins_nothing_half_visible(store: DatasetStore) -> None:
    """Writers commit the same version at once: exactly one wins, the others get
    FileExistsError, and a reader polling all along never sees a version it cannot
    load whole (the manifest, written last, is the version)."""
    writers, rounds = 4, 5
    for round_ in range(rounds):
        start = threading.Barrier(writers + 1)
        outcomes: list[Any] = [None] * writers
        seen: list[Any] = []
        stop = threading.Event()

        def write(i: int, round_: int = round_, start: threading.Barrier = start,
                  outcomes: list[Any] = outcomes) -> None:
            with store.staging() as staged:
                staged.append({"w": np.full(50_000, i, dtype=np.int64)})
                staged.write_private("row_key", bytes([i]) * 32)
                start.wait()
                try:
                    staged.commit("race", round_ + 1, {"writer": i})
                    outcomes[i] = "won"
                except FileExistsError:
                    outcomes[i] = "lost"

        def read(round_: int = round_, seen: list[Any] = seen,
                 stop: threading.Event = stop) -> None:
            while not stop.is_set():
                if store.exists("race", round_ + 1):
                    manifest, cols = store.load("race", round_ + 1)
                    seen.append((manifest["writer"], set(cols["w"].tolist())))

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        reader = threading.Thread(target=read)
        for t in [*threads, reader]:
            t.start()
        start.wait()
        for t in threads:
            t.join()
        stop.set()
        reader.join()
        assert sorted(outcomes) == ["lost"] * (writers - 1) + ["won"]
        winner = outcomes.index("won")
        manifest, cols = store.load("race", round_ + 1)
        assert manifest == {"writer": winner} and set(cols["w"].tolist()) == {winner}
        assert store.objects.get(f"datasets/race/v{round_ + 1}/row_key") == bytes([winner]) * 32
        assert all(s == (winner, {winner}) for s in seen)
    assert len(keys(store)) == 3 * rounds and staged_files(store) == []


@pytest.mark.parametrize(
    "dataset_id", ["", "a/b", "..", ".", "a" * 65, "a\n", "é", "a b", "a.b", None, 5]
)
def test_invalid_ids(store: DatasetStore, dataset_id: Any) -> None:
    with pytest.raises(ValueError):
        store.write(dataset_id, 1, {}, {"a": np.zeros(1)})
    for call in (store.load, store.exists, store.remove, store.files_present):
        with pytest.raises(ValueError):
            call(dataset_id, 1)
    assert leftovers(store) == []


@pytest.mark.parametrize("version", [0, -1, True, "1", 1.0, None])
def test_invalid_versions(store: DatasetStore, version: Any) -> None:
    with pytest.raises(ValueError):
        store.write("ok", version, {}, {"a": np.zeros(1)})
    assert leftovers(store) == []


def test_valid_id_edge_cases(store: DatasetStore) -> None:
    for dataset_id in ["a" * 64, "A-b_9", "-", "_"]:
        store.write(dataset_id, 1, {}, {"a": np.zeros(1)})
        assert store.exists(dataset_id, 1)


def test_failure_mid_write_leaves_nothing(store: DatasetStore) -> None:
    columns = {
        "good": np.arange(5, dtype=np.int64),
        "bad": np.array([object(), 1], dtype=object),
    }
    with pytest.raises(ValueError):
        store.write("ds", 1, {}, columns)
    assert leftovers(store) == []


@pytest.mark.parametrize(
    ("manifest", "error"),
    [
        ({"when": object()}, TypeError),
        ({"s": {1, 2}}, TypeError),
        ({"x": float("nan")}, ValueError),
    ],
)
def test_unserializable_manifest_leaves_nothing(
    store: DatasetStore, manifest: dict[str, Any], error: type[Exception]
) -> None:
    _, columns = sample()
    with pytest.raises(error):
        store.write("ds", 1, manifest, columns)
    assert leftovers(store) == []


class FailingStore(LocalStore):
    """A local store whose puts of one object name fail: before storing it (``lost``
    False), or after (the answer lost on the way back)."""

    def __init__(self, root: Path, name: str, lost: bool = False) -> None:
        super().__init__(root)
        self.name, self.lost = name, lost

    def put_new(self, key: str, data: bytes | IO[bytes]) -> str:
        if key.rsplit("/", 1)[-1] != self.name:
            return super().put_new(key, data)
        if self.lost:
            super().put_new(key, data)
        raise ObjectStoreError("the storage server went away")


@pytest.mark.parametrize("name", ["row_key", "manifest.json"])
def test_failed_commit_leaves_no_version_and_keeps_others(tmp_path: Path, name: str) -> None:
    manifest, columns = sample()
    good = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    good.write("ds", 1, manifest, columns)
    store = DatasetStore(FailingStore(tmp_path / "o", name), staging_dir=tmp_path / "s")
    with pytest.raises(ObjectStoreError), store.staging() as staged:
        staged.append(columns)
        staged.write_private("row_key", b"k" * 32)
        staged.commit("ds", 2, manifest)
    assert not store.exists("ds", 2) and store.exists("ds", 1)
    assert keys(store) == ["datasets/ds/v1/data.parquet", "datasets/ds/v1/manifest.json"]
    assert staged_files(store) == []
    good.write("ds", 2, manifest, columns)  # the number is free again


def test_commit_whose_manifest_answer_was_lost_keeps_the_version(tmp_path: Path) -> None:
    """The manifest landed but its put raised: the version exists, so nothing of it may
    be removed (the caller's rollback, or the orphan sweep, decides)."""
    manifest, columns = sample()
    store = DatasetStore(FailingStore(tmp_path / "o", "manifest.json", lost=True),
                         staging_dir=tmp_path / "s")
    with pytest.raises(ObjectStoreError):
        store.write("ds", 1, manifest, columns)
    assert store.exists("ds", 1) and store.files_present("ds", 1)
    assert store.load("ds", 1)[0] == manifest


def test_remove(store: DatasetStore) -> None:
    manifest, columns = sample()
    store.write("ds", 1, manifest, columns)
    store.write("ds", 2, manifest, columns)
    store.private_file("ds", 2, "row_key", lambda: b"k" * 32)
    assert store.remove("ds", 2) is True
    assert not store.exists("ds", 2) and store.exists("ds", 1)
    assert store.remove("ds", 2) is False
    assert store.remove("ds", 1) is True
    assert keys(store) == []
    if isinstance(store.objects, LocalStore):
        assert not (store.objects.root / "datasets" / "ds").exists()
    assert store.remove("never", 1) is False
    store.write("ds", 1, manifest, columns)  # the version can be written again after rollback
    assert store.exists("ds", 1)


def test_load_missing_version(store: DatasetStore) -> None:
    with pytest.raises(FileNotFoundError):
        store.load("nope", 1)
    with pytest.raises(FileNotFoundError):
        list(store.batches("nope", 1))


def test_a_changed_data_object_is_refused(store: DatasetStore) -> None:
    """Another object under the data key (same schema, same rows, other values) is
    detected by its ETag: load, batches and files_present refuse it."""
    store.write("ds", 1, {}, {"a": np.zeros(3)})
    other = DatasetStore(store.objects, "other")
    other.write("ds", 1, {}, {"a": np.ones(3)})
    store.objects.delete("datasets/ds/v1/data.parquet")
    store.objects.put_new("datasets/ds/v1/data.parquet",
                          store.objects.get("other/ds/v1/data.parquet"))
    assert store.exists("ds", 1) and not store.files_present("ds", 1)
    with pytest.raises(ChangedObject):
        store.load("ds", 1)
    with pytest.raises(ChangedObject):
        list(store.batches("ds", 1))
    store.objects.delete("datasets/ds/v1/data.parquet")
    assert not store.files_present("ds", 1)
    with pytest.raises(FileNotFoundError):
        store.load("ds", 1)


def test_a_data_object_changed_in_place_is_refused(tmp_path: Path) -> None:
    """On a local directory a file rewritten in place keeps its name and size: its ETag
    (size, modification time, inode) changes, and its SHA-256 tells other bytes from
    the same bytes written again."""
    store = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    store.write("ds", 1, {}, {"a": np.zeros(3)})
    path = tmp_path / "o" / "datasets" / "ds" / "v1" / "data.parquet"
    body = path.read_bytes()
    pinned = document(store, "ds", 1)["data"]
    time.sleep(0.01)
    path.write_bytes(body)  # the same bytes, written again: a new ETag, the same object
    assert store.objects.head("datasets/ds/v1/data.parquet").etag != pinned["etag"]
    assert store.files_present("ds", 1) and store.load("ds", 1)[1]["a"].tolist() == [0.0] * 3
    at = body.index(np.zeros(3).tobytes())  # the plain page of the three zeros
    path.write_bytes(body[:at] + np.ones(3).tobytes() + body[at + 24:])
    assert path.stat().st_size == pinned["size"]
    # a process that has not read the version refuses it
    fresh = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    assert not fresh.files_present("ds", 1)
    with pytest.raises(ChangedObject):
        fresh.load("ds", 1)
    with pytest.raises(ChangedObject):
        list(fresh.batches("ds", 1))
    # one that read it (a small version is kept read whole) keeps the pinned values
    assert store.load("ds", 1)[1]["a"].tolist() == [0.0] * 3
    assert [b["a"].tolist() for b in store.batches("ds", 1)] == [[0.0] * 3]


def test_a_small_version_is_read_once_per_process(tmp_path: Path) -> None:
    """A worker running many small releases reads each small version once: later loads
    and batches make no request to the store; a large one is read every time; removing a
    version forgets it."""
    store = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    store.write("ds", 1, {"m": 1}, {"a": np.arange(1000.0), "b": np.arange(1000)})
    store.write("big", 1, {}, {"a": np.zeros(SMALL_BYTES // 8 + 1)})
    first = store.load("ds", 1)
    asked: list[str] = []
    real_get, real_head = store.objects.get, store.objects.head
    store.objects.get = lambda key: (asked.append(key), real_get(key))[1]  # type: ignore[method-assign]
    store.objects.head = lambda key: (asked.append(key), real_head(key))[1]  # type: ignore[method-assign]
    again = store.load("ds", 1)
    assert again[0] == first[0] and all((again[1][k] == first[1][k]).all() for k in "ab")
    streamed = list(store.batches("ds", 1, ["b"], rows=300))
    assert [len(b["b"]) for b in streamed] == [300, 300, 300, 100]
    assert np.concatenate([b["b"] for b in streamed]).tolist() == list(range(1000))
    assert store.files_present("ds", 1) and asked == []
    list(store.batches("big", 1))
    assert asked  # read from the store
    store.remove("ds", 1)
    assert not store.files_present("ds", 1)


def test_versions_copied_to_another_store_load_there(store: DatasetStore,
                                                     tmp_path: Path) -> None:
    """Objects copied to another store (a migration to S3, a restored directory) get
    other ETags; their pinned SHA-256 shows they are the versions stored."""
    manifest, columns = sample()
    store.write("ds", 1, manifest, columns)
    copy = DatasetStore(LocalStore(tmp_path / "copy"), staging_dir=tmp_path / "s")
    for key in keys(store):
        copy.objects.put_new(key, store.objects.get(key))
    pinned = document(store, "ds", 1)["data"]
    assert copy.objects.head("datasets/ds/v1/data.parquet").etag != pinned["etag"]
    assert copy.files_present("ds", 1)
    got_manifest, got = copy.load("ds", 1)
    assert got_manifest == manifest
    for name, values in columns.items():
        np.testing.assert_array_equal(got[name], values)
    assert len(list(copy.batches("ds", 1))) == 1


def test_load_refuses_a_foreign_manifest(store: DatasetStore) -> None:
    store.objects.put_new("datasets/ds/v1/manifest.json", b'{"format": 99}')
    with pytest.raises(ValueError, match="unsupported dataset format"):
        store.load("ds", 1)


def test_empty_and_non_ascii_round_trip(store: DatasetStore) -> None:
    store.write("e", 1, {"note": "naïve ☃"}, {"empty": np.zeros(0), "one": np.zeros(0)})
    manifest, got = store.load("e", 1)
    assert manifest == {"note": "naïve ☃"}
    assert got["empty"].shape == (0,) and got["one"].dtype == np.float64
    assert list(store.batches("e", 1)) == []
    store.write("none", 1, {}, {})
    assert store.load("none", 1) == ({}, {})


def test_ingest_then_store_round_trip(store: DatasetStore) -> None:
    spec = parse_metadata({
        "name": "adult",
        "columns": {"age": {"type": "integer", "bounds": [17, 90]},
                    "race": {"type": "categorical", "categories": ["A", "B", "C"]},
                    "wage": {"type": "continuous", "bounds": [0, 200000]}},
        "budgets": {"epsilon": 5},
    })
    n, columns = parse_csv(b"race,age,wage\nB,30,1.25\nC,90,0\n", spec, max_rows=10)
    store.write("adult", 1, {"name": spec.name, "n_rows": n}, columns)
    manifest, got = store.load("adult", 1)
    assert manifest == {"name": "adult", "n_rows": 2}
    assert {k: v.tolist() for k, v in got.items()} == {
        "age": [30, 90], "race": [1, 2], "wage": [1.25, 0.0]
    }


# -- row groups and batches ------------------------------------------------------------


def test_staged_chunks_land_in_fixed_row_groups(store: DatasetStore,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of any sizes become row groups of exactly ``group_rows`` rows (the last
    shorter), and the stored columns are their concatenation."""
    monkeypatch.setattr(store_module, "ROW_GROUP_ROWS", 7)
    rng = np.random.default_rng(3)
    chunks = [{"x": rng.normal(size=k), "code": np.arange(k, dtype=np.int64),
               "f": rng.normal(size=(k, 3))} for k in (5, 0, 1, 4, 20, 3)]
    with store.staging() as staged:
        for chunk in chunks:
            staged.append(chunk)
        assert staged.n_rows == 33
        staged.commit("ds", 1, {"n_rows": staged.n_rows})
    manifest, got = store.load("ds", 1)
    assert manifest == {"n_rows": 33} and list(got) == ["x", "code", "f"]
    for name in got:
        np.testing.assert_array_equal(got[name], np.concatenate([c[name] for c in chunks]))
    assert got["f"].shape == (33, 3) and got["code"].dtype == np.int64
    with store.objects.open("datasets/ds/v1/data.parquet") as fh:
        meta = pq.ParquetFile(fh).metadata
        assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [
            7, 7, 7, 7, 5]
    assert document(store, "ds", 1)["group_rows"] == 7
    assert staged_files(store) == []


def test_wide_rows_make_shorter_row_groups() -> None:
    """A group holds at most ROW_GROUP_CELLS cells: 2,000-point rows, 2,097 rows."""
    assert store_module.group_rows(1) == store_module.ROW_GROUP_ROWS
    assert store_module.group_rows(2001) == store_module.ROW_GROUP_CELLS // 2001
    assert store_module.group_rows(10**9) == 1


def test_batches_over_several_row_groups_equal_load(store: DatasetStore,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "ROW_GROUP_ROWS", 1000)
    rng = np.random.default_rng(5)
    n = 4_321
    columns = {"x": rng.normal(size=n), "k": rng.integers(0, 9, n),
               "s": np.array([f"v{i % 13}" for i in range(n)]), "g": rng.normal(size=(n, 2))}
    with store.staging() as staged:
        for start in range(0, n, 777):
            staged.append({k: v[start:start + 777] for k, v in columns.items()})
        staged.commit("ds", 1, {})
    _, whole = store.load("ds", 1)
    for size, expected in ((None, [1000] * 4 + [321]), (250, [250] * 17 + [71]),
                           (1000, [1000] * 4 + [321])):
        got = list(store.batches("ds", 1, rows=size))
        assert [len(b["x"]) for b in got] == expected
        for name in columns:
            joined = np.concatenate([b[name] for b in got])
            assert joined.dtype == whole[name].dtype
            np.testing.assert_array_equal(joined, whole[name])
            np.testing.assert_array_equal(joined, columns[name])
    some = list(store.batches("ds", 1, ["k", "x"]))
    assert all(list(b) == ["k", "x"] for b in some)
    np.testing.assert_array_equal(np.concatenate([b["k"] for b in some]), columns["k"])
    assert sum(len(b) == 0 for b in store.batches("ds", 1, [])) == 5
    with pytest.raises(KeyError):
        list(store.batches("ds", 1, ["nope"]))
    with pytest.raises(KeyError):
        list(store.batches("ds", 1, ["x", "x"]))
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            list(store.batches("ds", 1, rows=bad))  # type: ignore[arg-type]


def test_batches_feed_a_streaming_statistic(store: DatasetStore,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``statistics.compute`` over the batches (read again per pass) equals the whole
    columns' partial exactly."""
    monkeypatch.setattr(store_module, "ROW_GROUP_ROWS", 500)
    rng = np.random.default_rng(9)
    n = 2_345
    wage = rng.uniform(-1000.0, 2e5, n)
    store.write("ds", 1, {}, {"wage": wage, "other": np.zeros(n)})
    mech = registry.get("laplace")
    assert isinstance(mech, StreamingMechanism)
    params = mech.load_params({"statistic": "variance", "column": "wage"})
    meta = DatasetMeta(n, {"wage": ColumnMeta("wage", "continuous", (-1000.0, 2e5))})
    statistic = mech.statistic(params, mech.cost(params, {"epsilon": Fraction(1)}, meta),
                               meta)

    class Passes:
        def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
            return store.batches("ds", 1, ["wage"])

    _, streamed = compute(statistic, Passes())
    assert streamed == whole(statistic, {"wage": wage})


@pytest.mark.parametrize("rows", [2_000_000])
def test_batches_memory_is_bounded_by_a_row_group(store: DatasetStore, rows: int) -> None:
    """Two float64 columns of 2 million rows (32 MB): streaming them holds about a row
    group (1 MiB of a column's values), reading them whole holds all of them."""
    values = rows * 16
    with store.staging() as staged:
        for start in range(0, rows, 1 << 16):
            k = min(1 << 16, rows - start)
            staged.append({"a": np.arange(start, start + k, dtype=np.float64),
                           "b": np.full(k, 0.5)})
        staged.commit("big", 1, {})
    with Peak() as streamed:
        total, count = 0.0, 0
        for batch in store.batches("big", 1):
            total += float(batch["a"].sum())
            count += len(batch["a"])
    with Peak() as loaded:
        _, whole = store.load("big", 1)
        assert float(whole["a"].sum()) == total and count == rows
        del whole
    print(f"{values} B of values: streamed peak arrow {streamed.arrow} B, python "
          f"{streamed.python} B; load arrow {loaded.arrow} B, python {loaded.python} B")
    assert loaded.arrow + loaded.python >= values / 2  # the measure sees a whole read
    assert streamed.arrow < values / 8
    if isinstance(store.objects, LocalStore):  # moto serves S3 from this process's heap
        assert streamed.python < values / 8


# -- private files -----------------------------------------------------------------------


def test_private_file_made_once_and_never_a_column(store: DatasetStore) -> None:
    with store.staging() as staged:
        staged.append({"x": np.arange(3)})
        staged.write_private("row_key", b"k" * 32)
        with pytest.raises(FileExistsError):
            staged.write_private("row_key", b"j" * 32)
        staged.commit("ds_a", 1, {"n": 3})
    assert store.private_file("ds_a", 1, "row_key", lambda: b"x") == b"k" * 32
    assert store.files_present("ds_a", 1) and set(store.load("ds_a", 1)[1]) == {"x"}
    assert "row_key" not in json.dumps(document(store, "ds_a", 1))
    store.write("ds_b", 1, {}, {"x": np.arange(3)})
    made = store.private_file("ds_b", 1, "row_key", lambda: b"m" * 32)
    assert made == b"m" * 32
    assert store.private_file("ds_b", 1, "row_key", lambda: b"n" * 32) == made
    with pytest.raises(ValueError):
        store.private_file("ds_b", 1, "../x", lambda: b"x")
    with pytest.raises(FileNotFoundError):  # no secret is made for a missing version
        store.private_file("ds_c", 1, "row_key", lambda: b"x")
    assert not any(k.startswith("datasets/ds_c") for k in keys(store))


def test_private_file_race_everybody_reads_the_winner(store: DatasetStore) -> None:
    store.write("ds", 1, {}, {"x": np.arange(3)})
    callers = 8
    start = threading.Barrier(callers)
    got: list[bytes] = [b""] * callers

    def call(i: int) -> None:
        start.wait()
        got[i] = store.private_file("ds", 1, "row_key", lambda: bytes([i]) * 32)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and got[0] in {bytes([i]) * 32 for i in range(callers)}
    assert store.objects.get("datasets/ds/v1/row_key") == got[0]


# -- sweeps ----------------------------------------------------------------------------


def test_sweep_tmp_removes_only_stale_staging_files(tmp_path: Path) -> None:
    import os

    store = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    store.staging_dir.mkdir()
    old, fresh, other = (store.staging_dir / n for n in ("stage-old", "stage-new", "mine"))
    for path in (old, fresh, other):
        path.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    os.utime(other, (time.time() - 7200, time.time() - 7200))
    assert store.sweep_tmp(older_than=3600) == 1
    assert not old.exists() and fresh.exists() and other.exists()


#: seconds between the "old" and the "fresh" objects of the sweep tests (S3's
#: LastModified has a resolution of one second)
GAP = 2.2


def test_sweep_orphans_removes_only_old_unregistered_datasets(store: DatasetStore) -> None:
    """Objects a failed registration kept go once their id is known to be unregistered
    and none of them is recent."""
    cols = {"x": np.arange(3.0)}
    for dataset_id in ("ds_kept", "ds_orphan", "ds_fresh"):
        store.write(dataset_id, 1, {"n": 3}, cols)
    store.objects.put_new("datasets/a.b/v1/x", b"x")  # not a dataset id: never touched
    time.sleep(GAP)
    store.write("ds_fresh", 2, {"n": 3}, cols)  # a new version: the dataset is in flight
    assert store.sweep_orphans({"ds_kept"}, older_than=GAP / 2) == ["ds_orphan"]
    assert not store.exists("ds_orphan", 1)
    assert store.exists("ds_kept", 1) and store.exists("ds_fresh", 1)
    assert "datasets/a.b/v1/x" in keys(store)
    assert store.sweep_orphans({"ds_kept"}, older_than=0) == ["ds_fresh"]
    assert not any(k.startswith("datasets/ds_fresh") for k in keys(store))


def test_sweep_orphan_versions_removes_only_old_unregistered_versions(
        store: DatasetStore) -> None:
    """Catches versions of a registered dataset left forever (the dataset sweep keeps
    the dataset), and never removes a registered version, a fresh upload's version, or
    anything of a dataset whose registration could not be read (left out of
    ``versions_of``, or ``versions_of`` raising)."""
    cols = {"x": np.arange(3.0)}
    for dataset_id, version in (("ds_a", 1), ("ds_a", 2), ("ds_a", 7),
                                ("ds_b", 1), ("ds_b", 5), ("ds_gone", 3)):
        store.write(dataset_id, version, {"n": 3}, cols)
    store.objects.put_new("datasets/ds_a/v07/x", b"x")  # not a version's key
    store.objects.put_new("datasets/ds_a/v9/data.parquet", b"x")  # a commit that died
    time.sleep(GAP)
    store.write("ds_a", 8, {"n": 3}, cols)  # a fresh upload not yet registered
    asked: list[list[str]] = []

    def versions_of(ids: list[str]) -> dict[str, set[int]]:
        asked.append(ids)
        return {"ds_a": {1, 2}}  # ds_b: its document could not be read

    with pytest.raises(ConnectionError):  # the record is away: nothing goes
        store.sweep_orphan_versions({"ds_a", "ds_b"}, _raise, older_than=GAP / 2)
    assert store.exists("ds_a", 7)
    assert store.sweep_orphan_versions({"ds_a", "ds_b", "..", "ds_none"}, versions_of,
                                       older_than=GAP / 2) == [("ds_a", 7), ("ds_a", 9)]
    assert asked == [["ds_a", "ds_b"]]  # only datasets with an old version, after listing
    assert store.versions("ds_a") == [1, 2, 8]
    assert "datasets/ds_a/v07/x" in keys(store)
    assert store.exists("ds_b", 5) and store.exists("ds_gone", 3)  # unreadable / not ours
    assert store.sweep_orphan_versions({"ds_a"}, versions_of, older_than=0) == [("ds_a", 8)]


def _raise(ids: list[str]) -> dict[str, set[int]]:
    raise ConnectionError("valkey is away")


# -- staging ---------------------------------------------------------------------------


def test_failure_while_staging_leaves_nothing(store: DatasetStore) -> None:
    """An upload whose CSV fails in a later chunk: the first chunks were staged."""
    with pytest.raises(RuntimeError, match="bad row"), store.staging() as staged:
        staged.append({"a": np.zeros(4)})
        raise RuntimeError("bad row")
    assert leftovers(store) == []


@pytest.mark.parametrize("second", [
    {"b": np.zeros(2)},
    {"a": np.zeros(2), "b": np.zeros(2)},
    {"a": np.zeros(2, dtype=np.int64)},
    {"a": np.zeros((2, 2))},
    {"a": np.array([object(), 1], dtype=object)},
])
def test_staged_chunks_must_match_the_first(store: DatasetStore,
                                            second: dict[str, np.ndarray]) -> None:
    with pytest.raises(ValueError), store.staging() as staged:
        staged.append({"a": np.zeros(3)})
        staged.append(second)
    assert leftovers(store) == []


def test_staged_version_commits_once(store: DatasetStore) -> None:
    with store.staging() as staged:
        with pytest.raises(ValueError, match="differ in length"):
            staged.append({"a": np.ones(2), "b": np.ones(3)})
        staged.append({"a": np.ones(3), "b": np.ones(3)})
        staged.commit("ds", 1, {})
        with pytest.raises(RuntimeError):
            staged.append({"a": np.ones(1), "b": np.ones(1)})
        with pytest.raises(RuntimeError):
            staged.commit("ds", 2, {})
    assert store.exists("ds", 1) and not store.exists("ds", 2)
    assert store.load("ds", 1)[1]["b"].tolist() == [1.0, 1.0, 1.0]


# -- versions written before: .npy folders, read in place --------------------------------


def _npy(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, values, allow_pickle=False)
    return buffer.getvalue()


def put_legacy(objects: ObjectStore, base: str, manifest: dict[str, Any],
               columns: dict[str, np.ndarray]) -> None:
    """A version as the ``.npy`` store wrote it (format 1: manifest.json, c<i>.npy)."""
    entries = []
    for i, (name, values) in enumerate(columns.items()):
        objects.put_new(f"{base}/c{i}.npy", _npy(values))
        entries.append({"name": name, "file": f"c{i}.npy", "dtype": values.dtype.str,
                        "shape": list(values.shape)})
    objects.put_new(f"{base}/manifest.json", json.dumps(
        {"format": 1, "manifest": manifest, "columns": entries}).encode())


def test_legacy_npy_versions_are_read_in_place(store: DatasetStore) -> None:
    rng = np.random.default_rng(2)
    columns: dict[str, np.ndarray] = {
        "x": rng.normal(size=1000), "k": np.arange(1000, dtype=np.int32),
        "g": rng.normal(size=(1000, 3))}
    put_legacy(store.objects, "datasets/old/v1", {"name": "old"}, columns)
    assert store.exists("old", 1) and store.files_present("old", 1)
    manifest, got = store.load("old", 1)
    assert manifest == {"name": "old"} and list(got) == ["x", "k", "g"]
    for name, values in columns.items():
        assert got[name].dtype == values.dtype
        np.testing.assert_array_equal(got[name], values)
    with pytest.raises(ValueError):
        got["x"][0] = 1.0
    pieces = list(store.batches("old", 1, ["g", "x"], rows=300))
    assert [len(p["x"]) for p in pieces] == [300, 300, 300, 100]
    np.testing.assert_array_equal(np.concatenate([p["g"] for p in pieces]), columns["g"])
    key = store.private_file("old", 1, "row_key", lambda: b"r" * 32)
    assert key == b"r" * 32 and store.objects.get("datasets/old/v1/row_key") == key
    store.objects.delete("datasets/old/v1/c1.npy")
    assert not store.files_present("old", 1)
    assert store.remove("old", 1) and not store.exists("old", 1) and keys(store) == []


def test_legacy_manifest_naming_a_path_is_refused(store: DatasetStore) -> None:
    put_legacy(store.objects, "datasets/ds/v1", {}, {"a": np.zeros(2)})
    doc = json.loads(store.objects.get("datasets/ds/v1/manifest.json"))
    doc["columns"][0]["file"] = "../../../etc/passwd"
    store.objects.delete("datasets/ds/v1/manifest.json")
    store.objects.put_new("datasets/ds/v1/manifest.json", json.dumps(doc).encode())
    with pytest.raises(ValueError):
        store.load("ds", 1)
    assert not store.files_present("ds", 1)


def test_arrow_types_of_a_version_are_fixed_by_its_first_chunk(store: DatasetStore) -> None:
    """Text chunks of other widths are other dtypes: refused, as the .npy store did."""
    with pytest.raises(ValueError), store.staging() as staged:
        staged.append({"s": np.array(["ab"])})
        staged.append({"s": np.array(["abc"])})
    assert pa.types.is_string(store_module._to_arrow(np.array(["x"])).type)
