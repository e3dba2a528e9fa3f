"""Dataset store: atomic, immutable version folders of memory-mapped columns."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.ingest import parse_csv, parse_metadata
from service.storage import dataset_files as store_module
from service.storage.dataset_files import DatasetStore


@pytest.fixture()
def store(tmp_path: Path) -> DatasetStore:
    return DatasetStore(tmp_path / "datasets")


def sample() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    manifest = {"name": "adult", "n_rows": 3, "budgets": {"epsilon": 5}}
    columns = {
        "age": np.array([17, 45, 90], dtype=np.int64),
        "wage": np.array([0.5, 1e5, 2e5], dtype=np.float64),
        "race": np.array([0, 2, 1], dtype=np.int64),
    }
    return manifest, columns


def leftovers(store: DatasetStore) -> list[Path]:
    """Everything under root except the (empty) temp folder."""
    return [p for p in store.root.rglob("*") if p != store.tmp_dir]


def test_round_trip_small_columns_read(store: DatasetStore) -> None:
    """Columns of at most READ_BYTES come back read into memory, read-only as a map."""
    manifest, columns = sample()
    folder = store.write("ds_1", 1, manifest, columns)
    assert folder == store.root / "ds_1" / "v1"
    assert sorted(p.name for p in folder.iterdir()) == ["c0.npy", "c1.npy", "c2.npy",
                                                         "manifest.json"]
    assert store.exists("ds_1", 1)
    assert not store.exists("ds_1", 2)
    got_manifest, got = store.load("ds_1", 1)
    assert got_manifest == manifest
    assert list(got) == ["age", "wage", "race"]
    for name, values in columns.items():
        assert not isinstance(got[name], np.memmap)
        assert got[name].dtype == values.dtype
        np.testing.assert_array_equal(got[name], values)
    with pytest.raises(ValueError):
        got["age"][0] = 1  # read-only: workers can never alter a stored version
    assert list(store.tmp_dir.iterdir()) == []


def test_columns_above_read_bytes_are_memory_mapped(store: DatasetStore) -> None:
    """The choice is each column's size from the manifest: a column over READ_BYTES is
    mapped (read-only), a small one beside it read."""
    rows = store_module.READ_BYTES // 8 + 1  # float64: just over; int8: an eighth of it
    big, small = np.arange(rows, dtype=np.float64), np.ones(rows, dtype=np.int8)
    store.write("ds_big", 1, {"n_rows": rows}, {"big": big, "small": small})
    _, got = store.load("ds_big", 1)
    assert isinstance(got["big"], np.memmap) and not isinstance(got["small"], np.memmap)
    np.testing.assert_array_equal(got["big"], big)
    with pytest.raises(ValueError):
        got["big"][0] = 1


def test_manifest_records_column_files(store: DatasetStore) -> None:
    manifest, columns = sample()
    folder = store.write("a", 3, manifest, columns)
    document = json.loads((folder / "manifest.json").read_text())
    assert document["manifest"] == manifest
    assert [(c["name"], c["file"]) for c in document["columns"]] == [
        ("age", "c0.npy"), ("wage", "c1.npy"), ("race", "c2.npy")
    ]


def test_hostile_column_names_never_become_paths(store: DatasetStore) -> None:
    names = ["../../escape", "/etc/passwd", "a\x00b", "..", "ü ñ"]
    columns = {name: np.arange(3, dtype=np.int64) for name in names}
    folder = store.write("x", 1, {}, columns)
    assert sorted(p.name for p in folder.iterdir()) == [
        "c0.npy", "c1.npy", "c2.npy", "c3.npy", "c4.npy", "manifest.json"
    ]
    assert set(store.root.iterdir()) == {store.root / "x", store.tmp_dir}
    _, got = store.load("x", 1)
    assert list(got) == names


def test_refuses_to_overwrite(store: DatasetStore) -> None:
    manifest, columns = sample()
    store.write("ds", 1, manifest, columns)
    with pytest.raises(FileExistsError):
        store.write("ds", 1, {"other": True}, {"z": np.zeros(2)})
    got_manifest, got = store.load("ds", 1)
    assert got_manifest == manifest and list(got) == list(columns)
    assert list(store.tmp_dir.iterdir()) == []
    store.write("ds", 2, {"other": True}, {"z": np.zeros(2)})
    assert store.exists("ds", 1) and store.exists("ds", 2)


def test_lost_race_is_file_exists_and_cleans_up(
    store: DatasetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer lands the same version between our check and our rename."""
    manifest, columns = sample()
    real_rename = os.rename

    def rename_after_rival(src: Any, dst: Any) -> None:
        monkeypatch.setattr(store_module.os, "rename", real_rename)
        DatasetStore(store.root).write("ds", 1, {"rival": True}, {"r": np.ones(1)})
        real_rename(src, dst)

    monkeypatch.setattr(store_module.os, "rename", rename_after_rival)
    with pytest.raises(FileExistsError):
        store.write("ds", 1, manifest, columns)
    assert store.load("ds", 1)[0] == {"rival": True}
    assert list(store.tmp_dir.iterdir()) == []


