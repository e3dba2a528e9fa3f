"""Valkey (or PostgreSQL, the system of record) going away under the API: 503 problems
with Retry-After, nothing half-written, and the same app (and worker) carrying on once
it is back.

These tests stop and kill Valkey, so they run their own (AOF, ``appendfsync
always``, on a free port with its own data directory) and their own worker,
never the session's, and a database of their own too, which the PostgreSQL faults take
away (``ALLOW_CONNECTIONS false`` and
its connections ended: the server is the session's, shared). Related fault tests live
elsewhere:

- Valkey killed with -9 under load against gunicorn, restarted from its AOF:
  ``tests/e2e/test_faults.py``.
- A worker killed mid-task (redelivered, re-run once, balanced):
  ``tests/integration/test_jobs.py::test_worker_killed_mid_task_ends_once_and_balances``.
- Valkey's data directory lost whole (budgets, releases and events kept):
  ``tests/integration/test_valkey_loss.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from flask import Flask

from service import apikeys, wiring
from service.api.app import create_app
from service.api.problems import PROBLEM_TYPE, RETRY_AFTER_SECONDS
from service.releases import sweeper
from service.releases.queue import Queue, make_celery
from service.storage import database, rkeys
from service.storage.pg_analyses import PgAnalysisStore
from service.storage.pg_keys import PgKeyStore
from service.storage.pg_ledger import RETRIES, PgLedger
from tests.conftest import ROOT, database_on, start_valkey, wait_for_worker
from tests.integration import record_state
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from workers.celery_app import HEARTBEAT_SECONDS

#: answered without Valkey: liveness, the scrape (reports redis_up 0) and the docs
NO_VALKEY = {"/healthz", "/metrics", "/openapi.json", "/docs", "/docs/<path:filename>",
             "/docs/assets/<name>", "/static/<path:filename>", "/manual", "/manual/",
             "/manual/<path:name>", "/", "/problems", "/problems/<string(maxlength=64):code>"}


@pytest.fixture(scope="module")
def rig(app: Flask, service_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Own Valkey, own data directory, own worker, own database, and an app (with the
    rate limiter on)."""
    valkey_dir = tmp_path_factory.mktemp("faults-valkey")
    data_dir = tmp_path_factory.mktemp("faults-data")
    server = start_valkey(valkey_dir)
    url = server.connection_url + "/0"
    env = {**service_env, "PRIVRELEASE_REDIS_URL": url, "PRIVRELEASE_DATA_DIR": str(data_dir)}
    # its own database: the session's holds other tests' datasets
    database_url = database_on(request.getfixturevalue("postgres_url"))
    database.upgrade(database_url)
    env["PRIVRELEASE_DATABASE_URL"] = database_url
    log = tmp_path_factory.mktemp("faults-worker") / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "1"],
            env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    state: dict[str, Any] = {"valkey": server, "valkey_dir": valkey_dir, "data_dir": data_dir,
                             "worker": worker, "log": log, "database_url": database_url}
    try:
        wait_for_worker(rkeys.connect(url))
        # no key cache: every request looks its key up in the record
        config = dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url, data_dir=data_dir,
                                     database_url=database_url, rate_limit="600/minute",
                                     max_upload_bytes=16 << 20, key_cache_seconds=0)
        state["app"] = create_app(config)
        apikeys.create(wiring.of(state["app"]).keys, "operator", token=TOKEN)
        yield state
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        if state["valkey"].is_running():
            state["valkey"].stop()


def _restart(rig: dict[str, Any]) -> None:
    rig["valkey"] = start_valkey(rig["valkey_dir"], port=rig["port"])


def _path_for(rule: Any, dataset: str, release: str) -> str:
    """A concrete path for a URL rule: real ids where the rule takes them."""
    values = {"dataset_id": dataset, "release_id": release, "version": "1"}
    path = str(rule.rule)
    for arg in rule.arguments:  # <arg> or <converter:arg>
        path = re.sub(rf"<(?:[^:>]+:)?{arg}>", values.get(arg, "x"), path)
    return path


