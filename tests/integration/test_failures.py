"""Failures are no channel: after the data is read a failure is charged and says only
"mechanism failed"; before it, the job is refunded with its reason.

A worker of its own imports a test-only mechanism (``failing_mechanism``) whose run
raises a different exception, with a data value in its message, for different
data. The test process installs it too (for this module only) and submits releases the way
``POST /v1/releases`` does (prepare, reserve, enqueue): the request schema lists
only the service's own mechanisms.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from service import apikeys, wiring
from service.api.app import create_app
from service.releases import pricing, submit
from service.releases.run import FAILED_AFTER_READ, MAX_RUNS
from service.storage import rkeys
from service.storage.ledger import Reservation
from tests.conftest import ROOT, wait_for_worker
from tests.integration import failing_mechanism
from tests.integration.conftest import PEOPLE_META, TOKEN, Api
from tests.integration.record_state import close, field, lapse, on_record, own_database

DB = 5
BOOT = ("import tests.integration.failing_mechanism as m; m.install()\n"
        "from workers.__main__ import main\n"
        "raise SystemExit(main(['--concurrency', '1']))")


@pytest.fixture(scope="module")
def rig(redis_url: str, service_env: dict[str, str], app: Flask, data_dir: Path,
        tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
        ) -> Iterator[dict[str, Any]]:
    url = redis_url.rsplit("/", 1)[0] + f"/{DB}"
    db = own_database(request)
    client = rkeys.connect(url)
    client.flushdb()
    failing_mechanism.install()
    log = tmp_path_factory.mktemp("failures") / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen([sys.executable, "-c", BOOT], cwd=ROOT, stdout=fh,
                                  stderr=subprocess.STDOUT,
                                  env=on_record({**service_env,
                                                 "PRIVRELEASE_REDIS_URL": url}, db))
    try:
        wait_for_worker(client)
        flask_app = create_app(dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url,
                                                   database_url=db))
        apikeys.create(wiring.of(flask_app).keys, "operator", token=TOKEN)
        yield {"app": flask_app, "api": Api(flask_app.test_client()), "log": log,
               "store": wiring.of(flask_app).datasets}
        close(flask_app)
    finally:
        failing_mechanism.uninstall()
        worker.terminate()
        worker.wait(timeout=30)


def _dataset(api: Api, ages: list[int]) -> str:
    csv = "age,income,group\n" + "".join(f"{a},1.5,a\n" for a in ages)
    resp = api.upload(csv, PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def _submit(flask_app: Flask, ds: str) -> str:
    """What POST /v1/releases does once its body passed the schema."""
    ledger = wiring.of(flask_app).ledger
    prepared = pricing.prepare(ledger, {
        "dataset_id": ds, "mechanism": failing_mechanism.NAME, "params": {"column": "age"},
        "budget": {"epsilon": 0.5}}, allow_seeds=False)
    rid = submit.new_id()
    res = ledger.reserve(Reservation(ds, rid, prepared.cost_units, actor="key_test",
                         fingerprint=prepared.fingerprint, request_json=prepared.job().to_json()))
    assert res.outcome == "reserved"
    wiring.of(flask_app).queue.run(rid)
    return rid


def test_failure_after_reading_is_charged_and_says_only_mechanism_failed(
        rig: dict[str, Any]) -> None:
    """Catches issue #14 finding 8: main refunded a job that failed after reading the data
    and returned "mechanism failed (<exception type>)", so which exception the data caused
    (here ValueError for a high mean, ZeroDivisionError for a low one) and whether it
    failed at all cost nothing to learn."""
    api: Api = rig["api"]
    low, high = _dataset(api, [20 + i % 20 for i in range(60)]), _dataset(api, [90] * 60)
    docs = [api.wait(_submit(rig["app"], ds)) for ds in (low, high)]
    for ds, doc in zip((low, high), docs, strict=True):
        assert doc["status"] == "failed", doc
        assert doc["error"] == {"code": "mechanism_failed", "message": "mechanism failed"}
        assert doc["result"] is None
        row = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
        assert row == {"cap": 5.0, "committed": 0.5, "reserved": 0.0, "remaining": 4.5}
        events = api.get(f"/v1/datasets/{ds}/ledger").get_json()
        assert [(e["kind"], e.get("outcome")) for e in events] == [
            ("cap", None), ("reserve", None), ("commit", "failed")]
        assert events[2]["amounts"] == {"epsilon": 0.5}
    assert docs[0]["error"] == docs[1]["error"]
    ledger = wiring.of(rig["app"]).ledger
    assert all(field(ledger, d["id"], "data_read") == "1" for d in docs)
    logged = rig["log"].read_text()
    assert "ValueError" in logged and "ZeroDivisionError" in logged  # operators see the type
    assert failing_mechanism.SECRET not in logged  # never the message (it holds data)


def test_dataset_files_missing_before_reading_is_refunded(rig: dict[str, Any]) -> None:
    """A job that fails before it reads anything (its dataset's files are gone) is refunded
    and says why; main failed it inside the read (FileNotFoundError), as any other error."""
    api: Api = rig["api"]
    ds = _dataset(api, [30] * 20)
    assert rig["store"].remove(ds, 1)
    resp = api.post("/v1/releases", {
        "dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": 0.5},
        "params": {"statistic": "count",
                   "condition": {"column": "age", "op": "ge", "value": 30}}})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "failed"
    assert doc["error"]["message"] == (
        "job failed before reading the data (FileNotFoundError); refunded")
    row = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert row == {"cap": 5.0, "committed": 0.0, "reserved": 0.0, "remaining": 5.0}
    kinds = [e["kind"] for e in api.get(f"/v1/datasets/{ds}/ledger").get_json()]
    assert kinds == ["cap", "reserve", "abort"]
    assert field(wiring.of(rig["app"]).ledger, doc["id"], "data_read") is None


def test_runs_that_keep_dying_after_reading_end_charged(rig: dict[str, Any]) -> None:
    """A job whose runs read the data and died MAX_RUNS times (here: runs that took the
    lease, marked the read, and vanished) is charged and failed by its next run instead of
    run again: on main a crash the data causes was redelivered and re-run forever."""
    api: Api = rig["api"]
    flask_app: Flask = rig["app"]
    ledger = wiring.of(flask_app).ledger
    ds = _dataset(api, [30] * 20)
    rid = submit.new_id()
    prepared = pricing.prepare(ledger, {
        "dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": 0.5},
        "params": {"statistic": "count", "condition": {"column": "age", "op": "ge",
                                                       "value": 30}}}, allow_seeds=False)
    assert ledger.reserve(Reservation(ds, rid, prepared.cost_units, actor="key_test",
                          fingerprint=prepared.fingerprint,
                          request_json=prepared.job().to_json())).outcome == "reserved"
    for _ in range(MAX_RUNS):
        run = ledger.mark_running(rid, "dead-worker")
        assert run is not None and ledger.mark_data_read(run)
        lapse(ledger, rid)
    wiring.of(flask_app).queue.run(rid)
    doc = api.wait(rid)
    assert doc["status"] == "failed" and doc["error"] == FAILED_AFTER_READ
    assert field(ledger, rid, "attempts") == str(MAX_RUNS + 1)
    row = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert row == {"cap": 5.0, "committed": 0.5, "reserved": 0.0, "remaining": 4.5}
