"""Release documents on disk (service.storage.release_documents): which run's files are visible, the
request kept when it changed under a settle, migration of documents held in Valkey, and
list pages that read only their own documents."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from psycopg_pool import ConnectionPool

from service import analyses, wiring
from service.releases import documents, submit
from service.releases.run import settle_files
from service.storage import database, rkeys
from service.storage.analysis_store import AnalysisStore
from service.storage.ledger import Ledger, Reservation
from service.storage.objects import LocalStore
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import (
    RESULT_ATTEMPT,
    DocumentStore,
    migrate,
    prune_swept,
)
from service.storage.release_tables import OutputStore
from service.storage.store import Store
from service.storage.valkey_analyses import ValkeyAnalysisStore
from tests.conftest import ROOT, database_on
from tests.integration.conftest import Api

#: a Valkey database of this module's own: the migration walks every release in it
DB = 12

REQUEST = json.dumps({"dataset_id": "ds_0000000000000001", "dataset_version": 1,
                      "mechanism": "laplace", "params": {"statistic": "mean", "column": "age"},
                      "cost": {"epsilon": "1/2"}, "cost_units": {"epsilon": 500000000},
                      "accuracy": {"ci95_halfwidth": 3.0, "statement": "s" * 200},
                      "seed": None, "callback_url": None, "privacy": {"notions": ["dp"]}})


def _output(value: float) -> str:
    return json.dumps({"result": {"value": value}, "accuracy": {"ci95_halfwidth": 3.0},
                       "guarantee": "pure epsilon-DP"})


@pytest.fixture()
def own(redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = redis_url.rsplit("/", 1)[0] + f"/{DB}"
    client = rkeys.connect(url)
    client.flushdb()
    yield url, client
    client.flushdb()


@pytest.fixture(scope="module")
def pg_template(postgres_url: str) -> Iterator[str]:
    """A database migrated to head, the template each PostgreSQL test's own is copied from."""
    url = database_on(postgres_url)
    database.upgrade(url)
    name = urlsplit(url).path.lstrip("/")
    yield name
    _drop(postgres_url, name)