def _assert_unavailable(resp: Any, what: str) -> None:
    assert resp.status_code == 503, (what, resp.status_code, resp.get_data(as_text=True))
    assert resp.mimetype == PROBLEM_TYPE, what
    assert resp.headers["Retry-After"] == str(RETRY_AFTER_SECONDS), what
    doc = resp.get_json()
    assert doc["code"] == "unavailable" and doc["status"] == 503, what
    assert "127.0.0.1" not in doc["detail"]  # no hosts or ports in problems


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_with_valkey_stopped_the_record_answers_and_jobs_wait_for_it(
        rig: dict[str, Any]) -> None:
    """The same outage on PostgreSQL (issue #29): Valkey keeps only what can be lost (the
    broker, rate-limit counters), so keys, datasets, budgets, releases and analyses
    answer from PostgreSQL as with Valkey up; what needs Valkey (readiness, sending a
    job: a new release, an analysis) answers the 503 problem and leaves nothing behind
    (no reservation, no analysis); an identical request is its replay, answered from the
    record; an upload is registered. Once Valkey is back the same app sends jobs again
    (catches a route that still reads the keys or the record from Valkey, or one that
    answers a 500 without it)."""
    flask_app: Flask = rig["app"]
    api = Api(flask_app.test_client())
    meta = {"name": "ages", "record_level": True, "budgets": {"interval_leakage": 1},
            "columns": {"age": {"type": "continuous", "bounds": [0, 100]}}}
    resp = api.upload("age\n" + "\n".join(str(20 + i % 50) for i in range(200)) + "\n",
                      meta)
    assert resp.status_code == 201, resp.get_json()
    dataset = resp.get_json()["id"]
    swept = api.upload(people_csv(20), PEOPLE_META).get_json()["id"]  # its DELETE retires it
    body = {"dataset_id": dataset, "mechanism": "interval.case2",
            "budget": {"interval_leakage": 0.5},
            "params": {"column": "age", "anchors": {"family": "logistic", "loc": 40,
                                                    "scale": 40}}}
    resp = api.post("/v1/releases", body)
    assert resp.status_code == 202
    release = resp.get_json()["id"]
    assert api.wait(release)["status"] == "succeeded"
    analyses_before = record_state.analysis_ids(wiring.of(flask_app).analyses)
    budget = f"/v1/datasets/{dataset}/budget"
    held = api.get(budget).get_json()["measures"]["interval_leakage:age"]

    rig["port"] = rig["valkey"].port
    rig["valkey"].stop()
    try:
        reads, fresh, uploaded = _while_valkey_is_stopped(rig, api, swept, release, body,
                                                          budget, held, analyses_before)
    finally:
        if not rig["valkey"].is_running():
            _restart(rig)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for path, status in reads.items():  # the reads answer as they do with Valkey up
        assert api.client.get(path, headers=headers).status_code == status, path
    listed = [d["id"] for d in api.get("/v1/datasets").get_json()]
    assert listed[:3] == [uploaded, swept, dataset]
    resp = api.post("/v1/releases", fresh)
    assert resp.status_code == 202, resp.get_json()
    assert api.wait(resp.get_json()["id"])["status"] == "succeeded"
    assert rig["worker"].poll() is None
    deadline = time.monotonic() + 3 * HEARTBEAT_SECONDS
    while (ready := api.client.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, ready.get_json()
        time.sleep(0.2)


def _while_valkey_is_stopped(rig: dict[str, Any], api: Api, swept: str, release: str,
                             body: dict[str, Any], budget: str, held: dict[str, float],
                             analyses_before: set[str]
                             ) -> tuple[dict[str, int], dict[str, Any], str]:
    """The outage's half of the test above: the reads' answers, the release to send
    after it and the dataset uploaded during it."""
    flask_app: Flask = rig["app"]
    rules = [r for r in flask_app.url_map.iter_rules() if r.rule not in NO_VALKEY
             and not r.endpoint.startswith("console.")]
    assert len(rules) >= 15
    headers = {"Authorization": f"Bearer {TOKEN}"}
    reads: dict[str, int] = {}
    for rule in rules:
        path = _path_for(rule, swept, release)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            if rule.endpoint == "datasets.upload" and method == "POST":
                continue  # multipart only; a real upload follows
            resp = api.client.open(path, method=method, headers=headers, json={})
            if rule.rule == "/readyz" or resp.status_code == 503:
                _assert_unavailable(resp, f"{method} {rule.rule}")
            else:
                assert resp.status_code < 500, (method, rule.rule, resp.get_data(True))
            if method == "GET":
                reads[path] = resp.status_code
    assert reads.pop("/readyz") == 503
    assert set(reads.values()) <= {200, 404}, reads  # 404: no data or plot to read
    assert sum(1 for s in reads.values() if s == 200) >= 10
    fresh = {**body, "params": {**body["params"], "anchors": {
        **body["params"]["anchors"], "loc": 45}}}
    _assert_unavailable(api.post("/v1/releases", fresh), "release")  # a job to send
    replay = api.post("/v1/releases", body)  # the same request: its replay, no job
    assert replay.status_code == 200, replay.get_json()
    assert replay.get_json()["id"] == release and replay.get_json()["replayed"] is True
    row = api.get(budget).get_json()["measures"]["interval_leakage:age"]
    assert row == held and row["reserved"] == 0.0  # the refused release holds nothing
    _assert_unavailable(api.post(f"/v1/releases/{release}/analyses",
                                 {"analysis": "npmle", "params": {}}), "analysis")
    assert record_state.analysis_ids(wiring.of(flask_app).analyses) == analyses_before
    uploaded = api.upload(people_csv(30), PEOPLE_META)
    assert uploaded.status_code == 201, uploaded.get_json()
    assert api.client.get("/healthz").status_code == 200
    assert "privrelease_redis_up 0.0" in api.client.get("/metrics").get_data(as_text=True)
    _restart(rig)
    return reads, fresh, str(uploaded.get_json()["id"])


def test_broker_down_refuses_releases_and_analyses_and_keeps_no_record(
        rig: dict[str, Any]) -> None:
    """Valkey up but the broker unreachable (its own host in production): a release is
    refunded at once and an analysis leaves no record stuck at "queued"."""
    flask_app: Flask = rig["app"]
    api = Api(flask_app.test_client())
    meta = {"name": "ages", "record_level": True, "budgets": {"interval_leakage": 1},
            "columns": {"age": {"type": "continuous", "bounds": [0, 100]}}}
    resp = api.upload("age\n" + "\n".join(str(20 + i % 50) for i in range(200)) + "\n", meta)
    assert resp.status_code == 201, resp.get_json()
    dataset = resp.get_json()["id"]
    body = {"dataset_id": dataset, "mechanism": "interval.case2",
            "budget": {"interval_leakage": 0.5},
            "params": {"column": "age", "anchors": {"family": "logistic", "loc": 40,
                                                    "scale": 40}}}
    resp = api.post("/v1/releases", body)
    assert resp.status_code == 202, resp.get_json()
    release = resp.get_json()["id"]
    assert api.wait(release)["status"] == "succeeded"
    measure = "interval_leakage:age"
    committed = api.get(f"/v1/datasets/{dataset}/budget").get_json()["measures"][measure]

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    cut_off = create_app(flask_app.config["PRIVRELEASE"])
    cut_off.extensions[wiring.EXTENSION] = dataclasses.replace(wiring.of(cut_off), queue=Queue(
        make_celery(dataclasses.replace(flask_app.config["PRIVRELEASE"], redis_url=dead))))
    broken = Api(cut_off.test_client())
    body["params"]["anchors"]["loc"] = 45
    _assert_unavailable(broken.post("/v1/releases", body), "release")
    row = api.get(f"/v1/datasets/{dataset}/budget").get_json()["measures"][measure]
    assert row == committed and row["reserved"] == 0.0  # refunded at once
    store = wiring.of(flask_app).analyses
    before = store.count(release)
    analyses = f"/v1/releases/{release}/analyses"
    _assert_unavailable(broken.post(analyses, {"analysis": "npmle", "params": {}}),
                        "analysis")
    assert store.count(release) == before
    assert not record_state.analysis_ids(store)


# -- PostgreSQL, the system of record ------------------------------------------------------



@contextlib.contextmanager
def _database_away(rig: dict[str, Any]) -> Iterator[Callable[[], None]]:
    """The rig's database stops answering when the yielded function is called (no new
    connection allowed, every open one ended), and answers again after the block; the
    server is the session's, so it is not stopped. The app's ledger (and its keys and
    analyses, on the same pool) meanwhile waits at most a second for a connection (its
    pool's usual wait is ten)."""
    url = rig["database_url"]
    name = urlsplit(url).path.lstrip("/")
    server = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    svc = wiring.of(rig["app"])
    ledger = svc.ledger
    assert isinstance(ledger, PgLedger)
    assert isinstance(svc.keys, PgKeyStore) and isinstance(svc.analyses, PgAnalysisStore)
    usual, short = ledger.pool, database.connect(url, max_size=2, timeout=1.0)
    ledger.pool = svc.keys.pool = svc.analyses.pool = short

    def cut() -> None:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))

    try:
        yield cut
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        ledger.pool = svc.keys.pool = svc.analyses.pool = usual
        short.close()


