"""`privrelease datasets draft` (#31 item 8): a metadata template from a local file, with
bounds never read from the data and budgets left to the operator."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner
from privrelease_client import cli as client_cli
from privrelease_client.draft import BOUNDS_NOTE, BUDGETS_NOTE, CATEGORIES_NOTE, draft


def test_a_csv_is_drafted_with_types_categories_and_no_bounds(tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    path.write_text("age,income,group,code\n34,52000.5,a, 7\n51,61000,b,\n29,38000,a,9\n")
    made = draft(path)
    assert made.metadata == {"name": "people", "budgets": {}, "columns": {
        "age": {"type": "integer", "bounds": [None, None]},
        "income": {"type": "continuous", "bounds": [None, None]},
        "group": {"type": "categorical", "categories": ["a", "b"]},
        "code": {"type": "integer", "bounds": [None, None]}}}
    assert made.notes[0] == BOUNDS_NOTE and made.notes[-1] == BUDGETS_NOTE
    assert CATEGORIES_NOTE in made.notes
    assert "'code' has empty cells: fill or drop them before uploading" in made.notes


def test_types_are_decided_over_every_row_not_a_first_block(tmp_path: Path) -> None:
    """pyarrow's own inference looks at a first block; a late decimal or word decides."""
    path = tmp_path / "late.csv"
    rows = [f"{i},{i},{i % 3}" for i in range(300_000)]
    path.write_text("a,b,c\n" + "\n".join(rows) + "\n1.5,x,2\n")
    columns = draft(path).metadata["columns"]
    assert columns["a"]["type"] == "continuous"
    assert "b" not in columns  # words and more than 50 values: not drafted, said why
    assert columns["c"] == {"type": "integer", "bounds": [None, None]}
    assert any("'b' has more than 50 distinct values" in n for n in draft(path).notes)


def test_a_parquet_file_keeps_its_types(tmp_path: Path) -> None:
    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"n": pa.array([1, 2, 3], pa.int32()),
                             "x": pa.array([0.5, 1.0, 2.0]),
                             "g": pa.array(["u", "v", "u"]).dictionary_encode()}), path)
    columns = draft(path, max_categories=2).metadata["columns"]
    assert columns == {"n": {"type": "integer", "bounds": [None, None]},
                       "x": {"type": "continuous", "bounds": [None, None]},
                       "g": {"type": "categorical", "categories": ["u", "v"]}}


def test_the_cli_prints_json_and_says_what_is_left(tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    path.write_text("age,group\n34,a\n51,b\n")
    done = CliRunner().invoke(client_cli.cli, ["datasets", "draft", str(path)])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["columns"]["group"]["categories"] == ["a", "b"]
    assert f"note: {BOUNDS_NOTE}" in done.stderr
    missing = CliRunner().invoke(client_cli.cli, ["datasets", "draft", str(tmp_path / "no")])
    assert missing.exit_code == 2
