"""The system of record's one interface (``Store``): the budget ledger, the releases, the
dataset registry and the audit events, whatever keeps them.

``service.storage.pg_ledger.PgLedger`` keeps it on PostgreSQL, the one system of record
(one short transaction per step; issue #29); Valkey holds only what may be lost (the
Celery broker, rate-limit counters, caches). The service reads and writes the record
through this interface only, never the tables, and builds it in one place
(``service.wiring.build``).

A release's stored fields (``release``) are a flat ``str -> str`` mapping, with only the
fields that are set:

- ``status``: pricing, queued, running, succeeded, failed, cancelled or refused;
- ``request``: the stored request (``service.releases.request.JobRequest.to_json``);
- ``actor``: the key id that asked;
- ``created_at``, ``started_at``, ``finished_at``: ISO 8601 (``ledger.now_iso``);
- ``output``: the result document (JSON) of a succeeded release;
- ``error``: the error document (JSON) of a failed, cancelled or refused one;
- ``data_read``: ``"1"`` once a run recorded that it reads the data;
- ``charged``: ``"1"`` if a failed release was charged (it failed after the read);
- ``table``: the attempt number whose table is the release's (``release_tables``);
- ``resent_at``: epoch seconds of the sweeper's last re-send; ``resends``: how many.

The sweeper's marks (``sweep_marks``, ``passed``; ``service.releases.sweeper`` has the
argument) are not among a release's fields.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

import psycopg
import psycopg_pool
import redis

from service.storage.index import Cursor
from service.storage.ledger import (
    PRICING,
    RUN,
    Passed,
    Reservation,
    ReserveResult,
    Run,
    SendMarks,
    Settled,
)
from service.storage.release_documents import DocumentStore

#: the record or Valkey cannot answer now (a server away, a failover under way, every
#: pooled connection busy): whether a step ran is unknown, and the request is not wrong
DOWN: tuple[type[Exception], ...] = (redis.RedisError, psycopg.OperationalError,
                                     psycopg_pool.PoolTimeout)
#: of :data:`DOWN`, what PostgreSQL raises while it is away (the API's 503s name these and
#: Valkey's connection errors, not every Valkey error)
POSTGRES_DOWN: tuple[type[Exception], ...] = (psycopg.OperationalError,
                                              psycopg_pool.PoolTimeout)
#: which releases a list shows (``Store.release_page``)
ViewKind = Literal["all", "datasets", "key", "pending", "failed"]
#: a release's fields as stored (see the module docstring)
Fields = dict[str, str]
#: re-exported: the sweeper's kinds of message and what its store calls answer
__all__ = ["DOWN", "PRICING", "RUN", "Fields", "Passed", "ReleaseView", "SendMarks", "Store",
           "ViewKind"]


@dataclass(frozen=True)
class BudgetWindow:
    """A dataset's newest audit events and, when older ones exist, what the ledger holds
    to replay them from (``service.console.burndown.replay_window``), read in one
    snapshot: ``events`` oldest first; ``complete`` when they are the whole history
    (the rest is then empty); otherwise ``start_at``, the time of the newest event
    before them, ``balance`` the dataset's cap, committed and reserved units per measure
    now (after every event read), and ``caps`` the cap of each measure the ``cap``
    events before them set last."""

    events: list[dict[str, Any]]
    complete: bool = True
    start_at: str = ""
    balance: dict[str, dict[str, int]] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseView:
    """A list of releases: every one (``all``), those of some ``datasets``, those one
    ``key_id`` requested (``key``), newest first by creation; the ``pending`` ones
    (pricing, queued, running: oldest first by creation) or the ``failed`` ones (failed
    and refused: newest first by when they ended), of every dataset or, with
    ``datasets``, of those only. A cursor's score is that order's time in epoch
    seconds, its member the release id."""

    kind: ViewKind
    datasets: frozenset[str] | None = None
    key_id: str = ""


class Store(Protocol):
    """The ledger, the releases, the dataset registry and the audit events."""

    lease_seconds: int
    #: where run outputs (``result.<attempt>.json``) are read from; None: ledger-only use
    documents: DocumentStore | None
    #: whether a run's output goes into the record with its commit (PostgreSQL: one
    #: transaction stores it and charges); False: each run writes its output as a file in
    #: ``documents`` first, and the commit names it
    results_inline: bool

    def ping(self) -> None:
        """Answer if the record is reachable now; raise one of ``DOWN`` if not."""
        ...

    # -- datasets ---------------------------------------------------------------------
    def open(self, dataset_id: str, caps: dict[str, int], actor: str,
             document: str | None = None, *, idempotency_key: str | None = None,
             fingerprint: str = "", idempotency_ttl: int = 86400) -> tuple[str, str]: ...

    def version_change(self, dataset_id: str, read: str, document: str, action: str,
                       version: int, actor: str, *, idempotency_key: str | None = None,
                       fingerprint: str = "", idempotency_ttl: int = 86400
                       ) -> tuple[str, int]: ...

    def set_dataset_status(self, dataset_id: str, status: str) -> str | None:
        """Set ``status`` in the dataset's document (compare-and-set, retried); the new
        document's text, None if there is no such dataset."""
        ...

    def dataset_document(self, dataset_id: str) -> str | None: ...

    def dataset_for_pricing(self, dataset_id: str) -> tuple[str, set[str], str] | None:
        """The dataset's document text and the measures its caps name
        (``named_measures``), read together (one statement, one round trip): what pricing a
        request reads of the registry; and its stamp, which ``reserve`` checks when a
        ``Reservation`` carries it ('' if this store has none). None if there is no such
        dataset."""
        ...

    def dataset_documents(self, ids: list[str]) -> list[str | None]:
        """Each dataset's document text, in order (None where there is none)."""
        ...

    def datasets_page(self, limit: int, after: Cursor | None = None,
                      granted: frozenset[str] | None = None
                      ) -> tuple[list[str], Cursor | None]: ...

    def dataset_count(self) -> int:
        """How many datasets are registered (a metric): exact, and at a cost that does not
        grow with their number."""
        ...

    def same_shape_documents(self, columns: list[str], n_rows: int, exclude: str
                             ) -> list[str]:
        """The documents of the datasets, ``exclude`` apart, that may have an active
        version of ``n_rows`` rows and these ``columns`` (as a set), oldest first: every
        such one, and maybe others (the caller checks each); never a read of every
        dataset where the store keeps an index of shapes."""
        ...

    def dataset_ids(self) -> list[str]:
        """Every registered dataset id (the hourly orphan sweep; operator tools)."""
        ...

    def idempotency_record(self, key: str) -> tuple[str, str | None, int | None] | None:
        """A live Idempotency-Key's (fingerprint, dataset id, version) as ``open`` or
        ``version_change`` stored it; None if there is none (or it expired)."""
        ...

    def record_holdout(self, dataset_id: str, rows: int) -> None:
        """One more release held ``rows`` rows out of DP: the count grows by one, the
        rows kept are the largest hold-out so far (DIP's hold-outs are nested)."""
        ...

    def holdout_exposure(self, dataset_id: str) -> dict[str, int]:
        """``{"rows": largest hold-out, "releases": releases that used one}``."""
        ...

    # -- caps, policy -------------------------------------------------------------------
    def migrate_policy(self, dataset_id: str, read: str, document: str, actor: str,
                       notions: list[str], record_level: bool) -> tuple[str, list[str]]: ...

    def recharge_interval(self, dataset_id: str, units: dict[str, int], actor: str) -> str: ...

    def set_caps(self, dataset_id: str, caps: dict[str, int], actor: str,
                 key_id: str | None = None) -> None: ...

    def change_caps(self, dataset_id: str, changes: list[tuple[str | None, dict[str, int]]],
                    actor: str) -> None: ...

    def retire(self, dataset_id: str, actor: str) -> None: ...

    def balance(self, dataset_id: str) -> dict[str, dict[str, int]]: ...

    def balances(self, ids: list[str]) -> list[dict[str, dict[str, int]]]:
        """Each dataset's ``balance``, in the order of ``ids`` (on PostgreSQL one query,
        however many ids)."""
        ...

    def budget(self, dataset_id: str) -> tuple[dict[str, dict[str, int]],
                                               dict[str, dict[str, dict[str, int]]]]: ...

    def named_measures(self, dataset_id: str) -> set[str]: ...

    def allocation_scopes(self, dataset_id: str) -> dict[str, str]: ...

    def notion_lock(self, dataset_id: str) -> str | None: ...

    # -- a release's life ---------------------------------------------------------------
    def reserve(self, r: Reservation) -> ReserveResult: ...

    def refuse(self, dataset_id: str, release_id: str, error_json: str, code: str,
               actor: str) -> bool: ...

    def enqueued(self, release_id: str) -> None: ...

    def enqueued_many(self, release_ids: list[str]) -> None:
        """``enqueued`` for each of ``release_ids`` (published), in one step: one
        statement, or one command (``submit.OutboxFlusher``'s batches). Ids no longer in
        the outbox (a run took them out) are no error."""
        ...

    def unsent(self, release_id: str, older_than: float) -> bool: ...

    def outbox(self, older_than: float, limit: int = 1000) -> list[str]: ...

    def mark_running(self, release_id: str, worker: str) -> Run | None: ...

    def renew_lease(self, run: Run) -> bool: ...

    def mark_data_read(self, run: Run) -> bool: ...

    def commit(self, dataset_id: str, run: Run, output_json: str,
               table_version: int | None = None, *, result_stored: bool = False
               ) -> Settled: ...

    def fail(self, dataset_id: str, run: Run, error_json: str) -> Settled: ...

    def abort_run(self, dataset_id: str, run: Run, error_json: str) -> Settled: ...

    def abort(self, dataset_id: str, release_id: str, error_json: str, actor: str,
              holder: str = "") -> bool: ...

    def charge_gone(self, dataset_id: str, release_id: str, error_json: str,
                    actor: str) -> bool: ...

    def cancel(self, dataset_id: str, release_id: str, actor: str) -> Settled: ...

    # -- reading releases ---------------------------------------------------------------
    def release(self, release_id: str) -> Fields | None:
        """The release's fields (module docstring), its request and output included
        wherever they are kept; None if there is no such release. Raises
        ``release_documents.DocumentMissing`` if a file the record names is gone."""
        ...

    def releases(self, ids: list[str]) -> list[tuple[str, Fields]]:
        """(id, fields) of each of ``ids`` that exists, in order: one round trip."""
        ...

    def release_page(self, view: ReleaseView, limit: int, after: Cursor | None = None
                     ) -> tuple[list[str], Cursor | None]:
        """Up to ``limit`` ids of ``view`` after the cursor ``after`` (a cursor this
        method returned for the same view), and the next page's cursor (None: this is
        the last page); O(log N + limit) whatever the number of releases."""
        ...

    def dataset_history(self, dataset_id: str, newest: int) -> tuple[list[Fields], bool]:
        """The fields (``request``, ``status``, ``charged`` at least) of the dataset's
        ``newest`` most recent releases, oldest first, and whether it has older ones:
        O(newest), whatever the number of its releases."""
        ...

    def kept_request(self, release_id: str) -> str | None:
        """The digest of the request file the release's record names; None when none is
        kept in ``documents`` (PostgreSQL keeps the request in its row)."""
        ...

    # -- the sweeper ----------------------------------------------------------------------
    def stale(self, older_than: float) -> list[tuple[str, float]]:
        """(id, creation epoch s) of the pending releases created over ``older_than``
        seconds ago, oldest first."""
        ...

    def lease_held(self, release_id: str) -> bool:
        """Whether a run holds the release's lease now."""
        ...

    def unsent_ids(self) -> set[str]:
        """Every release in the outbox, whatever its age."""
        ...

    def claim_resend(self, release_id: str, max_resends: int) -> int:
        """Claim a re-send of a gone job, atomically with the checks that it is still
        queued or running, unread (no ``data_read``) and unleased: the re-send's number
        (``resends`` + 1, ``resent_at`` now; a store that keeps marks marks a send under
        way, as ``sending``); 0 if it is no longer gone; -1 if ``max_resends`` re-sends
        were made (refund it)."""
        ...

    def undo_resend(self, release_id: str) -> None:
        """Give back the last claim (its publish failed): ``resends`` - 1, no
        ``resent_at`` (and a mark, as ``sent``)."""
        ...

    def drop_pending(self, release_id: str) -> None:
        """The release is no longer pending: forget any index entry that says it is."""
        ...

    def sweep_marks(self, older_than: float, witness_age: float, lapsed: float
                    ) -> SendMarks:
        """Mark (``sweep_seq``, phase 1) the pending releases whose last message was
        published and that have no valid mark: pricing or queued ones created over
        ``older_than`` s ago and out of the outbox, running ones whose lease lapsed over
        ``lapsed`` s ago (a killed run's message is back in its queue by then), and
        those whose send by the sweeper began over ``SEND_BOUND`` s ago; a bounded batch
        per call. Returns the witness bounds of each kind of message, from the releases
        started (``RUN``) or priced (``PRICING``) over ``witness_age`` s ago."""
        ...

    def passed(self, marks: SendMarks, empty: Collection[str], limit: int,
               stranded: Collection[str] = (), waiting: Collection[str] = ()
               ) -> list[Passed]:
        """Up to ``limit`` pending releases whose mark is below their kind's bound, or
        any mark at all for a kind in ``empty`` (its queue was found empty after the
        marks were taken): ``gone`` if so, or if marked twice (phase 2), else passed
        once; and the pending ones of ``stranded`` (their message held by a worker for
        too long: ``gone``). ``waiting`` is not read (the ids the old Valkey store's
        sweeper found in the queue lists; the marks say it)."""
        ...

    def confirm_passed(self, passed: list[Passed]) -> None:
        """Mark these releases, found passed once, again (phase 2): a worker took their
        message, or it was lost; if it comes back (a worker put it back), the next
        witness past this mark shows it."""
        ...

    def held_by_workers(self, release_ids: Collection[str]) -> None:
        """A worker holds these releases' messages now (kombu's unacked set): a pricing
        or queued one's second mark no longer counts (its message may be put back)."""
        ...

    def sending(self, release_id: str) -> None:
        """The sweeper publishes the release's pricing job now (phase 0, since now);
        ``claim_resend`` does the same for a run."""
        ...

    def sent(self, release_id: str) -> None:
        """The sweeper's publish returned (sent or failed): mark the release (phase 1)."""
        ...

    # -- the audit events -------------------------------------------------------------------
    def audit_range(self, since: datetime | None, until: datetime | None,
                    after: str | None) -> tuple[str, str]:
        """The (start, end) bounds ``iter_events`` and ``events_page`` take for the events
        at or after ``since``, at or before ``until`` and, with ``after`` (a page's last
        event id, from a cursor), after that event. Raises ``service.errors.Invalid``
        naming ``cursor`` if ``after`` is not an event id of this store."""
        ...

    def iter_events(self, dataset_id: str, start: str = "-", end: str = "+",
                    kinds: set[str] | None = None) -> Iterator[dict[str, Any]]: ...

    def events(self, dataset_id: str, start: str = "-", end: str = "+",
               kinds: set[str] | None = None) -> list[dict[str, Any]]: ...

    def events_page(self, dataset_id: str, start: str, end: str, kinds: set[str] | None,
                    limit: int) -> tuple[list[dict[str, Any]], str | None]: ...

    def budget_window(self, dataset_id: str, limit: int) -> BudgetWindow:
        """The dataset's newest ``limit`` audit events and what replaying them from the
        ledger needs (``BudgetWindow``), in one snapshot."""
        ...
