"""Contract fuzzing: schemathesis drives every operation of ``/openapi.json``.

The app runs in-process (WSGI) on the session's real Valkey with the real worker. Every
operation is fuzzed as each kind of caller (operator, analyst, consumer, no key, an
unknown key) and every response must hold to the contract:

- never a 5xx;
- its status is documented for the operation, its body matches the documented schema
  and its ``Content-Type`` the documented media type;
- schema-invalid requests are refused with a 4xx (``negative_data_rejection``) and
  operations that declare the bearer scheme refuse missing or bad tokens (``ignored_auth``);
- every error is ``application/problem+json`` with ``type``, ``title``, ``status`` (equal
  to the HTTP status) and ``detail`` (``problem_json`` below).

``positive_data_acceptance`` is off: the request schemas cannot say every rule the
service checks (a mechanism's params depend on the mechanism, the dataset metadata is
JSON inside a multipart field, ids must exist, a budget must fit), so a schema-valid
request can be rightly refused with a documented 422 or 409. ``use_after_free`` is off:
``DELETE /v1/datasets/{id}`` retires a dataset, whose metadata, budget and ledger stay
readable by design (README), and keys have no read-one operation to check.

Path ids are drawn half the time from real resources (a dataset, succeeded releases, an
analysis, disposable keys), so the fuzzer gets past 404 into the code behind it.

``FUZZ_MAX_EXAMPLES`` sets the examples per operation and caller (default 5, for CI);
``make fuzz`` runs many more.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import hypothesis
import pytest
import schemathesis
from flask import Flask
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, Response

from service import apikeys
from service.problems import PROBLEM_TYPE
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "5"))
BODY = "<body>"
RELEASE_PATHS = {"/v1/releases", "/v1/releases/estimate"}
#: swapped into release requests, so some reach the ledger and the worker
WORKABLE_RELEASE = {"mechanism": "laplace", "params": {"statistic": "mean", "column": "age"},
                    "budget": {"epsilon": 0.01}}


@schemathesis.check
def problem_json(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every error is an RFC 9457 problem document whose status is the HTTP status."""
    if response.status_code < 400:
        return None
    ctype = response.headers.get("content-type", [""])[0].split(";")[0].strip()
    assert ctype == PROBLEM_TYPE, f"error with Content-Type {ctype!r}, not {PROBLEM_TYPE}"
    body = json.loads(response.content)
    missing = {"type", "title", "status", "detail"} - set(body)
    assert not missing, f"problem document lacks {sorted(missing)}"
    assert body["status"] == response.status_code, "problem status differs from HTTP status"
    return True


@dataclass
class World:
    """Real resources the fuzzer's path ids are drawn from, and one token per caller."""

    tokens: dict[str, str | None]
    ids: dict[str, list[str]]
    upload: dict[str, Any]  # a valid multipart body for POST /v1/datasets


def _upload(api: Api, csv: str, meta: dict[str, Any]) -> str:
    resp = api.upload(csv, meta)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def _release(api: Api, body: dict[str, Any]) -> str:
    resp = api.post("/v1/releases", body)
    assert resp.status_code in {200, 202}, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    return str(doc["id"])


@pytest.fixture(scope="module")
def world(app: Flask, worker: Any) -> World:
    api = Api(app.test_client())
    r = app.extensions["redis"]
    meta = {**PEOPLE_META, "budgets": {**PEOPLE_META["budgets"], "interval_leakage": 0.9}}
    meta["columns"] = {**PEOPLE_META["columns"], "income": {
        "type": "continuous", "bounds": [0, 1000],
        "prior": {"family": "normal", "loc": 500, "scale": 200}}}
    ds = _upload(api, people_csv(60), meta)
    victims = [_upload(api, people_csv(5), PEOPLE_META) for _ in range(2)]
    scalar = _release(api, {"dataset_id": ds, "mechanism": "laplace", "seed": 1,
                            "params": {"statistic": "mean", "column": "age"},
                            "budget": {"epsilon": 0.5}})
    records = _release(api, {"dataset_id": ds, "mechanism": "interval.case1", "seed": 2,
                             "params": {"column": "income", "anchors": {
                                 "family": "logistic", "loc": 500, "scale": 200}},
                             "budget": {"interval_leakage": 0.5}})
    curve = _release(api, {"dataset_id": ds, "mechanism": "iclp.kde", "seed": 3,
                           "params": {"column": "income", "grid_size": 16},
                           "budget": {"epsilon": 0.5}})
    analysis = api.post(f"/v1/releases/{records}/analyses", {"analysis": "npmle"})
    assert analysis.status_code == 202, analysis.get_json()
    _, analyst = apikeys.create(r, "analyst", "fuzz analyst", datasets=(ds,))
    _, consumer = apikeys.create(r, "consumer", "fuzz consumer", datasets=(ds,))
    disposable = [apikeys.create(r, "consumer", "fuzz disposable")[0].id for _ in range(3)]
    return World(
        tokens={"operator": TOKEN, "analyst": analyst, "consumer": consumer,
                "no key": None, "unknown key": "pr_not_a_registered_key"},
        ids={"dataset_id": [ds], "release_id": [scalar, records, curve],
             "analysis_id": [analysis.get_json()["id"]], "key_id": disposable,
             "victim_dataset_id": victims},
        upload={"metadata": json.dumps(PEOPLE_META), "file": people_csv(20)},
    )


