"""Upload validation: every bad input names its field and never echoes a data value."""

from __future__ import annotations

import copy
import csv
import gc
import io
import math
import tempfile
import tracemalloc
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mechanisms.base import ColumnMeta
from service import ingest
from service.ingest import (
    DatasetSpec,
    IngestError,
    iter_csv,
    iter_upload,
    parse_csv,
    parse_metadata,
)

SECRET_NUM = "987654321"
SECRET_STR = "SECRETVALUE"

BASE: dict[str, Any] = {
    "name": "adult",
    "columns": {
        "age": {"type": "integer", "bounds": [17, 90]},
        "race": {"type": "categorical", "categories": ["A", "B", "C"]},
        "wage": {"type": "continuous", "bounds": [0, 200000]},
    },
    "budgets": {"epsilon": 5, "delta": 1e-6},
}


def metadata(**changes: Any) -> dict[str, Any]:
    """A deep copy of BASE with top-level keys replaced."""
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


def with_column(name: str, spec: Any) -> dict[str, Any]:
    raw = metadata()
    raw["columns"][name] = spec
    return raw


def to_csv(header: list[str], rows: list[list[Any]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode()


def spec_of(**changes: Any) -> DatasetSpec:
    return parse_metadata(metadata(**changes))


def parse(data: bytes, spec: DatasetSpec | None = None, max_rows: int = 1000) -> Any:
    return parse_csv(data, spec or spec_of(), max_rows=max_rows)


def ingest_error(data: bytes, spec: DatasetSpec | None = None, **kw: Any) -> IngestError:
    with pytest.raises(IngestError) as info:
        parse(data, spec, **kw)
    return info.value


def assert_no_secret(err: IngestError) -> None:
    for text in (str(err), err.message, err.field):
        assert SECRET_NUM not in text
        assert SECRET_STR not in text


GOOD = [["17", "A", "100.5"], ["90", "C", "0"]]
HEADER = ["age", "race", "wage"]


# --------------------------------------------------------------------------- metadata


def test_metadata_valid_keeps_order_defaults_and_budgets() -> None:
    raw = metadata(columns={
        "wage": {"type": "continuous", "bounds": [0, 10.5], "allow_missing": True},
        "age": {"type": "integer", "bounds": [17.0, 90], "allow_missing": True, "fill": 30},
        "race": {"type": "categorical", "categories": ["A", "B"], "allow_missing": True,
                 "fill": "B"},
        "sex": {"type": "categorical", "categories": ["F", "M"]},
    })
    spec = parse_metadata(raw)
    assert spec.name == "adult"
    assert list(spec.columns) == ["wage", "age", "race", "sex"]
    assert spec.columns["age"] == ColumnMeta("age", "integer", bounds=(17, 90))
    assert isinstance(spec.columns["age"].bounds[0], int)  # type: ignore[index]
    assert spec.columns["wage"] == ColumnMeta("wage", "continuous", bounds=(0.0, 10.5))
    assert spec.columns["race"].categories == ("A", "B")
    assert spec.fill == {"wage": 0.0, "age": 30, "race": "B"}
    assert spec.allows_missing("race") and not spec.allows_missing("sex")
    assert spec.bounds_policy == "reject"
    assert spec.budgets == raw["budgets"]
    assert parse_metadata(metadata(bounds_policy="clip")).bounds_policy == "clip"
    meta = spec.meta(12)
    assert meta.n_rows == 12 and meta.column("age") == spec.columns["age"]


def test_metadata_budgets_passed_through_untouched() -> None:
    budgets = {"epsilon": "not validated here", "whatever": [1, 2]}
    assert parse_metadata(metadata(budgets=budgets)).budgets == budgets


BAD_METADATA: list[tuple[str, Any, str]] = [
    ("not an object", ["a"], "metadata"),
    ("unknown top key", metadata(grids={}), "metadata.grids"),
    ("name missing", {k: v for k, v in BASE.items() if k != "name"}, "metadata.name"),
    ("name empty", metadata(name=""), "metadata.name"),
    ("name blank", metadata(name="   "), "metadata.name"),
    ("name too long", metadata(name="x" * 201), "metadata.name"),
    ("name not str", metadata(name=5), "metadata.name"),
    ("columns missing", {k: v for k, v in BASE.items() if k != "columns"}, "metadata.columns"),
    ("columns empty", metadata(columns={}), "metadata.columns"),
    ("columns list", metadata(columns=[{"type": "integer"}]), "metadata.columns"),
    ("column name empty", with_column("", {"type": "integer", "bounds": [0, 1]}),
     "metadata.columns"),
    ("column name too long", with_column("c" * 201, {"type": "integer", "bounds": [0, 1]}),
     "metadata.columns"),
    ("column name line break", with_column("a\nb", {"type": "integer", "bounds": [0, 1]}),
     "metadata.columns"),
    ("column not object", with_column("x", "integer"), "metadata.columns.x"),
    ("unknown column key", with_column("x", {"type": "integer", "bounds": [0, 1], "bound": 1}),
     "metadata.columns.x.bound"),
    ("type missing", with_column("x", {"bounds": [0, 1]}), "metadata.columns.x.type"),
    ("type unknown", with_column("x", {"type": "float", "bounds": [0, 1]}),
     "metadata.columns.x.type"),
    ("bounds missing", with_column("x", {"type": "continuous"}), "metadata.columns.x.bounds"),
    ("bounds one value", with_column("x", {"type": "continuous", "bounds": [1]}),
     "metadata.columns.x.bounds"),
    ("bounds not list", with_column("x", {"type": "continuous", "bounds": {"lo": 1}}),
     "metadata.columns.x.bounds"),
    ("bounds strings", with_column("x", {"type": "continuous", "bounds": ["0", "1"]}),
     "metadata.columns.x.bounds"),
    ("bounds bool", with_column("x", {"type": "integer", "bounds": [False, True]}),
     "metadata.columns.x.bounds"),
    ("bounds infinite", with_column("x", {"type": "continuous", "bounds": [0, math.inf]}),
     "metadata.columns.x.bounds"),
    ("bounds nan", with_column("x", {"type": "continuous", "bounds": [math.nan, 1]}),
     "metadata.columns.x.bounds"),
    ("bounds reversed", with_column("x", {"type": "continuous", "bounds": [2, 1]}),
     "metadata.columns.x.bounds"),
    ("bounds equal", with_column("x", {"type": "integer", "bounds": [1, 1]}),
     "metadata.columns.x.bounds"),
    ("integer bounds fractional", with_column("x", {"type": "integer", "bounds": [0, 1.5]}),
     "metadata.columns.x.bounds"),
    ("integer bounds beyond int64", with_column("x", {"type": "integer", "bounds": [0, 2**63]}),
     "metadata.columns.x.bounds"),
    ("bounds on categorical",
     with_column("x", {"type": "categorical", "categories": ["a"], "bounds": [0, 1]}),
     "metadata.columns.x.bounds"),
    ("categories missing", with_column("x", {"type": "categorical"}),
     "metadata.columns.x.categories"),
    ("categories empty", with_column("x", {"type": "categorical", "categories": []}),
     "metadata.columns.x.categories"),
    ("categories not strings", with_column("x", {"type": "categorical", "categories": [1, 2]}),
     "metadata.columns.x.categories"),
    ("categories duplicated",
     with_column("x", {"type": "categorical", "categories": ["a", "b", "a"]}),
     "metadata.columns.x.categories"),
    ("too many categories",
     with_column("x", {"type": "categorical", "categories": [str(i) for i in range(10_001)]}),
     "metadata.columns.x.categories"),
    ("categories on numeric",
     with_column("x", {"type": "integer", "bounds": [0, 1], "categories": ["a"]}),
     "metadata.columns.x.categories"),
    ("allow_missing not bool",
     with_column("x", {"type": "integer", "bounds": [0, 1], "allow_missing": "yes"}),
     "metadata.columns.x.allow_missing"),
    ("fill without allow_missing",
     with_column("x", {"type": "integer", "bounds": [0, 1], "fill": 0}), "metadata.columns.x.fill"),
    ("fill outside bounds",
     with_column("x", {"type": "integer", "bounds": [0, 1], "allow_missing": True, "fill": 2}),
     "metadata.columns.x.fill"),
    ("fill fractional for integer",
     with_column("x", {"type": "integer", "bounds": [0, 1], "allow_missing": True, "fill": 0.5}),
     "metadata.columns.x.fill"),
    ("fill not a number",
     with_column("x", {"type": "continuous", "bounds": [0, 1], "allow_missing": True,
                       "fill": "0"}),
     "metadata.columns.x.fill"),
    ("fill nan",
     with_column("x", {"type": "continuous", "bounds": [0, 1], "allow_missing": True,
                       "fill": math.nan}),
     "metadata.columns.x.fill"),
    ("categorical fill missing",
     with_column("x", {"type": "categorical", "categories": ["a"], "allow_missing": True}),
     "metadata.columns.x.fill"),
    ("categorical fill not a category",
     with_column("x", {"type": "categorical", "categories": ["a"], "allow_missing": True,
                       "fill": "b"}),
     "metadata.columns.x.fill"),
    ("budgets missing", {k: v for k, v in BASE.items() if k != "budgets"}, "metadata.budgets"),
    ("budgets not object", metadata(budgets=[1]), "metadata.budgets"),
    ("bounds_policy unknown", metadata(bounds_policy="ignore"), "metadata.bounds_policy"),
]


@pytest.mark.parametrize(
    ("raw", "field"), [(raw, field) for _, raw, field in BAD_METADATA],
    ids=[case for case, _, _ in BAD_METADATA],
)
def test_bad_metadata_names_field(raw: Any, field: str) -> None:
    with pytest.raises(IngestError) as info:
        parse_metadata(raw)
    assert info.value.field == field
    assert info.value.message


def test_metadata_too_many_columns() -> None:
    columns = {f"c{i}": {"type": "integer", "bounds": [0, 1]} for i in range(6)}
    parse_metadata(metadata(columns=columns), max_columns=6)
    with pytest.raises(IngestError) as info:
        parse_metadata(metadata(columns=columns), max_columns=5)
    assert info.value.field == "metadata.columns"


# --------------------------------------------------------------------------- CSV: good


def test_parse_types_order_and_values() -> None:
    data = to_csv(["wage", "race", "age"], [["100.5", "A", "17"], ["0", "C", " 90 "]])
    n, cols = parse(data)
    assert n == 2
    assert list(cols) == ["age", "race", "wage"]  # metadata order, not header order
    assert cols["age"].dtype == np.int64 and cols["age"].tolist() == [17, 90]
    assert cols["race"].dtype == np.int64 and cols["race"].tolist() == [0, 2]
    assert cols["wage"].dtype == np.float64 and cols["wage"].tolist() == [100.5, 0.0]


def test_bom_crlf_quotes_and_blank_lines() -> None:
    raw = metadata(columns={
        "note": {"type": "categorical", "categories": ["a,b", 'say "hi"', "two\nlines"]},
        "x": {"type": "integer", "bounds": [0, 10]},
    })
    text = '\ufeffnote,x\r\n"a,b",1\r\n\r\n"two\nlines",2\r\n"say ""hi""",3\r\n'
    n, cols = parse_csv(text.encode(), parse_metadata(raw), max_rows=10)
    assert n == 3
    assert cols["note"].tolist() == [0, 2, 1]
    assert cols["x"].tolist() == [1, 2, 3]


def test_line_numbers_count_blank_and_multiline_records() -> None:
    raw = metadata(columns={
        "note": {"type": "categorical", "categories": ["a", "two\nlines"]},
        "x": {"type": "integer", "bounds": [0, 10]},
    })
    text = 'note,x\n\n"two\nlines",1\na,2\na,99\n'  # the bad record starts on line 6
    with pytest.raises(IngestError) as info:
        parse_csv(text.encode(), parse_metadata(raw), max_rows=10)
    assert info.value.field == "file.columns.x"
    assert info.value.line == 6
    assert "line 6" in info.value.message


def test_integer_syntax() -> None:
    spec = parse_metadata(metadata(columns={"age": {"type": "integer", "bounds": [-5, 90]}}))
    _, cols = parse_csv(to_csv(["age"], [["3"], ["3.0"], ["4."], [" +5 "], ["-5.000"]]), spec,
                        max_rows=10)
    assert cols["age"].tolist() == [3, 3, 4, 5, -5]
    for bad in ["1.5", "3e0", "3.01", "0x10", "three", "1.0.0"]:
        err = ingest_error(to_csv(["age"], [["3"], [bad]]), spec)
        assert err.field == "file.columns.age" and err.line == 3
        assert "not an integer" in err.message


def test_float_syntax_exact() -> None:
    spec = parse_metadata(metadata(columns={"w": {"type": "continuous", "bounds": [-1, 1]}}))
    values = [0.1, -1.0, 1.0, 5e-324, 0.30000000000000004, 1 / 3]
    _, cols = parse_csv(to_csv(["w"], [[repr(v)] for v in values] + [[" 0.5 "], ["1e-1"]]),
                        spec, max_rows=10)
    assert cols["w"].tolist() == [*values, 0.5, 0.1]


MISSING_CELLS = ["", "  ", "nan", "NaN", "NA", "null", "inf", "-Infinity", "1e999"]


@pytest.mark.parametrize("cell", MISSING_CELLS)
def test_missing_numeric_rejected_without_allow_missing(cell: str) -> None:
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["18", "B", cell]]))
    assert err.field == "file.columns.wage" and err.line == 3
    assert "missing" in err.message


