"""``GET /v1/datasets/{id}/ledger`` a page at a time, and its JSON Lines export streamed.

A dataset's events are replaced by 2,500 events (several per millisecond, in 2001):
rows of ``events`` (their ids numbers, ``at`` the event's time). The events as written,
kept here, are the reference: each answer is compared with what the old unpaged view
rendered from them (``_render``, written out here, not the service's code).
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import re
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from html import unescape
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from flask import Flask, Response, g
from psycopg_pool import ConnectionPool

from service import apikeys, budget, wiring
from service.api import datasets as datasets_api
from service.storage import database
from service.storage.ledger import READ_BATCH
from service.storage.pg_ledger import PgLedger
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

N = 2500
KINDS = ("cap", "reserve", "commit", "reserve", "abort", "allocation", "commit")
START_MS = 978_307_200_000


def _render(event_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """An event as the unpaged view rendered it (the reference, kept apart from the code)."""
    doc: dict[str, Any] = {"id": event_id}
    units = {k[2:]: int(v) for k, v in fields.items() if k.startswith("m:")}
    doc.update({k: (int(v) if k == "version" else v) for k, v in fields.items()
                if not k.startswith("m:")})
    doc["units"] = units
    doc["amounts"] = {m: budget.display(m, u) for m, u in units.items()}
    return doc


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class Rig:
    """A dataset whose ledger holds ``N`` events, and those events as written."""

    def __init__(self, api: Api, app: Flask) -> None:
        resp = api.upload(people_csv(20), PEOPLE_META)
        assert resp.status_code == 201, resp.get_json()
        self.api, self.ds = api, resp.get_json()["id"]
        self.ledger = wiring.of(app).ledger
        self.url = f"/v1/datasets/{self.ds}/ledger"
        written: list[tuple[int, dict[str, str]]] = []  # (ms, fields)
        ms, seq = START_MS, 0
        for i in range(N):
            ms, seq = (ms + 1, 0) if i % 3 == 0 else (ms, seq + 1)
            fields = {"kind": KINDS[i % len(KINDS)], "release_id": f"rel_{i:024x}",
                      "actor": "op", "at": _iso(ms), "m:epsilon": str(1000 * i)}
            if i % 5 == 0:
                fields["version"] = "1"
            written.append((ms, fields))
        assert isinstance(self.ledger, PgLedger)
        ids = _pg_replace_events(self.ledger, self.ds, written)
        #: (id, fields, ms) of every event, oldest first: the reference
        self.events = [(i, f, ms) for i, (ms, f) in zip(ids, written, strict=True)]
        self.ids = [i for i, _, _ in self.events]

    def expected(self, since: int | None = None, until: int | None = None,
                 kinds: set[str] | None = None) -> list[dict[str, Any]]:
        """The events at or after ``START_MS + since`` and at or before ``START_MS +
        until`` (milliseconds), of ``kinds``, as the unpaged view rendered them."""
        return [_render(i, f) for i, f, ms in self.events
                if (since is None or ms >= START_MS + since)
                and (until is None or ms <= START_MS + until)
                and (not kinds or f["kind"] in kinds)]

    def pages(self, query: str) -> list[tuple[list[dict[str, Any]], str | None]]:
        """Every page of ``query`` (its events and the cursor it sent), following Link."""
        out: list[tuple[list[dict[str, Any]], str | None]] = []
        url = f"{self.url}?{query}"
        while True:
            resp = self.api.get(url)
            assert resp.status_code == 200, resp.get_json()
            cursor = resp.headers.get("X-Next-Cursor")
            out.append((resp.get_json(), cursor))
            if cursor is None:
                assert "Link" not in resp.headers
                return out
            link = resp.headers["Link"]
            assert link.endswith('>; rel="next"')
            target = urlsplit(link[1:link.index(">")])
            assert parse_qs(target.query)["cursor"] == [cursor]
            assert {k: v for k, v in parse_qs(target.query).items() if k != "cursor"} == {
                k: v for k, v in parse_qs(query).items()}
            url = f"{target.path}?{target.query}"
            assert len(out) < 20, "the pages never end"


def _iso(ms: int) -> str:
    return _at(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pg_replace_events(ledger: PgLedger, ds: str,
                       written: list[tuple[int, dict[str, str]]]) -> list[str]:
    """The dataset's ``events`` rows replaced by ``written`` (ids drawn from the table's
    sequence, in order; ``at`` each event's time): their ids."""
    _pg_drop_events(ledger, ds)
    with ledger.pool.connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT nextval(pg_get_serial_sequence('events', 'id')) "
                    "FROM generate_series(1, %s)", (len(written),))
        ids = sorted(int(row[0]) for row in cur.fetchall())
        with cur.copy("COPY events (id, dataset_id, kind, release_id, actor, at, units, "
                      "detail) FROM STDIN") as copy:
            for event_id, (ms, f) in zip(ids, written, strict=True):
                units = {k[2:]: int(v) for k, v in f.items() if k.startswith("m:")}
                detail = {"version": int(f["version"])} if "version" in f else {}
                copy.write_row((event_id, ds, f["kind"], f["release_id"], f["actor"], _at(ms),
                                json.dumps(units), json.dumps(detail)))
    return [str(i) for i in ids]


