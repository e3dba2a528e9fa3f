"""RFC 9457 problem details: the one error shape of the whole API."""

from __future__ import annotations

import errno
import logging
from typing import Any

import redis
from flask import Flask, Response, current_app, json, request
from kombu.exceptions import OperationalError
from werkzeug.exceptions import HTTPException

from service.api.problem_types import type_uri
from service.errors import STORAGE_DOWN, STORAGE_FULL, ServiceError
from service.storage.objects import Unavailable as ObjectStoreUnavailable
from service.storage.release_documents import DocumentMissing
from service.storage.store import POSTGRES_DOWN

#: under ``privrelease``, so error-path records go through the JSON handler with the
#: request id (``observability.configure_logging``), never a plain-text root handler
log = logging.getLogger("privrelease.errors")

PROBLEM_TYPE = "application/problem+json"

#: Seconds a client should wait before retrying a 503. Valkey restarted by a
#: supervisor (systemd, compose) answers again within a few seconds and the
#: API reconnects by itself on the next request, so a short, fixed pause is
#: right; the bundled client also backs off on its own between retries.
RETRY_AFTER_SECONDS = 2

#: Errors meaning the system of record (PostgreSQL, or Valkey before it), Valkey (keys,
#: the job broker) cannot be reached right now, not that the request is wrong:
#: redis-py's connection and timeout errors (BusyLoadingError, while Valkey replays its
#: AOF, is a ConnectionError), kombu's error when a task cannot be published, psycopg's
#: OperationalError (a server away, a failover) and a pool with no free connection.
UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
               OperationalError, *POSTGRES_DOWN)

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
    507: "insufficient_storage",
}



