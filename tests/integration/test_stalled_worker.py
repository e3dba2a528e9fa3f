"""A worker that stalls past its lease while its job runs again elsewhere: one output.

Real processes throughout: worker A (a ``privrelease worker``) reads the data of
a microdata release and is frozen with SIGSTOP before it stores anything; its
lease lapses; the job's message is sent again (as a re-send, or a message put back
by a broker, would be; the release workers keep no unacked record to restore) and
worker B runs the job again; A is thawed with
SIGCONT while B runs. Both runs compute an output, only one may become the
release. Runs sleep once they have read the data (``PRIVRELEASE_TEST_JOB_DELAY``)
so the freeze lands between the read and the commit.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from service import apikeys, wiring
from service.api.app import create_app
from service.storage import release_metrics, rkeys
from service.storage.store import Store
from tests.conftest import ROOT, until, wait_for_worker
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.record_state import close, field, on_record, own_database

LEASE = 2
DELAY = 3.0
DB = 4


def _pool_child(worker: subprocess.Popen[bytes]) -> int:
    children = Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.fixture()
def rig(redis_url: str, service_env: dict[str, str], app: Flask, data_dir: Path,
        tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Its own Valkey database (and record: ``record_state.own_database``), an app on
    it, and a way to start workers on it."""
    url = redis_url.rsplit("/", 1)[0] + f"/{DB}"
    db = own_database(request)
    client = rkeys.connect(url)
    client.flushdb()
    # no sweep during the test: the redelivery, not the sweeper, must meet the stalled job
    env = on_record({**service_env, "PRIVRELEASE_REDIS_URL": url,
                     "PRIVRELEASE_TEST_JOB_DELAY": str(DELAY),
                     "PRIVRELEASE_LEASE_SECONDS": str(LEASE),
                     "PRIVRELEASE_SWEEP_INTERVAL": "300"}, db)
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        client.delete(*client.keys(rkeys.WORKERS + "*") or ["-"])
        with open(tmp_path / f"{name}.log", "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "1",
                 "--queues", "releases"],
                env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        procs.append(proc)
        wait_for_worker(client)
        return proc

    flask_app = create_app(dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url,
                                               database_url=db, lease_seconds=LEASE))
    apikeys.create(wiring.of(flask_app).keys, "operator", token=TOKEN)
    try:
        yield {"api": Api(flask_app.test_client()), "client": client, "url": url,
               "app": flask_app,
               "ledger": wiring.of(flask_app).ledger,
               "start": start, "logs": tmp_path, "releases": data_dir / "releases"}
    finally:
        for proc in procs:
            for pid in [proc.pid, *_children(proc.pid)]:
                _signal(pid, signal.SIGCONT)
            proc.terminate()
            proc.wait(timeout=30)
        close(flask_app)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _redeliver(app: Flask, release_id: str) -> None:
    """The job's message once more: what the stalled worker popped is in no queue and no
    unacked set (the release workers run without kombu's acknowledgements)."""
    wiring.of(app).queue.run(release_id)


def _csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_stalled_worker_past_its_lease_yields_one_output_one_charge(
        rig: dict[str, Any]) -> None:
    """Catches issue #14 finding 6: on main the stalled run (lease lapsed, job re-run)
    still committed when it woke (settle did not check the lease) or rewrote the
    release's one table after the other run committed, so the inline records and /data
    came from two different runs (0 of 40 rows equal) for one charge."""
    api: Api = rig["api"]
    client: redis.Redis = rig["client"]
    ledger: Store = rig["ledger"]
    worker_a = rig["start"]("worker-a")
    resp = api.upload(people_csv(40), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "dip",
                                     "params": {"columns": ["income", "group"]},
                                     "budget": {"epsilon": 1}})
    assert resp.status_code == 202, resp.get_json()
    rid = resp.get_json()["id"]

    # A has read the data (the marker is written just before the read) and sleeps
    until(lambda: field(ledger, rid, "data_read"))
    stalled = [worker_a.pid, _pool_child(worker_a)]
    for pid in stalled:
        os.kill(pid, signal.SIGSTOP)
    try:
        worker_b = rig["start"]("worker-b")
        until(lambda: not ledger.lease_held(rid), timeout=LEASE + 5)  # lapsed
        _redeliver(rig["app"], rid)
        until(lambda: field(ledger, rid, "attempts") == "2")  # B runs it again
        assert field(ledger, rid, "status") == "running"
    finally:
        for pid in stalled:
            os.kill(pid, signal.SIGCONT)
    doc = api.wait(rid, timeout=30)
    # A wakes holding an output of its own; it must report that it lost the job
    lost = f"dip{release_metrics.SEP}lease_lost"
    until(lambda: client.hget(release_metrics.RELEASES, lost), timeout=DELAY + 15)
    assert worker_b.poll() is None and worker_a.poll() is None

    assert doc["status"] == "succeeded", doc
    records = doc["result"]["records"]
    assert len(records) == doc["result"]["n_records"] == 40
    data = api.get(f"/v1/releases/{rid}/data")
    assert data.status_code == 200
    rows = _csv_rows(data.get_data(as_text=True))
    assert rows == [{k: str(v) for k, v in rec.items()} for rec in records]

    events = api.get(f"/v1/datasets/{ds}/ledger").get_json()
    assert [e["kind"] for e in events] == ["cap", "reserve", "commit"]
    assert events[2]["outcome"] == "succeeded"
    row = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert row == {"cap": 5.0, "committed": 1.0, "reserved": 0.0, "remaining": 4.0}
    assert client.hget(release_metrics.RELEASES, lost) == "1"
    assert client.hget(release_metrics.RELEASES, f"dip{release_metrics.SEP}succeeded") == "1"
    # B's table is the release's; A's never became visible and is gone
    assert field(ledger, rid, "table") == "2"
    # so is A's result document: PostgreSQL keeps both in the row (B's commit wrote its
    # output, A's wrote nothing)
    assert field(ledger, rid, "result") is None
    kept = ledger.kept_request(rid)
    assert kept is None
    folder = rig["releases"] / rid
    assert not list(folder.iterdir() if folder.exists() else [])
    # the tables are objects of the service's store (the data directory by default)
    assert wiring.of(rig["app"]).outputs.store.versions(rid) == [2]
    assert "run lost its lease" in (rig["logs"] / "worker-a.log").read_text()
