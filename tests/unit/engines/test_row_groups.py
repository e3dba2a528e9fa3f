"""``service.engines.row_groups``: the plan from footers, the packing of row groups into
Spark tasks, and the read of one row group (local Parquet files)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.engines.row_groups import RowGroup, footers, pack, plan, read


@given(st.lists(st.integers(1, 50), max_size=30), st.integers(1, 120))
def test_tasks_keep_every_row_group_once_in_order_within_their_rows(
        sizes: list[int], rows: int) -> None:
    groups = [RowGroup("f", i, n) for i, n in enumerate(sizes)]
    tasks = pack(groups, rows)
    assert [g for task in tasks for g in task] == groups
    for task in tasks:
        assert task and (len(task) == 1 or sum(g.rows for g in task) <= rows)
    for first, second in itertools.pairwise(tasks):  # none could take the next
        assert sum(g.rows for g in first) + second[0].rows > rows


def test_a_task_of_no_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        pack([RowGroup("f", 0, 5)], 0)


def test_the_plan_reads_footers_skips_empty_groups_and_names_a_missing_column(
        tmp_path: Path) -> None:
    full, empty = str(tmp_path / "full.parquet"), str(tmp_path / "empty.parquet")
    pq.write_table(pa.table({"c0": np.arange(25), "c1": np.linspace(0, 1, 25)}), full,
                   row_group_size=10)
    pq.write_table(pa.table({"c0": pa.array([], pa.int64())}), empty)
    local = pafs.LocalFileSystem()
    found = footers([full, empty], local)
    assert [f.rows for f in found] == [(10, 10, 5), (0,)]
    assert plan(found, ["c0"]) == [RowGroup(full, 0, 10), RowGroup(full, 1, 10),
                                   RowGroup(full, 2, 5)]
    with pytest.raises(ValueError, match=r"column 'c1' is not in the Parquet file .*empty"):
        plan(found, ["c0", "c1"])
    batch = read(RowGroup(full, 1, 10), {"age": "c0", "also": "c0", "x": "c1"}, local)
    assert batch["age"].tolist() == batch["also"].tolist() == list(range(10, 20))
    assert batch["age"].dtype == np.int64 and batch["x"].dtype == np.float64


def test_a_null_cell_is_refused_without_its_row(tmp_path: Path) -> None:
    path = str(tmp_path / "nulls.parquet")
    pq.write_table(pa.table({"c0": pa.array([4.25, None])}), path)
    with pytest.raises(ValueError, match=r"column 'c0' of .* has null cells") as refused:
        read(RowGroup(path, 0, 2), {"x": "c0"}, pafs.LocalFileSystem())
    assert "4.25" not in str(refused.value)
