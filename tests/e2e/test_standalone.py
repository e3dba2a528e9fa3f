"""End to end: `privrelease standalone` (embedded Valkey + worker + gunicorn) over HTTP."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import TOKEN, Service


def test_release_over_http(service: Service) -> None:
    ds = service.upload({"epsilon": 2})
    resp = service.call("POST", "/v1/releases", json={
        "dataset_id": ds, "mechanism": "laplace",
        "params": {"statistic": "mean", "column": "x"}, "budget": {"epsilon": 1}})
    assert resp.status_code == 202, resp.text
    doc = service.wait(resp.json()["id"])
    assert doc["status"] == "succeeded"
    assert abs(doc["result"]["value"] - 0.45) < 50 * doc["accuracy"]["scale"]
    assert "operator key: registered from PRIVRELEASE_BOOTSTRAP_KEY" in service.banner
    assert TOKEN not in service.banner


def test_200_concurrent_requests_exactly_50_accepted(service: Service) -> None:
    ds = service.upload({"epsilon": 5})
    statuses: list[int] = []

    def one(i: int) -> int:
        body = {"dataset_id": ds, "mechanism": "geometric",
                "params": {"statistic": "count",
                           "condition": {"column": "x", "op": "ge", "value": i / 1000}},
                "budget": {"epsilon": 0.1}}
        return service.call("POST", "/v1/releases", json=body).status_code

    with ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(one, range(200)))
    assert statuses.count(202) == 50 and statuses.count(409) == 150
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        row = service.call("GET", f"/v1/datasets/{ds}/budget").json()["measures"]["epsilon"]
        if row["reserved"] == 0:
            break
        time.sleep(0.2)
    assert row == {"cap": 5.0, "committed": 5.0, "reserved": 0.0, "remaining": 0.0}


def test_metrics_and_request_ids_under_gunicorn(service: Service) -> None:
    """gunicorn's workers share the multiprocess directory: /metrics from any of
    them counts the requests all of them served."""

    def healthz_count() -> float:
        text = requests.get(service.url + "/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "privrelease_http_requests_total" and s.labels == {
                        "method": "GET", "route": "/healthz", "status": "200"}:
                    return float(s.value)
        return 0.0

    before = healthz_count()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: requests.get(service.url + "/healthz",
                                                        timeout=10).status_code, range(40)))
    assert statuses == [200] * 40
    assert [healthz_count() for _ in range(4)] == [before + 40] * 4
    resp = service.call("GET", "/v1/nowhere", headers={"X-Request-ID": "e2e-1"})
    assert resp.headers["X-Request-ID"] == "e2e-1" and resp.json()["request_id"] == "e2e-1"


def test_restart_keeps_datasets_ledger_and_releases(service: Service) -> None:
    ds = service.upload({"epsilon": 3})
    resp = service.call("POST", "/v1/releases", json={
        "dataset_id": ds, "mechanism": "laplace",
        "params": {"statistic": "sum", "column": "x"}, "budget": {"epsilon": 1.5}})
    rid = resp.json()["id"]
    before = service.wait(rid)
    url = service.database_url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE e2e_restart (note text)")
        conn.execute("INSERT INTO e2e_restart VALUES ('before the restart')")
    assert service.stop() == 0
    assert "privrelease stopped" in service.banner
    service.start()
    # the embedded PostgreSQL's cluster too: the same one, with the row written before
    assert service.banner.count(f"PostgreSQL: {url} (embedded)") == 2
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT note FROM e2e_restart").fetchall() == [
            ("before the restart",)]
    assert service.call("GET", f"/v1/datasets/{ds}").status_code == 200
    assert service.call("GET", f"/v1/releases/{rid}").json()["result"] == before["result"]
    row = service.call("GET", f"/v1/datasets/{ds}/budget").json()["measures"]["epsilon"]
    assert row["committed"] == 1.5
