"""The privacy budget ledger: reserve, commit, fail, abort, cancel — each one Lua script.

All amounts are integer units (see ``service.budget``). The scripts run
atomically inside Redis, so any number of API processes and workers on any
number of hosts can never hold or spend more than a cap (DESIGN §3), nor
more than an analyst key's allocation inside it.

A worker runs a job under a lease named by a token of that run (``Run``), and
settles it only while the lease is still that token's, in the same script that
settles: a run that stalled past its lease while another run took the job over
can neither store a second output nor refund the first.

Each script runs as a ``durable.Step``: safe to re-send (after a lost reply, or
across a Sentinel failover), and with PRIVRELEASE_LEDGER_REPLICAS > 0 answered only
once that many replicas acknowledged it (WAIT), else 503: a reserve a failover
loses held nothing and its job cannot run; a settle it loses is re-sent by the
worker, or charged by the sweeper (``service.storage.durable`` has the argument).
"""

from __future__ import annotations

import errno
import json
import logging
import re
import secrets
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

import redis

from service.errors import STORAGE_DOWN, STORAGE_FULL, Invalid
from service.storage import index, release_documents, rkeys
from service.storage.durable import Replication, Step
from service.storage.event_archive import READ_BATCH, AuditArchive, parse_id
from service.storage.release_documents import DocumentStore

if TYPE_CHECKING:
    from service.storage.store import BudgetWindow, ReleaseView

log = logging.getLogger("privrelease.ledger")

Outcome = Literal["reserved", "pricing", "replay", "idempotent", "idem_mismatch", "exhausted",
                  "retired", "version_retired", "ended", "notion_locked", "not_admitted",
                  "stale"]
#: how ``Ledger.reserve`` treats the release (reserve.lua): a new release with its cost, a
#: release created to be priced by a job (nothing held), or that release being reserved
Mode = Literal["new", "pricing", "priced"]
Settled = Literal["settled", "ended", "running", "lost"]
#: settle's lease condition for the sweeper: only if no run holds the job's lease
NO_LEASE = "!"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _script(name: str) -> str:
    return resources.files("service.storage").joinpath(f"lua/{name}.lua").read_text()


@dataclass(frozen=True)
class ReserveResult:
    """What ``reserve`` decided; ``release_id`` is the new or the earlier release.

    When exhausted, ``scope`` says whose cap was short: the dataset's or the
    actor's allocation; when ``ended`` (a priced release that left ``pricing``),
    ``status`` is the status it has; when ``notion_locked``, ``notion`` is the
    notion the dataset is locked to.
    """

    outcome: Outcome
    release_id: str = ""
    measure: str = ""
    requested: int = 0
    remaining: int = 0
    scope: str = ""
    status: str = ""
    notion: str = ""
    listed: bool = True


@dataclass(frozen=True)
class Reservation:
    """One release's call to ``Ledger.reserve``: which release, its cost in units, who
    asks, and how a retry or a replay of it is recognised."""

    dataset_id: str
    release_id: str
    #: integer ledger units per measure (``service.budget``); empty for a ``pricing`` one
    cost: dict[str, int]
    actor: str
    #: what the ``idempotency_key`` must match (the request); names the replay key unless
    #: ``replay_fingerprint`` does (the request with its cost)
    fingerprint: str
    #: the stored request (``service.releases.request.JobRequest.to_json``)
    request_json: str
    #: whether an identical earlier release answers this one (a ``pricing`` one: no)
    replay: bool = True
    idempotency_key: str | None = None
    idempotency_ttl: int = 86400
    at: str | None = None
    mode: Mode = "new"
    replay_fingerprint: str | None = None
    #: 'dp' or 'noiseless' (``budget.notion_lock``): the notion this release locks to
    notion_lock: str = ""
    #: the stamp of the registry read it was priced on (``Store.dataset_for_pricing``):
    #: the store reserves nothing and answers ``stale`` if the dataset's differs now
    #: ('': not checked)
    stamp: str = ""


@dataclass(frozen=True)
class Run:
    """One attempt at a job: its lease token and its attempt number (1, 2, ...).

    The token is the lease's value while this run holds it; the attempt number
    names the run's output files, so two runs never write to the same place.
    ``mark_running`` also hands the run what it reads next, read with the start:
    the release's ``request`` and its dataset's ``dataset_document`` (None: no such
    dataset); a ``Run`` made otherwise has neither (``""``, None).
    """

    release_id: str
    token: str
    attempt: int
    request: str = field(default="", compare=False, repr=False)
    dataset_document: str | None = field(default=None, compare=False, repr=False)


#: the sweeper's two kinds of message: a release's run (the ``releases`` queue) and its
#: pricing job (the ``pricing`` queue)
RUN, PRICING = "run", "pricing"


