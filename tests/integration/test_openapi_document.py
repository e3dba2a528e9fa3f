"""``/openapi.json`` is a document a generated client and a person can use (issue #18 §2).

Valid OpenAPI 3; ``params`` typed per mechanism (a ``oneOf`` discriminated by
``mechanism``, built from the registry); headers and statuses the routes really have
(415, ``Idempotency-Key``, ``Location``); and request examples, one per mechanism family,
that run as written against the upload example's dataset.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from flask import Flask
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

import mechanisms
from mechanisms import registry
from service.api import openapi
from service.api.problems import PROBLEM_TYPE
from tests.integration.conftest import TOKEN, Api

OPERATOR = {"Authorization": f"Bearer {TOKEN}"}
METHODS = {"get", "post", "put", "patch", "delete"}
#: path ids the routes' converters accept (the 415 check runs once a route matched)
PLACEHOLDERS = {"release_id": "rel_" + "0" * 24, "dataset_id": "ds_" + "0" * 16,
                "analysis_id": "an_" + "0" * 24, "key_id": "key_0", "version": "1"}


@pytest.fixture(scope="module")
def spec(app: Flask) -> dict[str, Any]:
    doc: dict[str, Any] = app.test_client().get("/openapi.json").get_json()
    return doc


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, item in spec["paths"].items()
            for method, op in item.items() if method in METHODS]


def _validator(spec: dict[str, Any], name: str) -> OAS30Validator:
    """A validator of component ``name`` that resolves the document's other components."""
    return OAS30Validator({**spec["components"]["schemas"][name],
                           "components": spec["components"]})


def test_document_is_valid_openapi_3(spec: dict[str, Any]) -> None:
    """Catches a hand-written part (oneOf, headers, examples) that breaks the document."""
    validate(spec)
    assert spec["openapi"].startswith("3.0")
    assert all(op.get("summary") and op.get("operationId") for _, _, op in _operations(spec))


def test_release_params_are_typed_per_mechanism(spec: dict[str, Any], api: Api) -> None:
    """Catches ``params`` documented as any object (generated clients then offer
    ``additionalProp1``) and a mechanism missing from, or drifting from, the oneOf."""
    schemas = spec["components"]["schemas"]
    names = mechanisms.names()
    catalog = {m["name"]: m for m in api.get("/v1/mechanisms").get_json()}
    for kind in ("ReleaseRequest", "EstimateRequest"):
        request = schemas[kind]
        assert request["discriminator"]["propertyName"] == "mechanism"
        mapping = request["discriminator"]["mapping"]
        assert sorted(mapping) == names
        assert [alt["$ref"] for alt in request["oneOf"]] == [mapping[n] for n in names]
        for name in names:
            alt = schemas[openapi.schema_name(name, kind)]
            assert alt["properties"]["mechanism"]["enum"] == [name]
            params = {k: v for k, v in alt["properties"]["params"].items()
                      if k != "description"}
            assert params == catalog[name]["params_schema"], name  # the registry's schema
            assert sorted(alt["properties"]["budget"]["properties"]) == sorted(
                mechanisms.get(name).measures)
            if kind == "ReleaseRequest":
                assert {"dataset_id", "mechanism", "budget"} <= set(alt["required"])
            else:  # a budget or a target, exactly one
                assert {"dataset_id", "mechanism"} <= set(alt["required"])
                assert "budget" not in alt["required"] and "target" not in alt["required"]
                assert alt["properties"]["target"]["required"] == ["half_width"]
    for path, kind in (("/v1/releases", "ReleaseRequest"),
                       ("/v1/releases/estimate", "EstimateRequest")):
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{kind}"}
    # the upload references the metadata format
    upload = spec["paths"]["/v1/datasets"]["post"]["requestBody"]["content"]
    metadata = upload["multipart/form-data"]["schema"]["properties"]["metadata"]
    assert metadata == {"$ref": "#/components/schemas/DatasetMetadata"}
    assert "columns" in schemas["DatasetMetadata"]["properties"]


def test_headers_and_statuses_are_declared(spec: dict[str, Any]) -> None:
    """Catches a body-taking operation without its 415, an honoured Idempotency-Key that
    is not declared, and a 201/202 without Location (an estimate's 202: Retry-After)."""
    for method, path, op in _operations(spec):
        where = f"{method.upper()} {path}"
        assert ("415" in op["responses"]) == (method in {"post", "put", "patch"}), where
        params = {p["name"] for p in op.get("parameters", []) if p["in"] == "header"}
        honours = where in {"POST /v1/datasets", "POST /v1/datasets/{dataset_id}/versions",
                            "POST /v1/releases"}
        assert ("Idempotency-Key" in params) == honours, where
        for status in ("201", "202"):
            if status in op["responses"]:
                header = "Retry-After" if where == "POST /v1/releases/estimate" else "Location"
                declared = op["responses"][status].get("headers", {})
                assert declared.get(header, {}).get("required") is True, (where, status)


