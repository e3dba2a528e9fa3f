"""Named Celery tasks: run a release (start, compute, commit — or fail, or abort) and notify.

A release runs to at most one stored output per charge. Each run holds the
job's lease under a token of its own (``service.ledger.Run``); the ledger's
scripts make a redelivered message skip a finished job, wait for a live run,
and re-run one whose run died or stalled past its lease. A run settles only
while it still holds the lease, in the settling script itself, and its table
lives in a folder of its own: a stalled run that wakes up after another took
the job over stores nothing visible, commits nothing and refunds nothing.

The data is first read at one explicit point (``Ledger.mark_data_read``, which
records ``data_read`` in the job state). A failure before it (dataset gone,
reference missing) is refunded with its message; a failure after it, whatever
the exception, is charged and says only ``mechanism failed`` (code
``mechanism_failed``): a refund or a message that the data decides would be a
side channel. The sweeper applies the same rule to a job whose worker died.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np
import redis
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

import mechanisms
import mechanisms.precompute
import mechanisms.rows
from mechanisms.rng import secure_generator
from service import analyses, datasets, metrics_store, notify, precompute, releases, rkeys
from service.config import Config
from service.documents import DocumentStore
from service.ledger import Ledger, Run, Settled
from service.outputs import INLINE_ROWS, OutputStore, records
from service.store import DatasetStore
from workers import pricing
from workers.celery_app import app, worker_client, worker_ledger

log = logging.getLogger("privrelease.worker")

# Load every mechanism (and scipy) once in the parent, before the pool forks,
# so the first job of each child does not pay for the imports.
mechanisms.names()


@cache
def _deps() -> tuple[Config, redis.Redis, Ledger, DatasetStore]:
    """Per-process clients, created after fork (never shared with the parent)."""
    config = Config.from_env()
    client = worker_client(config)
    return (config, client, worker_ledger(client, config),
            DatasetStore(config.datasets_dir))


@cache
def _outputs() -> OutputStore:
    return OutputStore(_deps()[0].releases_dir)


def _docs() -> DocumentStore:
    """The release documents' store (the ledger's: its settle moves requests there)."""
    docs = _deps()[2].documents
    assert docs is not None
    return docs


@contextmanager
def _lease(ledger: Ledger, run: Run) -> Iterator[threading.Event]:
    """Renew the run's lease while it works; the event is set once the run lost it."""
    stop, lost = threading.Event(), threading.Event()

    def renew() -> None:
        while not stop.wait(ledger.lease_seconds / 3):
            try:
                if not ledger.renew_lease(run):
                    lost.set()
                    return
            except redis.RedisError:  # Valkey away for a moment: the next renewal retries
                continue

    thread = threading.Thread(target=renew, daemon=True, name="privrelease-lease")
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join()


#: runs of one release that may read its data; a job whose runs all died after reading it
#: (worker killed, lost, out of memory) is then charged and failed, not run again
MAX_RUNS = 3


class LeaseHeld(Exception):
    """Another worker holds the job's lease; look again once it could have lapsed."""


@dataclass(frozen=True)
class _Job:
    """A release's public inputs, resolved before any of its data is read."""

    dataset_id: str
    version: int
    mechanism: mechanisms.Mechanism
    params: dict[str, Any]
    cost: dict[str, Fraction]
    meta: mechanisms.DatasetMeta
    seed: int | None


