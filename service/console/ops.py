"""The API's own operations, run in-process for the console as its signed-in key.

A console page does what its API route does by calling that route's view function
below its HTTP decorators (argument parsing, response serialisation): the same
grant checks, validation, ledger calls and errors (``APIError`` with the API's
``detail`` and ``field``), never a copy of them and never an HTTP call to itself.
The role check is the route's own: the role its ``@require`` declares, checked by
``auth.key_refusal`` against the session's key.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import marshmallow
from flask import g

from service.api import auth, problems
from service.api.problems import APIError
from service.errors import ServiceError


def role_of(view: Callable[..., Any]) -> str:
    """The role the API route ``view`` requires (set by ``auth.require``)."""
    role: str = view._required_role  # type: ignore[attr-defined]
    return role


def allowed(view: Callable[..., Any]) -> bool:
    """Whether the signed-in key may call the API route ``view`` (links, buttons)."""
    return auth.key_refusal(g.get("api_key"), role_of(view)) is None


def check(view: Callable[..., Any]) -> None:
    """Raise the API's own 401/403 unless the signed-in key may call ``view``."""
    refusal = auth.key_refusal(g.get("api_key"), role_of(view))
    if refusal is not None:
        raise refusal


def call(view: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run the API operation ``view`` for the signed-in key; APIError as the API raises.
    A domain refusal (``service.errors``: an exhausted budget, a retired dataset) comes as
    the APIError of the same answer, so a page shows it on its form as it shows the
    edge's own errors, not as the API's JSON."""
    check(view)
    body = inspect.unwrap(view)
    try:
        return body(*args, **kwargs)
    except APIError:
        raise
    except ServiceError as err:
        raise APIError(err.status, err.detail, code=err.code, field=err.field,
                       **err.extra) from err


def load(schema: marshmallow.Schema, data: Mapping[str, Any]) -> Any:
    """Validate a request body with the route's own schema; its errors as the API's 422
    (``detail`` and ``field`` as ``problems`` words them for webargs)."""
    try:
        return schema.load(data)
    except marshmallow.ValidationError as err:
        errors = problems.flatten_messages(err.messages)
        first = next(iter(errors))
        raise APIError(422, f"invalid request: {first}: {errors[first]}",
                       code="validation_error", field="body" if first == "_schema" else first,
                       errors=errors) from None