def _answers_again(api: Api, path: str, timeout: float = 30.0) -> Any:
    """The first answer to ``path`` that is not a 503 (the pool reconnects on its own)."""
    deadline = time.monotonic() + timeout
    while True:
        resp = api.get(path)
        if resp.status_code != 503 or time.monotonic() > deadline:
            return resp
        time.sleep(0.2)


def test_the_record_answers_503_while_the_database_is_away_then_recovers(
        rig: dict[str, Any]) -> None:
    """Catches a database outage answered 500 (a psycopg error unhandled) or hanging: every
    request that reads or writes the record (a dataset, its budget and ledger, a release,
    the lists, a new release, an upload, /readyz) answers 503 ``unavailable`` with
    Retry-After while the database takes no connection, and the same app, and the
    worker, carry on once it is back (their pools reconnect)."""
    api = Api(rig["app"].test_client())
    resp = api.upload(people_csv(50), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    dataset = resp.get_json()["id"]
    body = {"dataset_id": dataset, "mechanism": "geometric", "budget": {"epsilon": 0.5},
            "params": {"statistic": "count",
                       "condition": {"column": "age", "op": "ge", "value": 30}}}
    resp = api.post("/v1/releases", body)
    assert resp.status_code == 202, resp.get_json()
    release = resp.get_json()["id"]
    assert api.wait(release)["status"] == "succeeded"
    files_before = _files(rig["data_dir"])
    reads = [f"/v1/datasets/{dataset}", f"/v1/datasets/{dataset}/budget",
             f"/v1/datasets/{dataset}/ledger", "/v1/datasets", f"/v1/releases/{release}",
             "/v1/releases", f"/v1/releases?dataset_id={dataset}", "/v1/jobs"]
    with _database_away(rig) as cut:
        cut()
        for path in reads:
            _assert_unavailable(api.get(path), path)
        body["params"]["condition"]["value"] = 31
        _assert_unavailable(api.post("/v1/releases", body), "release")
        _assert_unavailable(api.client.get("/readyz"), "/readyz")
        assert api.client.get("/healthz").status_code == 200  # alive: do not restart it
    assert _files(rig["data_dir"]) == files_before
    row = _answers_again(api, f"/v1/datasets/{dataset}/budget").get_json()
    assert row["measures"]["epsilon"] == {"cap": 5.0, "committed": 0.5, "reserved": 0.0,
                                          "remaining": 4.5}  # nothing held by the refusal
    resp = api.post("/v1/releases", body)
    assert resp.status_code == 202, resp.get_json()
    assert api.wait(resp.get_json()["id"])["status"] == "succeeded"
    assert rig["worker"].poll() is None  # the worker's pool reconnected, it did not restart
    assert api.client.get("/readyz").status_code == 200


def test_upload_whose_registration_meets_a_dead_database_leaves_no_files(
        rig: dict[str, Any]) -> None:
    """The database goes away while the CSV is parsed (after authentication): the answer
    is a 503, nothing is registered, and the orphan sweep removes the files the upload
    kept (the record could not say whether the registration was stored)."""
    flask_app: Flask = rig["app"]
    api = Api(flask_app.test_client())
    files_before = _files(rig["data_dir"])
    datasets_before = api.get("/v1/datasets").get_json()
    staging = wiring.of(rig["app"]).datasets.staging_dir
    staged_before = set(staging.iterdir()) if staging.exists() else set()
    killed = threading.Event()

    with _database_away(rig) as cut:
        def cut_while_parsing() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if staging.exists() and any(p.name.startswith("stage-")
                                            for p in set(staging.iterdir()) - staged_before):
                    cut()
                    killed.set()
                    return
                time.sleep(0.002)

        watcher = threading.Thread(target=cut_while_parsing)
        watcher.start()
        resp = api.upload(people_csv(200_000), PEOPLE_META)  # parsing takes a while
        watcher.join(timeout=30)
    assert killed.is_set()
    _assert_unavailable(resp, "upload")

    assert _answers_again(api, "/v1/datasets").get_json() == datasets_before
    ledger = wiring.of(flask_app).ledger
    store = wiring.of(rig["app"]).datasets
    orphans = store.sweep_orphans(set(ledger.dataset_ids()), older_than=0)
    assert len(orphans) == 1
    assert _files(rig["data_dir"]) == files_before


def _beats_again(client: Any, name: str, beat: threading.Thread) -> None:
    """The heartbeat thread ``beat`` of worker ``name`` writes its key again after it is
    deleted, within three beats."""
    client.delete(rkeys.WORKERS + name)
    deadline = time.monotonic() + 3 * HEARTBEAT_SECONDS
    while not client.exists(rkeys.WORKERS + name):
        assert beat.is_alive() and time.monotonic() < deadline, "it beats no more"
        time.sleep(0.05)


def test_a_workers_heartbeat_outlives_a_sweep_that_met_a_dead_database(
        rig: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a heartbeat thread that survives only Valkey's errors: its sweep, which
    reads the record, met the database away (a PoolTimeout) and ended the thread, so the
    worker beat no more (``/readyz`` not ready for good) and swept no more. A heartbeat
    of the worker's (``workers.celery_app._beat``, in a thread here, on the rig's Valkey
    and database, sweeping every 0.2 s, its pool waiting a second) goes on beating
    through the outage and after it."""
    from workers import celery_app

    connect = database.connect
    monkeypatch.setattr(database, "connect",
                        lambda url, **kw: connect(url, **{**kw, "timeout": 1.0}))
    config = dataclasses.replace(rig["app"].config["PRIVRELEASE"], sweep_interval=0.2)
    client = rkeys.connect(rig["valkey"].connection_url + "/0")
    name = "beat-" + uuid.uuid4().hex[:8]
    stop = threading.Event()
    beat = threading.Thread(target=celery_app._beat, args=(config, name, stop), daemon=True)
    beat.start()
    try:
        deadline = time.monotonic() + 10
        while not client.exists(rkeys.WORKERS + name):
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.05)
        with _database_away(rig) as cut:
            cut()
            client.delete(sweeper.LOCK)  # the next sweep is this thread's, in the outage
            time.sleep(3)
            assert beat.is_alive(), "the heartbeat ended with the sweep's database error"
        _beats_again(client, name, beat)
    finally:
        stop.set()
        beat.join(timeout=30)


def test_a_workers_heartbeat_outlives_a_sweep_that_failed_otherwise(
        rig: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Catches a heartbeat thread that survives only the record's outages: its sweep met
    an error of another kind (here the schema of an older deployment: the tables the
    sweeper reads renamed away, so PostgreSQL answers UndefinedTable, a ProgrammingError)
    and the thread ended, so the worker beat and swept no more. The heartbeat logs the
    error by its type, beats on, and sweeps again once the tables are back."""
    from workers import celery_app

    config = dataclasses.replace(rig["app"].config["PRIVRELEASE"], sweep_interval=0.2)
    client = rkeys.connect(rig["valkey"].connection_url + "/0")
    name = "beat-" + uuid.uuid4().hex[:8]
    stop = threading.Event()
    beat = threading.Thread(target=celery_app._beat, args=(config, name, stop), daemon=True)
    tables = ("releases", "outbox")

    def rename(suffix_from: str, suffix_to: str) -> None:
        with psycopg.connect(rig["database_url"], autocommit=True) as conn:
            for table in tables:
                conn.execute(f"ALTER TABLE {table}{suffix_from} RENAME TO {table}{suffix_to}")

    def failures() -> int:
        return sum(r.getMessage() == "sweep failed" for r in caplog.records)

    caplog.set_level(logging.ERROR, logger="privrelease.worker")
    beat.start()
    try:
        rename("", "_away")
        try:
            deadline = time.monotonic() + 10
            while failures() < 2:  # two sweeps failed: the thread went on after the first
                assert beat.is_alive(), "the heartbeat ended with the sweep's error"
                assert time.monotonic() < deadline, "no sweep failed"
                client.delete(sweeper.LOCK)  # the next sweep is this thread's
                time.sleep(0.05)
            record = next(r for r in caplog.records if r.getMessage() == "sweep failed")
            assert record.__dict__["error_type"] == "UndefinedTable"
            _beats_again(client, name, beat)
        finally:
            rename("_away", "")
        failed = failures()
        client.delete(sweeper.LOCK)
        time.sleep(1.0)  # sweeps of the restored schema: none fails
        assert failures() == failed and beat.is_alive()
    finally:
        stop.set()
        beat.join(timeout=30)


class LosesCommitReplies:
    """A PgLedger's pool whose dataset registrations commit but whose reply is lost,
    ``cuts`` times in all: the transaction that inserted into ``datasets`` commits, then
    the caller sees the connection fail (as a server whose COMMIT reply never arrived),
    and ``PgLedger`` runs the step again."""

    def __init__(self, real: Any, cuts: int) -> None:
        self.real, self.cuts, self.cut = real, cuts, 0

    @contextlib.contextmanager
    def connection(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        seen: list[str] = []
        with self.real.connection(*args, **kwargs) as conn:
            yield _Watched(conn, seen)
        # the step's first run, or a re-run reading the answer the first one recorded
        cut = ("INSERT INTO datasets", "SELECT answer FROM step_calls")
        if any(q.startswith(cut) for q in seen) and self.cut < self.cuts:
            self.cut += 1  # committed above; the reply is lost
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _Watched:
    """A connection (or cursor) noting the statements its cursors execute."""

    def __init__(self, real: Any, seen: list[str]) -> None:
        self.real, self.seen = real, seen

    @contextlib.contextmanager
    def cursor(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with self.real.cursor(*args, **kwargs) as cur:
            yield _Watched(cur, self.seen)

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(str(query))
        return self.real.execute(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _losing_app(rig: dict[str, Any], cuts: int) -> tuple[Flask, LosesCommitReplies]:
    """An app of the rig's service whose ledger's registrations lose ``cuts`` replies."""
    fresh = create_app(rig["app"].config["PRIVRELEASE"])
    ledger = wiring.of(fresh).ledger
    assert isinstance(ledger, PgLedger)
    losing = LosesCommitReplies(ledger.pool, cuts)
    ledger.pool = losing  # type: ignore[assignment]
    return fresh, losing


def test_upload_whose_registration_reply_is_lost_once_is_registered_once_on_postgres(
        rig: dict[str, Any]) -> None:
    """The COMMIT's reply is lost, PgLedger runs the registration again, which finds it
    done: 201, and one cap event in the dataset's audit log (not two)."""
    fresh, losing = _losing_app(rig, cuts=1)
    try:
        resp = Api(fresh.test_client()).upload(people_csv(500), PEOPLE_META)
        assert resp.status_code == 201, resp.get_json()
        assert losing.cut == 1
    finally:
        losing.real.close()
    dataset = resp.get_json()["id"]
    events = Api(rig["app"].test_client()).get(f"/v1/datasets/{dataset}/ledger").get_json()
    assert [e["kind"] for e in events] == ["cap"]


def test_upload_whose_registration_reply_is_lost_keeps_its_files_on_postgres(
        rig: dict[str, Any]) -> None:
    """The database stores the registration but every reply is lost (each of PgLedger's
    runs of the step): the client hears 503, yet the dataset is registered, its files
    stay, and it works."""
    direct = Api(rig["app"].test_client())
    before = {d["id"] for d in direct.get("/v1/datasets").get_json()}
    fresh, losing = _losing_app(rig, cuts=RETRIES)
    try:
        resp = Api(fresh.test_client()).upload(people_csv(500), PEOPLE_META)
        _assert_unavailable(resp, "upload")
        assert losing.cut == RETRIES
    finally:
        losing.real.close()
    (dataset,) = {d["id"] for d in direct.get("/v1/datasets").get_json()} - before
    store = wiring.of(rig["app"]).datasets
    assert store.exists(dataset, 1)
    ledger = wiring.of(rig["app"]).ledger
    assert dataset not in store.sweep_orphans(set(ledger.dataset_ids()), older_than=0)
    assert [e["kind"] for e in direct.get(f"/v1/datasets/{dataset}/ledger").get_json()] == [
        "cap"]
    release = direct.post("/v1/releases", {
        "dataset_id": dataset, "mechanism": "geometric", "budget": {"epsilon": 0.5},
        "params": {"statistic": "count", "condition": {"column": "age", "op": "ge",
                                                       "value": 30}}})
    assert release.status_code == 202, release.get_json()
    assert direct.wait(release.get_json()["id"])["status"] == "succeeded"


def test_readyz_counts_only_heartbeats_of_the_current_valkey_run(
        app: Flask, tmp_path: Path) -> None:
    """A heartbeat restored from the AOF after a restart names the previous run: not ready
    until a worker has reconnected and beaten again. (No worker runs against this Valkey;
    the heartbeats are written here.)"""
    server = start_valkey(tmp_path)
    try:
        url = server.connection_url + "/0"
        client = rkeys.connect(url)
        probe = create_app(dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url))
        ready = probe.test_client().get("/readyz")
        assert ready.status_code == 503 and ready.get_json()["workers"] == 0
        client.set(rkeys.WORKERS + "restored", "run-id-of-the-previous-run", ex=10)
        ready = probe.test_client().get("/readyz")
        assert ready.status_code == 503 and ready.get_json()["workers"] == 0
        client.set(rkeys.WORKERS + "live", client.info("server")["run_id"], ex=10)
        ready = probe.test_client().get("/readyz")
        assert ready.status_code == 200 and ready.get_json()["workers"] == 1
    finally:
        server.stop()
