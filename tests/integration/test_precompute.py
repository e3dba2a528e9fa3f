"""Heavy cost computations never run on an API thread (issue #15 item 2).

On the old code a cold calibration ran in the request thread (or answered 503 busy): a
cold release answered 202 ``queued`` only after seconds of CPU in the API, and a cold
estimate 200 after the same. Here a cold one is 202 ``pricing`` at once, a worker
computes it, reserves once through the same reserve script and runs the release, or
ends it ``refused`` exactly as the synchronous POST would have answered. Each test
below fails on the old code (no ``pricing`` status, no pricing job).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
import requests
from flask import Flask

from mechanisms import precompute
from mechanisms.interval import entries as interval_entries
from service import apikeys, wiring
from service.api.app import create_app
from service.releases import pricing, queue, submit
from service.releases.queue import PRICING_QUEUE, RELEASES_QUEUE, Queue
from service.releases.sweeper import send_outbox, sweep
from service.storage import database, rkeys
from service.storage.ledger import Reservation
from service.storage.pg_ledger import PgLedger
from service.storage.store import ReleaseView, Store

from ..conftest import ROOT
from .conftest import TOKEN, Api
from .record_state import field, own_database

META: dict[str, Any] = {
    "name": "heights", "budgets": {"interval_leakage": 0.9}, "record_level": True,
    "columns": {"h": {"type": "continuous", "bounds": [100, 220],
                      "prior": {"family": "normal", "loc": 170, "scale": 10}}}}
CSV = "h\n" + "\n".join(str(150 + i % 40) for i in range(300)) + "\n"


def _upload(api: Api, budgets: dict[str, float] | None = None) -> str:
    meta = {**META, "budgets": budgets or META["budgets"]}
    resp = api.upload(CSV, meta)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


@pytest.fixture()
def heights(api: Api) -> str:
    return _upload(api)


def _fresh_budget() -> float:
    """A budget no other test (or run against the same data dir) used: a cold request."""
    return 0.1 + (uuid.uuid4().int % 10**6) / 10**8


def _calibrated(dataset_id: str, budget: float) -> dict[str, Any]:
    """A calibrated Case-I request; a fresh budget makes it cold."""
    return {"dataset_id": dataset_id, "mechanism": "interval.case1",
            "params": {"column": "h", "calibrate": True},
            "budget": {"interval_leakage": budget}}


def _until(api: Api, release_id: str, done: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc: dict[str, Any] = api.get(f"/v1/releases/{release_id}").get_json()
        if doc["status"] in done:
            return doc
        time.sleep(0.05)
    raise TimeoutError(release_id)


def _estimate_until_warm(api: Api, body: dict[str, Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = api.post("/v1/releases/estimate", body)
        if resp.status_code != 202:
            return resp
        time.sleep(0.1)
    raise TimeoutError("estimate stayed cold")


def _units(events: list[dict[str, Any]], kind: str) -> list[dict[str, int]]:
    return [e["units"] for e in events if e["kind"] == kind]


def test_a_cold_estimate_is_a_job_and_its_retry_is_warm(app: Flask, api: Api, heights: str,
                                                        worker: Any) -> None:
    """Cold: 202 pricing with Retry-After at once (nothing computed in the API); the job
    fills the shared store, the retry answers 200 from it (a hit, in a process without
    the plan in memory), with the cost the warm path computes."""
    body = _calibrated(heights, _fresh_budget())
    misses = precompute.STATS.misses
    first = api.post("/v1/releases/estimate", body)
    assert first.status_code == 202, first.get_json()
    assert first.get_json()["status"] == "pricing"
    assert int(first.headers["Retry-After"]) >= 1
    warm = _estimate_until_warm(api, body)
    assert warm.status_code == 200, warm.get_json()
    stored = wiring.of(app).datasets.objects  # the service's object store: every host's
    assert any(True for _ in stored.list("precompute/"))
    interval_entries._PLANS.clear()
    hits = precompute.STATS.hits
    again = api.post("/v1/releases/estimate", body)
    assert again.status_code == 200 and precompute.STATS.hits == hits + 1
    assert again.get_json()["cost"] == warm.get_json()["cost"]
    # the API looked the value up but never computed it: every miss it counted raised
    assert precompute.STATS.misses >= misses + 1


def test_sixteen_identical_cold_estimates_make_one_job(app: Flask, heights: str,
                                                       worker: Any) -> None:
    """A Valkey SET NX marker per precompute key: 16 identical cold estimates, one job
    published (counted at the Celery app, which still publishes it)."""
    counted = create_app(app.config["PRIVRELEASE"])
    celery = wiring.of(counted).queue.app
    sent: list[str] = []
    publish = celery.send_task

    def send_task(name: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(name)
        return publish(name, *args, **kwargs)

    celery.send_task = send_task
    api = Api(counted.test_client())
    body = _calibrated(heights, _fresh_budget())
    answers = [api.post("/v1/releases/estimate", body).status_code for _ in range(16)]
    assert answers == [202] * 16
    assert sent == [queue.PRECOMPUTE_ESTIMATE]
    assert _estimate_until_warm(api, body).status_code == 200
    assert sent == [queue.PRECOMPUTE_ESTIMATE]


def test_a_cold_release_is_priced_by_a_worker_and_charged_as_the_warm_path(
        app: Flask, api: Api, worker: Any) -> None:
    """202 pricing (Location) → succeeded; the ledger entries (reserve and commit units)
    equal exactly those of the same request on an identical dataset, warm by then."""
    budget = _fresh_budget()
    cold_ds, warm_ds = _upload(api), _upload(api)
    resp = api.post("/v1/releases", _calibrated(cold_ds, budget))
    assert resp.status_code == 202, resp.get_json()
    doc = resp.get_json()
    assert doc["status"] == "pricing" and doc["cost"] == {}
    assert resp.headers["Location"] == f"/v1/releases/{doc['id']}"
    cold = _until(api, doc["id"], {"succeeded", "failed", "refused"})
    assert cold["status"] == "succeeded", cold
    again = api.post("/v1/releases", _calibrated(warm_ds, budget))
    assert again.status_code == 202 and again.get_json()["status"] == "queued"
    warm = _until(api, again.get_json()["id"], {"succeeded", "failed"})
    assert warm["status"] == "succeeded" and warm["cost"] == cold["cost"]
    ledger = wiring.of(app).ledger
    cold_events, warm_events = ledger.events(cold_ds), ledger.events(warm_ds)
    for kind in ("reserve", "commit"):
        assert _units(cold_events, kind) == _units(warm_events, kind) != []
    assert ledger.balance(cold_ds) == ledger.balance(warm_ds)


def test_a_priced_release_over_the_budget_is_refused_as_the_post_would_be(
        app: Flask, api: Api, worker: Any) -> None:
    """The cost exceeds the remaining budget: the release ends refused with the problem
    the synchronous POST answers (409 budget_exhausted, same message and amounts), the
    ledger unchanged but for the audited refusal."""
    budget = _fresh_budget() + 0.3
    cold_ds, warm_ds = _upload(api, {"interval_leakage": 0.01}), _upload(
        api, {"interval_leakage": 0.01})
    ledger = wiring.of(app).ledger
    before = ledger.balance(cold_ds)
    resp = api.post("/v1/releases", _calibrated(cold_ds, budget))
    assert resp.status_code == 202 and resp.get_json()["status"] == "pricing"
    doc = _until(api, resp.get_json()["id"], {"refused", "succeeded", "failed"})
    assert doc["status"] == "refused", doc
    sync = api.post("/v1/releases", _calibrated(warm_ds, budget))
    assert sync.status_code == 409, sync.get_json()
    problem = sync.get_json()
    assert doc["error"] == {"code": problem["code"], "message": problem["detail"],
                            "status": 409, "measure": problem["measure"],
                            "scope": problem["scope"], "requested": problem["requested"],
                            "remaining": problem["remaining"]}
    assert ledger.balance(cold_ds) == before
    kinds = [e["kind"] for e in ledger.events(cold_ds)]
    assert kinds == ["cap", "refuse"]
    assert ledger.events(cold_ds, kinds={"refuse"})[0]["code"] == "budget_exhausted"
    jobs = _operator_of(app, cold_ds).get("/v1/jobs?status=refused").get_json()
    assert [j["id"] for j in jobs] == [doc["id"]]


def _operator_of(app: Flask, dataset_id: str) -> Api:
    """An operator limited to one dataset: its jobs list reads that dataset's indexes."""
    _, token = apikeys.create(wiring.of(app).keys, "operator", "pricing-jobs",
                              datasets=(dataset_id,))
    return Api(app.test_client(), token)


