"""What a release's ledger steps write on PostgreSQL (migration 0009_hot_start, issue #29's
ledger benchmark): a start and a lease renewal are HOT updates of ``releases`` (no index
entry written), only the insert and the settle write index entries, and a create without
an Idempotency-Key records no ``step_calls`` row. Throughput is noisy on a shared
machine; these counts are not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest

from service.storage import database
from service.storage.pg_ledger import PgLedger
from tests.integration.conftest import LEDGER_OUTPUT
from tests.integration.test_pg_ledger import (
    _create_db,
    _db_url,
    _doc,
    _drop_db,
    _ds,
    _res,
    _sql,
)
from tests.integration.test_pg_store import _downgrade

#: the columns a start (``ledger_start``) or a lease renewal (``ledger_touch``) changes
START_COLUMNS = {"status", "started_at", "worker", "attempt", "lease_token", "lease_until",
                 "data_read"}
#: the columns the indexes of ``releases`` name (keys, INCLUDE, predicates; migration
#: 0010_hot_settle moved the lists a settle changes to side tables)
INDEXED = {"id", "created_at", "dataset_id", "actor", "created_seq", "priced_at"}
#: sequences run
N = 40


@pytest.fixture()
def pg_url(postgres_url: str) -> Iterator[str]:
    name = _create_db(postgres_url)
    url = _db_url(postgres_url, name)
    database.upgrade(url)
    yield url
    _drop_db(postgres_url, name)


def test_no_index_of_releases_names_a_column_a_start_changes(pg_url: str) -> None:
    """PostgreSQL makes an UPDATE a HOT one only if it changes no column an index names
    (PostgreSQL records each such column, key, INCLUDE or predicate, as a dependency of
    the index)."""
    named = {name for (name,) in _sql(pg_url, """
        SELECT DISTINCT a.attname FROM pg_index i
        JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid
             AND d.refobjid = i.indrelid AND d.refobjsubid > 0
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = d.refobjsubid
        WHERE i.indrelid = 'releases'::regclass""")}
    assert named == INDEXED
    assert not named & START_COLUMNS


def test_a_start_and_a_renewal_are_hot_updates_and_a_create_records_no_answer(
        pg_url: str) -> None:
    """N sequences reserve, start, mark the data read, commit through one connection:
    ``releases`` gets N inserts and 3N updates, all HOT (the start, the renewal and,
    since 0010_hot_settle, the commit), ``release_runs`` a row per start, deleted by the
    commit, and ``step_calls`` only the open's row."""
    pool = database.connect(pg_url, min_size=1, max_size=1)
    try:
        ledger = PgLedger(pool)
        ds = _ds()
        ledger.open(ds, {"epsilon": 10**6}, "op")
        for _ in range(N):
            release_id = ledger.reserve(_res(ds, {"epsilon": 1})).release_id
            run = ledger.mark_running(release_id, "w")
            assert run is not None
            assert _sql(pg_url, "SELECT release_id FROM release_runs") == [(release_id,)]
            assert ledger.mark_data_read(run)
            assert ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
        # the one backend reports its counters when it next goes idle
        with pool.connection() as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
    finally:
        pool.close()
    counts = ("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM "
              "pg_stat_user_tables WHERE relname IN ('releases', 'release_runs') ORDER BY 1")
    expected = [("release_runs", N, 0, 0, N), ("releases", N, 3 * N, 3 * N, 0)]
    deadline = time.monotonic() + 10
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            seen = [tuple(row) for row in conn.execute(counts).fetchall()]
            if seen == expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert seen == expected
    assert _sql(pg_url, "SELECT count(*) FROM step_calls") == [(1,)]
    assert _sql(pg_url, "SELECT count(*) FROM release_runs") == [(0,)]
    assert _sql(pg_url, "SELECT count(*), bool_and(status = 'succeeded') FROM releases "
                        "JOIN release_ran USING (created_seq) WHERE ran_at = started_at") == [
        (N, True)]
    assert _sql(pg_url, "SELECT (SELECT count(*) FROM release_pending), "
                        "(SELECT count(*) FROM release_failed)") == [(0, 0)]


