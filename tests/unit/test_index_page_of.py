"""``index.page_of``: paging rows already in hand (a key's granted datasets) with the same
order and cursors as ``index.page`` over a sorted set."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st

from service.storage import index

_rows = st.lists(st.tuples(st.text("abcdef", min_size=1, max_size=3),
                           st.integers(0, 4).map(float)),
                 max_size=30, unique_by=lambda row: row[0])


@hypothesis.given(rows=_rows, limit=st.integers(1, 7), newest=st.booleans())
def test_following_the_cursors_yields_every_row_once_in_order(
        rows: list[tuple[str, float]], limit: int, newest: bool) -> None:
    expected = [m for m, _ in sorted(rows, key=lambda r: (r[1], r[0]), reverse=newest)]
    seen: list[str] = []
    after = None
    for _ in range(len(rows) + 2):
        ids, after = index.page_of(rows, limit, after, newest_first=newest)
        assert len(ids) <= limit
        seen += ids
        if after is None:
            break
        assert index.Cursor.decode(after.encode()) == after  # survives the round trip
    assert seen == expected


def test_an_empty_list_and_a_last_full_page_end_without_a_cursor() -> None:
    assert index.page_of([], 3) == ([], None)
    assert index.page_of([("a", 1.0), ("b", 2.0)], 2) == (["b", "a"], None)
    assert index.page_of([("a", 1.0), ("b", 2.0)], 1) == (["b"], index.Cursor(2.0, "b"))