def _pricing_release(app: Flask, dataset_id: str, budget: float) -> str:
    """A release created pricing as the API creates it, its job not sent (the test runs
    the job in-process)."""
    ledger = wiring.of(app).ledger
    body = _calibrated(dataset_id, budget)
    doc = json.loads(ledger.dataset_document(dataset_id) or "{}")
    request = pricing.PricingRequest(doc, body["mechanism"], body["params"], {}, None, None,
                                      body)
    release_id = submit.new_id()
    res = ledger.reserve(Reservation(dataset_id, release_id, {}, actor="key_pricing",
                         fingerprint=request.fingerprint, request_json=request.job().to_json(),
                         replay=False, mode="pricing"))
    assert res.outcome == "pricing"
    return release_id


class _Sent:
    """Records what a job publishes (Celery's send_task signature)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def send_task(self, name: str, args: list[Any], task_id: str | None = None,
                  queue: str | None = None) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.calls.append((name, task_id))

    def services(self, app: Flask) -> wiring.Services:
        """The app's services, publishing here instead of to the broker."""
        return dataclasses.replace(wiring.of(app), queue=Queue(self))


def test_a_pricing_job_run_twice_reserves_once(app: Flask, heights: str) -> None:
    """Redelivery: a job killed after reserving (its send failed) and run again, then a
    third run, reserve exactly once; the run is sent by the run that finds it unsent."""
    ledger = wiring.of(app).ledger
    release_id = _pricing_release(app, heights, _fresh_budget())
    broken = _Sent(fail=True)
    with pytest.raises(ConnectionError):
        submit.price(broken.services(app), release_id)
    assert field(ledger, release_id, "status") == "queued"
    assert ledger.unsent(release_id, 0.0)  # reserved, its run still in the outbox
    sent = _Sent()
    assert submit.price(sent.services(app), release_id) == "skipped"
    assert submit.price(sent.services(app), release_id) == "skipped"
    assert sent.calls == [(queue.RUN_RELEASE, release_id)]
    reserves = ledger.events(heights, kinds={"reserve"})
    assert [e["release_id"] for e in reserves] == [release_id]
    (row,) = ledger.balance(heights).values()
    (held,) = reserves[0]["units"].values()
    assert row["reserved"] == held > 0
    ledger.abort(heights, release_id, "{}", "test")  # its run is not sent: refund


