"""A settle is a HOT update of ``releases`` (migration 0010_hot_settle, issue #29's ledger
benchmark): every way a release ends (commit, fail, refund, cancel, refusal, the
sweeper's charge) changes no column an index of ``releases`` names, and the lists it
leaves or enters are rows of side tables (``release_pending``, ``release_failed``,
``release_ran``, ``release_runs``) kept by the trigger ``releases_lists``. Counted by
PostgreSQL's own statistics (``n_tup_hot_upd``): deterministic, unlike throughput on a
shared machine. And 0010 upgrades a populated database keeping every pending and failed
release listed with its marks, and goes down and up again."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from service.storage import database
from service.storage.ledger import NO_LEASE, Run
from service.storage.pg_ledger import PgLedger
from service.storage.store import ReleaseView
from tests.integration.conftest import LEDGER_OUTPUT
from tests.integration.test_pg_ledger import _create_db, _db_url, _drop_db, _ds, _res, _sql
from tests.integration.test_pg_store import _downgrade

STATS = ("SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
         "WHERE relname = 'releases'")


@pytest.fixture()
def pg_url(postgres_url: str) -> Iterator[str]:
    name = _create_db(postgres_url)
    url = _db_url(postgres_url, name)
    database.upgrade(url)
    yield url
    _drop_db(postgres_url, name)


def _stats(url: str, pool: object, expected: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """``releases``' counters once the pool's backends reported theirs (a backend
    reports when it next goes idle: polled up to 10 s for ``expected``)."""
    deadline = time.monotonic() + 10
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(STATS).fetchone()
            assert row is not None
            seen = tuple(int(v) for v in row)
            if expected is None or seen == expected or time.monotonic() > deadline:
                return seen
            time.sleep(0.05)


def _start(ledger: PgLedger, release_id: str) -> Run:
    run = ledger.mark_running(release_id, "w")
    assert run is not None
    return run


def _page(ledger: PgLedger, view: ReleaseView) -> list[str]:
    """Every id of the view, two at a time (the cursor's paging)."""
    ids: list[str] = []
    ids_page, after = ledger.release_page(view, 2)
    ids += ids_page
    while after is not None:
        ids_page, after = ledger.release_page(view, 2, after)
        ids += ids_page
    return ids


def test_every_settle_is_a_hot_update_and_moves_the_release_between_lists(
        pg_url: str) -> None:
    """Seven releases end seven ways; each end is one UPDATE of ``releases``, HOT. The
    pending list loses each, the failed list gains the failed and the refused ones (the
    dataset's too), the started ones that ended are witnesses (``release_ran``)."""
    pool = database.connect(pg_url, min_size=1, max_size=1)
    try:
        ledger = PgLedger(pool)
        ds = _ds()
        ledger.open(ds, {"epsilon": 10**6}, "op")
        ids = {}
        for name in ("commit", "fail", "abort_run", "abort", "cancel", "charge_gone"):
            ids[name] = ledger.reserve(_res(ds, {"epsilon": 1})).release_id
        ids["refuse"] = ledger.reserve(_res(ds, {}, mode="pricing")).release_id
        runs = {name: _start(ledger, ids[name]) for name in ("commit", "fail", "abort_run")}
        _start(ledger, ids["charge_gone"])
        _sql(pg_url, "UPDATE releases SET lease_until = now() - interval '1 second', "
                     "data_read = true WHERE id = %s RETURNING 1", ids["charge_gone"])
        pending = ReleaseView("pending")
        assert sorted(_page(ledger, pending)) == sorted(ids.values())
        with pool.connection() as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
        before = _stats(pg_url, pool)
        for name, run in runs.items():
            assert getattr(ledger, name)(ds, run, LEDGER_OUTPUT if name == "commit"
                                         else '{"error": "x"}') == "settled"
        assert ledger.abort(ds, ids["abort"], '{"error": "x"}', "op", NO_LEASE)
        assert ledger.cancel(ds, ids["cancel"], "op") == "settled"
        assert ledger.charge_gone(ds, ids["charge_gone"], '{"error": "x"}', "sweeper")
        assert ledger.refuse(ds, ids["refuse"], '{"error": "x"}', "refused", "op")
        with pool.connection() as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
        ended = len(ids)
        after = _stats(pg_url, pool, (before[0], before[1] + ended, before[2] + ended,
                                      before[3]))
        # n_tup_upd, n_tup_hot_upd: one update each, every one HOT
        assert (after[1] - before[1], after[2] - before[2]) == (ended, ended)
        assert _page(ledger, pending) == []
        failed = {ids[n] for n in ("fail", "abort_run", "abort", "charge_gone", "refuse")}
        assert set(_page(ledger, ReleaseView("failed"))) == failed
        assert set(_page(ledger, ReleaseView("failed", frozenset({ds})))) == failed
        assert _page(ledger, ReleaseView("failed", frozenset({"ds_other"}))) == []
    finally:
        pool.close()
    # the failed list by finished_at, newest first (the release's own time)
    assert _sql(pg_url, "SELECT count(*) FROM release_failed f JOIN releases r "
                        "ON r.id = f.release_id WHERE f.finished_at = r.finished_at "
                        "AND f.dataset_id = r.dataset_id") == [(len(failed),)]
    ran = {ids[n] for n in ("commit", "fail", "abort_run", "charge_gone")}
    assert {rid for (rid,) in _sql(pg_url, "SELECT r.id FROM release_ran w JOIN releases r "
                                           "USING (created_seq) WHERE w.ran_at = "
                                           "r.started_at")} == ran
    assert _sql(pg_url, "SELECT count(*) FROM release_runs") == [(0,)]


def test_0010_keeps_every_pending_and_failed_release_listed_and_goes_down_and_up(
        postgres_url: str) -> None:
    """Releases in every status under 0009 (marks on the pending ones, as the sweeper
    left them), then 0010: the pending list (every dataset's, one dataset's), the failed
    list and the marks are as they were, the ended runs are witnesses; a release then
    ends, HOT, and leaves its list. Down to 0009 the columns come back with the marks,
    and up again."""
    name = _create_db(postgres_url)
    url = _db_url(postgres_url, name)
    try:
        database.upgrade(url, "0009_hot_start")
        pool = database.connect(url, min_size=1, max_size=1)
        try:
            ledger = PgLedger(pool)
            ds, other = _ds(), _ds()
            ids: dict[str, str] = {}
            for d in (ds, other):
                ledger.open(d, {"epsilon": 100}, "op")
                for status in ("queued", "running", "succeeded", "failed", "cancelled"):
                    ids[f"{d}/{status}"] = ledger.reserve(_res(d, {"epsilon": 1})).release_id
                for status in ("pricing", "refused"):
                    ids[f"{d}/{status}"] = ledger.reserve(
                        _res(d, {}, mode="pricing")).release_id
                runs = {s: _start(ledger, ids[f"{d}/{s}"])
                        for s in ("running", "succeeded", "failed")}
                assert ledger.commit(d, runs["succeeded"], LEDGER_OUTPUT) == "settled"
                assert ledger.fail(d, runs["failed"], '{"error": "x"}') == "settled"
                assert ledger.cancel(d, ids[f"{d}/cancelled"], "op") == "settled"
                assert ledger.refuse(d, ids[f"{d}/refused"], '{"error": "x"}', "c", "op")
            # the sweeper's marks as 0009 kept them (its SQL: the columns of releases)
            _sql(url, "UPDATE releases SET sweep_seq = nextval('release_sends'), "
                      "sweep_phase = 2, sweep_at = now() WHERE status IN ('pricing', "
                      "'queued') RETURNING 1")
            marks = _sql(url, "SELECT id, sweep_seq, sweep_phase, sweep_at FROM releases "
                              "WHERE sweep_seq IS NOT NULL ORDER BY id")
            pending = {k: v for k, v in ids.items()
                       if k.split("/")[1] in ("pricing", "queued", "running")}
            failed = {k: v for k, v in ids.items() if k.split("/")[1] in ("failed", "refused")}
            views = {"pending": (ReleaseView("pending"), pending.values()),
                     "pending ds": (ReleaseView("pending", frozenset({ds})),
                                    [v for k, v in pending.items() if k.startswith(ds)]),
                     "failed": (ReleaseView("failed"), failed.values()),
                     "failed ds": (ReleaseView("failed", frozenset({other})),
                                   [v for k, v in failed.items() if k.startswith(other)])}
            # the lists as 0009 reads them (its partial indexes' predicates)
            listed = {"pending": "pending ORDER BY created_at, id",
                      "failed": "failed ORDER BY finished_at DESC, id DESC"}
            before = {n: [rid for (rid,) in _sql(
                url, f"SELECT id FROM releases WHERE dataset_id = ANY(%s) AND "
                     f"{listed[n.split()[0]]}", [other] if n == "failed ds" else
                [ds] if n == "pending ds" else [ds, other])] for n in views}
            for n, (_, expected) in views.items():
                assert sorted(before[n]) == sorted(expected), n

            database.upgrade(url)
            assert {n: _page(ledger, view) for n, (view, _) in views.items()} == before
            assert _sql(url, "SELECT release_id, sweep_seq, sweep_phase, sweep_at FROM "
                             "release_pending WHERE sweep_seq IS NOT NULL "
                             "ORDER BY release_id") == marks
            assert sorted(_sql(url, "SELECT r.id FROM release_ran JOIN releases r "
                                    "USING (created_seq)")) == sorted(
                (ids[f"{d}/{s}"],) for d in (ds, other) for s in ("succeeded", "failed"))
            assert _sql(url, "SELECT count(*) FROM release_runs") == [(2,)]
            # a release running since 0009 ends under 0010: HOT, out of its lists
            with pool.connection() as conn:
                conn.execute("SELECT pg_stat_force_next_flush()")
            hot_before = _stats(url, pool)
            assert ledger.fail(other, runs["running"], '{"error": "x"}') == "settled"
            with pool.connection() as conn:
                conn.execute("SELECT pg_stat_force_next_flush()")
            hot_after = _stats(url, pool, (hot_before[0], hot_before[1] + 1,
                                           hot_before[2] + 1, hot_before[3]))
            assert hot_after[1:3] == (hot_before[1] + 1, hot_before[2] + 1)
            assert ids[f"{other}/running"] not in _page(ledger, ReleaseView(
                "pending", frozenset({other})))
            assert ids[f"{other}/running"] in _page(ledger, ReleaseView("failed"))
        finally:
            pool.close()

        _downgrade(url, "0009_hot_start")
        assert _sql(url, "SELECT to_regclass('release_pending'), to_regclass('release_failed'),"
                         " to_regclass('release_ran'), to_regclass('releases_sweep') IS NOT "
                         "NULL") == [(None, None, None, True)]
        assert _sql(url, "SELECT id, sweep_seq, sweep_phase, sweep_at FROM releases "
                         "WHERE sweep_seq IS NOT NULL ORDER BY id") == marks
        assert sorted(_sql(url, "SELECT id FROM releases WHERE failed")) == sorted(
            [(v,) for v in failed.values()] + [(ids[f"{other}/running"],)])
        database.upgrade(url)
        assert _sql(url, "SELECT count(*) FROM release_pending") == [(len(pending) - 1,)]
    finally:
        _drop_db(postgres_url, name)
