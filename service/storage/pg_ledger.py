"""The privacy budget ledger and the dataset registry on PostgreSQL (issue #29): ``PgLedger``.

The same calls, arguments, answers and accounting as the Valkey ``Ledger``
(``service.storage.ledger``), each Lua script ported to ONE short transaction:

- reserve.lua  -> ``reserve``: modes new / pricing / priced, the re-sent create, the
  Idempotency-Key (``idempotent`` / ``idem_mismatch``), the replay, the retired dataset and
  the retired version, the notion lock, the caps (``not_admitted`` for a measure no cap
  names, ``exhausted`` with measure / requested / remaining / scope) and the allocations
  (``listed``: an unlisted measure is refused; ``legacy``: unlisted measures unlimited);
- start.lua -> ``mark_running``; lease.lua -> ``renew_lease`` / ``mark_data_read``;
- settle.lua -> ``commit`` / ``fail`` / ``abort_run`` / ``abort`` / ``charge_gone`` /
  ``cancel``: the failure rule (abort and cancel refund, commit and fail charge, once), the
  lease fencing (a run settles only while its token holds the lease: ``lost`` otherwise,
  nothing changed; the sweeper's ``NO_LEASE``), the replay dropped on a refund;
- refuse.lua -> ``refuse``; admin.lua -> ``change_caps`` / ``set_caps`` (``CapError``);
  ``retire``; ``set_version_retired`` (the ledger half of version.lua alone);
- open.lua -> ``open``: the dataset's document (table ``datasets``, migration 0002), its
  caps, the ``cap`` event and the ``recharged_interval`` mark in one transaction; the
  document (or, without one, the ledger) is the guard (``exists``); the Idempotency-Key
  (``idempotent`` / ``idem_mismatch``);
- version.lua -> ``version_change``: a compare-and-set on the document's exact text
  (``ok`` / ``conflict``; a re-send finds its own document: ``ok``), the retired version
  set (``retired``) or cleared (``current``), one ``version`` event per action, the
  Idempotency-Key (``idempotency.version``);
- policy.lua -> ``migrate_policy`` (``migrated`` / ``conflict`` / ``missing``, the keys
  whose allocations it marked ``legacy``); recharge.lua -> ``recharge_interval``
  (``recharged`` / ``nothing`` / ``done``, once per dataset);
- reading: ``events_page`` (``Ledger.events_page``: a page bounded by events read, the
  last id read when more follow), ``dataset_document`` (the exact text) and
  ``datasets_page`` (newest first by (created_at, id), ``index.Cursor`` cursors whose
  score is created_at in epoch seconds: ``datasets.page``'s contract).

How a step stays atomic without a single-threaded Lua: a transaction at READ COMMITTED
that takes locks in one global order, so two steps never deadlock: the Idempotency-Key
(advisory lock, class 1), the replay fingerprint (advisory lock, class 2), the dataset's
``datasets`` row (its document), the release's row, the dataset's advisory lock (class
3, ``DATASET_LOCK``), the dataset's ``ledgers`` row, the dataset's ``budgets`` rows sorted
by measure, the key's ``allocations`` rows sorted by measure (``SELECT ... ORDER BY
measure FOR UPDATE``: the rows are locked in that order); a release's outbox entry only
after its release row, its replay only after its ``budgets`` rows; a step's
``step_calls`` row last (only the attempts of the same call ever meet there). No step
that holds a class-3 lock or a ``ledgers`` row locks a release's row. Every step decides
on values no other step can change before it commits: rows it locked before reading
them (an UPDATE that decides in its WHERE, as ``ledger_start`` and ``ledger_settle``,
locks the row first: PostgreSQL checks the condition again on the newest version of a
row it waited for), or rows under a lock every writer of them takes. Locks are only as
strong as the decisions need (migration 0007_ledger_locks): ``reserve`` holds the
dataset's class-3 lock SHARED with the other reserves and reads the ``ledgers`` row
unlocked (a reserve that may set the notion lock locks the row FOR NO KEY UPDATE and
reads it again); every step that changes what reserve decides on (``retire``,
``set_version_retired``, ``version_change``'s ``retired``, ``change_caps``,
``migrate_policy``) takes the class-3 lock ALONE first (``_lock_ledger``), which waits for
the reserves under way and makes later ones wait for its COMMIT, and is not starved by
a stream of them (PostgreSQL queues shared requests behind a waiting exclusive one). A
dataset's reserves and settles take turns on its ``budgets`` rows (the caps are decided
on the locked values), so these hold them for the least work.
The audit event is inserted in the same transaction as the change it records (``events``
is append-only: a trigger refuses UPDATE, DELETE and TRUNCATE); a refused step writes
nothing but its answer.

The steps every release takes (``reserve``, ``mark_running``, ``renew_lease`` /
``mark_data_read``, the settles; ``refuse`` and ``enqueued`` besides) are PL/pgSQL
functions of migration 0004_steps (reserve and settle replaced by 0007_ledger_locks),
one per step, each the Python step it replaced statement for statement (0007 reordered
the locks): a step is ONE statement sent (``_call``), and that statement is its
transaction (autocommit: no BEGIN, no COMMIT round trip). Each statement a client
sends costs about as much again as the little work a ledger statement asks for, and a
step ran 3 to 10 of them. The rarer steps (the registry, caps, versions, policy, the
sweeper's claims, the hold-out counters) stay Python statements in one transaction.

A step is run again (``_tx``, at most ``RETRIES`` times) when PostgreSQL rolled it back
(deadlock, serialization failure) or its connection broke. A broken connection may have
committed the step before its COMMIT's reply was lost, so every write step answers once
per call (``_write``, ``_call``; table ``step_calls``, migration 0004): a call id made
once per call (not per attempt), the answer recorded under it in the step's own
transaction, and looked up first by every attempt after the first: a re-run answers what
the committed attempt answered and changes nothing more (no second event, no second
charge). Two attempts that overlap (the first one's COMMIT still on its way) meet on the
id's primary key: the later one fails there and is run again, and reads the answer.
The run's steps need no such row (migration 0007): ``mark_running``'s token is made once
per call and the lease it holds is the answer, a settle's call id is the release's
``settled_by``, and a lease renewed again is the same lease; an attempt of those that
changed nothing committed nothing, and a re-run decides again. Nor does a create without
an Idempotency-Key or a stamp (``reserve``, migration 0009_hot_start): its release's row
is the answer. Answers are kept
``CALL_MEMORY`` seconds; no call is re-run past ``RERUN_SECONDS``. Lease times are the
database's clock (``now()``), as they were Valkey's TTLs. Amounts are
Python ints end to end (BIGINT columns, JSON integers).

The rest of ``service.storage.store.Store`` (migration 0003_releases):

- reading releases: ``release`` / ``releases`` (the flat fields of the Valkey release
  hash, ``_release_fields``; a result stored as a run's file, ``commit(...,
  result_stored=True)``, is read from ``documents``: ``DocumentMissing`` if it is gone),
  ``release_page`` (``ReleaseView``: every one, some datasets', a key's, the pending, the
  failed; each list an index, on ``releases`` or, for the pending and the failed, on
  their side tables ``release_pending`` / ``release_failed`` (migration 0010_hot_settle:
  a settle then changes no indexed column of ``releases``, a HOT update), a page one
  range scan from its cursor),
  ``dataset_history``; the request always stays in the row (``kept_request``: None);
- the registry: ``set_dataset_status`` (the document rewritten under its row lock),
  ``dataset_documents``, ``dataset_ids``, ``idempotency_record``; the hold-out counters
  (``record_holdout`` / ``holdout_exposure``, table ``holdouts``);
- the sweeper: ``stale``, ``lease_held``, ``unsent_ids``, ``claim_resend`` /
  ``undo_resend`` (resend.lua: ``releases.resends`` / ``resent_at``), ``drop_pending``
  (nothing to do: the status changes the ``release_pending`` row with it, in its
  trigger, so no entry can outlive it); and
  which stale release's message no longer waits, by index (migration 0008_sweep:
  ``sweep_marks``, ``passed``, ``confirm_passed``, ``held_by_workers``, ``sending`` /
  ``sent``; ``service.releases.sweeper`` has the argument): each a statement or two on
  ranges of ``release_pending_sweep`` (the marks are columns of ``release_pending``),
  ``release_ran`` and ``releases_priced_seq`` and the few rows of ``release_runs``
  (migrations 0009_hot_start, 0010_hot_settle)
  (planned with sequential scans off: ``SWEEP_PLANNING``), whatever the backlog;
- the audit log's bounds: ``audit_range`` (time bounds to event ids, below);
- reads that do not grow with the history (issue #29 item 7, migration 0006_counts):
  ``dataset_count`` (a counter the triggers on ``datasets`` keep), ``same_shape_documents``
  (the GIN index of the active versions' shapes), ``balances`` (one query),
  ``budget_window`` (a dataset's newest events, its balance and the caps before them, one
  snapshot), ``dataset_history`` (``newest + 1`` rows: whether there are more, no count).

Not here yet: the audit archive (events stay in ``events``), and replication
acknowledgements (PostgreSQL's synchronous replication is configuration).

Known differences from the Valkey ledger: event ids are ``events.id`` (a number), not
stream ids (``<ms>-<seq>``); ``audit_range`` turns the ledger view's ``since`` / ``until``
into id bounds (the first event at or after ``since`` in (at, id) order, the last at or
before ``until``: one probe of the index ``events_at`` each, then the usual id range), so
an event whose transaction committed out of step with its neighbours' times may land on
the other side of a bound by that much (Valkey's bounds are the stream ids' clock, not
the events' ``at``: the same kind of edge), and a page's cursor is an event id (digits).
A dataset's page position is the database's clock at registration (``created_at``),
Valkey's the API process's ``time.time()``; a release's is its ``created_at`` (the
``Reservation.at`` the API passed), Valkey's the reserve script's ``time.time()``, and a
failed release's its ``finished_at`` (the database's clock). A document must be JSON
(``datasets.status`` is derived from it; Valkey stores any string).
``recharge_interval`` on a measure the caps do not name creates a cap-0 ``budgets`` row
(Valkey: a lone ``committed:<m>`` field), so ``named_measures`` then names it (the
releases recharged held only named measures). One Idempotency-Key row serves every kind
of step (Valkey: one hash whose fields differ per script). The sweeper's ``resent_at``
is the database's clock (Valkey: the sweeper's).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import psycopg
from psycopg import errors
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from service.errors import Invalid
from service.storage import index, pg_steps, release_documents
from service.storage.ledger import (
    NO_LEASE,
    READ_BATCH,
    CapError,
    Reservation,
    ReserveResult,
    Run,
    Settled,
)
from service.storage.release_documents import DocumentStore
from service.storage.store import (
    PRICING,
    RUN,
    BudgetWindow,
    Fields,
    Passed,
    ReleaseView,
    SendMarks,
)

if TYPE_CHECKING:
    from service.storage.store import Store

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]

RETRIES = pg_steps.RETRIES
#: seconds after a call's first attempt began within which it is run again: well inside
#: ``CALL_MEMORY``, so a re-run always finds its first attempt's answer if it committed
RERUN_SECONDS = 60.0
#: seconds a write call's answer is kept in ``step_calls`` (by the pruning process' clock:
#: the margin over ``RERUN_SECONDS`` covers clocks that disagree by minutes)
CALL_MEMORY = 600
#: every PRUNE_EVERY-th write call of a ``PgLedger`` deletes up to PRUNE_BATCH expired
#: answers: room for PRUNE_BATCH / PRUNE_EVERY = 4 rows per row written
PRUNE_EVERY, PRUNE_BATCH = 64, 256
#: advisory lock classes (pg_advisory_xact_lock(class, hashtext(key))): an
#: Idempotency-Key's, a replay fingerprint's, a dataset's (reserve shares it, the steps
#: that change what reserve decides on take it alone: ``_lock_ledger``, migration 0007)
IDEMPOTENCY_LOCK, REPLAY_LOCK, DATASET_LOCK = 1, 2, 3
#: a release holding units: settle moves them; every other status holds nothing
HOLDING = ("queued", "running")
#: the pending list's releases (Valkey's ``pr:pending``: reserve.lua enters every new
#: release, ``pricing`` ones too; settle.lua and refuse.lua take it out): the rows of
#: ``release_pending`` (migration 0010_hot_settle), by ``created_at``; the failed list's
#: (Valkey's ``pr:failed``: settle.lua's failed, refuse.lua's refused; not cancelled):
#: the rows of ``release_failed``, by ``finished_at``. Each view's (table, time column)
LIST_TABLES = {"pending": ("release_pending", "created_at"),
               "failed": ("release_failed", "finished_at")}
#: the sweeper's stale releases: a range of ``release_pending``'s primary key
STALE_SQL = ("SELECT release_id, created_at FROM release_pending "
             "WHERE created_at <= now() - make_interval(secs => %s) "
             "ORDER BY created_at, release_id")
#: the ``releases`` columns ``_release_fields`` reads, in its order
RELEASE_COLUMNS = ("id, status, request, actor, created_at, started_at, finished_at, worker, "
                   "attempt, output, result_attempt, error, data_read, charged, "
                   "output_table, resends, resent_at")
#: reads whose cost does not grow with the history (issue #29 item 7; tests EXPLAIN them):
#: a dataset's newest releases and one more (``dataset_history``), a counter of ``counts``
#: (``dataset_count``), the datasets of a shape (``same_shape_documents``), the balances
#: of some datasets (``balances``), a dataset's newest events and one more, and the caps
#: its ``cap`` events set up to an event (``budget_window``)
HISTORY_SQL = (f"SELECT {RELEASE_COLUMNS} FROM releases WHERE dataset_id = %s "
               "ORDER BY created_at DESC, id DESC LIMIT %s")
COUNT_SQL = "SELECT value FROM counts WHERE name = %s"
SHAPES_SQL = ("SELECT document FROM datasets WHERE shapes @> "
              "ARRAY[dataset_shape(%s::jsonb, %s::jsonb)] AND id <> %s ORDER BY created_at, id")
BALANCES_SQL = ("SELECT dataset_id, measure, cap, committed, reserved FROM budgets "
                "WHERE dataset_id = ANY(%s) ORDER BY dataset_id, measure")
WINDOW_SQL = ("SELECT id, kind, release_id, actor, at, units, detail FROM events "
              "WHERE dataset_id = %s ORDER BY id DESC LIMIT %s")
CAPS_BEFORE_SQL = ("SELECT DISTINCT ON (m.key) m.key, m.value FROM events e "
                   "CROSS JOIN LATERAL jsonb_each_text(e.units) m "
                   "WHERE e.dataset_id = %s AND e.kind = 'cap' AND e.id <= %s "
                   "ORDER BY m.key, e.id DESC")
#: an event id as ``audit_range`` takes it from a cursor: what ``events.id`` holds
_EVENT_ID = re.compile(r"[0-9]{1,19}")
#: the server-side steps' calls (migration 0004), each argument cast to its parameter's
#: type (the statement is prepared once per connection, whatever the Python values)
RESERVE_SQL = (
    "ledger_reserve(p_release => %(release)s::text, p_dataset => %(dataset)s::text, "
    "p_actor => %(actor)s::text, p_mode => %(mode)s::text, p_request => %(request)s::text, "
    "p_fingerprint => %(fingerprint)s::text, p_replay_key => %(replay_key)s::text, "
    "p_replay => %(replay)s::boolean, p_idempotency_key => %(idem)s::text, "
    "p_idempotency_ttl => %(ttl)s::integer, p_notion => %(notion)s::text, "
    "p_measures => %(measures)s::text[], p_units => %(units)s::bigint[], "
    "p_version => %(version)s::bigint, p_at => %(at)s::timestamptz)")
#: what a registry read for pricing depends on, as one digest (of ``datasets d``'s row):
#: the document and the measures its caps name. A reservation priced on a read checks it
#: in its own statement, so it holds nothing on a read the dataset has moved past.
STAMP = ("md5(d.document || ARRAY(SELECT b.measure FROM budgets b "
         "WHERE b.dataset_id = d.id ORDER BY b.measure)::text)")
#: what ``mark_running`` reads in ``ledger_start``'s statement: the release's request and
#: its dataset's document
START_READS = (
    "(SELECT request FROM releases WHERE id = %(release)s::text), "
    "(SELECT d.document FROM releases r JOIN datasets d ON d.id = r.dataset_id "
    "WHERE r.id = %(release)s::text)")
SETTLE_SQL = (
    "ledger_settle(%(dataset)s::text, %(release)s::text, %(action)s::text, "
    "%(payload)s::text, %(actor)s::text, %(holder)s::text, %(table_version)s::bigint, "
    "%(result_attempt)s::integer, %(settle_call)s::text)")

# the sweeper's marks (migration 0008_sweep; ``service.releases.sweeper`` has the
# argument): every mark a number of the sequence ``release_sends``

#: releases marked per pass at most, by each of the marking statements
MARK_BATCH = 1000
#: seconds after which a send of the sweeper (a claim, a pricing job's re-send) whose
#: release was not marked after its publish returned is marked anyway: a publish has
#: given up long before (Celery's 3 retries of a 5 s socket timeout)
SEND_BOUND = 60.0
#: ``Store.passed``'s bound for a kind whose queue is empty: every mark is below it
NO_BOUND = 2**63 - 1
#: the sweeper's statements are index ranges by design (a pass must not read the
#: backlog): a planner misled by statistics older than the backlog (all of it unmarked,
#: say) must not pick a scan of the table instead, so its transactions forbid that
SWEEP_PLANNING = "SET LOCAL enable_seqscan = off"
#: a pending release's row of ``release_pending`` (its primary key: created_at, id), as
#: a row value, from the release's id (a parameter): the primary keys of both tables
PENDING_KEY = ("(release_pending.created_at, release_pending.release_id) IN "
               "(SELECT created_at, id FROM releases WHERE id {ids})")
#: pricing and queued releases never marked, stale, out of the outbox (so published):
#: the two ranges of ``release_pending_sweep`` (pricing or not; migration
#: 0010_hot_settle: the marks are columns of ``release_pending``), the running ones in
#: them (as many as runs under way: ``release_runs``) skipped
MARK_NEW_SQL = (
    "UPDATE release_pending SET sweep_seq = nextval('release_sends'), sweep_phase = 1, "
    "sweep_at = now() WHERE (created_at, release_id) IN (SELECT created_at, release_id "
    "FROM release_pending p WHERE pricing IN (true, false) AND sweep_seq IS NULL "
    "AND created_at <= now() - make_interval(secs => %(older)s) "
    "AND NOT EXISTS (SELECT 1 FROM outbox WHERE outbox.release_id = p.release_id) "
    "AND NOT EXISTS (SELECT 1 FROM release_runs u WHERE u.release_id = p.release_id) "
    "LIMIT %(batch)s FOR UPDATE SKIP LOCKED)")
#: running releases whose lease lapsed ``lapsed`` s ago, not marked since it lapsed: the
#: releases of ``release_runs`` (the running ones, migration 0009_hot_start), each found
#: by its primary key (LATERAL: the few runs drive, never a scan of ``releases``)
MARK_LAPSED_SQL = (
    "UPDATE release_pending SET sweep_seq = nextval('release_sends'), sweep_phase = 1, "
    "sweep_at = now() WHERE (created_at, release_id) IN (SELECT m.created_at, m.release_id "
    "FROM release_runs u CROSS JOIN LATERAL (SELECT p.created_at, p.release_id "
    "FROM releases r JOIN release_pending p "
    "ON p.created_at = r.created_at AND p.release_id = r.id "
    "WHERE r.id = u.release_id AND r.status = 'running' "
    "AND COALESCE(r.lease_until, '-infinity') <= now() - make_interval(secs => %(lapsed)s) "
    "AND (p.sweep_at IS NULL OR p.sweep_at <= COALESCE(r.lease_until, '-infinity')) "
    "FOR UPDATE OF p SKIP LOCKED) m LIMIT %(batch)s)")
#: a send of the sweeper begun ``SEND_BOUND`` s ago and never marked after (phase 0)
MARK_SENDING_SQL = (
    "UPDATE release_pending SET sweep_seq = nextval('release_sends'), sweep_phase = 1, "
    "sweep_at = now() WHERE (created_at, release_id) IN (SELECT created_at, release_id "
    "FROM release_pending WHERE pricing IN (true, false) AND sweep_seq = 0 "
    "AND sweep_at <= now() - make_interval(secs => %(bound)s) "
    "LIMIT %(batch)s FOR UPDATE SKIP LOCKED)")
#: the witness bounds: the newest release started (its run's message taken) and priced
#: (its pricing job's) ``age`` s ago or more, by the mark taken at its insert; the
#: started ones: those that ended (``release_ran``, migration 0010_hot_settle) and those
#: running (``release_runs``, migration 0009_hot_start)
WITNESS_SQL = (
    "SELECT GREATEST((SELECT created_seq FROM release_ran "
    "WHERE ran_at <= now() - make_interval(secs => %(age)s) "
    "ORDER BY created_seq DESC LIMIT 1), (SELECT max(r.created_seq) FROM release_runs u "
    "CROSS JOIN LATERAL (SELECT created_seq FROM releases WHERE id = u.release_id "
    "AND started_at <= now() - make_interval(secs => %(age)s) OFFSET 0) r)), "
    "(SELECT created_seq FROM releases WHERE priced_at IS NOT NULL "
    "AND created_seq IS NOT NULL AND priced_at <= now() - make_interval(secs => %(age)s) "
    "ORDER BY created_seq DESC LIMIT 1)")
#: one kind's marked releases below a bound (``{pricing}``: the range of
#: ``release_pending_sweep``, named literally so that a generic plan uses it too; a
#: running one's mark counts only if taken after its lease lapsed); parameters: bound,
#: limit
PASSED_SQL = (
    "SELECT p.release_id, r.status, p.created_at, p.sweep_seq, p.sweep_phase, false "
    "FROM release_pending p JOIN releases r ON r.id = p.release_id "
    "WHERE p.pricing = {pricing} AND p.sweep_seq > 0 AND p.sweep_seq < %s "
    "AND (r.status <> 'running' OR p.sweep_at > COALESCE(r.lease_until, '-infinity')) "
    "ORDER BY p.sweep_seq LIMIT %s")
#: pending releases by id (their message held by a worker for too long)
STRANDED_SQL = (
    "SELECT p.release_id, r.status, p.created_at, p.sweep_seq, p.sweep_phase, true "
    "FROM releases r JOIN release_pending p "
    "ON p.created_at = r.created_at AND p.release_id = r.id WHERE r.id = ANY(%s)")
#: marked again, phase 2, if the mark read is still the release's
CONFIRM_SQL = (
    "UPDATE release_pending SET sweep_seq = nextval('release_sends'), sweep_phase = 2, "
    "sweep_at = now() FROM unnest(%s::text[], %s::bigint[]) AS p(id, seq) "
    "JOIN releases r ON r.id = p.id "
    "WHERE release_pending.created_at = r.created_at AND release_pending.release_id = p.id "
    "AND release_pending.sweep_seq = p.seq AND release_pending.sweep_phase = 1")
#: a worker holds the message: a second mark no longer counts (pricing or queued ones)
HELD_SQL = ("UPDATE release_pending SET sweep_phase = 1 WHERE "
            + PENDING_KEY.format(ids="= ANY(%s)") + " AND sweep_phase = 2 "
            "AND NOT EXISTS (SELECT 1 FROM release_runs u "
            "WHERE u.release_id = release_pending.release_id)")
SENDING_SQL = ("UPDATE release_pending SET sweep_seq = 0, sweep_phase = 0, sweep_at = now() "
               "WHERE " + PENDING_KEY.format(ids="= %s"))
SENT_SQL = ("UPDATE release_pending SET sweep_seq = nextval('release_sends'), "
            "sweep_phase = 1, sweep_at = now() WHERE " + PENDING_KEY.format(ids="= %s"))


def passed_query(marks: SendMarks, empty: Collection[str], limit: int,
                 stranded: Collection[str] = ()) -> tuple[str, list[Any]] | None:
    """``PgLedger.passed``'s statement and its parameters (None: nothing to read): per
    kind with a bound (a pricing job's message: pricing releases; a run's: queued and
    running ones), ``PASSED_SQL``; the ``stranded`` ones, ``STRANDED_SQL``; one UNION
    ALL."""
    parts: list[str] = []
    params: list[Any] = []
    for kind, pricing in ((PRICING, "true"), (RUN, "false")):
        bound = NO_BOUND if kind in empty else marks.bounds.get(kind)
        if bound is None:
            continue
        parts.append(PASSED_SQL.format(pricing=pricing))
        params += [bound, limit]
    if stranded:
        parts.append(STRANDED_SQL)
        params.append(sorted(stranded))
    if not parts:
        return None
    return " UNION ALL ".join(f"({part})" for part in parts), params


def _call_id() -> str:
    """A new write call's id: its time (milliseconds since the epoch, 12 hex digits: ids
    sort by time, so ``step_calls``' expired rows are one key range), then 64 random
    bits."""
    return f"{time.time_ns() // 1_000_000:012x}-{secrets.token_hex(8)}"


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _version_of(request_json: str) -> int | None:
    """The request's ``dataset_version`` if a number (reserve.lua: ``%d`` of it)."""
    request = json.loads(request_json)
    version = request.get("dataset_version") if isinstance(request, dict) else None
    if isinstance(version, bool) or not isinstance(version, int | float):
        return None
    return int(version)


