"""The job queue seen by operators: what waits, runs or failed; cancel with refund."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import current_app
from flask_smorest import Blueprint

from service import releases, rkeys
from service.api.responses import AUTH, problems
from service.apikeys import parse_time
from service.auth import current_key, may_use, require
from service.problems import APIError
from service.schemas import JobListQuerySchema, JobSchema, ReleaseSchema

blp = Blueprint("jobs", __name__, url_prefix="/v1/jobs", description="Jobs")

#: how many recent releases are scanned for failed jobs
FAILED_WINDOW = 1000


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
@blp.response(200, JobSchema(many=True))
def list_jobs(status: str | None = None) -> list[dict[str, Any]]:
    """Queued and running jobs (oldest first), then recently failed ones."""
    client = current_app.extensions["redis"]
    ids = list(client.zrange(rkeys.PENDING, 0, -1))
    pending = set(ids)
    ids += [i for i in client.zrevrange(rkeys.RELEASES, 0, FAILED_WINDOW - 1)
            if i not in pending]
    jobs = []
    for release_id in ids:
        doc = releases.document(client, release_id)
        if doc is None or doc["status"] not in {"queued", "running", "failed"}:
            continue
        if not may_use(doc["dataset_id"]):  # an operator key limited to some datasets
            continue
        if status is None or doc["status"] == status:
            jobs.append(_job(doc))
    return jobs


@blp.route("/<release_id>/cancel", methods=["POST"])
@require("operator")
@problems(blp, *AUTH, 403, 404, 409)
@blp.response(200, ReleaseSchema())
def cancel(release_id: str) -> dict[str, Any]:
    """Cancel a job that has not started and refund its reservation; 409 once running."""
    client = current_app.extensions["redis"]
    doc = releases.document(client, release_id)
    if doc is None or not may_use(doc["dataset_id"]):
        raise APIError(404, "no such job", code="not_found")
    outcome = current_app.extensions["ledger"].cancel(doc["dataset_id"], release_id,
                                                      current_key().id)
    if outcome == "running":
        raise APIError(409, "the job is already running and cannot be cancelled",
                       code="job_running")
    if outcome == "ended" and doc["status"] != "cancelled":  # a repeated cancel is a no-op
        raise APIError(409, f"the job already ended ({doc['status']})", code="job_finished")
    # the queued message is now harmless (the worker skips ended releases); drop it early
    current_app.extensions["celery"].control.revoke(release_id)
    cancelled = releases.document(client, release_id)
    assert cancelled is not None
    return cancelled
