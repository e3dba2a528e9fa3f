"""The error statuses each operation lists in the OpenAPI document.

Every error is a problem document (``service.api.problems``). flask-smorest's catch-all
``default`` response is off, so a status a route can answer must be listed on it here:
clients and the contract fuzzer (``tests/integration/test_contract_fuzz.py``) hold the
service to exactly the statuses it documents.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TypeVar, cast
from urllib.parse import urlencode

from flask import request
from flask_smorest import Blueprint

from service.storage import index

F = TypeVar("F", bound=Callable[..., Any])

#: every route behind a bearer key: no/unknown/revoked/expired key, rate limit, Valkey down
AUTH = (401, 429, 503)
#: and a route that reads a body: malformed JSON or form, too large, invalid fields
BODY = (400, 413, 422)


def problems(blp: Blueprint, *statuses: int) -> Callable[[F], F]:
    """List ``statuses`` as problem+json responses of the decorated route."""

    def decorator(view: F) -> F:
        for status in sorted(set(statuses), reverse=True):
            view = blp.alt_response(status, response=HTTPStatus(status).name)(view)
        return view

    return decorator


def located(template: str) -> Callable[[F], F]:
    """Answer with a ``Location`` header naming what the view created: ``template``
    formatted with the route's arguments and the created document's fields (``{id}``).
    Put it below ``blp.response``, which takes the (document, headers) pair."""

    def decorator(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> tuple[Any, dict[str, str]]:
            doc = view(*args, **kwargs)
            return doc, {"Location": template.format(**{**kwargs, **doc})}

        return cast(F, wrapper)

    return decorator


def page_headers(nxt: index.Cursor | str | None) -> dict[str, str]:
    """A list response's paging headers: ``X-Next-Cursor`` and ``Link: <url>; rel="next"``
    (the request's own query with the new cursor); none on the last page. ``nxt``: an
    index cursor, or a list's own opaque token (the analyses')."""
    if nxt is None:
        return {}
    token = nxt if isinstance(nxt, str) else nxt.encode()
    args = {k: v for k, v in request.args.items() if k != "cursor"}
    url = f"{request.base_url}?{urlencode({**args, 'cursor': token})}"
    return {"X-Next-Cursor": token, "Link": f'<{url}>; rel="next"'}
