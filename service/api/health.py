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
    """Valkey answers and at least one worker sent a heartbeat to this Valkey run.

    A heartbeat carries the run id of the server it reached: one restored
    from the AOF after a restart names the previous run, so it does not count
    until its worker has reconnected and beaten again.
    """
    client: redis.Redis = current_app.extensions["redis"]
    try:
        run_id = client.info("server")["run_id"]
        keys = list(client.scan_iter(rkeys.WORKERS + "*", count=100))
        workers = sum(1 for beat in (client.mget(keys) if keys else []) if beat == run_id)
    except redis.RedisError:
        raise APIError(503, "Valkey/Redis is not reachable", code="unavailable") from None
    if workers == 0:
        raise APIError(503, "no worker is running", code="unavailable", workers=0)
    return {"status": "ready", "workers": workers}
