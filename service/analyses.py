"""Analyses: free post-processing of releases, run on workers, kept in the record
(``service.storage.analysis_store``: PostgreSQL, or Valkey on the store before it).

They read only released outputs, so they touch no ledger: any number of
analyses of a release spend nothing.

An analysis runs at most once. Its states: ``queued`` -> ``running`` -> ``succeeded`` |
``failed``, or ``cancelled`` from either of the first two. Every transition is one
compare-and-set of the store (a single UPDATE on PostgreSQL), so
a cancelled analysis never turns ``succeeded`` (a run that ends after the cancel stores
nothing), and a redelivered message of an analysis that already started (its worker
died) fails it with ``worker_lost`` instead of running it again. A running analysis past
its hard deadline (its process was killed by the time limit) reads as ``failed`` with
``time_limit``.

A failed analysis's ``error`` is ``{"code", "message"}`` and, when an input
is to blame, ``field``; messages name inputs and limits, never values.

A succeeded analysis's result is a file in the document store
(``<release>/analyses/<id>.json``, service.storage.release_documents), written before the status
turns ``succeeded`` (the record then holds ``stored``); a run that lost the
transition (cancelled meanwhile) removes it. Results stored in the record by
earlier versions still read.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

import mechanisms
from mechanisms.rng import secure_generator
from service import datasets
from service.releases import documents as release_documents
from service.storage.analysis_store import AnalysisStore, Fields
from service.storage.ledger import now_iso
from service.storage.release_documents import DocumentMissing, DocumentStore
from service.storage.release_tables import OutputStore
from service.storage.store import Store
from service.wiring import Services

log = logging.getLogger("privrelease.worker")

#: statuses after which nothing changes
ENDED = frozenset({"succeeded", "failed", "cancelled"})

WORKER_LOST = {"code": "worker_lost",
               "message": "the worker running this analysis stopped; it is not run again"}
TIME_LIMIT = {"code": "time_limit", "message": "the analysis ran past its time limit"}


def view(ledger: Store, outputs: OutputStore, doc: dict[str, Any]
         ) -> mechanisms.ReleaseView:
    """A succeeded release's public outputs as analyses see them (its table is
    memory-mapped: checking an analysis reads only the columns it needs)."""
    dataset = datasets.get(ledger, doc["dataset_id"])
    if dataset is None:
        raise LookupError("dataset missing")
    return mechanisms.ReleaseView(
        id=doc["id"], mechanism=doc["mechanism"], params=doc["params"],
        result=doc["result"] or {},
        table=outputs.load(doc["id"], release_documents.table_attempt(
            ledger.release(doc["id"]) or {})),
        meta=datasets.meta(dataset),
    )


def create(store: AnalysisStore, release_id: str, name: str, params: dict[str, Any],
           others: list[str], actor: str, work: float | None = None) -> str:
    analysis_id = "ana_" + secrets.token_hex(10)
    fields: Fields = {
        "release_id": release_id, "analysis": name, "params": json.dumps(params, default=str),
        "releases": json.dumps(others), "status": "queued", "created_at": now_iso(),
        "actor": actor,
    }
    if work is not None:
        fields["work"] = repr(float(work))
    # newest first by creation time (microseconds; the id breaks ties)
    store.add(analysis_id, fields, time.time_ns() // 1000)
    return analysis_id


def discard(store: AnalysisStore, release_id: str, analysis_id: str) -> None:
    """Remove an analysis whose job could not be queued."""
    store.discard(release_id, analysis_id)


def start(store: AnalysisStore, analysis_id: str, hard_limit: float
          ) -> dict[str, Any] | None:
    """Mark running and return the stored request; None if this run must not run it
    (ended, cancelled, or started before: then it is failed ``worker_lost``)."""
    return store.start(analysis_id, now_iso(), time.time() + hard_limit,
                       json.dumps(WORKER_LOST))


def finish(store: AnalysisStore, analysis_id: str, *, result_json: str | None = None,
           error: dict[str, str] | None = None, docs: DocumentStore | None = None,
           release_id: str = "") -> bool:
    """Store the outcome of a running analysis; False (nothing stored) if it was
    cancelled or otherwise ended meanwhile. With ``docs`` a result goes to its file
    there (``release_id``'s folder), not into the record."""
    mapping = {"status": "failed" if error else "succeeded", "finished_at": now_iso()}
    on_disk = docs is not None and not error
    if error:
        mapping["error"] = json.dumps(error)
    elif docs is not None:
        docs.save_analysis(release_id, analysis_id, result_json or "null")
        mapping["stored"] = "1"
    else:
        mapping["result"] = result_json or "null"
    done = store.transition(analysis_id, ("running",), mapping) is not None
    if on_disk and not done:
        assert docs is not None
        docs.discard_analysis(release_id, analysis_id)
    return done


def cancel(store: AnalysisStore, analysis_id: str) -> str | None:
    """Cancel a queued or running analysis; its status before, or None if it had ended."""
    return store.transition(analysis_id, ("queued", "running"),
                            {"status": "cancelled", "finished_at": now_iso(),
                             "error": json.dumps({"code": "cancelled",
                                                  "message": "cancelled on request"})})


def _expire(store: AnalysisStore, analysis_id: str, h: Fields) -> Fields:
    """A running analysis past its hard deadline was killed by the time limit: say so."""
    deadline = h.get("deadline")
    if h.get("status") != "running" or deadline is None or float(deadline) > time.time():
        return h
    store.transition(analysis_id, ("running",),
                     {"status": "failed", "finished_at": now_iso(),
                      "error": json.dumps(TIME_LIMIT)})
    return store.fields(analysis_id) or {}


def render(analysis_id: str, h: Fields,
           docs: DocumentStore | None = None) -> dict[str, Any]:
    """The analysis document; a result stored on disk is read from ``docs``."""
    if "result" not in h and h.get("stored"):
        raw = docs.load_analysis(h["release_id"], analysis_id) if docs else None
        if raw is None:
            raise DocumentMissing("analysis result missing from the output store")
        h = {**h, "result": raw}
    return {
        "id": analysis_id, "release_id": h["release_id"], "analysis": h["analysis"],
        "params": json.loads(h["params"]), "releases": json.loads(h["releases"]),
        "status": h["status"], "created_at": h["created_at"],
        "started_at": h.get("started_at"), "finished_at": h.get("finished_at"),
        "work": float(h["work"]) if "work" in h else None,
        "result": json.loads(h["result"]) if "result" in h else None,
        "error": json.loads(h["error"]) if "error" in h else None,
    }


def raw(store: AnalysisStore, analysis_id: str) -> Fields | None:
    """The stored fields (with an expired run read as failed), or None."""
    h = store.fields(analysis_id)
    return _expire(store, analysis_id, h) if h else None


def document(store: AnalysisStore, analysis_id: str,
             docs: DocumentStore | None = None) -> dict[str, Any] | None:
    h = raw(store, analysis_id)
    return render(analysis_id, h, docs) if h else None


def page(store: AnalysisStore, release_id: str, limit: int, cursor: str | None,
         docs: DocumentStore | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """A release's analyses, newest first: ``limit`` of them after ``cursor`` (the
    previous page's ``X-Next-Cursor``), and the cursor of the next page (None: no more).

    The order is (creation time, id) descending, as ZREVRANGE sorts; a cursor is the
    last item's ``<time>:<id>``, so items created meanwhile never shift a page.
    """
    after = None
    if cursor is not None:
        score_text, _, last = cursor.partition(":")
        after = (int(score_text), last)
    rows = store.page(release_id, limit, after)
    items = []
    for analysis_id, _, h in rows[:limit]:
        if h:
            items.append(render(analysis_id, _expire(store, analysis_id, h), docs))
    if len(rows) <= limit:
        return items, None
    last_id, last_score, _ = rows[limit - 1]
    return items, f"{last_score}:{last_id}"


def release_view(svc: Services, release_id: str) -> mechanisms.ReleaseView:
    """A succeeded release's public outputs, as analyses see them."""
    doc = release_documents.document(svc.ledger, release_id)
    if doc is None:
        raise LookupError("release missing")
    return view(svc.ledger, svc.outputs, doc)


def run(svc: Services, analysis_id: str, req: dict[str, Any]) -> str:
    """Run a started analysis (``start``) and store its result or error; past the soft
    time limit (``SoftTimeLimitExceeded``, raised in the task by Celery, or by its
    cancel watcher) it ends ``failed`` with ``time_limit``, or, cancelled, stores
    nothing. Returns the outcome."""
    config, store = svc.config, svc.analyses
    try:
        main = release_view(svc, req["release_id"])
        others = [release_view(svc, rid) for rid in json.loads(req["releases"])]
        analysis = mechanisms.get(main.mechanism).analyses[req["analysis"]]
        if config.test_analysis_delay and config.allow_seeds:  # time limit tests only
            time.sleep(config.test_analysis_delay)
        result = analysis.run(main, json.loads(req["params"]), others, secure_generator())
        payload = release_documents.to_json(result)
    except SoftTimeLimitExceeded:
        # the time limit, or the cancel watcher: finish stores nothing once cancelled
        if not finish(store, analysis_id, error=dict(TIME_LIMIT)):
            return "cancelled"
        log.warning("analysis stopped at its time limit", extra={"analysis_id": analysis_id})
        return "failed"
    except Exception as err:
        log.error("analysis failed", extra={"analysis_id": analysis_id,
                                            "error_type": type(err).__name__})
        finish(store, analysis_id, error=error_of(err))
        return "failed"
    if not finish(store, analysis_id, result_json=payload, docs=svc.documents,
                  release_id=req["release_id"]):
        return "discarded"  # cancelled (or ended) while it ran: its result is not stored
    return "succeeded"


def error_of(err: Exception) -> dict[str, str]:
    """A failed analysis's error: code and field for a bad input (its message names
    public inputs only), a bare code otherwise."""
    if isinstance(err, mechanisms.MechanismInputError):
        return {"code": "invalid_input", "field": err.field, "message": err.message}
    return {"code": "analysis_failed", "message": f"analysis failed ({type(err).__name__})"}