def execute(release_id: str, worker: str) -> str:
    """Run one release; returns the final status. Safe to call again (redelivery).

    'succeeded' or 'failed' when this run settled the job, 'lost' when it lost
    its lease to another run (it then stored nothing and settled nothing),
    'skipped' when the job had ended, 'missing' when it does not exist.
    """
    config, client, ledger, store = _deps()
    raw, status = client.hmget(rkeys.release(release_id), "request", "status")
    if raw is None:
        if status is not None:  # ended: its request moved to the document store
            return "skipped"
        log.warning("release not found", extra={"release_id": release_id})
        return "missing"
    req = json.loads(raw)
    dataset_id, mechanism = req["dataset_id"], req["mechanism"]
    run = ledger.mark_running(release_id, worker)
    if run is None:
        if client.hget(rkeys.release(release_id), "status") == "running":
            raise LeaseHeld(release_id)
        return "skipped"
    started = time.perf_counter()
    if run.attempt > MAX_RUNS and client.hget(rkeys.release(release_id), "data_read"):
        # earlier runs read the data and died (a crash the data may cause would repeat
        # forever): charged, and the same message as any failure after the read
        log.error("release failed: its runs kept dying after reading the data",
                  extra={"release_id": release_id, "attempt": run.attempt})
        outcome = ledger.fail(dataset_id, run, json.dumps(releases.FAILED_AFTER_READ))
        if outcome != "settled":
            return _lost(client, run, mechanism, outcome, started)
        metrics_store.record_release(client, mechanism, "failed", time.perf_counter() - started)
        return "failed"

    def finish(outcome: Settled, status: str) -> str:
        if outcome != "settled":
            return _lost(client, run, mechanism, outcome, started)
        metrics_store.record_release(client, mechanism, status, time.perf_counter() - started)
        return status

    with _lease(ledger, run):
        try:
            job = _public_inputs(client, store, req)
        except Exception as err:  # nothing of the data read yet: refund, say why
            log.error("release failed before reading the data",
                      extra={"release_id": release_id, "error_type": type(err).__name__})
            message = err.message if isinstance(err, mechanisms.MechanismInputError) else (
                f"job failed before reading the data ({type(err).__name__}); refunded")
            return finish(ledger.abort_run(dataset_id, run, json.dumps({"message": message})),
                          "failed")
        if not ledger.mark_data_read(run):  # another run has the job: read nothing
            return _lost(client, run, mechanism, "lost", started)
        try:
            payload, table = _compute(config, store, job, run)
            # the result document on disk before the commit, which makes it the release's
            _docs().save_result(release_id, run.attempt, payload)
        except Exception as err:  # after reading the data: charged, and the same message
            log.error("release failed after reading the data",
                      extra={"release_id": release_id, "error_type": type(err).__name__})
            _outputs().discard(release_id, run.attempt)
            _docs().discard_result(release_id, run.attempt)
            return finish(ledger.fail(dataset_id, run, json.dumps(releases.FAILED_AFTER_READ)),
                          "failed")
    outcome = ledger.commit(dataset_id, run, payload, table, result_stored=True)
    settle_files(client, _docs(), _outputs(), run, outcome, table)
    if outcome == "settled":
        try:
            datasets.record_holdout(client, dataset_id, payload)
        except redis.RedisError:  # the release stands; only the operator's count misses it
            log.error("hold-out exposure not recorded", extra={"release_id": release_id})
    return finish(outcome, "succeeded")


def settle_files(client: redis.Redis, docs: DocumentStore, outputs: OutputStore, run: Run,
                 outcome: Settled, table: int | None) -> None:
    """After a run's commit: the winner removes the files of runs that died (tables,
    result documents, request copies the hash does not name); a run that did not settle
    removes its own (its output is not the release's: only the attempt settle.lua recorded
    is ever read)."""
    if outcome == "settled":
        if table is not None:
            outputs.prune(run.release_id, keep=table)
        keep = client.hget(rkeys.release(run.release_id), "doc")
        docs.prune(run.release_id, keep_result=run.attempt, keep_request=keep)
    else:
        if table is not None:
            outputs.discard(run.release_id, run.attempt)
        docs.discard_result(run.release_id, run.attempt)


def _lost(client: redis.Redis, run: Run, mechanism: str, outcome: Settled,
          started: float) -> str:
    """Report a run whose output is not the release's (another run took the job over)."""
    log.warning("run lost its lease; its output was discarded and nothing was settled",
                extra={"release_id": run.release_id, "attempt": run.attempt,
                       "outcome": outcome})
    metrics_store.record_release(client, mechanism, "lease_lost", time.perf_counter() - started)
    return "lost"