def test_two_runs_of_a_pricing_job_at_once_reserve_once(app: Flask, heights: str) -> None:
    """A message delivered twice and run by two workers at the same time: both compute,
    the reserve script lets one reserve and send the run; the other changes nothing."""
    ledger = wiring.of(app).ledger
    release_id = _pricing_release(app, heights, _fresh_budget())
    sent = _Sent()
    outcomes: list[str] = []
    runs = [threading.Thread(target=lambda: outcomes.append(
        submit.price(sent.services(app), release_id))) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert sorted(outcomes) == ["priced", "skipped"]
    # the run is sent (twice only if the second found it reserved, not yet sent: harmless)
    assert set(sent.calls) == {(queue.RUN_RELEASE, release_id)}
    assert [e["release_id"] for e in ledger.events(heights, kinds={"reserve"})] == [release_id]
    ledger.abort(heights, release_id, "{}", "test")  # its run is not sent: refund


def test_cancelling_a_pricing_release_stops_its_reservation(app: Flask, api: Api,
                                                            heights: str) -> None:
    """An operator cancels a release still pricing: cancelled at once, and its job then
    reserves nothing."""
    ledger = wiring.of(app).ledger
    release_id = _pricing_release(app, heights, _fresh_budget())
    jobs = _operator_of(app, heights).get("/v1/jobs?status=pricing").get_json()
    assert [j["id"] for j in jobs] == [release_id]
    resp = api.post(f"/v1/jobs/{release_id}/cancel", {})
    assert resp.status_code == 200 and resp.get_json()["status"] == "cancelled"
    sent = _Sent()
    assert submit.price(sent.services(app), release_id) == "skipped"
    assert sent.calls == []
    assert all(r["reserved"] == 0 and r["committed"] == 0
               for r in ledger.balance(heights).values())
    assert [e["kind"] for e in ledger.events(heights)] == ["cap", "cancel"]


def _isolated(redis_url: str, request: pytest.FixtureRequest) -> tuple[Any, Store]:
    """A Valkey database of its own and a record of its own (a database,
    ``record_state.own_database``): the sweeper passes over every release in it, and no
    worker consumes what a test leaves in its queues."""
    client = rkeys.connect(redis_url.rsplit("/", 1)[0] + "/7")
    client.flushdb()
    ledger = PgLedger(database.connect(own_database(request)))
    request.addfinalizer(ledger.pool.close)
    ledger.open("ds_sweep", {"epsilon": 10**6}, actor="t")
    return client, ledger


def test_the_sweeper_sends_a_pricing_job_left_unsent_or_lost(
        redis_url: str, request: pytest.FixtureRequest) -> None:
    """In the outbox past its grace: its pricing job is sent; sent but its message lost
    (in no queue, not unacked): sent again; a run never refunds or charges it."""
    client, ledger = _isolated(redis_url, request)
    release_id = "rel_" + "c" * 24
    assert ledger.reserve(Reservation("ds_sweep", release_id, {}, actor="t", fingerprint=release_id,
                          request_json=json.dumps({"dataset_id": "ds_sweep"}), replay=False,
                          mode="pricing")).outcome == "pricing"
    sent = _Sent()
    time.sleep(0.01)  # the outbox stamps milliseconds (rounded): be past the stamp
    assert send_outbox(ledger, Queue(sent), grace=0.0) == [release_id]
    assert (queue.PRICE_RELEASE, queue.pricing_task_id(release_id)) in sent.calls
    assert not ledger.unsent(release_id, 0.0)
    sent.calls.clear()
    assert sweep(client, ledger, Queue(sent), min_age=0.0, grace=3600) == []
    assert (queue.PRICE_RELEASE, queue.pricing_task_id(release_id)) in sent.calls
    assert field(ledger, release_id, "status") == "pricing"
    assert ledger.balance("ds_sweep")["epsilon"]["reserved"] == 0
    client.flushdb()


def test_the_sweeper_sees_messages_waiting_in_the_release_and_pricing_queues(
        redis_url: str, request: pytest.FixtureRequest) -> None:
    """Catches the sweeper reading the queue's old name (``privrelease``): a queued
    release whose message still waited in ``releases`` (workers busy for over a minute)
    was refunded as "job message lost"; a pricing job waiting in ``pricing`` would be
    sent again. On a database of its own, so no worker consumes the stand-in messages."""
    client, ledger = _isolated(redis_url, request)
    queued = "rel_" + "a" * 24
    assert ledger.reserve(Reservation(
        "ds_sweep", queued, {"epsilon": 10}, actor="t", fingerprint=queued,
                          request_json=json.dumps({"dataset_id": "ds_sweep"})
                          )).outcome == "reserved"
    ledger.enqueued(queued)  # sent: its message waits in the queue
    client.lpush(RELEASES_QUEUE, json.dumps({"headers": {"id": queued}}))
    priced = "rel_" + "b" * 24
    assert ledger.reserve(Reservation("ds_sweep", priced, {}, actor="t", fingerprint=priced,
                          request_json=json.dumps({"dataset_id": "ds_sweep"}), replay=False,
                          mode="pricing")).outcome == "pricing"
    ledger.enqueued(priced)
    client.lpush(PRICING_QUEUE, json.dumps({"headers": {"id": priced + ".pricing"}}))
    sent = _Sent()
    assert sweep(client, ledger, Queue(sent), min_age=0.0, grace=3600) == []
    assert sent.calls == []
    assert field(ledger, queued, "status") == "queued"
    assert field(ledger, priced, "status") == "pricing"
    assert ledger.balance("ds_sweep")["epsilon"]["reserved"] == 10
    client.flushdb()


def test_an_idempotency_key_replays_a_pricing_release(api: Api, heights: str,
                                                      worker: Any) -> None:
    """The same key while pricing and after: the same release; the key matches the
    request, not its cost, so the warm retry is no idempotency_mismatch."""
    body = _calibrated(heights, _fresh_budget())
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = api.post("/v1/releases", body, key)
    assert first.status_code == 202 and first.get_json()["status"] == "pricing"
    again = api.post("/v1/releases", body, key)
    assert again.status_code == 202 and again.get_json()["id"] == first.get_json()["id"]
    done = _until(api, first.get_json()["id"], {"succeeded", "failed", "refused"})
    assert done["status"] == "succeeded", done
    late = api.post("/v1/releases", body, key)
    assert late.status_code == 202 and late.get_json()["id"] == done["id"]
    other = api.post("/v1/releases", {**body, "budget": {"interval_leakage": 0.5}}, key)
    assert other.status_code == 422 and other.get_json()["code"] == "idempotency_mismatch"


def test_estimates_have_a_per_key_limit(app: Flask, heights: str) -> None:
    """ESTIMATE_RATE_LIMIT counts estimates per key: the fourth of "3/minute" is a 429,
    another key is not affected, and other endpoints are not counted against it."""
    limited = create_app(dataclasses.replace(app.config["PRIVRELEASE"],
                                             estimate_rate_limit="3/minute"))
    keys = wiring.of(limited).keys
    tokens = [apikeys.create(keys, "operator", "estimate-limit")[1] for _ in range(2)]
    first, other = (Api(limited.test_client(), t) for t in tokens)
    body = {**_calibrated(heights, 0.9), "params": {
        "column": "h", "anchors": {"family": "logistic", "loc": 170, "scale": 10}}}
    codes = [first.post("/v1/releases/estimate", body).status_code for _ in range(3)]
    assert set(codes) <= {200, 202}
    refused = first.post("/v1/releases/estimate", body)
    assert refused.status_code == 429 and refused.get_json()["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert first.get(f"/v1/datasets/{heights}").status_code == 200
    assert other.post("/v1/releases/estimate", body).status_code in {200, 202}


def test_cold_release_requests_count_against_the_estimate_limit(app: Flask, api: Api,
                                                                worker: Any) -> None:
    """Each cold POST makes a pricing job (a cold estimate's work): with "2/minute" the
    third cold one from a key is a 429 and creates nothing; warm ones are not counted."""
    limited = create_app(dataclasses.replace(app.config["PRIVRELEASE"],
                                             estimate_rate_limit="2/minute"))
    keys = wiring.of(limited).keys
    key, token = apikeys.create(keys, "analyst", "pricing-limit")
    caller = Api(limited.test_client(), token)
    ds = _upload(api)
    cold = [_calibrated(ds, _fresh_budget()) for _ in range(3)]
    assert [caller.post("/v1/releases", b).status_code for b in cold[:2]] == [202, 202]
    refused = caller.post("/v1/releases", cold[2])
    assert refused.status_code == 429 and refused.get_json()["code"] == "rate_limited"
    made, _ = wiring.of(limited).ledger.release_page(ReleaseView("key", key_id=key.id), 10)
    assert len(made) == 2
    warm = {"dataset_id": _upload(api), "mechanism": "interval.case1", "params": {
        "column": "h", "anchors": {"family": "logistic", "loc": 170, "scale": 10}},
        "budget": {"interval_leakage": 0.5}}
    assert api.estimate(warm).status_code == 200  # warm from now on (another key)
    assert caller.post("/v1/releases", warm).status_code == 202


def test_work_beyond_the_ceiling_is_a_422_naming_the_parameter(app: Flask, heights: str) -> None:
    """PRIVRELEASE_MAX_PRECOMPUTE_WORK: a calibrated design above it is refused with 422
    naming the parameter (and nothing computed, nothing created); a plain one below it
    is answered."""
    low = create_app(dataclasses.replace(app.config["PRIVRELEASE"], max_precompute_work=1e6))
    api = Api(low.test_client())
    refused = api.post("/v1/releases/estimate", _calibrated(heights, 0.4567891))
    assert refused.status_code == 422
    assert refused.get_json()["field"] == "params.calibrate"
    casek = {**_calibrated(heights, 0.4567891), "mechanism": "interval.casek"}
    casek["params"] = {**casek["params"], "m": 8}
    resp = api.post("/v1/releases", casek)
    assert resp.status_code == 422 and resp.get_json()["field"] == "params.m"
    plain = {**_calibrated(heights, 0.9), "params": {
        "column": "h", "anchors": {"family": "logistic", "loc": 170, "scale": 10}}}
    assert api.post("/v1/releases/estimate", plain).status_code in {200, 202}


#: the answer time the issue requires of /healthz and GET /v1/datasets under load
BOUND_SECONDS = 2.0
CONCURRENT = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_eight_cold_heavy_requests_leave_gunicorn_responsive(
        app: Flask, api: Api, service_env: dict[str, str], worker: Any) -> None:
    """Served by gunicorn: 8 cold Case-K calibrations (CPU seconds in all) are answered
    202 pricing at once, and while the worker computes them /healthz and GET
    /v1/datasets answer within 2 s; then every one succeeds. (The old code computed them
    in the API's threads, or answered 503 busy.)"""
    ds = _upload(api, {"interval_leakage": 0.99})
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "service.processes.cli", "api", "--host",
                             "127.0.0.1", "--port", str(port), "--workers", "2"],
                            env={**os.environ, **service_env}, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(url + "/v1/datasets", headers=auth, timeout=10).ok:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            assert time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.1)
        for _ in range(6):  # both workers past their first request before the clock runs
            requests.get(url + "/v1/datasets", headers=auth, timeout=30)
        tag = _fresh_budget()
        bodies = [{"dataset_id": ds, "mechanism": "interval.casek",
                   "params": {"column": "h", "m": 4, "calibrate": True},
                   "budget": {"interval_leakage": tag + i / 1000}} for i in range(CONCURRENT)]
        answers: list[requests.Response | None] = [None] * CONCURRENT

        def post(i: int) -> None:
            answers[i] = requests.post(url + "/v1/releases", json=bodies[i], headers=auth,
                                       timeout=30)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(CONCURRENT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(a is not None and a.status_code == 202 for a in answers), answers
        ids = [a.json()["id"] for a in answers if a is not None]
        assert {a.json()["status"] for a in answers if a is not None} == {"pricing"}
        probes: list[tuple[str, int, float]] = []
        pending = set(ids)
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for path in ("/healthz", "/v1/datasets"):
                t0 = time.monotonic()
                resp = requests.get(url + path, headers=auth, timeout=30)
                probes.append((path, resp.status_code, time.monotonic() - t0))
            for rid in list(pending):
                doc = requests.get(f"{url}/v1/releases/{rid}", headers=auth, timeout=30).json()
                if doc["status"] not in {"pricing", "queued", "running"}:
                    assert doc["status"] == "succeeded", doc
                    pending.discard(rid)
            time.sleep(0.1)
        assert not pending, pending
        assert len(probes) >= 6, probes  # the worker was busy for a while
        slow = [p for p in probes if p[1] != 200 or p[2] >= BOUND_SECONDS]
        assert not slow, slow
    finally:
        proc.terminate()
        proc.wait(timeout=30)
