"""The data plane's edges (issue 15 items 8-12), against real Valkey and a real worker:
error-path logs, storage errors at upload, indexed and paged lists, the enqueue outbox."""

from __future__ import annotations

import io
import json
import os
import socket
from typing import Any

import pytest
from flask import Flask

from service.app import create_app
from service.config import Config
from service.observability import log_handler
from tests.integration.conftest import TOKEN

SECRET = "31337.25"  # a data value an exception message quotes; it must reach no log


def _fresh_app(env: dict[str, str], **overrides: str) -> Flask:
    """An app of its own (routes may still be added to it), built from ``env``."""
    saved = dict(os.environ)
    os.environ.update({**env, **overrides})
    try:
        return create_app(Config.from_env())
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _swap(buf: io.StringIO) -> Any:
    """Point the service's JSON log handler at ``buf``; returns (handler, old stream)."""
    handler = log_handler()
    assert handler is not None
    return handler, handler.setStream(buf)


def _records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- item 11: error-path logs --------------------------------------------------------

def test_500_is_logged_as_json_with_request_id_and_type_only(
        app: Flask, service_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """Item 11: main logged a 500 through ``service.problems``, a logger outside the JSON
    setup: plain text on stderr, no request id, the exception's message (a data value)
    and its full traceback. Now one JSON record: request id, exception type, frames."""
    fresh = _fresh_app(service_env)

    @fresh.route("/boom")
    def boom() -> str:
        raise ValueError(f"could not convert {SECRET!r}")

    buf = io.StringIO()
    handler, old = _swap(buf)
    try:
        resp = fresh.test_client().get("/boom", headers={"X-Request-ID": "err-500-check"})
    finally:
        handler.setStream(old)
    assert resp.status_code == 500 and resp.get_json()["code"] == "internal_error"
    out = buf.getvalue()
    errors = [r for r in _records(out) if r["logger"] == "privrelease.errors"]
    assert len(errors) == 1, out
    assert errors[0]["request_id"] == "err-500-check"
    assert errors[0]["exc_type"] == "ValueError" and errors[0]["level"] == "ERROR"
    assert "boom" in errors[0]["traceback"]  # where it happened, for the operator
    std = capsys.readouterr()
    assert SECRET not in out + std.err + std.out


def test_503_is_logged_as_json_with_request_id(
        service_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """Item 11: the 503 handler's warning went to the plain-text last-resort handler without
    the request id on main; now a JSON record with it and the error type."""
    with socket.socket() as sock:  # a port nothing listens on: Valkey unreachable
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fresh = _fresh_app(service_env, PRIVRELEASE_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    buf = io.StringIO()
    handler, old = _swap(buf)
    try:
        resp = fresh.test_client().get("/v1/datasets", headers={
            "Authorization": f"Bearer {TOKEN}", "X-Request-ID": "err-503-check"})
    finally:
        handler.setStream(old)
    assert resp.status_code == 503, resp.get_json()
    out = buf.getvalue()
    warnings = [r for r in _records(out) if r["logger"] == "privrelease.errors"]
    assert len(warnings) == 1, out
    assert warnings[0]["request_id"] == "err-503-check"
    assert warnings[0]["error_type"] == "ConnectionError"
    assert "traceback" not in warnings[0]
    assert "valkey unavailable" not in capsys.readouterr().err
