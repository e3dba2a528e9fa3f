"""The job queue seen by operators: what waits, runs or failed; cancel with refund."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from flask_smorest import Blueprint

from service import wiring
from service.api import responses
from service.api.auth import current_key, may_use, require
from service.api.problems import APIError
from service.api.responses import AUTH, problems
from service.api.schemas import PAGE_HEADERS, JobListQuerySchema, JobSchema, ReleaseSchema
from service.apikeys import parse_time
from service.releases import documents, queue
from service.storage import index
from service.storage.store import ReleaseView

blp = Blueprint("jobs", __name__, url_prefix="/v1/jobs", description="Jobs")

#: the jobs list's phases: pending (pricing, queued and running, oldest first), then
#: failed (and refused)
PENDING, FAILED = "p", "f"
#: the statuses of the pending phase
PENDING_STATUSES = frozenset({"pricing", "queued", "running"})


def _job(doc: dict[str, Any]) -> dict[str, Any]:
    created = parse_time(doc["created_at"])
    return {
        "id": doc["id"], "dataset_id": doc["dataset_id"], "mechanism": doc["mechanism"],
        "status": doc["status"], "created_at": doc["created_at"],
        "age_seconds": round((datetime.now(UTC) - created).total_seconds(), 3),
        "error": doc.get("error"),
    }


@blp.route("")
@require("operator")
@problems(blp, *AUTH, 403, 422)
@blp.arguments(JobListQuerySchema(), location="query", as_kwargs=True)
@blp.response(200, JobSchema(many=True), headers=PAGE_HEADERS)
def list_jobs(status: str | None = None, limit: int = 100, cursor: str | None = None,
              ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Pricing, queued and running jobs (oldest first), then failed and refused ones
    (newest first), a page at a time (``X-Next-Cursor``, as ``GET /v1/releases``).

    Read from the pending and failed indexes (per dataset for a key limited to some),
    never from every release; a page may hold fewer than ``limit`` jobs.
    """
    store = wiring.current().ledger
    limit = min(max(limit, 1), 1000)
    after = index.Cursor.decode(cursor)
    if after is not None and after.phase not in {PENDING, FAILED}:
        raise APIError(422, "not a cursor this server returned", code="validation_error",
                       field="cursor")
    if after is not None and after.phase == FAILED and not after.member:
        after = None  # the failed phase from its start
        phases = [FAILED]
    elif after is not None and after.phase == FAILED:
        phases = [FAILED]
    else:
        phases = ([PENDING] if status in PENDING_STATUSES else [FAILED] if status
                  else [PENDING, FAILED])
    key = current_key()
    jobs: list[dict[str, Any]] = []
    left, nxt = limit, None
    for phase in phases:
        view = ReleaseView("pending" if phase == PENDING else "failed",
                           None if key.datasets is None else frozenset(key.datasets))
        here = after if after is not None and after.phase == phase else None
        ids, nxt = store.release_page(view, left, here)
        if nxt is not None:
            nxt = dataclasses.replace(nxt, phase=phase)
        left -= len(ids)  # a page reads at most ``limit`` ids, however many are shown
        for doc in documents.documents(store, ids):
            if phase == PENDING and doc["status"] not in PENDING_STATUSES:
                store.drop_pending(doc["id"])  # an index entry left behind: drop it
                continue
            if may_use(doc["dataset_id"]) and (status is None or doc["status"] == status):
                jobs.append(_job(doc))
        if nxt is not None:
            break
        if left == 0:
            if phase == PENDING and FAILED in phases:
                nxt = index.Cursor(0.0, "", FAILED)  # the failed jobs, from the newest
            break
    return jobs, responses.page_headers(nxt)


@blp.route("/<release_id>/cancel", methods=["POST"])
@require("operator")
@problems(blp, *AUTH, 403, 404, 409)
@blp.response(200, ReleaseSchema())
def cancel(release_id: str) -> dict[str, Any]:
    """Cancel a job that has not started and refund its reservation (one still pricing
    holds nothing: it is cancelled, and its pricing job then reserves nothing); 409 once
    running."""
    store = wiring.current().ledger
    doc = documents.document(store, release_id)
    if doc is None or not may_use(doc["dataset_id"]):
        raise APIError(404, "no such job", code="not_found")
    outcome = wiring.current().ledger.cancel(doc["dataset_id"], release_id,
                                                      current_key().id)
    if outcome == "running":
        raise APIError(409, "the job is already running and cannot be cancelled",
                       code="job_running")
    if outcome == "ended" and doc["status"] != "cancelled":  # a repeated cancel is a no-op
        raise APIError(409, f"the job already ended ({doc['status']})", code="job_finished")
    # the queued message is now harmless (the worker skips ended releases); drop it early
    wiring.current().queue.revoke([release_id, queue.pricing_task_id(release_id)])
    cancelled = documents.document(store, release_id)
    assert cancelled is not None
    return cancelled