@pytest.mark.parametrize(
    "dataset_id", ["", "a/b", "..", ".", "a" * 65, "a\n", "é", "a b", "a.b", None, 5]
)
def test_invalid_ids(store: DatasetStore, dataset_id: Any) -> None:
    with pytest.raises(ValueError):
        store.write(dataset_id, 1, {}, {"a": np.zeros(1)})
    with pytest.raises(ValueError):
        store.load(dataset_id, 1)
    with pytest.raises(ValueError):
        store.exists(dataset_id, 1)
    with pytest.raises(ValueError):
        store.remove(dataset_id, 1)
    assert not store.root.exists() or leftovers(store) == []


@pytest.mark.parametrize("version", [0, -1, True, "1", 1.0, None])
def test_invalid_versions(store: DatasetStore, version: Any) -> None:
    with pytest.raises(ValueError):
        store.write("ok", version, {}, {"a": np.zeros(1)})
    assert not store.root.exists() or leftovers(store) == []


def test_valid_id_edge_cases(store: DatasetStore) -> None:
    for dataset_id in ["a" * 64, "A-b_9", "-", "_"]:
        store.write(dataset_id, 1, {}, {"a": np.zeros(1)})
        assert store.exists(dataset_id, 1)


def test_failure_mid_write_leaves_nothing(store: DatasetStore) -> None:
    columns = {
        "good": np.arange(5, dtype=np.int64),  # written before the failure
        "bad": np.array([object(), 1], dtype=object),
    }
    with pytest.raises(ValueError):
        store.write("ds", 1, {}, columns)
    assert leftovers(store) == []
    assert list(store.tmp_dir.iterdir()) == []


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


def test_failed_rename_leaves_nothing_but_keeps_other_versions(
    store: DatasetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, columns = sample()

    def broken_rename(src: Any, dst: Any) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(store_module.os, "rename", broken_rename)
    with pytest.raises(OSError, match="disk on fire"):
        store.write("ds", 1, manifest, columns)
    assert leftovers(store) == []  # the dataset folder it created is gone too

    monkeypatch.undo()
    store.write("ds", 1, manifest, columns)
    monkeypatch.setattr(store_module.os, "rename", broken_rename)
    with pytest.raises(OSError):
        store.write("ds", 2, manifest, columns)
    assert store.exists("ds", 1)
    assert sorted(p.name for p in (store.root / "ds").iterdir()) == ["v1"]
    assert list(store.tmp_dir.iterdir()) == []


def test_remove(store: DatasetStore) -> None:
    manifest, columns = sample()
    store.write("ds", 1, manifest, columns)
    store.write("ds", 2, manifest, columns)
    assert store.remove("ds", 2) is True
    assert not store.exists("ds", 2) and store.exists("ds", 1)
    assert store.remove("ds", 2) is False
    assert store.remove("ds", 1) is True
    assert not (store.root / "ds").exists()
    assert list(store.tmp_dir.iterdir()) == []
    assert store.remove("never", 1) is False
    store.write("ds", 1, manifest, columns)  # the version can be written again after rollback
    assert store.exists("ds", 1)


def test_load_missing_version(store: DatasetStore) -> None:
    with pytest.raises(FileNotFoundError):
        store.load("nope", 1)


def test_load_refuses_tampered_file_names(store: DatasetStore) -> None:
    folder = store.write("ds", 1, {}, {"a": np.zeros(2)})
    path = folder / "manifest.json"
    document = json.loads(path.read_text())
    document["columns"][0]["file"] = "../../../etc/passwd"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError):
        store.load("ds", 1)


