"""The named Celery tasks: each a few lines calling the service, with its retry and
time policy at the decorator. Task names come from ``service.releases.queue``.

What a task does lives in the service (``service.releases.run``, ``.submit``,
``service.analyses``, ``service.notify``), which can be run and tested without Celery;
what is Celery's stays here: redelivery (``acks_late``), retries, and stopping a
cancelled analysis inside the pool's process.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

import mechanisms
from service import analyses, notify
from service.config import Config
from service.releases import queue, run, submit
from service.storage.analysis_store import AnalysisStore
from service.storage.store import DOWN
from service.wiring import Services, build
from workers.celery_app import app

# Load every mechanism (and scipy) once in the parent, before the pool forks,
# so the first job of each child does not pay for the imports.
mechanisms.names()


@cache
def services() -> Services:
    """Per-process clients, created after fork (never shared with the parent)."""
    return build(Config.from_env(), "worker", celery=app)


@app.task(name=queue.RUN_RELEASE, bind=True, acks_late=True, max_retries=None)
def run_release(self: Task, release_id: str) -> str:
    """Run the release; then, if it asked for one, send its notification."""
    svc = services()
    try:
        ran = run.run_job(svc, release_id, self.request.hostname or "worker")
    except run.LeaseHeld as held:
        raise self.retry(countdown=svc.config.lease_seconds, max_retries=None) from held
    # the callback from the request the run read: no second read of the release
    if ran.status in {"succeeded", "failed"} and ran.callback_url:
        svc.queue.notify(release_id)
    return ran.status


@app.task(name=queue.NOTIFY, bind=True, acks_late=True, max_retries=8,
          autoretry_for=(notify.DeliveryError,), retry_backoff=2, retry_backoff_max=600,
          retry_jitter=True)
def send_notification(self: Task, release_id: str) -> bool:
    """POST the release document to its callback_url, signed; retried with backoff."""
    svc = services()
    return notify.deliver(svc.keys, svc.ledger, svc.config, release_id)


@app.task(name=queue.PRICE_RELEASE, bind=True, acks_late=True)
def price_release(self: Task, release_id: str) -> str:
    """Compute a ``pricing`` release's cost, reserve it (once), queue its run; or end it
    ``refused`` and send its notification."""
    svc = services()
    status = submit.price(svc, release_id)
    if status == "refused" and notify.wanted(svc.ledger, release_id):
        svc.queue.notify(release_id)
    return status


@app.task(name=queue.PRECOMPUTE_ESTIMATE, bind=True, acks_late=True)
def precompute_estimate(self: Task, body_json: str, marker: str) -> str:
    """Compute a cold estimate's heavy precomputation into the shared store."""
    return submit.precompute_estimate(services(), body_json, marker)


@app.task(name=queue.RUN_ANALYSIS, bind=True, acks_late=True)
def run_analysis(self: Task, analysis_id: str) -> str:
    """Free post-processing of released outputs; no ledger involved.

    Runs at most once (a redelivered message of a started analysis fails it with
    ``worker_lost``); past the soft time limit it ends ``failed`` with ``time_limit``;
    a cancelled one stores nothing. Its error names a code and, for a bad input, the
    field.
    """
    svc = services()
    config = svc.config
    req = analyses.start(svc.analyses, analysis_id,
                         config.analysis_time_limit + config.time_limit_grace)
    if req is None:
        return "skipped"
    try:
        with _stopped_when_cancelled(svc.analyses, analysis_id):
            return analyses.run(svc, analysis_id, req)
    except SoftTimeLimitExceeded:  # the watcher's stop landed as the run was ending
        return "cancelled"


#: seconds between looks at a running analysis's status (a cancel stops it this soon)
CANCEL_POLL = 0.5


@contextmanager
def _stopped_when_cancelled(store: AnalysisStore, analysis_id: str) -> Iterator[None]:
    """Stop the analysis once it is cancelled, without relying on the revoke broadcast
    reaching this worker: a watcher raises billiard's soft-limit exception in the task
    (the pool's SIGUSR1 handler), which ends it; its result is not stored anyway."""
    handler = signal.getsignal(signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else None
    if not callable(handler):  # not in a prefork pool child: SIGUSR1 would kill us
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(CANCEL_POLL):
            try:
                status = store.status(analysis_id)
            except DOWN:  # the record away a moment: look again at the next turn
                continue
            if status == "cancelled" and not stop.is_set():
                os.kill(os.getpid(), signal.SIGUSR1)
                return

    thread = threading.Thread(target=watch, daemon=True, name="privrelease-cancel")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
