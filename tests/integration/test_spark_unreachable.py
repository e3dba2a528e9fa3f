"""A Spark engine that is down (issue #30): a worker whose ``PRIVRELEASE_SPARK_REMOTE``
names a Spark Connect server that does not answer fails the release before it marks the
data read, within ``PRIVRELEASE_SPARK_CONNECT_TIMEOUT``, and the release is refunded
under the failure rule; pyspark alone retries such a server for over ten minutes, after
the read (charged). A worker of its own on a Valkey database and record of their own."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from service import wiring
from service.releases import submit
from tests.integration.conftest import PEOPLE_META, Api, people_csv
from tests.integration.record_state import field, worker_rig

DB = 13
LEASE = 10
#: the worker's connect timeout (seconds), and what a run may take beyond it: the
#: queue's delivery, closing the session, the refund and this test's polling
TIMEOUT, SLACK = 3.0, 4.0


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def rig(redis_url: str, service_env: dict[str, str], app: Flask,
        tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
        ) -> Iterator[dict[str, Any]]:
    env = {"PRIVRELEASE_SPARK_REMOTE": f"sc://127.0.0.1:{_closed_port()}",
           "PRIVRELEASE_SPARK_CONNECT_TIMEOUT": str(TIMEOUT)}
    with worker_rig(request, redis_url, service_env, app,
                    tmp_path_factory.mktemp("spark-down"), DB, LEASE, env) as made:
        made.start()
        yield {"api": Api(made.app.test_client()), "app": made.app, "log": made.log}


def _release(api: Api, ds: str) -> tuple[dict[str, Any], float]:
    """A streaming release (a mean: Spark's work when the engine answers), ended; and the
    seconds from its request to its end."""
    start = time.monotonic()
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age"},
                                     "budget": {"epsilon": 0.5}})
    assert resp.status_code == 202, resp.get_json()
    submit.flush_outbox()
    doc = api.wait(resp.get_json()["id"], timeout=TIMEOUT + 60)
    return doc, time.monotonic() - start


def test_an_unreachable_engine_fails_refunded_within_the_timeout(rig: dict[str, Any]) -> None:
    """Catches the first call to an ``sc://`` server that is down hanging the worker (no
    answer after 120 s) and a Spark failure counted after the read (charged): each of two
    releases ends failed before the read, refunded, within the timeout and some slack,
    the budget as it was and the ledger a reservation and its abort; the worker is free
    for the next."""
    api: Api = rig["api"]
    resp = api.upload(people_csv(200), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]
    before = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]
    ledger = wiring.of(rig["app"]).ledger
    for _ in range(2):
        doc, took = _release(api, ds)
        assert doc["status"] == "failed", doc
        assert doc["error"]["message"] == (
            "job failed before reading the data (SparkUnreachable); refunded")
        assert doc["result"] is None
        assert took < TIMEOUT + SLACK, took
        assert field(ledger, doc["id"], "data_read") is None
    after = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]
    assert after == before and after["epsilon"]["committed"] == 0.0
    assert after["epsilon"]["reserved"] == 0.0
    kinds = [e["kind"] for e in api.get(f"/v1/datasets/{ds}/ledger").get_json()]
    assert kinds == ["cap", "reserve", "abort", "reserve", "abort"]
    logged = rig["log"].read_text()
    assert "release failed before reading the data" in logged
    assert "SparkUnreachable" in logged
