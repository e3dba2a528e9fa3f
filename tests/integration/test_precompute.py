"""Heavy cost computations in the API: shared through the data dir, gated, rate limited.

On the old code every API process recomputed interval calibration for each
fresh process, any number of cold computations ran at once in request threads,
and estimates had no limit of their own: each test below fails there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from mechanisms import precompute
from mechanisms.interval import service as interval_service
from service import apikeys
from service import precompute as service_precompute
from service.app import create_app

from .conftest import Api

META: dict[str, Any] = {
    "name": "heights", "budgets": {"interval_leakage": 0.9},
    "columns": {"h": {"type": "continuous", "bounds": [100, 220],
                      "prior": {"family": "normal", "loc": 170, "scale": 10}}}}


@pytest.fixture()
def heights(api: Api) -> str:
    resp = api.upload("h\n" + "\n".join(str(150 + i % 40) for i in range(300)) + "\n", META)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def _calibrated(dataset_id: str, budget: float) -> dict[str, Any]:
    """A calibrated Case-I request; a budget no other test uses makes it cold."""
    return {"dataset_id": dataset_id, "mechanism": "interval.case1",
            "params": {"column": "h", "calibrate": True},
            "budget": {"interval_leakage": budget}}


def test_a_second_process_reads_the_shared_result(app: Flask, api: Api, heights: str) -> None:
    """The calibration lands under <data dir>/precompute; a process without it in memory
    (simulated by clearing the in-process plans) answers from the store with a hit, and
    the same cost."""
    body = _calibrated(heights, 0.1234567)
    first = api.post("/v1/releases/estimate", body)
    assert first.status_code == 200, first.get_json()
    store = app.config["PRIVRELEASE"].data_dir / "precompute"
    assert any(p.is_file() for p in store.rglob("*"))
    interval_service._PLANS.clear()
    hits, misses = precompute.STATS.hits, precompute.STATS.misses
    second = api.post("/v1/releases/estimate", body)
    assert second.status_code == 200
    assert (precompute.STATS.hits, precompute.STATS.misses) == (hits + 1, misses)
    assert second.get_json()["cost"] == first.get_json()["cost"]


@contextlib.contextmanager
def _slot_taken(app: Flask) -> Iterator[threading.Event]:
    """Occupy the app's only gate slot with a cold computation that waits for an event."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with service_precompute.scope(app):
            precompute.cached(precompute.key("test.hold", "", uuid.uuid4().hex),
                              lambda: started.set() or release.wait(30),
                              precompute.encode_json, precompute.decode_json)

    holder = threading.Thread(target=hold)
    holder.start()
    assert started.wait(10)
    try:
        yield release
    finally:
        release.set()
        holder.join(10)


def test_cold_work_beyond_the_gate_is_busy(app: Flask, heights: str) -> None:
    """With every slot computing, a cold estimate or release is 503 busy with Retry-After
    at once, reserving nothing; a warm one still answers; after the slot frees, the
    retry succeeds."""
    one_slot = create_app(dataclasses.replace(app.config["PRIVRELEASE"],
                                              precompute_concurrency=1))
    api = Api(one_slot.test_client())
    warm = _calibrated(heights, 0.2345678)
    assert api.post("/v1/releases/estimate", warm).status_code == 200
    cold = _calibrated(heights, 0.3456789)
    with _slot_taken(one_slot):
        for path in ("/v1/releases/estimate", "/v1/releases"):
            resp = api.post(path, cold)
            assert resp.status_code == 503, resp.get_json()
            assert resp.get_json()["code"] == "busy"
            assert int(resp.headers["Retry-After"]) >= 1
        assert api.post("/v1/releases/estimate", warm).status_code == 200
    budget = api.get(f"/v1/datasets/{heights}/budget").get_json()["measures"]
    assert all(row["reserved"] == 0 and row["committed"] == 0 for row in budget.values())
    assert api.post("/v1/releases/estimate", cold).status_code == 200


def test_estimates_have_a_per_key_limit(app: Flask, heights: str) -> None:
    """ESTIMATE_RATE_LIMIT counts estimates per key: the fourth of "3/minute" is a 429,
    another key is not affected, and other endpoints are not counted against it."""
    limited = create_app(dataclasses.replace(app.config["PRIVRELEASE"],
                                             estimate_rate_limit="3/minute"))
    client = limited.extensions["redis"]
    tokens = [apikeys.create(client, "operator", "estimate-limit")[1] for _ in range(2)]
    first, other = (Api(limited.test_client(), t) for t in tokens)
    body = _calibrated(heights, 0.2345678)
    assert [first.post("/v1/releases/estimate", body).status_code for _ in range(3)] == [200] * 3
    refused = first.post("/v1/releases/estimate", body)
    assert refused.status_code == 429 and refused.get_json()["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert first.get(f"/v1/datasets/{heights}").status_code == 200
    assert other.post("/v1/releases/estimate", body).status_code == 200


def test_work_beyond_the_ceiling_is_a_422_naming_the_parameter(app: Flask, heights: str) -> None:
    """PRIVRELEASE_MAX_PRECOMPUTE_WORK: a calibrated design above it is refused with 422
    naming the parameter (and nothing computed); a plain one below it is answered."""
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
    assert api.post("/v1/releases/estimate", plain).status_code == 200


def test_nested_cold_work_uses_the_slot_it_holds(app: Flask) -> None:
    """A cold computation that needs another cold one (in the same thread) is not refused
    by its own slot: with one slot, the nested one runs."""
    one_slot = create_app(dataclasses.replace(app.config["PRIVRELEASE"],
                                              precompute_concurrency=1))

    def cold(tag: str, inner: Any) -> Any:
        return precompute.cached(precompute.key("test.nested", "", [tag, uuid.uuid4().hex]),
                                 inner, precompute.encode_json, precompute.decode_json)

    with service_precompute.scope(one_slot):
        assert cold("outer", lambda: cold("inner", lambda: 2.5) * 2) == 5.0
        assert cold("again", lambda: 1.0) == 1.0  # the slot was given back
