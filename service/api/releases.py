"""Releases: dry-run estimates, requests (reserve + enqueue), reads."""

from __future__ import annotations

from typing import Any

from flask import g, jsonify
from flask.blueprints import BlueprintSetupState
from flask_smorest import Blueprint
from werkzeug.routing import BaseConverter

from service import wiring
from service.api import inputs, ratelimit, responses
from service.api.auth import check_dataset_grant, current_key, may_use, require
from service.api.problems import APIError
from service.api.responses import AUTH, BODY, problems
from service.api.schemas import (
    PAGE_HEADERS,
    EstimateRequestSchema,
    EstimateSchema,
    PricingSchema,
    ReleaseListQuerySchema,
    ReleaseRequestSchema,
    ReleaseSchema,
)
from service.releases import documents, pricing, submit
from service.storage import index
from service.storage.store import ReleaseView

blp = Blueprint("releases", __name__, url_prefix="/v1/releases", description="Releases")


class ReleaseIdConverter(BaseConverter):
    """A release id (``submit.new_id``), so ``GET /v1/releases/estimate`` is no release
    read: without it ``Allow`` on ``/estimate`` would offer the GET the docs do not list."""

    regex = r"rel_[0-9a-f]{24}"


@blp.record_once
def _register_converter(state: BlueprintSetupState) -> None:
    state.app.url_map.converters["release_id"] = ReleaseIdConverter

def _submit_checks(body: dict[str, Any]) -> None:
    """What comes before every other check: the grant. For a dataset the key may not use,
    every body gets the answer of a dataset that does not exist (no retirement, columns,
    bounds or params checked)."""
    if not may_use(body["dataset_id"]):
        raise pricing.no_such_dataset()


def _document(release_id: str) -> dict[str, Any]:
    """The release, if it exists and the key may see its dataset; else the same 404."""
    svc = wiring.current()
    doc = documents.document(svc.ledger, release_id)
    if doc is None or not may_use(doc["dataset_id"]):
        raise APIError(404, "no such release", code="not_found")
    return doc


@blp.route("/estimate", methods=["POST"])
@require("analyst")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(EstimateRequestSchema())
@blp.response(200, EstimateSchema())
@blp.alt_response(202, schema=PricingSchema(), description=(
    "the cost needs a heavy precomputation not computed yet: a worker computes it;"
    " retry after Retry-After seconds (the retry is warm and answers 200)"))
def estimate(body: dict[str, Any]) -> Any:
    """Cost and expected accuracy of a request; spends nothing.

    With a ``target`` (``{"half_width": x, "level": 0.95}``) instead of a ``budget``: the
    smallest budget, in whole ledger units, whose stated 95 % interval is within ±x,
    searched up to the dataset's cap, and its estimate with ``budget`` (to paste into the
    release request) and ``target``. An (epsilon, delta) mechanism holds ``target.delta``
    fixed. Refused (422, ``field`` target) for a mechanism stating no interval or one not
    monotone in the budget, and ``target_unreachable`` (with ``best_half_width``) when
    even the cap does not reach it.

    When the cost needs a heavy precomputation (interval calibration, an ICLP
    eigen-system) that no process has computed yet, the answer is 202 ``pricing`` with
    ``Retry-After``: one job per precomputation computes it, however many callers ask.
    """
    ratelimit.count_estimate()  # PRIVRELEASE_ESTIMATE_RATE_LIMIT, per key
    _submit_checks(body)
    svc = wiring.current()
    try:
        prepared = submit.prepare(svc, body, api=True)
    except pricing.Unpriced as cold:
        submit.request_estimate(svc, cold)
        resp = jsonify({"status": "pricing", "mechanism": cold.request.mechanism,
                        "retry_after": submit.PRICING_RETRY_AFTER})
        resp.status_code = 202
        resp.headers["Retry-After"] = str(submit.PRICING_RETRY_AFTER)
        g.retry_after = submit.PRICING_RETRY_AFTER  # kept by ratelimit's after_request
        return resp
    return pricing.estimate(svc.ledger, prepared, current_key().id)


@blp.route("", methods=["POST"])
@require("analyst")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(ReleaseRequestSchema())
@blp.response(202, ReleaseSchema(), description=(
    "accepted: ``queued``, or ``pricing`` when its cost needs a heavy precomputation (a"
    " worker computes it, then reserves and runs the release, or ends it ``refused``)"))
@blp.alt_response(200, schema=ReleaseSchema(), description="replay of an identical release")
def create(body: dict[str, Any]) -> tuple[dict[str, Any], int, dict[str, str]]:
    """Validate, reserve the cost atomically, enqueue; 202 with the release id.

    An ``Idempotency-Key`` header (1..255 characters) makes a retry safe: the same key
    gets the first answer back; with a different request it is 422 idempotency_mismatch.

    A cost that needs a heavy precomputation nobody computed yet is never computed in the
    request: the release is created ``pricing`` (after every other check) and a worker
    computes the cost, reserves it through the same ledger script, and runs it; if the
    reservation is refused the release ends ``refused``, its ``error`` the problem this
    POST would have answered (nothing is charged).
    """
    _submit_checks(body)
    key = current_key()
    # a pricing job is a cold estimate's work: counted against the same per-key limit
    done = submit.submit(wiring.current(), body, actor=key.id,
                         idempotency_key=inputs.idempotency_key(key.id),
                         on_cold=ratelimit.count_estimate)
    location = {"Location": f"/v1/releases/{done.release_id}"}
    if done.outcome in {"replay", "idempotent"}:  # an earlier release: may the key see it?
        check_dataset_grant(done.document["dataset_id"],
                            APIError(404, "no such release", code="not_found"))
    if done.outcome == "replay":
        return {**done.document, "replayed": True}, 200, location
    return done.document, 202, location


@blp.route("")
@require("consumer")
@problems(blp, *AUTH, 422)
@blp.arguments(ReleaseListQuerySchema(), location="query", as_kwargs=True)
@blp.response(200, ReleaseSchema(many=True), headers=PAGE_HEADERS)
def list_releases(limit: int, dataset_id: str | None = None, cursor: str | None = None,
                  mine: bool = False) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The most recent releases (newest first), optionally of one dataset, a page at a time.

    Read from indexes (a dataset's releases, a key's), never by scanning every release:
    a key limited to some datasets pages through those datasets' releases only. The next
    page's cursor is in ``X-Next-Cursor`` (and ``Link``); a page may hold fewer than
    ``limit`` releases, and the list ends when no cursor comes back.
    """
    store = wiring.current().ledger
    limit = min(max(limit, 1), 1000)
    after = index.Cursor.decode(cursor)
    key = current_key()
    view: ReleaseView | None
    if mine:
        view = ReleaseView("key", key_id=key.id)
    elif dataset_id is not None:
        view = ReleaseView("datasets", frozenset({dataset_id})) if may_use(dataset_id) else None
    elif key.datasets is None:
        view = ReleaseView("all")
    else:
        view = ReleaseView("datasets", frozenset(key.datasets))
    ids, nxt = store.release_page(view, limit, after) if view is not None else ([], None)
    out = []
    for doc in documents.documents(store, ids):
        if dataset_id and doc["dataset_id"] != dataset_id:
            continue
        if may_use(doc["dataset_id"]):  # a grant narrowed after the release was made
            out.append(doc)
    return out, responses.page_headers(nxt)


@blp.route("/<release_id:release_id>")
@require("consumer")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, ReleaseSchema())
def show(release_id: str) -> dict[str, Any]:
    """Status, and when done the result, cost, accuracy and provenance."""
    return _document(release_id)