class PgLedger:
    """Budget accounting for every dataset, backed by PostgreSQL (``database.connect``)."""

    #: a run's output is written by its commit's transaction (the row's ``output``)
    results_inline = True

    def __init__(self, pool: ConnectionPool[Any], lease_seconds: int = 30,
                 documents: DocumentStore | None = None) -> None:
        """With ``documents``, a release whose run stored its result as a file
        (``commit(..., result_stored=True)``: the row records the run's attempt) has its
        output read from there; without, such an output reads as missing
        (``DocumentMissing``). Requests always stay in the ``releases`` row."""
        self.pool = pool
        self.lease_seconds = lease_seconds
        self.documents = documents
        self._writes = itertools.count(1)  # write calls made: when to prune step_calls

    # -- transactions -------------------------------------------------------------------

    def _tx(self, step: Callable[[Cursor], T], *, one_statement: bool = False) -> T:
        """Run ``step`` in one transaction, committed if it returns; run again (bounded:
        ``RETRIES`` attempts within ``RERUN_SECONDS`` of the first) if PostgreSQL rolled it
        back (deadlock, serialization), another attempt of the same write call committed
        meanwhile (``step_calls_pkey``), or the connection broke. At the first broken
        connection the pool checks its idle ones (``pool.check``: one empty query each,
        the dead replaced), so after a failover the next attempt does not draw another
        connection to the old server.

        ``one_statement``: ``step`` sends one statement, which is its transaction (the
        connection in autocommit for it): one round trip where BEGIN, the statement and
        COMMIT take three. The statement commits when it ends, all or nothing, as the
        transaction around it would."""
        began = time.monotonic()
        checked = False
        for attempt in range(RETRIES):
            try:
                # the pool's connection context commits on success, rolls back on error
                with self.pool.connection() as conn:
                    if not one_statement:
                        with conn.cursor() as cur:
                            return step(cur)
                    conn.autocommit = True
                    try:
                        with conn.cursor() as cur:
                            return step(cur)
                    finally:
                        if not conn.closed:
                            conn.autocommit = False
            except (psycopg.OperationalError, errors.UniqueViolation) as err:
                if (attempt == RETRIES - 1 or not _retryable(err)
                        or time.monotonic() - began > RERUN_SECONDS):
                    raise
                if pg_steps.broken(err) and not checked:
                    checked = True
                    self.pool.check()
                time.sleep(0.005 * 2 ** attempt + secrets.randbelow(5) / 1000)
        raise AssertionError("unreachable")

    def _write(self, step: Callable[[Cursor], Any]) -> Any:
        """Run the write step ``step`` (its answer JSON: None, bool, int, str, lists) in
        one transaction, once per call: under a call id made here, once, its answer is
        looked up first (an attempt whose COMMIT's reply was lost committed it: that
        answer is returned, nothing else runs) and otherwise recorded with its changes
        (``step_calls``, migration 0004). The answer comes back as JSON reads it (a list
        for a tuple)."""
        call_id = _call_id()
        attempts = itertools.count()

        def once(cur: Cursor) -> Any:
            if next(attempts):  # a first attempt has nothing to find
                cur.execute("SELECT answer FROM step_calls WHERE id = %s", (call_id,))
                known = cur.fetchone()
                if known is not None:
                    return known[0]
            answer = step(cur)
            cur.execute("INSERT INTO step_calls (id, answer) VALUES (%s, %s)",
                        (call_id, Jsonb(answer)))
            return answer

        answer = self._tx(once)
        self._prune_now_and_then()
        return json.loads(json.dumps(answer))

    def _call(self, function: str, params: dict[str, Any], *, remembered: bool = True) -> Any:
        """The answer of the server-side step ``function`` (SQL naming its arguments as
        ``%(name)s``: ``ledger_reserve(...)``, migration 0004), once per call: one
        statement, its own transaction, that runs the function and records its answer
        under the call's id (``step_remember``) or, on a re-run, first returns the answer
        an earlier attempt recorded if it committed (``step_recall``): ``_write``'s rule,
        server-side.

        ``remembered=False``: a step whose own rows tell a re-run what an earlier attempt
        did (``ledger_start``: the lease its token holds; ``ledger_touch``: the same
        lease extended again; migration 0007): just the function, on every attempt, and
        no ``step_calls`` row to write."""
        return self._call_reading(function, params, remembered=remembered)[0]

    def _call_reading(self, function: str, params: dict[str, Any], reads: str = "", *,
                      remembered: bool = True) -> tuple[Any, ...]:
        """``_call``, with more columns in the same statement: ``reads``, a select list
        (of ``params``) after the answer. They read the statement's snapshot, taken as
        it began: what was committed before the step ran, not what it changes."""
        if not remembered:
            statement = f"SELECT {function}{', ' + reads if reads else ''}"
            return self._tx(lambda cur: _fetch_row(cur, statement, params),
                            one_statement=True)
        call_id = _call_id()
        attempts = itertools.count()
        row = self._tx(lambda cur: self._run_call_row(cur, function, params, call_id,
                                                      next(attempts) > 0, reads),
                       one_statement=True)
        self._prune_now_and_then()
        return row

    @staticmethod
    def _run_call(cur: Cursor, function: str, params: dict[str, Any], call_id: str,
                  rerun: bool = True) -> Any:
        """``function``'s answer as the call ``call_id``: run and recorded, or, on a
        ``rerun``, the answer an earlier attempt recorded if there is one."""
        return PgLedger._run_call_row(cur, function, params, call_id, rerun)[0]

    @staticmethod
    def _run_call_row(cur: Cursor, function: str, params: dict[str, Any], call_id: str,
                      rerun: bool, reads: str = "") -> tuple[Any, ...]:
        """``_run_call``'s answer, then the columns ``reads`` selects."""
        run = f"step_remember(%(call_id)s::text, {function})"
        if rerun:
            run = f"COALESCE(step_recall(%(call_id)s::text), {run})"
        cur.execute(f"SELECT {run}{', ' + reads if reads else ''}",
                    {**params, "call_id": call_id})
        row = cur.fetchone()
        assert row is not None  # a SELECT without FROM: one row
        return tuple(row)

    def _prune_now_and_then(self) -> None:
        """Every ``PRUNE_EVERY``-th write call of this ledger deletes up to ``PRUNE_BATCH``
        of the ``step_calls`` rows older than ``CALL_MEMORY`` seconds (a range of the
        primary key: the ids start with their time), skipping rows another pruner has
        locked, in a transaction of its own; a server away is left for the next time."""
        if next(self._writes) % PRUNE_EVERY:
            return
        bound = f"{time.time_ns() // 1_000_000 - CALL_MEMORY * 1000:012x}"
        with contextlib.suppress(psycopg.OperationalError):
            self._tx(lambda cur: cur.execute(
                "DELETE FROM step_calls WHERE id IN (SELECT id FROM step_calls WHERE id < %s "
                "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)", (bound, PRUNE_BATCH)))

    @staticmethod
    def _event(cur: Cursor, dataset_id: str, kind: str, release_id: str, actor: str,
               at: datetime | str | None, units: dict[str, int] | None = None,
               **detail: Any) -> None:
        cur.execute(
            "INSERT INTO events (dataset_id, kind, release_id, actor, at, units, detail) "
            "VALUES (%s, %s, %s, %s, COALESCE(%s::timestamptz, now()), %s, %s)",
            (dataset_id, kind, release_id, actor, at, Jsonb(units or {}), Jsonb(detail)))

    @staticmethod
    def _lock_ledger(cur: Cursor, dataset_id: str) -> tuple[Any, ...] | None:
        """The dataset's lock alone (``DATASET_LOCK``), then its ledgers row FOR UPDATE:
        every step that changes what ``reserve`` decides on (the retired flags, the caps'
        rules) takes them first. It waits for the reserves under way (they share the
        dataset's lock) and every later reserve waits for its COMMIT (PostgreSQL queues
        a shared request behind a waiting exclusive one: a stream of reserves never
        starves it), then reads what it wrote (migration 0007)."""
        cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (DATASET_LOCK, dataset_id))
        cur.execute("SELECT retired, retired_versions, notion_lock FROM ledgers "
                    "WHERE dataset_id = %s FOR UPDATE", (dataset_id,))
        return cur.fetchone()

    @classmethod
    def _ensure_ledger(cls, cur: Cursor, dataset_id: str) -> None:
        """The dataset's ledgers row, created if missing (a Valkey hash springs into being
        on its first write), locked as ``_lock_ledger`` locks it."""
        cur.execute("INSERT INTO ledgers (dataset_id) VALUES (%s) ON CONFLICT DO NOTHING",
                    (dataset_id,))
        cls._lock_ledger(cur, dataset_id)

    @staticmethod
    def _idempotent(cur: Cursor, key: str, fingerprint: str,
                    column: str) -> tuple[Literal["idempotent", "idem_mismatch"], str] | None:
        """('idempotent' | 'idem_mismatch', what the key made) if the live key exists."""
        cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (IDEMPOTENCY_LOCK, key))
        cur.execute(f"SELECT fingerprint, {column} FROM idempotency "
                    "WHERE key = %s AND expires_at > now()", (key,))
        prev = cur.fetchone()
        if prev is None:
            return None
        return ("idempotent" if prev[0] == fingerprint else "idem_mismatch", prev[1] or "")

    @staticmethod
    def _remember_key(cur: Cursor, key: str, fingerprint: str, ttl: int,
                      release_id: str | None, dataset_id: str | None,
                      version: int | None = None) -> None:
        cur.execute(
            "INSERT INTO idempotency (key, fingerprint, release_id, dataset_id, version, "
            "expires_at) VALUES (%s, %s, %s, %s, %s, now() + make_interval(secs => %s)) "
            "ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, "
            "release_id = EXCLUDED.release_id, dataset_id = EXCLUDED.dataset_id, "
            "version = EXCLUDED.version, expires_at = EXCLUDED.expires_at",
            (key, fingerprint, release_id, dataset_id, version, ttl))

    # -- datasets and caps --------------------------------------------------------------

    def open(self, dataset_id: str, caps: dict[str, int], actor: str,
             document: str | None = None, *, idempotency_key: str | None = None,
             fingerprint: str = "", idempotency_ttl: int = 86400) -> tuple[str, str]:
        """Register the dataset (its ``document``, stored exactly as given) and open its
        ledger with its caps, recorded as a ``cap`` event, all in one step (open.lua).

        Returns (outcome, dataset id): ``opened``; ``exists`` if the dataset (without a
        document: its ledger) was there before, nothing changed; with an
        ``idempotency_key``, ``idempotent`` and the dataset the key registered
        (``idem_mismatch`` if for another ``fingerprint``). A dataset opened here is
        marked ``recharged_interval`` (it never held an exact-increment interval charge:
        ``recharge_interval`` has nothing to do for it)."""
        fp = fingerprint if idempotency_key else ""
        units = {m: int(u) for m, u in sorted(caps.items())}

        def step(cur: Cursor) -> tuple[str, str]:
            if idempotency_key and fp:
                known = self._idempotent(cur, idempotency_key, fp, "dataset_id")
                if known:
                    return known
            if document:
                # the document is the guard (open.lua's KEYS[3]); the ledger may exist
                cur.execute("INSERT INTO datasets (id, document, created_by) "
                            "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                            (dataset_id, document, actor))
                if cur.rowcount == 0:
                    return "exists", dataset_id
                cur.execute("INSERT INTO ledgers (dataset_id, opened_by, recharged_interval) "
                            "VALUES (%s, %s, true) ON CONFLICT (dataset_id) DO UPDATE SET "
                            "recharged_interval = true, "
                            "opened_by = COALESCE(ledgers.opened_by, EXCLUDED.opened_by)",
                            (dataset_id, actor))
            else:
                cur.execute("INSERT INTO ledgers (dataset_id, opened_by, recharged_interval) "
                            "VALUES (%s, %s, true) ON CONFLICT DO NOTHING", (dataset_id, actor))
                if cur.rowcount == 0:
                    return "exists", dataset_id
            cur.execute("SELECT measure FROM budgets WHERE dataset_id = %s AND measure = ANY(%s) "
                        "ORDER BY measure FOR UPDATE", (dataset_id, list(units)))
            for measure, cap in units.items():
                cur.execute("INSERT INTO budgets (dataset_id, measure, cap) VALUES (%s, %s, %s) "
                            "ON CONFLICT (dataset_id, measure) DO UPDATE SET cap = EXCLUDED.cap",
                            (dataset_id, measure, cap))
            self._event(cur, dataset_id, "cap", "", actor, None, units)
            if idempotency_key and fp:
                self._remember_key(cur, idempotency_key, fp, idempotency_ttl, None, dataset_id)
            return "opened", dataset_id

        outcome, opened = self._write(step)
        return outcome, opened

    def version_change(self, dataset_id: str, read: str, document: str, action: str,
                       version: int, actor: str, *, idempotency_key: str | None = None,
                       fingerprint: str = "", idempotency_ttl: int = 86400) -> tuple[str, int]:
        """Replace the dataset's document ``read`` by ``document`` for the version
        ``action`` (comma-separated: uploaded, current, retired), one ``version`` event
        each, in one step (version.lua): a compare-and-set on the document's exact text.

        Returns (outcome, version): ``ok`` (also for this very call re-sent: its document
        is stored); ``conflict`` (0) when the document is no longer ``read``; with an
        ``idempotency_key``, ``idempotent`` and the version the key stored first
        (``idem_mismatch`` if for another ``fingerprint``). ``retired`` marks the version
        retired in the ledger (``reserve`` refuses it: ``version_retired``), ``current``
        clears that mark, both in the same transaction as the document."""
        fp = fingerprint if idempotency_key else ""
        actions = [a for a in action.split(",") if a]

        def step(cur: Cursor) -> tuple[str, int]:
            if idempotency_key and fp:
                cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                            (IDEMPOTENCY_LOCK, idempotency_key))
            cur.execute("SELECT document FROM datasets WHERE id = %s FOR UPDATE", (dataset_id,))
            row = cur.fetchone()
            current = row[0] if row else None
            if current == document:  # a re-send of this call: it happened
                return "ok", version
            if idempotency_key and fp:
                cur.execute("SELECT fingerprint, version FROM idempotency WHERE key = %s "
                            "AND expires_at > now() AND version IS NOT NULL",
                            (idempotency_key,))
                prev = cur.fetchone()
                if prev is not None:
                    return ("idempotent" if prev[0] == fp else "idem_mismatch", int(prev[1]))
            if current is None or current != read:
                return "conflict", 0
            cur.execute("UPDATE datasets SET document = %s WHERE id = %s", (document, dataset_id))
            for one in actions:
                if one == "retired":
                    self._ensure_ledger(cur, dataset_id)
                    cur.execute("UPDATE ledgers SET retired_versions = array_append("
                                "array_remove(retired_versions, %s::bigint), %s::bigint) "
                                "WHERE dataset_id = %s", (version, version, dataset_id))
                elif one == "current":
                    cur.execute("UPDATE ledgers SET retired_versions = array_remove("
                                "retired_versions, %s::bigint) WHERE dataset_id = %s",
                                (version, dataset_id))
                self._event(cur, dataset_id, "version", "", actor, None,
                            action=one, version=version)
            if idempotency_key and fp:
                self._remember_key(cur, idempotency_key, fp, idempotency_ttl, None, dataset_id,
                                   version)
            return "ok", version

        outcome, stored = self._write(step)
        return outcome, stored

    def migrate_policy(self, dataset_id: str, read: str, document: str, actor: str,
                       notions: list[str], record_level: bool) -> tuple[str, list[str]]:
        """Replace the dataset's document ``read`` by ``document`` (its policy made
        explicit), mark every allocation without a rule ``legacy`` and record a ``policy``
        event, in one step (policy.lua). Returns the outcome (``migrated``; ``conflict``:
        the document changed since it was read; ``missing``) and the keys marked.

        The event's fields are policy.lua's strings: ``notions`` and
        ``legacy_allocations`` comma-separated, ``record_level`` '1' or '0'."""
        def step(cur: Cursor) -> tuple[str, list[str]]:
            cur.execute("SELECT document FROM datasets WHERE id = %s FOR UPDATE", (dataset_id,))
            row = cur.fetchone()
            if row is None:
                return "missing", []
            if row[0] != read:
                return "conflict", []
            self._lock_ledger(cur, dataset_id)  # change_caps writes allocations under it
            cur.execute("SELECT DISTINCT a.key_id FROM allocations a WHERE a.dataset_id = %s "
                        "AND NOT EXISTS (SELECT 1 FROM allocation_scopes s WHERE "
                        "s.dataset_id = a.dataset_id AND s.key_id = a.key_id)", (dataset_id,))
            keys = sorted(key for (key,) in cur.fetchall())
            for key in keys:
                cur.execute("INSERT INTO allocation_scopes (dataset_id, key_id, scope) "
                            "VALUES (%s, %s, 'legacy')", (dataset_id, key))
            cur.execute("UPDATE datasets SET document = %s WHERE id = %s", (document, dataset_id))
            self._event(cur, dataset_id, "policy", "", actor, None, action="migrated",
                        notions=",".join(notions), record_level=str(int(record_level)),
                        legacy_allocations=",".join(keys))
            return "migrated", keys

        outcome, marked = self._write(step)
        return outcome, marked

    def recharge_interval(self, dataset_id: str, units: dict[str, int], actor: str) -> str:
        """Add ``units`` (per interval measure) to the dataset's committed totals and record
        one ``policy`` event (action ``recharged``), once per dataset (recharge.lua):
        ``recharged``; ``nothing`` (no measure given: marked done all the same); ``done``
        (it ran before, or the dataset was opened after issue #27: ``open`` marks it)."""
        amounts = {m: int(u) for m, u in sorted(units.items())}

        def step(cur: Cursor) -> str:
            self._ensure_ledger(cur, dataset_id)
            cur.execute("UPDATE ledgers SET recharged_interval = true "
                        "WHERE dataset_id = %s AND NOT recharged_interval", (dataset_id,))
            if cur.rowcount == 0:
                return "done"
            if not amounts:
                return "nothing"
            cur.execute("SELECT measure FROM budgets WHERE dataset_id = %s AND measure = ANY(%s) "
                        "ORDER BY measure FOR UPDATE", (dataset_id, list(amounts)))
            for measure, amount in amounts.items():
                # a measure the caps do not name gets a cap-0 row (Valkey: a lone
                # committed:<m> field); the releases recharged held only named ones
                cur.execute("INSERT INTO budgets (dataset_id, measure, cap, committed) "
                            "VALUES (%s, %s, 0, %s) ON CONFLICT (dataset_id, measure) DO "
                            "UPDATE SET committed = budgets.committed + EXCLUDED.committed",
                            (dataset_id, measure, amount))
            self._event(cur, dataset_id, "policy", "", actor, None, amounts, action="recharged")
            return "recharged"

        return str(self._write(step))

    def set_caps(self, dataset_id: str, caps: dict[str, int], actor: str,
                 key_id: str | None = None) -> None:
        """Change the dataset's caps, or ``key_id``'s allocation; CapError if refused."""
        self.change_caps(dataset_id, [(key_id, caps)], actor)

    def change_caps(self, dataset_id: str, changes: list[tuple[str | None, dict[str, int]]],
                    actor: str) -> None:
        """Apply every (key id or None for the dataset, caps) change, or none (admin.lua).

        Each is checked first: never below what is committed + reserved at its level, an
        allocation never above the dataset's cap as this same call leaves it; a refused
        change raises CapError and nothing is written or recorded. An allocation written
        here is ``listed``. One ``cap`` / ``allocation`` event per change."""
        plan = [(key or "", {m: int(u) for m, u in sorted(caps.items())})
                for key, caps in changes]

        def step(cur: Cursor) -> None:
            self._ensure_ledger(cur, dataset_id)
            measures = sorted({m for _, caps in plan for m in caps})
            cur.execute("SELECT measure, cap, committed, reserved FROM budgets "
                        "WHERE dataset_id = %s AND measure = ANY(%s) "
                        "ORDER BY measure FOR UPDATE", (dataset_id, measures))
            dataset = {row[0]: row[1:] for row in cur.fetchall()}
            keys = sorted({key for key, _ in plan if key})
            cur.execute("SELECT key_id, measure, cap, committed, reserved FROM allocations "
                        "WHERE dataset_id = %s AND key_id = ANY(%s) AND measure = ANY(%s) "
                        "ORDER BY key_id, measure FOR UPDATE", (dataset_id, keys, measures))
            allocated = {(row[0], row[1]): row[2:] for row in cur.fetchall()}
            new_caps: dict[str, int] = {}
            for key, caps in plan:
                if not key:
                    new_caps.update(caps)

            def cap_of(measure: str) -> int:
                if measure in new_caps:
                    return new_caps[measure]
                return int(dataset[measure][0]) if measure in dataset else 0

            for key, caps in plan:
                for measure, units in caps.items():
                    row = allocated.get((key, measure)) if key else dataset.get(measure)
                    held = int(row[1]) + int(row[2]) if row else 0
                    if units < held:
                        raise CapError("below_spent", measure, held, key or None)
                    if key and units > cap_of(measure):
                        raise CapError("above_dataset", measure, cap_of(measure), key)
            for key, caps in plan:
                for measure, units in caps.items():
                    if key:
                        cur.execute(
                            "INSERT INTO allocations (dataset_id, key_id, measure, cap) "
                            "VALUES (%s, %s, %s, %s) ON CONFLICT (dataset_id, key_id, measure) "
                            "DO UPDATE SET cap = EXCLUDED.cap", (dataset_id, key, measure, units))
                    else:
                        cur.execute(
                            "INSERT INTO budgets (dataset_id, measure, cap) VALUES (%s, %s, %s) "
                            "ON CONFLICT (dataset_id, measure) DO UPDATE SET cap = EXCLUDED.cap",
                            (dataset_id, measure, units))
                if key and caps:
                    cur.execute(
                        "INSERT INTO allocation_scopes (dataset_id, key_id, scope) "
                        "VALUES (%s, %s, 'listed') ON CONFLICT (dataset_id, key_id) "
                        "DO UPDATE SET scope = 'listed'", (dataset_id, key))
                self._event(cur, dataset_id, "allocation" if key else "cap", "", actor, None,
                            caps, key_id=key)

        self._write(step)

    def retire(self, dataset_id: str, actor: str) -> None:
        """Refuse every new reservation on the dataset from now on; record it."""
        def step(cur: Cursor) -> None:
            self._ensure_ledger(cur, dataset_id)
            cur.execute("UPDATE ledgers SET retired = true WHERE dataset_id = %s", (dataset_id,))
            self._event(cur, dataset_id, "retire", "", actor, None)

        self._write(step)

    def set_version_retired(self, dataset_id: str, version: int, retired: bool,
                            actor: str) -> None:
        """The ledger half of version.lua: mark the dataset's ``version`` retired (or
        current again, ``retired=False``) and record a ``version`` event, in one step;
        ``reserve`` refuses a request on a retired version (``version_retired``)."""
        def step(cur: Cursor) -> None:
            self._ensure_ledger(cur, dataset_id)
            if retired:
                cur.execute("UPDATE ledgers SET retired_versions = array_append("
                            "array_remove(retired_versions, %s::bigint), %s::bigint) "
                            "WHERE dataset_id = %s", (version, version, dataset_id))
            else:
                cur.execute("UPDATE ledgers SET retired_versions = array_remove("
                            "retired_versions, %s::bigint) WHERE dataset_id = %s",
                            (version, dataset_id))
            self._event(cur, dataset_id, "version", "", actor, None,
                        action="retired" if retired else "current", version=version)

        self._write(step)

    # -- reserve ------------------------------------------------------------------------

    def reserve(self, r: Reservation) -> ReserveResult:
        """Hold ``r.cost`` for a new release unless it is a retry, a replay, refused or
        over a cap (reserve.lua, ``Ledger.reserve``): same modes, outcomes and fields.

        One call of the server-side step ``ledger_reserve`` (migrations 0004, 0007). It
        locks, in the global order: the Idempotency-Key's advisory lock (two requests with
        one key: one waits for the other's answer), the replay fingerprint's (two
        identical requests: the second finds the first), the release's row (a re-sent
        create finds it), the dataset's lock shared with other reserves (``retire``, the
        versions, the caps take it alone: ``_lock_ledger``) and under it reads its
        ``ledgers`` row (retired, retired versions, the notion lock: a reserve that may
        set it locks the row alone), then the ``budgets`` rows of the measures asked and
        the actor's ``allocations`` rows of them, each set by measure: it reads the caps
        on locked rows, so two reserves never both take the last units.

        A create (``new`` or ``pricing``) without an Idempotency-Key records no answer in
        ``step_calls``: the only change it can commit is its release's row with its units
        (every other outcome changes nothing), and a re-run that finds the row answers
        ``reserved`` (``pricing``), what the committed attempt answered; one that does not
        decides again, as a first attempt. With a key, a replay records the key, and a
        re-run would answer ``idempotent``: those keep their record, as ``priced``.

        A stamped reservation (priced on a registry read, ``dataset_cache``) reserves only
        while the dataset's ``STAMP`` is that read's, else answers ``stale`` holding
        nothing, in the same statement; a re-run whose release's row is there goes to the
        step whatever the stamp is now, so it answers as the committed attempt did."""
        remembered = r.mode not in ("new", "pricing") or r.idempotency_key is not None
        if not r.stamp:
            return ReserveResult(**self._call(RESERVE_SQL, _reserve_params(r),
                                              remembered=remembered))
        checked = (f"CASE WHEN EXISTS (SELECT 1 FROM releases WHERE id = %(release)s) "
                   f"OR (SELECT {STAMP} FROM datasets d WHERE d.id = %(dataset)s) "
                   f"= %(stamp)s THEN {RESERVE_SQL} "
                   "ELSE jsonb_build_object('outcome', 'stale') END")
        return ReserveResult(**self._call(checked, {**_reserve_params(r), "stamp": r.stamp},
                                          remembered=remembered))

    def refuse(self, dataset_id: str, release_id: str, error_json: str, code: str,
               actor: str) -> bool:
        """End a release still ``pricing`` as ``refused`` (nothing was held), recorded;
        False if it was no longer pricing (refuse.lua). One call of ``ledger_refuse``;
        it locks the release's row (its UPDATE) and nothing else: it moves no units."""
        return bool(self._call(
            "ledger_refuse(%(dataset)s, %(release)s, %(error)s, %(code)s, %(actor)s)",
            {"dataset": dataset_id, "release": release_id, "error": error_json,
             "code": code, "actor": actor}))

    # -- the outbox ---------------------------------------------------------------------

    def enqueued(self, release_id: str) -> None:
        """The release's task is published: take it out of the outbox (``ledger_enqueued``;
        it locks the outbox row it deletes)."""
        self._call("ledger_enqueued(%(release)s)", {"release": release_id})

    def enqueued_many(self, release_ids: list[str]) -> None:
        """Their tasks are published: take them out of the outbox, in one statement (its
        own transaction; it locks the outbox rows it deletes). Idempotent, so re-run as
        is after a broken connection: no call record (``_call``'s) is needed."""
        if not release_ids:
            return
        self._tx(lambda cur: cur.execute("DELETE FROM outbox WHERE release_id = ANY(%s)",
                                         (release_ids,)), one_statement=True)

    def unsent(self, release_id: str, older_than: float) -> bool:
        """Whether the release waits in the outbox since more than ``older_than`` s ago."""
        def step(cur: Cursor) -> bool:
            cur.execute("SELECT 1 FROM outbox WHERE release_id = %s AND "
                        "due_at <= now() - make_interval(secs => %s)", (release_id, older_than))
            return cur.fetchone() is not None

        return self._tx(step)

    def outbox(self, older_than: float, limit: int = 1000) -> list[str]:
        """Releases reserved over ``older_than`` s ago whose task may never have been sent."""
        def step(cur: Cursor) -> list[str]:
            cur.execute("SELECT release_id FROM outbox WHERE due_at <= now() - "
                        "make_interval(secs => %s) ORDER BY due_at LIMIT %s", (older_than, limit))
            return [row[0] for row in cur.fetchall()]

        return self._tx(step)

    # -- runs and leases ----------------------------------------------------------------

    def mark_running(self, release_id: str, worker: str) -> Run | None:
        """Start a run of the job and take its lease; None if it ended or a live run has it
        (start.lua). One call of ``ledger_start``: it locks the release's row (the UPDATE
        that takes the lease checks the status and the lease on the newest row version:
        two runs never both take it) and takes the release out of the outbox. The same
        statement reads what the run reads next (``START_READS``): the release's request
        (set when it was queued, before its task was sent: the same in any snapshot a
        start can take it in) and its dataset's document as committed when the statement
        began (read a moment before the start, as a separate read after it would have
        been a moment after: a document changed between the two is a race either way)."""
        token = f"{worker}#{secrets.token_hex(8)}"  # this call's, on every attempt
        answer, request, document = self._call_reading(
            "ledger_start(%(release)s, %(worker)s, %(token)s, %(lease)s)",
            {"release": release_id, "worker": worker, "token": token,
             "lease": self.lease_seconds}, START_READS, remembered=False)
        attempt = int(answer)
        if not attempt:
            return None
        return Run(release_id, token, attempt, str(request),
                   None if document is None else str(document))

    def renew_lease(self, run: Run) -> bool:
        """Keep a long run's lease alive; False if the run lost it (another run took over)."""
        return self._touch(run, read=False)

    def mark_data_read(self, run: Run) -> bool:
        """Record, as the lease holder, that the run is about to read the data (charged
        from then on whatever happens); False if the run lost its lease."""
        return self._touch(run, read=True)

    def _touch(self, run: Run, read: bool) -> bool:
        """One call of ``ledger_touch``: it locks the release's row (its UPDATE, only
        while the run's token holds a live lease). Run again after its reply was lost, it
        extends the same lease again (and marks the data read again): nothing recorded."""
        return bool(self._call(
            "ledger_touch(%(release)s, %(token)s, %(read)s, %(lease)s)",
            {"release": run.release_id, "token": run.token, "read": read,
             "lease": self.lease_seconds}, remembered=False))

    # -- settle -------------------------------------------------------------------------

    def commit(self, dataset_id: str, run: Run, output_json: str,
               table_version: int | None = None, *, result_stored: bool = False) -> Settled:
        """Store the output and charge, once; only while ``run`` holds the lease:
        'settled', else 'ended' (already ended) or 'lost' (nothing changed)."""
        return self._end(dataset_id, run.release_id, "commit",
                         "" if result_stored else output_json, run.token, run.token,
                         table_version, run.attempt if result_stored else None)

    def fail(self, dataset_id: str, run: Run, error_json: str) -> Settled:
        """Charge the reservation and mark the release failed (it failed after reading
        the data); only while ``run`` holds the lease, as ``commit``."""
        return self._end(dataset_id, run.release_id, "fail", error_json, run.token, run.token)

    def abort_run(self, dataset_id: str, run: Run, error_json: str) -> Settled:
        """Refund the reservation of a run that failed before reading the data; only
        while ``run`` holds the lease, as ``commit``."""
        return self._end(dataset_id, run.release_id, "abort", error_json, run.token, run.token)

    def abort(self, dataset_id: str, release_id: str, error_json: str, actor: str,
              holder: str = "") -> bool:
        """Refund the reservation and mark the release failed; False if already ended
        (or if ``holder`` is ``NO_LEASE`` and a run holds the lease)."""
        return self._end(dataset_id, release_id, "abort", error_json, actor,
                         holder) == "settled"

    def charge_gone(self, dataset_id: str, release_id: str, error_json: str,
                    actor: str) -> bool:
        """Charge a job whose run died after reading the data and mark it failed; only if
        no run holds its lease."""
        return self._end(dataset_id, release_id, "fail", error_json, actor,
                         NO_LEASE) == "settled"

    def cancel(self, dataset_id: str, release_id: str, actor: str) -> Settled:
        """Refund a job that has not started; 'running' if it already has."""
        return self._end(dataset_id, release_id, "cancel",
                         '{"message": "cancelled by an operator"}', actor)

    def _end(self, dataset_id: str, release_id: str, action: str, payload: str,
             actor: str, holder: str = "", table_version: int | None = None,
             result_attempt: int | None = None) -> Settled:
        call_id = _call_id()  # the same on every attempt of this call
        return self._tx(lambda cur: self._settle(cur, dataset_id, release_id, action,
                                                 payload, actor, holder, table_version,
                                                 result_attempt, call_id),
                        one_statement=True)

    @staticmethod
    def _settle(cur: Cursor, dataset_id: str, release_id: str, action: str,
                payload: str, actor: str, holder: str, table_version: int | None,
                result_attempt: int | None, call_id: str) -> Settled:
        """One settle (settle.lua) as the call ``call_id``, in ``cur``'s transaction: one
        call of ``ledger_settle``, its own statement. The release that a call settles
        records its id (``settled_by``): an attempt run again after its reply was lost
        (or waiting on the row while the first attempt commits) reads ``settled`` there,
        and an attempt that settled nothing changed nothing (no ``step_calls`` row: the
        row says it all; migration 0007). The failure rule: commit and
        fail charge what the release holds, abort and cancel refund it, once (a release
        that ended answers ``ended``); the lease fencing: with a ``holder`` token only
        while that token holds a live lease (``lost`` otherwise), with ``NO_LEASE`` only
        while none does. It locks the release's row (and deletes its outbox entry), then
        the dataset's ``budgets`` rows of the measures held and the owner's
        ``allocations`` rows of them, each set by measure (one measure: its row, by key),
        and records its event (kind ``commit`` for commit and fail)."""
        settled: Settled = _fetch_one(cur, f"SELECT {SETTLE_SQL}", {
            "dataset": dataset_id, "release": release_id, "action": action,
            "payload": payload, "actor": actor, "holder": holder,
            "table_version": table_version, "result_attempt": result_attempt,
            "settle_call": call_id})
        return settled

    # -- reading ------------------------------------------------------------------------

    def balance(self, dataset_id: str) -> dict[str, dict[str, int]]:
        """Per measure: cap, committed, reserved and remaining, in units."""
        return self.budget(dataset_id)[0]

    def balances(self, ids: list[str]) -> list[dict[str, dict[str, int]]]:
        """Each dataset's ``balance``, in the order of ``ids``: one query (the primary
        key's range of each dataset), however many ids."""
        if not ids:
            return []

        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(BALANCES_SQL, (sorted(set(ids)),))
            return cur.fetchall()

        found: dict[str, dict[str, dict[str, int]]] = {}
        for dataset_id, measure, cap, committed, reserved in self._tx(step):
            found.setdefault(dataset_id, {})[measure] = _balance_row(cap, committed, reserved)
        return [dict(found.get(dataset_id, {})) for dataset_id in ids]

    def budget(self, dataset_id: str) -> tuple[dict[str, dict[str, int]],
                                               dict[str, dict[str, dict[str, int]]]]:
        """The balance, and the same rows for each key's allocation."""
        def step(cur: Cursor) -> tuple[dict[str, dict[str, int]],
                                       dict[str, dict[str, dict[str, int]]]]:
            cur.execute("SELECT measure, cap, committed, reserved FROM budgets "
                        "WHERE dataset_id = %s ORDER BY measure", (dataset_id,))
            dataset = {m: _balance_row(c, k, r) for m, c, k, r in cur.fetchall()}
            cur.execute("SELECT key_id, measure, cap, committed, reserved FROM allocations "
                        "WHERE dataset_id = %s ORDER BY key_id, measure", (dataset_id,))
            allocations: dict[str, dict[str, dict[str, int]]] = {}
            for key, m, c, k, r in cur.fetchall():
                allocations.setdefault(key, {})[m] = _balance_row(c, k, r)
            return dataset, allocations

        return self._tx(step)

    def named_measures(self, dataset_id: str) -> set[str]:
        """The measures the dataset's caps name (0 included): the only ones it admits."""
        def step(cur: Cursor) -> set[str]:
            cur.execute("SELECT measure FROM budgets WHERE dataset_id = %s", (dataset_id,))
            return {row[0] for row in cur.fetchall()}

        return self._tx(step)

    def allocation_scopes(self, dataset_id: str) -> dict[str, str]:
        """Each key's allocation rule (``ALLOCATION_SCOPES``), by key id."""
        def step(cur: Cursor) -> dict[str, str]:
            cur.execute("SELECT key_id, scope FROM allocation_scopes WHERE dataset_id = %s",
                        (dataset_id,))
            return {key: scope for key, scope in cur.fetchall()}

        return self._tx(step)

    def notion_lock(self, dataset_id: str) -> str | None:
        """The notion ('dp' or 'noiseless') the dataset is locked to, or None."""
        def step(cur: Cursor) -> str | None:
            cur.execute("SELECT notion_lock FROM ledgers WHERE dataset_id = %s", (dataset_id,))
            row = cur.fetchone()
            return str(row[0]) if row and row[0] else None

        return self._tx(step)

    def iter_events(self, dataset_id: str, start: str = "-", end: str = "+",
                    kinds: set[str] | None = None) -> Iterator[dict[str, Any]]:
        """The dataset's audit events between event ids (``-`` / ``+``: no bound; a
        leading ``(``: exclusive), oldest first, as ``Ledger.events`` shows them: read
        ``READ_BATCH`` rows at a time, each batch its own short transaction (an export of
        any size in bounded memory, no transaction open while the caller streams)."""
        while True:
            rows = self._event_rows(dataset_id, start, end, kinds, READ_BATCH)
            for row in rows:
                yield _event_doc(row)
            if len(rows) < READ_BATCH:
                return
            start = f"({rows[-1][0]}"

    def events(self, dataset_id: str, start: str = "-", end: str = "+",
               kinds: set[str] | None = None) -> list[dict[str, Any]]:
        """The dataset's audit events between event ids, oldest first."""
        return list(self.iter_events(dataset_id, start, end, kinds))

    def events_page(self, dataset_id: str, start: str, end: str, kinds: set[str] | None,
                    limit: int) -> tuple[list[dict[str, Any]], str | None]:
        """One page (``Ledger.events_page``): of the next ``limit`` events from ``start``,
        those of ``kinds``; and the id of the last event read when more follow (None:
        the range ends here). Bounded by events read, not returned: a filter matching
        nothing still reads at most ``limit + 1`` rows."""
        rows = self._event_rows(dataset_id, start, end, None, limit + 1)
        more = len(rows) > limit
        docs = [_event_doc(row) for row in rows[:limit] if not kinds or row[1] in kinds]
        return docs, str(rows[limit - 1][0]) if more else None

    def budget_window(self, dataset_id: str, limit: int) -> BudgetWindow:
        """``Store.budget_window``: the newest ``limit`` events of the dataset (one
        backward range scan of ``events_dataset``, ``limit + 1`` rows: the one past the
        window gives ``start_at``), its ``budgets`` rows, and the last cap each measure's
        ``cap`` events set up to the window (the partial index ``events_dataset_caps``:
        a dataset's cap changes, not its releases), in one REPEATABLE READ snapshot, so
        the balance is exactly the effect of the events that snapshot sees."""
        wanted = max(limit, 0)

        def step(cur: Cursor) -> BudgetWindow:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur.execute(WINDOW_SQL, (dataset_id, wanted + 1))
            rows = cur.fetchall()
            events = [_event_doc(row) for row in reversed(rows[:wanted])]
            if len(rows) <= wanted:
                return BudgetWindow(events)
            before = rows[wanted]
            cur.execute("SELECT measure, cap, committed, reserved FROM budgets "
                        "WHERE dataset_id = %s", (dataset_id,))
            balance = {m: {"cap": int(c), "committed": int(k), "reserved": int(r)}
                       for m, c, k, r in cur.fetchall()}
            cur.execute(CAPS_BEFORE_SQL, (dataset_id, before[0]))
            caps = {measure: int(value) for measure, value in cur.fetchall()}
            return BudgetWindow(events, complete=False, start_at=_iso(before[4]),
                                balance=balance, caps=caps)

        return self._tx(step)

    def _event_rows(self, dataset_id: str, start: str, end: str, kinds: set[str] | None,
                    limit: int | None) -> list[tuple[Any, ...]]:
        low, low_open = _bound(start, "-")
        high, high_open = _bound(end, "+")

        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(
                "SELECT id, kind, release_id, actor, at, units, detail FROM events "
                "WHERE dataset_id = %s AND (%s::bigint IS NULL OR id > %s OR (id = %s AND NOT %s)) "
                "AND (%s::bigint IS NULL OR id < %s OR (id = %s AND NOT %s)) "
                "AND (%s::text[] IS NULL OR kind = ANY(%s)) ORDER BY id LIMIT %s",
                (dataset_id, low, low, low, low_open, high, high, high, high_open,
                 sorted(kinds) if kinds else None, sorted(kinds) if kinds else None, limit))
            return cur.fetchall()

        return self._tx(step)

    # -- the dataset registry -----------------------------------------------------------

    def dataset_document(self, dataset_id: str) -> str | None:
        """The dataset's document, exactly as stored (the text ``version_change`` and
        ``migrate_policy`` compare); None if no such dataset (``datasets.get``)."""
        def step(cur: Cursor) -> str | None:
            cur.execute("SELECT document FROM datasets WHERE id = %s", (dataset_id,))
            row = cur.fetchone()
            return str(row[0]) if row else None

        return self._tx(step)

    def dataset_for_pricing(self, dataset_id: str) -> tuple[str, set[str], str] | None:
        """The dataset's document, the measures its caps name and their ``STAMP``, in one
        statement (its own transaction, one snapshot: the three agree); None if no such
        dataset."""
        def step(cur: Cursor) -> tuple[str, set[str], str] | None:
            cur.execute(f"SELECT d.document, ARRAY(SELECT b.measure FROM budgets b "
                        f"WHERE b.dataset_id = d.id), {STAMP} FROM datasets d WHERE d.id = %s",
                        (dataset_id,))
            row = cur.fetchone()
            return (str(row[0]), set(row[1]), str(row[2])) if row else None

        return self._tx(step, one_statement=True)

    def datasets_page(self, limit: int, after: index.Cursor | None = None,
                      granted: frozenset[str] | None = None
                      ) -> tuple[list[str], index.Cursor | None]:
        """Up to ``limit`` dataset ids, newest first by (created_at, id), after the cursor
        ``after``, of every dataset (``granted`` None) or of the ``granted`` ones; and the
        next page's cursor, None when this page is the last (``datasets.page``'s
        contract, ``index.page``'s cursors: score = created_at in epoch seconds, member =
        id). One index range scan of ``limit + 1`` rows whatever the number of datasets."""
        if limit < 1:
            return [], None
        since = _cursor_time(after) if after is not None else None

        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(
                "SELECT id, created_at FROM datasets "
                "WHERE (%s::text[] IS NULL OR id = ANY(%s)) "
                "AND (%s::timestamptz IS NULL OR (created_at, id) < (%s, %s)) "
                "ORDER BY created_at DESC, id DESC LIMIT %s",
                (sorted(granted) if granted is not None else None,
                 sorted(granted) if granted is not None else None,
                 since, since, after.member if after else None, limit + 1))
            return cur.fetchall()

        rows = self._tx(step)
        taken = rows[:limit]
        more = len(rows) > limit
        nxt = index.Cursor(taken[-1][1].timestamp(), taken[-1][0]) if more else None
        return [dataset_id for dataset_id, _ in taken], nxt

    def dataset_documents(self, ids: list[str]) -> list[str | None]:
        """Each dataset's document text, in the order of ``ids`` (None where there is
        none): one query, whatever the number."""
        def step(cur: Cursor) -> dict[str, str]:
            cur.execute("SELECT id, document FROM datasets WHERE id = ANY(%s)",
                        (sorted(set(ids)),))
            return {dataset_id: document for dataset_id, document in cur.fetchall()}

        found = self._tx(step) if ids else {}
        return [found.get(dataset_id) for dataset_id in ids]

    def ping(self) -> None:
        """One ``SELECT 1`` (a readiness probe): raises if the server does not answer."""
        self._tx(lambda cur: cur.execute("SELECT 1"))

    def dataset_count(self) -> int:
        """How many datasets are registered (a metric): the counter the triggers on
        ``datasets`` keep in the transaction of each registration (migration
        0006_counts), one primary-key probe whatever their number."""
        def step(cur: Cursor) -> int:
            cur.execute(COUNT_SQL, ("datasets",))
            row = cur.fetchone()
            return int(row[0]) if row else 0

        return self._tx(step)

    def same_shape_documents(self, columns: list[str], n_rows: int, exclude: str
                             ) -> list[str]:
        """``Store.same_shape_documents``: the datasets whose ``shapes`` (the active
        versions' shapes of an active, non-public dataset: a generated column,
        migration 0006_counts) hold this shape, found through the GIN index
        ``datasets_shapes``: the rows read are those of that shape (and of an MD5
        collision), not every dataset. Oldest first, as ``dataset_ids``."""
        def step(cur: Cursor) -> list[str]:
            cur.execute(SHAPES_SQL,
                        (Jsonb(dict.fromkeys(columns)), Jsonb(int(n_rows)), exclude))
            return [document for (document,) in cur.fetchall()]

        return self._tx(step)

    def dataset_ids(self) -> list[str]:
        """Every registered dataset id, oldest first (Valkey: ``pr:datasets`` in order)."""
        def step(cur: Cursor) -> list[str]:
            cur.execute("SELECT id FROM datasets ORDER BY created_at, id")
            return [dataset_id for (dataset_id,) in cur.fetchall()]

        return self._tx(step)

    def set_dataset_status(self, dataset_id: str, status: str) -> str | None:
        """Set ``status`` in the dataset's document and return the new document's text;
        None if there is no such dataset. The read and the write are one transaction
        under the row's lock (Valkey: WATCH/MULTI, retried), so a concurrent
        ``version_change`` or ``migrate_policy`` either sees this document or is seen by
        it: neither change is lost. The document is written as ``json.dumps`` writes it
        (``datasets.set_status``)."""
        def step(cur: Cursor) -> str | None:
            cur.execute("SELECT document FROM datasets WHERE id = %s FOR UPDATE", (dataset_id,))
            row = cur.fetchone()
            if row is None:
                return None
            doc = json.loads(row[0])
            doc["status"] = status
            text = json.dumps(doc)
            cur.execute("UPDATE datasets SET document = %s WHERE id = %s", (text, dataset_id))
            return text

        text: str | None = self._write(step)
        return text

    def idempotency_record(self, key: str) -> tuple[str, str | None, int | None] | None:
        """A live Idempotency-Key's (fingerprint, dataset id, version): the dataset ``open``
        registered under it, or the dataset and the version ``version_change`` stored
        under it; None if there is none or it expired. A key a release was created under
        (``reserve``) made no dataset: its dataset id reads None (Valkey's hash names
        the release there), its fingerprint is the request's."""
        def step(cur: Cursor) -> tuple[str, str | None, int | None] | None:
            cur.execute("SELECT fingerprint, dataset_id, version, release_id FROM idempotency "
                        "WHERE key = %s AND expires_at > now()", (key,))
            row = cur.fetchone()
            if row is None:
                return None
            fingerprint, dataset_id, version, release_id = row
            return (str(fingerprint), None if release_id is not None else dataset_id,
                    None if version is None else int(version))

        return self._tx(step)

    def record_holdout(self, dataset_id: str, rows: int) -> None:
        """One more release held ``rows`` rows out of DP: the count grows by one and the
        rows kept are the largest hold-out so far (DIP's hold-outs are nested), in one
        statement (Valkey: ``datasets._HOLDOUT_MAX``), once per call (``_write``: run
        again after its COMMIT's reply was lost, it counts nothing more)."""
        held = max(int(rows), 0)

        def step(cur: Cursor) -> None:
            cur.execute(
                "INSERT INTO holdouts (dataset_id, rows, releases) VALUES (%s, %s, 1) "
                "ON CONFLICT (dataset_id) DO UPDATE SET rows = GREATEST(holdouts.rows, "
                "EXCLUDED.rows), releases = holdouts.releases + 1", (dataset_id, held))

        self._write(step)

    def holdout_exposure(self, dataset_id: str) -> dict[str, int]:
        """``{"rows": largest hold-out, "releases": releases that used one}`` (0 and 0
        for a dataset none used)."""
        def step(cur: Cursor) -> tuple[Any, ...] | None:
            cur.execute("SELECT rows, releases FROM holdouts WHERE dataset_id = %s",
                        (dataset_id,))
            return cur.fetchone()

        row = self._tx(step)
        return {"rows": int(row[0]) if row else 0, "releases": int(row[1]) if row else 0}

    # -- reading releases -----------------------------------------------------------------

    def release(self, release_id: str) -> Fields | None:
        """The release's fields (``_release_fields``: the Valkey hash's names and
        formats), its output read from ``documents`` where its run stored it as a file;
        None if there is no such release. Raises ``release_documents.DocumentMissing``
        if that file is gone (or there is no document store): never fields without it.
        The file is read after the transaction: no connection waits on the disk."""
        def step(cur: Cursor) -> tuple[Any, ...] | None:
            cur.execute(f"SELECT {RELEASE_COLUMNS} FROM releases WHERE id = %s", (release_id,))
            return cur.fetchone()

        row = self._tx(step)
        if row is None:
            return None
        return release_documents.fields(self.documents, release_id, _release_fields(row))

    def releases(self, ids: list[str]) -> list[tuple[str, Fields]]:
        """(id, fields) of each of ``ids`` that exists, in the order of ``ids``: one
        query; outputs stored as files read as ``release`` does."""
        if not ids:
            return []

        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(f"SELECT {RELEASE_COLUMNS} FROM releases WHERE id = ANY(%s)",
                        (sorted(set(ids)),))
            return cur.fetchall()

        found = {row[0]: row for row in self._tx(step)}
        return [(release_id, release_documents.fields(self.documents, release_id,
                                                      _release_fields(found[release_id])))
                for release_id in ids if release_id in found]

    def release_page(self, view: ReleaseView, limit: int, after: index.Cursor | None = None
                     ) -> tuple[list[str], index.Cursor | None]:
        """Up to ``limit`` ids of ``view`` after the cursor ``after``, and the next page's
        cursor (None: this is the last page).

        Each list is ordered by (time, id), as Valkey's sorted sets by (score, member):
        ``all``, ``datasets`` and ``key`` newest first by ``created_at``, ``pending``
        (pricing, queued, running) oldest first by ``created_at``, ``failed`` (failed,
        refused) newest first by ``finished_at``. A cursor is ``index.Cursor(score=that
        time in epoch seconds, member=id)``, phase "": the next page starts strictly past
        (time, id), so ties on the time are neither skipped nor repeated, and a cursor
        whose release is gone still pages on from its place. ``datasets`` applies to
        the ``datasets``, ``pending`` and ``failed`` views (None: every dataset; empty:
        none); ``all`` and ``key`` ignore it.

        One query: a range scan of at most ``limit + 1`` entries of the view's index
        (migrations 0003_releases, 0010_hot_settle), or, with ``datasets``, one such
        scan per dataset (``unnest`` of the ids, LATERAL) merged and cut to ``limit +
        1``: O(log N + limit), O(D (log N + limit)) for D datasets, as Valkey's union of
        D sets
        (``index.page``). ``_page_query`` builds it (tests EXPLAIN it)."""
        if limit < 1:
            return [], None
        query = self._page_query(view, limit, after)
        if query is None:
            return [], None
        sql, params = query

        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(sql, params)
            return cur.fetchall()

        rows = self._tx(step)
        taken = rows[:limit]
        more = len(rows) > limit
        nxt = index.Cursor(taken[-1][1].timestamp(), taken[-1][0]) if more else None
        return [release_id for release_id, _ in taken], nxt

    @staticmethod
    def _page_query(view: ReleaseView, limit: int, after: index.Cursor | None
                    ) -> tuple[str, list[Any]] | None:
        """The SQL and parameters of ``release_page``'s query (None: the view is empty):
        the pending and failed views read their side table (``LIST_TABLES``), the others
        ``releases``."""
        if view.kind not in ("all", "datasets", "key", "pending", "failed"):
            raise ValueError(f"no such release view: {view.kind!r}")
        table, at = LIST_TABLES.get(view.kind, ("releases", "created_at"))
        key = "id" if table == "releases" else "release_id"
        newest_first = view.kind != "pending"
        past, way = ("<", "DESC") if newest_first else (">", "ASC")
        where: list[str] = []
        params: list[Any] = []
        if view.kind == "key":
            where.append("actor = %s")
            params.append(view.key_id)
        if after is not None:
            where.append(f"({at}, {key}) {past} (%s, %s)")
            params += [_cursor_time(after), after.member]
        datasets = view.datasets if view.kind in ("datasets", "pending", "failed") else None
        order = f"ORDER BY {at} {way}, {key} {way} LIMIT %s"
        if datasets is None:
            sql = (f"SELECT {key}, {at} FROM {table} "
                   f"{'WHERE ' + ' AND '.join(where) if where else ''} {order}")
            return sql, [*params, limit + 1]
        if not datasets:
            return None
        # one index range scan per dataset (dataset_id, time, id), merged: each reads at
        # most limit + 1 entries past the cursor
        sql = (f"SELECT r.{key}, r.{at} FROM unnest(%s::text[]) AS d(dataset_id) "
               f"CROSS JOIN LATERAL (SELECT {key}, {at} FROM {table} "
               f"WHERE {' AND '.join(['dataset_id = d.dataset_id', *where])} {order}) r "
               f"ORDER BY r.{at} {way}, r.{key} {way} LIMIT %s")
        return sql, [sorted(datasets), *params, limit + 1, limit + 1]

    def dataset_history(self, dataset_id: str, newest: int) -> tuple[list[Fields], bool]:
        """The fields of the dataset's ``newest`` most recent releases (by creation),
        oldest first: every field ``release`` gives but the output (no result file is
        read), ``request``, ``status`` and ``charged`` among them; and whether it has
        older ones. One range scan of ``newest + 1`` entries of
        ``releases_dataset_newest``, whatever the number of its releases (the one past
        ``newest`` says there are more; nothing counts them all)."""
        wanted = max(newest, 0)

        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(HISTORY_SQL, (dataset_id, wanted + 1))
            return cur.fetchall()

        rows = self._tx(step)
        history = []
        for row in reversed(rows[:wanted]):
            fields = _release_fields(row)
            fields.pop("output", None)
            fields.pop(release_documents.RESULT_ATTEMPT, None)
            history.append(fields)
        return history, len(rows) > wanted

    def kept_request(self, release_id: str) -> str | None:
        """None: PostgreSQL keeps every request in its ``releases`` row, never as a file of
        ``documents`` (only Valkey moves a settled request out of its memory)."""
        return None

    # -- the sweeper ----------------------------------------------------------------------

    def stale(self, older_than: float) -> list[tuple[str, float]]:
        """(id, creation epoch s) of the pending releases (pricing, queued, running)
        created over ``older_than`` seconds ago (the database's clock), oldest first:
        a range of ``release_pending``'s primary key (``STALE_SQL``)."""
        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(STALE_SQL, (older_than,))
            return cur.fetchall()

        return [(release_id, at.timestamp()) for release_id, at in self._tx(step)]

    def lease_held(self, release_id: str) -> bool:
        """Whether a run holds the release's lease now (a token whose time has not run
        out by the database's clock, as Valkey's lease key with its TTL)."""
        def step(cur: Cursor) -> bool:
            cur.execute("SELECT lease_token IS NOT NULL AND lease_until > now() FROM releases "
                        "WHERE id = %s", (release_id,))
            row = cur.fetchone()
            return bool(row and row[0])

        return self._tx(step)

    def unsent_ids(self) -> set[str]:
        """Every release in the outbox, whatever its age."""
        def step(cur: Cursor) -> set[str]:
            cur.execute("SELECT release_id FROM outbox")
            return {release_id for (release_id,) in cur.fetchall()}

        return self._tx(step)

    def claim_resend(self, release_id: str, max_resends: int) -> int:
        """Claim a re-send of a gone job (resend.lua's 'claim'), under the row's lock, so
        two sweepers never both claim and a run that starts meanwhile waits for it or is
        seen: the re-send's number (``resends`` + 1, ``resent_at`` now, and the sweeper's
        mark: a send under way, phase 0) if the release is still queued or running,
        unread (no ``data_read``) and unleased; 0 if it is no longer gone (or there is no
        such release); -1 if ``max_resends`` re-sends were made (the sweeper refunds
        it)."""
        def step(cur: Cursor) -> int:
            cur.execute("SELECT status, lease_token IS NOT NULL AND "
                        "COALESCE(lease_until > now(), false), data_read, "
                        "COALESCE(resends, 0) FROM releases WHERE id = %s FOR UPDATE",
                        (release_id,))
            row = cur.fetchone()
            if row is None:
                return 0
            status, leased, read, sent = row
            if status not in HOLDING or leased or read:
                return 0
            if int(sent) >= max_resends:
                return -1
            cur.execute("UPDATE releases SET resends = %s, resent_at = now() WHERE id = %s",
                        (int(sent) + 1, release_id))
            cur.execute(SENDING_SQL, (release_id,))
            return int(sent) + 1

        return int(self._write(step))

    def undo_resend(self, release_id: str) -> None:
        """Give back the last claim (its publish failed): ``resends`` - 1, no
        ``resent_at``, so the next pass claims it again (resend.lua's 'undo'), and a new
        mark (the publish returned: no message of it was published after). A release
        never claimed is left as it is (Valkey would count it -1). Once per call
        (``_write``): run again after its COMMIT's reply was lost, it gives back nothing
        more."""
        def step(cur: Cursor) -> None:
            cur.execute("UPDATE releases SET resends = GREATEST(resends - 1, 0), "
                        "resent_at = NULL WHERE id = %s AND resends IS NOT NULL", (release_id,))
            cur.execute(SENT_SQL, (release_id,))

        self._write(step)

    def drop_pending(self, release_id: str) -> None:
        """Nothing to do: a release's ``release_pending`` row goes when its status stops
        being a pending one (the trigger ``releases_lists``, migration 0010_hot_settle),
        whichever step ends it; no row can outlive it."""
        return None

    def sweep_marks(self, older_than: float, witness_age: float, lapsed: float
                    ) -> SendMarks:
        """Mark the stale releases whose last message was published (migration
        0008_sweep; ``Store.sweep_marks``): up to ``MARK_BATCH`` pricing or queued ones
        never marked, created over ``older_than`` s ago and out of the outbox
        (``MARK_NEW_SQL``: two ranges of ``release_pending_sweep``), the running ones whose
        lease lapsed over ``lapsed`` s ago and whose mark predates that
        (``MARK_LAPSED_SQL``: the rows of ``release_runs``), those whose send by the
        sweeper began over ``SEND_BOUND`` s ago (``MARK_SENDING_SQL``); rows a step holds
        are skipped (the next pass marks them). Then the witnesses (``WITNESS_SQL``): one
        backward scan of ``release_ran`` and of ``releases_priced_seq`` each, and
        the running releases. One transaction;
        run again after a lost reply it only takes newer marks, which are as true."""
        args = {"older": older_than, "lapsed": lapsed, "bound": SEND_BOUND,
                "batch": MARK_BATCH, "age": witness_age}

        def step(cur: Cursor) -> tuple[Any, ...] | None:
            cur.execute(SWEEP_PLANNING)
            for sql in (MARK_NEW_SQL, MARK_LAPSED_SQL, MARK_SENDING_SQL):
                cur.execute(sql, args)
            cur.execute(WITNESS_SQL, args)
            return cur.fetchone()

        row = self._tx(step) or (None, None)
        bounds = {kind: int(seq) for kind, seq in zip((RUN, PRICING), row, strict=True)
                  if seq is not None}
        return SendMarks(older_than, bounds)

    def passed(self, marks: SendMarks, empty: Collection[str], limit: int,
               stranded: Collection[str] = (), waiting: Collection[str] = ()
               ) -> list[Passed]:
        """The marked releases taken past (``Store.passed``): per kind, one range of
        ``release_pending_sweep`` below its bound (every mark for a kind whose queue was found
        empty), oldest mark first, ``limit`` at most each; a running
        one's mark counts only if taken after its lease lapsed. Then the ``stranded``
        ones by id. ``waiting`` is not read (the marks say it)."""
        query = passed_query(marks, empty, limit, stranded)
        if query is None:
            return []
        sql, params = query

        def step(cur: Cursor) -> list[tuple[Any, ...]]:
            cur.execute(SWEEP_PLANNING)
            return cur.execute(sql, params).fetchall()

        rows = self._tx(step)
        out: dict[str, Passed] = {}
        for release_id, status, created, seq, phase, held_long in rows:
            kind = PRICING if status == "pricing" else RUN
            gone = bool(held_long) or kind in empty or phase == 2
            if release_id not in out or gone:
                out[release_id] = Passed(release_id, status, created.timestamp(),
                                         int(seq or 0), gone)
        return sorted(out.values(), key=lambda p: p.seq)[:limit]

    def confirm_passed(self, passed: list[Passed]) -> None:
        """Mark each again (phase 2), if its mark is still the one read (a pass that
        overlaps this one, or a claim, changes nothing twice): one statement."""
        if passed:
            self._tx(lambda cur: cur.execute(CONFIRM_SQL, (
                [p.release_id for p in passed], [p.seq for p in passed])),
                one_statement=True)

    def held_by_workers(self, release_ids: Collection[str]) -> None:
        """The pricing or queued ones among them marked twice go back to phase 1 (a
        change of no indexed column: a HOT update)."""
        if release_ids:
            self._tx(lambda cur: cur.execute(HELD_SQL, (sorted(release_ids),)),
                     one_statement=True)

    def sending(self, release_id: str) -> None:
        """Phase 0 since now (``sweep_seq`` 0): no mark until its publish returned."""
        self._tx(lambda cur: cur.execute(SENDING_SQL, (release_id,)), one_statement=True)

    def sent(self, release_id: str) -> None:
        """A new mark, phase 1: taken after the publish returned, so after the message."""
        self._tx(lambda cur: cur.execute(SENT_SQL, (release_id,)), one_statement=True)

    # -- the audit events' bounds -----------------------------------------------------------

    def audit_range(self, since: datetime | None, until: datetime | None,
                    after: str | None) -> tuple[str, str]:
        """The (start, end) event-id bounds ``iter_events`` and ``events_page`` take for
        the events at or after ``since``, at or before ``until`` and after the event
        ``after`` (a page's last id, from a cursor).

        Event ids are global (``events.id``, a bigserial) and the events of every
        dataset share them, so the bounds are too: ``since`` is the id of the first event
        at or after it in (at, id) order (inclusive: ``"<id>"``), ``until`` that of the
        last at or before it (inclusive), each one probe of the index ``events_at``;
        ``"-"`` / ``"+"``: no bound. With no event at or after ``since`` the range is
        empty (``"(<max id>"`` to ``"<max id>"``: nor any event written later, as a
        stream read to ``+`` would give), with none at or before ``until`` too (end
        ``"0"``). ``after`` wins over ``since`` when it is past it (``"(<after>"``,
        exclusive). Ids follow the order events were inserted,
        ``at`` their transaction's time: an event whose transaction ran in step with
        another's may fall on the other side of a bound by that overlap (Valkey's bounds,
        its stream ids' clock, have the same kind of edge). Raises
        ``service.errors.Invalid`` naming ``cursor`` if ``after`` is not an event id of
        this store (decimal digits, a bigint)."""
        position: int | None = None
        if after is not None:
            if not _EVENT_ID.fullmatch(after) or int(after) >= 2**63:
                raise Invalid("not a cursor this server returned", code="validation_error",
                              field="cursor")
            position = int(after)
        low = _utc(since) if since is not None else None
        high = _utc(until) if until is not None else None

        def step(cur: Cursor) -> tuple[str, str]:
            start = "-"
            if low is not None:
                cur.execute("SELECT id FROM events WHERE at >= %s ORDER BY at, id LIMIT 1",
                            (low,))
                first = cur.fetchone()
                if first is None:  # no event at or after since: the range is empty
                    cur.execute("SELECT COALESCE(max(id), 0) FROM events")
                    newest = cur.fetchone()
                    top = int(newest[0]) if newest else 0
                    return f"({top}", str(top)
                start = str(first[0])
            if position is not None and (start == "-" or position + 1 >= int(start)):
                start = f"({position}"
            end = "+"
            if high is not None:
                cur.execute("SELECT id FROM events WHERE at <= %s ORDER BY at DESC, id DESC "
                            "LIMIT 1", (high,))
                last = cur.fetchone()
                end = str(last[0]) if last is not None else "0"
            return start, end

        return self._tx(step)


