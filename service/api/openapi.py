"""What ``/openapi.json`` says beyond the marshmallow schemas (issue #18 §2).

A generated client and a person reading ``/docs`` need more than the request schemas
say: which headers a route honours or sends, every status it can answer, bodies that run
as pasted, and ``params`` typed per mechanism. The rules live here, in one place, and
come from the code that enforces them (``inputs.check_body`` for 415, the registry for
the mechanisms, ``service.metadata`` for the upload format); the handlers stay as they
are. ``tests/integration/test_openapi_document.py`` holds the document to them and runs
every example; the contract fuzzer holds the service to the document.
"""

from __future__ import annotations

import copy
from typing import Any

from apispec import APISpec, BasePlugin

import mechanisms
from service import budget
from service.api import inputs
from service.api.catalog import json_schema
from service.api.schemas import EstimateRequestSchema, ReleaseRequestSchema

#: endpoints that honour an ``Idempotency-Key`` header (``inputs.idempotency_key``)
IDEMPOTENT = frozenset({"datasets.upload", "datasets.upload_version", "releases.create"})
#: endpoints whose 202 creates nothing (an estimate being priced): ``Retry-After``, no
#: ``Location``
NO_LOCATION = frozenset({"releases.estimate"})

IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "makes a retry safe: the same key answers with what the first request"
                   " made; the same key with a different request is 422"
                   " idempotency_mismatch (remembered for PRIVRELEASE_IDEMPOTENCY_TTL)",
}
LOCATION = {"description": "the URL of what was created", "required": True,
            "schema": {"type": "string"}}
RETRY_AFTER = {"description": "seconds until the estimate is worth asking again",
               "required": True, "schema": {"type": "integer"}}

#: a dataset the release examples run against: POST it (metadata + file) first
EXAMPLE_METADATA: dict[str, Any] = {
    "name": "people",
    "columns": {
        "age": {"type": "integer", "bounds": [0, 100]},
        "income": {"type": "continuous", "bounds": [0, 1000],
                   "prior": {"family": "normal", "loc": 500, "scale": 200}},
        "group": {"type": "categorical", "categories": ["a", "b", "c", "d"]},
    },
    "budgets": {"epsilon": 10, "delta": 1e-5, "interval_leakage": 0.9, "subset_draws": 1,
                "noiseless_bits": 8},
    # the examples include subset and interval releases: one output per record, which a
    # dataset admits only when its operator opts in (the notions follow from the budgets)
    "record_level": True,
}
EXAMPLE_CSV = "age,income,group\n" + "".join(
    f"{20 + i % 50},{(i * 37) % 1000}.5,{'abcd'[i % 4]}\n" for i in range(60))
#: stands for the id the upload answered (``ds_`` + 16 hex digits)
EXAMPLE_DATASET_ID = "ds_0123456789abcdef"

#: one runnable request per mechanism family, against the example dataset
RELEASE_EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "laplace": ("DP mean (Laplace)", {
        "mechanism": "laplace", "params": {"statistic": "mean", "column": "age"},
        "budget": {"epsilon": 0.5}}),
    "geometric": ("DP histogram of a categorical column (geometric)", {
        "mechanism": "geometric", "params": {"statistic": "histogram", "column": "group"},
        "budget": {"epsilon": 0.5}}),
    "gaussian": ("(ε, δ)-DP count of rows meeting a condition (Gaussian)", {
        "mechanism": "gaussian",
        "params": {"statistic": "count", "condition": {"column": "age", "op": "ge",
                                                       "value": 40}},
        "budget": {"epsilon": 0.5, "delta": 1e-6}}),
    "interval": ("Interval-censored microdata, anchors from a prior (interval.case1)", {
        "mechanism": "interval.case1",
        "params": {"column": "income",
                   "anchors": {"family": "logistic", "loc": 500, "scale": 200}},
        "budget": {"interval_leakage": 0.5}}),
    "subset": ("Random subsets holding each record's category (subset.uniform)", {
        "mechanism": "subset.uniform", "params": {"column": "group"},
        "budget": {"subset_draws": 1}}),
    "dip": ("DP synthetic microdata (dip)", {
        "mechanism": "dip", "params": {"columns": ["age", "group"]},
        "budget": {"epsilon": 1}}),
    "iclp": ("DP density estimate on a grid (iclp.kde)", {
        "mechanism": "iclp.kde", "params": {"column": "income", "grid_size": 16},
        "budget": {"epsilon": 0.5}}),
    "noiseless": ("Noiseless-privacy mean (noiseless.aggregate)", {
        "mechanism": "noiseless.aggregate", "params": {"statistic": "mean",
                                                       "column": "income"},
        "budget": {"noiseless_bits": 3}}),
    "competitors": ("DP mean vector, one-point mechanism (opm.mean)", {
        "mechanism": "opm.mean", "params": {"columns": ["income"], "center": "midpoint"},
        "budget": {"epsilon": 1}}),
}