def _pg_drop_events(ledger: PgLedger, ds: str) -> None:
    """Delete the dataset's ``events`` rows, append-only as they are (their trigger is off
    for this transaction's session only: ``session_replication_role``)."""
    with ledger.pool.connection() as conn, conn.cursor() as cur:
        cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute("DELETE FROM events WHERE dataset_id = %s", (ds,))


@pytest.fixture(scope="module")
def rig(app: Flask) -> Iterator[Rig]:
    rig = Rig(Api(app.test_client()), app)
    yield rig
    # events dated 2001 among the session's: ``since`` / ``until`` of other modules'
    # ledgers map to event ids by time, so they go (the dataset stays, its ledger empty)
    assert isinstance(rig.ledger, PgLedger)
    _pg_drop_events(rig.ledger, rig.ds)


def _token(parts: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


def _cursor_id(token: str) -> str:
    member: str = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))[1]
    return member


def test_pages_of_1000_concatenate_to_the_unpaged_list(rig: Rig) -> None:
    """Catches a view that answers everything at once (no cursor after 1000), a page
    that repeats or skips an event at its edge, and a list
    that does not end: 2,500 events come as 1000 + 1000 + 500, oldest first, and the
    last page has no cursor (one more event is read to know)."""
    pages = rig.pages("limit=1000")
    assert [len(events) for events, _ in pages] == [1000, 1000, 500]
    assert [e for events, _ in pages for e in events] == rig.expected()
    assert [_cursor_id(c) for _, c in pages[:-1]] == [rig.ids[999], rig.ids[1999]]