def test_415_answers_where_documented(app: Flask, spec: dict[str, Any]) -> None:
    """Every body-taking operation answers a text/plain body with a 415 problem, as its
    document now says (a client generated from it knows the status)."""
    client = app.test_client()
    for method, path, _ in _operations(spec):
        if method not in {"post", "put", "patch"}:
            continue
        url = path.format(**PLACEHOLDERS)
        resp = client.open(url, method=method.upper(), data="x", content_type="text/plain",
                           headers=OPERATOR)
        assert resp.status_code == 415, (method, path, resp.get_json())
        assert resp.mimetype == PROBLEM_TYPE


def _family(mechanism: str) -> str:
    module = type(mechanisms.get(mechanism)).__module__
    return next(m for m in registry.BUILTIN if module == m or module.startswith(m + "."))


def test_examples_cover_every_family_and_run_as_written(
        app: Flask, spec: dict[str, Any], api: Api, worker: Any) -> None:
    """Catches examples that do not run (an unknown column, a budget the example dataset
    lacks), a family without one, and a test-only ``seed`` in them. The upload example
    is posted as documented, then every release example is estimated and released."""
    operation = spec["paths"]["/v1/datasets"]["post"]
    example = operation["requestBody"]["content"]["multipart/form-data"]["example"]

    def upload(idempotency_key: str) -> Any:
        data = {"metadata": json.dumps(example["metadata"]),
                "file": (io.BytesIO(example["file"].encode()), "people.csv")}
        return api.client.post("/v1/datasets", data=data, content_type="multipart/form-data",
                               headers={**OPERATOR, "Idempotency-Key": idempotency_key})

    made = upload("docs-example")
    assert made.status_code == 201, made.get_json()
    dataset = made.get_json()
    # a dataset admits DP or noiseless releases, not both (manual: privacy notions per
    # dataset): the noiseless examples run on a second upload of the same example
    noiseless_dataset = upload("docs-example-noiseless").get_json()
    assert made.headers["Location"] == f"/v1/datasets/{dataset['id']}"
    assert api.get(made.headers["Location"]).get_json()["id"] == dataset["id"]

    for path, kind in (("/v1/releases", "ReleaseRequest"),
                       ("/v1/releases/estimate", "EstimateRequest")):
        request_validator = _validator(spec, kind)
        examples = spec["paths"][path]["post"]["requestBody"]["content"][
            "application/json"]["examples"]
        assert {_family(e["value"]["mechanism"]) for e in examples.values()} == set(
            registry.BUILTIN), path
        for name, ex in examples.items():
            assert "seed" not in ex["value"] and ex["summary"], name
            assert "additionalProp" not in json.dumps(ex), name
            request_validator.validate(ex["value"])
    # an estimate's target examples run as written too (and are no release request)
    estimates = spec["paths"]["/v1/releases/estimate"]["post"]["requestBody"]["content"][
        "application/json"]["examples"]
    for name in openapi.TARGET_EXAMPLES:
        body = {**estimates[name]["value"], "dataset_id": dataset["id"]}
        estimate = api.estimate(body)
        assert estimate.status_code == 200, (name, estimate.get_json())
        assert estimate.get_json()["fits"] is True and estimate.get_json()["budget"], name
        assert not _validator(spec, "ReleaseRequest").is_valid(body), name

    examples = spec["paths"]["/v1/releases"]["post"]["requestBody"]["content"][
        "application/json"]["examples"]
    released = []
    for name, ex in examples.items():
        target = noiseless_dataset if name == "noiseless" else dataset
        body = {**ex["value"], "dataset_id": target["id"]}
        estimate = api.estimate(body)
        assert estimate.status_code == 200, (name, estimate.get_json())
        assert estimate.get_json()["fits"] is True, name
        resp = api.post("/v1/releases", body)
        assert resp.status_code == 202, (name, resp.get_json())
        assert resp.headers["Location"] == f"/v1/releases/{resp.get_json()['id']}"
        released.append((name, resp.get_json()["id"]))
    for name, release_id in released:
        doc = api.wait(release_id, timeout=60)
        assert doc["status"] == "succeeded", (name, doc)

    # Location of the other creations answers with what was created
    key = api.post("/v1/keys", {"role": "consumer", "label": "docs"})
    assert key.status_code == 201 and key.headers["Location"] == (
        f"/v1/keys/{key.get_json()['id']}")
    record = next(r for name, r in released if name == "interval")
    analysis = api.post(f"/v1/releases/{record}/analyses", {"analysis": "npmle"})
    assert analysis.status_code == 202, analysis.get_json()
    assert api.get(analysis.headers["Location"]).get_json()["id"] == analysis.get_json()["id"]
