"""Submitting a release: price, reserve, enqueue. Written once, for the API's POST and
for the pricing job of a release whose cost needed a cold precomputation.

The sequence: ``pricing.prepare`` (every check, the cost from public inputs), one
``Ledger.reserve`` (caps, allocations, notion lock, retired version, replay and
idempotency, atomically; the release enters the outbox), then the run's message
(``enqueue``), which takes it out of the outbox. A refused reservation raises the
domain error the caller answers; a message that cannot be published refunds the
reservation, or, when Valkey went away too, leaves it in the outbox for the sweeper.

The POST takes its release out of the outbox off the request path: once the message is
published, the id goes to the process's ``OutboxFlusher``, which deletes the published
ids in one statement every ``OUTBOX_FLUSH_SECONDS`` (sooner when ``OUTBOX_FLUSH_BATCH``
wait), and once more when the process exits. A process that dies first leaves its rows:
the sweeper re-sends them after ``OUTBOX_GRACE``, a second message of a release that is
harmless (``Store.mark_running`` runs a release once; a run also takes its release out
of the outbox). Every other sender (the sweeper, a pricing job, a replay's re-send)
takes the release out at once, as before.

A release whose cost needs a heavy precomputation missing from the shared store is
created ``pricing`` after every cheap check; its pricing job (``price``) prepares the
request again in a worker, computing what was missing, and reserves it through the same
script (mode ``priced``), which reserves a release at most once: a redelivered or
doubled job finds it no longer pricing and changes nothing. A refusal there ends the
release ``refused`` with the problem the synchronous POST would have answered; nothing
was held, so nothing is charged or refunded. Only public inputs are involved (the
request, the dataset's metadata, the ledger), so what the caller learns does not depend
on the data.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import secrets
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

import mechanisms
from service import budget, datasets, notify
from service.errors import (
    BudgetExhausted,
    Conflict,
    Failed,
    Invalid,
    NotFound,
    Retired,
    ServiceError,
    Unavailable,
    idempotency_mismatch,
)
from service.releases import dataset_cache, documents, pricing
from service.releases.queue import Queue
from service.releases.request import JobRequest
from service.storage import rkeys
from service.storage.ledger import Outcome, Reservation, ReserveResult, now_iso
from service.storage.store import DOWN, Store
from service.wiring import Services

log = logging.getLogger("privrelease.pricing")

#: the actor the audit stream names for a refusal by a pricing job
ACTOR = "pricing"
#: seconds a reservation may wait in the outbox before a retry or the sweeper sends its
#: task: longer than a live API takes between reserve and publish (a slow broker), and a
#: task sent twice is harmless anyway (``Store.mark_running`` runs a release once)
OUTBOX_GRACE = 5.0
#: Retry-After (s) of a 202 ``pricing`` answer to an estimate
PRICING_RETRY_AFTER = 2
#: seconds a cold estimate's job marker lives (the job removes it when done): while it
#: lives, identical cold estimates enqueue nothing more; if the job was lost, the next
#: estimate after it expires sends another
ESTIMATE_JOB_TTL = 120
#: fresh reads a POST may take after its cached one (``dataset_cache``) before a 503
FRESH_ROUNDS = 2


#: seconds between an ``OutboxFlusher``'s deletes of published releases' outbox rows
OUTBOX_FLUSH_SECONDS = 0.1
#: published releases that make a flusher delete at once, without waiting its seconds
OUTBOX_FLUSH_BATCH = 256
#: most ids a flusher keeps while its deletes fail (the record away); beyond, the rows
#: stay and the sweeper re-sends those releases after OUTBOX_GRACE (a harmless message)
OUTBOX_FLUSH_KEEP = 100_000


def new_id() -> str:
    return "rel_" + secrets.token_hex(12)


class OutboxFlusher:
    """Takes published releases out of one store's outbox in batches, off the request
    path: ``sent`` queues an id; a thread of this process (started by the first ``sent``
    after a fork: gunicorn's workers each get their own) deletes what was queued in one
    ``Store.enqueued_many`` every ``seconds``, or at once when ``batch`` ids wait; the
    process's exit flushes what is left (``flush_outbox``, atexit). A failed delete (the
    record away) keeps its ids for the next round, at most ``OUTBOX_FLUSH_KEEP``."""

    def __init__(self, ledger: Store, seconds: float = OUTBOX_FLUSH_SECONDS,
                 batch: int = OUTBOX_FLUSH_BATCH) -> None:
        self.ledger, self.seconds, self.batch = ledger, seconds, batch
        self._reset()

    def _reset(self) -> None:
        """No thread and nothing queued (a new flusher, or its copy in a forked child:
        the parent's thread did not come along, and its lock may have been held)."""
        self._lock = threading.Lock()
        self._ids: list[str] = []
        self._wake = threading.Event()
        self._pid = 0
        self._failing = False

    def sent(self, release_id: str) -> None:
        """The release's task is published: take it out of the outbox in the next batch."""
        with self._lock:
            self._ids.append(release_id)
            waiting = len(self._ids)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="outbox-flusher", daemon=True).start()
        if waiting >= self.batch:
            self._wake.set()

    def _run(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            self._wake.wait(self.seconds)
            self._wake.clear()
            self.flush()

    def flush(self) -> int:
        """Delete the queued ids' outbox rows now (one statement); how many."""
        with self._lock:
            ids, self._ids = self._ids, []
        if not ids:
            return 0
        try:
            self.ledger.enqueued_many(ids)
        except Exception as err:  # the record away: the next round tries again
            if not self._failing:  # once per outage, not every round
                log.warning("outbox flush failed", extra={"error_type": type(err).__name__,
                                                          "releases": len(ids)})
            self._failing = True
            with self._lock:
                room = max(0, OUTBOX_FLUSH_KEEP - len(self._ids))
                self._ids[:0] = ids[:room]
            return 0
        self._failing = False
        return len(ids)


#: each store's flusher in this process
_FLUSHERS: weakref.WeakKeyDictionary[Any, OutboxFlusher] = weakref.WeakKeyDictionary()
_FLUSHERS_LOCK = threading.Lock()


def outbox_flusher(ledger: Store) -> OutboxFlusher:
    """The process's flusher of ``ledger``'s outbox (made on first use)."""
    flusher = _FLUSHERS.get(ledger)
    if flusher is None:
        with _FLUSHERS_LOCK:
            flusher = _FLUSHERS.setdefault(ledger, OutboxFlusher(ledger))
    return flusher


def flush_outbox() -> int:
    """Flush every flusher of this process now (at exit; tests): how many were deleted."""
    return sum(flusher.flush() for flusher in list(_FLUSHERS.values()))


def _after_fork() -> None:
    global _FLUSHERS_LOCK
    _FLUSHERS_LOCK = threading.Lock()
    for flusher in list(_FLUSHERS.values()):
        flusher._reset()


atexit.register(flush_outbox)
os.register_at_fork(after_in_child=_after_fork)


def enqueue(queue: Queue, ledger: Store, release_id: str, *, pricing: bool = False,
            outbox: OutboxFlusher | None = None) -> None:
    """Publish the release's task (its pricing job while it is ``pricing``), then take it
    out of the outbox: at once, or, given ``outbox`` (the POST's), in that flusher's next
    batch. An error leaves it there, for the sweeper or a retry to send."""
    if pricing:
        queue.price(release_id)
    else:
        queue.run(release_id)
    if outbox is not None:
        outbox.sent(release_id)
    else:
        ledger.enqueued(release_id)


def refusal(res: ReserveResult) -> ServiceError | None:
    """The error of a reservation the ledger refused (None if it was not refused); the
    same for the API and for a pricing job (then the release ends ``refused`` with it)."""
    if res.outcome == "exhausted" and not res.listed:
        return BudgetExhausted(
            f"your allocation does not list {res.measure}: an allocation that lists some"
            " measures allows none of the others; nothing was spent",
            measure=res.measure, scope="allocation", listed=False,
            requested=budget.display(res.measure, res.requested), remaining=0.0)
    if res.outcome == "exhausted":
        whose = "your allocation of" if res.scope == "allocation" else "the dataset's"
        return BudgetExhausted(
            f"not enough of {whose} {res.measure} budget left", measure=res.measure,
            scope=res.scope, requested=budget.display(res.measure, res.requested),
            remaining=budget.display(res.measure, max(res.remaining, 0)))
    if res.outcome == "retired":
        return Retired("dataset is retired")
    if res.outcome == "version_retired":  # retired after ``prepare`` read the document
        return Retired(datasets.VERSION_RETIRED, code="version_retired", field="version")
    if res.outcome == "not_admitted":  # ``prepare`` checked it too: the script again, atomically
        return pricing.not_admitted(res.measure)
    if res.outcome == "notion_locked":
        return Conflict(
            f"this dataset has had {res.notion} releases and admits one notion at a time"
            " (noiseless and DP outputs together have no finite guarantee in either); nothing"
            " was spent", code="notion_locked", notion=res.notion)
    return None


def prepare(svc: Services, body: dict[str, Any], *, api: bool,
            found: dataset_cache.PricingRead | None = None) -> pricing.Prepared:
    """``pricing.prepare`` with this server's limits; in the API (``api``) a cold
    precomputation raises ``pricing.Unpriced`` instead of running. ``found``: the
    dataset's pricing read, if the caller has it."""
    config = svc.config
    scope = (pricing.api_scope(config, svc.precomputed) if api
             else pricing.worker_scope(config, svc.precomputed))
    with scope:
        return pricing.prepare(svc.ledger, body, allow_seeds=config.allow_seeds,
                               max_work=config.max_release_work,
                               max_memory=config.worker_memory,
                               distributed=config.spark_remote is not None, found=found)


@dataclass(frozen=True)
class Submitted:
    """What a POST answers: the release (ours, or the earlier one a retry or a replay
    found), how it was found, and its document."""

    release_id: str
    #: ``queued`` or ``pricing`` (ours, sent), ``replay`` (an identical earlier release),
    #: ``idempotent`` (the release this Idempotency-Key created)
    outcome: str
    document: dict[str, Any]


def _nothing() -> None:
    return None


def submit(svc: Services, body: dict[str, Any], *, actor: str,
           idempotency_key: str | None, on_cold: Callable[[], None] = _nothing,
           fresh: int = 0) -> Submitted:
    """Validate, reserve the cost atomically, enqueue (the synchronous POST).

    ``on_cold`` runs when the cost needs a cold precomputation (the API counts it against
    the estimate rate limit: a pricing job is a cold estimate's work).

    The dataset's registry read comes from the process's ``dataset_cache``; a cached read
    that refuses, or that the reservation finds ``stale``, is replaced by a fresh one and
    the request judged again (``fresh`` counts those rounds: at most ``FRESH_ROUNDS``).
    """
    config, ledger = svc.config, svc.ledger
    callback = body.get("callback_url")
    if callback is not None and (why := notify.check_url(callback, config.callback_hosts)):
        raise Invalid(f"callback_url {why}", field="callback_url")
    cache = dataset_cache.cache_for(ledger)
    read = None if fresh else cache.get(body["dataset_id"])
    cached = read is not None
    if read is None:
        read = cache.read(ledger, body["dataset_id"])
        if read is None:
            raise pricing.no_such_dataset()

    def again() -> Submitted:
        cache.drop(body["dataset_id"])
        if fresh >= FRESH_ROUNDS:
            raise Unavailable("the dataset's registry changed while this request was"
                              " priced; nothing was spent, retry")
        return submit(svc, body, actor=actor, idempotency_key=idempotency_key,
                      on_cold=on_cold, fresh=fresh + 1)

    at, release_id = now_iso(), new_id()
    ours: Outcome
    try:
        job = prepare(svc, body, api=True, found=read)
        mechanism, params = job.mechanism, job.params
        request_json = job.job().to_json()
        reservation = Reservation(
            job.dataset["id"], release_id, job.cost_units, actor, job.request_fingerprint,
            request_json, replay_fingerprint=job.fingerprint, notion_lock=job.notion_lock)
        ours = "reserved"
    except pricing.Unpriced as unpriced:
        on_cold()
        mechanism, params = mechanisms.get(unpriced.request.mechanism), unpriced.request.params
        request_json = unpriced.request.job().to_json()
        reservation = Reservation(unpriced.request.dataset["id"], release_id, {}, actor,
                                  unpriced.request.fingerprint, request_json, replay=False,
                                  mode="pricing")
        ours = "pricing"
    except ServiceError:
        if cached:  # judged on a cached read: the registry may have changed since
            return again()
        raise
    dataset_id = reservation.dataset_id
    # a store that could not take the output now: 507 or 503 (an OSError, or the object
    # store unavailable, which the API answers), before anything is held; a run checks
    # again before it reads the data. Only where the output needs one: a table goes to
    # the object store, a result to a file on a store without ``results_inline``; a
    # summary's output on PostgreSQL goes into the record with its commit
    if not ledger.results_inline:
        svc.documents.check_room()
    if mechanism.writes_table(params):
        svc.outputs.check_room()
    res = ledger.reserve(dataclasses.replace(
        reservation, idempotency_key=idempotency_key, idempotency_ttl=config.idempotency_ttl,
        at=at, stamp=read[2]))
    if res.outcome == "stale":  # priced on a read the registry has moved past
        return again()
    if res.release_id == release_id and res.outcome in {"replay", "idempotent"}:
        # our own reservation, re-sent after a lost reply (the record restarting): it
        # must be enqueued, not answered as someone else's release
        res = dataclasses.replace(res, outcome=ours)
    refused = refusal(res)
    if refused is not None:
        raise refused
    if res.outcome == "idem_mismatch":
        raise idempotency_mismatch()
    if res.outcome in {"replay", "idempotent"}:
        doc = documents.document(ledger, res.release_id)
        if doc is None:
            raise NotFound("no such release")
        if ledger.unsent(res.release_id, OUTBOX_GRACE):
            # the first request's API died between reserve and enqueue: send it now, so the
            # release this retry is answered with runs (a second message would be harmless)
            enqueue(svc.queue, ledger, res.release_id, pricing=doc["status"] == "pricing")
            log.warning("sent a release left in the outbox",
                        extra={"release_id": res.release_id})
        return Submitted(res.release_id, res.outcome, doc)
    try:
        enqueue(svc.queue, ledger, res.release_id, pricing=res.outcome == "pricing",
                outbox=outbox_flusher(ledger))
    except Exception:
        _unsend(svc, dataset_id, res, actor)
        raise Unavailable("job queue unavailable; nothing was spent") from None
    # no round trip: the document of a just-accepted release is known here
    status = "pricing" if res.outcome == "pricing" else "queued"
    fields = {"status": status, "request": request_json, "created_at": at}
    return Submitted(res.release_id, status, documents.render(res.release_id, fields))


def _unsend(svc: Services, dataset_id: str, res: ReserveResult, actor: str) -> None:
    """A reservation whose message could not be published: refunded (aborted, or a
    ``pricing`` one refused), or, when Valkey went away too, left in the outbox."""
    try:
        if res.outcome == "pricing":
            err = Unavailable("job queue unavailable; nothing was spent")
            svc.ledger.refuse(dataset_id, res.release_id, json.dumps(err.problem()), err.code,
                              actor)
        else:
            svc.ledger.abort(dataset_id, res.release_id, '{"message": "could not enqueue"}',
                             actor)
    except Exception:  # the record went away too: the outbox keeps it
        log.warning("reservation left in the outbox", extra={"release_id": res.release_id})
        raise Unavailable("service unavailable; the release may still run: retry with the"
                          " same Idempotency-Key to learn its state") from None


def price(svc: Services, release_id: str) -> str:
    """Price, reserve and enqueue a ``pricing`` release, or refuse it (its pricing job).

    Returns 'priced' (reserved and its run sent), 'refused', 'skipped' (it had left
    ``pricing``: reserved by an earlier run of this job, or cancelled) or 'missing'.
    A Valkey or broker error propagates: the release stays where it was (pricing, or
    reserved in the outbox) for the sweeper to send again.
    """
    ledger = svc.ledger
    h = ledger.release(release_id)
    if h is None:
        return "missing"
    status, raw, actor = h.get("status"), h.get("request", ""), h.get("actor")
    if status != "pricing":
        if status == "queued" and ledger.unsent(release_id, 0.0):
            # an earlier run reserved it and died before sending its run: send it now
            enqueue(svc.queue, ledger, release_id)
        return "skipped"
    stored = JobRequest.from_json(raw)
    assert stored.body is not None  # a pricing release keeps its body until priced
    res: ReserveResult | None = None
    problem: ServiceError | None
    try:
        job = prepare(svc, stored.body, api=False)
        res = ledger.reserve(Reservation(
            stored.dataset_id, release_id, job.cost_units, actor or "",
            job.request_fingerprint, job.job().to_json(), mode="priced",
            replay_fingerprint=job.fingerprint, notion_lock=job.notion_lock))
        problem = refusal(res)
        if res.outcome == "replay":  # the synchronous POST answers with that release
            problem = Conflict("an identical request was released before (release_id);"
                               " nothing was spent", code="replayed",
                               release_id=res.release_id)
    except ServiceError as err:  # refused as the POST would have been
        problem = err
    except DOWN:
        raise
    except SoftTimeLimitExceeded:
        problem = Unavailable("computing the cost took longer than this server's time"
                              " limit", code="time_limit")
    except Exception as err:  # a bug: public inputs only, so its type may be told
        log.error("pricing failed", extra={"release_id": release_id,
                                           "error_type": type(err).__name__})
        problem = Failed(f"computing the cost failed ({type(err).__name__})",
                         code="pricing_failed")
    if problem is not None:
        if not ledger.refuse(stored.dataset_id, release_id, json.dumps(problem.problem()),
                             problem.code, ACTOR):
            return "skipped"  # cancelled meanwhile
        log.info("priced release refused", extra={"release_id": release_id,
                                                  "code": problem.code})
        return "refused"
    assert res is not None
    if res.outcome != "reserved":  # 'ended': cancelled, or reserved by another run
        return "skipped"
    enqueue(svc.queue, ledger, release_id)  # an error leaves it in the outbox
    return "priced"


def request_estimate(svc: Services, unpriced: pricing.Unpriced) -> None:
    """Send a cold estimate's job unless one for the same precomputation is under way (a
    Valkey SET NX with expiry: 16 identical cold estimates, one job)."""
    job_key = unpriced.key or unpriced.request.fingerprint
    marker = rkeys.pricing_job(job_key)
    if svc.client.set(marker, "1", nx=True, ex=ESTIMATE_JOB_TTL):
        try:
            svc.queue.estimate(json.dumps(unpriced.request.body), marker)
        except Exception:
            svc.client.delete(marker)
            raise Unavailable("job queue unavailable; retry shortly") from None


def precompute_estimate(svc: Services, body_json: str, marker: str) -> str:
    """Compute a cold estimate's heavy precomputation into the shared store, so the
    caller's retry is warm; then drop the job's marker (``rkeys.pricing_job``).

    A refusal is not reported here: the retry prepares the request again and answers it
    (interval calibrations store their refusals too)."""
    try:
        prepare(svc, json.loads(body_json), api=False)
        return "computed"
    except ServiceError:
        return "refused"
    finally:
        svc.client.delete(marker)