@pytest.mark.parametrize("cell", ["", "nan", "NA", "inf"])
def test_missing_integer_rejected_without_allow_missing(cell: str) -> None:
    err = ingest_error(to_csv(HEADER, [GOOD[0], [cell, "B", "1"]]))
    assert err.field == "file.columns.age" and err.line == 3


def test_missing_filled_when_allowed() -> None:
    spec = parse_metadata(metadata(columns={
        "age": {"type": "integer", "bounds": [17, 90], "allow_missing": True},
        "race": {"type": "categorical", "categories": ["A", "NA"], "allow_missing": True,
                 "fill": "A"},
        "wage": {"type": "continuous", "bounds": [0, 100], "allow_missing": True, "fill": 50},
    }))
    rows = [[c, "", c] for c in MISSING_CELLS] + [["20", "NA", "1.5"], ["", "nan", "2"]]
    n, cols = parse_csv(to_csv(HEADER, rows), spec, max_rows=100)
    assert n == len(MISSING_CELLS) + 2
    assert cols["age"].tolist() == [17] * len(MISSING_CELLS) + [20, 17]
    assert cols["wage"].tolist() == [50.0] * len(MISSING_CELLS) + [1.5, 2.0]
    # "NA" is a declared category, so it is that category, not a missing marker
    assert cols["race"].tolist() == [0] * len(MISSING_CELLS) + [1, 0]


