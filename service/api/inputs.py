"""Guards on request bodies, run before any endpoint reads one.

Werkzeug and webargs are lenient where the API must be strict: a multipart
body cut short parses silently as an empty form (the client then hears that
``metadata`` is missing), a body of the wrong media type is read as no body
at all, a JSON body as large as an upload costs seconds of validation and
hundreds of megabytes, and JSON nested deeper than Python's recursion limit raises
RecursionError inside the parser (an internal error) or takes seconds to
validate just below it. Here each of those becomes a problem document that
names it: 400 for a malformed multipart body or JSON nested too deeply, 413
for a JSON body over ``max_json_bytes``, 415 for the wrong media type.
Callers without a key the endpoint admits get its 401/403 instead, their
bodies unread.
"""

from __future__ import annotations

import hashlib
import re
from typing import IO, Any

from flask import Flask, Request, current_app, request
from werkzeug.exceptions import BadRequest
from werkzeug.formparser import FormDataParser

from service.api import auth
from service.api.problems import APIError
from service.storage import rkeys

#: deepest JSON nesting accepted (release requests need about 6 levels)
MAX_JSON_DEPTH = 32
MULTIPART = "multipart/form-data"
#: methods whose body ``check_body`` judges (415 for the wrong media type)
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: endpoints whose body is a multipart form or JSON (a registration by reference); every
#: other body is JSON
MULTIPART_ENDPOINTS = frozenset({"datasets.upload", "datasets.upload_version"})
#: blueprints of HTML forms (urlencoded or multipart) that their own views read: the web
#: console, whose pages reach the API's operations in-process (``service.console``)
FORM_BLUEPRINTS = frozenset({"console"})

# A JSON string, or an unterminated one running to the end: possessive, so every
# attempt succeeds at once and the scan stays linear whatever the body holds.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_OPEN = frozenset(b"[{")


def too_deep(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON ``text`` nests arrays/objects more than ``limit`` levels.

    Decided from the brackets outside strings, in C-speed passes plus one
    loop over the brackets that stops at the first level past the limit, so
    a hostile body is judged before a recursive parser ever sees it.
    """
    data = text.encode() if isinstance(text, str) else text
    depth = 0
    for byte in _STRING.sub(b"", data).translate(None, _NOT_BRACKET):
        depth += 1 if byte in _OPEN else -1
        if depth > limit:
            return True
    return False


class StrictFormParser(FormDataParser):
    """A form parser that reports a malformed or truncated body instead of an empty form."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["silent"] = False
        super().__init__(*args, **kwargs)

    def parse(self, stream: IO[bytes], mimetype: str, content_length: int | None,
              options: dict[str, str] | None = None) -> Any:
        try:
            return super().parse(stream, mimetype, content_length, options)
        except ValueError:  # werkzeug's multipart errors: no boundary, cut short, bad part
            raise BadRequest(
                "the multipart body is malformed or cut short (a missing boundary or an"
                " unterminated part)") from None


class StrictRequest(Request):
    form_data_parser_class = StrictFormParser


def idempotency_key(scope: str, given: str | None = None) -> str | None:
    """The Valkey key of the request's ``Idempotency-Key`` header for ``scope`` (a key id),
    or of ``given``: the key a console form carries (a browser sends no such header)."""
    idem = given if given is not None else request.headers.get("Idempotency-Key")
    if idem is None:
        return None
    if not 1 <= len(idem) <= 255:
        raise APIError(422, "Idempotency-Key must be 1..255 characters",
                       code="validation_error", field="Idempotency-Key")
    return rkeys.idempotency(scope, hashlib.sha256(idem.encode()).hexdigest())


def check_body() -> None:
    """Before a view: a body must have the endpoint's media type and sane JSON nesting."""
    if request.method not in BODY_METHODS or request.endpoint is None:
        return
    if not request.content_length and "Transfer-Encoding" not in request.headers:
        return
    if not auth.admitted():  # the view refuses it before any body is read
        return
    if request.blueprint in FORM_BLUEPRINTS:
        return
    if request.endpoint in MULTIPART_ENDPOINTS:
        if request.mimetype == MULTIPART:
            return
        if not request.is_json:
            raise APIError(415, f"the request body must be {MULTIPART} (an upload) or "
                           "application/json (a registration by reference)",
                           field="Content-Type")
    elif not request.is_json:
        raise APIError(415, "the request body must be application/json", field="Content-Type")
    # a JSON body is parsed and validated whole: keep it far below the upload limit
    limit = current_app.config["PRIVRELEASE"].max_json_bytes
    if request.max_content_length is None or limit < request.max_content_length:
        request.max_content_length = limit
    raw = request.get_data(cache=True)
    if too_deep(raw):
        raise APIError(400, f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep",
                       code="bad_request", field="body")
    if _NUL_ESCAPE.search(raw):
        raise APIError(422, "a JSON string of the body holds a NUL character (\\u0000): no"
                       " name, key or text of this API can", code="validation_error",
                       field="body")


#: a JSON ``\u0000`` escape: a backslash not itself escaped (an even run before it)
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def check_text() -> None:
    """Before a view: no NUL character in the path or the query. PostgreSQL's text can not
    hold one (psycopg refuses to send it: a 500 where the input is at fault); no id, name
    or cursor of the API has one, so a path with one names nothing (404) and a query
    value with one is refused naming its parameter (422), before anything is read."""
    query = request.query_string
    if "\x00" not in request.path and b"%00" not in query and b"\x00" not in query:
        return
    if not auth.admitted():  # the view refuses the caller first
        return
    if "\x00" in request.path:
        raise APIError(404, "no such resource (a NUL character names nothing)",
                       code="not_found")
    for name, value in request.args.items(multi=True):
        if "\x00" in name or "\x00" in value:
            raise APIError(422, "a query parameter holds a NUL character",
                           code="validation_error", field=name.replace("\x00", "?"))


def init_app(app: Flask) -> None:
    app.request_class = StrictRequest
    app.before_request(check_text)
    app.before_request(check_body)
