"""PgLedger keeps the whole ``service.storage.store.Store`` contract (issue #29): the release
fields, lists and history, the registry's reads and status, the hold-out counters, the
sweeper's steps and the audit log's bounds, against a real PostgreSQL (a fresh database
per test, copied from a migrated template). Nothing is mocked.
"""

from __future__ import annotations

import inspect
import json
import random
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from service import datasets
from service.errors import Invalid
from service.storage import database, index, pg_ledger
from service.storage.ledger import Reservation, now_iso
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentMissing, DocumentStore
from service.storage.store import BudgetWindow, ReleaseView, Store
from tests.integration.conftest import LEDGER_OUTPUT, LEDGER_REQUEST
from tests.integration.test_pg_ledger import (
    _create_db,
    _db_url,
    _doc,
    _drop_db,
    _lapse,
    _res,
    _sql,
)


@pytest.fixture(scope="module")
def pg_template(postgres_url: str) -> Iterator[str]:
    """A database migrated to head, the template every test's database is copied from."""
    name = _create_db(postgres_url)
    database.upgrade(_db_url(postgres_url, name))
    yield name
    _drop_db(postgres_url, name)


@pytest.fixture()
def pg_url(postgres_url: str, pg_template: str) -> Iterator[str]:
    name = _create_db(postgres_url, pg_template)
    yield _db_url(postgres_url, name)
    _drop_db(postgres_url, name)


@pytest.fixture()
def docs(tmp_path: Path) -> DocumentStore:
    return DocumentStore(tmp_path / "pg-documents")


@pytest.fixture()
def store(pg_url: str, docs: DocumentStore) -> Iterator[PgLedger]:
    pool = database.connect(pg_url, max_size=4)
    try:
        yield PgLedger(pool, documents=docs)
    finally:
        pool.close()


def _ds() -> str:
    return "ds_" + secrets.token_hex(6)


def _set(url: str, release_id: str, **columns: Any) -> None:
    """Set a release row's columns (times, status) as a test's scenario needs."""
    names = sorted(columns)
    sets = ", ".join(f"{n} = %s" for n in names)
    _sql(url, f"UPDATE releases SET {sets} WHERE id = %s RETURNING 1",
         *[columns[n] for n in names], release_id)


T0 = datetime(2026, 11, 28, 10, 0, 0, 123456, tzinfo=UTC)


# -- the contract ------------------------------------------------------------------------

def test_pg_ledger_has_every_method_of_the_store_with_its_signature() -> None:
    """Every method of ``Store`` is PgLedger's, with the same parameters (names, kinds,
    defaults); mypy checks the types (pg_ledger's ``_keeps_the_contract``)."""
    methods = [name for name, value in vars(Store).items()
               if inspect.isfunction(value) and not name.startswith("_")]
    assert len(methods) >= 45
    for name in methods:
        ours = getattr(PgLedger, name, None)
        assert callable(ours), name
        want = [(p.name, p.kind, p.default)
                for p in inspect.signature(getattr(Store, name)).parameters.values()]
        got = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()]
        assert got == want, name
    assert set(inspect.signature(PgLedger.__init__).parameters) == {
        "self", "pool", "lease_seconds", "documents"}


