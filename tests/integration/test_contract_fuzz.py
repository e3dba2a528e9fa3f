"""Contract fuzzing: schemathesis drives every operation of ``/openapi.json``.

The app runs in-process (WSGI) on the session's real store with the real worker. Every
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
readable by design (the manual), and keys have no read-one operation to check.
``ensure_resource_availability`` is off: the links schemathesis infers from ids lead from
a new release to sub-resources only some mechanisms have (``/data`` of a scalar release
is a 404 by design). The stateful test asserts its own chain instead: a dataset created,
released from and the release read back, all within the workflows.

In valid cases, path ids are often swapped for real resources (a dataset, succeeded
releases, an analysis, disposable keys) and upload / release bodies for workable ones, so
the fuzzer gets past 404 and 422 into the code behind them.

``FUZZ_MAX_EXAMPLES`` sets the examples per operation and caller (default 5, for CI);
``make fuzz`` runs many more.
"""

from __future__ import annotations

import io
import itertools
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

from service import apikeys, wiring
from service.api.problems import PROBLEM_TYPE
from tests.integration import record_state
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "5"))
GENERATION = {"max-examples": MAX_EXAMPLES, "deterministic": True,
              "with-security-parameters": False, "database": "none"}
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
    keep: set[str]  # the callers' key ids and the shared dataset: never revoked or retired


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


def _unlist_ledger_only_releases(app: Flask) -> None:
    """Ledger tests reserve straight through the session's store with a stub request
    ("{}"), which the API never writes; unlist them so the listings show only what the API
    can make (the lists are the ``releases`` rows: the rows go)."""
    svc = wiring.of(app)
    stubs = [release_id for release_id, request in
             record_state.sql(svc.ledger, "SELECT id, request FROM releases")
             if "dataset_version" not in json.loads(request)]
    record_state.sql(svc.ledger, "DELETE FROM outbox WHERE release_id = ANY(%s)", stubs)
    record_state.sql(svc.ledger, "DELETE FROM releases WHERE id = ANY(%s)", stubs)


@pytest.fixture(scope="module")
def world(app: Flask, worker: Any) -> World:
    api = Api(app.test_client())
    keys = wiring.of(app).keys
    _unlist_ledger_only_releases(app)
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
    analyst_key, analyst = apikeys.create(keys, "analyst", "fuzz analyst", datasets=(ds,))
    consumer_key, consumer = apikeys.create(keys, "consumer", "fuzz consumer", datasets=(ds,))
    operator_key = apikeys.lookup(keys, TOKEN)
    assert operator_key is not None
    disposable = [apikeys.create(keys, "consumer", "fuzz disposable")[0].id for _ in range(3)]
    return World(
        tokens={"operator": TOKEN, "analyst": analyst, "consumer": consumer,
                "no key": None, "unknown key": "pr_not_a_registered_key"},
        ids={"dataset_id": [ds], "release_id": [scalar, records, curve],
             "analysis_id": [analysis.get_json()["id"]], "key_id": disposable,
             "victim_dataset_id": victims},
        # metadata is a JSON part (encoding: application/json): schemathesis sends the object
        upload={"metadata": PEOPLE_META, "file": people_csv(20)},
        keep={operator_key.id, analyst_key.id, consumer_key.id, ds},
    )