@pytest.fixture(scope="module")
def api_schema(app: Flask, world: World) -> Iterator[schemathesis.BaseSchema]:
    config = schemathesis.Config.from_dict({
        "seed": 20261123,
        "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True,
                       "with-security-parameters": False, "database": "none"},
        "checks": {"positive_data_acceptance": {"enabled": False},
                   "use_after_free": {"enabled": False}},
        "phases": {"coverage": {"enabled": os.environ.get("FUZZ_COVERAGE", "1") == "1"},
                   "fuzzing": {"enabled": os.environ.get("FUZZ_FUZZING", "1") == "1"}},
    })
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app, config=config)

    @schema.hook
    def flatmap_case(context: Any, case: Case) -> st.SearchStrategy[Case]:
        """Often a real id for each path id and a workable body (else as generated).

        Only in valid (positive) cases: negative cases stay as generated, so that
        ``negative_data_rejection`` judges what the fuzzer meant to be invalid.
        """
        if case.meta is not None and case.meta.generation.mode.is_negative:
            return st.just(case)
        swaps: dict[str, st.SearchStrategy[Any]] = {}
        for name in case.path_parameters or {}:
            pool = world.ids.get(f"victim_{name}" if case.method.upper() == "DELETE" else name)
            if pool:
                swaps[name] = st.one_of(st.sampled_from(pool), st.none())
        if (case.method.upper(), case.path) == ("POST", "/v1/datasets"):
            swaps[BODY] = st.one_of(st.just(world.upload), st.none())
        elif case.path in RELEASE_PATHS and isinstance(case.body, dict):
            body = case.body
            swaps[BODY] = st.one_of(st.sampled_from(world.ids["dataset_id"]).map(
                lambda ds: {**body, **WORKABLE_RELEASE, "dataset_id": ds}), st.none())
        if not swaps:
            return st.just(case)

        def swap(chosen: dict[str, Any]) -> Case:
            new = case.derive(keep_auth=True)
            for name, value in chosen.items():
                if value is not None and name == BODY:
                    new.body = value
                elif value is not None:
                    new.path_parameters[name] = value
            return new

        return st.fixed_dictionaries(swaps).map(swap)

    yield schema


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_shim(request: pytest.FixtureRequest) -> None:
    """schemathesis' lazy loader renames ``node._nodeid``, an attribute pytest 9.2 dropped."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


def _call_as_everyone(case: Case, world: World) -> None:
    """Send the case as each caller in turn (one generated case, five contracts)."""
    for role, token in world.tokens.items():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            case.call_and_validate(headers=headers)
        except BaseException as exc:
            exc.add_note(f"sent as: {role}")
            raise


@schema.parametrize()
@hypothesis.settings(deadline=None)
def test_every_operation_as_every_caller(case: Case, world: World) -> None:
    _call_as_everyone(case, world)


def test_stateful_workflows(api_schema: schemathesis.BaseSchema, world: World) -> None:
    """Chains of calls linked by the ids they return (create dataset -> release -> read)."""
    machine = api_schema.as_state_machine()
    OPERATOR = {"Authorization": f"Bearer {TOKEN}"}

    class Workflow(machine):  # type: ignore[misc,valid-type]
        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"headers": OPERATOR}

        def validate_response(self, response: Response, case: Case,
                              additional_checks: Any = None, **kwargs: Any) -> None:
            # pass the headers on, so ``ignored_auth`` knows the token is ours, not generated
            case.validate_response(response, additional_checks=additional_checks,
                                   headers=OPERATOR, transport_kwargs=kwargs,
                                   recorder=self.recorder)

    Workflow.run(settings=hypothesis.settings(
        max_examples=MAX_EXAMPLES, stateful_step_count=10, deadline=None, derandomize=True,
        database=None, suppress_health_check=list(hypothesis.HealthCheck)))