def _public_inputs(client: redis.Redis, store: DatasetStore, req: dict[str, Any]) -> _Job:
    """Everything a run needs but the private data: metadata, public references, and
    that the dataset's files are all there (stat only, no value read)."""
    dataset_id, version = req["dataset_id"], req["dataset_version"]
    doc = datasets.get(client, dataset_id)
    if doc is None:
        raise LookupError("dataset metadata missing")
    mech = mechanisms.get(req["mechanism"])
    references = {}
    for ref_id in mech.reference_datasets(req["params"]):  # public reference data
        ref = datasets.get(client, ref_id)
        if ref is None:
            raise LookupError("reference dataset missing")
        references[ref_id] = (datasets.meta(ref), store.load(ref_id, ref["version"])[1])
    params = mech.bind_references(req["params"], references)
    if not store.files_present(dataset_id, version):
        raise FileNotFoundError("dataset files missing")
    cost = {m: Fraction(v) for m, v in req["cost"].items()}
    # the metadata (rows, bounds) of the version the release recorded, not the current one
    view = {**doc, **{k: v for k, v in datasets.find_version(doc, version).items()
                      if k in ("version", "n_rows", "columns")}}
    return _Job(dataset_id, version, mech, params, cost, datasets.meta(view), req.get("seed"))


def _compute(config: Config, store: DatasetStore, job: _Job, run: Run) -> tuple[str, int | None]:
    """Read the data, run the mechanism, store this run's table; the output as JSON and
    the attempt whose table it is (None without a table)."""
    _, columns = store.load(job.dataset_id, job.version)
    if config.test_job_delay and config.allow_seeds:  # fault injection (tests only)
        time.sleep(config.test_job_delay)
    # the plan's heavy public parts (calibration, eigen-systems) are in the store the
    # API filled when it costed the request: the run reuses them instead of recomputing
    with mechanisms.precompute.use(precompute.store(config)):
        output = job.mechanism.run(columns, job.params, job.cost, job.meta,
                                   secure_generator(job.seed))
    result = dict(output.result)
    guarantee = output.guarantee
    table = None
    if output.table is not None:
        released = output.table
        if output.per_record:
            released, said = _row_order(store, job, output)
            result["row_order"] = said
            guarantee = f"{guarantee}; {said}"
        rows = _outputs().save(run.release_id, run.attempt, released)
        table = run.attempt
        result["n_records"] = rows
        if rows <= INLINE_ROWS:
            result["records"] = records(released)
    return to_json({"result": result, "accuracy": output.accuracy,
                    "guarantee": guarantee}), table


def _row_order(store: DatasetStore, job: _Job, output: mechanisms.Output
               ) -> tuple[Mapping[str, np.ndarray], str]:
    """A record-level table in the dataset's secret order, and what to say about it.

    The one place every mechanism's table passes before it is stored, served or
    analysed, and the only process that reads the dataset's private folder: the key
    never reaches a mechanism, a result or a log. ``keep_row_order`` (operator
    metadata) leaves the dataset's order.
    """
    assert output.table is not None
    if job.meta.keep_row_order:
        return output.table, mechanisms.rows.statement(False)
    key = datasets.row_key(store, job.dataset_id, job.version)
    table = mechanisms.rows.permute(output.table, key, job.meta.n_rows, output.row_column)
    return table, mechanisms.rows.statement(True, output.row_column)


def _plain(obj: Any) -> Any:
    """JSON-ready copy: numpy to Python, non-finite floats to null (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, np.generic):
        return _plain(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_json(obj: Any) -> str:
    return json.dumps(_plain(obj), allow_nan=False)


@app.task(name="privrelease.run_release", bind=True, acks_late=True, max_retries=None)
def run_release(self: Task, release_id: str) -> str:
    """Run the release; then, if it asked for one, send its notification."""
    try:
        status = execute(release_id, self.request.hostname or "worker")
    except LeaseHeld as held:
        config = _deps()[0]
        raise self.retry(countdown=config.lease_seconds, max_retries=None) from held
    if status in {"succeeded", "failed"} and notify.wanted(_deps()[1], _docs(), release_id):
        send_notification.delay(release_id)
    return status


@app.task(name="privrelease.notify", bind=True, acks_late=True, max_retries=8,
          autoretry_for=(notify.DeliveryError,), retry_backoff=2, retry_backoff_max=600,
          retry_jitter=True)
def send_notification(self: Task, release_id: str) -> bool:
    """POST the release document to its callback_url, signed; retried with backoff."""
    config, client, _, _ = _deps()
    return notify.deliver(client, config, release_id)


@app.task(name="privrelease.price_release", bind=True, acks_late=True)
def price_release(self: Task, release_id: str) -> str:
    """Compute a ``pricing`` release's cost, reserve it (once), queue its run; or end it
    ``refused`` and send its notification (``workers.pricing``)."""
    config, client, ledger, _ = _deps()
    status = pricing.price(config, client, ledger, release_id, app.send_task)
    if status == "refused" and notify.wanted(client, _docs(), release_id):
        send_notification.delay(release_id)
    return status


@app.task(name="privrelease.precompute_estimate", bind=True, acks_late=True)
def precompute_estimate(self: Task, body_json: str, marker: str) -> str:
    """Compute a cold estimate's heavy precomputation into the shared store."""
    config, client, ledger, _ = _deps()
    return pricing.precompute_estimate(config, client, ledger, body_json, marker)


