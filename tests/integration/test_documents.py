"""Release documents on disk (service.storage.release_documents): which run's files are
visible, and the files the sweeper prunes of runs that died."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from psycopg_pool import ConnectionPool

from service import wiring
from service.releases import documents, submit
from service.releases.run import settle_files
from service.storage import database, rkeys
from service.storage.ledger import Reservation
from service.storage.objects import LocalStore
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.release_tables import OutputStore
from service.storage.store import Store
from tests.conftest import database_on
from tests.integration.conftest import Api

#: a Valkey database of this module's own (the broker the sweeper reads)
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
    """A ``PgLedger`` on a database of the test's own, and a Valkey database (the
    broker's) beside it."""

    r: redis.Redis
    pool: ConnectionPool[Any]

    def ledger(self, docs: DocumentStore | None = None) -> Store:
        return PgLedger(self.pool, documents=docs)

    def lapse(self, release_id: str) -> None:
        """The run's lease lapses (its worker stalled or died)."""
        with self.pool.connection() as conn:
            done = conn.execute("UPDATE releases SET lease_until = now() - interval '1 second' "
                                "WHERE id = %s AND lease_until > now()", (release_id,))
            assert done.rowcount == 1


@pytest.fixture()
def backend(request: pytest.FixtureRequest,
            own: tuple[str, redis.Redis]) -> Iterator[Backend]:
    postgres_url: str = request.getfixturevalue("postgres_url")
    url = database_on(postgres_url, template=request.getfixturevalue("pg_template"))
    pool = database.connect(url, max_size=2)
    try:
        yield Backend(own[1], pool)
    finally:
        pool.close()
        _drop(postgres_url, urlsplit(url).path.lstrip("/"))


def _request_files(ledger: Store, release_id: str) -> list[str]:
    """The request file the record names: none (PostgreSQL keeps it in the row)."""
    assert ledger.kept_request(release_id) is None
    return []


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


class _Nowhere:
    """A broker that drops what it is sent (the sweep below sends nothing anyway)."""

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_the_sweeper_prunes_dead_runs_results(backend: Backend, tmp_path: Path) -> None:
    """A run wrote its result and died before committing; the sweeper's pass charges the
    job (``charge_gone``) and prunes: no result file stays (catches a sweeper that leaves
    dead runs' results on disk). The store is the test's own: the sweep walks every
    release in it."""
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
