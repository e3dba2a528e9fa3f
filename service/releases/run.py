"""Running a release: start, read, compute, commit — or fail, or abort. No Celery here:
``workers.tasks.run_release`` calls ``execute`` and retries on ``LeaseHeld``.

A release runs to at most one stored output per charge. Each run holds the
job's lease under a token of its own (``service.storage.ledger.Run``); the ledger's
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
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import redis

import mechanisms
import mechanisms.memory
import mechanisms.precompute
import mechanisms.rows
from mechanisms import record_maps
from mechanisms.base import RecordMechanism, StreamingMechanism
from mechanisms.rng import job_secret, secure_generator
from mechanisms.rows import RowKey
from mechanisms.statistics import Partial, Statistic, compute_over
from service import datasets
from service.engines import spark_records
from service.engines.spark import compute_on_spark
from service.engines.spark_session import engine_name, reach, spark_session
from service.errors import STORAGE_DOWN, STORAGE_FULL
from service.releases.documents import to_json
from service.releases.request import JobRequest
from service.storage import release_metrics
from service.storage.dataset_files import DatasetStore, ParquetSource
from service.storage.ledger import Run, Settled
from service.storage.release_documents import DocumentStore
from service.storage.release_tables import INLINE_ROWS, OutputStore, records
from service.storage.store import DOWN, Store
from service.wiring import Services

log = logging.getLogger("privrelease.worker")

#: the error of every release that failed after its job read the data (charged): the
#: same whatever went wrong, since a message the data decides would be a side channel
FAILED_AFTER_READ: dict[str, str] = {"code": "mechanism_failed", "message": "mechanism failed"}


class _Renewals:
    """The leases of this process's runs, kept alive by one thread: each renewed a third
    of its lease after it was taken or last renewed, as a thread per run did, without a
    thread's start and join per release. A run whose renewal finds the lease gone has its
    event set and is renewed no more; the record away for a moment (``DOWN``), it is
    tried again a third of a lease later. A run that ends waits for its renewal in
    flight, as the join of its thread did: none is sent after it settles, and a renewal
    still waiting out a failover delays its settle rather than run beside it. The thread
    is started in the process that runs (after a pool's fork), once."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        #: per run's token: (when its renewal is due, monotonic; the ledger; the run; lost)
        self._runs: dict[str, tuple[float, Store, Run, threading.Event]] = {}
        self._renewing: str | None = None  # the token whose renewal is in flight
        self._pid: int | None = None

    def add(self, ledger: Store, run: Run) -> threading.Event:
        lost = threading.Event()
        with self._changed:
            self._runs[run.token] = (time.monotonic() + ledger.lease_seconds / 3, ledger,
                                     run, lost)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._renew, daemon=True,
                                 name="privrelease-lease").start()
            self._changed.notify_all()  # the thread: a run due sooner than it waits for
        return lost

    def remove(self, run: Run) -> None:
        with self._changed:
            self._runs.pop(run.token, None)
            while self._renewing == run.token:
                self._changed.wait()

    def _renew(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [entry for entry in self._runs.values() if entry[0] <= now]
                if not due:
                    soonest = min((entry[0] for entry in self._runs.values()), default=None)
                    self._changed.wait(None if soonest is None else soonest - now)
                    continue
            for _, ledger, run, lost in due:
                with self._changed:
                    if run.token not in self._runs:  # the run ended meanwhile
                        continue
                    self._renewing = run.token
                held = self._held(ledger, run)  # never raises
                with self._changed:
                    self._renewing = None
                    self._changed.notify_all()  # a run ending waits for this renewal
                    if run.token not in self._runs:  # the run ended meanwhile
                        continue
                    if held:
                        self._runs[run.token] = (time.monotonic() + ledger.lease_seconds / 3,
                                                 ledger, run, lost)
                    else:
                        del self._runs[run.token]
                        lost.set()

    @staticmethod
    def _held(ledger: Store, run: Run) -> bool:
        """One renewal: False only if the run lost its lease; an error (the record away,
        or anything else: the thread serves every run of the process) tries again later."""
        try:
            return ledger.renew_lease(run)
        except DOWN:
            return True
        except Exception as err:
            log.error("lease renewal failed", extra={"release_id": run.release_id,
                                                      "error_type": type(err).__name__})
            return True


_RENEWALS = _Renewals()


@contextmanager
def _lease(ledger: Store, run: Run) -> Iterator[threading.Event]:
    """Renew the run's lease while it works; the event is set once the run lost it."""
    lost = _RENEWALS.add(ledger, run)
    try:
        yield lost
    finally:
        _RENEWALS.remove(run)


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


@dataclass(frozen=True)
class Ran:
    """How ``run_job`` ended (``execute``'s status), and the callback URL the release's
    request named (None: none, or the release was not read): the worker sends the
    notification from it without reading the release again."""

    status: str
    callback_url: str | None = None


def execute(svc: Services, release_id: str, worker: str) -> str:
    """Run one release; returns the final status. Safe to call again (redelivery).

    'succeeded' or 'failed' when this run settled the job, 'lost' when it lost
    its lease to another run (it then stored nothing and settled nothing),
    'skipped' when the job had ended, 'missing' when it does not exist.
    """
    return run_job(svc, release_id, worker).status


def run_job(svc: Services, release_id: str, worker: str) -> Ran:
    """``execute``, with the callback URL of the request it read. The start reads the
    release's request and its dataset's document with it (``Store.mark_running``): a
    release the start does not take is read once more only to say why."""
    run = svc.ledger.mark_running(release_id, worker)
    if run is None:
        return Ran(_not_started(svc.ledger, release_id))
    req = JobRequest.from_json(run.request)
    return Ran(_execute(svc, run, req), req.callback_url)


def _not_started(ledger: Store, release_id: str) -> str:
    """Why ``mark_running`` took no run: 'missing', 'skipped' (it ended, or is not queued
    yet), or ``LeaseHeld`` raised (a live run holds it)."""
    h = ledger.release(release_id)
    if h is None:
        log.warning("release not found", extra={"release_id": release_id})
        return "missing"
    if h.get("status") == "running":
        raise LeaseHeld(release_id)
    return "skipped"


def _execute(svc: Services, run: Run, req: JobRequest) -> str:
    """Run a release ``run`` started, its request ``req``: ``execute``'s statuses."""
    client, ledger = svc.client, svc.ledger
    release_id, dataset_id, mechanism = run.release_id, req.dataset_id, req.mechanism
    started = time.perf_counter()
    if run.attempt > MAX_RUNS and (ledger.release(release_id) or {}).get("data_read"):
        # earlier runs read the data and died (a crash the data may cause would repeat
        # forever): charged, and the same message as any failure after the read
        log.error("release failed: its runs kept dying after reading the data",
                  extra={"release_id": release_id, "attempt": run.attempt})
        outcome = ledger.fail(dataset_id, run, json.dumps(FAILED_AFTER_READ))
        if outcome != "settled":
            return _lost(client, run, mechanism, outcome, started)
        release_metrics.record_release(client, mechanism, "failed", time.perf_counter() - started)
        return "failed"

    def finish(outcome: Settled, status: str) -> str:
        if outcome != "settled":
            return _lost(client, run, mechanism, outcome, started)
        release_metrics.record_release(client, mechanism, status, time.perf_counter() - started)
        return status

    inline = ledger.results_inline  # else the result is a file, written before the commit
    with _lease(ledger, run):
        try:
            job = _public_inputs(ledger, svc.datasets, req, run.dataset_document)
            source = _record_source(svc, job)
            # the memory the run would need, as the API judged it, against this worker's
            # (its setting may differ from the API's), on the engine the run will use (a
            # row map whose version Spark cannot map holds its table here): refused here
            # is refunded, not killed
            mechanisms.memory.check(mechanisms.memory.held(
                job.mechanism, job.params, job.meta, held_rows=INLINE_ROWS,
                distributed=source is not None),
                svc.config.worker_memory, "this release")
            # the output's room before the data, where a file will hold some of it (a table,
            # a result file): a store that cannot take it is refunded. Decided by public
            # inputs only (the store, the mechanism and its parameters)
            if not inline:
                svc.documents.preflight(release_id, run.attempt)
            if job.mechanism.writes_table(job.params):
                svc.outputs.preflight()
            _reach_engine(svc.config.spark_remote, svc.config.spark_connect_timeout, job)
        except Exception as err:  # nothing of the data read yet: refund, say why
            log.error("release failed before reading the data",
                      extra={"release_id": release_id, "error_type": type(err).__name__})
            message = _refund_message(err)
            return finish(ledger.abort_run(dataset_id, run, json.dumps({"message": message})),
                          "failed")
        if not ledger.mark_data_read(run):  # another run has the job: read nothing
            return _lost(client, run, mechanism, "lost", started)
        try:
            payload, table = _compute(svc, job, run, source)
            if not inline:  # the result file before the commit, which makes it the release's
                svc.documents.save_result(release_id, run.attempt, payload)
        except Exception as err:  # after reading the data: charged, and the same message
            log.error("release failed after reading the data",
                      extra={"release_id": release_id, "error_type": type(err).__name__})
            svc.outputs.discard(release_id, run.attempt)
            svc.documents.discard_result(release_id, run.attempt)
            return finish(ledger.fail(dataset_id, run, json.dumps(FAILED_AFTER_READ)),
                          "failed")
    outcome = ledger.commit(dataset_id, run, payload, table, result_stored=not inline)
    settle_files(ledger, svc.documents, svc.outputs, run, outcome, table)
    if outcome == "settled":
        try:
            datasets.record_holdout(ledger, dataset_id, payload)
        except DOWN:  # the release stands; only the operator's count misses it
            log.error("hold-out exposure not recorded", extra={"release_id": release_id})
    return finish(outcome, "succeeded")


def _refund_message(err: Exception) -> str:
    """What a run refunded before reading the data says: its input's own message, that
    the output store could not take the release, or the error's type (public inputs only
    were involved)."""
    if isinstance(err, mechanisms.MechanismInputError):
        return err.message
    if isinstance(err, OSError) and err.errno in STORAGE_FULL | STORAGE_DOWN:
        return ("the server's output store could not take the release (full or"
                " unavailable); refunded before the data was read")
    return f"job failed before reading the data ({type(err).__name__}); refunded"


def settle_files(ledger: Store, docs: DocumentStore, outputs: OutputStore, run: Run,
                 outcome: Settled, table: int | None) -> None:
    """After a run's commit: the winner removes the files of runs that died (tables,
    result documents, request copies the hash does not name); a run that did not settle
    removes its own (its output is not the release's: only the attempt the settle recorded
    is ever read). A first run (attempt 1) had no runs before it, and a store that keeps
    no request files (``kept_request`` None) made none: then nothing is left to remove and
    the release's folder is not listed."""
    if outcome == "settled":
        if table is not None and run.attempt > 1:
            outputs.prune(run.release_id, keep=table)
        keep = ledger.kept_request(run.release_id)
        if run.attempt > 1 or keep is not None:
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
    release_metrics.record_release(client, mechanism, "lease_lost", time.perf_counter() - started)
    return "lost"


def _public_inputs(ledger: Store, store: DatasetStore, req: JobRequest,
                   document: str | None) -> _Job:
    """Everything a run needs but the private data: metadata (the dataset's ``document``,
    as the start read it: None if there is none), public references, and that the
    dataset's files are all there (stat only, no value read)."""
    dataset_id, version = req.dataset_id, req.dataset_version
    if document is None:
        raise LookupError("dataset metadata missing")
    doc = json.loads(document)
    mech = mechanisms.get(req.mechanism)
    references = {}
    for ref_id in mech.reference_datasets(req.params):  # public reference data
        ref = datasets.get(ledger, ref_id)
        if ref is None:
            raise LookupError("reference dataset missing")
        references[ref_id] = (datasets.meta(ref), store.load(ref_id, ref["version"])[1])
    params = mech.bind_references(req.params, references)
    if not store.files_present(dataset_id, version):
        raise FileNotFoundError("dataset files missing")
    # the metadata (rows, bounds) of the version the release recorded, not the current one
    view = {**doc, **{k: v for k, v in datasets.find_version(doc, version).items()
                      if k in ("version", "n_rows", "columns")}}
    return _Job(dataset_id, version, mech, params, dict(req.cost), datasets.meta(view),
                req.seed)


def _compute(svc: Services, job: _Job, run: Run,
             source: tuple[RowKey | None, ParquetSource] | None) -> tuple[str, int | None]:
    """Read the data, run the mechanism, store this run's table; the output as JSON and
    the attempt whose table it is (None without a table). ``source``: where a record-level
    row map runs on Spark (``_record_source``), None where it runs here."""
    config = svc.config
    if config.test_job_delay and config.allow_seeds:  # fault injection (tests only)
        time.sleep(config.test_job_delay)
    # the plan's heavy public parts (calibration, eigen-systems) are in the store the
    # API filled when it costed the request: the run reuses them instead of recomputing
    with mechanisms.precompute.use(svc.precomputed):
        parted = None if source is None else _records_on_spark(svc, job, run, source)
        output, engine = parted[:2] if parted else _run(svc.datasets, job, config.spark_remote)
    result = dict(output.result)
    guarantee = output.guarantee
    table = None
    if parted is not None:  # its table is stored, in its order, as parts
        rows, said = parted[2:]
        result["row_order"] = said
        guarantee = f"{guarantee}; {said}"
        table = run.attempt
        result["n_records"] = rows
        if rows <= INLINE_ROWS:
            result["records"] = records(svc.outputs.load(run.release_id, run.attempt) or {})
    elif output.table is not None:
        if not job.mechanism.writes_table(job.params):  # its run was not preflighted
            log.error("mechanism returned a table it does not declare (writes_table)",
                      extra={"release_id": run.release_id, "mechanism": job.mechanism.name})
        released = output.table
        if output.per_record:
            released, said = _row_order(svc.datasets, job, output)
            result["row_order"] = said
            guarantee = f"{guarantee}; {said}"
        rows = svc.outputs.save(run.release_id, run.attempt, released)
        table = run.attempt
        result["n_records"] = rows
        if rows <= INLINE_ROWS:
            result["records"] = records(released)
    return to_json({"result": result, "accuracy": output.accuracy,
                    "guarantee": guarantee, "engine": engine}), table


def _reach_engine(spark_remote: str | None, timeout: float, job: _Job) -> None:
    """Before the data is read: the Spark engine a streaming run or a record-level row
    map may use answers within ``timeout`` seconds (``spark_session.reach``), so one that
    is down fails the release refunded instead of hanging the worker after the read.
    Decided by the setting and the mechanism (public), as ``_run`` decides the engine."""
    mech = job.mechanism
    if spark_remote is not None and (isinstance(mech, StreamingMechanism) or (
            isinstance(mech, RecordMechanism) and mech.mappable(job.params, job.meta))):
        reach(spark_remote, timeout)


def _run(store: DatasetStore, job: _Job, spark_remote: str | None = None
         ) -> tuple[mechanisms.Output, str]:
    """The mechanism's output and the engine that read the data. A record-level row map
    (``RecordMechanism``) fits on the row groups and maps each with its own generator
    from a fresh job secret (``mechanisms.record_maps``). A streaming mechanism
    reads the version's row groups, each pass the columns it needs (memory: one batch,
    whatever the rows): on Spark (``spark_remote``) when the version is Parquet that
    Spark's workers read as this process would, else here; any other mechanism reads the
    whole columns here. All give the same output (``StreamingMechanism.run`` is the same
    passes over one batch, and its partials are exact whatever the batches). The engine
    is the operator's setting and the stored format: public, never the data's choice."""
    mech, rng = job.mechanism, secure_generator(job.seed)
    if isinstance(mech, RecordMechanism) and job.meta.n_rows > 0 and mech.mappable(
            job.params, job.meta):
        # a row map: one partition per row group, each with its own generator (a version
        # of no rows has none: its run maps the empty columns, typed as stored)
        def read(columns: Sequence[str]) -> Iterator[Mapping[str, np.ndarray]]:
            return store.batches(job.dataset_id, job.version, columns)

        mapped = record_maps.fit(mech, read, job.params, job.cost, job.meta, rng,
                                 job_secret(job.seed))
        return record_maps.release(mapped, read(mapped.columns)), engine_name(None)
    if not isinstance(mech, StreamingMechanism):
        _, columns = store.load(job.dataset_id, job.version)
        return mech.run(columns, job.params, job.cost, job.meta, rng), engine_name(None)
    statistic = mech.statistic(job.params, job.cost, job.meta)
    source = (store.parquet_source(job.dataset_id, job.version)
              if spark_remote is not None else None)
    if source is not None and spark_remote is not None:
        last, partial = compute_on_spark(spark_session(spark_remote), statistic,
                                         [source.path], source.columns, source.filesystem)
        store.check_source(source)
        engine = engine_name(spark_remote)
    else:
        last, partial = compute_over(
            statistic, lambda columns: store.batches(job.dataset_id, job.version, columns))
        engine = engine_name(None)
    return mech.release(job.params, partial, job.cost, job.meta, rng, last), engine


def _record_source(svc: Services, job: _Job) -> tuple[RowKey | None, ParquetSource] | None:
    """Where a record-level row map runs on Spark: the dataset's row key (None: it keeps
    its row order) and the version as Spark reads it; None where it does not (no Spark, no
    rows, no row map, a version Spark does not read, a v1 order: one sequential stream).
    Public inputs and the stored format decide; it reads no data."""
    mech, remote = job.mechanism, svc.config.spark_remote
    if remote is None or job.meta.n_rows == 0 or not isinstance(mech, RecordMechanism) \
            or not mech.mappable(job.params, job.meta):
        return None
    store = svc.datasets
    key = None if job.meta.keep_row_order else datasets.row_key(store, job.dataset_id,
                                                                 job.version)
    if key is not None and not key.seekable:
        return None
    source = store.parquet_source(job.dataset_id, job.version)
    return None if source is None else (key, source)


def _records_on_spark(svc: Services, job: _Job, run: Run,
                      found: tuple[RowKey | None, ParquetSource]
                      ) -> tuple[mechanisms.Output, str, int, str]:
    """A record-level row map on Spark (``service.engines.spark_records``) from where
    ``_record_source`` found it: its output, engine, the rows of the table it stored as
    parts of this run, and what is said of the order."""
    key, source = found
    mech, remote, store = job.mechanism, svc.config.spark_remote, svc.datasets
    assert isinstance(mech, RecordMechanism) and remote is not None
    session = spark_session(remote)

    def partial_of(statistic: Statistic) -> Partial:  # the fit's passes on Spark too
        return compute_on_spark(session, statistic, [source.path], source.columns,
                                source.filesystem)[1]

    mapped = record_maps.fit_from(mech, partial_of, job.params, job.cost, job.meta,
                                  secure_generator(job.seed), job_secret(job.seed))
    output, parts = spark_records.release_on_spark(
        session, mapped, [source.path], source.columns, source.filesystem,
        spark_records.plan_order(key, job.meta.n_rows, mech.record_row_column),
        svc.outputs.parts_place(run.release_id, run.attempt))
    store.check_source(source)
    rows = svc.outputs.commit_parts(run.release_id, run.attempt, parts)
    return (output, engine_name(remote), rows,
            mechanisms.rows.statement(key is not None, output.row_column))


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
