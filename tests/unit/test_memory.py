"""The memory model of a release (``mechanisms.memory``, issue #30 item 6): what it counts
from public metadata, which input it names, and the refusal. Measured figures are checked
against real runs in ``tests/integration/test_memory_bounds.py``."""

from __future__ import annotations

from typing import Any

import pytest

from mechanisms import memory, registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError, RecordMechanism

COLUMNS = {
    "x": ColumnMeta("x", "continuous", (0.0, 1.0)),
    "g": ColumnMeta("g", "categorical", categories=("a", "b", "c")),
    "z": ColumnMeta("z", "categorical", categories=tuple(f"z{i}" for i in range(99))),
    "f": ColumnMeta("f", "functional", grid=tuple(i / 9 for i in range(10)), norm_bound=1.0),
}


def _meta(n: int) -> DatasetMeta:
    return DatasetMeta(n, COLUMNS)


def test_the_loaded_columns_count_a_functional_column_s_cells_and_the_widest_transient() -> None:
    # 13 cells of 8 bytes, the widest (10 cells) 1.5 times while it loads, 8 bytes offsets
    assert memory.loaded_bytes(_meta(1000)) == 1000 * ((13 + 15) * 8 + 8)
    assert memory.loaded_bytes(_meta(0)) == 0


def test_named_cells_are_the_distinct_columns_the_params_name_at_any_depth() -> None:
    meta = _meta(10)
    assert memory.named_cells({"column": "f"}, meta) == 10
    assert memory.named_cells({"columns": ["x", "g", "x"]}, meta) == 2
    assert memory.named_cells({"statistic": "count", "group_by": ["g"],
                               "condition": {"column": "x", "op": "ge", "value": 0}},
                              meta) == 2
    assert memory.named_cells({"queries": [{"column": "f"}, {"column": "x"}]}, meta) == 11
    assert memory.named_cells({"statistic": "count", "label": "x"}, meta) == 1  # none: 1


def test_a_whole_column_bound_grows_with_the_declared_rows_and_names_the_dataset() -> None:
    mech = registry.get("dip")
    # a hold-out reference samples rows itself: no row map, whole columns
    params = mech.load_params({"columns": ["x", "g"], "reference": {"kind": "holdout"}})
    small, large = mech.memory(params, _meta(10**5)), mech.memory(params, _meta(10**6))
    per_row = (large.bytes - small.bytes) / (10**6 - 10**5)
    expected = (memory.loaded_bytes(_meta(1)) + mech.row_bytes + 2 * mech.cell_bytes)
    assert per_row == pytest.approx(expected)
    assert large.field == "dataset_id"


def test_a_row_map_bound_is_a_row_group_of_its_columns_and_the_table_it_builds() -> None:
    """No loaded columns: per row, the table's ``map_row_bytes`` and the named cells; one
    row group of the named columns with their reading transient; the fixed part."""
    mech = registry.get("dip")
    assert isinstance(mech, RecordMechanism)
    params = mech.load_params({"columns": ["x", "g"]})
    small, large = mech.memory(params, _meta(10**5)), mech.memory(params, _meta(10**6))
    per_row = (large.bytes - small.bytes) / (10**6 - 10**5)
    assert per_row == pytest.approx(mech.map_row_bytes + 2 * mech.cell_bytes)
    batch = (2 * memory.CELL_BYTES * (1 + memory.LOAD_TRANSIENT) + 8)
    assert mech.memory(params, _meta(100)).bytes == pytest.approx(
        100 * (batch + mech.map_row_bytes + 2 * mech.cell_bytes) + mech.map_fixed_bytes)
    assert large.field == "dataset_id"


def test_a_streamed_bound_is_a_row_group_and_its_table() -> None:
    mech = registry.get("laplace")
    mean = mech.load_params({"statistic": "mean", "column": "x"})
    assert mech.memory(mean, _meta(10**8)) == mech.memory(mean, _meta(memory.BATCH_ROWS))
    small = mech.memory(mean, _meta(100))
    assert small.bytes == 100 * (mech.row_bytes + mech.cell_bytes) + 64 + mech.fixed_bytes
    # a 100 x 4 table (undeclared codes counted): its cells, not the rows, drive the bound
    table = mech.load_params({"statistic": "count", "group_by": ["z", "g"]})
    assert memory.table_cells(table, _meta(10)) == 100 * 4
    bound = mech.memory(table, _meta(10))
    assert bound.field == "params.group_by" and bound.bytes > 100 * 4 * 64
    hist = mech.load_params({"statistic": "histogram", "column": "x", "bins": 5000})
    assert mech.memory(hist, _meta(10)).field == "params.bins"


def test_a_bound_above_the_limit_is_refused_naming_its_field_and_the_limit() -> None:
    mech = registry.get("interval.case1")
    params = {"column": "x"}
    bound = mech.memory(params, _meta(10**7))
    memory.check(bound, bound.bytes, "this release")  # at the limit: admitted
    with pytest.raises(MechanismInputError) as refused:
        memory.check(bound, bound.bytes - 1, "this release")
    err = refused.value
    assert isinstance(err, memory.MemoryLimit) and err.code == "memory_limit"
    assert err.field == "dataset_id"
    assert err.extra == {"memory": bound.bytes, "limit": bound.bytes - 1}
    assert "worker memory of" in err.message and "fewer rows" in err.message


def test_the_default_worker_serves_ten_million_rows_of_a_few_columns() -> None:
    """The issue's figure: a 4 GiB worker (3 GiB for releases) serves ~10^7 rows."""
    meta = DatasetMeta(10**7, {k: COLUMNS[k] for k in ("x", "g")})
    cases: list[tuple[str, dict[str, Any]]] = [
        ("dip", {"columns": ["x", "g"]}), ("iclp.kde", {"column": "x"}),
        ("interval.case1", {"column": "x"})]
    for name, raw in cases:
        mech = registry.get(name)
        assert mech.memory(raw, meta).bytes < 3 * 2**30, name
