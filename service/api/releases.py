"""Releases: dry-run estimates, requests (reserve + enqueue), reads."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import redis
from flask import Response, current_app, g, jsonify
from flask.blueprints import BlueprintSetupState
from flask_smorest import Blueprint
from werkzeug.routing import BaseConverter

from service import budget, index, inputs, notify, precompute, ratelimit, releases, rkeys
from service.api.responses import AUTH, BODY, problems
from service.auth import check_dataset_grant, current_key, may_use, require
from service.ledger import now_iso
from service.problems import APIError
from service.schemas import (
    PAGE_HEADERS,
    EstimateSchema,
    PricingSchema,
    ReleaseListQuerySchema,
    ReleaseRequestSchema,
    ReleaseSchema,
)

log = logging.getLogger("privrelease.releases")

blp = Blueprint("releases", __name__, url_prefix="/v1/releases", description="Releases")


class ReleaseIdConverter(BaseConverter):
    """A release id (``releases.new_id``), so ``GET /v1/releases/estimate`` is no release
    read: without it ``Allow`` on ``/estimate`` would offer the GET the docs do not list."""

    regex = r"rel_[0-9a-f]{24}"


@blp.record_once
def _register_converter(state: BlueprintSetupState) -> None:
    state.app.url_map.converters["release_id"] = ReleaseIdConverter

TASK = releases.TASK


def _prepare(body: dict[str, Any]) -> releases.Prepared:
    """Every check and the cost; ``releases.Unpriced`` when the cost needs a heavy
    precomputation the shared store lacks (never computed in this thread)."""
    # the grant first: for a dataset the key may not use, every body gets the answer of a
    # dataset that does not exist (no retirement, columns, bounds or params checked)
    check_dataset_grant(body["dataset_id"], releases.no_such_dataset())
    config = current_app.config["PRIVRELEASE"]
    callback = body.get("callback_url")
    if callback is not None and (why := notify.check_url(callback, config.callback_hosts)):
        raise APIError(422, f"callback_url {why}", code="validation_error",
                       field="callback_url")
    with precompute.api_scope(current_app):
        return releases.prepare(current_app.extensions["redis"],
                                current_app.extensions["ledger"], body,
                                allow_seeds=config.allow_seeds,
                                max_work=config.max_release_work)


def _document(release_id: str) -> dict[str, Any]:
    """The release, if it exists and the key may see its dataset; else the same 404."""
    doc = releases.document(current_app.extensions["redis"], release_id,
                            current_app.extensions["documents"])
    not_found = APIError(404, "no such release", code="not_found")
    if doc is None:
        raise not_found
    check_dataset_grant(doc["dataset_id"], not_found)
    return doc


@blp.route("/estimate", methods=["POST"])
@require("analyst")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(ReleaseRequestSchema())
@blp.response(200, EstimateSchema())
@blp.alt_response(202, schema=PricingSchema(), description=(
    "the cost needs a heavy precomputation not computed yet: a worker computes it;"
    " retry after Retry-After seconds (the retry is warm and answers 200)"))
def estimate(body: dict[str, Any]) -> Any:
    """Cost and expected accuracy of a request; spends nothing.

    When the cost needs a heavy precomputation (interval calibration, an ICLP
    eigen-system) that no process has computed yet, the answer is 202 ``pricing`` with
    ``Retry-After``: one job per precomputation computes it, however many callers ask.
    """
    ratelimit.count_estimate()  # PRIVRELEASE_ESTIMATE_RATE_LIMIT, per key
    try:
        prepared = _prepare(body)
    except releases.Unpriced as cold:
        return _estimate_pricing(cold)
    ledger = current_app.extensions["ledger"]
    rows, allocations = ledger.budget(prepared.dataset["id"])
    mine = allocations.get(current_key().id, {})
    # what this key may still spend: the dataset's remainder, or its allocation's if smaller;
    # a listed allocation allows none of a measure it does not list (reserve.lua)
    rule = ledger.allocation_scopes(prepared.dataset["id"]).get(current_key().id)
    unlisted = 0 if rule == "listed" else 1 << 62
    remaining = {m: min(rows.get(m, {}).get("remaining", 0),
                        mine.get(m, {}).get("remaining", unlisted))
                 for m in prepared.cost_units}
    short = {m: units - remaining[m] for m, units in prepared.cost_units.items()
             if units > remaining[m]}
    return {
        "mechanism": prepared.mechanism.name,
        "cost": releases.cost_doc(prepared.cost_units),
        "accuracy": prepared.accuracy,
        "remaining": {m: budget.display(m, max(r, 0)) for m, r in remaining.items()},
        "fits": not short,
        "shortfall": {m: budget.display(m, u) for m, u in short.items()},
    }


def _estimate_pricing(cold: releases.Unpriced) -> Response:
    """202 ``pricing``; enqueue the estimate's job unless one for the same precomputation
    is under way (a Valkey SET NX with expiry: 16 identical cold estimates, one job)."""
    client = current_app.extensions["redis"]
    job_key = cold.key or cold.request.fingerprint
    marker = rkeys.pricing_job(job_key)
    if client.set(marker, "1", nx=True, ex=releases.ESTIMATE_JOB_TTL):
        try:
            current_app.extensions["celery"].send_task(
                releases.ESTIMATE_TASK, args=[json.dumps(cold.request.body), marker])
        except Exception:
            client.delete(marker)
            raise APIError(503, "job queue unavailable; retry shortly",
                           code="unavailable") from None
    resp = jsonify({"status": "pricing", "mechanism": cold.request.mechanism,
                    "retry_after": releases.PRICING_RETRY_AFTER})
    resp.status_code = 202
    resp.headers["Retry-After"] = str(releases.PRICING_RETRY_AFTER)
    g.retry_after = releases.PRICING_RETRY_AFTER  # kept by ratelimit's after_request
    return resp


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
    config = current_app.config["PRIVRELEASE"]
    pricing: releases.PricingRequest | None = None
    try:
        prepared: releases.Prepared | None = _prepare(body)
    except releases.Unpriced as cold:
        # a pricing job is a cold estimate's work: counted against the same per-key limit
        ratelimit.count_estimate()
        prepared, pricing = None, cold.request
    key = current_key()
    idem_key = inputs.idempotency_key(key.id)
    ledger = current_app.extensions["ledger"]
    at, release_id = now_iso(), releases.new_id()
    if prepared is not None:
        dataset_id, request_json = prepared.dataset["id"], prepared.request_json()
        res = ledger.reserve(
            dataset_id, release_id, prepared.cost_units, actor=key.id,
            fingerprint=prepared.request_fingerprint,
            replay_fingerprint=prepared.fingerprint, request_json=request_json,
            idempotency_key=idem_key, idempotency_ttl=config.idempotency_ttl, at=at,
            notion_lock=prepared.notion_lock,
        )
        ours = "reserved"
    else:
        assert pricing is not None
        dataset_id, request_json = pricing.dataset["id"], pricing.request_json()
        res = ledger.reserve(
            dataset_id, release_id, {}, actor=key.id, fingerprint=pricing.fingerprint,
            request_json=request_json, replay=False, idempotency_key=idem_key,
            idempotency_ttl=config.idempotency_ttl, at=at, mode="pricing",
        )
        ours = "pricing"
    if res.release_id == release_id and res.outcome in {"replay", "idempotent"}:
        # our own reservation: redis-py re-sent the script after a lost reply (Valkey
        # restarting); it must be enqueued, not answered as someone else's release
        res = dataclasses.replace(res, outcome=ours)
    refused = releases.refusal(res)
    if refused is not None:
        raise refused
    if res.outcome == "idem_mismatch":
        raise inputs.idempotency_mismatch()
    location = {"Location": f"/v1/releases/{res.release_id}"}
    send = current_app.extensions["celery"].send_task
    if res.outcome in {"replay", "idempotent"}:
        doc = _document(res.release_id)
        if ledger.unsent(res.release_id, releases.OUTBOX_GRACE):
            # the first request's API died between reserve and enqueue: send it now, so the
            # release this retry is answered with runs (a second message would be harmless)
            releases.enqueue(send, ledger, res.release_id, pricing=doc["status"] == "pricing")
            log.warning("sent a release left in the outbox",
                        extra={"release_id": res.release_id})
        if res.outcome == "replay":
            return {**doc, "replayed": True}, 200, location
        return doc, 202, location
    try:
        releases.enqueue(send, ledger, res.release_id, pricing=res.outcome == "pricing")
    except Exception:
        try:
            if res.outcome == "pricing":
                err = APIError(503, "job queue unavailable; nothing was spent",
                               code="unavailable")
                ledger.refuse(dataset_id, res.release_id, json.dumps(releases.error_doc(err)),
                              err.code, key.id)
            else:
                ledger.abort(dataset_id, res.release_id, '{"message": "could not enqueue"}',
                             key.id)
        except redis.RedisError:  # Valkey went away too: the outbox keeps it
            log.warning("reservation left in the outbox", extra={"release_id": res.release_id})
            raise APIError(503, "service unavailable; the release may still run: retry"
                           " with the same Idempotency-Key to learn its state",
                           code="unavailable") from None
        raise APIError(503, "job queue unavailable; nothing was spent",
                       code="unavailable") from None
    # no round trip: the document of a just-accepted release is known here
    status = "pricing" if res.outcome == "pricing" else "queued"
    fields = {"status": status, "request": request_json, "created_at": at}
    return releases.render(res.release_id, fields), 202, location


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
    client = current_app.extensions["redis"]
    limit = min(max(limit, 1), 1000)
    after = index.Cursor.decode(cursor)
    key = current_key()
    index.ensure_release_indexes(client, current_app.extensions["documents"])
    if mine:
        keys = [rkeys.key_releases(key.id)]
    elif dataset_id is not None:
        keys = [rkeys.dataset_releases(dataset_id)] if may_use(dataset_id) else []
    elif key.datasets is None:
        keys = [rkeys.RELEASES]
    else:
        keys = [rkeys.dataset_releases(d) for d in sorted(key.datasets)]
    ids, nxt = index.page(client, keys, limit, after)
    out = []
    for doc in releases.documents(client, ids, current_app.extensions["documents"]):
        if dataset_id and doc["dataset_id"] != dataset_id:
            continue
        if may_use(doc["dataset_id"]):  # a grant narrowed after the release was made
            out.append(doc)
    return out, index.page_headers(nxt)


@blp.route("/<release_id:release_id>")
@require("consumer")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, ReleaseSchema())
def show(release_id: str) -> dict[str, Any]:
    """Status, and when done the result, cost, accuracy and provenance."""
    return _document(release_id)
