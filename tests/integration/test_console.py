"""The web console in-process: sessions, CSRF, roles, and the burn-down replay.

The browser scenarios are in tests/e2e/test_console.py; these are the fast, exact checks.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from service import apikeys, wiring
from service.console import burndown, session, views
from service.storage.keys import KeyStore
from tests.integration.conftest import PEOPLE_META, Api, people_csv

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _csrf(client: FlaskClient, path: str = "/console/signin") -> str:
    page = client.get(path).get_data(as_text=True)
    found = CSRF.search(page)
    assert found, page
    return found.group(1)


def _signed_in(app: Flask, token: str) -> FlaskClient:
    client = app.test_client()
    resp = client.post("/console/signin", data={"token": token, "csrf_token": _csrf(client)})
    assert resp.status_code == 302, resp.get_data(as_text=True)
    return client


def test_cookie_flags_and_no_token_in_cookie(app: Flask, keys: KeyStore) -> None:
    """The session cookie is HttpOnly, SameSite=Strict, scoped to /console, and holds
    neither the token nor its digest (catches a cookie that carries the key)."""
    _key, token = apikeys.create(keys, "analyst", label="cookie")
    client = app.test_client()
    resp = client.post("/console/signin", data={"token": token, "csrf_token": _csrf(client)})
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie  # only with PRIVRELEASE_CONSOLE_SECURE_COOKIE
    value = cookie.split(";")[0].split("=", 1)[1]
    import base64
    import zlib
    payload = value.lstrip(".").split(".")[0]
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    text = (zlib.decompress(raw) if value.startswith(".") else raw).decode()
    assert token not in text and apikeys.digest(token) not in text
    assert "sid" in text


def test_post_without_csrf_token_is_refused(app: Flask, keys: KeyStore) -> None:
    """A form POST without (or with a wrong) CSRF token changes nothing: 400."""
    key, token = apikeys.create(keys, "consumer", label="victim")
    client = _signed_in(app, token)
    op = _signed_in(app, apikeys.create(keys, "operator", label="csrf-op")[1])
    resp = op.post(f"/console/keys/{key.id}/revoke", data={})
    assert resp.status_code == 400
    resp = op.post(f"/console/keys/{key.id}/revoke", data={"csrf_token": "forged"})
    assert resp.status_code == 400
    assert apikeys.get(keys, key.id) is not None
    fresh = app.test_client()
    assert fresh.post("/console/signin", data={"token": token}).status_code == 400
    assert client.get("/console/datasets").status_code == 200


def test_consumer_gets_no_operator_page(app: Flask, keys: KeyStore) -> None:
    """Operator pages answer 403 to a consumer, whose navigation has no operator links."""
    client = _signed_in(app, apikeys.create(keys, "consumer", label="c")[1])
    page = client.get("/console/datasets").get_data(as_text=True)
    assert "nav-keys" not in page and "nav-jobs" not in page and "upload-form" not in page
    for path in ("/console/keys", "/console/jobs"):
        assert client.get(path).status_code == 403, path
    assert client.post("/console/datasets", data={"csrf_token": _csrf(
        client, "/console/mechanisms")}).status_code == 403


def test_signed_out_and_revoked_sessions_end(app: Flask, keys: KeyStore) -> None:
    """Sign-out deletes the server-side session (a replayed cookie is dead), and a revoked
    key's sessions end on their next request."""
    key, token = apikeys.create(keys, "analyst", label="s")
    client = _signed_in(app, token)
    stolen = client.get_cookie("privrelease_console", path="/console")
    assert stolen is not None
    csrf = _csrf(client, "/console/datasets")
    assert client.post("/console/signout", data={"csrf_token": csrf}).status_code == 302
    replay = app.test_client()
    replay.set_cookie("privrelease_console", stolen.value, path="/console")
    assert replay.get("/console/datasets").status_code == 302  # to the sign-in page
    other = _signed_in(app, token)
    apikeys.revoke(keys, key.id)
    resp = other.get("/console/datasets")
    assert resp.status_code == 302 and "/console/signin" in resp.headers["Location"]


def test_wrong_key_and_open_redirect(app: Flask, keys: KeyStore) -> None:
    client = app.test_client()
    resp = client.post("/console/signin", data={"token": "pr_nope", "csrf_token": _csrf(client)})
    assert resp.status_code == 401 and "unknown or revoked API key" in resp.get_data(True)
    token = apikeys.create(keys, "consumer")[1]
    resp = client.post("/console/signin?next=//evil.example/x",
                       data={"token": token, "csrf_token": _csrf(client)})
    assert resp.headers["Location"] == "/console/datasets" or \
        resp.headers["Location"].endswith("/console/")