def test_0009_knows_the_running_releases_and_goes_down_and_up_again(postgres_url: str) -> None:
    """Upgraded over a release running under 0008, 0009 lists it in ``release_runs``
    (its commit takes it out); a release inserted running (as ``migrate-from-valkey``
    does) is listed too; 0009 downgrades to 0008 (its table, columns, indexes and
    trigger gone, the releases kept, 0008's indexes back) and upgrades again."""
    name = _create_db(postgres_url)
    url = _db_url(postgres_url, name)
    try:
        database.upgrade(url, "0008_sweep")
        pool = database.connect(url)
        try:
            ledger = PgLedger(pool)
            ds = _ds()
            ledger.open(ds, {"epsilon": 10}, "op")
            release_id = ledger.reserve(_res(ds, {"epsilon": 1})).release_id
            run = ledger.mark_running(release_id, "w")
            assert run is not None
            database.upgrade(url, "0009_hot_start")
            assert _sql(url, "SELECT release_id FROM release_runs") == [(release_id,)]
            assert ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
        finally:
            pool.close()
        _sql(url, "INSERT INTO releases (id, dataset_id, actor, status, request) "
                  "VALUES ('rel_moved', %s, 'a', 'running', '{}') RETURNING 1", ds)
        assert _sql(url, "SELECT release_id FROM release_runs") == [("rel_moved",)]
        assert _sql(url, "SELECT id, pending, failed, pricing, ran_at IS NOT NULL FROM "
                         "releases ORDER BY id") == [
            (release_id, False, False, False, True), ("rel_moved", True, False, False, False)]
        _downgrade(url, "0008_sweep")
        assert _sql(url, "SELECT to_regclass('release_runs'), to_regclass('releases_ran_seq'),"
                         " to_regclass('releases_started_seq') IS NOT NULL, "
                         "to_regprocedure('releases_priced()') IS NOT NULL") == [
            (None, None, True, True)]
        assert _sql(url, "SELECT count(*) FROM information_schema.columns WHERE table_name = "
                         "'releases' AND column_name IN ('pending', 'failed', 'pricing', "
                         "'ran_at')") == [(0,)]
        assert _sql(url, "SELECT id FROM releases ORDER BY id") == [(release_id,), ("rel_moved",)]
        database.upgrade(url)
        assert _sql(url, "SELECT release_id FROM release_runs") == [("rel_moved",)]
    finally:
        _drop_db(postgres_url, name)


def test_a_priced_release_gets_its_priced_at_and_loses_its_marks(pg_url: str) -> None:
    """0008's trigger ``releases_priced`` (gone: a BEFORE UPDATE trigger locks every row
    an UPDATE changes) did this; ``ledger_reserve``'s priced UPDATE sets ``priced_at``
    and the trigger ``releases_lists`` clears the marks in ``release_pending``
    (0010_hot_settle)."""
    pool = database.connect(pg_url, max_size=2)
    try:
        ledger = PgLedger(pool)
        ds = _ds()
        ledger.open(ds, {"epsilon": 10}, "op")
        r = _res(ds, {"epsilon": 1}, mode="pricing")
        assert ledger.reserve(r).outcome == "pricing"
        ledger.enqueued(r.release_id)
        ledger.sent(r.release_id)  # the sweeper's mark of its pricing job's message
        marked = "SELECT priced_at IS NOT NULL, sweep_seq IS NOT NULL, sweep_phase, " \
                 "sweep_at IS NOT NULL FROM releases JOIN release_pending ON id = release_id"
        assert _sql(pg_url, marked) == [(False, True, 1, True)]
        assert ledger.reserve(replace(r, mode="priced")).outcome == "reserved"
        assert _sql(pg_url, marked) == [(True, False, None, False)]
        assert _sql(pg_url, "SELECT tgname FROM pg_trigger WHERE tgrelid = "
                            "'releases'::regclass AND tgtype & 2 = 2") == []  # no BEFORE
    finally:
        pool.close()


def test_only_a_plain_create_goes_without_its_answer_recorded(pg_url: str) -> None:
    """A create (``new``, ``pricing``, stamped or not) records no ``step_calls`` row; one
    with an Idempotency-Key does (a re-run could answer ``idempotent``), and so does a
    ``priced`` reserve (its re-run would answer ``ended``). A stamped create sent again
    after its first attempt committed answers ``reserved`` even once the dataset has
    moved past its stamp (its row is there), and holds nothing more."""
    pool = database.connect(pg_url, max_size=2)
    try:
        ledger = PgLedger(pool)
        ds = _ds()
        ledger.open(ds, {"epsilon": 10}, "op", _doc(ds))  # a registered dataset: a stamp
        read = ledger.dataset_for_pricing(ds)
        assert read is not None

        def recorded() -> int:
            return int(_sql(pg_url, "SELECT count(*) FROM step_calls")[0][0])

        before = recorded()
        assert ledger.reserve(_res(ds, {"epsilon": 1})).outcome == "reserved"
        pricing = _res(ds, {"epsilon": 1}, mode="pricing")
        assert ledger.reserve(pricing).outcome == "pricing"
        assert recorded() == before
        assert ledger.reserve(_res(ds, {"epsilon": 1}, idempotency_key="k1")).outcome == (
            "reserved")
        assert recorded() == before + 1
        stamped = _res(ds, {"epsilon": 1}, stamp=read[2])
        assert ledger.reserve(stamped).outcome == "reserved"
        assert recorded() == before + 1
        ledger.set_caps(ds, {"delta": 10}, "op")  # moves past the stamp (its own record)
        held = ledger.balance(ds)["epsilon"]["reserved"]
        assert ledger.reserve(stamped).outcome == "reserved"  # sent again: its row answers
        assert ledger.balance(ds)["epsilon"]["reserved"] == held
        assert ledger.reserve(replace(stamped, release_id="rel_other")).outcome == "stale"
        assert ledger.reserve(replace(pricing, mode="priced")).outcome == "reserved"
        assert recorded() == before + 3
    finally:
        pool.close()
