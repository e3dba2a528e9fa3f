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
from flask import Flask
from flask.testing import FlaskClient

from service import apikeys, wiring
from service.storage.keys import KeyStore
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

PUBLIC = {"/", "/problems", "/problems/<string(maxlength=64):code>", "/healthz", "/readyz",
          "/metrics", "/openapi.json", "/docs", "/docs/<path:filename>", "/docs/assets/<name>",
          "/manual", "/manual/", "/manual/<path:name>"}
_counter = itertools.count()


@dataclass
class World:
    client: FlaskClient
    keys: KeyStore
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
#:                    dataset-scoped: a key granted another dataset gets 404, as if the
#:                    dataset or release did not exist)
RULES: dict[tuple[str, str], tuple[Request, str, int, bool]] = {
    ("/v1/datasets", "POST"): (lambda w: ("POST", "/v1/datasets", {
        "data": {"metadata": json.dumps(PEOPLE_META),
                 "file": (io.BytesIO(people_csv(5).encode()), "d.csv")},
        "content_type": "multipart/form-data"}), "operator", 201, False),
    ("/v1/datasets", "GET"): (lambda w: ("GET", "/v1/datasets", {}), "consumer", 200, False),
    ("/v1/datasets/<dataset_id>", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}", {}), "consumer", 200, True),
    ("/v1/datasets/<dataset_id>/dummy.csv", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}/dummy.csv", {}), "consumer", 200, True),
    ("/v1/datasets/<dataset_id>", "DELETE"): (
        lambda w: ("DELETE", f"/v1/datasets/{w.upload()}", {}), "operator", 200, True),
    ("/v1/datasets/<dataset_id>/budget", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}/budget", {}), "analyst", 200, True),
    ("/v1/datasets/<dataset_id>/budget", "PATCH"): (
        lambda w: ("PATCH", f"/v1/datasets/{w.ds}/budget", {"json": {"caps": {"epsilon": 5}}}),
        "operator", 200, True),
    ("/v1/datasets/<dataset_id>/ledger", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}/ledger", {}), "operator", 200, True),
    ("/v1/datasets/<dataset_id>/versions", "POST"): (
        lambda w: ("POST", f"/v1/datasets/{w.ds}/versions", {
            "data": {"file": (io.BytesIO(people_csv(5).encode()), "d.csv")},
            "content_type": "multipart/form-data"}), "operator", 201, True),
    ("/v1/datasets/<dataset_id>/versions", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}/versions", {}), "consumer", 200, True),
    ("/v1/datasets/<dataset_id>/versions/<int:version>", "GET"): (
        lambda w: ("GET", f"/v1/datasets/{w.ds}/versions/1", {}), "consumer", 200, True),
    ("/v1/datasets/<dataset_id>/versions/<int:version>", "PATCH"): (  # v1 is current: 200
        lambda w: ("PATCH", f"/v1/datasets/{w.ds}/versions/1", {"json": {"current": True}}),
        "operator", 200, True),
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
    ("/v1/releases/<release_id>/plot.png", "GET"): (  # its count drawn with its interval
        lambda w: ("GET", f"/v1/releases/{w.release}/plot.png", {}), "consumer", 200, True),
    ("/v1/releases/<release_id>/plot.svg", "GET"): (
        lambda w: ("GET", f"/v1/releases/{w.release}/plot.svg", {}), "consumer", 200, True),
    ("/v1/releases/<release_id>/analyses", "POST"): (  # nor analyses
        lambda w: ("POST", f"/v1/releases/{w.release}/analyses", {"json": {"analysis": "em"}}),
        "consumer", 422, True),
    ("/v1/releases/<release_id>/analyses/<analysis_id>", "GET"): (
        lambda w: ("GET", f"/v1/releases/{w.release}/analyses/ana_none", {}),
        "consumer", 404, True),
    ("/v1/releases/<release_id>/analyses/<analysis_id>/plot.png", "GET"): (
        lambda w: ("GET", f"/v1/releases/{w.release}/analyses/ana_none/plot.png", {}),
        "consumer", 404, True),
    ("/v1/releases/<release_id>/analyses/<analysis_id>/plot.svg", "GET"): (
        lambda w: ("GET", f"/v1/releases/{w.release}/analyses/ana_none/plot.svg", {}),
        "consumer", 404, True),
    ("/v1/releases/<release_id>/analyses", "GET"): (
        lambda w: ("GET", f"/v1/releases/{w.release}/analyses", {}), "consumer", 200, True),
    ("/v1/releases/<release_id>/analyses/<analysis_id>/cancel", "POST"): (
        lambda w: ("POST", f"/v1/releases/{w.release}/analyses/ana_none/cancel", {}),
        "consumer", 404, True),
    ("/v1/keys", "POST"): (
        lambda w: ("POST", "/v1/keys", {"json": {"role": "consumer"}}), "operator", 201, False),
    ("/v1/keys", "GET"): (lambda w: ("GET", "/v1/keys", {}), "operator", 200, False),
    ("/v1/keys/<key_id>", "DELETE"): (
        lambda w: ("DELETE", f"/v1/keys/{apikeys.create(w.keys, 'consumer')[0].id}", {}),
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
    keys = wiring.of(app).keys
    w = World(client, keys, "", "", "", {})
    w.ds, w.other = w.upload(), w.upload()
    body = _release_body(w)
    resp = client.post("/v1/releases", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    w.release = resp.get_json()["id"]
    Api(client).wait(w.release)  # finished: cancelling it is a 409 for operators
    tokens: dict[str, str | None] = {"none": None, "unknown": "pr_not_a_key",
                                     "operator": TOKEN}
    for role in ("consumer", "analyst"):
        tokens[role] = apikeys.create(keys, role, datasets=(w.ds,))[1]
        tokens[f"{role}-other"] = apikeys.create(keys, role, datasets=(w.other,))[1]
    revoked_key, tokens["revoked"] = apikeys.create(keys, "operator")
    apikeys.revoke(keys, revoked_key.id)
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    tokens["expired"] = apikeys.create(keys, "operator", expires_at=past)[1]
    w.tokens = tokens
    return w


def test_every_route_has_a_rule(app: Flask) -> None:
    routes = {(rule.rule, method) for rule in app.url_map.iter_rules()
              for method in rule.methods or () if method not in {"HEAD", "OPTIONS"}
              and rule.rule not in PUBLIC and rule.endpoint != "static"
              # the console's pages run these same routes' checks (tests/console)
              and not rule.endpoint.startswith("console.")}
    assert routes == set(RULES)


def _expected(caller: str, least: str, ok: int, scoped: bool) -> int:
    if caller in {"none", "unknown", "revoked", "expired"}:
        return 401
    role, _, other = caller.partition("-")
    if ROLE_RANK[role] < ROLE_RANK[least]:
        return 403
    return 404 if other and scoped else ok


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
    for path in ("/", "/healthz", "/readyz", "/openapi.json", "/docs", "/metrics"):
        assert client.get(path).status_code == 200, path


def test_every_problem_type_is_a_page_of_this_service(app: Flask) -> None:
    """#31 item 6: a problem's ``type`` named a placeholder domain nobody serves. Now it is
    ``/problems/<code>`` here, described for every code the API answers with."""
    client = app.test_client()
    refused = client.get("/v1/datasets")  # no key
    problem = refused.get_json()
    assert refused.status_code == 401 and problem["type"] == "/problems/unauthorized"
    page = client.get(problem["type"])
    assert page.status_code == 200 and page.get_json()["code"] == "unauthorized"
    assert "Authorization: Bearer" in page.get_json()["description"]
    listed = {p["code"]: p for p in client.get("/problems").get_json()}
    assert {"budget_exhausted", "validation_error", "memory_limit", "source_changed",
            "possible_reupload"} <= set(listed)
    unknown = client.get("/problems/no_such_code").get_json()
    assert unknown["description"].startswith("A refusal of this service")


def test_the_front_door_sends_browsers_to_the_console_and_clients_an_index(app: Flask) -> None:
    """#31 item 6: ``GET /`` answered 404."""
    client = app.test_client()
    browser = client.get("/", headers={"Accept": "text/html,application/xhtml+xml,"
                                                 "application/xml;q=0.9,*/*;q=0.8"})
    assert browser.status_code == 302 and browser.headers["Location"] == "/console/"
    for accept in ("application/json", "*/*", None):
        answer = client.get("/", headers={"Accept": accept} if accept else {})
        assert answer.status_code == 200 and answer.mimetype == "application/json", accept
        links = answer.get_json()["links"]
        assert answer.get_json()["service"] == "privrelease"
        for name in ("openapi", "docs", "datasets", "releases", "health"):
            assert client.get(links[name]).status_code in {200, 401}, name


MISSING_RELEASE = "rel_" + "0" * 24


def _no_volatile(doc: Any) -> Any:
    """A problem document without per-request fields (none today; instance/trace if added)."""
    if not isinstance(doc, dict):
        return doc
    return {k: v for k, v in doc.items() if k not in {"instance", "trace_id", "request_id"}}


def _answer(w: World, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    resp = w.client.open(path, method=method, json=body,
                         headers={"Authorization": f"Bearer {token}"})
    return resp.status_code, _no_volatile(resp.get_json())


def test_ungranted_dataset_answers_as_a_missing_one_whatever_the_body(world: World) -> None:
    """Catches issue #14 finding 7: main validated a release request against the dataset
    before the grant, so a key without a grant learnt from 422/404/409 answers whether the
    dataset exists or is retired, its column names, categories, bounds and budget left;
    and release reads answered 403 (exists) vs 404 (does not)."""
    token = world.tokens["analyst-other"]
    assert token is not None
    retired = world.upload()
    resp = world.client.delete(f"/v1/datasets/{retired}",
                               headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 200
    count = {"statistic": "count", "condition": {"column": "age", "op": "ge", "value": 30}}
    bodies = {
        "valid": ("geometric", count, {"epsilon": 0.1}),
        "unknown column": ("laplace", {"statistic": "mean", "column": "nope"},
                           {"epsilon": 0.1}),
        "categorical mean": ("laplace", {"statistic": "mean", "column": "group"},
                             {"epsilon": 0.1}),
        "unknown category": ("geometric", {"statistic": "count", "condition": {
            "column": "group", "op": "eq", "value": "zzz"}}, {"epsilon": 0.1}),
        "bins out of bounds": ("laplace", {"statistic": "histogram", "column": "age",
                                           "bins": [-1e9, 0, 1e9]}, {"epsilon": 0.1}),
        "over the cap": ("geometric", count, {"epsilon": 1000}),
        "bad params": ("geometric", {"statistic": "nope"}, {"epsilon": 0.1}),
        "wrong measure": ("geometric", count, {"delta": 1e-9}),
        "unknown mechanism": ("no.such.mechanism", count, {"epsilon": 0.1}),
    }
    missing = "ds_does_not_exist"
    answers = {}
    for name, (mechanism, params, budget) in bodies.items():
        for path in ("/v1/releases", "/v1/releases/estimate"):
            seen = {}
            for ds in (world.ds, retired, missing):
                body = {"dataset_id": ds, "mechanism": mechanism, "params": params,
                        "budget": budget}
                status, doc = _answer(world, token, "POST", path, body)
                seen[ds] = (status, {k: v for k, v in doc.items() if k != "errors"}
                            if status == 422 else doc)
            assert seen[world.ds] == seen[retired] == seen[missing], (name, path, seen)
            answers[(name, path)] = seen[missing]
    # what the schema refuses it refuses for every dataset; everything else is one 404
    schema_level = {k: v for k, v in answers.items() if k[0] == "unknown mechanism"}
    assert all(v[0] == 422 for v in schema_level.values())
    rest = {v[1]["detail"] for k, v in answers.items() if k not in schema_level}
    assert {v[0] for k, v in answers.items() if k not in schema_level} == {404}
    assert rest == {"no such dataset"}
    key = apikeys.lookup(world.keys, token)
    assert key is not None  # and it reserved nothing anywhere
    ledger = wiring.of(world.client.application).ledger
    assert ledger.events(world.ds)  # (the events are read: the dataset has some)
    assert not [e for ds in (world.ds, retired) for e in ledger.events(ds)
                if e.get("actor") == key.id]


def test_ungranted_reads_answer_as_missing_ones(world: World) -> None:
    """Catches issue #14 finding 7 for reads: every endpoint taking a dataset or release
    id answered 403 for an ungranted one and 404 for a missing one (existence leaked)."""
    keys = world.keys
    operator_other = apikeys.create(keys, "operator", datasets=(world.other,))[1]
    consumer_other = world.tokens["consumer-other"]
    analyst_other = world.tokens["analyst-other"]
    assert consumer_other is not None and analyst_other is not None
    ds_paths = [("GET", "/v1/datasets/{}", consumer_other, None),
                ("GET", "/v1/datasets/{}/budget", analyst_other, None),
                ("GET", "/v1/datasets/{}/ledger", operator_other, None),
                ("PATCH", "/v1/datasets/{}/budget", operator_other, {"caps": {"epsilon": 1}}),
                ("PATCH", "/v1/datasets/{}/budget", operator_other, {"caps": {"rho": 1}}),
                ("DELETE", "/v1/datasets/{}", operator_other, None)]
    for method, pattern, token, body in ds_paths:
        granted_not = _answer(world, token, method, pattern.format(world.ds), body)
        missing = _answer(world, token, method, pattern.format("ds_does_not_exist"), body)
        assert granted_not == missing, (method, pattern, granted_not, missing)
        assert granted_not[0] == 404
    rel_paths = [("GET", "/v1/releases/{}", None), ("GET", "/v1/releases/{}/data", None),
                 ("GET", "/v1/releases/{}/plot.png", None),
                 ("GET", "/v1/releases/{}/plot.svg", None),
                 ("GET", "/v1/releases/{}/analyses/ana_none/plot.svg", None),
                 ("POST", "/v1/releases/{}/analyses", {"analysis": "em"}),
                 ("POST", "/v1/releases/{}/analyses", {"analysis": "nope", "params": {}}),
                 ("GET", "/v1/releases/{}/analyses/ana_none", None)]
    for method, pattern, body in rel_paths:
        granted_not = _answer(world, consumer_other, method, pattern.format(world.release),
                              body)
        missing = _answer(world, consumer_other, method, pattern.format(MISSING_RELEASE),
                          body)
        assert granted_not == missing, (method, pattern, granted_not, missing)
        assert granted_not[0] == 404
    cancel = [_answer(world, operator_other, "POST", f"/v1/jobs/{rid}/cancel")
              for rid in (world.release, MISSING_RELEASE)]
    assert cancel[0] == cancel[1] and cancel[0][0] == 404
    jobs = _answer(world, operator_other, "GET", "/v1/jobs")[1]
    assert all(j["dataset_id"] == world.other for j in jobs)
    # a key limited to some datasets grants only those, and never everything
    made = [_answer(world, operator_other, "POST", "/v1/keys",
                    {"role": "analyst", "datasets": [ds]})
            for ds in (world.ds, "ds_does_not_exist")]
    assert made[0] == made[1] and made[0][0] == 422
    status, doc = _answer(world, operator_other, "POST", "/v1/keys", {"role": "analyst"})
    assert status == 422 and doc["field"] == "datasets"


def test_dataset_limited_operator_manages_only_keys_within_its_grants(world: World) -> None:
    """Catches the session-4 finding: an operator key limited to one dataset listed every
    key (unrestricted operators' ids and labels included) and could revoke any of them."""
    keys = world.keys
    operator_other = apikeys.create(keys, "operator", datasets=(world.other,))[1]
    mine = apikeys.create(keys, "consumer", datasets=(world.other,))[0]
    theirs = apikeys.create(keys, "consumer", datasets=(world.ds,))[0]
    both = apikeys.create(keys, "consumer", datasets=(world.ds, world.other))[0]
    unrestricted = apikeys.create(keys, "operator")[0]
    status, listed = _answer(world, operator_other, "GET", "/v1/keys")
    assert status == 200
    ids = {k["id"] for k in listed}
    assert mine.id in ids
    assert not ids & {theirs.id, both.id, unrestricted.id}
    assert all(k["datasets"] is not None and set(k["datasets"]) <= {world.other}
               for k in listed)
    for key in (theirs, both, unrestricted):
        # answered exactly like a key that does not exist, and nothing is revoked
        assert (_answer(world, operator_other, "DELETE", f"/v1/keys/{key.id}")
                == _answer(world, operator_other, "DELETE", "/v1/keys/key_does_not_exist"))
        assert apikeys.exists(keys, key.id)
    resp = world.client.delete(f"/v1/keys/{mine.id}",
                               headers={"Authorization": f"Bearer {operator_other}"})
    assert resp.status_code == 204
    assert not apikeys.exists(keys, mine.id)
    # the unrestricted operator still sees and manages every key
    status, listed = _answer(world, TOKEN, "GET", "/v1/keys")
    assert {theirs.id, both.id, unrestricted.id} <= {k["id"] for k in listed}