class APIError(ServiceError):
    """An error of the HTTP edge itself, with its status given where it is raised
    (the domain raises ``service.errors`` classes, which carry theirs)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        code: str | None = None,
        field: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail, code=code or _CODES.get(status, "error"), field=field,
                         **extra)
        self.status = status  # type: ignore[misc]


def problem(status: int, code: str, detail: str, **extra: Any) -> Response:
    """Build a problem+json response."""
    body: dict[str, Any] = {
        "type": type_uri(code),
        "title": code.replace("_", " "),
        "status": status,
        "code": code,
        "detail": detail,
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    resp = Response(json.dumps(body), status=status, mimetype=PROBLEM_TYPE)
    return resp


def _retry_later(resp: Response) -> Response:
    """Every 503 says when to come back (RFC 9110 §10.2.3)."""
    if resp.status_code == 503 and "Retry-After" not in resp.headers:
        resp.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return resp


def _from_service_error(err: ServiceError) -> Response:
    """Any domain refusal or API error: its status, code, field and extra fields."""
    resp = problem(err.status, err.code, err.detail, field=err.field, **err.extra)
    return _retry_later(resp)


def _from_unavailable(err: Exception) -> Response:
    """The record (PostgreSQL) or Valkey down, restarting, failing over or loading: a 503
    to retry, not a 500 to page someone.

    Logged as a warning with the error type only (the message names hosts). Nothing
    is half-written: every ledger step is one transaction that ran whole or not at
    all, an upload removes its files when its registration fails, and a reservation
    whose job could not be queued is refunded at once, or, when the record went away
    before the refund, stays in the outbox and runs (``service.releases.sweeper``).
    """
    log.warning("store unavailable", extra={"error_type": type(err).__name__})
    return _retry_later(problem(503, "unavailable",
                                "the service's data store is unavailable; retry later"))


def _from_os_error(err: OSError) -> Response:
    """A full or unwritable data directory: 507 or 503 with a code, not a 500.

    The writer already removed what it staged (``store.StagedVersion.discard``).
    Logged with the error type and errno name only (the message names paths).
    """
    if err.errno not in STORAGE_FULL | STORAGE_DOWN:
        return _unhandled(err)
    name = errno.errorcode.get(err.errno or 0, "")
    log.error("storage error", extra={"error_type": type(err).__name__, "errno": name})
    if err.errno in STORAGE_FULL:
        return problem(507, "insufficient_storage",
                       "the server has no room to store this now; nothing was stored")
    return _retry_later(problem(503, "storage_unavailable",
                                "the server's storage is unavailable; nothing was stored"))


def _from_object_store_down(err: ObjectStoreUnavailable) -> Response:
    """The object store (S3) did not answer: 503 to retry. An upload that met it stored
    no version (its manifest is written last) and removed what it put, if it could.
    Logged with the error type only (the message names the endpoint)."""
    log.error("object store unavailable", extra={"error_type": type(err).__name__})
    return _retry_later(problem(503, "storage_unavailable",
                                "the server's storage is unavailable; retry later"))


def _from_missing_document(err: DocumentMissing) -> Response:
    """A release's stored document cannot be read (the shared folder is not mounted or
    lost): 503 for an operator to fix and a client to retry; the record still exists."""
    log.error("release document missing", extra={"error_type": type(err).__name__})
    return _retry_later(problem(503, "storage_unavailable",
                                "a stored release document cannot be read now; retry later"))


def _unhandled(err: Exception) -> Response:
    # the JSON formatter keeps the exception's type and stack frames, never its
    # message: a message may quote a data value
    log.error("unhandled error", exc_info=err, extra={"error_type": type(err).__name__})
    return problem(500, "internal_error", "internal server error")


def _from_http_exception(err: HTTPException) -> Response:
    status = err.code or 500
    code = _CODES.get(status, "error")
    data = getattr(err, "data", None) or {}
    extra: dict[str, Any] = {}
    detail = err.description or err.name
    # webargs/flask-smorest put schema errors in data["messages"]
    messages = data.get("messages") if isinstance(data, dict) else None
    if messages:
        errors = flatten_messages(messages)
        extra["errors"] = errors
        first = next(iter(errors))
        detail = f"invalid request: {first}: {errors[first]}"
        extra["field"] = "body" if first == "_schema" else first
        if status == 422:
            code = "validation_error"
    if status == 413:
        detail = _too_large()
    resp = _retry_later(problem(status, code, detail, **extra))
    if isinstance(data, dict) and data.get("headers"):
        resp.headers.update(data["headers"])
    if status == 405 and err.get_response().headers.get("Allow"):
        resp.headers["Allow"] = err.get_response().headers["Allow"]
    return resp


def _too_large() -> str:
    """Which size limit a 413 is about: the whole body, or one part of a form."""
    body_limit = request.max_content_length  # lowered for JSON bodies (service.api.inputs)
    length = request.content_length
    if body_limit is not None and (length is None or length > body_limit):
        kind = "JSON body" if request.is_json else "request body"
        return f"the {kind} is larger than the {body_limit}-byte limit"
    form_limit = current_app.config.get("MAX_FORM_MEMORY_SIZE")
    parts = current_app.config.get("MAX_FORM_PARTS")
    return (f"a form field is larger than the {form_limit}-byte limit, or the form has more"
            f" than {parts} parts")


_LOCATIONS = {"json", "form", "files", "query", "headers"}


def flatten_messages(messages: Any, prefix: str = "") -> dict[str, str]:
    """Flatten webargs' nested {location: {field: [msgs]}} into "a.b": "msg"."""
    out: dict[str, str] = {}
    if isinstance(messages, dict):
        for key, value in messages.items():
            if not prefix and key in _LOCATIONS:
                name = ""
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            out.update(flatten_messages(value, name))
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        out[prefix or "body"] = "; ".join(messages)
    else:
        out[prefix or "body"] = str(messages)
    return out


def register(app: Flask) -> None:
    """Make every error, including 404/405/500, a problem document."""

    app.register_error_handler(ServiceError, _from_service_error)
    app.register_error_handler(HTTPException, _from_http_exception)
    for error in UNAVAILABLE:
        app.register_error_handler(error, _from_unavailable)
    app.register_error_handler(OSError, _from_os_error)
    app.register_error_handler(ObjectStoreUnavailable, _from_object_store_down)
    app.register_error_handler(DocumentMissing, _from_missing_document)
    app.register_error_handler(Exception, _unhandled)