@pytest.fixture(scope="module")
def api_schema(app: Flask, world: World) -> Iterator[schemathesis.BaseSchema]:
    config = schemathesis.Config.from_dict({
        "seed": 20261123,
        "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
        "generation": GENERATION,
        "checks": {"positive_data_acceptance": {"enabled": False},
                   "use_after_free": {"enabled": False},
                   "ensure_resource_availability": {"enabled": False}},
        # a release body is a oneOf of every mechanism's request (params typed per
        # mechanism): the coverage phase would enumerate every boundary of every
        # alternative (thousands of cases per caller, past the rate limit); instead
        # the fuzzing phase draws three times as many bodies from it
        "operations": [{"include-method": "POST",
                        "include-path-regex": "^/v1/releases(/estimate)?$",
                        "generation": {**GENERATION, "max-examples": 3 * MAX_EXAMPLES},
                        "phases": {"coverage": {"enabled": False}}}],
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
def test_every_operation_as_every_caller(case: Case, world: World) -> None:
    _call_as_everyone(case, world)


def test_stateful_workflows(api_schema: schemathesis.BaseSchema, world: World,
                            api: Api) -> None:
    """Chains of calls linked by the ids they return: create a dataset, release from it,
    read the release (schemathesis infers the links from the response schemas)."""
    machine = api_schema.as_state_machine()
    operator = {"Authorization": f"Bearer {TOKEN}"}
    created: list[str] = []  # datasets the workflows made
    released: list[str] = []  # releases the workflows made of those datasets
    seeds = itertools.count(1)
    read: set[str] = set()  # of those, read back (the release, its data or plot)

    def _workflow_dataset() -> str:
        """The workflows' dataset, made here when a release comes first (an
        Idempotency-Key of its own: one dataset whatever the number of sequences)."""
        resp = api.client.post(
            "/v1/datasets", content_type="multipart/form-data",
            headers={**operator, "Idempotency-Key": "fuzz-workflow-release"},
            data={"metadata": json.dumps(world.upload["metadata"]),
                  "file": (io.BytesIO(world.upload["file"].encode()), "data.csv")})
        assert resp.status_code in {200, 201}, resp.get_json()
        return str(resp.get_json()["id"])

    class Workflow(machine):  # type: ignore[misc,valid-type]
        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"headers": operator}

        def before_call(self, case: Case) -> None:
            # inputs are fuzzed per operation above; here the sequences matter, so uploads
            # are valid and a release asks for something workable of the dataset made last
            # (schemathesis links ids into paths, not into request bodies)
            op = f"{case.method.upper()} {case.path}"
            if op == "POST /v1/datasets":
                case.body = dict(world.upload)
                # one dataset for every workflow: the listings the links read from (and
                # the index a link draws into them) stay the same in every sequence
                case.headers = {**(case.headers or {}), "Idempotency-Key": "fuzz-workflow"}
            elif op == "POST /v1/releases":
                if not created:
                    # the derandomized order may reach a release before any upload (it
                    # changes with every schema change): the release's dataset first
                    created.append(_workflow_dataset())
                # whole, not merged: a fuzzed extra (callback_url, a non-object body) would
                # make the chain hang on a 4xx, and bodies are fuzzed per operation above;
                # a seed of its own makes it a new release (202) in every sequence, never a
                # replay (200) of the one an earlier sequence made of the same dataset, which
                # fills another bundle and reads to hypothesis as a flaky strategy
                case.body = {**WORKABLE_RELEASE, "dataset_id": created[-1],
                             "seed": next(seeds)}
                if case.headers:  # a generated key met again: 422 mismatch, not 202
                    case.headers.pop("Idempotency-Key", None)
            elif (op.startswith("GET /v1/releases/{release_id}") and released
                  and case.path_parameters.get("release_id") not in released):
                # the inferred links reach a release read only by chance (the derandomized
                # run changes with every schema change): read the one made last
                case.path_parameters["release_id"] = released[-1]
            # a generated cursor is always refused (422): lists are walked from their start
            if isinstance(case.query, dict):
                case.query.pop("cursor", None)
            # a listing links every key and dataset to DELETE: spare the ones the tests use,
            # and the workflows' own datasets: a release on the one made last must answer
            # alike in every sequence (202, not 409 dataset_retired after another sequence
            # retired it, which hypothesis reports as a flaky strategy)
            if case.method.upper() == "DELETE":
                for name, spare in (("key_id", world.ids["key_id"][0]),
                                    ("dataset_id", world.ids["victim_dataset_id"][0])):
                    if case.path_parameters.get(name) in world.keep | set(created):
                        case.path_parameters[name] = spare

        def after_call(self, response: Response, case: Case) -> None:
            super().after_call(response, case)
            op, ok = f"{case.method.upper()} {case.path}", response.status_code < 300
            if ok and op == "POST /v1/datasets":
                created.append(json.loads(response.content)["id"])
            elif ok and op == "POST /v1/releases":
                release_id = json.loads(response.content)["id"]
                if case.body.get("dataset_id") in created:
                    released.append(release_id)
                # let it end: a read or cancel of it then answers the same in every run of
                # a sequence (not 409 "not yet" in one and 404 or 200 in the replay, which
                # hypothesis reports as a flaky strategy)
                api.wait(release_id)
            elif ok and op.startswith("GET /v1/releases/{release_id}"):
                read.update(set(released) & {case.path_parameters["release_id"]})

        def validate_response(self, response: Response, case: Case,
                              additional_checks: Any = None, **kwargs: Any) -> None:
            # pass the headers on, so ``ignored_auth`` knows the token is ours, not generated
            case.validate_response(response, additional_checks=additional_checks,
                                   headers=operator, transport_kwargs=kwargs,
                                   recorder=self.recorder)

    # generate only: a replay to shrink meets a server whose state has moved on
    Workflow.run(settings=hypothesis.settings(
        max_examples=4 * MAX_EXAMPLES, stateful_step_count=10, deadline=None, derandomize=True,
        database=None, phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck)))
    assert created and released, "no workflow went dataset -> release"
    # the derandomized run reaches a read of its release only by chance (the sequence
    # changes with every schema change): read each one made, and hold it to the contract
    read_one = api_schema["/v1/releases/{release_id}"]["GET"]
    for release_id in dict.fromkeys(released):
        case = read_one.Case(path_parameters={"release_id": release_id})
        response = case.call(headers=operator)
        case.validate_response(response, headers=operator)
        assert response.status_code == 200, response.text
        read.add(release_id)
    assert read