def test_missing_categorical_rejected_without_allow_missing() -> None:
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["20", "", "1"]]))
    assert err.field == "file.columns.race" and err.line == 3
    assert "missing" in err.message


def test_bounds_reject_and_clip() -> None:
    rows = [["16", "A", "-0.5"], ["91", "B", "200000.5"], ["50", "C", "7"],
            ["99999999999999999999999", "A", "1"], ["-99999999999999999999999", "A", "1"]]
    data = to_csv(HEADER, rows)
    err = ingest_error(data)
    assert err.field == "file.columns.age" and err.line == 2
    assert "outside declared bounds [17, 90]" in err.message
    _, cols = parse(data, spec_of(bounds_policy="clip"))
    assert cols["age"].tolist() == [17, 90, 50, 90, 17]
    assert cols["wage"].tolist() == [0.0, 200000.0, 7.0, 1.0, 1.0]


def test_huge_integer_rejected_as_out_of_bounds() -> None:
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["1" + "0" * 30, "A", "1"]]))
    assert err.field == "file.columns.age" and err.line == 3
    assert "outside declared bounds" in err.message


def test_earliest_problem_in_a_column_is_reported() -> None:
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["99", "A", "1"], ["x", "A", "1"]]))
    assert (err.line, "outside" in err.message) == (3, True)
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["x", "A", "1"], ["99", "A", "1"]]))
    assert (err.line, "not an integer" in err.message) == (3, True)
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["", "A", "1"], ["x", "A", "1"]]))
    assert (err.line, "missing" in err.message) == (3, True)
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["x", "A", "1"], ["", "A", "1"]]))
    assert (err.line, "not an integer" in err.message) == (3, True)
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["17", "A", "nan"], ["17", "A", "-1"]]))
    assert (err.line, "missing" in err.message) == (3, True)
    err = ingest_error(to_csv(HEADER, [GOOD[0], ["17", "A", "-1"], ["17", "A", "nan"]]))
    assert (err.line, "outside" in err.message) == (3, True)


def test_max_rows_boundary() -> None:
    data = to_csv(HEADER, GOOD * 3)
    assert parse(data, max_rows=6)[0] == 6
    err = ingest_error(data, max_rows=5)
    assert err.field == "file" and "more than 5" in err.message


def test_gc_state_restored() -> None:
    assert gc.isenabled()
    parse(to_csv(HEADER, GOOD))
    assert gc.isenabled()
    ingest_error(to_csv(HEADER, [["1", "2"]]))
    assert gc.isenabled()
    gc.disable()
    try:
        parse(to_csv(HEADER, GOOD))
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_chunked_conversion(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(ingest, "CHUNK_ROWS", chunk)
    spec = parse_metadata(metadata(columns={
        "age": {"type": "integer", "bounds": [17, 90], "allow_missing": True},
        "race": {"type": "categorical", "categories": ["A", "B", "C"]},
        "wage": {"type": "continuous", "bounds": [0, 200000]},
    }))
    rows = [[str(17 + i), "ABC"[i % 3], f"{i}.5"] for i in range(7)]
    rows[4][0] = ""
    n, cols = parse_csv(to_csv(HEADER, rows), spec, max_rows=7)
    assert n == 7
    assert cols["age"].tolist() == [17, 18, 19, 20, 17, 22, 23]
    assert cols["race"].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert cols["wage"].tolist() == [i + 0.5 for i in range(7)]
    rows[5][2] = "-1"
    err = ingest_error(to_csv(HEADER, rows), spec)
    assert (err.field, err.line) == ("file.columns.wage", 7)
    rows[5][2] = "1"
    with pytest.raises(IngestError) as info:
        parse_csv(to_csv(HEADER, rows), spec, max_rows=6)
    assert info.value.field == "file"


def test_larger_table_round_trips() -> None:
    rng = np.random.default_rng(7)
    n = 20_000
    age = rng.integers(17, 91, n)
    race = rng.integers(0, 3, n)
    wage = rng.uniform(0, 200000, n)
    rows = [[str(a), "ABC"[r], repr(w)] for a, r, w in zip(age.tolist(), race.tolist(),
                                                          wage.tolist(), strict=True)]
    got_n, cols = parse(to_csv(HEADER, rows), max_rows=n)
    assert got_n == n
    np.testing.assert_array_equal(cols["age"], age)
    np.testing.assert_array_equal(cols["race"], race)
    np.testing.assert_array_equal(cols["wage"], wage)


# --------------------------------------------------------------------------- CSV: bad


BAD_FILES: list[tuple[str, bytes, str]] = [
    ("not utf-8", b"age,race,wage\n17,A,\xff" + SECRET_NUM.encode() + b"\n", "file"),
    ("empty", b"", "file"),
    ("only blank lines", b"\n\n", "file"),
    ("header only", b"age,race,wage\n", "file"),
    ("missing column", to_csv(["age", "race"], [["17", "A"]]), "file.columns.wage"),
    ("unknown column", to_csv([*HEADER, "extra"], [["17", "A", "1", SECRET_STR]]),
     "file.columns.extra"),
    ("duplicate header", to_csv(["age", "race", "wage", "age"], [["17", "A", "1", "18"]]),
     "file.columns.age"),
    ("empty header name", to_csv(["age", "race", "wage", ""], [["17", "A", "1", ""]]),
     "file.header"),
    ("headerless", to_csv([SECRET_NUM, SECRET_STR, "1.5"], [["17", "A", "1"]]), "file.header"),
    ("headerless repeated value", to_csv([SECRET_NUM, SECRET_NUM, "A"], [["17", "A", "1"]]),
     "file.header"),
    ("headerless ragged below", to_csv([SECRET_NUM, "A", "1"], [["17", SECRET_STR]]),
     "file.header"),
    ("huge unknown header name", to_csv([*HEADER, SECRET_STR * 30], [["17", "A", "1", "x"]]),
     "file.header"),
    ("ragged short", to_csv(HEADER, [GOOD[0], ["17", SECRET_STR]]), "file.line 3"),
    ("ragged long", to_csv(HEADER, [GOOD[0], GOOD[1], ["17", "A", "1", SECRET_NUM]]),
     "file.line 4"),
    ("unclosed quote", b'age,race,wage\n17,A,1\n17,"A' + SECRET_STR.encode() + b",1\n",
     "file.line 3"),
    ("text after quote", b'age,race,wage\n17,"A"' + SECRET_STR.encode() + b",1\n",
     "file.line 2"),
    ("non-numeric continuous", to_csv(HEADER, [GOOD[0], ["17", "A", SECRET_STR]]),
     "file.columns.wage"),
    ("non-numeric integer", to_csv(HEADER, [GOOD[0], [SECRET_STR, "A", "1"]]),
     "file.columns.age"),
    ("non-integer", to_csv(HEADER, [GOOD[0], [SECRET_NUM + ".5", "A", "1"]]),
     "file.columns.age"),
    ("integer out of bounds", to_csv(HEADER, [GOOD[0], [SECRET_NUM, "A", "1"]]),
     "file.columns.age"),
    ("continuous out of bounds", to_csv(HEADER, [GOOD[0], ["17", "A", SECRET_NUM + ".25"]]),
     "file.columns.wage"),
    ("negative out of bounds", to_csv(HEADER, [GOOD[0], ["17", "A", "-" + SECRET_NUM]]),
     "file.columns.wage"),
    ("unknown category", to_csv(HEADER, [GOOD[0], ["17", SECRET_STR, "1"]]),
     "file.columns.race"),
    ("unknown category number", to_csv(HEADER, [GOOD[0], ["17", SECRET_NUM, "1"]]),
     "file.columns.race"),
]


@pytest.mark.parametrize(
    ("data", "field"), [(data, field) for _, data, field in BAD_FILES],
    ids=[case for case, _, _ in BAD_FILES],
)
def test_bad_file_names_field_without_data_values(data: bytes, field: str) -> None:
    err = ingest_error(data)
    assert err.field == field
    assert err.message
    assert_no_secret(err)


def test_secret_absent_from_huge_integer_and_clip_paths() -> None:
    err = ingest_error(to_csv(HEADER, [GOOD[0], [SECRET_NUM * 5, "A", "1"]]))
    assert_no_secret(err)
    spec = spec_of(bounds_policy="clip")
    err = ingest_error(to_csv(HEADER, [[SECRET_NUM, "A", SECRET_STR]]), spec)
    assert err.field == "file.columns.wage"
    assert_no_secret(err)


def test_malformed_csv_oversized_field() -> None:
    data = b"age,race,wage\n17,A,1\n17,A," + b"9" * 200_000 + b"\n"
    err = ingest_error(data)
    assert err.field == "file.line 3" and "malformed CSV" in err.message
    assert "999999" not in str(err)


def test_too_many_header_columns() -> None:
    err = ingest_error(b"age,race,wage,x,y\n1,2,3,4,5\n", spec_of(), max_rows=10)
    assert err.field == "file.columns.x"
    with pytest.raises(IngestError) as info:
        parse_csv(b"age,race,wage,x,y\n1,2,3,4,5\n", spec_of(), max_rows=10, max_columns=4)
    assert info.value.field == "file"


def test_missing_column_reported_before_unknown_one() -> None:
    err = ingest_error(to_csv(["age", "race", "salary"], [["17", "A", "1"]]))
    assert err.field == "file.columns.wage"


# --------------------------------------------------------------------------- properties

_CELL_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8
)
_ONE_LINE_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00\r\n"), max_size=8
)
_NAME = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cc"]), min_size=1, max_size=8
)