def test_upload_errors_are_the_apis(app: Flask, api: Api, keys: KeyStore) -> None:
    """The upload form shows the API's own problem detail and field for the same input."""
    client = _signed_in(app, apikeys.create(keys, "operator", label="up")[1])
    bad = dict(PEOPLE_META, columns={"age": {"type": "integer", "bounds": [5, 1]}})
    import json
    expected = api.upload(people_csv(10), bad).get_json()
    import io
    resp = client.post("/console/datasets", data={
        "csrf_token": _csrf(client, "/console/datasets"), "metadata": json.dumps(bad),
        "file": (io.BytesIO(people_csv(10).encode()), "p.csv")},
        content_type="multipart/form-data")
    page = resp.get_data(as_text=True)
    assert resp.status_code == expected["status"] == 422
    assert expected["field"] in page
    from markupsafe import escape
    assert str(escape(expected["detail"])) in page


def test_burndown_replays_to_the_ledger(app: Flask, api: Api, worker: Any,
                                         keys: KeyStore, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    """Replaying the audit stream ends where the ledger is: committed and reserved per
    measure, exactly (catches a replay that mishandles commit, abort or a cap change);
    so does the chart's window of the newest events, from what held before them."""
    doc = api.upload(people_csv(), PEOPLE_META).get_json()
    body = {"dataset_id": doc["id"], "mechanism": "geometric", "budget": {"epsilon": 0.5},
            "params": {"statistic": "count",
                       "condition": {"column": "age", "op": "ge", "value": 30}}}
    rel = api.post("/v1/releases", body).get_json()
    api.wait(rel["id"])
    api.client.patch(f"/v1/datasets/{doc['id']}/budget", json={"caps": {"epsilon": 4}},
                     headers={"Authorization": "Bearer pr_test_operator_token"})
    ledger = wiring.of(app).ledger
    rows, _alloc = ledger.budget(doc["id"])
    series = burndown.replay(ledger.events(doc["id"]))
    for measure, row in rows.items():
        s = series[measure]
        assert (s.cap[-1], s.committed[-1], s.reserved[-1]) == (
            row["cap"], row["committed"], row["reserved"])
    shown = series["epsilon"].display("epsilon")
    assert (shown["cap"][0], shown["cap"][-1], shown["committed"][-1]) == (5.0, 4.0, 0.5)
    windowed = burndown.replay_window(ledger.budget_window(doc["id"], 2))
    for measure, s in series.items():
        w = windowed[measure]
        assert (w.cap[-1], w.committed[-1], w.reserved[-1]) == (
            s.cap[-1], s.committed[-1], s.reserved[-1])
    client = _signed_in(app, "pr_test_operator_token")
    for chart_events in (views.CHART_EVENTS, 2):
        monkeypatch.setattr(views, "CHART_EVENTS", chart_events)
        png = client.get(f"/console/datasets/{doc['id']}/budget.png")
        assert png.status_code == 200 and png.data.startswith(b"\x89PNG")
    assert session.session_digest("x") != session.session_digest("y")


def test_replay_refunds_and_skips_allocations() -> None:
    """Exact steps for every kind: abort and cancel refund, an allocation's cap event and
    a refusal change nothing of the dataset's (catches charging refunds or allocations)."""
    events = [
        {"kind": "cap", "key_id": "", "at": "t0", "units": {"epsilon": 100}},
        {"kind": "reserve", "at": "t1", "units": {"epsilon": 10}},
        {"kind": "allocation", "key_id": "key_a", "at": "t2", "units": {"epsilon": 50}},
        {"kind": "reserve", "at": "t3", "units": {"epsilon": 7}},
        {"kind": "commit", "at": "t4", "units": {"epsilon": 10}},
        {"kind": "abort", "at": "t5", "units": {"epsilon": 7}},
        {"kind": "refuse", "at": "t6", "units": {}},
        {"kind": "reserve", "at": "t7", "units": {"epsilon": 3}},
        {"kind": "cancel", "at": "t8", "units": {"epsilon": 3}},
    ]
    s = burndown.replay(events)["epsilon"]
    assert s.times == ["t0", "t1", "t3", "t4", "t5", "t7", "t8"]
    assert s.cap == [100] * 7
    assert s.committed == [0, 0, 0, 10, 10, 10, 10]
    assert s.reserved == [0, 10, 17, 7, 0, 3, 0]
