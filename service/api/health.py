"""Liveness and readiness probes (no auth: load balancers call them)."""

from __future__ import annotations

from typing import Any

import redis
from flask_smorest import Blueprint

from service import wiring
from service.api.problems import APIError
from service.api.responses import problems
from service.api.schemas import HealthSchema, ReadySchema
from service.releases.queue import live_workers
from service.storage.store import DOWN

blp = Blueprint("health", __name__, description="Liveness and readiness")


@blp.route("/healthz")
@blp.doc(security=[])
@blp.response(200, HealthSchema)
def healthz() -> dict[str, Any]:
    """The process is up."""
    return {"status": "ok"}


@blp.route("/readyz")
@blp.doc(security=[])
@problems(blp, 503)
@blp.response(200, ReadySchema)
def readyz() -> dict[str, Any]:
    """The system of record and Valkey answer, and at least one worker sent a heartbeat
    to this Valkey run.

    A heartbeat restored from the AOF after a restart does not count
    (:func:`service.releases.queue.live_workers`).
    """
    client: redis.Redis = wiring.current().client
    try:
        wiring.current().ledger.ping()
    except DOWN:
        raise APIError(503, "the system of record is not reachable",
                       code="unavailable") from None
    try:
        workers = live_workers(client)
    except redis.RedisError:
        raise APIError(503, "Valkey/Redis is not reachable", code="unavailable") from None
    if workers == 0:
        raise APIError(503, "no worker is running", code="unavailable", workers=0)
    return {"status": "ready", "workers": workers}
