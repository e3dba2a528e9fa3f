"""Release tables: stored and replaced atomically, served as exact CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest

from service.outputs import CSV_CHUNK, OutputStore, csv_chunks, neutralise, records


def test_save_load_replace(tmp_path: Path) -> None:
    store = OutputStore(tmp_path)
    assert store.load("rel_x") is None
    table = {"left": np.array([0.1, 1 / 3]), "label": np.array(["a", "b|c"], dtype=object)}
    assert store.save("rel_x", table) == 2
    loaded = store.load("rel_x")
    assert loaded is not None and loaded["left"].tolist() == [0.1, 1 / 3]
    assert loaded["label"].tolist() == ["a", "b|c"]
    assert store.save("rel_x", {"left": np.array([2.0])}) == 1  # a re-run replaces
    again = store.load("rel_x")
    assert again is not None and list(again) == ["left"]
    with pytest.raises(ValueError, match="differ in length"):
        store.save("rel_y", {"a": np.zeros(2), "b": np.zeros(3)})


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