@dataclass(frozen=True)
class SendMarks:
    """What ``Store.sweep_marks`` learnt, for ``Store.passed``: the age from which a
    pending release is judged (``older_than``, s) and, per kind of message (``RUN``,
    ``PRICING``), the witness bound: the mark taken before the first message of the
    newest release whose message of that kind a worker took ``witness_age`` s ago or
    more (absent: none known). ``indexed`` False: the store keeps no marks (the Valkey
    store): the sweeper finds the waiting messages in the queue lists instead."""

    older_than: float
    bounds: Mapping[str, int] = field(default_factory=dict)
    indexed: bool = True


@dataclass(frozen=True)
class Passed:
    """A pending release ``Store.passed`` found: its ``status`` when marked ('' if the
    store did not read it), creation (epoch s) and mark; ``gone`` if its last message is
    known to be off its queue (the sweeper then looks whether a worker holds it), else
    taken past once (``Store.confirm_passed`` marks it again)."""

    release_id: str
    status: str
    created: float
    seq: int
    gone: bool


class CapError(ValueError):
    """A cap change the ledger refused; ``reason`` is below_spent or above_dataset,
    ``key_id`` the allocation refused (None: the dataset's cap)."""

    def __init__(self, reason: str, measure: str, units: int,
                 key_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.measure, self.units, self.key_id = reason, measure, units, key_id


#: every kind of audit event the scripts write (the ledger view's ``kind`` filter)
EVENT_KINDS = ("cap", "allocation", "reserve", "commit", "abort", "cancel", "refuse",
               "retire", "version", "policy")
#: an allocation's rule, the ledger field ``alloc:<key>:scope``: ``listed`` (written by
#: admin.lua with every allocation: the measures it lists, none of the others) or
#: ``legacy`` (an allocation from before that rule, marked by ``service.policy.migrate``:
#: unlisted measures unlimited, as they were); no field: no allocation
ALLOCATION_SCOPES = ("listed", "legacy")


class Ledger:
    """Budget accounting for every dataset, backed by one Redis server."""

    #: a run writes its output as a file before the commit, which names it: outputs stay
    #: out of Valkey's memory
    results_inline = False

    def __init__(self, client: redis.Redis, lease_seconds: int = 30,
                 replication: Replication | None = None,
                 run_retry_seconds: float = 0.0,
                 documents: DocumentStore | None = None,
                 audit: AuditArchive | None = None) -> None:
        """With ``documents`` a settle moves the release's request out of Valkey into
        that store (``service.storage.release_documents``); without, the hash keeps it
        (ledger-only use).
        Every script is a ``durable.Step``: acknowledged by ``replication``'s replicas
        (WAIT). A run's steps (start, lease, settle) are re-sent for ``run_retry_seconds``
        across a failover (workers; the API answers 503 at once). See ``service.storage.durable``
        for why that is safe and what an unacknowledged step means. With ``audit`` the
        audit stream's archived events are read too (``service.storage.event_archive``)."""
        self.r = client
        self.lease_seconds = lease_seconds
        self.documents = documents
        self.audit = audit
        repl = replication or Replication()
        self._reserve = Step(client, _script("reserve"), repl)
        self._settle = Step(client, _script("settle"), repl, nonce=True,
                            retry_seconds=run_retry_seconds)
        self._start = Step(client, _script("start"), repl, retry_seconds=run_retry_seconds)
        self._lease = Step(client, _script("lease"), repl, retry_seconds=run_retry_seconds)
        self._admin = Step(client, _script("admin"), repl)
        self._refuse = Step(client, _script("refuse"), repl)
        self._open = Step(client, _script("open"), repl)
        self._version = Step(client, _script("version"), repl)
        self._policy = Step(client, _script("policy"), repl)
        self._recharge = Step(client, _script("recharge"), repl)
        self._resend = Step(client, _script("resend"), repl)

    def open(self, dataset_id: str, caps: dict[str, int], actor: str,
             document: str | None = None, *, idempotency_key: str | None = None,
             fingerprint: str = "", idempotency_ttl: int = 86400) -> tuple[str, str]:
        """Register a dataset (its ``document``) with its caps, recorded in its audit stream.

        One script, so it happens whole or not at all, and at most once.
        Returns (outcome, dataset id): ``opened``; ``exists`` when redis-py
        re-sent the call after a lost reply and it had run; with an
        ``idempotency_key``, ``idempotent`` and the dataset the key already
        registered (``idem_mismatch`` if that was for another ``fingerprint``).
        Without a document only the ledger is opened (tests of the ledger alone).
        """
        argv: list[Any] = [dataset_id, document or "", time.time(), actor, now_iso(),
                           fingerprint if idempotency_key else "", idempotency_ttl, len(caps)]
        for measure, units in sorted(caps.items()):
            argv += [measure, str(int(units))]
        guard = rkeys.dataset(dataset_id) if document else rkeys.ledger(dataset_id)
        keys = [rkeys.ledger(dataset_id), rkeys.events(dataset_id), guard, rkeys.DATASETS,
                idempotency_key or f"{rkeys.P}idem:none"]
        outcome, registered = self._open(keys=keys, args=argv)
        return str(outcome), str(registered)

    def version_change(self, dataset_id: str, read: str, document: str, action: str,
                       version: int, actor: str, *, idempotency_key: str | None = None,
                       fingerprint: str = "", idempotency_ttl: int = 86400) -> tuple[str, int]:
        """Replace the dataset's document ``read`` by ``document`` for a version ``action``
        (uploaded, current, retired), recorded as a ``version`` event (version.lua).

        Returns (outcome, version): ``ok``; ``conflict`` when the document is no longer
        ``read`` (read it again); with an ``idempotency_key``, ``idempotent`` and the
        version the key uploaded first (``idem_mismatch`` if for another ``fingerprint``).

        ``retired`` also sets the ledger hash's ``retired:v<version>`` in the same step
        (``current`` clears it), the field ``reserve`` refuses on: a version retired
        while a release on it was being prepared never has that release reserved.
        """
        outcome, done = self._version(
            keys=[rkeys.dataset(dataset_id), rkeys.events(dataset_id),
                  idempotency_key or f"{rkeys.P}idem:none", rkeys.ledger(dataset_id)],
            args=[read, document, action, version, actor, now_iso(),
                  fingerprint if idempotency_key else "", idempotency_ttl])
        return str(outcome), int(done or 0)

    def migrate_policy(self, dataset_id: str, read: str, document: str, actor: str,
                       notions: list[str], record_level: bool) -> tuple[str, list[str]]:
        """Replace the dataset's document ``read`` by ``document`` (its policy made explicit),
        mark its allocations legacy and record a ``policy`` event, in one script
        (policy.lua). Returns the outcome (``migrated``, ``conflict``: the document changed
        since it was read; ``missing``) and the keys whose allocations were marked."""
        outcome, keys = self._policy(
            keys=[rkeys.dataset(dataset_id), rkeys.ledger(dataset_id), rkeys.events(dataset_id)],
            args=[read, document, actor, now_iso(), ",".join(notions), int(record_level)])
        return str(outcome), [k for k in str(keys).split(",") if k]

    def recharge_interval(self, dataset_id: str, units: dict[str, int], actor: str) -> str:
        """Add ``units`` (per interval measure) to the dataset's committed totals and record
        one ``policy`` event, once per dataset (recharge.lua); returns ``recharged``,
        ``nothing`` (no amount, marked done) or ``done`` (it ran before)."""
        argv: list[Any] = [actor, now_iso(), len(units)]
        for measure, amount in sorted(units.items()):
            argv += [measure, int(amount)]
        outcome, *_ = self._recharge(
            keys=[rkeys.ledger(dataset_id), rkeys.events(dataset_id)], args=argv)
        return str(outcome)

    def set_caps(self, dataset_id: str, caps: dict[str, int], actor: str,
                 key_id: str | None = None) -> None:
        """Change the dataset's caps, or ``key_id``'s allocation; CapError if refused."""
        self.change_caps(dataset_id, [(key_id, caps)], actor)

    def change_caps(self, dataset_id: str, changes: list[tuple[str | None, dict[str, int]]],
                    actor: str) -> None:
        """Apply every (key id or None for the dataset, caps) change, or none of them.

        One script: an allocation is checked against the dataset's cap as this same
        call sets it, and a refused change (CapError) leaves every cap as it was and
        records nothing, so an answered 409 never changed a cap.
        """
        argv: list[Any] = [actor, now_iso(), len(changes)]
        for key_id, caps in changes:
            argv += ["allocation" if key_id else "cap", key_id or "", len(caps)]
            for measure, units in sorted(caps.items()):
                argv += [measure, str(int(units))]
        reply = self._admin(keys=[rkeys.ledger(dataset_id), rkeys.events(dataset_id)],
                            args=argv)
        if reply[0] != "ok":
            raise CapError(reply[0], reply[1], int(reply[2]), reply[3] or None)

    def retire(self, dataset_id: str, actor: str) -> None:
        """Refuse every new reservation on the dataset from now on; record it."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(rkeys.ledger(dataset_id), "retired", "1")
        pipe.xadd(rkeys.events(dataset_id),
                  {"kind": "retire", "release_id": "", "actor": actor, "at": now_iso()})
        pipe.execute()

    def reserve(self, r: Reservation) -> ReserveResult:
        """Hold ``r.cost`` for a new release unless it is a retry, a replay or over a cap.

        ``mode="pricing"`` creates the release in status ``pricing`` holding nothing
        (outcome ``pricing``); ``mode="priced"`` is its pricing job reserving it, at most
        once per release id: a release no longer pricing answers ``ended`` (reserve.lua).
        ``notion_lock`` ('dp' or 'noiseless', ``budget.notion_lock``) locks the dataset to
        that notion with the reservation, or answers ``notion_locked`` if it is locked to
        the other one; a release created ``pricing`` is checked but locks nothing yet.
        A retired dataset is refused ``retired``; a request (``dataset_version`` in
        ``request_json``) on a retired version ``version_retired``, checked here, in the
        script, not only by the caller: a PATCH retiring it after the API read the
        document still wins. Releases reserved before a retirement stay valid and run
        (retirement means "no new releases").
        """
        argv: list[Any] = [
            r.release_id, r.fingerprint, r.actor, r.at or now_iso(), f"{time.time():.3f}",
            r.request_json, r.idempotency_ttl, int(r.idempotency_key is not None),
            int(r.replay), r.mode, len(r.cost),
        ]
        for measure, units in sorted(r.cost.items()):
            argv += [measure, str(int(units))]
        argv.append(r.notion_lock)
        reply = self._reserve(
            keys=[
                rkeys.ledger(r.dataset_id), rkeys.events(r.dataset_id),
                rkeys.release(r.release_id), rkeys.reservation(r.release_id),
                rkeys.replay(r.replay_fingerprint or r.fingerprint),
                r.idempotency_key or f"{rkeys.P}idem:none", rkeys.PENDING, rkeys.RELEASES,
                rkeys.OUTBOX, rkeys.dataset_releases(r.dataset_id), rkeys.key_releases(r.actor),
                rkeys.dataset_pending(r.dataset_id),
            ],
            args=argv,
        )
        if reply[0] == "exhausted":
            return ReserveResult("exhausted", "", reply[1], int(reply[2]), int(reply[3]),
                                 reply[4], listed=len(reply) < 6 or reply[5] != "unlisted")
        if reply[0] == "not_admitted":
            return ReserveResult("not_admitted", measure=reply[1])
        if reply[0] == "ended":
            return ReserveResult("ended", reply[1], status=reply[2])
        if reply[0] == "notion_locked":
            return ReserveResult("notion_locked", notion=reply[1])
        return ReserveResult(reply[0], reply[1])

    def refuse(self, dataset_id: str, release_id: str, error_json: str, code: str,
               actor: str) -> bool:
        """End a release still ``pricing`` as ``refused`` (nothing was held, so nothing is
        refunded), recorded in the audit stream; False if it was no longer pricing."""
        return bool(self._refuse(
            keys=[rkeys.release(release_id), rkeys.events(dataset_id), rkeys.PENDING,
                  rkeys.dataset_pending(dataset_id), rkeys.OUTBOX, rkeys.FAILED,
                  rkeys.dataset_failed(dataset_id)],
            args=[release_id, error_json, actor, now_iso(), f"{time.time():.3f}", code]))

    def enqueued(self, release_id: str) -> None:
        """The release's task is published: take it out of the outbox."""
        self.r.zrem(rkeys.OUTBOX, release_id)

    def enqueued_many(self, release_ids: list[str]) -> None:
        """Their tasks are published: take them out of the outbox (one ZREM)."""
        if release_ids:
            self.r.zrem(rkeys.OUTBOX, *release_ids)

    def unsent(self, release_id: str, older_than: float) -> bool:
        """Whether the release waits in the outbox since more than ``older_than`` s ago."""
        score = self.r.zscore(rkeys.OUTBOX, release_id)
        return score is not None and score <= time.time() - older_than

    def outbox(self, older_than: float, limit: int = 1000) -> list[str]:
        """Releases reserved over ``older_than`` s ago whose task may never have been sent."""
        return list(self.r.zrangebyscore(rkeys.OUTBOX, 0, time.time() - older_than,
                                         start=0, num=limit))

    def mark_running(self, release_id: str, worker: str) -> Run | None:
        """Start a run of the job and take its lease; None if it ended or a live run has it.
        The run carries the release's request and its dataset's document (``Run``), read
        after the start: a started release is pending, so its request is in the hash."""
        token = f"{worker}#{secrets.token_hex(8)}"
        attempt = int(self._start(keys=[rkeys.release(release_id), rkeys.lease(release_id),
                                        rkeys.OUTBOX],
                                  args=[now_iso(), worker, self.lease_seconds, token,
                                        release_id]))
        if not attempt:
            return None
        request = self.r.hget(rkeys.release(release_id), "request") or ""
        dataset_id = json.loads(request).get("dataset_id") if request else None
        document = self.dataset_document(dataset_id) if isinstance(dataset_id, str) else None
        return Run(release_id, token, attempt, request, document)

    def renew_lease(self, run: Run) -> bool:
        """Keep a long run's lease alive; False if the run lost it (another run took over)."""
        return self._touch(run, "renew")

    def mark_data_read(self, run: Run) -> bool:
        """Record, as the lease holder, that the run is about to read the data; False if
        the run lost its lease (it must then read nothing and store nothing).

        From then on the job is charged whatever happens: a failure, or a worker that
        dies, is no longer refunded (DESIGN §3).
        """
        return self._touch(run, "read")

    def _touch(self, run: Run, action: str) -> bool:
        return bool(self._lease(keys=[rkeys.lease(run.release_id), rkeys.release(run.release_id)],
                                args=[run.token, self.lease_seconds, action]))

    def commit(self, dataset_id: str, run: Run, output_json: str,
               table_version: int | None = None, *, result_stored: bool = False) -> Settled:
        """Store the output (and which run's table is the release's) and charge, once.

        With ``result_stored`` the output is the run's file in the document store
        (``DocumentStore.save_result``, written before): the release records the run's
        attempt instead of the output. Only while ``run`` holds the lease: 'settled',
        else 'ended' (already ended) or 'lost' (another run holds the lease; nothing
        changed).
        """
        return self._end(dataset_id, run.release_id, "commit",
                         "" if result_stored else output_json, run.token, run.token,
                         "" if table_version is None else str(table_version),
                         str(run.attempt) if result_stored else "")

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
        no run holds its lease. False if it ended or a run holds the lease."""
        return self._end(dataset_id, release_id, "fail", error_json, actor,
                         NO_LEASE) == "settled"

    def cancel(self, dataset_id: str, release_id: str, actor: str) -> Settled:
        """Refund a job that has not started; 'running' if it already has."""
        return self._end(dataset_id, release_id, "cancel",
                         '{"message": "cancelled by an operator"}', actor)

    def _end(self, dataset_id: str, release_id: str, action: str, payload: str,
             actor: str, holder: str = "", table_version: str = "",
             result_attempt: str = "") -> Settled:
        replay_key, request = self.r.hmget(rkeys.release(release_id), "replay_key", "request")
        # the request to disk first: settle drops it from the hash only if it is this one
        sha = ""
        if self.documents is not None and request:
            try:
                sha = self.documents.save_request(release_id, request)
            except OSError as err:
                if err.errno not in STORAGE_FULL | STORAGE_DOWN:
                    raise
                # the store cannot take it now (full, read-only): the release settles all
                # the same, its request kept in the hash, where documents are read from
                # too (``privrelease migrate-outputs`` moves it later); said, so an
                # operator learns the store needs room (the errno only: no path)
                log.warning("release request kept in Valkey: the document store cannot"
                            " take it", extra={"release_id": release_id,
                                               "errno": errno.errorcode.get(err.errno or 0)})
        reply = self._settle(
            keys=[
                rkeys.ledger(dataset_id), rkeys.events(dataset_id), rkeys.release(release_id),
                rkeys.reservation(release_id), rkeys.PENDING,
                replay_key or f"{rkeys.P}replay:none", rkeys.lease(release_id),
                rkeys.OUTBOX, rkeys.dataset_pending(dataset_id), rkeys.FAILED,
                rkeys.dataset_failed(dataset_id),
            ],
            args=[release_id, action, payload, actor, now_iso(), holder, table_version,
                  f"{time.time():.3f}", sha, result_attempt],
        )
        outcomes: dict[int, Settled] = {1: "settled", 0: "ended", -1: "running", -2: "lost"}
        return outcomes[int(reply)]

    def balance(self, dataset_id: str) -> dict[str, dict[str, int]]:
        """Per measure: cap, committed, reserved and remaining, in units."""
        return self.budget(dataset_id)[0]

    def balances(self, ids: list[str]) -> list[dict[str, dict[str, int]]]:
        return [self.balance(dataset_id) for dataset_id in ids]

    def budget(self, dataset_id: str) -> tuple[dict[str, dict[str, int]],
                                               dict[str, dict[str, dict[str, int]]]]:
        """The balance, and the same rows for each key's allocation."""
        dataset: dict[str, dict[str, int]] = {}
        allocations: dict[str, dict[str, dict[str, int]]] = {}
        for name, value in self.r.hgetall(rkeys.ledger(dataset_id)).items():
            parts = name.split(":", 3)
            if parts[0] == "alloc" and len(parts) == 4:
                table = allocations.setdefault(parts[1], {})
                kind, measure = parts[2], parts[3]
            elif parts[0] in {"cap", "committed", "reserved"}:
                table, (kind, measure) = dataset, name.split(":", 1)
            else:
                continue
            row = table.setdefault(measure, {"cap": 0, "committed": 0, "reserved": 0})
            row[kind] = int(value)
        for table in (dataset, *allocations.values()):
            for row in table.values():
                row["remaining"] = row["cap"] - row["committed"] - row["reserved"]
        return dataset, allocations

    def named_measures(self, dataset_id: str) -> set[str]:
        """The measures the dataset's caps name (``cap:<measure>`` fields, 0 included): the
        only ones it admits (DESIGN §3: no default caps)."""
        return {f[4:] for f in self.r.hkeys(rkeys.ledger(dataset_id)) if f.startswith("cap:")}

    def allocation_scopes(self, dataset_id: str) -> dict[str, str]:
        """Each key's allocation rule (``ALLOCATION_SCOPES``), by key id."""
        fields = self.r.hgetall(rkeys.ledger(dataset_id))
        return {name.split(":")[1]: value for name, value in fields.items()
                if name.startswith("alloc:") and name.count(":") == 2
                and name.endswith(":scope")}

    def notion_lock(self, dataset_id: str) -> str | None:
        """The notion ('dp' or 'noiseless') the dataset is locked to, or None."""
        lock = self.r.hget(rkeys.ledger(dataset_id), "notion_lock")
        return str(lock) if lock else None

    def read(self, dataset_id: str, start: str = "-", end: str = "+",
             count: int | None = None) -> Iterator[tuple[str, dict[str, str]]]:
        """The dataset's raw audit events (id, fields) between stream ids (XRANGE's
        bounds, ``(`` exclusive), oldest first, at most ``count``: the archived ones and
        those still in the stream, read in batches (memory bounded whatever the range)."""
        if self.audit is not None:
            return self.audit.merge(self.r, dataset_id, start, end, count)
        return self._stream(dataset_id, start, end, count)

    def _stream(self, dataset_id: str, start: str, end: str,
                count: int | None) -> Iterator[tuple[str, dict[str, str]]]:
        low = start
        while count is None or count > 0:
            want = READ_BATCH if count is None else min(count, READ_BATCH)
            batch = self.r.xrange(rkeys.events(dataset_id), low, end, count=want)
            yield from batch
            if len(batch) < want:
                return
            low = f"({batch[-1][0]}"
            count = None if count is None else count - len(batch)

    def iter_events(self, dataset_id: str, start: str = "-", end: str = "+",
                    kinds: set[str] | None = None) -> Iterator[dict[str, Any]]:
        """``events`` one at a time (an export of any size in bounded memory)."""
        for event_id, fields in self.read(dataset_id, start, end):
            if not kinds or fields.get("kind") in kinds:
                yield event_doc(event_id, fields)

    def events(self, dataset_id: str, start: str = "-", end: str = "+",
               kinds: set[str] | None = None) -> list[dict[str, Any]]:
        """The dataset's audit events between stream ids, oldest first: the archived ones
        and those still in the stream."""
        return list(self.iter_events(dataset_id, start, end, kinds))

    def events_page(self, dataset_id: str, start: str, end: str, kinds: set[str] | None,
                    limit: int) -> tuple[list[dict[str, Any]], str | None]:
        """One page: of the next ``limit`` events from ``start``, those of ``kinds``; and
        the id of the last event read when more follow (None: the range ends here).

        The page is bounded by events read, not returned, so a filter that matches
        nothing still reads at most ``limit + 1`` events (the one more says whether the
        range goes on)."""
        read = list(self.read(dataset_id, start, end, limit + 1))
        more = len(read) > limit
        docs = [event_doc(i, f) for i, f in read[:limit]
                if not kinds or f.get("kind") in kinds]
        return docs, read[limit - 1][0] if more else None


    def budget_window(self, dataset_id: str, limit: int) -> BudgetWindow:
        """``Store.budget_window``: the whole stream (archived events too), ``complete``:
        Valkey keeps no index of the cap events, and the stream and the ledger hash are
        not read in one snapshot."""
        from service.storage.store import BudgetWindow  # store.py imports this module

        return BudgetWindow(self.events(dataset_id))

    def audit_range(self, since: datetime | None, until: datetime | None,
                    after: str | None) -> tuple[str, str]:
        """``Store.audit_range`` in stream ids: milliseconds since the epoch (earlier
        times clamped to 0), ``(`` for the exclusive start after a cursor's id."""
        if after is not None and (not _STREAM_ID.fullmatch(after)
                                  or int(after.partition("-")[0]) >= 2**64
                                  or int(after.partition("-")[2]) >= 2**64 - 1):
            raise Invalid("not a cursor this server returned", code="validation_error",
                          field="cursor")
        since_ms = max(0, int(since.timestamp() * 1000)) if since else -1
        start = f"{since_ms}-0" if since else "-"
        if after is not None and parse_id(after) >= (since_ms, 0):
            start = f"({after}"
        end = str(max(0, int(until.timestamp() * 1000))) if until else "+"
        return start, end

    # -- the dataset registry (``Store``) -----------------------------------------------

    def ping(self) -> None:
        self.r.ping()

    def dataset_document(self, dataset_id: str) -> str | None:
        raw = self.r.get(rkeys.dataset(dataset_id))
        return None if raw is None else str(raw)

    def dataset_documents(self, ids: list[str]) -> list[str | None]:
        return list(self.r.mget([rkeys.dataset(i) for i in ids])) if ids else []

    def dataset_for_pricing(self, dataset_id: str) -> tuple[str, set[str], str] | None:
        """The dataset's document and the measures its caps name (``named_measures``), in
        one round trip (a pipeline, not atomic, as the two reads it replaces were not:
        reserve.lua checks the measures again, atomically with the reservation). No stamp
        (''): reserve.lua does not check one, so no POST caches this read."""
        pipe = self.r.pipeline(transaction=False)
        pipe.get(rkeys.dataset(dataset_id))
        pipe.hkeys(rkeys.ledger(dataset_id))
        raw, fields = pipe.execute()
        if raw is None:
            return None
        return str(raw), {f[4:] for f in fields if f.startswith("cap:")}, ""

    def datasets_page(self, limit: int, after: index.Cursor | None = None,
                      granted: frozenset[str] | None = None
                      ) -> tuple[list[str], index.Cursor | None]:
        """``Store.datasets_page``: the registry's index read by rank, or, for a key
        limited to some datasets, their creation times in one ZMSCORE."""
        if granted is None:
            return index.page(self.r, [rkeys.DATASETS], limit, after)
        wanted = sorted(granted)
        scores = self.r.zmscore(rkeys.DATASETS, wanted) if wanted else []
        rows = [(i, s) for i, s in zip(wanted, scores, strict=True) if s is not None]
        return index.page_of(rows, limit, after)

    def dataset_count(self) -> int:
        return int(self.r.zcard(rkeys.DATASETS))

    def dataset_ids(self) -> list[str]:
        return list(self.r.zrange(rkeys.DATASETS, 0, -1))

    def same_shape_documents(self, columns: list[str], n_rows: int, exclude: str
                             ) -> list[str]:
        """``Store.same_shape_documents``: Valkey keeps no index of shapes, so every
        other document, oldest first (the caller checks each)."""
        ids = [i for i in self.dataset_ids() if i != exclude]
        return [doc for doc in self.dataset_documents(ids) if doc is not None]

    def set_dataset_status(self, dataset_id: str, status: str) -> str | None:
        """``Store.set_dataset_status``: a WATCH/MULTI compare-and-set of the document."""
        key = rkeys.dataset(dataset_id)
        with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        return None
                    doc = json.loads(raw)
                    doc["status"] = status
                    text = json.dumps(doc)
                    pipe.multi()
                    pipe.set(key, text)
                    pipe.execute()
                    return text
                except redis.WatchError:
                    continue

    def idempotency_record(self, key: str) -> tuple[str, str | None, int | None] | None:
        fingerprint, dataset_id, version = self.r.hmget(key, "fp", "id", "version")
        if fingerprint is None:
            return None
        return str(fingerprint), dataset_id, None if version is None else int(version)

    def record_holdout(self, dataset_id: str, rows: int) -> None:
        self.r.eval(_HOLDOUT_MAX, 1, _holdout_key(dataset_id), int(rows))

    def holdout_exposure(self, dataset_id: str) -> dict[str, int]:
        rows, count = self.r.hmget(_holdout_key(dataset_id), "rows", "releases")
        return {"rows": int(rows or 0), "releases": int(count or 0)}

    # -- reading releases (``Store``) ---------------------------------------------------

    def release(self, release_id: str) -> dict[str, str] | None:
        """``Store.release``: the release hash, its request and output read from the
        document store where a settle moved them (``release_documents.fields``)."""
        raw = self.r.hgetall(rkeys.release(release_id))
        return release_documents.fields(self.documents, release_id, raw) if raw else None

    def releases(self, ids: list[str]) -> list[tuple[str, dict[str, str]]]:
        pipe = self.r.pipeline(transaction=False)
        for release_id in ids:
            pipe.hgetall(rkeys.release(release_id))
        return [(release_id, release_documents.fields(self.documents, release_id, raw))
                for release_id, raw in zip(ids, pipe.execute(), strict=True) if raw]

    def release_page(self, view: ReleaseView, limit: int, after: index.Cursor | None = None
                     ) -> tuple[list[str], index.Cursor | None]:
        """``Store.release_page`` over the sorted-set indexes reserve.lua and settle.lua
        keep (those made before the indexes existed are indexed once, first)."""
        index.ensure_release_indexes(self.r, self.documents)
        per = {"pending": rkeys.dataset_pending, "failed": rkeys.dataset_failed,
               "all": rkeys.dataset_releases, "datasets": rkeys.dataset_releases}
        if view.kind == "key":
            keys = [rkeys.key_releases(view.key_id)]
        elif view.datasets is not None:
            keys = [per[view.kind](d) for d in sorted(view.datasets)]
        else:
            keys = [{"pending": rkeys.PENDING, "failed": rkeys.FAILED}.get(view.kind,
                                                                         rkeys.RELEASES)]
        return index.page(self.r, keys, limit, after, newest_first=view.kind != "pending",
                          phase=after.phase if after is not None else "")

    def dataset_history(self, dataset_id: str, newest: int
                        ) -> tuple[list[dict[str, str]], bool]:
        key = rkeys.dataset_releases(dataset_id)
        more = int(self.r.zcard(key)) > max(newest, 0)
        ids = self.r.zrange(key, -newest, -1) if newest > 0 else []
        pipe = self.r.pipeline(transaction=False)
        for release_id in ids:
            pipe.hmget(rkeys.release(release_id), "request", "status", "charged", "doc")
        out = []
        for release_id, (raw, status, charged, sha) in zip(ids, pipe.execute(), strict=True):
            h = {k: v for k, v in (("request", raw), ("doc", sha)) if v is not None}
            request = release_documents.request_of(self.documents, release_id, h)
            if request is None:
                continue
            row = {"request": json.dumps(request), "status": status or ""}
            if charged:
                row["charged"] = charged
            out.append(row)
        return out, more

    def kept_request(self, release_id: str) -> str | None:
        sha = self.r.hget(rkeys.release(release_id), release_documents.REQUEST_DIGEST)
        return None if sha is None else str(sha)

    # -- the sweeper (``Store``) --------------------------------------------------------

    def stale(self, older_than: float) -> list[tuple[str, float]]:
        return [(str(m), float(s)) for m, s in self.r.zrangebyscore(
            rkeys.PENDING, 0, time.time() - older_than, withscores=True)]

    def lease_held(self, release_id: str) -> bool:
        return bool(self.r.exists(rkeys.lease(release_id)))

    def unsent_ids(self) -> set[str]:
        return set(self.r.zrange(rkeys.OUTBOX, 0, -1))

    def claim_resend(self, release_id: str, max_resends: int) -> int:
        """``Store.claim_resend``: resend.lua, checked and counted in one step."""
        return int(self._resend(keys=[rkeys.release(release_id), rkeys.lease(release_id)],
                                args=[f"{time.time():.3f}", max_resends, "claim"]))

    def undo_resend(self, release_id: str) -> None:
        self._resend(keys=[rkeys.release(release_id), rkeys.lease(release_id)],
                     args=["", 0, "undo"])

    def drop_pending(self, release_id: str) -> None:
        """Out of the pending index, and of its dataset's (an entry the one-time backfill
        left behind for a release that ended while it ran)."""
        h = {k: v for k, v in zip(("request", "doc"), self.r.hmget(
            rkeys.release(release_id), "request", release_documents.REQUEST_DIGEST),
            strict=True) if v is not None}
        try:
            request = release_documents.request_of(self.documents, release_id, h)
        except release_documents.DocumentMissing:
            request = None
        pipe = self.r.pipeline(transaction=False)
        pipe.zrem(rkeys.PENDING, release_id)
        if request and request.get("dataset_id"):
            pipe.zrem(rkeys.dataset_pending(request["dataset_id"]), release_id)
        pipe.execute()

    # The Valkey store keeps no marks: the record is the broker's Valkey, and the sweeper
    # reads which messages wait from the queue lists themselves (O(backlog) a pass, as
    # before issue #29 item 7; this store is kept only for ``migrate-from-valkey``).

    def sweep_marks(self, older_than: float, witness_age: float, lapsed: float
                    ) -> SendMarks:
        """No marks: ``indexed`` False (the sweeper reads the queue lists)."""
        return SendMarks(older_than, indexed=False)

    def passed(self, marks: SendMarks, empty: Collection[str], limit: int,
               stranded: Collection[str] = (), waiting: Collection[str] = ()
               ) -> list[Passed]:
        """The pending releases older than ``marks.older_than`` whose id is not in
        ``waiting`` (the queue lists), oldest first, all ``gone``; a stranded one is
        among them (its message is in no list)."""
        return [Passed(release_id, "", created, 0, True)
                for release_id, created in self.stale(marks.older_than)
                if release_id not in waiting][:limit]

    def confirm_passed(self, passed: list[Passed]) -> None:
        """Nothing: no marks."""

    def held_by_workers(self, release_ids: Collection[str]) -> None:
        """Nothing: no marks."""

    def sending(self, release_id: str) -> None:
        """Nothing: no marks."""

    def sent(self, release_id: str) -> None:
        """Nothing: no marks."""


#: rows held out so far: the largest hold-out (DIP's default splits are nested, so the
#: rows that have served are those of the largest one) and how many releases used one
_HOLDOUT_MAX = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'rows') or '0')
if tonumber(ARGV[1]) > cur then redis.call('HSET', KEYS[1], 'rows', ARGV[1]) end
return redis.call('HINCRBY', KEYS[1], 'releases', 1)
"""
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def _holdout_key(dataset_id: str) -> str:
    return f"{rkeys.dataset(dataset_id)}:holdout"


def event_doc(event_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """An audit event as the API shows it: ``m:<measure>`` fields as integer ``units``."""
    doc: dict[str, Any] = {"id": event_id}
    units: dict[str, int] = {}
    for key, val in fields.items():
        if key.startswith("m:"):
            units[key[2:]] = int(val)
        elif key == "version":
            doc[key] = int(val)
        else:
            doc[key] = val
    doc["units"] = units
    return doc