def test_empty_and_non_ascii_round_trip(store: DatasetStore) -> None:
    store.write("e", 1, {"note": "naïve ☃"}, {"empty": np.zeros(0), "one": np.ones(1)})
    manifest, got = store.load("e", 1)
    assert manifest == {"note": "naïve ☃"}
    assert got["empty"].shape == (0,) and got["one"].tolist() == [1.0]


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


def test_sweep_tmp_removes_only_stale_leftovers(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path)
    store.tmp_dir.mkdir(parents=True)
    old, fresh = store.tmp_dir / "old", store.tmp_dir / "fresh"
    old.mkdir()
    fresh.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert store.sweep_tmp(older_than=3600) == 1
    assert not old.exists() and fresh.exists()


def test_sweep_orphans_removes_only_old_unregistered_datasets(store: DatasetStore) -> None:
    """Files a failed registration kept go once their id is known to be unregistered."""
    cols = {"x": np.arange(3.0)}
    for dataset_id in ("ds_kept", "ds_orphan", "ds_fresh"):
        store.write(dataset_id, 1, {"n": 3}, cols)
    store.tmp_dir.mkdir(exist_ok=True)
    stray = store.root / "not a dataset"
    stray.mkdir()
    hour_ago = time.time() - 7200
    for name in ("ds_kept", "ds_orphan", "not a dataset"):
        os.utime(store.root / name, (hour_ago, hour_ago))
    os.utime(store.tmp_dir, (hour_ago, hour_ago))
    assert store.sweep_orphans({"ds_kept"}, older_than=3600) == ["ds_orphan"]
    assert not (store.root / "ds_orphan").exists()
    assert store.exists("ds_kept", 1) and store.exists("ds_fresh", 1)  # registered / in flight
    assert stray.exists() and store.tmp_dir.exists()
    assert store.sweep_orphans({"ds_kept"}, older_than=0) == ["ds_fresh"]


def test_sweep_orphan_versions_removes_only_old_unregistered_versions(
        store: DatasetStore) -> None:
    """Catches version folders of a registered dataset left forever (the dataset sweep
    keeps the whole folder), and a version sweep that removes a registered version, a
    fresh upload's folder, or anything of a dataset whose registration it could not read
    (left out of ``versions_of``, or ``versions_of`` raising)."""
    cols = {"x": np.arange(3.0)}
    for dataset_id, version in (("ds_a", 1), ("ds_a", 2), ("ds_a", 7), ("ds_a", 8),
                                ("ds_b", 1), ("ds_b", 5), ("ds_gone", 3)):
        store.write(dataset_id, version, {"n": 3}, cols)
    (store.root / "ds_a" / "v07").mkdir()  # not a version folder name
    old = time.time() - 7200
    for path in [*store.root.glob("ds_*/v*")]:
        if path.name != "v8":  # ds_a v8: a fresh upload not yet registered
            os.utime(path, (old, old))
    asked: list[list[str]] = []

    def versions_of(ids: list[str]) -> dict[str, set[int]]:
        asked.append(ids)
        return {"ds_a": {1, 2}}  # ds_b: its document could not be read

    with pytest.raises(ConnectionError):  # a Valkey error: nothing goes
        store.sweep_orphan_versions({"ds_a", "ds_b"}, _raise, older_than=3600)
    assert store.exists("ds_a", 7)
    assert store.sweep_orphan_versions({"ds_a", "ds_b", "..", "ds_none"}, versions_of,
                                       older_than=3600) == [("ds_a", 7)]
    assert asked == [["ds_a", "ds_b"]]  # only datasets with an old folder, after listing
    assert {p.name for p in (store.root / "ds_a").iterdir()} == {"v1", "v2", "v8", "v07"}
    assert store.exists("ds_b", 5) and store.exists("ds_gone", 3)  # unreadable / not ours
    assert store.sweep_orphan_versions({"ds_a"}, versions_of, older_than=0) == [("ds_a", 8)]


