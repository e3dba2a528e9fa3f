"""The sweeper: re-send jobs that are gone, settle those that cannot be re-sent.

A job is gone when its release has not ended and nobody holds its lease, and either
it was running (its worker died or lost Valkey) and its message is not back in the
queue, or it was queued, its task was sent (it left the outbox) and its message is
neither waiting in its queue nor held by a worker in the broker's unacked set (the
broker lost it: kombu's Redis transport pops a message and records it as
unacknowledged in a second command, so a primary killed between the two loses it; or
Valkey lost its data), or only held, delivered over ``min_age`` ago and never started
(its worker died or lost its connection in a failover; kombu would put it back only
after its 15-minute visibility timeout). A message back in the queue (a worker killed
with -9 rejects it) is left to the redelivery, which re-runs the job.

**Which messages still wait is read by index, never by scanning the queues** (issue #29
item 7). A pass sends Valkey a fixed handful of commands (the queues' lengths, and the
unacked set, bounded by the messages workers hold: prefetch x workers, and retries
waiting for their countdown) and reads PostgreSQL by index ranges of what changed, not
O(backlog) either. kombu's Redis transport keeps each queue in a list: a publish, and
Celery's retry of a task (a new message), push at one end (LPUSH), workers pop at the
other (BRPOP), so each queue is first in, first out (no priorities are used: one list
per queue). kombu puts a popped message back only from the unacked set: at the front
after its visibility timeout or at a worker's warm shutdown (RPUSH), at the back when
a worker's process died mid-task (LPUSH). The marks are numbers of one PostgreSQL
sequence (migration 0008_sweep):

- a release's ``created_seq`` is taken when its row is inserted, before any of its
  messages is published;
- its ``sweep_seq``, taken by the sweeper once its last message is published: when the
  release is stale (``min(min_age, lost_age)`` s old) and out of the outbox (the API
  takes it out after publishing), when its run's lease lapsed that long ago (a killed
  process's message is back in the queue by then), when the sweeper's own publish
  returned (``Store.sweep_marks``, ``sending``, ``sent``).

A release a worker started ``lost_age`` s ago or more (priced, for the pricing queue) is
a witness: one of its messages was taken off the queue, a message published after its
``created_seq``. A release whose ``sweep_seq`` is below a witness's ``created_seq`` had
its last message published before the witness's, so taken off the queue before it,
``lost_age`` s ago at least: it waits no longer. A worker then holds it (the unacked
set says so), or started it (its status, its lease), or it was lost, unless a worker
put it back since. So it takes two: the first time the sweeper finds a release taken
past and held by no worker, it marks it again (phase 2); a message put back before that
second mark is in the queue then, and is taken before any witness of the second mark,
which shows it started or held. Only a release found taken past at its second mark and
held by no worker is gone (a held one loses its second mark: it may be put back). An
empty queue (LLEN, read with the unacked set in one MULTI, after the marks) shows at
once that none of its messages waits: every marked release of it that no worker holds
is gone.

The workers of the release and pricing queues run without kombu's acknowledgement
emulation (``queue.RESENT_QUEUES``): a message they pop is in no queue and no unacked
set while its job waits to start (milliseconds: one message per free process) or
runs (its lease speaks for it), so a worker that dies loses it, and the release is
found as any message the broker lost is, once the workers are past two of its marks or
its queue is empty: re-sent, or charged if its run had read the data. The unacked set
is read all the same: older workers, and a deployment's own, may keep messages there.

So a release merely waiting in a backlog is never re-sent: its mark stays above every
witness until the workers reach it. A message lost in a backlog is found once the
workers have gone past two of its marks, or once its queue is empty; while no worker
takes anything, nothing is found, and nothing would run sooner for it (a re-send waits
behind the same backlog). Two races are left, each costing one message too many (a
duplicate is harmless, but counts against ``max_resends``): a message taken, put back
and gone past twice between two passes (its workers shut down or killed twice within
seconds while holding it), and, as before, a message popped and not yet recorded as
unacknowledged (milliseconds) when a pass finds its queue empty.

Case by case:

- a backlog: its releases' marks stay above every witness until the workers reach them;
- a message the broker lost (popped and never recorded, a failover): its release is
  found once the workers are past two of its marks, or once its queue is empty;
- the broker wiped (its data directory deleted): the queues are empty, so every marked
  release is found at once (and the unmarked ones at the next pass, once marked);
- a worker killed mid-run: kombu put its message back at the end of the queue before
  the run's lease lapsed ``min(min_age, lost_age)`` s ago, and the release's mark is
  taken after that, so it stays above the witnesses until the workers reach the message,
  which runs the job again; only if that message was lost too is the release re-sent (or
  charged, had it read its data);
- a message prefetched by a worker that died (in kombu's unacked set): held, never
  passed; delivered over ``min_age`` ago and never started, it is stranded: re-sent;
- Celery's retry of a run (``LeaseHeld``: another run holds the lease) is a new message
  of a running release, which the live lease guards (a running release is judged only
  once its lease lapsed, and marked after that);
- pricing jobs: the same in the pricing queue, the releases a pricing job priced
  (``priced_at``) its witnesses; a priced release's marks are cleared (they were its
  pricing job's); a lost pricing job is sent again, uncounted;
- the outbox: a release still in it is never marked (its message may not be published
  yet); once the outbox's send published it, it is;
- a re-send racing the original: the claim, under the release's row lock, finds the run
  started (no re-send) or is seen by it; the release is marked as a send under way
  (phase 0) until the publish returned and marked after it, so no mark predates a
  message; of the two messages, start runs the job once;
- a wrong witness: a row inserted with a start it had before (``migrate-from-valkey``
  inserts the moved releases so, run with every worker stopped, so before any mark of
  the store it fills, normally) takes its ``created_seq`` after its message. Inserted
  after a release's first mark, it only marks that release a second time (the second
  mark needs a witness created after it); after its second mark, it would find it gone:
  one message too many.

A gone job that had not read its data is sent again (its task, same release
id), up to ``max_resends`` times (PRIVRELEASE_MAX_RESENDS, default 3), counted
on its release (``resends``, ``resent_at``: ``Store.claim_resend``); a job
re-sent less than ``min_age`` ago is left to that message. Only past the bound
is it aborted and refunded, with a message that says so. Re-sending is safe
however many messages a release ends up with: its original may only have been
delayed (a running job's message left in the unacked set comes back after
kombu's visibility timeout), but start runs a job once: a second message
finds the lease (the task waits and looks again) or the ended status (it does
nothing), and a run that lost its lease stores and settles nothing, so one
release has one output and one charge.

A gone job whose run had read the data (``data_read`` in its state, set
before the first byte is loaded) is not re-sent: it is charged and fails with
the one message of every failure after the data was read. Why a worker died
(a crash, memory) may depend on the data, so a refund could tell it, and a
re-run of the same data would likely die the same way (a redelivered message
re-runs it at most ``run.MAX_RUNS`` times). Either settles only
while no run holds a lease (in the settling step), so a run that started
meanwhile is never settled here. Outputs and commits are stored by one atomic
step, so a gone job never stored a result.

A reservation still in the outbox (its API died between reserve and enqueue)
is not gone but unsent: after ``submit.OUTBOX_GRACE`` seconds the sweeper
publishes its task instead of refunding it, so an accepted release always runs.
A release still ``pricing`` holds nothing: its pricing job is sent from the outbox
the same way, and sent again (uncounted: pricing reserves a release once) if its
message is neither waiting in the pricing queue nor held.

Hourly it also removes dataset files that no registration refers to: an
upload that could not learn whether the record stored its registration keeps
its files rather than risk metadata without files.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

import redis

from service import datasets
from service.releases.queue import PRICING_QUEUE, RELEASES_QUEUE, Queue
from service.releases.run import FAILED_AFTER_READ
from service.releases.submit import OUTBOX_GRACE, enqueue
from service.storage import rkeys
from service.storage.dataset_files import DatasetStore
from service.storage.ledger import NO_LEASE
from service.storage.objects import ObjectStoreError
from service.storage.release_tables import OutputStore
from service.storage.store import DOWN, PRICING, RUN, Store
from service.wiring import Services

log = logging.getLogger("privrelease.sweeper")

#: the kind of message (``Store.passed``) whose queue each list is
KINDS = {RELEASES_QUEUE: RUN, PRICING_QUEUE: PRICING}
UNACKED = "unacked"  # kombu's Redis transport keeps unacknowledged messages here
UNACKED_INDEX = "unacked_index"  # ... and when it delivered each (delivery tag: epoch s)
LOCK = rkeys.P + "sweeper:lock"
ORPHAN_LOCK = rkeys.P + "sweeper:orphans"
#: what an hourly orphan sweep survives: a file system or the record away for a moment
HICCUPS: tuple[type[Exception], ...] = (OSError, *DOWN)
#: ... and the object store's errors, for the orphan sweeps (they list and delete objects)
SWEEP_HICCUPS: tuple[type[Exception], ...] = (*HICCUPS, ObjectStoreError)
#: seconds between sweeps for dataset files without metadata (one worker at a time)
ORPHAN_INTERVAL = 3600.0
#: times a gone job that had not read its data is re-sent before it is refunded
MAX_RESENDS = 3
#: seconds a queued release's message may be missing from the broker (in neither queue
#: nor the unacked set) before it is taken as lost and re-sent: a message is missing
#: otherwise only between kombu's pop and its unacked record (milliseconds), and a
#: second message is harmless (start runs a release once). Also how long ago a witness
#: must have started (its queue popped everything before it that long ago)
LOST_AGE = 5.0
#: gone releases dealt with per pass at most (the rest the next pass): a pass stays
#: short after Valkey lost every message of a large backlog
PASS_LIMIT = 1000


#: a release id as it appears in a message (its task id, and its args): the service's
#: ``rel_`` + hex, and any id of the same alphabet; a pricing task's id adds ``.pricing``
RELEASE_ID = re.compile(r"rel_[A-Za-z0-9_]+")


@dataclass(frozen=True)
class Broker:
    """What one MULTI read of the broker says: the kinds of message whose queue is
    empty (``store.RUN``, ``store.PRICING``), and when each release's messages that
    workers hold (kombu's unacked set) were delivered (epoch s; None where kombu's
    index has none)."""

    empty: frozenset[str]
    held: dict[str, list[float | None]]


def _broker(client: redis.Redis) -> Broker:
    """The queues' lengths and the unacked set with its delivery times, in one MULTI
    (one moment of the broker: a message put back from the unacked set into a queue is
    seen in one or the other). O(held messages): no queue list is read."""
    pipe = client.pipeline(transaction=True)
    for name in KINDS:
        pipe.llen(name)
    pipe.hgetall(UNACKED)
    pipe.zrange(UNACKED_INDEX, 0, -1, withscores=True)
    *lengths, messages, index = pipe.execute()
    at = dict(index)
    held: dict[str, list[float | None]] = {}
    for tag, message in messages.items():
        for release_id in set(RELEASE_ID.findall(message)):
            held.setdefault(release_id, []).append(at.get(tag))
    empty = frozenset(kind for kind, length in zip(KINDS.values(), lengths, strict=True)
                      if not length)
    return Broker(empty, held)


def _stranded(release_id: str, delivered: dict[str, list[float | None]],
              before: float) -> bool:
    """Whether every unacknowledged message of the release was delivered before
    ``before``: with one task at a time per worker process (acks late, prefetch 1), a
    queued release whose message a worker took that long ago and never started was
    taken by a worker that died or lost its connection (a failover); kombu would put it
    back only after its visibility timeout (15 min)."""
    times = delivered.get(release_id, [])
    return bool(times) and all(t is not None and t <= before for t in times)


def send_outbox(ledger: Store, queue: Queue, grace: float = OUTBOX_GRACE) -> list[str]:
    """Publish the task of every release left in the outbox over ``grace`` s ago whose
    release is still queued; returns their ids. One whose send fails stays for the next
    pass; one that ended (or vanished) only leaves the outbox."""
    sent = []
    for release_id in ledger.outbox(grace):
        status = (ledger.release(release_id) or {}).get("status")
        if status not in {"queued", "pricing"}:
            ledger.enqueued(release_id)
            continue
        try:
            enqueue(queue, ledger, release_id, pricing=status == "pricing")
        except Exception as err:  # the broker is down: the outbox keeps it
            log.warning("outbox send failed", extra={"release_id": release_id,
                                                      "error_type": type(err).__name__})
            continue
        log.warning("sent a release left in the outbox", extra={"release_id": release_id})
        sent.append(release_id)
    return sent


def sweep(client: redis.Redis, ledger: Store, queue: Queue, min_age: float = 30.0,
          outputs: OutputStore | None = None, grace: float = OUTBOX_GRACE,
          max_resends: int = MAX_RESENDS, lost_age: float = LOST_AGE) -> list[str]:
    """One pass; returns the ids it settled (refunded, or charged if the data was read).

    First sends the outbox's tasks, then marks what was published and reads which
    releases are gone (the module docstring), and deals with those older than
    ``min_age``, never one still in the outbox: re-sends one that did not read its data
    (at most ``max_resends`` times, each at least ``min_age`` after the last), settles
    the rest; ``outputs``: remove the tables runs of a settled job stored before they
    died. A queued (or pricing) release whose message the broker lost is re-sent
    sooner, once it is ``lost_age`` old (and ``lost_age`` after its last re-send); it is
    refunded only on the ``min_age`` pace.
    """
    send_outbox(ledger, queue, grace)
    now = time.time()
    older = min(min_age, lost_age)
    marks = ledger.sweep_marks(older, lost_age, older)
    broker = _broker(client)
    held = broker.held
    if held:
        ledger.held_by_workers(held)
    stranded = [rid for rid in held if _stranded(rid, held, now - min_age)]
    found = ledger.passed(marks, broker.empty, PASS_LIMIT, stranded=stranded)
    # taken past once and held by no worker: marked again (a run's message held by a
    # worker is no sign of life: the run's lease is)
    once = [p for p in found if not p.gone and (p.status == "running" or p.release_id not in held)]
    if once:
        ledger.confirm_passed(once)
    gone = [p for p in found if p.gone]
    if not gone:
        return []
    unsent = ledger.unsent_ids()
    aborted = []
    for p in gone:
        release_id = p.release_id
        young = p.created > now - min_age  # only its lost message is dealt with yet
        h = ledger.release(release_id)
        if h is None or "request" not in h:
            ledger.drop_pending(release_id)
            continue
        status, raw = h.get("status"), h["request"]
        data_read, resent_at = h.get("data_read"), h.get("resent_at")
        if ledger.lease_held(release_id):
            continue
        if (status == "queued" and release_id in held
                and not _stranded(release_id, held, now - min_age)):
            continue  # prefetched by a worker that may still start it
        if status in {"queued", "pricing"} and release_id in unsent:
            continue  # accepted, its task not yet sent: a pass after its grace sends it
        if status == "pricing":
            # holds nothing, so nothing to settle: its pricing job's message was lost (the
            # broker lost it, or a run failed on a Valkey error): send it again (pricing is
            # idempotent: the release is reserved at most once)
            if release_id not in held:
                _send_pricing(ledger, queue, release_id)
            continue
        if status not in {"queued", "running"}:
            ledger.drop_pending(release_id)
            continue
        if young and status != "queued":
            continue  # a running job is judged by its lease, on the min_age pace
        if resent_at is not None and float(resent_at) > now - (lost_age if young else min_age):
            continue  # re-sent lately: its message may be on its way to a worker
        reason = "worker died" if status == "running" else "job message lost"
        dataset_id = json.loads(raw)["dataset_id"]
        if data_read:
            settled = ledger.charge_gone(dataset_id, release_id,
                                         json.dumps(FAILED_AFTER_READ), "sweeper")
        else:
            sent = _resend(ledger, release_id, max_resends, queue, reason)
            if sent is not None or young:  # a refund waits for the min_age pace
                continue
            error = json.dumps({"message": f"job gone ({reason}) after {max_resends}"
                                           " re-sends; reservation refunded"})
            settled = ledger.abort(dataset_id, release_id, error, "sweeper",
                                   holder=NO_LEASE)
        if settled:
            log.warning("swept job", extra={"release_id": release_id, "reason": reason,
                                            "charged": bool(data_read)})
            aborted.append(release_id)
            if outputs is not None:
                outputs.prune(release_id, keep=None)
            if ledger.documents is not None:  # result files of runs that died uncommitted
                ledger.documents.prune(release_id, keep_result=None,
                                       keep_request=ledger.kept_request(release_id))
    return aborted


def _send_pricing(ledger: Store, queue: Queue, release_id: str) -> None:
    """Publish a pricing release's job again, marked as a send under way until the
    publish returned (then marked after it)."""
    ledger.sending(release_id)
    try:
        enqueue(queue, ledger, release_id, pricing=True)
    except Exception as err:  # the broker is down: the next pass retries
        log.warning("pricing job resend failed",
                    extra={"release_id": release_id, "error_type": type(err).__name__})
    else:
        log.warning("resent a lost pricing job", extra={"release_id": release_id})
    finally:
        ledger.sent(release_id)


def _resend(ledger: Store, release_id: str, max_resends: int, queue: Queue,
            reason: str) -> int | None:
    """Publish a gone job's task again if its bound allows (``Store.claim_resend`` claims
    the re-send, atomically with the checks that it is still gone and unread, and marks
    a send under way); returns the re-send's number, 0 if it is no longer gone or the
    broker failed (the next pass looks again), None if the bound is reached (refund
    it)."""
    claimed = ledger.claim_resend(release_id, max_resends)
    if claimed < 0:
        return None
    if claimed == 0:
        return 0
    try:
        enqueue(queue, ledger, release_id)
    except Exception as err:  # the broker is down: give the claim back for the next pass
        ledger.undo_resend(release_id)
        log.warning("job resend failed", extra={"release_id": release_id,
                                                 "error_type": type(err).__name__})
        return 0
    ledger.sent(release_id)  # marked after its publish returned
    log.warning("resent a gone job", extra={"release_id": release_id, "reason": reason,
                                            "resend": claimed})
    return claimed


def sweep_if_due(svc: Services, interval: float,
                 max_resends: int = MAX_RESENDS) -> list[str]:
    """Sweep unless another worker swept within ``interval`` (a Redis lock)."""
    if not svc.client.set(LOCK, "1", nx=True, px=max(int(interval * 1000), 1)):
        return []
    return sweep(svc.client, svc.ledger, svc.queue,
                 min_age=max(2 * svc.ledger.lease_seconds, 1), outputs=svc.outputs,
                 max_resends=max_resends)


def sweep_orphans_if_due(client: redis.Redis, ledger: Store, store: DatasetStore
                         ) -> list[str]:
    """Hourly, one worker at a time: remove dataset files no registration refers to
    (``sweep_orphans``)."""
    if not client.set(ORPHAN_LOCK, "1", nx=True, px=int(ORPHAN_INTERVAL * 1000)):
        return []
    return sweep_orphans(ledger, store)


def sweep_orphans(ledger: Store, store: DatasetStore,
                  older_than: float = ORPHAN_INTERVAL) -> list[str]:
    """Remove the versions of unregistered datasets, then the versions of registered
    datasets whose number is not registered, both untouched for ``older_than`` s; returns
    what went (``<id>`` for a dataset, ``<id>/v<k>`` for a version). Files whose
    registration can not be read stay (the record away, or the object store: all of
    them, until the next hour).
    """
    try:
        registered = set(ledger.dataset_ids())
        removed = store.sweep_orphans(registered, older_than)
    except SWEEP_HICCUPS as err:  # a hiccup: try again next hour
        log.warning("orphan sweep failed", extra={"error": type(err).__name__})
        return []
    for dataset_id in removed:
        log.warning("removed unregistered dataset files", extra={"dataset_id": dataset_id})
    try:
        versions = store.sweep_orphan_versions(
            registered, lambda ids: registered_versions(ledger, ids), older_than)
    except SWEEP_HICCUPS as err:
        log.warning("orphan version sweep failed", extra={"error": type(err).__name__})
        return removed
    for dataset_id, version in versions:
        log.warning("removed unregistered version files",
                    extra={"dataset_id": dataset_id, "version": version})
    return [*removed, *(f"{d}/v{v}" for d, v in versions)]


#: dataset documents read per round trip by ``registered_versions``
DOC_BATCH = 200


def registered_versions(ledger: Store, ids: list[str]) -> dict[str, set[int]]:
    """Each dataset's registered version numbers, from its document (``datasets``); a
    dataset whose document is missing or unreadable is left out (its files stay)."""
    out: dict[str, set[int]] = {}
    for start in range(0, len(ids), DOC_BATCH):
        batch = ids[start:start + DOC_BATCH]
        for dataset_id, raw in zip(batch, ledger.dataset_documents(batch), strict=True):
            if raw is None:
                continue
            try:
                out[dataset_id] = {int(e["version"])
                                   for e in datasets.versions_of(json.loads(raw))}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return out