def _drop(postgres_url: str, name: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@dataclass
class Backend:
    """A store of the test's own (the Valkey ``Ledger`` on the module's database, or a
    ``PgLedger`` on a database of its own), and the Valkey database beside it."""

    r: redis.Redis
    pool: ConnectionPool[Any] | None

    def ledger(self, docs: DocumentStore | None = None) -> Store:
        if self.pool is not None:
            return PgLedger(self.pool, documents=docs)
        return Ledger(self.r, documents=docs)

    def lapse(self, release_id: str) -> None:
        """The run's lease lapses (its worker stalled or died)."""
        if self.pool is None:
            assert self.r.delete(rkeys.lease(release_id)) == 1
            return
        with self.pool.connection() as conn:
            done = conn.execute("UPDATE releases SET lease_until = now() - interval '1 second' "
                                "WHERE id = %s AND lease_until > now()", (release_id,))
            assert done.rowcount == 1


@pytest.fixture(params=[pytest.param("valkey", marks=pytest.mark.valkey_store), "postgres"])
def backend(request: pytest.FixtureRequest,
            own: tuple[str, redis.Redis]) -> Iterator[Backend]:
    if request.param == "valkey":
        yield Backend(own[1], None)
        return
    postgres_url: str = request.getfixturevalue("postgres_url")
    url = database_on(postgres_url, template=request.getfixturevalue("pg_template"))
    pool = database.connect(url, max_size=2)
    try:
        yield Backend(own[1], pool)
    finally:
        pool.close()
        _drop(postgres_url, urlsplit(url).path.lstrip("/"))


def _request_files(ledger: Store, release_id: str) -> list[str]:
    """The request file the record names: the Valkey store moves a settled release's
    request to one (it must name it); PostgreSQL keeps it in the row (none)."""
    sha = ledger.kept_request(release_id)
    assert (sha is not None) == isinstance(ledger, Ledger)
    return [] if sha is None else [f"request.{sha}.json"]


def _reserved(ledger: Store, request: str = REQUEST, mode: Any = "new") -> tuple[str, str]:
    ds = "ds_" + secrets.token_hex(6)
    ledger.open(ds, {"epsilon": 10**10}, "op")
    rid = submit.new_id()
    res = ledger.reserve(Reservation(ds, rid, {} if mode == "pricing" else {"epsilon": 500000000},
                         actor="key_a", fingerprint=secrets.token_hex(8),
                         request_json=request, mode=mode, replay=mode != "pricing"))
    assert res.outcome in {"reserved", "pricing"}
    return ds, rid


def test_only_the_run_settle_recorded_is_ever_read(backend: Backend, tmp_path: Path) -> None:
    """A run that stalled past its lease wrote its result file; the run that took the job
    over commits: the document is the second run's, the first run's file is removed by the
    winner, and the stalled run's late commit changes nothing and keeps nothing."""
    docs, outputs = DocumentStore(tmp_path), OutputStore(LocalStore(tmp_path / "objects"))
    ledger = backend.ledger(docs)
    ds, rid = _reserved(ledger)
    stalled = ledger.mark_running(rid, "host")
    assert stalled is not None and ledger.mark_data_read(stalled)
    docs.save_result(rid, stalled.attempt, _output(1.0))
    backend.lapse(rid)  # its lease lapsed
    taken = ledger.mark_running(rid, "host")
    assert taken is not None and taken.attempt == 2 and ledger.mark_data_read(taken)
    docs.save_result(rid, taken.attempt, _output(2.0))
    with pytest.raises(FileExistsError):  # a run's output is never replaced
        docs.save_result(rid, taken.attempt, _output(3.0))
    outcome = ledger.commit(ds, taken, "", None, result_stored=True)
    settle_files(ledger, docs, outputs, taken, outcome, None)
    assert outcome == "settled"
    assert sorted(p.name for p in docs.folder(rid).iterdir()) == sorted(
        [*_request_files(ledger, rid), "result.2.json"])
    late = ledger.commit(ds, stalled, "", None, result_stored=True)
    settle_files(ledger, docs, outputs, stalled, late, None)
    assert late == "ended"
    doc = documents.document(backend.ledger(docs), rid)
    assert doc is not None and doc["result"] == {"value": 2.0}
    assert doc["accuracy"] == {"ci95_halfwidth": 3.0}  # the output's, not the estimate's
    assert not (docs.folder(rid) / "result.1.json").exists()


@pytest.mark.valkey_store  # the Valkey store's settle moving the hash's request to a file
def test_a_request_rewritten_under_the_settle_stays_in_valkey(own: tuple[str, redis.Redis],
                                                              tmp_path: Path) -> None:
    """Catches a settle that drops the hash's request for a copy of another version: a
    ``pricing`` release's request is rewritten when its pricing job reserves it; a cancel
    that stored the old version must not replace the new one by it."""
    _, r = own
    rewritten = json.dumps({**json.loads(REQUEST), "params": {"statistic": "sum",
                                                              "column": "age"}})

    class Concurrent(DocumentStore):
        """The pricing job's reserve lands between the store and the settle script."""

        def save_request(self, release_id: str, request_json: str) -> str:
            sha = super().save_request(release_id, request_json)
            r.hset(rkeys.release(release_id), "request", rewritten)
            return sha

    docs = Concurrent(tmp_path)
    ledger = Ledger(r, documents=docs)
    ds, rid = _reserved(ledger)
    assert ledger.cancel(ds, rid, "op") == "settled"
    h = r.hgetall(rkeys.release(rid))
    assert h["status"] == "cancelled" and h["request"] == rewritten and "doc" not in h
    doc = documents.document(Ledger(r, documents=docs), rid)
    assert doc is not None and doc["params"] == {"statistic": "sum", "column": "age"}


@pytest.mark.valkey_store  # documents held in Valkey release hashes, moved to disk
def test_migrate_outputs_moves_documents_held_in_valkey(own: tuple[str, redis.Redis],
                                                        tmp_path: Path) -> None:
    """Releases finished before the document store (request and output in the hash) read
    as before, and ``privrelease migrate-outputs`` moves them to disk: same documents, a
    compact hash; pending releases stay; a second run moves nothing."""
    url, r = own
    legacy = Ledger(r)  # no document store: settles as the code before it did
    ds, done_rid = _reserved(legacy)
    run = legacy.mark_running(done_rid, "w")
    assert run is not None and legacy.commit(ds, run, _output(4.0)) == "settled"
    _, pending_rid = _reserved(legacy)
    store = ValkeyAnalysisStore(r)
    analysis_id = analyses.create(store, done_rid, "a", {}, [], "key_a")
    assert analyses.start(store, analysis_id, 60) is not None
    assert analyses.finish(store, analysis_id, result_json='{"estimate": 1.5}')
    docs = DocumentStore(tmp_path / "releases")
    # read from the hash (fallback)
    before = documents.document(Ledger(r, documents=docs), done_rid)
    assert before is not None and before["result"] == {"value": 4.0}
    assert r.object("encoding", rkeys.release(done_rid)) == "hashtable"

    env = {**os.environ, "PRIVRELEASE_REDIS_URL": url, "PRIVRELEASE_DATA_DIR": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "service.processes.cli", "migrate-outputs"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "moved 1 release(s) and 1 analysis result(s)" in proc.stdout, proc.stdout

    h = r.hgetall(rkeys.release(done_rid))
    assert not {"request", "output", "replay_key"} & set(h) and h["result"] == "0"
    assert r.object("encoding", rkeys.release(done_rid)) == "listpack"
    assert documents.document(Ledger(r, documents=docs), done_rid) == before
    assert r.hget(rkeys.release(pending_rid), "request") == REQUEST  # still pending: stays
    moved = r.hgetall(rkeys.analysis(analysis_id))
    assert "result" not in moved and moved["stored"] == "1"
    ana = analyses.document(store, analysis_id, docs)
    assert ana is not None and ana["result"] == {"estimate": 1.5}
    again = migrate(r, docs)
    assert (again.releases, again.analyses) == (0, 0)


@pytest.mark.valkey_store  # results as files (on PostgreSQL a summary's is in its row)
def test_list_pages_read_only_their_own_documents(api: Api, dataset: dict[str, Any],
                                                  worker: Any, app: Any,
                                                  analysis_store: AnalysisStore,
                                                  tmp_path: Path) -> None:
    """A page of N releases reads N documents: with the files of every older release
    gone, the newest page of the dataset's list and of the key's own list still answers
    (any read of another document would fail), and so does a page of analyses."""
    ids = []
    for eps in (0.01, 0.02, 0.03, 0.04):
        resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                         "params": {"statistic": "mean", "column": "age"},
                                         "budget": {"epsilon": eps}})
        assert resp.status_code == 202, resp.get_json()
        ids.append(resp.get_json()["id"])
        assert api.wait(ids[-1])["status"] == "succeeded"
    docs: DocumentStore = wiring.of(app).documents
    aside = tmp_path / "aside"
    aside.mkdir()
    for rid in ids[:2]:  # moved away for the reads below, back after (the session's)
        fields = wiring.of(app).ledger.release(rid)
        assert fields is not None and fields[RESULT_ATTEMPT] == "1"  # its output: a file
        shutil.move(docs.folder(rid), aside / rid)
    try:
        resp = api.get(f"/v1/releases?dataset_id={dataset['id']}&limit=2")
        assert resp.status_code == 200
        assert [d["id"] for d in resp.get_json()] == ids[:1:-1]
        assert "X-Next-Cursor" in resp.headers
        resp = api.get("/v1/releases?mine=true&limit=2")
        assert resp.status_code == 200
        assert [d["id"] for d in resp.get_json()] == ids[:1:-1]
    finally:
        for rid in ids[:2]:
            shutil.move(aside / rid, docs.folder(rid))
    resp = api.get(f"/v1/releases?dataset_id={dataset['id']}&limit=10")
    assert [d["id"] for d in resp.get_json()] == ids[::-1]  # all readable again

    made = []
    for _ in range(3):
        aid = analyses.create(analysis_store, ids[-1], "x", {}, [], "key_a")
        assert analyses.start(analysis_store, aid, 60) is not None
        assert analyses.finish(analysis_store, aid, result_json=json.dumps({"n": aid}), docs=docs,
                               release_id=ids[-1])
        made.append(aid)
    docs.discard_analysis(ids[-1], made[0])
    items, cursor = analyses.page(analysis_store, ids[-1], 2, None, docs)
    assert [a["id"] for a in items] == made[:0:-1] and cursor is not None
    assert [a["result"] for a in items] == [{"n": aid} for aid in made[:0:-1]]
    analyses.discard(analysis_store, ids[-1], made[0])  # leave the session's lists all readable