def _downgrade(url: str, revision: str) -> None:
    """Run the migrations on ``url`` down to ``revision`` (alembic, as ``upgrade``)."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    config = Config()
    config.set_main_option("script_location", database.migrations_path())
    engine = create_engine(database.sqlalchemy_url(url), poolclass=NullPool)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
    engine.dispose()


def test_the_migration_goes_down_and_up_again(postgres_url: str) -> None:
    """0003_releases downgrades to 0002 (its tables, columns and indexes gone, the
    releases kept) and upgrades again."""
    name = _create_db(postgres_url)
    url = _db_url(postgres_url, name)
    try:
        database.upgrade(url)
        pool = database.connect(url)
        ledger = PgLedger(pool)
        ds = _ds()
        ledger.open(ds, {"epsilon": 10}, "op")
        rid = ledger.reserve(_res(ds, {"epsilon": 1})).release_id
        pool.close()
        indexes = ("SELECT indexname FROM pg_indexes WHERE tablename LIKE 'release%%' "
                   "ORDER BY 1")
        assert [i for (i,) in _sql(url, indexes)] == [
            "release_failed_at", "release_failed_dataset", "release_failed_pkey",
            "release_pending_dataset", "release_pending_pkey", "release_pending_sweep",
            "release_ran_pkey", "release_runs_pkey", "releases_actor_newest",
            "releases_dataset_newest", "releases_newest", "releases_pkey",
            "releases_priced_seq"]
        _downgrade(url, "0002_datasets")
        assert _sql(url, "SELECT version_num FROM alembic_version") == [("0002_datasets",)]
        assert [i for (i,) in _sql(url, indexes)] == ["releases_dataset", "releases_pkey"]
        assert _sql(url, "SELECT to_regclass('holdouts')") == [(None,)]
        assert _sql(url, "SELECT id FROM releases") == [(rid,)]
        database.upgrade(url, "0003_releases")
        assert _sql(url, "SELECT version_num FROM alembic_version") == [("0003_releases",)]
        assert _sql(url, "SELECT collation_name FROM information_schema.columns WHERE "
                         "table_name = 'releases' AND column_name = 'id'") == [("C",)]
    finally:
        _drop_db(postgres_url, name)


def test_0006_counts_backfills_and_goes_down_and_up_again(postgres_url: str) -> None:
    """Upgraded over a registry that has datasets, 0006_counts counts them and indexes
    their shapes; it downgrades to 0005_keys (its table, column, functions and indexes
    gone, the datasets kept) and upgrades again."""
    name = _create_db(postgres_url)
    url = _db_url(postgres_url, name)
    try:
        database.upgrade(url, "0005_keys")
        pool = database.connect(url)
        ledger = PgLedger(pool)
        doc = {"status": "active", "n_rows": 3, "columns": {"a": {}}}
        for ds in ("ds_1", "ds_2"):
            ledger.open(ds, {"epsilon": 10}, "op", json.dumps({"id": ds, **doc}))
        pool.close()
        database.upgrade(url)
        pool = database.connect(url)
        ledger = PgLedger(pool)
        assert ledger.dataset_count() == 2
        assert [json.loads(d)["id"] for d in ledger.same_shape_documents(["a"], 3, "ds_1")] == [
            "ds_2"]
        pool.close()
        _downgrade(url, "0005_keys")
        assert _sql(url, "SELECT to_regclass('counts'), to_regclass('datasets_shapes'), "
                         "to_regclass('events_dataset_caps'), "
                         "to_regprocedure('dataset_shape(jsonb, jsonb)')") == [
            (None, None, None, None)]
        assert _sql(url, "SELECT id FROM datasets ORDER BY id") == [("ds_1",), ("ds_2",)]
        database.upgrade(url)
        assert _sql(url, "SELECT value FROM counts") == [(2,)]
    finally:
        _drop_db(postgres_url, name)


# -- a release's fields ------------------------------------------------------------------

#: every field a release may have (``service.storage.store``'s module docstring, and the
#: run's: ``worker``, ``attempts``, ``result``)
FIELDS = {"status", "request", "actor", "created_at", "started_at", "finished_at", "output",
          "error", "data_read", "charged", "table", "resent_at", "resends", "worker",
          "attempts", "result"}


def test_release_fields_through_a_life(store: PgLedger, pg_url: str) -> None:
    """``release`` gives the fields the ``Store`` contract names (the old Valkey hash's:
    its request and output read back from the document store), at every step of each
    life: reserved, started, read, committed (inline and as a run's file), failed,
    aborted, cancelled; pricing, priced, refused."""
    ds = _ds()
    store.open(ds, {"epsilon": 1000}, "op")

    def same(rid: str, at_step: str, *, timed: set[str] = frozenset()) -> dict[str, str]:
        got = store.release(rid)
        assert got is not None, at_step
        assert set(got) <= FIELDS and {"status", "request", "actor", "created_at"} <= set(
            got), (at_step, sorted(got))
        for key in {"created_at", *timed}:  # now_iso's form
            assert len(got[key]) == 24 and got[key].endswith("Z"), (at_step, key)
        return got

    def run(rid: str) -> Any:
        started = store.mark_running(rid, "w1")
        assert started is not None
        return started

    def reserve(i: int, **kw: Any) -> tuple[str, str]:
        at = now_iso()
        res = Reservation(ds, f"rel_{ds}_{i}", kw.pop("cost", {"epsilon": 10}), actor="alice",
                          fingerprint=f"{ds}-{i}", request_json=LEDGER_REQUEST, at=at, **kw)
        assert store.reserve(res).outcome in {"reserved", "pricing"}
        return res.release_id, at

    # committed inline, with its table
    rid, at = reserve(0)
    fields = same(rid, "reserved")
    assert (fields["created_at"], fields["status"], fields["actor"], fields["request"]) == (
        at, "queued", "alice", LEDGER_REQUEST)
    run_p = run(rid)
    fields = same(rid, "started", timed={"started_at"})
    assert (fields["status"], fields["worker"], fields["attempts"]) == ("running", "w1", "1")
    assert store.mark_data_read(run_p)
    assert same(rid, "read")["data_read"] == "1"
    assert store.commit(ds, run_p, LEDGER_OUTPUT, 1) == "settled"
    fields = same(rid, "committed", timed={"started_at", "finished_at"})
    assert (fields["status"], fields["output"], fields["table"], fields["charged"]) == (
        "succeeded", LEDGER_OUTPUT, "1", "1")
    assert "result" not in fields

    # committed as the run's file (the second run: the first one's lease lapsed)
    rid, _ = reserve(1)
    run(rid)
    _lapse(pg_url, rid)
    run_p = run(rid)
    assert run_p.attempt == 2
    assert store.documents is not None
    store.documents.save_result(rid, run_p.attempt, LEDGER_OUTPUT)
    assert store.commit(ds, run_p, LEDGER_OUTPUT, 2, result_stored=True) == "settled"
    fields = same(rid, "committed from a file")
    assert (fields["output"], fields["result"], fields["table"], fields["attempts"]) == (
        LEDGER_OUTPUT, "2", "2", "2")

    # failed after the read (charged), aborted before it (refunded), cancelled
    rid, _ = reserve(2)
    assert store.fail(ds, run(rid), '{"message": "x"}') == "settled"
    fields = same(rid, "failed")
    assert (fields["status"], fields["error"], fields["charged"]) == (
        "failed", '{"message": "x"}', "1")
    rid, _ = reserve(3)
    assert store.abort_run(ds, run(rid), '{"message": "y"}') == "settled"
    fields = same(rid, "aborted")
    assert "charged" not in fields and fields["status"] == "failed"
    rid, _ = reserve(4)
    assert store.cancel(ds, rid, "op") == "settled"
    assert same(rid, "cancelled", timed={"finished_at"})["status"] == "cancelled"

    # pricing, then priced (keeps its creation time), and a refused one
    rid, at = reserve(5, cost={}, mode="pricing", replay=False)
    assert same(rid, "pricing")["status"] == "pricing"
    priced = Reservation(ds, rid, {"epsilon": 5}, actor="alice", fingerprint=f"{ds}-p",
                         request_json=LEDGER_REQUEST.replace("laplace", "gaussian"),
                         mode="priced")
    assert store.reserve(priced).outcome == "reserved"
    fields = same(rid, "priced")
    assert (fields["request"], fields["created_at"], fields["status"]) == (
        priced.request_json, at, "queued")
    rid, _ = reserve(6, cost={}, mode="pricing", replay=False)
    assert store.refuse(ds, rid, '{"code": "z"}', "z", "pricer") is True
    fields = same(rid, "refused")
    assert (fields["status"], fields["error"]) == ("refused", '{"code": "z"}')
    assert store.release("rel_none") is None


def test_a_result_file_that_is_gone_reads_as_missing(store: PgLedger, pg_url: str,
                                                     docs: DocumentStore) -> None:
    """A release whose output is a run's file: read from the document store; the file
    gone (or no store) is ``DocumentMissing``, never fields without the output. The
    request stays in the row: ``kept_request`` is None."""
    ds = _ds()
    store.open(ds, {"epsilon": 100}, "op")
    rid = store.reserve(_res(ds, {"epsilon": 1})).release_id
    run = store.mark_running(rid, "w")
    assert run is not None
    docs.save_result(rid, run.attempt, LEDGER_OUTPUT)
    assert store.commit(ds, run, LEDGER_OUTPUT, result_stored=True) == "settled"
    assert _sql(pg_url, "SELECT output, result_attempt FROM releases WHERE id = %s", rid) == [
        (None, 1)]
    fields = store.release(rid)
    assert fields is not None and fields["output"] == LEDGER_OUTPUT
    assert fields["request"] == LEDGER_REQUEST
    assert store.kept_request(rid) is None
    without = PgLedger(store.pool)  # ledger-only use: no document store
    with pytest.raises(DocumentMissing):
        without.release(rid)
    docs.discard_result(rid, run.attempt)
    with pytest.raises(DocumentMissing):
        store.release(rid)
    with pytest.raises(DocumentMissing):
        store.releases([rid])
    # an inline output needs no file
    rid2 = store.reserve(_res(ds, {"epsilon": 1})).release_id
    run2 = store.mark_running(rid2, "w")
    assert run2 is not None and store.commit(ds, run2, LEDGER_OUTPUT) == "settled"
    assert without.release(rid2) is not None
    assert store.kept_request(rid2) is None and store.kept_request("rel_none") is None


def test_releases_reads_many_in_order_in_one_query(store: PgLedger) -> None:
    ds = _ds()
    store.open(ds, {"epsilon": 100}, "op")
    rids = [store.reserve(_res(ds, {"epsilon": 1})).release_id for _ in range(4)]
    want = [rids[2], "rel_none", rids[0], rids[3], rids[2]]
    got = store.releases(want)
    assert [rid for rid, _ in got] == [rids[2], rids[0], rids[3], rids[2]]
    assert all(fields == store.release(rid) for rid, fields in got)
    assert store.releases([]) == []


# -- the release lists -------------------------------------------------------------------

def _page_all(store: PgLedger, view: ReleaseView, limit: int) -> tuple[list[str], int]:
    seen: list[str] = []
    after, pages = None, 0
    while True:
        got, after = store.release_page(view, limit, after)
        seen += got
        pages += 1
        assert len(got) <= limit
        if after is None:
            return seen, pages
        assert after.phase == "" and after.member == got[-1]
        after = index.Cursor.decode(after.encode())  # the client's round trip
        assert pages < 1000


def test_release_pages_match_a_model_of_every_view(store: PgLedger, pg_url: str) -> None:
    """Releases of three datasets and three keys, in every status, created (and ended) at
    few distinct times (many ties): each view paged at several sizes gives exactly the
    model's order, by (time, id), each release once."""
    rng = random.Random(29)
    sets = [_ds() for _ in range(3)]
    for ds in sets:
        store.open(ds, {"epsilon": 10**6}, "op")
    rows: list[dict[str, Any]] = []
    statuses = ["pricing", "queued", "running", "succeeded", "failed", "cancelled", "refused"]
    for i in range(60):
        ds, actor = rng.choice(sets), rng.choice(["alice", "bob", "carol"])
        rid = store.reserve(_res(ds, {"epsilon": 1}, actor)).release_id
        status = rng.choice(statuses)
        created = T0 + timedelta(seconds=rng.choice([0, 1, 2, 5]))
        finished = created + timedelta(seconds=rng.choice([1, 2])) \
            if status in {"succeeded", "failed", "cancelled", "refused"} else None
        _set(pg_url, rid, status=status, created_at=created, finished_at=finished)
        rows.append({"id": rid, "ds": ds, "actor": actor, "status": status,
                     "created": created, "finished": finished, "i": i})

    def model(keep: Any, time: str, newest: bool) -> list[str]:
        kept = [row for row in rows if keep(row)]
        return [row["id"] for row in sorted(kept, key=lambda row: (row[time], row["id"]),
                                            reverse=newest)]

    some = frozenset(sets[:2])
    views = {
        ReleaseView("all"): model(lambda row: True, "created", True),
        ReleaseView("datasets", frozenset(sets[1:2])):
            model(lambda row: row["ds"] == sets[1], "created", True),
        ReleaseView("datasets", some): model(lambda row: row["ds"] in some, "created", True),
        ReleaseView("datasets", None): model(lambda row: True, "created", True),
        ReleaseView("key", key_id="bob"): model(lambda row: row["actor"] == "bob", "created",
                                                True),
        ReleaseView("pending"): model(lambda row: row["status"] in {"pricing", "queued",
                                                                      "running"},
                                      "created", False),
        ReleaseView("pending", some): model(
            lambda row: row["ds"] in some and row["status"] in {"pricing", "queued",
                                                                 "running"}, "created", False),
        ReleaseView("failed"): model(lambda row: row["status"] in {"failed", "refused"},
                                     "finished", True),
        ReleaseView("failed", some): model(
            lambda row: row["ds"] in some and row["status"] in {"failed", "refused"},
            "finished", True),
    }
    for view, want in views.items():
        assert want, view
        for limit in (1, 3, 7, 100):
            got, pages = _page_all(store, view, limit)
            assert got == want, (view, limit)
            assert pages == max(1, -(-len(want) // limit)), (view, limit)  # no empty page
    assert store.release_page(ReleaseView("datasets", frozenset()), 10) == ([], None)
    assert store.release_page(ReleaseView("key", key_id="nobody"), 10) == ([], None)
    assert store.release_page(ReleaseView("all"), 0) == ([], None)
    with pytest.raises(ValueError):
        store.release_page(ReleaseView("every"), 10)  # type: ignore[arg-type]


def test_a_page_cursor_holds_its_place(store: PgLedger, pg_url: str) -> None:
    """A cursor names (time, id): releases created since are not on the next page (they
    are newer), the one it names may go, ties are split by the id, and the score is the
    release's time in epoch seconds (the failed list: when it ended)."""
    ds = _ds()
    store.open(ds, {"epsilon": 100}, "op")
    rids = sorted(store.reserve(_res(ds, {"epsilon": 1})).release_id for _ in range(5))
    for rid, second in zip(rids, (0, 1, 1, 1, 9), strict=True):  # 1..3: the same microsecond
        _set(pg_url, rid, created_at=T0 + timedelta(seconds=second))
    view = ReleaseView("datasets", frozenset({ds}))
    first, after = store.release_page(view, 2)
    assert first == [rids[4], rids[3]]
    assert after == index.Cursor((T0 + timedelta(seconds=1)).timestamp(), rids[3])
    store.reserve(_res(ds, {"epsilon": 1}))  # newer: before the cursor, not after it
    _sql(pg_url, "DELETE FROM releases WHERE id = %s RETURNING 1", rids[3])
    assert store.release_page(view, 2, after) == ([rids[2], rids[1]], index.Cursor(
        (T0 + timedelta(seconds=1)).timestamp(), rids[1]))
    # the failed list's cursor: when it ended
    _set(pg_url, rids[0], status="failed", finished_at=T0 + timedelta(hours=1))
    _set(pg_url, rids[1], status="refused", finished_at=T0 + timedelta(hours=2))
    got, after = store.release_page(ReleaseView("failed"), 1)
    assert got == [rids[1]] and after == index.Cursor(
        (T0 + timedelta(hours=2)).timestamp(), rids[1])
    assert store.release_page(ReleaseView("failed"), 1, after) == ([rids[0]], None)
    # a forged score no time has
    with pytest.raises(Invalid) as err:
        store.release_page(ReleaseView("all"), 1, index.Cursor(1e300, "x"))
    assert err.value.field == "cursor"


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def test_each_page_is_one_index_range_scan(store: PgLedger, pg_url: str) -> None:
    """EXPLAIN ANALYZE of every view's page over 30,000 releases: an index scan of the
    view's index that reads at most ``limit + 1`` entries (per dataset with ``datasets``),
    no sequential scan, no filter discarding rows: O(log N + limit)."""
    sets = [f"ds_{i:03d}" for i in range(60)]
    _sql(pg_url,
         "INSERT INTO releases (id, dataset_id, actor, status, request, created_at, finished_at) "
         "SELECT 'rel_' || lpad(g::text, 6, '0'), 'ds_' || lpad(mod(g / 10, 60)::text, 3, '0'), "
         "'key_' || mod(g / 7, 20), (ARRAY['pricing', 'queued', 'running', 'succeeded', 'failed', "
         "'cancelled', 'refused', 'succeeded', 'succeeded', 'succeeded'])[1 + mod(g, 10)], '{}', "
         "timestamptz '2026-01-01Z' + make_interval(secs => g / 3), "
         "timestamptz '2026-02-01Z' + make_interval(secs => g / 3) "
         "FROM generate_series(1, 30000) g RETURNING 1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE releases, release_pending, release_failed")
    limit = 20
    cases = [
        (ReleaseView("all"), "releases_newest", 1),
        (ReleaseView("datasets", frozenset(sets[:1])), "releases_dataset_newest", 1),
        (ReleaseView("datasets", frozenset(sets[:8])), "releases_dataset_newest", 8),
        (ReleaseView("key", key_id="key_3"), "releases_actor_newest", 1),
        (ReleaseView("pending"), "release_pending_pkey", 1),
        (ReleaseView("pending", frozenset(sets[:5])), "release_pending_dataset", 5),
        (ReleaseView("failed"), "release_failed_at", 1),
        (ReleaseView("failed", frozenset(sets[:5])), "release_failed_dataset", 5),
    ]
    for view, name, loops in cases:
        first, after = store.release_page(view, limit)
        assert len(first) == limit and after is not None
        for cursor in (None, after):
            query = store._page_query(view, limit, cursor)
            assert query is not None
            sql, params = query
            with psycopg.connect(pg_url) as conn:
                explained = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql,
                                         params).fetchone()
            assert explained is not None
            nodes = list(_plan_nodes(explained[0][0]["Plan"]))
            kinds = {node["Node Type"] for node in nodes}
            assert "Seq Scan" not in kinds and "Bitmap Heap Scan" not in kinds, (view, kinds)
            scans = [node for node in nodes if node["Node Type"] in {"Index Scan",
                                                                     "Index Only Scan"}]
            assert [node["Index Name"] for node in scans] == [name], (view, scans)
            scan = scans[0]
            assert scan["Actual Loops"] == loops
            assert scan["Actual Rows"] <= limit + 1, (view, scan["Actual Rows"])
            assert scan.get("Rows Removed by Filter", 0) == 0, view
            # the same ids as the page itself
            with psycopg.connect(pg_url) as conn:
                ids = [row[0] for row in conn.execute(sql, params).fetchall()][:limit]
            if cursor is None:
                assert ids == first
    # the sweeper's stale releases: the pending index too
    with psycopg.connect(pg_url) as conn:
        explained = conn.execute("EXPLAIN (FORMAT JSON) " + pg_ledger.STALE_SQL,
                                 (30,)).fetchone()
    assert explained is not None
    assert {node.get("Index Name") for node in _plan_nodes(explained[0][0]["Plan"])} >= {
        "release_pending_pkey"}


def test_dataset_history_reads_the_newest_oldest_first_and_says_if_more(
        store: PgLedger, pg_url: str) -> None:
    ds, other = _ds(), _ds()
    store.open(ds, {"epsilon": 100}, "op")
    store.open(other, {"epsilon": 100}, "op")
    rids = [store.reserve(_res(ds, {"epsilon": 1})).release_id for _ in range(5)]
    store.reserve(_res(other, {"epsilon": 1}))
    for i, rid in enumerate(rids):
        _set(pg_url, rid, created_at=T0 + timedelta(seconds=i))
    run = store.mark_running(rids[3], "w")
    assert run is not None and store.mark_data_read(run)
    assert store.fail(ds, run, '{"message": "x"}') == "settled"
    run = store.mark_running(rids[4], "w")
    assert run is not None and store.commit(ds, run, LEDGER_OUTPUT) == "settled"
    history, more = store.dataset_history(ds, 3)
    assert more and len(history) == 3
    assert [h["status"] for h in history] == ["queued", "failed", "succeeded"]
    assert [h.get("charged") for h in history] == [None, "1", "1"]
    assert all(h["request"] == LEDGER_REQUEST and "output" not in h for h in history)
    assert history[0] == store.release(rids[2])
    assert store.dataset_history(ds, 0) == ([], True)
    assert store.dataset_history(ds, 4)[1] and not store.dataset_history(ds, 5)[1]
    assert [h["created_at"] for h in store.dataset_history(ds, 99)[0]] == [
        (T0 + timedelta(seconds=i)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        for i in range(5)]
    assert store.dataset_history("ds_none", 10) == ([], False)
    assert store.dataset_history("ds_none", 0) == ([], False)


def test_earlier_releases_says_truncated_past_the_newest_it_reads(store: PgLedger,
                                                                  pg_url: str) -> None:
    """Pricing composes with at most ``MAX_EARLIER_RELEASES`` releases: one more and it
    says ``truncated`` (``dataset_history``'s ``more``), never composes with a part."""
    from service.releases import pricing

    ds = _ds()
    store.open(ds, {"epsilon": 10**6}, "op")
    newest = pricing.MAX_EARLIER_RELEASES
    _sql(pg_url, "INSERT INTO releases (id, dataset_id, actor, status, request, created_at) "
                 "SELECT 'rel_' || g, %s, 'key', 'succeeded', %s, now() - g * interval '1 s' "
                 "FROM generate_series(1, %s) g RETURNING 1", ds, LEDGER_REQUEST, newest)
    dataset = {"id": ds, "version": 1}
    full = pricing.earlier_releases(store, dataset)
    assert len(full) == newest and {"status": "truncated"} not in full
    _sql(pg_url, "INSERT INTO releases (id, dataset_id, actor, status, request, created_at) "
                 "VALUES ('rel_oldest', %s, 'key', 'succeeded', %s, now() - interval '1 day') "
                 "RETURNING 1", ds, LEDGER_REQUEST)
    assert pricing.earlier_releases(store, dataset) == [{"status": "truncated"}, *full]


def test_dataset_history_reads_newest_plus_one_rows_whatever_the_history(
        store: PgLedger, pg_url: str) -> None:
    """Over 40,000 releases, 4,000 of them the dataset's, the history's query reads
    ``newest + 1`` entries of ``releases_dataset_newest`` (EXPLAIN ANALYZE): nothing
    counts them all."""
    _sql(pg_url,
         "INSERT INTO releases (id, dataset_id, actor, status, request, created_at) "
         "SELECT 'rel_' || lpad(g::text, 6, '0'), CASE WHEN mod(g, 10) = 0 THEN 'ds_big' "
         "ELSE 'ds_' || mod(g, 99) END, 'key', 'succeeded', '{}', "
         "timestamptz '2026-01-01Z' + make_interval(secs => g) "
         "FROM generate_series(1, 40000) g RETURNING 1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE releases")
    history, more = store.dataset_history("ds_big", 256)
    assert more and len(history) == 256 and history[-1]["created_at"].startswith("2026-01-01T11")
    with psycopg.connect(pg_url) as conn:
        explained = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + pg_ledger.HISTORY_SQL,
                                 ("ds_big", 257)).fetchone()
    assert explained is not None
    nodes = list(_plan_nodes(explained[0][0]["Plan"]))
    scans = [n for n in nodes if n["Node Type"] in {"Index Scan", "Index Only Scan"}]
    assert [n["Index Name"] for n in scans] == ["releases_dataset_newest"]
    assert scans[0]["Actual Rows"] == 257 and scans[0].get("Rows Removed by Filter", 0) == 0
    assert "Seq Scan" not in {n["Node Type"] for n in nodes}


# -- the sweeper -------------------------------------------------------------------------

def test_stale_lists_the_old_pending_releases_oldest_first(store: PgLedger,
                                                           pg_url: str) -> None:
    ds = _ds()
    store.open(ds, {"epsilon": 100}, "op")
    old = datetime.now(UTC) - timedelta(minutes=10)
    pricing = store.reserve(_res(ds, {}, mode="pricing", replay=False)).release_id
    queued = store.reserve(_res(ds, {"epsilon": 1})).release_id
    running = store.reserve(_res(ds, {"epsilon": 1})).release_id
    ended = store.reserve(_res(ds, {"epsilon": 1})).release_id
    young = store.reserve(_res(ds, {"epsilon": 1})).release_id
    assert store.mark_running(running, "w") is not None
    assert store.cancel(ds, ended, "op") == "settled"
    for i, rid in enumerate((running, pricing, queued, ended)):
        _set(pg_url, rid, created_at=old + timedelta(seconds=i))
    got = store.stale(60)
    assert [rid for rid, _ in got] == [running, pricing, queued]
    assert [at for _, at in got] == [(old + timedelta(seconds=i)).timestamp()
                                     for i in range(3)]
    assert [rid for rid, _ in store.stale(0)][-1] == young
    assert store.stale(3600) == []
    store.drop_pending(queued)  # a no-op: the status says it is pending
    assert [rid for rid, _ in store.stale(60)] == [running, pricing, queued]


def test_lease_held_and_unsent_ids(store: PgLedger, pg_url: str) -> None:
    ds = _ds()
    store.open(ds, {"epsilon": 100}, "op")
    a = store.reserve(_res(ds, {"epsilon": 1})).release_id
    b = store.reserve(_res(ds, {"epsilon": 1})).release_id
    assert store.unsent_ids() == {a, b}
    store.enqueued(a)
    assert store.unsent_ids() == {b}
    assert not store.lease_held(a) and not store.lease_held("rel_none")
    run = store.mark_running(a, "w")
    assert run is not None and store.lease_held(a)
    assert store.mark_running(b, "w") is not None
    assert store.unsent_ids() == set()  # a started release was evidently sent
    _lapse(pg_url, a)
    assert not store.lease_held(a)
    run = store.mark_running(a, "w2")
    assert run is not None and store.lease_held(a)
    assert store.commit(ds, run, LEDGER_OUTPUT) == "settled"
    assert not store.lease_held(a)


def test_claim_resend_claims_and_gives_back(store: PgLedger, pg_url: str) -> None:
    """``claim_resend`` answers the re-send's number while the release is gone (no lease,
    not read, pending) and the bound allows, -1 past the bound, 0 when it is not gone;
    ``undo_resend`` gives the last claim back; ``resends`` / ``resent_at`` say so."""
    ds = _ds()
    store.open(ds, {"epsilon": 100}, "op")

    def reserve(i: int) -> str:
        res = _res(ds, {"epsilon": 1})
        res = Reservation(ds, f"rel_{ds}_{i}", res.cost, res.actor, res.fingerprint,
                          res.request_json)
        assert store.reserve(res).outcome == "reserved"
        return res.release_id

    def fields(rid: str) -> dict[str, str]:
        return {k: v for k, v in (store.release(rid) or {}).items()
                if k in {"resends", "resent_at"}}

    gone = reserve(0)
    assert [store.claim_resend(gone, 2) for _ in range(4)] == [1, 2, -1, -1]
    pg = fields(gone)
    assert pg.keys() == {"resends", "resent_at"} and pg["resends"] == "2"
    assert abs(float(pg["resent_at"]) - datetime.now(UTC).timestamp()) < 60
    store.undo_resend(gone)
    assert fields(gone) == {"resends": "1"}
    assert store.claim_resend(gone, 2) == 2
    # leased (a run holds it), read, ended, missing: not gone
    running = reserve(1)
    assert store.mark_running(running, "w") is not None
    assert store.claim_resend(running, 3) == 0
    _lapse(pg_url, running)  # its worker died: gone, re-sendable while unread
    assert store.claim_resend(running, 3) == 1
    read = reserve(2)
    run = store.mark_running(read, "w")
    assert run is not None and store.mark_data_read(run)
    _lapse(pg_url, read)
    assert store.claim_resend(read, 3) == 0
    ended = reserve(3)
    assert store.cancel(ds, ended, "op") == "settled"
    assert store.claim_resend(ended, 3) == 0
    assert store.claim_resend("rel_none", 3) == 0
    store.undo_resend("rel_none")  # nothing to give back
    never = reserve(4)
    store.undo_resend(never)  # never claimed: left as it is
    assert "resends" not in (store.release(never) or {})


def test_two_sweepers_claim_one_resend(pg_url: str) -> None:
    """Claims racing on one release with room for one more re-send: exactly one wins."""
    pool = database.connect(pg_url, max_size=4)
    store = PgLedger(pool)
    try:
        ds = _ds()
        store.open(ds, {"epsilon": 100}, "op")
        for round_ in range(10):
            rid = store.reserve(_res(ds, {"epsilon": 1})).release_id
            barrier = threading.Barrier(4)

            def claim(_: int, rid: str = rid, barrier: threading.Barrier = barrier) -> int:
                barrier.wait()
                return store.claim_resend(rid, 1)

            with ThreadPoolExecutor(4) as executor:
                answers = sorted(executor.map(claim, range(4)))
            assert answers == [-1, -1, -1, 1], (round_, answers)
            assert (store.release(rid) or {})["resends"] == "1"
    finally:
        pool.close()


# -- the registry ------------------------------------------------------------------------

def test_set_dataset_status_rewrites_the_document(store: PgLedger, pg_url: str) -> None:
    ds = _ds()
    store.open(ds, {"epsilon": 10}, "op", _doc(ds, name="people"))
    text = store.set_dataset_status(ds, "retired")
    assert text is not None and text == store.dataset_document(ds)
    assert json.loads(text) == {"id": ds, "status": "retired", "versions": [1],
                                "name": "people"}
    assert text == json.dumps(json.loads(text))  # as datasets.set_status writes it
    assert _sql(pg_url, "SELECT status FROM datasets WHERE id = %s", ds) == [("retired",)]
    assert store.set_dataset_status("ds_none", "retired") is None
    assert store.dataset_document("ds_none") is None


def test_set_dataset_status_loses_no_concurrent_version_change(pg_url: str) -> None:
    """Status changes racing version uploads (read, compare-and-set, read again on a
    conflict): every version and the last status are in the final document."""
    pool = database.connect(pg_url, max_size=4)
    store = PgLedger(pool)
    try:
        ds = _ds()
        store.open(ds, {"epsilon": 10}, "op", json.dumps({"id": ds, "status": "active",
                                                          "versions": [1]}))

        def statuses() -> None:
            for i in range(30):
                assert store.set_dataset_status(ds, f"s{i}") is not None

        def versions() -> None:
            for version in range(2, 12):
                while True:
                    read = store.dataset_document(ds)
                    assert read is not None
                    doc = json.loads(read)
                    doc["versions"] = [*doc["versions"], version]
                    outcome, _ = store.version_change(ds, read, json.dumps(doc), "uploaded",
                                                      version, "op")
                    if outcome == "ok":
                        break

        threads = [threading.Thread(target=statuses), threading.Thread(target=versions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        final = json.loads(store.dataset_document(ds) or "{}")
        assert final["versions"] == list(range(1, 12)) and final["status"] == "s29"
    finally:
        pool.close()


def test_dataset_documents_and_ids(store: PgLedger, pg_url: str) -> None:
    ids = [_ds() for _ in range(3)]
    for i, ds in enumerate(ids):
        store.open(ds, {"epsilon": 1}, "op", _doc(ds, n=i))
        _sql(pg_url, "UPDATE datasets SET created_at = %s WHERE id = %s RETURNING 1",
             T0 - timedelta(seconds=i), ds)
    store.open(_ds(), {"epsilon": 1}, "op")  # a ledger without a document: not registered
    assert store.dataset_documents([ids[2], "ds_none", ids[0], ids[2]]) == [
        _doc(ids[2], n=2), None, _doc(ids[0], n=0), _doc(ids[2], n=2)]
    assert store.dataset_documents([]) == []
    assert store.dataset_ids() == [ids[2], ids[1], ids[0]]  # oldest first


def test_idempotency_record_names_what_the_key_made(store: PgLedger, pg_url: str) -> None:
    ds, fp = _ds(), secrets.token_hex(8)
    v1 = _doc(ds)
    assert store.idempotency_record("pr:idem:none") is None
    store.open(ds, {"epsilon": 10}, "op", v1, idempotency_key="k-open", fingerprint=fp)
    assert store.idempotency_record("k-open") == (fp, ds, None)
    v2 = _doc(ds, versions=[1, 2])
    store.version_change(ds, v1, v2, "uploaded", 2, "op", idempotency_key="k-version",
                         fingerprint=fp + "v")
    assert store.idempotency_record("k-version") == (fp + "v", ds, 2)
    store.reserve(_res(ds, {"epsilon": 1}, idempotency_key="k-release", fingerprint="rfp"))
    assert store.idempotency_record("k-release") == ("rfp", None, None)
    _sql(pg_url, "UPDATE idempotency SET expires_at = now() - interval '1 second' "
                 "WHERE key = 'k-open' RETURNING 1")
    assert store.idempotency_record("k-open") is None  # expired: as good as absent


def test_holdout_counters(store: PgLedger) -> None:
    """The largest hold-out and the count of releases that used one
    (``datasets.record_holdout``: exact integers)."""
    ds = _ds()
    assert store.holdout_exposure(ds) == {"rows": 0, "releases": 0}
    seen = []
    for rows in (100, 50, 10**12, 7):
        payload = json.dumps({"result": {"reference": {"kind": "holdout",
                                                        "holdout_rows": rows}}})
        datasets.record_holdout(store, ds, payload)
        seen.append(rows)
        assert store.holdout_exposure(ds) == {"rows": max(seen), "releases": len(seen)}
    assert store.holdout_exposure(ds) == {"rows": 10**12, "releases": 4}
    assert store.holdout_exposure(_ds()) == {"rows": 0, "releases": 0}


# -- the audit log's bounds --------------------------------------------------------------

def test_audit_range_maps_times_and_cursors_to_event_ids(store: PgLedger) -> None:
    """Events of two datasets at known times (the reserve event's ``at`` is the
    reservation's; later events, later times, as the API's clock gives them): ``since`` /
    ``until`` select by time, ``after`` continues a page, the bounds work for either
    dataset (ids are global), and a cursor that is not an event id of this store is
    refused naming ``cursor``."""
    ds, other = _ds(), _ds()
    store.open(ds, {"epsilon": 100}, "op")
    store.open(other, {"epsilon": 100}, "op")
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    times = [base + timedelta(minutes=m) for m in range(6)]
    made = []
    for i, at in enumerate(times):
        one = ds if i % 2 == 0 else other
        iso = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        made.append(store.reserve(_res(one, {"epsilon": 1}, at=iso)).release_id)

    def rids(dataset_id: str, since: datetime | None, until: datetime | None,
             after: str | None = None) -> list[str]:
        start, end = store.audit_range(since, until, after)
        return [e["release_id"] for e in store.events(dataset_id, start, end)
                if e["kind"] == "reserve"]

    assert rids(ds, None, None) == made[0::2]
    assert rids(ds, times[1], None) == [made[2], made[4]]
    assert rids(ds, times[2], None) == [made[2], made[4]]  # at or after: inclusive
    assert rids(other, times[1], times[3]) == [made[1], made[3]]  # at or before: inclusive
    assert rids(other, None, times[2]) == [made[1]]
    assert rids(ds, times[5] + timedelta(seconds=1), None) == []
    assert rids(ds, None, base - timedelta(days=1)) == []
    assert store.audit_range(None, None, None) == ("-", "+")
    # a naive time is local time, as datetime.timestamp reads it
    naive = datetime.fromtimestamp(times[2].timestamp())
    assert rids(ds, naive, None) == [made[2], made[4]]
    # a page's last event id: the next page starts after it (and after since)
    events = store.events(ds)
    page, last = store.events_page(ds, *store.audit_range(times[0], None, None), None, 1)
    assert [e["release_id"] for e in page] == [made[0]] and last == page[0]["id"]
    page, last = store.events_page(ds, *store.audit_range(times[0], None, last), None, 1)
    assert [e["release_id"] for e in page] == [made[2]]
    assert rids(ds, None, None, events[0]["id"]) == made[0::2]  # the cap event was first
    assert rids(ds, times[4], None, events[0]["id"]) == [made[4]]  # since is further
    # no event at or after since: an empty range, even once later events are written
    start, end = store.audit_range(times[5] + timedelta(hours=1), None, None)
    assert store.events(ds, start, end) == store.events(other, start, end) == []
    store.reserve(_res(ds, {"epsilon": 1}))
    assert store.events(ds, start, end) == []
    assert store.events(ds, *store.audit_range(None, None, None)) == store.events(ds)
    for forged in ("", "12-0", "-1", "1e3", "x", "9" * 20, str(2**63), " 1"):
        with pytest.raises(Invalid) as err:
            store.audit_range(None, None, forged)
        assert err.value.field == "cursor" and err.value.code == "validation_error"


# -- reads that do not grow with the history (issue #29 item 7) ---------------------------

def _explain(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    """The nodes of EXPLAIN ANALYZE's plan of ``sql``."""
    with psycopg.connect(url) as conn:
        explained = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
    assert explained is not None
    return list(_plan_nodes(explained[0][0]["Plan"]))


def test_dataset_count_is_kept_with_every_change_of_the_registry(store: PgLedger,
                                                                 pg_url: str) -> None:
    """``dataset_count`` is exactly ``count(*)`` after registrations (concurrent ones
    too), a re-sent one, a ledger without a document, bulk inserts and deletes and a
    TRUNCATE; and it reads one row of ``counts`` (its primary key), not the datasets."""
    def counted() -> int:
        (row,) = _sql(pg_url, "SELECT count(*) FROM datasets")
        assert store.dataset_count() == row[0]
        return int(row[0])

    assert counted() == 0
    ids = [_ds() for _ in range(3)]
    for ds in ids:
        assert store.open(ds, {"epsilon": 1}, "op", _doc(ds))[0] == "opened"
    assert store.open(ids[0], {"epsilon": 1}, "op", _doc(ids[0]))[0] == "exists"
    store.open(_ds(), {"epsilon": 1}, "op")  # a ledger alone: no dataset registered
    assert counted() == 3
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda ds: store.open(ds, {"epsilon": 1}, "op", _doc(ds)),
                      [_ds() for _ in range(40)]))
    assert counted() == 43
    _sql(pg_url, "INSERT INTO datasets (id, document, created_by) SELECT 'ds_bulk' || g, "
                 "'{}', 'op' FROM generate_series(1, 5000) g RETURNING 1")
    assert counted() == 5043
    _sql(pg_url, "DELETE FROM datasets WHERE id IN ('ds_bulk1', 'ds_bulk2') RETURNING 1")
    _sql(pg_url, "DELETE FROM datasets WHERE id = 'ds_none' RETURNING 1")
    assert counted() == 5041
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE datasets")
    nodes = _explain(pg_url, pg_ledger.COUNT_SQL, "datasets")
    assert [(n["Node Type"], n.get("Index Name"), n["Actual Rows"]) for n in nodes] == [
        ("Index Scan", "counts_pkey", 1)]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("TRUNCATE datasets")
    assert counted() == 0


def _version(version: int, rows: int, columns: list[str], status: str = "active",
             sha: str = "") -> dict[str, Any]:
    return {"version": version, "n_rows": rows, "status": status,
            "columns": {c: {"type": "continuous"} for c in columns},
            **({"sha256": sha} if sha else {})}


def test_reupload_warnings_read_the_datasets_of_the_shape_only(store: PgLedger,
                                                               pg_url: str) -> None:
    """``reupload_warnings`` answers as a read of every document would (a model over
    random datasets: active or retired, public or not, versions active or retired, of
    a few shapes; legacy documents without versions), and its query reads, through
    ``datasets_shapes``, the rows of the shape only (EXPLAIN ANALYZE over 3,000
    datasets)."""
    rng = random.Random(29)
    shapes = [(100, ["a", "b"]), (100, ["b", "a", "c"]), (7, ["a", "b"]), (100, ["é", "a"])]
    docs: list[dict[str, Any]] = []
    for i in range(120):
        ds = f"ds_{i:04d}"
        doc: dict[str, Any] = {"id": ds, "status": rng.choice(["active", "active", "retired"]),
                               "public": rng.random() < 0.2, "name": f"n{i}"}
        if rng.random() < 0.2:  # a document from before versions: its one version on top
            rows, columns = rng.choice(shapes)
            doc.update(_version(1, rows, columns, sha=rng.choice(["", "f1", "f2"])))
            del doc["status"]
            doc["status"] = rng.choice(["active", "retired"])
        else:
            doc["versions"] = [_version(v, *rng.choice(shapes),
                                        status=rng.choice(["active", "retired"]),
                                        sha=rng.choice(["", "f1", "f2"]))
                               for v in range(1, rng.randint(1, 4) + 1)]
            doc.update({k: doc["versions"][-1][k] for k in ("n_rows", "columns")})
        docs.append(doc)
        store.open(ds, {"epsilon": 1}, "op", json.dumps(doc))
        _sql(pg_url, "UPDATE datasets SET created_at = %s WHERE id = %s RETURNING 1",
             T0 + timedelta(seconds=rng.randint(0, 50)), ds)
    order = [ds for (ds,) in _sql(pg_url, "SELECT id FROM datasets ORDER BY created_at, id")]
    by_id = {d["id"]: d for d in docs}

    def model(new: dict[str, Any]) -> list[dict[str, Any]]:
        """The warnings as the read of every document gave them (issue #29 before)."""
        out = []
        for other in (by_id[ds] for ds in order):
            if (other["id"] == new["id"] or other.get("status") != "active"
                    or other.get("public")):
                continue
            for entry in datasets.versions_of(other):
                if (entry["status"] == "active" and set(entry["columns"]) == set(new["columns"])
                        and int(entry["n_rows"]) == int(new["n_rows"])):
                    out.append({"dataset_id": other["id"], "version": entry["version"],
                                "same_file": bool(new.get("sha256"))
                                and entry.get("sha256") == new["sha256"]})
                    break
        return out

    checked = 0
    for rows, columns in [*shapes, (5, ["z"])]:
        for sha in ("", "f1"):
            new = {"id": "ds_new", "n_rows": rows, "public": False,
                   "columns": {c: {} for c in reversed(columns)},
                   **({"sha256": sha} if sha else {})}
            got = [{k: w[k] for k in ("dataset_id", "version", "same_file")}
                   for w in datasets.reupload_warnings(store, new)]
            assert got == model(new), (rows, columns, sha)
            checked += len(got)
    assert checked > 20  # the model names many
    # one of them as the registered dataset itself: never its own warning
    own = next(d for d in docs if d["status"] == "active" and not d["public"]
               and "versions" in d and d["versions"][-1]["status"] == "active")
    assert all(w["dataset_id"] != own["id"] for w in datasets.reupload_warnings(store, own))
    assert datasets.reupload_warnings(store, {**own, "public": True}) == []

    # 3,000 datasets more, of other shapes: the probe reads the shape's rows only
    _sql(pg_url, "INSERT INTO datasets (id, document, created_by) SELECT 'ds_x' || g, "
                 "jsonb_build_object('id', 'ds_x' || g, 'status', 'active', 'versions', "
                 "jsonb_build_array(jsonb_build_object('version', 1, 'status', 'active', "
                 "'n_rows', g, 'columns', '{\"a\": {}, \"b\": {}}'::jsonb)))::text, 'op' "
                 "FROM generate_series(1000, 3999) g RETURNING 1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE datasets")  # no dead row versions left in the index
    matching = len(model({"id": "ds_new", "n_rows": 100, "columns": {"a": {}, "b": {}}}))
    nodes = _explain(pg_url, pg_ledger.SHAPES_SQL, Jsonb({"a": None, "b": None}),
                     Jsonb(100), "ds_new")
    kinds = {n["Node Type"] for n in nodes}
    assert "Seq Scan" not in kinds, kinds
    probe = next(n for n in nodes if n["Node Type"] == "Bitmap Index Scan")
    assert probe["Index Name"] == "datasets_shapes"
    heap = next(n for n in nodes if n["Node Type"] == "Bitmap Heap Scan")
    read = heap["Actual Rows"] + heap.get("Rows Removed by Index Recheck", 0)
    assert read == probe["Actual Rows"] <= matching + 5, (read, matching)
    with_one = len(store.same_shape_documents(["a", "b"], 1000, "ds_new"))
    assert with_one == 1  # one of the 3,000, found by its shape


def test_balances_reads_every_dataset_in_one_query(store: PgLedger) -> None:
    ids = [_ds() for _ in range(4)]
    for i, ds in enumerate(ids):
        store.open(ds, {"epsilon": 10 + i, "delta": 5}, "op")
    store.reserve(_res(ids[1], {"epsilon": 3}))
    assert store.balances([ids[2], "ds_none", ids[1], ids[2]]) == [
        store.balance(ids[2]), {}, store.balance(ids[1]), store.balance(ids[2])]
    assert store.balances(ids[1:2])[0]["epsilon"] == {
        "cap": 11, "committed": 0, "reserved": 3, "remaining": 8}
    assert store.balances([]) == []


def test_budget_window_replays_as_the_whole_history(store: PgLedger, pg_url: str) -> None:
    """The chart's window (the newest events, from the balance with them undone and the
    caps set before them) gives exactly the steps a replay of the whole history gives
    for them, wherever the window starts: caps changed, commits, failures charged,
    aborts, cancels, allocations, a recharge, a second measure; and its queries read
    ``limit + 1`` events and the dataset's cap events (EXPLAIN ANALYZE)."""
    from service.console import burndown

    ds = _ds()
    store.open(ds, {"epsilon": 1000, "delta": 100}, "op")
    store.recharge_interval(ds, {"epsilon": 7}, "op")  # opened now: marked done, no event
    _sql(pg_url, "UPDATE ledgers SET recharged_interval = false WHERE dataset_id = %s "
                 "RETURNING 1", ds)
    assert store.recharge_interval(ds, {"epsilon": 7, "rho": 2}, "op") == "recharged"
    rng = random.Random(7)
    for i in range(60):
        cost = {"epsilon": rng.randint(1, 5), **({"delta": 1} if i % 3 == 0 else {})}
        rid = store.reserve(_res(ds, cost)).release_id
        action = rng.choice(["commit", "fail", "abort", "cancel", "leave"])
        if action == "cancel":
            store.cancel(ds, rid, "op")
        elif action != "leave":
            run = store.mark_running(rid, "w")
            assert run is not None
            if action == "commit":
                store.commit(ds, run, LEDGER_OUTPUT)
            elif action == "fail":
                assert store.mark_data_read(run)
                store.fail(ds, run, '{"message": "x"}')
            else:
                store.abort_run(ds, run, '{"message": "x"}')
        if i in (10, 40):
            store.change_caps(ds, [(None, {"epsilon": 2000 + i}), ("key_1", {"epsilon": 9})],
                              "op")
    events = store.events(ds)
    assert len(events) > 100
    whole = burndown.replay(events)
    balance = store.balance(ds)
    for measure in ("epsilon", "delta"):  # the whole replay ends at the ledger's balance
        assert whole[measure].committed[-1] == balance[measure]["committed"]
        assert whole[measure].reserved[-1] == balance[measure]["reserved"]
    assert store.budget_window(ds, len(events)) == BudgetWindow(events)
    for limit in (1, 2, 5, 17, 50, 100, len(events) - 1):
        window = store.budget_window(ds, limit)
        assert not window.complete and window.events == events[-limit:]
        assert window.start_at == events[-limit - 1]["at"]
        steps = burndown.replay_window(window)
        for measure, series in whole.items():
            named = [i for i, e in enumerate(events) if measure in (e.get("units") or {})
                     and e["kind"] in {"cap", *burndown.MOVES}]
            tail = [i for i in named if i >= len(events) - limit]
            got = steps[measure]
            # the first step: what held before the window; then the window's own steps
            state = {"cap": 0, "committed": 0, "reserved": 0}
            before = [i for i in named if i < len(events) - limit]
            if before:
                at = named.index(before[-1])
                state = {"cap": series.cap[at], "committed": series.committed[at],
                         "reserved": series.reserved[at]}
            assert (got.cap[0], got.committed[0], got.reserved[0]) == (
                state["cap"], state["committed"], state["reserved"]), (limit, measure)
            assert got.times[0] == window.start_at
            first = named.index(tail[0]) if tail else len(named)
            assert got.times[1:] == series.times[first:], (limit, measure)
            assert got.cap[1:] == series.cap[first:], (limit, measure)
            assert got.committed[1:] == series.committed[first:], (limit, measure)
            assert got.reserved[1:] == series.reserved[first:], (limit, measure)
    # the queries: limit + 1 events through events_dataset; the cap events alone
    _sql(pg_url, "INSERT INTO events (dataset_id, kind, actor, at, units) SELECT 'ds_other', "
                 "'reserve', 'k', now(), '{\"epsilon\": 1}' FROM generate_series(1, 20000) g "
                 "RETURNING 1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE events")
    nodes = _explain(pg_url, pg_ledger.WINDOW_SQL, ds, 11)
    scans = [n for n in nodes if "Scan" in n["Node Type"]]
    assert [(n["Node Type"], n["Index Name"], n["Actual Rows"]) for n in scans] == [
        ("Index Scan Backward", "events_dataset", 11)] or [
        (n["Index Name"], n["Actual Rows"]) for n in scans] == [("events_dataset", 11)], scans
    nodes = _explain(pg_url, pg_ledger.CAPS_BEFORE_SQL, ds, int(events[-2]["id"]))
    scans = [n for n in nodes if n["Node Type"] in {"Index Scan", "Bitmap Index Scan",
                                                     "Seq Scan", "Bitmap Heap Scan"}]
    assert {n["Node Type"] for n in scans} <= {"Index Scan", "Bitmap Index Scan",
                                               "Bitmap Heap Scan"}, scans
    assert {n.get("Index Name") for n in scans} - {None} == {"events_dataset_caps"}
    assert max(n["Actual Rows"] for n in scans) == 3  # open's and the two changes'