def _release_fields(row: tuple[Any, ...]) -> Fields:
    """A ``releases`` row (``RELEASE_COLUMNS``) as the Valkey release hash's fields, only
    those that are set, in the hash's formats (``service.storage.store``'s list):
    ``status``, ``request``, ``actor``; ``created_at`` / ``started_at`` / ``finished_at``
    ISO 8601 in ``ledger.now_iso``'s form (the ``Reservation.at`` the API passed reads
    back as it was: milliseconds, ``Z``); ``worker`` and ``attempts`` (start.lua) once a
    run started; ``output`` kept in the row, or ``result`` (the attempt whose file holds
    it, settle.lua's field: ``release_documents.fields`` reads it); ``error``;
    ``data_read`` and ``charged`` ``"1"``; ``table`` the attempt whose table is the
    release's; ``resends`` and ``resent_at`` (epoch seconds, ``%.3f``) once the sweeper
    claimed a re-send. Not the Valkey hash's internal fields (``settled_by``,
    ``replay_key``) nor ``doc`` (the request never leaves the row)."""
    (_, status, request, actor, created, started, finished, worker, attempt, output,
     result_attempt, error, data_read, charged, table, resends, resent_at) = row
    fields: Fields = {"status": status, "request": request, "actor": actor,
                      "created_at": _iso(created)}
    if started is not None:
        fields["started_at"] = _iso(started)
    if finished is not None:
        fields["finished_at"] = _iso(finished)
    if worker is not None:
        fields["worker"] = worker
    if attempt:
        fields["attempts"] = str(int(attempt))
    if output is not None:
        fields["output"] = output
    elif result_attempt is not None:
        fields[release_documents.RESULT_ATTEMPT] = str(int(result_attempt))
    if error is not None:
        fields["error"] = error
    if data_read:
        fields["data_read"] = "1"
    if charged:
        fields["charged"] = "1"
    if table is not None:
        fields["table"] = str(int(table))
    if resends is not None:
        fields["resends"] = str(int(resends))
    if resent_at is not None:
        fields["resent_at"] = f"{resent_at.timestamp():.3f}"
    return fields


