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
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mechanisms.base import ColumnMeta
from service import ingest
from service.ingest import DatasetSpec, IngestError, iter_csv, parse_csv, parse_metadata

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