#: estimates only: a target accuracy instead of a budget
TARGET_EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "target": ("The smallest ε whose 95 % interval of a DP mean is within ±2 (laplace)", {
        "mechanism": "laplace", "params": {"statistic": "mean", "column": "age"},
        "target": {"half_width": 2, "level": 0.95}}),
}


def release_examples(estimate: bool = False) -> dict[str, dict[str, Any]]:
    """The examples as OpenAPI ``examples`` (``dataset_id`` first, as one would write);
    an estimate's include the target ones."""
    chosen = {**RELEASE_EXAMPLES, **(TARGET_EXAMPLES if estimate else {})}
    return {name: {"summary": summary,
                   "value": {"dataset_id": EXAMPLE_DATASET_ID, **body}}
            for name, (summary, body) in chosen.items()}


def schema_name(mechanism: str, kind: str = "ReleaseRequest") -> str:
    """``iclp.kde`` -> ``ReleaseRequest_iclp.kde`` (a valid component name); ``kind``
    ``EstimateRequest`` names the estimate's."""
    return f"{kind}_{mechanism}"


def _amount() -> dict[str, Any]:
    # as ``budget.to_fraction`` reads it: a JSON number, or a decimal string read exactly
    return {"anyOf": [{"type": "number", "minimum": 0, "exclusiveMinimum": True},
                      {"type": "string"}],
            "description": "a positive amount (a decimal string is read exactly)"}


def _budget(measures: tuple[str, ...]) -> dict[str, Any]:
    per_column = sorted(set(measures) & budget.PER_COLUMN)
    note = (f"; {', '.join(per_column)} may be named per column (measure:column)"
            if per_column else "")
    return {"type": "object", "minProperties": 1,
            "description": f"the most this release may spend, per measure it charges{note}",
            "properties": {m: _amount() for m in measures},
            "additionalProperties": _amount()}


def _target(schema: dict[str, Any]) -> None:
    """What apispec does not say of ``TargetSchema``: the open ends of its ranges, and δ
    read as an amount."""
    props = schema["properties"]
    props["half_width"]["exclusiveMinimum"] = True
    props["level"].update(exclusiveMinimum=True, exclusiveMaximum=True)
    props["delta"] = {**_amount(), "description": props["delta"]["description"]}