class _Nowhere:
    """A broker that drops what it is sent (the sweep below sends nothing anyway)."""

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_prune_swept_removes_dead_runs_results(backend: Backend, tmp_path: Path) -> None:
    """A run wrote its result and died before committing; the sweeper's pass charges the
    job (``charge_gone``; the Valkey store moves the request to a file) and prunes: no
    result file stays, the request's file does (catches a sweeper that leaves dead runs'
    results on disk). The store is the test's own: the sweep walks every release in it."""
    from service.releases import sweeper
    from service.releases.queue import Queue

    r = backend.r
    docs = DocumentStore(tmp_path)
    ledger = backend.ledger(docs)
    _, rid = _reserved(ledger)
    ledger.enqueued(rid)  # its task was sent
    run = ledger.mark_running(rid, "host")
    assert run is not None and ledger.mark_data_read(run)
    docs.save_result(rid, run.attempt, _output(5.0))
    backend.lapse(rid)  # the worker died
    assert sweeper.sweep(r, ledger, Queue(_Nowhere()), min_age=0) == [rid]
    kept = _request_files(ledger, rid)
    assert sorted(p.name for p in docs.folder(rid).iterdir()) == kept
    # idempotent: nothing left to remove (the sweeper's prune again)
    assert docs.prune(rid, keep_result=None, keep_request=ledger.kept_request(rid)) == []
    if isinstance(ledger, Ledger):
        assert prune_swept(r, docs, rid) == []
    doc = documents.document(backend.ledger(docs), rid)
    assert doc is not None and doc["status"] == "failed" and doc["result"] is None
    assert doc["params"] == json.loads(REQUEST)["params"]


