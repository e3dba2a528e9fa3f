"""Release tables: stored atomically per run, never replaced, served as exact CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from service.storage.dataset_files import ChangedObject
from service.storage.objects import LocalStore
from service.storage.release_tables import (
    CSV_CHUNK,
    OutputStore,
    csv_chunks,
    neutralise,
    part_name,
    records,
)
from tests.unit.test_store import put_legacy


def test_save_load_per_run_never_replaces(tmp_path: Path) -> None:
    """Each run stores its table apart and a stored table is never replaced: main's
    ``save`` removed and rewrote the release's one table, so a stalled run that lost
    its lease overwrote the committed run's /data (issue #14, finding 6)."""
    store = OutputStore(LocalStore(tmp_path), tmp_path / ".staging")
    assert store.load("rel_x", 1) is None
    table = {"left": np.array([0.1, 1 / 3]), "label": np.array(["a", "b|c"], dtype=object)}
    assert store.save("rel_x", 1, table) == 2
    with pytest.raises(FileExistsError):
        store.save("rel_x", 1, {"left": np.array([2.0])})
    loaded = store.load("rel_x", 1)
    assert loaded is not None and loaded["left"].tolist() == [0.1, 1 / 3]
    assert loaded["label"].tolist() == ["a", "b|c"]
    assert store.save("rel_x", 2, {"left": np.array([2.0])}) == 1  # another run: apart
    again = store.load("rel_x", 2)
    assert again is not None and list(again) == ["left"]
    first = store.load("rel_x", 1)
    assert first is not None and first["left"].tolist() == [0.1, 1 / 3]
    store.save("rel_x", 3, {"left": np.array([3.0])})
    assert store.prune("rel_x", keep=2) == [1, 3]
    assert store.load("rel_x", 1) is None and store.load("rel_x", 2) is not None
    store.discard("rel_x", 2)
    assert store.load("rel_x", 2) is None and not (tmp_path / "tables" / "rel_x").exists()
    assert store.prune("rel_x", keep=None) == []
    with pytest.raises(ValueError, match="differ in length"):
        store.save("rel_y", 1, {"a": np.zeros(2), "b": np.zeros(3)})


def test_csv_round_trips_floats_exactly_across_chunks() -> None:
    rng = np.random.default_rng(1)
    n = CSV_CHUNK * 2 + 7
    table = {"x": rng.normal(size=n), "k": np.arange(n), "s": np.array(["q"] * n)}
    text = "".join(csv_chunks(table))
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["x", "k", "s"] and len(rows) == n + 1
    assert [float(r[0]) for r in rows[1:]] == table["x"].tolist()
    assert [int(r[1]) for r in rows[1:]] == list(range(n))
    assert "".join(csv_chunks({"x": np.zeros(0)})) == "x\r\n"


def test_records_are_json_rows() -> None:
    assert records({"a": np.array([1, 2]), "b": np.array([0.5, 1.5])}) == [
        {"a": 1, "b": 0.5}, {"a": 2, "b": 1.5}]


@pytest.mark.parametrize(("cell", "shown"), [
    ("=cmd|' /C calc'!A0", "'=cmd|' /C calc'!A0"),
    ("+1", "'+1"), ("-1", "'-1"), ("@SUM(1)", "'@SUM(1)"),
    ("\t=1", "'\t=1"), ("\r=1", "'\r=1"),
    ("plain", "plain"), ("a=b", "a=b"), ("", ""), (" =1", " =1"), ("'=1", "'=1"),
])
def test_neutralise_prefixes_only_formula_starters(cell: str, shown: str) -> None:
    assert neutralise(cell) == shown


def test_csv_neutralises_text_cells_and_header_but_not_numbers() -> None:
    table = {"@k": np.array(["=1+1", "a\rb", "-x", "ok"]), "v": np.array([-1.5, 2.0, -3.0, 0.0]),
             "n": np.array([-1, 2, -3, 4])}
    text = "".join(csv_chunks(table))
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == ["'@k", "v", "n"]
    assert [r[0] for r in rows[1:]] == ["'=1+1", "a\rb", "'-x", "ok"]  # "\r" kept in one cell
    assert [float(r[1]) for r in rows[1:]] == [-1.5, 2.0, -3.0, 0.0]
    assert [r[2] for r in rows[1:]] == ["-1", "2", "-3", "4"]
    assert text.endswith("\r\n") and '"a\rb"' in text


def test_tables_stored_before_are_read_and_pruned_in_place(tmp_path: Path) -> None:
    """A run's table in the ``.npy`` layout under ``releases/<id>/v<attempt>`` (before
    tables moved to ``tables/``) is served, and pruned with the new ones."""
    objects = LocalStore(tmp_path)
    put_legacy(objects, "releases/rel_old/v1", {"kind": "release-table"},
               {"x": np.array([1.5, 2.5]), "label": np.array(["a", "b"])})
    store = OutputStore(objects, tmp_path / ".staging")
    old = store.load("rel_old", 1)
    assert old is not None and old["x"].tolist() == [1.5, 2.5]
    assert old["label"].tolist() == ["a", "b"]
    store.save("rel_old", 2, {"x": np.array([3.0])})
    assert store.prune("rel_old", keep=2) == [1]
    assert store.load("rel_old", 1) is None and not (tmp_path / "releases").exists()
    kept = store.load("rel_old", 2)
    assert kept is not None and kept["x"].tolist() == [3.0]


def _write_part(fs: pafs.FileSystem, base: str, bucket: int, table: pa.Table) -> str:
    """A part as an engine's worker writes it (through the store's filesystem)."""
    fs.create_dir(base, recursive=True)
    name = part_name(bucket)
    with fs.open_output_stream(f"{base}/{name}") as stream:
        pq.write_table(table, stream)
    return name


def test_a_table_stored_as_parts_reads_as_one_table(tmp_path: Path) -> None:
    """Parts committed in bucket order read back end to end, text as unicode; a second
    commit, a bad part name, a changed part are refused; a discard removes every part."""
    outputs = OutputStore(LocalStore(tmp_path / "o"), tmp_path / "s")
    fs, base = outputs.parts_place("rel_parts", 1)
    parts = [(_write_part(fs, base, b, pa.table({"_row": np.arange(b * 10, b * 10 + rows),
                                                 "c": pa.array([f"v{i}" for i in range(rows)],
                                                               pa.string())})), rows)
             for b, rows in ((0, 3), (2, 0), (5, 4))]
    assert outputs.commit_parts("rel_parts", 1, parts) == 7
    table = outputs.load("rel_parts", 1)
    assert table is not None
    assert table["_row"].tolist() == [0, 1, 2, 50, 51, 52, 53]
    assert table["c"].dtype.kind == "U" and table["c"].tolist() == ["v0", "v1", "v2", "v0",
                                                                      "v1", "v2", "v3"]
    with pytest.raises(FileExistsError):
        outputs.commit_parts("rel_parts", 1, parts)
    with pytest.raises(ValueError):
        outputs.commit_parts("rel_parts", 2, [("../x.parquet", 1)])
    outputs.save("rel_whole", 1, {"x": np.arange(2)})
    with pytest.raises(FileExistsError):  # a run's table is never replaced by parts
        outputs.commit_parts("rel_whole", 1, [])
    _write_part(fs, base, 5, pa.table({"_row": np.arange(9), "c": ["w"] * 9}))  # replaced
    with pytest.raises(ChangedObject):
        outputs.load("rel_parts", 1)
    outputs.discard("rel_parts", 1)
    assert outputs.load("rel_parts", 1) is None
    assert not list(outputs.store.objects.list(base + "/"))