def _raise(ids: list[str]) -> dict[str, set[int]]:
    raise ConnectionError("valkey is away")


def test_staged_chunks_equal_one_write(store: DatasetStore) -> None:
    """Columns appended chunk by chunk land as the same memory-mapped .npy files."""
    rng = np.random.default_rng(3)
    chunks = [{"x": rng.normal(size=k), "code": np.arange(k, dtype=np.int64),
               "f": rng.normal(size=(k, 3))} for k in (5, 0, 1, 4)]
    with store.staging() as staged:
        for chunk in chunks:
            staged.append(chunk)
        assert staged.n_rows == 10
        folder = staged.commit("ds", 1, {"n_rows": staged.n_rows})
    manifest, got = store.load("ds", 1)
    assert manifest == {"n_rows": 10} and list(got) == ["x", "code", "f"]
    for name in got:
        np.testing.assert_array_equal(got[name], np.concatenate([c[name] for c in chunks]))
        # the header written last is the one numpy reads: a plain np.load agrees
        np.testing.assert_array_equal(np.load(folder / f"c{list(got).index(name)}.npy"),
                                      got[name])
    assert got["f"].shape == (10, 3) and got["code"].dtype == np.int64
    assert list(store.tmp_dir.iterdir()) == []


def test_npy_header_does_not_grow_with_the_row_count() -> None:
    """StagedVersion writes the header for 0 rows first and rewrites it in place."""
    sizes = set()
    for rows in (0, 9, 10**7, 10**15):
        for dtype, rest in ((np.float64, ()), (np.int64, ()), (np.float64, (2000,))):
            buf = io.BytesIO()
            np.lib.format.write_array_header_1_0(buf, {
                "descr": np.dtype(dtype).str, "fortran_order": False, "shape": (rows, *rest)})
            sizes.add((dtype, rest, len(buf.getvalue())))
    assert len(sizes) == 3  # one size per dtype and trailing shape


def test_failure_while_staging_leaves_nothing(store: DatasetStore) -> None:
    """An upload whose CSV fails in a later chunk: the first chunks were on disk."""
    with pytest.raises(RuntimeError, match="bad row"), store.staging() as staged:
        staged.append({"a": np.zeros(4)})
        raise RuntimeError("bad row")
    assert leftovers(store) == []
    assert list(store.tmp_dir.iterdir()) == []


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
        staged.append({"a": np.ones(2), "b": np.ones(3)})
        with pytest.raises(ValueError, match="differ in length"):
            _ = staged.n_rows
        staged.commit("ds", 1, {})
        with pytest.raises(RuntimeError):
            staged.append({"a": np.ones(1), "b": np.ones(1)})
        with pytest.raises(RuntimeError):
            staged.commit("ds", 2, {})
    assert store.exists("ds", 1) and not store.exists("ds", 2)
    assert store.load("ds", 1)[1]["b"].tolist() == [1.0, 1.0, 1.0]
