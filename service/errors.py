"""The domain's refusals and failures, as exceptions that know nothing of HTTP.

The release pipeline (``service.releases``) raises these; the HTTP edge turns any of
them into one problem+json answer (``service.api.problems``), and a pricing job stores the
same problem as a refused release's ``error``. Each class carries the HTTP status it is
answered with, so that mapping is written once, here, beside the class.

Messages and extra fields name public inputs only (measures, fields, limits, amounts of
public budgets), never a data value.
"""

from __future__ import annotations

import errno
from typing import Any, ClassVar

#: file-system errors that mean the store cannot take more now, not a bug: full (or over
#: quota, or a file-size limit), answered 507; read-only, refused or failing storage,
#: answered 503 ``storage_unavailable``: for an operator to fix and a client to retry
STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
STORAGE_DOWN = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO})


class ServiceError(Exception):
    """A request the service refuses, or a step it cannot do now.

    ``code`` is the stable machine-readable name; ``field`` the input it is about;
    ``extra`` fields are merged into the problem document.
    """

    status: ClassVar[int] = 400
    default_code: ClassVar[str] = "bad_request"

    def __init__(self, detail: str, *, code: str | None = None, field: str | None = None,
                 **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code or self.default_code
        self.field = field
        self.extra = extra

    def problem(self) -> dict[str, Any]:
        """The error as a stored document: code, message, HTTP status, field, extras (what
        a refused release's ``error`` holds: the answer the POST would have given)."""
        doc: dict[str, Any] = {"code": self.code, "message": self.detail,
                               "status": self.status}
        if self.field is not None:
            doc["field"] = self.field
        doc.update(self.extra)
        return doc


class Invalid(ServiceError):
    """The request is well formed but cannot be served as written (422)."""

    status = 422
    default_code = "validation_error"


class NotFound(ServiceError):
    """No such thing, or one the caller may not see: the two answer the same (404)."""

    status = 404
    default_code = "not_found"


class Conflict(ServiceError):
    """The request is valid but the state forbids it now (409)."""

    status = 409
    default_code = "conflict"


class Retired(Conflict):
    """The dataset (or the version) takes no new releases."""

    default_code = "dataset_retired"


class BudgetExhausted(Conflict):
    """The cost does not fit what is left: of the dataset's cap (``scope`` ``dataset``)
    or of the caller's allocation (``allocation``; ``listed`` False when the allocation
    does not list the measure at all). Amounts are in the measure's public units."""

    default_code = "budget_exhausted"

    def __init__(self, detail: str, *, measure: str, scope: str, requested: float,
                 remaining: float, listed: bool | None = None) -> None:
        extra: dict[str, Any] = {"measure": measure, "scope": scope}
        if listed is not None:
            extra["listed"] = listed
        super().__init__(detail, requested=requested, remaining=remaining, **extra)
        self.measure, self.scope = measure, scope
        self.requested, self.remaining = requested, remaining


class Unavailable(ServiceError):
    """A dependency (queue, store) cannot take the step now; retry later (503)."""

    status = 503
    default_code = "unavailable"


class Failed(ServiceError):
    """A step failed in a way the caller cannot fix (500); its message names no data."""

    status = 500
    default_code = "internal_error"


#: the class each HTTP status of a domain error is raised as (``by_status``)
_BY_STATUS: dict[int, type[ServiceError]] = {
    cls.status: cls for cls in (Invalid, NotFound, Conflict, Unavailable, Failed)}


def by_status(status: int, detail: str, *, code: str | None = None,
              field: str | None = None, **extra: Any) -> ServiceError:
    """The domain error for a status a lower layer decided (``datasets.VersionError``)."""
    return _BY_STATUS.get(status, ServiceError)(detail, code=code, field=field, **extra)


def idempotency_mismatch() -> Invalid:
    """An ``Idempotency-Key`` reused for a different request (422, nothing done)."""
    return Invalid("Idempotency-Key was used for a different request",
                   code="idempotency_mismatch", field="Idempotency-Key")