def _view(client: redis.Redis, release_id: str) -> mechanisms.ReleaseView:
    """A succeeded release's public outputs, as analyses see them."""
    doc = releases.document(client, release_id, _docs())
    if doc is None:
        raise LookupError("release missing")
    return analyses.view(client, _outputs(), doc)


@app.task(name="privrelease.run_analysis", bind=True, acks_late=True)
def run_analysis(self: Task, analysis_id: str) -> str:
    """Free post-processing of released outputs; no ledger involved.

    Runs at most once (a redelivered message of a started analysis fails it with
    ``worker_lost``); past the soft time limit it ends ``failed`` with ``time_limit``;
    a cancelled one stores nothing. Its error names a code and, for a bad input, the
    field.
    """
    config, client, _, _ = _deps()
    req = analyses.start(client, analysis_id,
                         config.analysis_time_limit + config.time_limit_grace)
    if req is None:
        return "skipped"
    try:
        with _stopped_when_cancelled(client, analysis_id):
            return _run_analysis(config, client, analysis_id, req)
    except SoftTimeLimitExceeded:  # the watcher's stop landed as the run was ending
        return "cancelled"


#: seconds between looks at a running analysis's status (a cancel stops it this soon)
CANCEL_POLL = 0.5


@contextmanager
def _stopped_when_cancelled(client: redis.Redis, analysis_id: str) -> Iterator[None]:
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
                status = client.hget(rkeys.analysis(analysis_id), "status")
            except redis.RedisError:
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


def _run_analysis(config: Config, client: redis.Redis, analysis_id: str,
                  req: dict[str, Any]) -> str:
    try:
        main = _view(client, req["release_id"])
        others = [_view(client, rid) for rid in json.loads(req["releases"])]
        analysis = mechanisms.get(main.mechanism).analyses[req["analysis"]]
        if config.test_analysis_delay and config.allow_seeds:  # time limit tests only
            time.sleep(config.test_analysis_delay)
        result = analysis.run(main, json.loads(req["params"]), others, secure_generator())
        payload = to_json(result)
    except SoftTimeLimitExceeded:
        # the time limit, or the cancel watcher: finish stores nothing once cancelled
        if not analyses.finish(client, analysis_id, error=dict(analyses.TIME_LIMIT)):
            return "cancelled"
        log.warning("analysis stopped at its time limit", extra={"analysis_id": analysis_id})
        return "failed"
    except Exception as err:
        log.error("analysis failed", extra={"analysis_id": analysis_id,
                                            "error_type": type(err).__name__})
        analyses.finish(client, analysis_id, error=_analysis_error(err))
        return "failed"
    if not analyses.finish(client, analysis_id, result_json=payload, docs=_docs(),
                           release_id=req["release_id"]):
        return "discarded"  # cancelled (or ended) while it ran: its result is not stored
    return "succeeded"


def _analysis_error(err: Exception) -> dict[str, str]:
    """A failed analysis's error: code and field for a bad input (its message names
    public inputs only), a bare code otherwise."""
    if isinstance(err, mechanisms.MechanismInputError):
        return {"code": "invalid_input", "field": err.field, "message": err.message}
    return {"code": "analysis_failed", "message": f"analysis failed ({type(err).__name__})"}
