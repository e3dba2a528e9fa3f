"""Console sign-in: a signed session cookie naming a server-side session, never the key.

The cookie (Flask's itsdangerous-signed session; HttpOnly, SameSite=Strict, path
``/console``, Secure when ``PRIVRELEASE_CONSOLE_SECURE_COOKIE`` is set) holds a random
session id and the CSRF secret. The key store (``service.storage.keys``: PostgreSQL, or
Valkey on the store before it) maps the id's SHA-256 to the key id, with an expiry
(``PRIVRELEASE_CONSOLE_SESSION_SECONDS``, never past the key's own). Whoever
steals the cookie gets a console session until it expires or its owner signs out,
not the API key: the token is never stored, in the cookie or on the server. Each
request looks the key up again, so a revoked or expired key ends its sessions at once.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Request, session
from flask.sessions import SecureCookieSessionInterface

from service import apikeys, wiring
from service.api.problems import UNAVAILABLE

PREFIX = "/console"
DEFAULT_SESSION_SECONDS = 8 * 3600
#: environ flag: the session store could not be reached while opening the session
UNAVAILABLE_FLAG = "privrelease.console_unavailable"


def session_digest(session_id: str) -> str:
    """What the store knows a session by: the SHA-256 of its id (never the id)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def session_seconds() -> int:
    raw = os.environ.get("PRIVRELEASE_CONSOLE_SESSION_SECONDS", "")
    try:
        value = int(raw) if raw.strip() else DEFAULT_SESSION_SECONDS
    except ValueError:
        raise SystemExit("PRIVRELEASE_CONSOLE_SESSION_SECONDS: not an integer") from None
    if value <= 0:
        raise SystemExit("PRIVRELEASE_CONSOLE_SESSION_SECONDS: must be positive")
    return value


def configure(app: Flask) -> None:
    """Cookie flags, lifetimes and the session interface (only ``/console`` has sessions)."""
    seconds = session_seconds()
    app.config.update(
        SESSION_COOKIE_NAME="privrelease_console",
        SESSION_COOKIE_PATH=PREFIX,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_SECURE=_env_bool("PRIVRELEASE_CONSOLE_SECURE_COOKIE"),
        PERMANENT_SESSION_LIFETIME=seconds,
        WTF_CSRF_TIME_LIMIT=seconds,  # a form token lives as long as its session
        WTF_CSRF_SSL_STRICT=False,  # SameSite=Strict already stops cross-site posts
    )
    secret = os.environ.get("PRIVRELEASE_CONSOLE_SECRET")
    if secret:
        app.secret_key = secret
    app.session_interface = ConsoleSessionInterface()


def _shared_secret(app: Flask) -> None:
    """Every API process signs with one secret: configured, else made once in the key
    store (the first process's candidate is kept, every other one reads it)."""
    if app.secret_key:
        return
    app.secret_key = wiring.of(app).keys.console_secret(secrets.token_hex(32))


class ConsoleSessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions for console paths; every other request (the API)
    gets the null session and never touches the key store for it."""

    def open_session(self, app: Flask, request: Request) -> Any:
        if request.path != PREFIX and not request.path.startswith(PREFIX + "/"):
            return None
        try:
            _shared_secret(app)
        except UNAVAILABLE:
            request.environ[UNAVAILABLE_FLAG] = True
            return None
        return super().open_session(app, request)


def sign_in(key: apikeys.ApiKey) -> None:
    """A new session for ``key`` (a new id and CSRF secret: no fixation)."""
    ttl = session_seconds()
    if key.expires_at is not None:
        left = (apikeys.parse_time(key.expires_at) - datetime.now(UTC)).total_seconds()
        ttl = max(1, min(ttl, int(left)))
    session_id = secrets.token_urlsafe(32)
    wiring.current().keys.add_session(session_digest(session_id), key.id, ttl)
    session.clear()
    session.permanent = True
    session["sid"] = session_id


def signed_in() -> apikeys.ApiKey | None:
    """The key of the request's session, if the session and the key are still valid."""
    session_id = session.get("sid")
    if not isinstance(session_id, str):
        return None
    keys = wiring.current().keys
    key_id = keys.session_key_id(session_digest(session_id))
    return apikeys.get(keys, key_id) if key_id else None


def sign_out() -> None:
    session_id = session.get("sid")
    if isinstance(session_id, str):
        wiring.current().keys.remove_session(session_digest(session_id))
    session.clear()
