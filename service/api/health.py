"""The service's front door, liveness and readiness probes (no auth: browsers, clients and
load balancers call them before they hold a key)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import redis
from flask import redirect, request
from flask_smorest import Blueprint
from werkzeug.wrappers import Response

from service import wiring
from service.api.problems import APIError
from service.api.responses import problems
from service.api.schemas import HealthSchema, IndexSchema, ReadySchema
from service.releases.queue import live_workers
from service.storage.store import DOWN

blp = Blueprint("health", __name__, description="Front door, liveness and readiness")

#: the API's entry points, as ``GET /`` lists them
LINKS = {"docs": "/docs", "openapi": "/openapi.json", "console": "/console/",
         "datasets": "/v1/datasets", "releases": "/v1/releases",
         "mechanisms": "/v1/mechanisms", "jobs": "/v1/jobs", "keys": "/v1/keys",
         "health": "/healthz", "ready": "/readyz"}


@cache
def _version() -> str:
    try:
        return version("privrelease")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


@blp.route("/")
@blp.doc(security=[])
@blp.response(200, IndexSchema)
@blp.alt_response(302, description="a browser (it prefers HTML): to the console")
def index() -> dict[str, Any] | Response:
    """Where to start: a browser is sent to the console, any other client gets this
    short JSON index of the API's entry points."""
    if request.accept_mimetypes.best_match(["application/json", "text/html"]) == "text/html":
        return redirect(LINKS["console"], 302)
    return {"service": "privrelease", "version": _version(), "links": LINKS}


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