def _balance_row(cap: int, committed: int, reserved: int) -> dict[str, int]:
    """A ``budgets`` (or ``allocations``) row as ``balance`` shows it, in units."""
    return {"cap": int(cap), "committed": int(committed), "reserved": int(reserved),
            "remaining": int(cap) - int(committed) - int(reserved)}


def _cursor_time(cursor: index.Cursor) -> datetime:
    """The time a page cursor's score names (epoch seconds, as ``index.Cursor``); 422
    naming ``cursor`` for a score no timestamp has (a forged cursor)."""
    try:
        return datetime.fromtimestamp(cursor.score, UTC)
    except (OverflowError, OSError, ValueError):
        raise Invalid("not a cursor this server returned", code="validation_error",
                      field="cursor") from None


def _utc(at: datetime) -> datetime:
    """An aware datetime in UTC; a naive one is the local time ``datetime.timestamp``
    takes it for (as the Valkey ledger view's bounds read it)."""
    return datetime.fromtimestamp(at.timestamp(), UTC)


def _event_doc(row: tuple[Any, ...]) -> dict[str, Any]:
    """An events row as ``ledger.event_doc`` shows a stream entry."""
    event_id, kind, release_id, actor, at, units, detail = row
    doc: dict[str, Any] = {"id": str(event_id), "kind": kind, "release_id": release_id,
                           "actor": actor, "at": _iso(at)}
    doc.update(detail or {})
    doc["units"] = {m: int(u) for m, u in (units or {}).items()}
    return doc