@pytest.mark.parametrize("query,since,until,kinds", [
    ("kind=commit,abort&limit=700", None, None, {"commit", "abort"}),
    ("since=2001-01-01T00:00:00.300Z&until=2001-01-01T00:00:00.700Z&limit=150", 300, 700,
     None),
    ("since=2001-01-01T00:00:00.350Z&kind=cap&limit=1000", 350, None, {"cap"}),
])
def test_filtered_pages_concatenate_to_the_filtered_list(rig: Rig, query: str,
                                                        since: int | None, until: int | None,
                                                        kinds: set[str] | None) -> None:
    """Catches a cursor that loses the filters (the next page unfiltered, or restarting
    at ``since``), and a ``kind`` filter applied before the page's read count: each page
    reads ``limit`` events and keeps those that match, so pages may be short."""
    pages = rig.pages(query)
    assert [e for events, _ in pages for e in events] == rig.expected(since, until, kinds)
    limit = int(parse_qs(query)["limit"][0])
    assert len(pages) == -(-len(rig.expected(since, until)) // limit)


def test_a_filter_matching_nothing_reads_one_page(rig: Rig) -> None:
    """Catches a page bounded by events returned instead of read: ``kind=retire`` matches
    none of 2,500 events, yet the first page answers at once with no events and a cursor
    at the 1000th event read, and the walk ends after three such pages."""
    resp = rig.api.get(f"{rig.url}?kind=retire&limit=1000")
    assert resp.status_code == 200 and resp.get_json() == []
    assert _cursor_id(resp.headers["X-Next-Cursor"]) == rig.ids[999]
    assert [len(e) for e, _ in rig.pages("kind=retire&limit=1000")] == [0, 0, 0]


class CountingPool:
    """A real connection pool whose cursors count the rows each fetch returns
    (``counts``, one entry per fetch; ``returned``, their sum)."""

    def __init__(self, real: ConnectionPool[Any]) -> None:
        self.real, self.returned, self.counts = real, 0, []

    @contextlib.contextmanager
    def connection(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with self.real.connection(*args, **kwargs) as conn:
            yield _Counted(conn, self)

    def fetched(self, rows: int) -> None:
        self.counts.append(rows)
        self.returned += rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _Counted:
    """A connection (or cursor) whose cursors' fetches are counted by ``pool``."""

    def __init__(self, real: Any, pool: CountingPool) -> None:
        self.real, self.pool = real, pool

    @contextlib.contextmanager
    def cursor(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with self.real.cursor(*args, **kwargs) as cur:
            yield _Counted(cur, self.pool)

    def fetchone(self) -> Any:
        row = self.real.fetchone()
        self.pool.fetched(0 if row is None else 1)
        return row

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self.real.fetchall()
        self.pool.fetched(len(rows))
        return rows

    def fetchmany(self, size: int = 0) -> list[Any]:
        rows: list[Any] = self.real.fetchmany(size)
        self.pool.fetched(len(rows))
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_page_reads_at_most_limit_plus_one_rows(database_url: str) -> None:
    """The same on PostgreSQL (its own pool on the session's database, whichever store
    the session's service runs on): a filter-matching-nothing page of 10 from a
    dataset's 2,500 rows gets 11 rows back, not 2,500; the export reads them in batches
    of at most ``READ_BATCH`` rows (catches a query that fetches the whole range at once:
    an export of millions of events held in memory)."""
    pool = database.connect(database_url, max_size=2)
    ledger = PgLedger(pool)
    ds = "ds_" + secrets.token_hex(8)
    try:
        ids = _pg_replace_events(ledger, ds, [(START_MS + 5_000_000 + i, {
            "kind": KINDS[i % len(KINDS)], "release_id": "", "actor": "op"})
            for i in range(N)])
        counting = CountingPool(pool)
        ledger.pool = counting  # type: ignore[assignment]
        events, last = ledger.events_page(ds, "-", "+", {"retire"}, 10)
        assert events == [] and counting.returned == 11 and last == ids[9]
        counting.counts.clear()
        assert [e["id"] for e in ledger.iter_events(ds)] == ids
        assert len(counting.counts) > 1 and max(counting.counts) <= READ_BATCH
        counting.counts.clear()
        assert [e["id"] for e in ledger.iter_events(ds, f"({ids[10]}", ids[-3],
                                                    {"cap", "reserve"})] == [
            i for n, i in enumerate(ids) if 10 < n < N - 2 and KINDS[n % len(KINDS)] in {
                "cap", "reserve"}]
        assert len(counting.counts) > 1 and max(counting.counts) <= READ_BATCH
    finally:
        ledger.pool = pool
        _pg_drop_events(ledger, ds)
        pool.close()


def test_jsonl_export_is_streamed_and_byte_identical(rig: Rig) -> None:
    """Catches an export that changed bytes (order, key order, a missing event at a
    page's edge) or is built whole in memory: the body is a streamed response equal byte for
    byte to the reference lines and to the JSON pages' events, with and without a
    filter."""
    for query, kinds in (("", None), ("kind=reserve", {"reserve"})):
        resp = rig.api.client.get(f"{rig.url}?format=jsonl&{query}",
                                  headers=rig.api._h(), buffered=False)
        assert resp.status_code == 200
        assert resp.mimetype == "application/x-ndjson"
        body = resp.get_data()
        want = "".join(json.dumps(e, sort_keys=True) + "\n"
                       for e in rig.expected(kinds=kinds)).encode()
        assert body == want
        paged = [e for events, _ in rig.pages(f"{query}&limit=900".lstrip("&"))
                 for e in events]
        assert body == "".join(json.dumps(e, sort_keys=True) + "\n" for e in paged).encode()


def test_the_export_is_a_generator_not_a_built_body(rig: Rig, app: Flask) -> None:
    """Catches an export built whole in memory (a body of every line): the route, called
    as the console calls it, answers a streamed Response (an iterator, not a string)."""
    with app.test_request_context(rig.url):
        g.api_key = apikeys.lookup(wiring.of(app).keys, TOKEN)
        resp = inspect.unwrap(datasets_api.audit)(rig.ds, format="jsonl")
        assert isinstance(resp, Response) and resp.is_streamed
        first = next(iter(resp.response))
        assert json.loads(first)["id"] == rig.ids[0]


def test_a_cursor_resumes_the_export(rig: Rig) -> None:
    """The export after a cursor is the rest of the range (a resumed download)."""
    cursor = rig.api.get(f"{rig.url}?limit=1000").headers["X-Next-Cursor"]
    body = rig.api.get(f"{rig.url}?format=jsonl&cursor={cursor}").get_data()
    assert body == "".join(json.dumps(e, sort_keys=True) + "\n"
                           for e in rig.expected()[1000:]).encode()


@pytest.mark.parametrize("query,field", [
    ("limit=10001", "limit"), ("limit=0", "limit"), ("cursor=not-a-cursor!", "cursor"),
    # a cursor of another list (score, member, phase ""): valid base64 JSON, not ours
    ("cursor=" + _token([1.0, "rel_x", ""]), "cursor"),
    # a stream cursor whose id is no stream id
    ("cursor=" + _token([1.0, "1-x", "stream"]), "cursor"),
    # ids past 64 bits (a 500 if passed on to the database)
    ("cursor=" + _token([1.0, f"{2**64}-0", "stream"]), "cursor"),
    ("cursor=" + _token([1.0, f"1-{2**64 - 1}", "stream"]), "cursor"),
    # an event id past PostgreSQL's bigint (it would refuse it: a 500 if passed on); no
    # stream id either (no ``-``)
    ("cursor=" + _token([1.0, str(2**63), "stream"]), "cursor"),
])
def test_bad_paging_arguments_are_422_naming_the_field(rig: Rig, query: str,
                                                       field: str) -> None:
    """Catches a limit without bounds (one request reading everything) and a cursor
    that is not checked (a 500, or a read from a forged position)."""
    resp = rig.api.get(f"{rig.url}?{query}")
    assert resp.status_code == 422, resp.get_data()
    assert resp.get_json()["field"] == field


def test_console_audit_page_pages_with_its_filters(rig: Rig, app: Flask) -> None:
    """Catches a console page that renders the whole ledger (or the API's first page
    only, with no way on), and next/previous links that drop a repeated filter (two
    ``kind`` boxes ticked): the pages' rows, followed by their "next" links, are the
    filtered events in order, and "previous" goes back one page."""
    from service.console.views import AUDIT_PAGE
    from tests.integration.test_console import _signed_in

    client = _signed_in(app, TOKEN)
    url = f"/console/datasets/{rig.ds}/audit?kind=commit&kind=abort&format=json"
    seen: list[str] = []
    pages: list[str] = []
    while url:
        page = client.get(url)
        assert page.status_code == 200, page.get_data(as_text=True)[:500]
        html = page.get_data(as_text=True)
        pages.append(url)
        seen += re.findall(r">(rel_[0-9a-f]{24})</a>", html)
        nxt = re.search(r'href="([^"]+)" id="pager-next"', html)
        url = unescape(nxt.group(1)) if nxt else ""
        assert len(pages) <= N // AUDIT_PAGE + 1
    assert len(pages) == -(-N // AUDIT_PAGE)
    assert seen == [e["release_id"] for e in rig.expected(kinds={"commit", "abort"})]
    html = client.get(pages[2]).get_data(as_text=True)
    back = re.search(r'href="([^"]+)" id="pager-previous"', html)
    rows = re.compile(r">(rel_[0-9a-f]{24})</a>")
    assert back and rows.findall(client.get(unescape(back.group(1))).get_data(as_text=True)
                                 ) == rows.findall(client.get(pages[1]).get_data(as_text=True))
