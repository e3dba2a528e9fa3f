"""The authorization matrix: every endpoint × every kind of caller, exact statuses.

The expected table is checked against the app's route table, so an endpoint
added without an entry here fails ``test_every_route_has_a_rule``.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from service import apikeys
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

PUBLIC = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/<path:filename>"}
_counter = itertools.count()


@dataclass
class World:
    client: FlaskClient
    r: redis.Redis
    ds: str  # the dataset every granted key may use
    other: str  # a dataset only the operator may use
    release: str  # a finished release on ``ds``
    tokens: dict[str, str | None]

    def upload(self) -> str:
        data = {"metadata": json.dumps(PEOPLE_META),
                "file": (io.BytesIO(people_csv(20).encode()), "d.csv")}
        resp = self.client.post("/v1/datasets", data=data, content_type="multipart/form-data",
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status_code == 201
        return str(resp.get_json()["id"])


Request = Callable[[World], tuple[str, str, dict[str, Any]]]


def _release_body(w: World) -> dict[str, Any]:
    return {"dataset_id": w.ds, "mechanism": "geometric", "budget": {"epsilon": 0.001},
            "params": {"statistic": "count", "condition": {
                "column": "age", "op": "ge", "value": 1000 + next(_counter)}}}


#: (rule, method) -> (how to call it, least role, status for allowed callers,
#:                    dataset-scoped: a key granted another dataset gets 403)
RULES: dict[tuple[str, str], tuple[Request, str, int, bool]] = {
    ("/v1/datasets", "POST"): (lambda w: ("POST", "/v1/datasets", {
        "data": {"metadata": json.dumps(PEOPLE_META),
                 "file": (io.BytesIO(people_csv(5).encode()), "d.csv")},
        "content_type": "multipart/form-data"}), "operator", 201, False),
    ("/v1/datasets", "GET"): (lambda w: ("GET", "/v1/datasets", {}), "consumer", 200, False),
    ("/v1/datasets/<dataset_id>", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}", {}), "consumer", 200, True),
    ("/v1/datasets/<dataset_id>", "DELETE"): (
        lambda w: ("DELETE", f"/v1/datasets/{w.upload()}", {}), "operator", 200, True),
    ("/v1/datasets/<dataset_id>/budget", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}/budget", {}), "analyst", 200, True),
    ("/v1/datasets/<dataset_id>/budget", "PATCH"): (
        lambda w: ("PATCH", f"/v1/datasets/{w.ds}/budget", {"json": {"caps": {"epsilon": 5}}}),
        "operator", 200, True),
    ("/v1/datasets/<dataset_id>/ledger", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}/ledger", {}), "operator", 200, True),
    ("/v1/mechanisms", "GET"): (lambda w: ("GET", "/v1/mechanisms", {}), "consumer", 200, False),
    ("/v1/releases/estimate", "POST"): (
        lambda w: ("POST", "/v1/releases/estimate", {"json": _release_body(w)}),
        "analyst", 200, True),
    ("/v1/releases", "POST"): (
        lambda w: ("POST", "/v1/releases", {"json": _release_body(w)}), "analyst", 202, True),
    ("/v1/releases", "GET"): (lambda w: ("GET", "/v1/releases", {}), "consumer", 200, False),
    ("/v1/releases/<release_id:release_id>", "GET"): (
        lambda w: ("GET", f"/v1/releases/{w.release}", {}), "consumer", 200, True),
    ("/v1/releases/<release_id>/data", "GET"): (  # a baseline has no record-level data
        lambda w: ("GET", f"/v1/releases/{w.release}/data", {}), "consumer", 404, True),
    ("/v1/releases/<release_id>/plot.png", "GET"): (  # nor a function to draw
        lambda w: ("GET", f"/v1/releases/{w.release}/plot.png", {}), "consumer", 404, True),
    ("/v1/releases/<release_id>/analyses", "POST"): (  # nor analyses
        lambda w: ("POST", f"/v1/releases/{w.release}/analyses", {"json": {"analysis": "em"}}),
        "consumer", 422, True),
    ("/v1/releases/<release_id>/analyses/<analysis_id>", "GET"): (
        lambda w: ("GET", f"/v1/releases/{w.release}/analyses/ana_none", {}),
        "consumer", 404, True),
    ("/v1/keys", "POST"): (
        lambda w: ("POST", "/v1/keys", {"json": {"role": "consumer"}}), "operator", 201, False),
    ("/v1/keys", "GET"): (lambda w: ("GET", "/v1/keys", {}), "operator", 200, False),
    ("/v1/keys/<key_id>", "DELETE"): (
        lambda w: ("DELETE", f"/v1/keys/{apikeys.create(w.r, 'consumer')[0].id}", {}),
        "operator", 204, False),
    ("/v1/jobs", "GET"): (lambda w: ("GET", "/v1/jobs", {}), "operator", 200, False),
    ("/v1/jobs/<release_id>/cancel", "POST"): (
        lambda w: ("POST", f"/v1/jobs/{w.release}/cancel", {}), "operator", 409, False),
}

ROLE_RANK = {"consumer": 0, "analyst": 1, "operator": 2}
CALLERS = ["none", "unknown", "revoked", "expired", "consumer", "analyst", "operator",
           "consumer-other", "analyst-other"]


@pytest.fixture(scope="module")
def world(app: Flask, worker: Any) -> World:
    client = app.test_client()
    r = app.extensions["redis"]
    w = World(client, r, "", "", "", {})
    w.ds, w.other = w.upload(), w.upload()
    body = _release_body(w)
    resp = client.post("/v1/releases", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    w.release = resp.get_json()["id"]
    Api(client).wait(w.release)  # finished: cancelling it is a 409 for operators
    tokens: dict[str, str | None] = {"none": None, "unknown": "pr_not_a_key",
                                     "operator": TOKEN}
    for role in ("consumer", "analyst"):
        tokens[role] = apikeys.create(r, role, datasets=(w.ds,))[1]
        tokens[f"{role}-other"] = apikeys.create(r, role, datasets=(w.other,))[1]
    revoked_key, tokens["revoked"] = apikeys.create(r, "operator")
    apikeys.revoke(r, revoked_key.id)
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    tokens["expired"] = apikeys.create(r, "operator", expires_at=past)[1]
    w.tokens = tokens
    return w


def test_every_route_has_a_rule(app: Flask) -> None:
    routes = {(rule.rule, method) for rule in app.url_map.iter_rules()
              for method in rule.methods or () if method not in {"HEAD", "OPTIONS"}
              and rule.rule not in PUBLIC and rule.endpoint != "static"}
    assert routes == set(RULES)


def _expected(caller: str, least: str, ok: int, scoped: bool) -> int:
    if caller in {"none", "unknown", "revoked", "expired"}:
        return 401
    role, _, other = caller.partition("-")
    if ROLE_RANK[role] < ROLE_RANK[least]:
        return 403
    return 403 if other and scoped else ok


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("route", sorted(RULES), ids=lambda r: f"{r[1]} {r[0]}")
def test_matrix(world: World, route: tuple[str, str], caller: str) -> None:
    request, least, ok, scoped = RULES[route]
    method, path, kwargs = request(world)
    token = world.tokens[caller]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = world.client.open(path, method=method, headers=headers, **kwargs)
    assert resp.status_code == _expected(caller, least, ok, scoped), resp.get_data(as_text=True)
    if resp.status_code in {401, 403}:
        assert resp.mimetype == "application/problem+json"


def test_public_probes_need_no_key(app: Flask, worker: Any) -> None:
    client = app.test_client()
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs", "/metrics"):
        assert client.get(path).status_code == 200, path