@st.composite
def tables(
    draw: st.DrawFn, cell_text: st.SearchStrategy[str] = _CELL_TEXT
) -> tuple[dict[str, Any], list[str], list[list[str]], dict[str, list]]:
    """Random valid metadata, a CSV (header order shuffled) and the expected columns.

    Category values may contain commas, quotes and line breaks (``cell_text``).
    """
    names = draw(st.lists(_NAME, min_size=1, max_size=4, unique=True))
    n = draw(st.integers(1, 25))
    columns: dict[str, Any] = {}
    expected: dict[str, list] = {}
    cells: dict[str, list[str]] = {}
    for name in names:
        kind = draw(st.sampled_from(["continuous", "integer", "categorical"]))
        if kind == "categorical":
            cats = draw(st.lists(cell_text, min_size=1, max_size=5, unique=True))
            codes = draw(st.lists(st.integers(0, len(cats) - 1), min_size=n, max_size=n))
            columns[name] = {"type": kind, "categories": cats}
            expected[name] = codes
            cells[name] = [cats[c] for c in codes]
        elif kind == "integer":
            lo = draw(st.integers(-(10**12), 10**12))
            hi = lo + draw(st.integers(1, 10**6))
            values = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
            columns[name] = {"type": kind, "bounds": [lo, hi]}
            expected[name] = values
            cells[name] = [str(v) for v in values]
        else:
            flo = draw(st.floats(-1e6, 1e6))
            fhi = flo + draw(st.floats(1e-3, 1e6))
            floats = draw(st.lists(st.floats(flo, fhi), min_size=n, max_size=n))
            columns[name] = {"type": kind, "bounds": [flo, fhi]}
            expected[name] = floats
            cells[name] = [repr(v) for v in floats]
    header = draw(st.permutations(names))
    rows = [[cells[name][i] for name in header] for i in range(n)]
    raw = {"name": "t", "columns": columns, "budgets": {}}
    return raw, header, rows, expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_valid_tables_round_trip(table: Any) -> None:
    raw, header, rows, expected = table
    spec = parse_metadata(raw)
    n, cols = parse_csv(to_csv(header, rows), spec, max_rows=len(rows))
    assert n == len(rows)
    assert list(cols) == list(raw["columns"])
    for name, meta in spec.columns.items():
        assert cols[name].shape == (n,)
        assert cols[name].tolist() == expected[name]
        if meta.categories is not None:
            assert [meta.categories[c] for c in cols[name]] == [
                row[header.index(name)] for row in rows
            ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(_ONE_LINE_TEXT), st.data())
def test_one_planted_violation_names_its_column(table: Any, data: st.DataObject) -> None:
    # one physical line per record, so record i (0-based) starts on line i + 2
    raw, header, rows, _ = table
    name = data.draw(st.sampled_from(header))
    row = data.draw(st.integers(0, len(rows) - 1))
    col = raw["columns"][name]
    if col["type"] == "categorical":
        bad = data.draw(_ONE_LINE_TEXT.filter(lambda s: s not in col["categories"]))
    else:
        lo, hi = col["bounds"]
        choices = ["", "nan", "inf", "word", repr(hi + 1 + abs(hi)), repr(lo - 1 - abs(lo))]
        if col["type"] == "integer":
            choices += [str(hi + 1), str(lo - 1), f"{lo}.5"]
        bad = data.draw(st.sampled_from(choices))
    rows[row][header.index(name)] = bad
    with pytest.raises(IngestError) as info:
        parse_csv(to_csv(header, rows), parse_metadata(raw), max_rows=len(rows))
    assert info.value.field == f"file.columns.{name}"
    assert info.value.line == row + 2


# ------------------------------------------------------------- priors and functional columns


def _functional_meta(**col: object) -> dict[str, object]:
    return {"name": "curves", "budgets": {},
            "columns": {"id": {"type": "integer", "bounds": [0, 9]},
                        "f": {"type": "functional", "grid": [0.0, 0.5, 1.0], "norm_bound": 2,
                              **col}}}


def test_functional_column_becomes_a_matrix_in_grid_order() -> None:
    spec = parse_metadata(_functional_meta())
    assert spec.columns["f"].grid == (0.0, 0.5, 1.0) and spec.columns["f"].norm_bound == 2.0
    csv = b"f.2,id,f.0,f.1\n3,1,1,2\n6,2,4,5\n"
    n, cols = parse_csv(csv, spec, max_rows=10)
    assert n == 2 and cols["f"].shape == (2, 3)
    assert cols["f"].tolist() == [[1, 2, 3], [4, 5, 6]] and cols["id"].tolist() == [1, 2]