def test_a_redelivered_task_of_an_ended_release_is_skipped(
        api: Api, dataset: dict[str, Any], worker: Any, service_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a redelivered run of a finished release read as 'missing' (and logged as
    not found) once its request left the hash: it ended, so it is 'skipped'."""
    from service.config import Config
    from service.releases import run

    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age"},
                                     "budget": {"epsilon": 0.01}})
    rid = resp.get_json()["id"]
    assert api.wait(rid)["status"] == "succeeded"
    for name, value in service_env.items():
        monkeypatch.setenv(name, value)
    svc = wiring.build(Config.from_env(), "worker")  # a worker's, from its environment
    assert run.execute(svc, rid, "redelivered") == "skipped"
    assert run.execute(svc, submit.new_id(), "redelivered") == "missing"


@pytest.mark.valkey_store  # results as files (on PostgreSQL a summary's is in its row)
def test_a_missing_document_answers_503_not_500_or_404(api: Api, dataset: dict[str, Any],
                                                       worker: Any, app: Any,
                                                       tmp_path: Path) -> None:
    """Catches a release whose files are missing (the shared folder not mounted here)
    answered 500 ``internal_error`` (an unhandled LookupError), or 404 (a lie: the release
    exists and was paid for): 503 ``storage_unavailable`` with Retry-After, no path in the
    body, for the release, a list page that holds it, and an analysis asked of it; the
    same requests answer again once the files are back."""
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age"},
                                     "budget": {"epsilon": 0.01}})
    assert resp.status_code == 202, resp.get_json()
    rid = resp.get_json()["id"]
    assert api.wait(rid)["status"] == "succeeded"
    docs: DocumentStore = wiring.of(app).documents
    shutil.move(docs.folder(rid), tmp_path / rid)
    try:
        for resp in (api.get(f"/v1/releases/{rid}"),
                     api.get(f"/v1/releases?dataset_id={dataset['id']}&limit=1"),
                     api.post(f"/v1/releases/{rid}/analyses",
                              {"analysis": "confidence_interval", "params": {}})):
            body = resp.get_json()
            assert resp.status_code == 503, body
            assert body["code"] == "storage_unavailable" and "Retry-After" in resp.headers
            assert str(docs.root) not in json.dumps(body)
    finally:
        shutil.move(tmp_path / rid, docs.folder(rid))
    assert api.get(f"/v1/releases/{rid}").get_json()["status"] == "succeeded"
