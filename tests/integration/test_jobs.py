"""Jobs under fire: cancel with refund, a worker killed mid-task, the sweeper.

These tests run their own slow worker (each job sleeps once it has read its data, a test-only
fault-injection knob) against their own Valkey database (and, on PostgreSQL, their own
database: ``record_state.own_database``), so the shared worker of the session never sees
their jobs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from service import apikeys, wiring
from service.api.app import create_app
from service.releases.run import FAILED_AFTER_READ
from service.releases.sweeper import sweep
from service.storage import rkeys
from service.storage.ledger import Reservation
from tests.conftest import ROOT, wait_for_worker
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.record_state import (
    close,
    field,
    lapse,
    on_record,
    own_database,
    run_store,
)

LEASE = 2
DELAY = 3.0


@pytest.fixture(scope="module")
def slow(redis_url: str, service_env: dict[str, str], app: Flask,
         tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
         ) -> Iterator[tuple[Api, redis.Redis, dict]]:
    url = redis_url.rsplit("/", 1)[0] + "/3"
    db = own_database(request)
    client = rkeys.connect(url)
    client.flushdb()
    env = on_record({**service_env, "PRIVRELEASE_REDIS_URL": url,
                     "PRIVRELEASE_TEST_JOB_DELAY": str(DELAY),
                     "PRIVRELEASE_LEASE_SECONDS": str(LEASE),
                     "PRIVRELEASE_SWEEP_INTERVAL": "0.5"}, db)
    log = tmp_path_factory.mktemp("slow") / "worker.log"
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start() -> subprocess.Popen[bytes]:
        client.delete(*client.keys(rkeys.WORKERS + "*") or ["-"])
        with open(log, "ab") as fh:
            procs["worker"] = subprocess.Popen(
                [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "1",
                 "--queues", "releases"],
                env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        wait_for_worker(client)
        return procs["worker"]

    start()
    flask_app = create_app(dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url,
                                               database_url=db, lease_seconds=LEASE))
    apikeys.create(wiring.of(flask_app).keys, "operator", token=TOKEN)
    yield Api(flask_app.test_client()), client, {"start": start, "procs": procs, "log": log}
    procs["worker"].terminate()
    procs["worker"].wait(timeout=30)
    close(flask_app)


def _dataset(api: Api) -> str:
    resp = api.upload(people_csv(50), PEOPLE_META)
    assert resp.status_code == 201
    return str(resp.get_json()["id"])


def _release(api: Api, ds: str, value: int) -> str:
    resp = api.post("/v1/releases", {
        "dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": 0.5},
        "params": {"statistic": "count",
                   "condition": {"column": "age", "op": "ge", "value": value}}})
    assert resp.status_code == 202, resp.get_json()
    return str(resp.get_json()["id"])


def _until(api: Api, rid: str, statuses: set[str], timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc: dict[str, Any] = api.get(f"/v1/releases/{rid}").get_json()
        if doc["status"] in statuses:
            return doc
        time.sleep(0.05)
    raise TimeoutError(f"{rid} never reached {statuses}")


def _epsilon(api: Api, ds: str) -> dict[str, float]:
    row: dict[str, float] = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"][
        "epsilon"]
    return row


def test_cancel_refunds_queued_and_refuses_running(slow: Any) -> None:
    api, _, _ = slow
    ds = _dataset(api)
    first, second = _release(api, ds, 30), _release(api, ds, 31)
    _until(api, first, {"running"})
    jobs = {j["id"]: j["status"] for j in api.get("/v1/jobs").get_json()}
    assert jobs[first] == "running" and jobs[second] == "queued"
    assert _epsilon(api, ds)["reserved"] == 1.0

    resp = api.post(f"/v1/jobs/{first}/cancel", {})
    assert resp.status_code == 409 and resp.get_json()["code"] == "job_running"
    resp = api.post(f"/v1/jobs/{second}/cancel", {})
    assert resp.status_code == 200 and resp.get_json()["status"] == "cancelled"
    again = api.post(f"/v1/jobs/{second}/cancel", {})  # idempotent: a retried cancel
    assert again.status_code == 200 and again.get_json()["status"] == "cancelled"

    assert _until(api, first, {"succeeded"})["status"] == "succeeded"
    time.sleep(0.5)  # the cancelled message reaches the worker, which must skip it
    assert api.get(f"/v1/releases/{second}").get_json()["status"] == "cancelled"
    assert _epsilon(api, ds) == {"cap": 5.0, "committed": 0.5, "reserved": 0.0,
                                 "remaining": 4.5}
    kinds = [e["kind"] for e in api.get(f"/v1/datasets/{ds}/ledger").get_json()]
    assert kinds.count("commit") == 1 and kinds.count("cancel") == 1


def _pool_child(worker: subprocess.Popen[bytes]) -> int:
    children = Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_worker_killed_mid_task_ends_once_and_balances(slow: Any) -> None:
    api, _, ctl = slow
    ds = _dataset(api)
    rid = _release(api, ds, 40)
    _until(api, rid, {"running"})
    os.kill(_pool_child(ctl["procs"]["worker"]), signal.SIGKILL)
    doc = _until(api, rid, {"succeeded", "failed"}, timeout=60)
    row = _epsilon(api, ds)
    events = api.get(f"/v1/datasets/{ds}/ledger").get_json()
    commits = [e for e in events if e["kind"] == "commit"]
    # the message was redelivered, waited for the dead run's lease to lapse, and re-ran;
    # the sweeper leaves a job alone while its message exists
    assert doc["status"] == "succeeded", doc
    assert isinstance(doc["result"]["value"], int)
    assert row["committed"] == 0.5 and row["reserved"] == 0.0 and len(commits) == 1
    assert field(wiring.of(api.client.application).ledger, rid, "attempts") == "2"


def test_sweeper_resolves_reservations_whose_job_is_gone(slow: Any) -> None:
    """Which jobs are gone, with re-sends off (PRIVRELEASE_MAX_RESENDS=0: these stand-in
    releases cannot run; test_sweeper_resend.py re-sends real ones): each is refunded."""
    api, client, _ = slow
    ledger = run_store(api.client.application, LEASE)
    ds = _dataset(api)

    def reserve(name: str) -> str:
        rid = f"rel_sweep_{name}_{ds}"
        res = ledger.reserve(Reservation(
            ds, rid, {"epsilon": 10**8}, actor="key_t", fingerprint=rid,
                             request_json=json.dumps({"dataset_id": ds})))
        assert res.outcome == "reserved"
        return rid

    # reserved and sent (out of the outbox), but its message is in no queue: the broker
    # lost it. One still in the outbox is not lost but unsent (test_dataplane.py)
    lost = reserve("lost")
    ledger.enqueued(lost)
    dead = reserve("dead")  # running, but its worker died (no lease)
    assert ledger.mark_running(dead, "w")
    lapse(ledger, dead)
    alive = reserve("alive")  # running with a live lease: left alone
    alive_run = ledger.mark_running(alive, "w")
    assert alive_run is not None
    # running, lease lapsed, its message stuck in kombu's unacked set (the worker lost
    # Valkey before acknowledging): gone now, not after the visibility timeout
    stuck = reserve("stuck")
    assert ledger.mark_running(stuck, "w")
    lapse(ledger, stuck)
    # queued, its message prefetched (unacked) by a worker that may still start it: left alone
    prefetched = reserve("prefetched")
    tag = f"tag_{ds}"
    client.hset("unacked", mapping={f"{tag}_1": json.dumps({"id": stuck}),
                                    f"{tag}_2": json.dumps({"id": prefetched})})
    try:
        queue = wiring.of(api.client.application).queue
        assert sorted(sweep(client, ledger, queue, min_age=0, max_resends=0)
                      ) == sorted([lost, dead, stuck])
    finally:
        client.hdel("unacked", f"{tag}_1", f"{tag}_2")
    assert field(ledger, alive, "status") == "running"
    assert field(ledger, prefetched, "status") == "queued"
    assert json.loads(field(ledger, lost, "error") or "") == {
        "message": "job gone (job message lost) after 0 re-sends; reservation refunded"}
    assert ledger.abort(ds, prefetched, "{}", "test")
    assert _epsilon(api, ds)["reserved"] == 0.1 and _epsilon(api, ds)["committed"] == 0
    assert ledger.commit(ds, alive_run, "{}") == "settled"
    assert _epsilon(api, ds) == {"cap": 5.0, "committed": 0.1, "reserved": 0.0,
                                 "remaining": 4.9}


def test_sweeper_charges_a_job_whose_worker_died_after_reading(slow: Any) -> None:
    """Catches issue #14 finding 8 for dead workers: main's sweeper refunded every gone
    job, so a worker that died because of the data (a crash, memory) was a free probe.
    A job gone after its data_read marker is charged and says only "mechanism failed"."""
    api, client, _ = slow
    ledger = run_store(api.client.application, LEASE)
    ds = _dataset(api)
    rid = f"rel_read_{ds}"
    res = ledger.reserve(Reservation(ds, rid, {"epsilon": 10**8}, actor="key_t", fingerprint=rid,
                         request_json=json.dumps({"dataset_id": ds})))
    assert res.outcome == "reserved"
    run = ledger.mark_running(rid, "w")
    assert run is not None and ledger.mark_data_read(run)
    lapse(ledger, rid)  # its worker died after reading
    assert rid in sweep(client, ledger, wiring.of(api.client.application).queue, min_age=0)
    assert field(ledger, rid, "status") == "failed"
    assert json.loads(field(ledger, rid, "error") or "") == FAILED_AFTER_READ
    assert _epsilon(api, ds) == {"cap": 5.0, "committed": 0.1, "reserved": 0.0,
                                 "remaining": 4.9}
    events = api.get(f"/v1/datasets/{ds}/ledger").get_json()
    assert [(e["kind"], e.get("outcome")) for e in events] == [
        ("cap", None), ("reserve", None), ("commit", "failed")]
