"""Named Celery tasks: run a release (start, compute, commit — or abort) and notify.

A release runs at most once to a stored result: the ledger's scripts make a
redelivered message skip a finished job, wait for a live one, and re-run one
whose worker died before storing anything.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np
import redis
from celery import Task

import mechanisms
from mechanisms.rng import secure_generator
from service import analyses, datasets, metrics_store, notify, releases, rkeys
from service.config import Config
from service.ledger import Ledger
from service.outputs import INLINE_ROWS, OutputStore, records
from service.store import DatasetStore
from workers.celery_app import app

log = logging.getLogger("privrelease.worker")

# Load every mechanism (and scipy) once in the parent, before the pool forks,
# so the first job of each child does not pay for the imports.
mechanisms.names()


@cache
def _deps() -> tuple[Config, redis.Redis, Ledger, DatasetStore]:
    """Per-process clients, created after fork (never shared with the parent)."""
    config = Config.from_env()
    client = rkeys.connect(config.require_redis_url())
    return (config, client, Ledger(client, config.lease_seconds),
            DatasetStore(config.datasets_dir))


@cache
def _outputs() -> OutputStore:
    return OutputStore(_deps()[0].releases_dir)


@contextmanager
def _lease(ledger: Ledger, release_id: str, worker: str) -> Iterator[None]:
    """Renew the job's lease while it runs, so no other worker takes it over."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ledger.lease_seconds / 3):
            ledger.renew_lease(release_id, worker)

    thread = threading.Thread(target=renew, daemon=True, name="privrelease-lease")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class LeaseHeld(Exception):
    """Another worker holds the job's lease; look again once it could have lapsed."""


def execute(release_id: str, worker: str) -> str:
    """Run one release; returns the final status. Safe to call again (redelivery)."""
    config, client, ledger, store = _deps()
    raw = client.hget(rkeys.release(release_id), "request")
    if raw is None:
        log.warning("release not found", extra={"release_id": release_id})
        return "missing"
    req = json.loads(raw)
    dataset_id = req["dataset_id"]
    if not ledger.mark_running(release_id, worker):
        if client.hget(rkeys.release(release_id), "status") == "running":
            raise LeaseHeld(release_id)
        return "skipped"
    started = time.perf_counter()
    try:
        with _lease(ledger, release_id, worker):
            if config.test_job_delay and config.allow_seeds:
                time.sleep(config.test_job_delay)
            payload = _run(client, store, req, release_id)
    except Exception as err:  # any failure before storing: refund
        log.error("release failed", extra={"release_id": release_id,
                                           "error_type": type(err).__name__})
        message = err.message if isinstance(err, mechanisms.MechanismInputError) else (
            f"mechanism failed ({type(err).__name__})")
        ledger.abort(dataset_id, release_id, json.dumps({"message": message}), worker)
        metrics_store.record_release(client, req["mechanism"], "failed",
                                     time.perf_counter() - started)
        return "failed"
    ledger.commit(dataset_id, release_id, payload, worker)
    metrics_store.record_release(client, req["mechanism"], "succeeded",
                                 time.perf_counter() - started)
    return "succeeded"


def _run(client: redis.Redis, store: DatasetStore, req: dict[str, Any],
         release_id: str) -> str:
    """Load the data, run the mechanism, store its table; return the output as JSON."""
    doc = datasets.get(client, req["dataset_id"])
    if doc is None:
        raise LookupError("dataset metadata missing")
    mech = mechanisms.get(req["mechanism"])
    _, columns = store.load(req["dataset_id"], req["dataset_version"])
    cost = {m: Fraction(v) for m, v in req["cost"].items()}
    references = {}
    for ref_id in mech.reference_datasets(req["params"]):  # public reference data
        ref = datasets.get(client, ref_id)
        if ref is None:
            raise LookupError("reference dataset missing")
        references[ref_id] = (datasets.meta(ref), store.load(ref_id, ref["version"])[1])
    params = mech.bind_references(req["params"], references)
    output = mech.run(columns, params, cost, datasets.meta(doc), secure_generator(req.get("seed")))
    result = dict(output.result)
    if output.table is not None:
        rows = _outputs().save(release_id, output.table)
        result["n_records"] = rows
        if rows <= INLINE_ROWS:
            result["records"] = records(output.table)
    return to_json({"result": result, "accuracy": output.accuracy,
                    "guarantee": output.guarantee})


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
    if status in {"succeeded", "failed"} and notify.wanted(_deps()[1], release_id):
        send_notification.delay(release_id)
    return status


@app.task(name="privrelease.notify", bind=True, acks_late=True, max_retries=8,
          autoretry_for=(notify.DeliveryError,), retry_backoff=2, retry_backoff_max=600,
          retry_jitter=True)
def send_notification(self: Task, release_id: str) -> bool:
    """POST the release document to its callback_url, signed; retried with backoff."""
    config, client, _, _ = _deps()
    return notify.deliver(client, config, release_id)


def _view(client: redis.Redis, release_id: str) -> mechanisms.ReleaseView:
    """A succeeded release's public outputs, as analyses see them."""
    doc = releases.document(client, release_id)
    dataset = datasets.get(client, doc["dataset_id"]) if doc else None
    if doc is None or dataset is None:
        raise LookupError("release or dataset missing")
    return mechanisms.ReleaseView(
        id=release_id, mechanism=doc["mechanism"], params=doc["params"],
        result=doc["result"] or {}, table=_outputs().load(release_id),
        meta=datasets.meta(dataset),
    )


@app.task(name="privrelease.run_analysis", bind=True, acks_late=True)
def run_analysis(self: Task, analysis_id: str) -> str:
    """Free post-processing of released outputs; no ledger involved."""
    _, client, _, _ = _deps()
    req = analyses.start(client, analysis_id)
    if req is None:
        return "skipped"
    try:
        main = _view(client, req["release_id"])
        others = [_view(client, rid) for rid in json.loads(req["releases"])]
        analysis = mechanisms.get(main.mechanism).analyses[req["analysis"]]
        result = analysis.run(main, json.loads(req["params"]), others, secure_generator())
        payload = to_json(result)
    except Exception as err:
        log.error("analysis failed", extra={"analysis_id": analysis_id,
                                            "error_type": type(err).__name__})
        message = err.message if isinstance(err, mechanisms.MechanismInputError) else (
            f"analysis failed ({type(err).__name__})")
        analyses.finish(client, analysis_id, error=message)
        return "failed"
    analyses.finish(client, analysis_id, result_json=payload)
    return "succeeded"