def release_request_schemas() -> dict[str, dict[str, Any]]:
    """``ReleaseRequest`` (and ``EstimateRequest``: a budget or a target) as a ``oneOf`` of
    one schema per mechanism, discriminated by ``mechanism``; each types ``params`` with
    the mechanism's own params schema."""
    out: dict[str, dict[str, Any]] = {}
    for kind, request, what in (
            ("ReleaseRequest", ReleaseRequestSchema, "a release request"),
            ("EstimateRequest", EstimateRequestSchema,
             "a release request to price, with a budget or a target accuracy")):
        base = json_schema(request)
        for name in mechanisms.names():
            mech = mechanisms.get(name)
            schema = copy.deepcopy(base)
            props = schema["properties"]
            props["mechanism"] = {"type": "string", "enum": [name],
                                  "description": mech.description or name}
            props["params"] = {**json_schema(mech.params_schema),
                               "description": f"the parameters of {name}"}
            props["budget"] = _budget(tuple(mech.measures))
            if "target" in props:  # exactly one of budget and target: said in words, as
                # a oneOf of required-only schemas leaves generated clients an untyped body
                _target(props["target"])
                props["budget"]["description"] += " (or give a target; not both)"
            schema["title"] = f"{name} {'estimate' if 'target' in props else 'request'}"
            out[schema_name(name, kind)] = schema
        names = mechanisms.names()
        out[kind] = {
            "oneOf": [{"$ref": f"#/components/schemas/{schema_name(n, kind)}"} for n in names],
            "discriminator": {"propertyName": "mechanism", "mapping": {
                n: f"#/components/schemas/{schema_name(n, kind)}" for n in names}},
            "description": f"{what}; params and budget depend on the mechanism",
        }
    return out


class Documentation(BasePlugin):
    """Per operation: 415 on every body-taking method, ``Idempotency-Key`` where it is
    honoured, ``Location`` on every 201/202 (``Retry-After`` on a priced estimate's 202),
    a schema for CSV and PNG answers, and runnable request examples for releases and
    uploads."""

    def operation_helper(self, path: str | None = None,
                         operations: dict[str, dict[str, Any]] | None = None,
                         **kwargs: Any) -> None:
        rule = kwargs.get("rule")
        if rule is None or not operations:
            return
        endpoint = rule.endpoint
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            if method.upper() in inputs.BODY_METHODS:  # any body of the wrong media type
                responses.setdefault(415, "UNSUPPORTED_MEDIA_TYPE")
            if endpoint in IDEMPOTENT:
                operation.setdefault("parameters", []).append(dict(IDEMPOTENCY_KEY))
            for status, response in responses.items():
                if isinstance(response, dict):
                    _type_media(response)
                if str(status) in {"201", "202"} and isinstance(response, dict):
                    name, header = (("Retry-After", RETRY_AFTER) if endpoint in NO_LOCATION
                                    else ("Location", LOCATION))
                    response.setdefault("headers", {})[name] = dict(header)
            replay = responses.get(200, responses.get("200"))
            if endpoint == "releases.create" and isinstance(replay, dict):
                replay.setdefault("headers", {})["Location"] = dict(LOCATION)
            body = operation.get("requestBody", {}).get("content", {})
            if endpoint in {"releases.create", "releases.estimate"}:
                body["application/json"]["examples"] = release_examples(
                    endpoint == "releases.estimate")
            if endpoint == "datasets.upload":
                body["multipart/form-data"]["example"] = {"metadata": EXAMPLE_METADATA,
                                                          "file": EXAMPLE_CSV}
                # by reference: a folder of Parquet files under a configured source root
                body["application/json"]["example"] = {
                    "source": "s3://exports/people/2026-11", "metadata": EXAMPLE_METADATA}


def _type_media(response: dict[str, Any]) -> None:
    """A CSV or PNG answer documented without a schema is typed as text or bytes, so a
    generated client returns its body (it drops an untyped one)."""
    for media, spec in response.get("content", {}).items():
        if not spec.get("schema"):
            binary = not media.startswith("text/")
            spec["schema"] = {"type": "string", **({"format": "binary"} if binary else {})}


def register_components(spec: APISpec) -> None:
    """Replace the loose ``ReleaseRequest`` (params: any object) by the typed one.

    Called once every blueprint is registered: the operations already refer to
    ``ReleaseRequest`` (``EstimateRequest``) by name, so overwriting the component retypes
    every one of them.
    """
    for name, schema in release_request_schemas().items():
        spec.components.schemas[name] = schema
