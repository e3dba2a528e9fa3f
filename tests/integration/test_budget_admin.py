"""Budget administration, allocations, the audit log and signed notifications."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
from flask import Flask

from service import apikeys, wiring
from service.storage.ledger import Reservation
from tests.integration import record_state
from tests.integration.conftest import LEDGER_OUTPUT, LEDGER_REQUEST, PEOPLE_META, Api, people_csv


def _body(ds: str, value: float, eps: float = 0.1) -> dict[str, Any]:
    return {"dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": eps},
            "params": {"statistic": "count",
                       "condition": {"column": "age", "op": "ge", "value": value}}}


def test_caps_raise_lower_and_never_below_spent(api: Api, dataset: dict[str, Any],
                                                worker: Any) -> None:
    ds = dataset["id"]
    rid = api.post("/v1/releases", _body(ds, 30, eps=2)).get_json()["id"]
    api.wait(rid)
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json={"caps": {"epsilon": 1.5}},
                            headers=api._h())
    assert resp.status_code == 409 and resp.get_json()["code"] == "cap_below_spent"
    assert resp.get_json()["held"] == 2.0
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json={"caps": {"epsilon": 2}},
                            headers=api._h())
    assert resp.status_code == 200
    assert resp.get_json()["measures"]["epsilon"]["remaining"] == 0.0
    assert api.post("/v1/releases", _body(ds, 31)).status_code == 409
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json={"caps": {"epsilon": 7}},
                            headers=api._h())
    assert resp.get_json()["measures"]["epsilon"] == {"cap": 7.0, "committed": 2.0,
                                                      "reserved": 0.0, "remaining": 5.0}
    bad = api.client.patch(f"/v1/datasets/{ds}/budget", json={"caps": {"zeta": 1}},
                           headers=api._h())
    assert bad.status_code == 422 and bad.get_json()["field"] == "caps.zeta"
    caps = [e for e in api.get(f"/v1/datasets/{ds}/ledger?kind=cap").get_json()]
    assert [e["amounts"].get("epsilon") for e in caps] == [5.0, 2.0, 7.0]


def test_interval_leakage_caps_above_one_are_refused(api: Api, dataset: dict[str, Any]) -> None:
    """Thm 4 bounds composed interval leakage additively, which says nothing past 1: a cap
    above 1 is a 422 naming the field, at upload and in a PATCH (main accepted up to 1000)."""
    meta = {**PEOPLE_META, "budgets": {"epsilon": 1, "interval_leakage": 1.5}}
    resp = api.upload(people_csv(20), meta)
    assert resp.status_code == 422, resp.get_json()
    assert resp.get_json()["field"] == "metadata.budgets.interval_leakage"
    ds = dataset["id"]
    for caps, field in [({"interval_leakage": 2}, "caps.interval_leakage"),
                        ({"interval_leakage:age": 1000}, "caps.interval_leakage:age")]:
        resp = api.client.patch(f"/v1/datasets/{ds}/budget", json={"caps": caps},
                                headers=api._h())
        assert resp.status_code == 422, resp.get_json()
        assert resp.get_json()["field"] == field
        assert resp.get_json()["code"] == "validation_error"
    resp = api.client.patch(f"/v1/datasets/{ds}/budget",
                            json={"caps": {"interval_leakage:age": 1}}, headers=api._h())
    assert resp.status_code == 200
    assert resp.get_json()["measures"]["interval_leakage:age"]["cap"] == 1.0


def test_allocations_are_enforced_and_shown(app: Flask, api: Api, dataset: dict[str, Any],
                                            worker: Any) -> None:
    ds, keys = dataset["id"], wiring.of(app).keys
    key, token = apikeys.create(keys, "analyst", datasets=(ds,))
    consumer, _ = apikeys.create(keys, "consumer")
    patch = {"allocations": {key.id: {"epsilon": 0.3}}}
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json=patch, headers=api._h())
    assert resp.status_code == 200
    assert resp.get_json()["allocations"][key.id]["epsilon"]["cap"] == 0.3
    too_big = {"allocations": {key.id: {"epsilon": 6}}}
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json=too_big, headers=api._h())
    assert resp.status_code == 409 and resp.get_json()["code"] == "allocation_above_cap"
    not_analyst = {"allocations": {consumer.id: {"epsilon": 1}}}
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json=not_analyst, headers=api._h())
    assert resp.status_code == 422

    analyst = Api(api.client, token)
    # issue #18: the estimate says whether the cost fits what this key may still spend
    fits = analyst.post("/v1/releases/estimate", _body(ds, 0)).get_json()
    assert fits["fits"] is True and fits["shortfall"] == {}
    assert fits["remaining"]["epsilon"] == pytest.approx(0.3)
    big = {**_body(ds, 0), "budget": {"epsilon": 0.5}}
    short = analyst.post("/v1/releases/estimate", big).get_json()
    assert short["fits"] is False and short["shortfall"]["epsilon"] == pytest.approx(0.2)
    assert api.post("/v1/releases/estimate", big).get_json()["fits"] is True  # no allocation
    statuses = [analyst.post("/v1/releases", _body(ds, v)).status_code for v in range(5)]
    assert statuses == [202, 202, 202, 409, 409]
    refused = analyst.post("/v1/releases", _body(ds, 9)).get_json()
    assert refused["scope"] == "allocation" and refused["remaining"] == 0.0
    # the operator (no allocation) still has the rest of the dataset's cap
    assert api.post("/v1/releases", _body(ds, 10)).status_code == 202
    view = analyst.get(f"/v1/datasets/{ds}/budget").get_json()
    assert set(view["allocations"]) == {key.id}
    row = view["allocations"][key.id]["epsilon"]  # displayed decimals: 0.2 + 0.1 != 0.3
    assert row["committed"] + row["reserved"] == pytest.approx(0.3, abs=1e-9)


def test_a_key_id_with_a_nul_is_no_key(api: Api, dataset: dict[str, Any]) -> None:
    """Found by the contract fuzz: a key id with a NUL character reached PostgreSQL, whose
    text cannot hold one (500). Now no JSON string of a body may hold one: 422 naming the
    body, before anything is read (``inputs.check_body``); the key store also finds no
    key for such an id (``pg_keys``), as for any unknown key."""
    patch = {"allocations": {"key_\u0000x": {"epsilon": 1}}}
    resp = api.client.patch(f"/v1/datasets/{dataset['id']}/budget", json=patch,
                            headers=api._h())
    assert resp.status_code == 422, resp.get_json()
    assert resp.get_json()["field"] == "body" and "NUL" in resp.get_json()["detail"]


def test_racing_analysts_respect_allocations_and_cap(app: Flask) -> None:
    """Two analysts, allocations 2 and 2 inside a cap of 3: never more than either, with
    the reservations spread over four API hosts' stores of the session's record."""
    ds = "ds_race_" + secrets.token_hex(6)
    ledger = wiring.of(app).ledger
    ledger.open(ds, {"epsilon": 30}, "op")
    ledger.set_caps(ds, {"epsilon": 20}, "op", key_id="key_a")
    ledger.set_caps(ds, {"epsilon": 20}, "op", key_id="key_b")

    def one(i: int) -> tuple[str, str]:
        actor = "key_a" if i % 2 else "key_b"
        own, rid = hosts[i % len(hosts)], f"rel_race_{i}_{ds}"
        res = own.reserve(Reservation(ds, rid, {"epsilon": 1}, actor=actor,
                          fingerprint=f"race-{i}-{ds}", request_json=LEDGER_REQUEST))
        if res.outcome == "reserved" and i % 3 == 0:
            run = own.mark_running(rid, "w")
            assert run is not None and own.commit(ds, run, LEDGER_OUTPUT) == "settled"
        return actor, res.outcome

    config = app.config["PRIVRELEASE"]
    with ExitStack() as stack, ThreadPoolExecutor(16) as pool:
        hosts = [stack.enter_context(record_state.another_host(config)) for _ in range(4)]
        results = list(pool.map(one, range(200)))
    won = {a: sum(1 for x, o in results if x == a and o == "reserved") for a in ("key_a",
                                                                                 "key_b")}
    assert sum(won.values()) == 30 and max(won.values()) <= 20
    rows, allocs = ledger.budget(ds)
    assert rows["epsilon"]["committed"] + rows["epsilon"]["reserved"] == 30
    for actor, count in won.items():
        assert allocs[actor]["epsilon"]["committed"] + allocs[actor]["epsilon"]["reserved"] \
            == count


def test_audit_log_is_complete_after_a_mixed_workload(api: Api, dataset: dict[str, Any],
                                                      worker: Any) -> None:
    ds = dataset["id"]
    ids = [api.post("/v1/releases", _body(ds, v, eps=0.25)).get_json()["id"] for v in range(6)]
    for rid in ids:
        api.wait(rid)
    assert api.post("/v1/releases", _body(ds, 0, eps=0.25)).status_code == 200  # replay
    assert api.post("/v1/releases", _body(ds, 50, eps=9)).status_code == 409
    events = api.get(f"/v1/datasets/{ds}/ledger").get_json()
    commits = [e for e in events if e["kind"] == "commit"]
    assert sorted(e["release_id"] for e in commits) == sorted(ids)
    committed = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    units = sum(e["units"]["epsilon"] for e in commits)
    assert units == 6 * 250_000_000 and committed["committed"] == 1.5
    lines = api.get(f"/v1/datasets/{ds}/ledger?format=jsonl&kind=commit,reserve")
    assert lines.mimetype == "application/x-ndjson"
    parsed = [json.loads(line) for line in lines.get_data(as_text=True).splitlines()]
    assert [e["kind"] for e in parsed].count("commit") == 6 and len(parsed) == 12
    assert all(e["actor"] for e in parsed)
    since = api.get(f"/v1/datasets/{ds}/ledger?since=2999-01-01T00:00:00Z").get_json()
    assert since == []
    # times before 1970 (found by the contract fuzzer: a 500) bound nothing / everything
    early = api.get(f"/v1/datasets/{ds}/ledger?since=1012-09-17T23:13:41Z")
    assert early.status_code == 200 and early.get_json() == events
    before = api.get(f"/v1/datasets/{ds}/ledger?until=0363-02-04T01:56:49Z")
    assert before.status_code == 200 and before.get_json() == []


def test_retired_dataset_refuses_releases_keeps_reads(api: Api, dataset: dict[str, Any],
                                                      worker: Any) -> None:
    ds = dataset["id"]
    rid = api.post("/v1/releases", _body(ds, 30)).get_json()["id"]
    api.wait(rid)
    assert api.client.delete(f"/v1/datasets/{ds}", headers=api._h()).get_json()["status"] \
        == "retired"
    resp = api.post("/v1/releases", _body(ds, 31))
    assert resp.status_code == 409 and resp.get_json()["code"] == "dataset_retired"
    assert api.get(f"/v1/releases/{rid}").get_json()["status"] == "succeeded"
    assert api.get(f"/v1/datasets/{ds}/ledger").get_json()[-1]["kind"] == "retire"


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], bytes]]] = []
    failures_left: ClassVar[int] = 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if _Receiver.failures_left > 0:  # the first delivery fails: it must be retried
            _Receiver.failures_left -= 1
            self.send_response(503)
        else:
            _Receiver.received.append((dict(self.headers), body))
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_callback_is_signed_retried_and_allow_listed(app: Flask, api: Api,
                                                     dataset: dict[str, Any],
                                                     worker: Any) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        keys = wiring.of(app).keys
        key, token = apikeys.create(keys, "analyst")
        secret = apikeys.callback_secret(keys, key.id)
        assert secret
        body = {**_body(dataset["id"], 30),
                "callback_url": f"http://127.0.0.1:{server.server_port}/hook"}
        rid = Api(api.client, token).post("/v1/releases", body).get_json()["id"]
        api.wait(rid)
        deadline = time.monotonic() + 30
        while not _Receiver.received and time.monotonic() < deadline:
            time.sleep(0.1)
        headers, payload = _Receiver.received[0]
        expected = "sha256=" + hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()
        assert headers["X-Privrelease-Signature"] == expected
        assert json.loads(payload)["id"] == rid and json.loads(payload)["status"] == "succeeded"
    finally:
        server.shutdown()
    for url in ("http://10.0.0.1/hook", "http://localhost:1/x", "ftp://127.0.0.1/x",
                "http://user:pw@127.0.0.1/x"):
        resp = api.post("/v1/releases", {**_body(dataset["id"], 31), "callback_url": url})
        assert resp.status_code == 422 and resp.get_json()["field"] == "callback_url", url


def test_refused_patch_changes_nothing(app: Flask, api: Api, dataset: dict[str, Any]) -> None:
    """Issue 15 item 8: a PATCH with a valid cap and an invalid allocation is refused whole.
    Main applied the cap (5 -> 50) and audited it, then answered 409 allocation_above_cap."""
    ds, keys = dataset["id"], wiring.of(app).keys
    key, _ = apikeys.create(keys, "analyst", datasets=(ds,))
    before = api.get(f"/v1/datasets/{ds}/budget").get_json()
    events = len(api.get(f"/v1/datasets/{ds}/ledger").get_json())
    patch = {"caps": {"epsilon": 50}, "allocations": {key.id: {"epsilon": 60}}}
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json=patch, headers=api._h())
    assert resp.status_code == 409, resp.get_json()
    assert resp.get_json()["code"] == "allocation_above_cap"
    assert resp.get_json()["cap"] == 50.0  # checked against the cap this PATCH sets
    assert resp.get_json()["field"] == f"allocations.{key.id}.epsilon"
    assert api.get(f"/v1/datasets/{ds}/budget").get_json() == before
    assert len(api.get(f"/v1/datasets/{ds}/ledger").get_json()) == events
    # the same PATCH with an allocation inside the new cap applies both, audited as two
    patch["allocations"] = {key.id: {"epsilon": 40}}
    resp = api.client.patch(f"/v1/datasets/{ds}/budget", json=patch, headers=api._h())
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json()["measures"]["epsilon"]["cap"] == 50.0
    assert resp.get_json()["allocations"][key.id]["epsilon"]["cap"] == 40.0
    kinds = [e["kind"] for e in api.get(f"/v1/datasets/{ds}/ledger").get_json()[events:]]
    assert kinds == ["cap", "allocation"]
