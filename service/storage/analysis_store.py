"""Where analyses are kept (``AnalysisStore``), whatever keeps them.

``service.storage.pg_analyses.PgAnalysisStore`` keeps it on PostgreSQL, beside the ledger
(issue #29). ``service.analyses`` holds the logic (the states, the expiry, the documents,
the cursors) and reaches the store through this interface only.

An analysis's stored fields (``Fields``) are a flat ``str -> str`` mapping (the fields of
the old Valkey store's hash, which ``privrelease migrate-from-valkey`` moves as they are),
with only the fields that are set:

- ``release_id``, ``analysis`` (its name), ``actor`` (the key id that asked);
- ``params`` (JSON object), ``releases`` (JSON list of the other releases' ids);
- ``status``: queued, running, succeeded, failed or cancelled;
- ``created_at``, ``started_at``, ``finished_at``: ISO 8601 (``ledger.now_iso``);
- ``work``: the analysis's work units (``repr`` of a float);
- ``deadline``: a running analysis's hard deadline, epoch seconds (``repr``);
- ``error``: the error document (JSON) of a failed or cancelled one;
- ``stored``: ``"1"`` once its result is a file of the document store; ``result``: a
  result kept in the record itself (JSON; earlier versions, or no document store).

Every change of status is one compare-and-set on the stored status (``start``,
``transition``): two of them never both apply from the same status.
"""

from __future__ import annotations

from typing import Protocol

#: an analysis's stored fields (see the module docstring)
Fields = dict[str, str]
#: a place in a release's list of analyses: (creation time in microseconds, id)
Position = tuple[int, str]


class AnalysisStore(Protocol):
    """Analyses: their records, status changes and each release's list."""

    def add(self, analysis_id: str, fields: Fields, order_us: int) -> None:
        """Store a new analysis (status ``queued``) in its release's list at ``order_us``
        (its creation time in microseconds)."""
        ...

    def discard(self, release_id: str, analysis_id: str) -> None:
        """Forget an analysis whose job could not be queued."""
        ...

    def start(self, analysis_id: str, started_at: str, deadline: float,
              lost_error: str) -> Fields | None:
        """One compare-and-set: a ``queued`` analysis turns ``running`` (``started_at``,
        ``deadline``) and its fields are returned; a ``running`` one (an earlier run
        started it: the message was redelivered) turns ``failed`` with ``lost_error``
        and None is returned; any other (ended, unknown): nothing changes, None."""
        ...

    def transition(self, analysis_id: str, expected: tuple[str, ...],
                   changes: Fields) -> str | None:
        """Set ``changes`` (``status`` and the fields that go with it) only while the
        status is one of ``expected``: the status it had, or None (nothing changed)."""
        ...

    def fields(self, analysis_id: str) -> Fields | None:
        """The analysis's stored fields, None if there is no such analysis."""
        ...

    def status(self, analysis_id: str) -> str | None:
        """Its status alone (a running analysis's worker looks at it twice a second)."""
        ...

    def page(self, release_id: str, limit: int, after: Position | None
             ) -> list[tuple[str, int, Fields | None]]:
        """Up to ``limit + 1`` of the release's analyses after ``after`` in (creation
        time, id) descending order (newest first): (id, creation time in microseconds,
        fields: None for one discarded meanwhile)."""
        ...

    def count(self, release_id: str) -> int:
        """How many analyses the release has."""
        ...
