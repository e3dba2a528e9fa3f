"""Liveness and readiness probes (no auth: load balancers call them)."""

from __future__ import annotations

from typing import Any

import redis
from flask import current_app
from flask_smorest import Blueprint

from service import rkeys
from service.api.responses import problems
from service.problems import APIError
from service.schemas import HealthSchema, ReadySchema

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
    """Valkey answers and at least one worker sent a heartbeat recently."""
    client: redis.Redis = current_app.extensions["redis"]
    try:
        client.ping()
        workers = sum(1 for _ in client.scan_iter(rkeys.WORKERS + "*", count=100))
    except redis.RedisError:
        raise APIError(503, "Valkey/Redis is not reachable", code="unavailable") from None
    if workers == 0:
        raise APIError(503, "no worker is running", code="unavailable", workers=0)
    return {"status": "ready", "workers": workers}