def _bound(value: str, unbounded: str) -> tuple[int | None, bool]:
    """(id, exclusive) of an events range bound; (None, False) for no bound."""
    if value == unbounded:
        return None, False
    exclusive = value.startswith("(")
    return int(value[1:] if exclusive else value), exclusive


def _reserve_params(r: Reservation) -> dict[str, Any]:
    """``RESERVE_SQL``'s arguments for ``r`` (its cost by measure, sorted)."""
    cost = {m: int(u) for m, u in sorted(r.cost.items())}
    return {"release": r.release_id, "dataset": r.dataset_id, "actor": r.actor,
            "mode": r.mode, "request": r.request_json, "fingerprint": r.fingerprint,
            "replay_key": r.replay_fingerprint or r.fingerprint, "replay": r.replay,
            "idem": r.idempotency_key, "ttl": r.idempotency_ttl,
            "notion": r.notion_lock or "", "measures": list(cost),
            "units": list(cost.values()), "version": _version_of(r.request_json),
            "at": r.at}


def _fetch_one(cur: Cursor, query: str, params: dict[str, Any]) -> Any:
    """The first column of the first row ``query`` answers (None without a row)."""
    cur.execute(query, params)
    row = cur.fetchone()
    return row[0] if row else None


def _fetch_row(cur: Cursor, query: str, params: dict[str, Any]) -> tuple[Any, ...]:
    """The one row of ``query``, a SELECT without FROM."""
    cur.execute(query, params)
    row = cur.fetchone()
    assert row is not None  # a SELECT without FROM: one row
    return tuple(row)


def _retryable(err: Exception) -> bool:
    """What ``pg_steps.retryable`` runs again (a transaction PostgreSQL rolled back, a
    connection that broke), and besides another attempt of the same write call that
    committed meanwhile (its answer in ``step_calls``: the next attempt reads it) or a
    create of the same release id that committed meanwhile (``releases_pkey``: reserves
    share the dataset's ``ledgers`` row, migration 0007, so two creates of one id meet on
    the key; the next attempt finds the release, or its first attempt's answer). Any other
    error (a bad query, any other unique violation) is raised."""
    if isinstance(err, errors.UniqueViolation):
        return err.diag.constraint_name in ("step_calls_pkey", "releases_pkey")
    return pg_steps.retryable(err)


if TYPE_CHECKING:
    def _keeps_the_contract(ledger: PgLedger) -> Store:
        """mypy checks here that ``PgLedger`` implements every method of ``Store``."""
        return ledger