@pytest.mark.parametrize(("col", "field"), [
    ({"grid": [0, 0, 1]}, "metadata.columns.f.grid"),
    ({"grid": [0.0]}, "metadata.columns.f.grid"),
    ({"grid": [0, float("nan"), 1]}, "metadata.columns.f.grid"),
    ({"norm_bound": 0}, "metadata.columns.f.norm_bound"),
    ({"norm_bound": -1}, "metadata.columns.f.norm_bound"),
    ({"bounds": [0, 1]}, "metadata.columns.f.bounds"),
])
def test_bad_functional_metadata(col: dict[str, object], field: str) -> None:
    with pytest.raises(IngestError) as info:
        parse_metadata(_functional_meta(**col))
    assert info.value.field == field


@pytest.mark.parametrize(("csv", "field"), [
    (b"id,f.0,f.1\n1,1,2\n", "file.columns.f.2"),  # a grid point missing from the CSV
    (b"id,f.0,f.1,f.2\n1,1,,3\n", "file.columns.f.1"),  # empty cell
    (b"id,f.0,f.1,f.2\n1,1,inf,3\n", "file.columns.f.1"),
])
def test_bad_functional_cells(csv: bytes, field: str) -> None:
    with pytest.raises(IngestError) as info:
        parse_csv(csv, parse_metadata(_functional_meta()), max_rows=10)
    assert info.value.field == field


def test_prior_only_on_continuous_columns() -> None:
    meta = {"name": "p", "budgets": {}, "columns": {
        "x": {"type": "continuous", "bounds": [0, 1],
              "prior": {"family": "beta", "a": 2, "b": 3}}}}
    assert parse_metadata(meta).columns["x"].prior == {"family": "beta", "a": 2, "b": 3}
    for bad, field in [({"a": 1}, "metadata.columns.x.prior.family"),
                       ({"family": "beta", "a": "2"}, "metadata.columns.x.prior.a")]:
        meta["columns"]["x"]["prior"] = bad  # type: ignore[index]
        with pytest.raises(IngestError) as info:
            parse_metadata(meta)
        assert info.value.field == field
    with pytest.raises(IngestError) as info:
        parse_metadata({"name": "p", "budgets": {}, "columns": {
            "k": {"type": "integer", "bounds": [0, 1], "prior": {"family": "x"}}}})
    assert info.value.field == "metadata.columns.k.prior"


# --------------------------------------------------------------------------- streaming


def _rows(n: int) -> list[list[str]]:
    return [[str(17 + i % 70), "ABC"[i % 3], f"{i}.25"] for i in range(n)]


@pytest.mark.parametrize("source", ["file", "spooled-memory", "spooled-disk"])
def test_iter_csv_reads_a_binary_file_chunk_by_chunk(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, source: str
) -> None:
    """The upload hands over werkzeug's spooled file; it is read, never closed."""
    monkeypatch.setattr(ingest, "CHUNK_ROWS", 3)
    data = b"\xef\xbb\xbf" + to_csv(HEADER, _rows(7)).replace(b"\n", b"\r\n")
    fh: Any
    if source == "file":
        (tmp_path / "d.csv").write_bytes(data)
        fh = open(tmp_path / "d.csv", "rb")  # noqa: SIM115
    else:
        size = 10**6 if source == "spooled-memory" else 8
        fh = tempfile.SpooledTemporaryFile(max_size=size)  # noqa: SIM115
        fh.write(data)
        fh.seek(0)
    with fh:
        chunks = list(iter_csv(fh, spec_of(), max_rows=7))
        assert not fh.closed and fh.read() == b""  # left open, read to the end
    assert [len(c["age"]) for c in chunks] == [3, 3, 1]
    assert all(list(c) == HEADER for c in chunks)
    n, whole = parse_csv(data, spec_of(), max_rows=7)
    assert n == 7
    for col in HEADER:
        np.testing.assert_array_equal(np.concatenate([c[col] for c in chunks]), whole[col])
        assert chunks[0][col].dtype == whole[col].dtype


