"""Exceptions of the client: every server refusal carries its problem+json document."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

__all__ = ["ApiError", "BudgetExhausted", "BudgetRefused", "ConnectionFailed", "MissingExtra",
           "ReleaseFailed"]

_FALLBACK_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden",
                   404: "not_found", 405: "method_not_allowed", 409: "conflict",
                   413: "payload_too_large", 415: "unsupported_media_type",
                   422: "validation_error", 429: "rate_limited", 500: "internal_error",
                   502: "bad_gateway", 503: "unavailable", 504: "gateway_timeout"}


class ApiError(Exception):
    """An error answer of the API, built from its problem+json document.

    ``code`` is the server's stable name (``budget_exhausted``, ``not_found``, ...) so
    callers branch on it rather than on the human ``detail``; ``body`` keeps the whole
    document, and ``requested``/``remaining``/``measure``/``scope`` read its amounts.
    """

    def __init__(self, status: int, code: str, detail: str, field: str | None = None,
                 body: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}" + (f" (field: {field})" if field else ""))
        self.status = status
        self.code = code
        self.detail = detail
        self.field = field
        self.body: dict[str, Any] = dict(body or {})

    @property
    def requested(self) -> Any:
        """The amount asked for (budget errors), as the server wrote it; else None."""
        return self.body.get("requested")

    @property
    def remaining(self) -> Any:
        """What is left of the budget (budget errors), as the server wrote it; else None."""
        return self.body.get("remaining")

    @property
    def measure(self) -> str | None:
        value = self.body.get("measure")
        return None if value is None else str(value)

    @property
    def scope(self) -> str | None:
        """``dataset`` or ``allocation`` for a budget error: whose budget ran out."""
        value = self.body.get("scope")
        return None if value is None else str(value)

    @staticmethod
    def build(status: int, code: str, detail: str, field: str | None = None,
              body: Mapping[str, Any] | None = None) -> ApiError:
        """The most specific class for ``code`` (``BudgetExhausted`` for that code)."""
        cls = BudgetExhausted if code == "budget_exhausted" else ApiError
        return cls(status, code, detail, field, body)

    @classmethod
    def from_response(cls, resp: requests.Response) -> ApiError:
        """Read a problem document; fall back to the status for proxies' HTML pages."""
        body: Any = None
        try:
            body = resp.json()
        except ValueError:
            body = None
        fallback = _FALLBACK_CODES.get(resp.status_code, f"http_{resp.status_code}")
        if not isinstance(body, dict):
            text = " ".join(resp.text.split())[:200] or resp.reason or "no detail"
            return cls.build(resp.status_code, fallback, text, None, {})
        field = body.get("field")
        return cls.build(resp.status_code, str(body.get("code") or fallback),
                         str(body.get("detail") or body.get("title") or resp.reason or ""),
                         str(field) if field is not None else None, body)


class BudgetExhausted(ApiError):
    """409 ``budget_exhausted``: ``requested`` is more than ``remaining`` of ``measure``."""


class ConnectionFailed(ApiError):
    """The server could not be reached (after retries); status 0 as no answer came."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, "connection_error", detail)


class ReleaseFailed(ApiError):
    """A release (or analysis) that ended ``failed`` or ``cancelled``.

    The server accepted the request (status 0 here: no HTTP error), but the job did not
    succeed; ``code``/``field``/amounts come from the document's ``error`` object, e.g.
    ``budget_exhausted`` when pricing found the cost larger than what remains.
    """

    def __init__(self, doc: Mapping[str, Any]) -> None:
        error = doc.get("error")
        error = dict(error) if isinstance(error, Mapping) else {"message": error}
        code = str(error.get("code") or f"release_{doc.get('status')}")
        detail = str(error.get("message") or error.get("detail") or "no detail")
        field = error.get("field")
        super().__init__(0, code, detail, None if field is None else str(field), error)
        self.doc = dict(doc)

    @staticmethod
    def of(doc: Mapping[str, Any]) -> ReleaseFailed:
        """The exception of an ended job: ``BudgetRefused`` when it was refused for budget
        (so ``except BudgetExhausted`` catches a refusal whether the POST or a pricing job
        found it), else ``ReleaseFailed``."""
        error = doc.get("error")
        refused = isinstance(error, Mapping) and error.get("code") == "budget_exhausted"
        return BudgetRefused(doc) if refused else ReleaseFailed(doc)


class BudgetRefused(ReleaseFailed, BudgetExhausted):
    """A release refused for budget after the POST (a cold request priced by a worker):
    both a ``ReleaseFailed`` (the job ended refused) and a ``BudgetExhausted`` (what an
    identical request gets at the POST once the service knows its price), with the same
    ``requested``, ``remaining``, ``measure`` and ``scope``."""


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra to add."""

    def __init__(self, module: str, extra: str, what: str) -> None:
        super().__init__(f"{what} needs {module}: pip install 'privrelease-client[{extra}]'")
        self.extra = extra
