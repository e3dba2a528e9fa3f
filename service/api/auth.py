"""Bearer-token authentication and role checks for every endpoint.

Roles nest: an operator may do everything, an analyst what a consumer may
and spend on granted datasets, a consumer only read releases and run free
post-processing. A key with ``datasets`` set sees only those datasets: for
it, any other dataset (and its releases) does not exist. Views check the
grant first, before anything about the dataset or the request body, and
answer exactly what they answer for an id that does not exist (DESIGN §6).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, current_app, g, request

from service import apikeys, wiring
from service.api.problems import APIError
from service.config import Config
from service.errors import ServiceError

F = TypeVar("F", bound=Callable[..., Any])

# Which roles each declared role admits: an operator can do what others can.
_ADMITS = {
    "operator": {"operator"},
    "analyst": {"operator", "analyst"},
    "consumer": {"operator", "analyst", "consumer"},
}


def bearer_token() -> str | None:
    """The request's ``Authorization: Bearer`` token, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


#: the ``app.extensions`` key of the app's ``apikeys.KeyCache``
KEY_CACHE = "privrelease.key_cache"


def key_cache(app: Flask) -> apikeys.KeyCache:
    """The app's cache of keys found by token (made on first use: in each gunicorn
    worker, after the fork), kept ``PRIVRELEASE_KEY_CACHE_SECONDS``."""
    cache: apikeys.KeyCache | None = app.extensions.get(KEY_CACHE)
    if cache is None:
        config: Config = app.config["PRIVRELEASE"]
        cache = app.extensions.setdefault(KEY_CACHE,
                                          apikeys.KeyCache(config.key_cache_seconds))
    return cache


def request_key() -> apikeys.ApiKey | None:
    """The registered key the bearer token names (None: no token or none registered).

    Looked up once per request (the rate limiter asks first, the role check after), and
    answered from the process's ``apikeys.KeyCache`` while a lookup of the same token is
    fresh (``PRIVRELEASE_KEY_CACHE_SECONDS``).
    """
    if "key_lookup" not in g:
        token = bearer_token()
        g.key_lookup = (key_cache(current_app).lookup(wiring.current().keys, token)
                        if token else None)
    key: apikeys.ApiKey | None = g.key_lookup
    return key


def current_key() -> apikeys.ApiKey:
    key: apikeys.ApiKey = g.api_key
    return key


def _refusal(role: str) -> APIError | None:
    """Why the request's key may not call a view that needs ``role`` (None: it may)."""
    if bearer_token() is None:
        return APIError(401, "missing bearer token", code="unauthorized")
    return key_refusal(request_key(), role)


def key_refusal(key: apikeys.ApiKey | None, role: str) -> APIError | None:
    """Why ``key`` may not do what needs ``role`` (None: it may).

    The one role check: the API's bearer tokens and the web console's sessions
    (``service.console``) both come here, so a page allows exactly what its route does.
    """
    if key is None:
        return APIError(401, "unknown or revoked API key", code="unauthorized")
    if key.expired():
        return APIError(401, "API key expired", code="unauthorized")
    if key.role not in _ADMITS[role]:
        return APIError(403, f"this endpoint needs the {role} role", code="forbidden")
    return None


def require(role: str) -> Callable[[F], F]:
    """Allow the view to keys whose role admits ``role``; 401/403 otherwise."""

    def decorator(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            refusal = _refusal(role)
            if refusal is not None:
                raise refusal
            g.api_key = request_key()
            return view(*args, **kwargs)

        wrapper._required_role = role  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def admitted() -> bool:
    """Whether the request's key may call its endpoint (true for endpoints without a role).

    Body checks ask first, so a caller without the right key hears 401/403
    from the view before anything reads, measures or parses its body.
    """
    view = current_app.view_functions.get(request.endpoint or "")
    role: str | None = getattr(view, "_required_role", None)
    return role is None or _refusal(role) is None


def may_use(dataset_id: str) -> bool:
    """Whether the current key has a grant for ``dataset_id`` (unscoped keys: any)."""
    key = current_key()
    return key.datasets is None or dataset_id in key.datasets


def check_dataset_grant(dataset_id: str, not_found: ServiceError) -> None:
    """Raise ``not_found`` unless the current key may use ``dataset_id``.

    ``not_found`` is the view's own answer for an id that does not exist, so a
    key learns nothing of a dataset it may not use, not even that it exists.
    """
    if not may_use(dataset_id):
        raise not_found