def test_iter_csv_fails_in_a_later_chunk_after_yielding_earlier_ones(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller must be able to drop what it stored: the error comes mid-stream."""
    monkeypatch.setattr(ingest, "CHUNK_ROWS", 2)
    rows = _rows(7)
    rows[5][2] = SECRET_NUM + "x"
    fh = io.BytesIO(to_csv(HEADER, rows))
    chunks = iter_csv(fh, spec_of(), max_rows=10)
    assert len(next(chunks)["age"]) == 2 and len(next(chunks)["age"]) == 2
    with pytest.raises(IngestError) as info:
        next(chunks)
    assert (info.value.field, info.value.line) == ("file.columns.wage", 7)
    assert SECRET_NUM not in info.value.message
    assert not fh.closed


def test_iter_csv_functional_column_chunks_are_matrices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "CHUNK_ROWS", 2)
    spec = parse_metadata(_functional_meta())
    csv_bytes = b"f.2,id,f.0,f.1\n3,1,1,2\n6,2,4,5\n9,3,7,8\n"
    chunks = list(iter_csv(io.BytesIO(csv_bytes), spec, max_rows=10))
    assert [c["f"].shape for c in chunks] == [(2, 3), (1, 3)]
    assert np.concatenate([c["f"] for c in chunks]).tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def _traced_peak(run: Any) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_streamed_parse_memory_does_not_grow_with_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Consuming iter_csv chunk by chunk from a file holds one chunk, whatever the rows.

    tracemalloc sees Python objects and numpy buffers alike; the in-memory
    parse of the larger file is the control that shows the measure can fail.
    """
    monkeypatch.setattr(ingest, "CHUNK_ROWS", 1024)
    # Arrow reads blocks, up to 32 ahead: both files must span many more than that, or
    # the read-ahead holds the whole file
    monkeypatch.setattr(ingest, "BLOCK_SIZE", 1024)
    paths = {}
    for n in (8_000, 32_000):
        paths[n] = tmp_path / f"{n}.csv"
        paths[n].write_bytes(to_csv(HEADER, _rows(n)))

    def stream(n: int) -> None:
        with open(paths[n], "rb") as fh:
            rows = sum(len(chunk["age"]) for chunk in iter_csv(fh, spec_of(), max_rows=n))
        assert rows == n

    def whole(n: int) -> None:
        with open(paths[n], "rb") as fh:
            assert parse_csv(fh, spec_of(), max_rows=n)[0] == n

    small, large = _traced_peak(lambda: stream(8_000)), _traced_peak(lambda: stream(32_000))
    in_memory = _traced_peak(lambda: whole(32_000))
    assert large < 1.25 * small, (small, large)
    assert in_memory > 2 * large, (large, in_memory)


def test_wide_rows_make_smaller_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks are bounded in cells as well as rows, so a 2,000-point functional column
    (now uploadable, issue 16 item 3) does not make a chunk 30x bigger; the parse is the
    same whatever the chunking. (Now read from ``iter_csv``'s chunks: the hand-written
    record reader this test spied on is gone.)"""
    monkeypatch.setattr(ingest, "CHUNK_CELLS", 7)  # 3 columns: 2 rows a chunk
    spec = parse_metadata(metadata(columns={
        "age": {"type": "integer", "bounds": [17, 90]},
        "race": {"type": "categorical", "categories": ["A", "B", "C"]},
        "wage": {"type": "continuous", "bounds": [0, 200000]},
    }))
    rows = [[str(17 + i), "ABC"[i % 3], f"{i}.5"] for i in range(5)]
    sizes = [len(c["age"]) for c in iter_csv(to_csv(HEADER, rows), spec, max_rows=5)]
    n, cols = parse_csv(to_csv(HEADER, rows), spec, max_rows=5)
    assert n == 5 and sizes == [2, 2, 1]
    assert cols["wage"].tolist() == [i + 0.5 for i in range(5)]


# --------------------------------------------------------------- Arrow's parsers vs Python's

_NUMBER_TEXT = st.text(alphabet="0123456789.eE+-_xXinfatyINFATY() \t\u00a0\u0663", max_size=7)


def _chain(err: BaseException) -> list[BaseException]:
    """The error and every error it chains to (cause or context)."""
    out: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(_NUMBER_TEXT, min_size=1, max_size=12))
def test_vectorised_numbers_agree_with_python(cells: list[str]) -> None:
    """Arrow converts a chunk only where it agrees with float()/int(): it also reads
    "0x10" and "nan(1)", which Python's rules refuse; a divergence shows up here."""
    text = pa.array(cells, pa.string())
    got = ingest._text_floats(text)
    want = ingest._python_numbers(cells, float, float, np.float64)
    assert got[2] == want[2]
    read = len(cells) if want[2] is None else want[2]
    got_missing = np.zeros(len(cells), bool) if got[1] is None else got[1]
    want_missing = ~np.isfinite(want[0]) | (False if want[1] is None else want[1])
    np.testing.assert_array_equal(got_missing[:read], want_missing[:read])
    present = ~want_missing[:read]
    np.testing.assert_array_equal(got[0][:read][present], want[0][:read][present])
    got_i = ingest._text_ints(text, -(10**6), 10**6)
    want_i = ingest._python_numbers(
        cells, int, lambda c: max(-(10**6) - 1, min(10**6 + 1, ingest._to_int(c))), np.int64)
    assert got_i[2] == want_i[2]
    read = len(cells) if want_i[2] is None else want_i[2]
    wanted = np.zeros(len(cells), bool) if want_i[1] is None else want_i[1]
    gotten = np.zeros(len(cells), bool) if got_i[1] is None else got_i[1]
    np.testing.assert_array_equal(gotten[:read], wanted[:read])
    keep = ~wanted[:read]
    np.testing.assert_array_equal(np.clip(got_i[0][:read][keep], -(10**6) - 1, 10**6 + 1),
                                  want_i[0][:read][keep])


@pytest.mark.parametrize(("cell", "message"), [
    ("nan(1)", "not a number"), ("0x10", "not an integer"), ("1_000.5", "not an integer")])
def test_spellings_arrow_reads_but_python_does_not_are_refused(cell: str, message: str) -> None:
    column = "wage" if message == "not a number" else "age"
    row = {"age": "20", "race": "A", "wage": "1"}
    row[column] = cell
    err = ingest_error(to_csv(HEADER, [GOOD[0], [row[c] for c in HEADER]]))
    assert (err.field, err.line) == (f"file.columns.{column}", 3)
    assert message in err.message


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_hexadecimal_found_in_any_chunk_slice(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Chunks are slices of one Arrow batch: the scan for "0x" covers exactly the slice's
    cells, the last one included (an off-by-one there would let 16 through)."""
    monkeypatch.setattr(ingest, "CHUNK_ROWS", chunk)
    spec = parse_metadata(metadata(columns={"age": {"type": "integer", "bounds": [0, 90]}}))
    err = ingest_error(to_csv(["age"], [["1"], ["2"], ["3"], ["0x10"]]), spec)
    assert (err.field, err.line) == ("file.columns.age", 5)
    assert parse_csv(to_csv(["age"], [["1"], ["2"], ["3"], ["10"]]), spec,
                     max_rows=9)[1]["age"].tolist() == [1, 2, 3, 10]


def test_python_spellings_arrow_refuses_are_read() -> None:
    """The per-cell path keeps what int()/float() accept beyond Arrow's syntax."""
    spec = parse_metadata(metadata(columns={
        "age": {"type": "integer", "bounds": [0, 5000]},
        "wage": {"type": "continuous", "bounds": [0, 5000]}}))
    data = to_csv(["age", "wage"], [["1_000", "1_0.5"], ["\u0663", " \u00a02.5\u00a0"],
                                    ["+7", "+7"]])
    assert parse_csv(data, spec, max_rows=10)[1] == {"age": pytest.approx([1000, 3, 7]),
                                                     "wage": pytest.approx([10.5, 2.5, 7])}


def test_non_finite_cells_are_missing_on_pythons_path_too() -> None:
    """A chunk that Arrow cannot convert (an Arabic-Indic digit) goes to Python's path;
    its "INF" is still a missing value, filled, not a value outside the bounds."""
    spec = parse_metadata(metadata(columns={
        "wage": {"type": "continuous", "bounds": [0, 100], "allow_missing": True, "fill": 50}}))
    data = to_csv(["wage"], [["\u0663"], ["INF"], ["-1e999"], ["7"]])
    assert parse_csv(data, spec, max_rows=10)[1]["wage"].tolist() == [3.0, 50.0, 50.0, 7.0]


@pytest.mark.parametrize("data", [
    to_csv(HEADER, [GOOD[0], ["17", "A", "0x" + SECRET_NUM]]),
    to_csv(HEADER, [GOOD[0], ["17", "A", SECRET_STR]]),
    to_csv(HEADER, [GOOD[0], ["17", "A", "1", SECRET_NUM]]),
    b"age,race,wage\n17,A,1\n17,B," + SECRET_NUM.encode() + b"\xff\n",
    b"age,race,wage\n17,A,1\n17,\"B" + SECRET_STR.encode() + b",1\n",
    b"age,race,wage\n17,A,1\n17,B," + SECRET_NUM.encode() * 40_000 + b"\n",
])
def test_no_error_in_the_chain_quotes_a_cell(data: bytes) -> None:
    """pyarrow's messages quote the cell ("invalid value '987654321'"); the report is
    built without them and no chained error (cause or context) keeps one, so a logged
    traceback cannot show it either."""
    err = ingest_error(data)
    for linked in _chain(err):
        assert SECRET_NUM not in str(linked) and SECRET_STR not in str(linked)


@pytest.mark.parametrize(("tail", "line"), [(b'33,A,"1', 4), (b'33,"A\n', 4),
                                            (b'33,A,"1\n\n', 5)])
def test_a_file_cut_inside_a_quoted_field_is_refused(tail: bytes, line: int) -> None:
    """Arrow closes a quote left open at the end of the file; the quote count catches it,
    so a truncated upload is not registered as data (issue: it was, with "A")."""
    err = ingest_error(to_csv(HEADER, GOOD) + tail)  # Python's csv: the line it ended on
    assert (err.field, err.line) == (f"file.line {line}", line)
    assert "not closed" in err.message


def test_an_odd_number_of_literal_quotes_is_read() -> None:
    """A quote inside an unquoted field is text (Python's csv reads it so): an odd count
    sends the file through the strict re-read, which finds nothing wrong."""
    spec = parse_metadata(metadata(columns={
        "size": {"type": "categorical", "categories": ['5"', '6"']},
        "n": {"type": "integer", "bounds": [0, 9]}}))
    n, cols = parse_csv(b'size,n\n5",1\n"6""",2\n', spec, max_rows=10)
    assert n == 2 and cols["size"].tolist() == [0, 1]


def test_a_record_longer_than_a_block_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrow refuses a record spanning more than two blocks; one within a block is read."""
    monkeypatch.setattr(ingest, "BLOCK_SIZE", 4096)
    spec = parse_metadata(metadata(columns={"a": {"type": "continuous", "bounds": [0, 1]},
                                            "b": {"type": "continuous", "bounds": [0, 1]}}))
    err = ingest_error(b"a,b\n0,1\n" + b"0," + b"0" * 9000 + b"1\n", spec)
    assert err.field == "file" and "malformed CSV" in err.message
    assert parse_csv(b"a,b\n0,1\n0," + b"0" * 3000 + b"1\n", spec, max_rows=5)[0] == 2


def test_an_unseekable_stream_is_spooled() -> None:
    class Pipe(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            chunk = self._data.read(len(buffer))
            buffer[:len(chunk)] = chunk
            return len(chunk)

    rows = [GOOD[0], ["17", "B", "x"]]
    n, cols = parse_csv(Pipe(to_csv(HEADER, GOOD)), spec_of(), max_rows=10)  # type: ignore[arg-type]
    assert n == 2 and cols["race"].tolist() == [0, 2]
    with pytest.raises(IngestError) as info:
        parse_csv(Pipe(to_csv(HEADER, rows)), spec_of(), max_rows=10)  # type: ignore[arg-type]
    assert (info.value.field, info.value.line) == ("file.columns.wage", 3)


# --------------------------------------------------------------------------- Parquet


def parquet_bytes(columns: dict[str, Any], **kwargs: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink, **kwargs)
    return sink.getvalue()


def parquet_error(data: bytes, spec: DatasetSpec | None = None, **kw: Any) -> IngestError:
    with pytest.raises(IngestError) as info:
        list(iter_upload(data, spec or spec_of(), max_rows=kw.pop("max_rows", 1000), **kw))
    return info.value


def test_parquet_matches_the_same_table_as_csv() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    age, race, wage = rng.integers(17, 91, n), rng.integers(0, 3, n), rng.uniform(0, 2e5, n)
    labels = np.array(["A", "B", "C"])[race]
    data = parquet_bytes({"wage": wage, "race": labels, "age": age}, row_group_size=777)
    assert ingest.is_parquet(io.BytesIO(data))
    got_n, cols = ingest.parse_parquet(data, spec_of(), max_rows=n)
    csv_n, from_csv = parse(to_csv(HEADER, [[str(a), r, repr(w)] for a, r, w in zip(
        age.tolist(), labels.tolist(), wage.tolist(), strict=True)]), max_rows=n)
    assert got_n == csv_n == n and list(cols) == HEADER
    for col in HEADER:
        np.testing.assert_array_equal(cols[col], from_csv[col])
        assert cols[col].dtype == from_csv[col].dtype
    chunks = list(iter_upload(io.BytesIO(data), spec_of(), max_rows=n))
    assert sum(len(c["age"]) for c in chunks) == n


def test_parquet_types_nulls_and_fill() -> None:
    """A nullable integer column written as floats (pandas) is integral; nulls are missing;
    dictionary and integer-typed categories and narrow integer types are read."""
    spec = parse_metadata(metadata(columns={
        "age": {"type": "integer", "bounds": [17, 90], "allow_missing": True, "fill": 30},
        "race": {"type": "categorical", "categories": ["A", "B", "1"], "allow_missing": True,
                 "fill": "B"},
        "wage": {"type": "continuous", "bounds": [0, 100], "allow_missing": True, "fill": 5},
        "kids": {"type": "integer", "bounds": [0, 9]},
        "code": {"type": "categorical", "categories": ["7", "8"]},
    }))
    data = parquet_bytes({
        "age": pa.array([17.0, None, 90.0, float("nan")], pa.float64()),
        "race": pa.array(["A", None, "NA", "1"]).dictionary_encode(),
        "wage": pa.array([1, None, 3, 100], pa.int16()),
        "kids": pa.array([0, 1, 2, 9], pa.uint8()),
        "code": pa.array([7, 8, 8, 7], pa.int32()),
    })
    n, cols = ingest.parse_parquet(data, spec, max_rows=10)
    assert n == 4
    assert cols["age"].tolist() == [17, 30, 90, 30] and cols["age"].dtype == np.int64
    assert cols["race"].tolist() == [0, 1, 1, 2]
    assert cols["wage"].tolist() == [1.0, 5.0, 3.0, 100.0]
    assert cols["kids"].tolist() == [0, 1, 2, 9] and cols["code"].tolist() == [0, 1, 1, 0]


def test_parquet_functional_column_and_clip() -> None:
    spec = parse_metadata({**_functional_meta(), "bounds_policy": "clip"})
    data = parquet_bytes({"f.0": [1.0, 4.0], "f.1": [2.0, 5.0], "f.2": [3.0, 6.0],
                          "id": pa.array([1, 2**63 + 5], pa.uint64())})
    n, cols = ingest.parse_parquet(data, spec, max_rows=10)
    assert n == 2 and cols["f"].tolist() == [[1, 2, 3], [4, 5, 6]] and cols["id"].tolist() == [1, 9]


BAD_PARQUET: list[tuple[str, dict[str, Any], str, str]] = [
    ("fractional integer", {"age": [17.0, float(SECRET_NUM) + 0.5], "race": ["A", "B"],
                            "wage": [1.0, 2.0]}, "file.columns.age", "row 2: not an integer"),
    ("integer out of bounds", {"age": [17, int(SECRET_NUM)], "race": ["A", "B"],
                               "wage": [1.0, 2.0]}, "file.columns.age", "row 2: value outside"),
    ("uint64 beyond int64", {"age": pa.array([17, 2**64 - 1], pa.uint64()), "race": ["A", "B"],
                             "wage": [1.0, 2.0]}, "file.columns.age", "row 2: value outside"),
    ("null without allow_missing", {"age": [17, None], "race": ["A", "B"], "wage": [1.0, 2.0]},
     "file.columns.age", "row 2: missing"),
    ("unknown category", {"age": [17, 18], "race": ["A", SECRET_STR], "wage": [1.0, 2.0]},
     "file.columns.race", "row 2: value is not one"),
    ("null category", {"age": [17, 18], "race": ["A", None], "wage": [1.0, 2.0]},
     "file.columns.race", "row 2: missing value"),
    ("nan continuous", {"age": [17, 18], "race": ["A", "B"], "wage": [1.0, float("nan")]},
     "file.columns.wage", "row 2: missing"),
    ("continuous text", {"age": [17, 18], "race": ["A", "B"], "wage": ["1", SECRET_STR]},
     "file.columns.wage", "row 2: not a number"),
    ("boolean for a number", {"age": [17, 18], "race": ["A", "B"], "wage": [True, False]},
     "file.columns.wage", "has type bool"),
    ("float category", {"age": [17, 18], "race": [1.5, 2.5], "wage": [1.0, 2.0]},
     "file.columns.race", "has type double"),
    ("missing column", {"age": [17], "race": ["A"]}, "file.columns.wage", "missing from"),
    ("undeclared column", {"age": [17], "race": ["A"], "wage": [1.0], "x": [1]},
     "file.columns.x", "not declared"),
    ("no rows", {"age": pa.array([], pa.int64()), "race": pa.array([], pa.string()),
                 "wage": pa.array([], pa.float64())}, "file", "no data rows"),
]


@pytest.mark.parametrize(("columns", "field", "words"),
                         [case[1:] for case in BAD_PARQUET], ids=[c[0] for c in BAD_PARQUET])
def test_bad_parquet_names_field_and_row_without_values(
        columns: dict[str, Any], field: str, words: str) -> None:
    err = parquet_error(parquet_bytes(columns))
    assert err.field == field and words in err.message, err.message
    for linked in _chain(err):
        assert SECRET_NUM not in str(linked) and SECRET_STR not in str(linked)


def test_parquet_rows_counted_before_reading_and_damage_reported_plainly() -> None:
    data = parquet_bytes({"age": [17] * 6, "race": ["A"] * 6, "wage": [1.0] * 6})
    assert parquet_error(data, max_rows=5).message == "more than 5 data rows"
    secret = parquet_bytes({"age": [17] * 50, "race": [SECRET_STR] * 50, "wage": [1.0] * 50},
                           compression="none")
    broken = secret[:4] + b"\0" * 200 + secret[204:]  # pages damaged, footer intact
    err = parquet_error(broken)
    assert err.field == "file" and "Parquet" in err.message
    for linked in _chain(err):
        assert SECRET_STR not in str(linked)
    truncated = b"PAR1" + SECRET_STR.encode() * 10 + b"PAR1"
    err = parquet_error(truncated)
    assert (err.field, err.message) == ("file", "not a readable Parquet file")


def test_declared_parquet_that_is_not_parquet_is_refused() -> None:
    data = to_csv(HEADER, GOOD)
    err = parquet_error(data, content_type="application/vnd.apache.parquet")
    assert err.field == "file" and "not a Parquet file" in err.message
    assert len(list(iter_upload(data, spec_of(), max_rows=10, content_type="text/csv"))) == 1
    assert not ingest.is_parquet(io.BytesIO(b"PAR1"))


#: test_parquet_memory_does_not_grow_with_the_file's proxy pools, kept for the session: a
#: buffer they allocated can outlive the test in a reference cycle, and freeing it through a
#: destroyed pool corrupts the heap (later tests segfaulted)
_PROXY_POOLS: list[Any] = []


def test_parquet_memory_does_not_grow_with_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Batches of CHUNK_ROWS rows are read from row groups through a bounded buffer: the
    Arrow allocations (a fresh pool's peak) stay flat when the file grows 4x, while
    reading the whole table (the control) grows with it."""
    monkeypatch.setattr(ingest, "CHUNK_ROWS", 1024)
    peaks = {}
    for n in (20_000, 80_000):
        path = tmp_path / f"{n}.parquet"
        pq.write_table(pa.table({"age": np.arange(n) % 70 + 17, "race": ["A", "B"] * (n // 2),
                                 "wage": np.arange(n) * 0.5}), path, row_group_size=4096)
        pool = pa.proxy_memory_pool(pa.default_memory_pool())
        _PROXY_POOLS.append(pool)
        previous = pa.default_memory_pool()
        pa.set_memory_pool(pool)
        try:
            with open(path, "rb") as fh:
                assert sum(len(c["age"]) for c in iter_upload(fh, spec_of(), max_rows=n)) == n
            peaks[n] = pool.max_memory()
            control = pa.proxy_memory_pool(previous)
            _PROXY_POOLS.append(control)
            pa.set_memory_pool(control)
            whole = pq.read_table(path)
            peaks[-n] = control.max_memory()
            del whole
        finally:
            pa.set_memory_pool(previous)
    assert peaks[80_000] < 1.25 * peaks[20_000], peaks
    assert peaks[-80_000] > 2 * peaks[80_000], peaks


def _arrow_peak(read: Any) -> int:
    """The Arrow allocations' peak (a fresh proxy pool's) while ``read()`` runs."""
    previous = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(previous)
    _PROXY_POOLS.append(pool)
    pa.set_memory_pool(pool)
    try:
        read()
    finally:
        pa.set_memory_pool(previous)
    return int(pool.max_memory())


@pytest.mark.parametrize("dictionary", [True, False], ids=["dictionary", "plain"])
def test_a_decompression_bomb_is_refused_before_its_pages_are_read(dictionary: bool) -> None:
    """A few KiB of Parquet holding one 1 MiB text value repeated 600 times made an upload
    allocate about 600 MiB (+1.5 GiB in Arrow's pool) before it refused the category: the
    footer's uncompressed sizes are checked against the rows of the declared type first,
    so nothing is decompressed."""
    data = parquet_bytes({"age": [17] * 600, "race": ["A" * (1 << 20)] * 600,
                          "wage": [1.0] * 600}, compression="zstd", use_dictionary=dictionary)
    assert len(data) < 64 << 10  # the attack is small
    errors: list[IngestError] = []

    def read() -> None:
        errors.append(parquet_error(data))

    assert _arrow_peak(read) < 1 << 20
    assert errors[0].field == "file.columns.race"
    assert "larger uncompressed than its 600 rows of the declared type" in errors[0].message


def test_text_columns_are_read_as_dictionaries_and_long_numbers_refused() -> None:
    """Under the size bound a text column may still repeat one long value: it is read as a
    dictionary (each distinct value once), so a category is coded without expanding it,
    and a number written longer than TEXT_NUMBER_BYTES is refused before decoding."""
    n = 5000
    wide = parquet_bytes({"age": [17] * n, "race": ["A"] * n,
                          "wage": ["1" + "0" * 300] * n}, compression="zstd")
    err = parquet_error(wide, max_rows=n)
    assert err.field == "file.columns.wage" and "longer than 256 bytes" in err.message
    fine = parquet_bytes({"age": [17] * n, "race": ["B"] * n, "wage": ["12.5"] * n})
    got, cols = ingest.parse_parquet(fine, spec_of(), max_rows=n)
    assert got == n and set(cols["race"].tolist()) == {1} and set(cols["wage"]) == {12.5}
    # a long declared category is within the bound
    long = "x" * 5000
    spec = spec_of(columns={**BASE["columns"], "race": {"type": "categorical",
                                                        "categories": [long, "B"]}})
    got, cols = ingest.parse_parquet(parquet_bytes({"age": [17] * n, "race": [long] * n,
                                                    "wage": [1.0] * n}), spec, max_rows=n)
    assert got == n and set(cols["race"].tolist()) == {0}


def test_a_nested_column_is_refused_before_reading() -> None:
    data = parquet_bytes({"age": [17, 18], "race": ["A", "B"],
                          "wage": pa.array([[1.0], [2.0]], pa.list_(pa.float64()))})
    err = parquet_error(data)
    assert err.field == "file.columns.wage" and "flat" in err.message


def test_a_parquet_file_cut_short_is_named_so() -> None:
    """Its end (the footer) gone, a Parquet file no longer ends with PAR1: it was read as
    CSV and answered "not valid UTF-8"; it is now named for what it is. A CSV whose header
    begins with PAR1 is still a CSV."""
    whole = parquet_bytes({"age": [17] * 50, "race": [SECRET_STR] * 50, "wage": [1.0] * 50})
    for cut in (len(whole) - 1, len(whole) // 2, 100):
        err = parquet_error(whole[:cut])
        assert err.field == "file" and "end is missing" in err.message, err.message
        assert SECRET_STR not in err.message
    spec = spec_of(columns={"PAR1x": {"type": "integer", "bounds": [0, 9]}})
    chunks = list(iter_upload(b"PAR1x\n1\n2\n", spec, max_rows=10))
    assert chunks[0]["PAR1x"].tolist() == [1, 2]
