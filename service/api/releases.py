"""Releases: dry-run estimates, requests (reserve + enqueue), reads."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import redis
from flask import current_app
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
    # the grant first: for a dataset the key may not use, every body gets the answer of a
    # dataset that does not exist (no retirement, columns, bounds or params checked)
    check_dataset_grant(body["dataset_id"], releases.no_such_dataset())
    config = current_app.config["PRIVRELEASE"]
    callback = body.get("callback_url")
    if callback is not None and (why := notify.check_url(callback, config.callback_hosts)):
        raise APIError(422, f"callback_url {why}", code="validation_error",
                       field="callback_url")
    # heavy cost parts shared across processes; a cold one beyond the gate is 503 busy
    with precompute.scope(current_app):
        prepared = releases.prepare(current_app.extensions["redis"],
                                    current_app.extensions["ledger"], body,
                                    allow_seeds=config.allow_seeds,
                                    max_work=config.max_release_work)
    return prepared


def _document(release_id: str) -> dict[str, Any]:
    """The release, if it exists and the key may see its dataset; else the same 404."""
    doc = releases.document(current_app.extensions["redis"], release_id)
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
def estimate(body: dict[str, Any]) -> dict[str, Any]:
    """Cost and expected accuracy of a request; spends nothing."""
    ratelimit.count_estimate()  # PRIVRELEASE_ESTIMATE_RATE_LIMIT, per key
    prepared = _prepare(body)
    balance = current_app.extensions["ledger"].balance(prepared.dataset["id"])
    return {
        "mechanism": prepared.mechanism.name,
        "cost": releases.cost_doc(prepared.cost_units),
        "accuracy": prepared.accuracy,
        "remaining": {m: budget.display(m, balance.get(m, {}).get("remaining", 0))
                      for m in prepared.cost_units},
    }


@blp.route("", methods=["POST"])
@require("analyst")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(ReleaseRequestSchema())
@blp.response(202, ReleaseSchema())
@blp.alt_response(200, schema=ReleaseSchema(), description="replay of an identical release")
def create(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Validate, reserve the cost atomically, enqueue; 202 with the release id.

    An ``Idempotency-Key`` header (1..255 characters) makes a retry safe: the same key
    gets the first answer back; with a different request it is 422 idempotency_mismatch.
    """
    config = current_app.config["PRIVRELEASE"]
    prepared = _prepare(body)
    key = current_key()
    idem_key = inputs.idempotency_key(key.id)
    ledger = current_app.extensions["ledger"]
    dataset_id = prepared.dataset["id"]
    request_json, at, release_id = prepared.request_json(), now_iso(), releases.new_id()
    res = ledger.reserve(
        dataset_id, release_id, prepared.cost_units, actor=key.id,
        fingerprint=prepared.fingerprint, request_json=request_json,
        idempotency_key=idem_key, idempotency_ttl=config.idempotency_ttl, at=at,
    )
    if res.release_id == release_id and res.outcome in {"replay", "idempotent"}:
        # our own reservation: redis-py re-sent the script after a lost reply (Valkey
        # restarting); it must be enqueued, not answered as someone else's release
        res = dataclasses.replace(res, outcome="reserved")
    if res.outcome == "exhausted":
        whose = "your allocation of" if res.scope == "allocation" else "the dataset's"
        raise APIError(
            409, f"not enough of {whose} {res.measure} budget left", code="budget_exhausted",
            measure=res.measure, scope=res.scope,
            requested=budget.display(res.measure, res.requested),
            remaining=budget.display(res.measure, max(res.remaining, 0)),
        )
    if res.outcome == "retired":
        raise APIError(409, "dataset is retired", code="dataset_retired")
    if res.outcome == "idem_mismatch":
        raise inputs.idempotency_mismatch()
    send = current_app.extensions["celery"].send_task
    if res.outcome in {"replay", "idempotent"} and ledger.unsent(res.release_id,
                                                                 releases.OUTBOX_GRACE):
        # the first request's API died between reserve and enqueue: send it now, so the
        # release this retry is answered with runs (a second message would be harmless)
        releases.enqueue(send, ledger, res.release_id)
        log.warning("sent a release left in the outbox", extra={"release_id": res.release_id})
    if res.outcome == "replay":
        return {**_document(res.release_id), "replayed": True}, 200
    if res.outcome == "reserved":
        try:
            releases.enqueue(send, ledger, res.release_id)
        except Exception:
            try:
                ledger.abort(dataset_id, res.release_id, '{"message": "could not enqueue"}',
                             key.id)
            except redis.RedisError:  # Valkey went away too: the outbox keeps it
                log.warning("reservation left in the outbox",
                            extra={"release_id": res.release_id})
                raise APIError(503, "service unavailable; the release may still run: retry"
                               " with the same Idempotency-Key to learn its state",
                               code="unavailable") from None
            raise APIError(503, "job queue unavailable; nothing was spent",
                           code="unavailable") from None
        # no round trip: the document of a just-queued release is known here
        fields = {"status": "queued", "request": request_json, "created_at": at}
        return releases.render(res.release_id, fields), 202
    return _document(res.release_id), 202


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
    index.ensure_release_indexes(client)
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
    for doc in releases.documents(client, ids):
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
