"""The public release document (DESIGN §4), rendered from the release's stored fields
(``service.storage.store.Store.release``)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

import mechanisms
from service.releases import pricing
from service.releases.request import JobRequest
from service.storage.store import Fields, Store


def document(store: Store, release_id: str) -> dict[str, Any] | None:
    """The public release document (DESIGN §4), or None."""
    h = store.release(release_id)
    return None if h is None else render(release_id, h)


def documents(store: Store, ids: list[str]) -> list[dict[str, Any]]:
    """The documents of ``ids`` in one round trip, in order (ids without one left out)."""
    return [render(release_id, h) for release_id, h in store.releases(ids)]


def table_attempt(h: Fields) -> int:
    """Which run's table is the release's, from its stored fields, as its commit recorded
    (release tables live per run, ``service.storage.release_tables``); releases committed
    before runs were numbered kept theirs as run 1."""
    return int(h.get("table") or 1)


def render(release_id: str, h: dict[str, str]) -> dict[str, Any]:
    """The document from the release's stored fields (``service.storage.store``)."""
    req = JobRequest.from_json(h["request"])
    doc: dict[str, Any] = {
        "id": release_id,
        "status": h["status"],
        "dataset_id": req.dataset_id,
        "dataset_version": req.dataset_version,
        "mechanism": req.mechanism,
        "params": req.params,
        "cost": pricing.cost_doc(req.cost_units),
        "seeded": req.seed is not None,
        "created_at": h.get("created_at"),
        "started_at": h.get("started_at"),
        "finished_at": h.get("finished_at"),
        "result": None,
        "accuracy": req.accuracy,
        "guarantee": None,
        "engine": None,
        "privacy": req.privacy,
    }
    if "output" in h:
        out = json.loads(h["output"])
        doc["result"] = out["result"]
        doc["accuracy"] = out["accuracy"]
        doc["guarantee"] = out["guarantee"]
        doc["engine"] = out.get("engine", "embedded")  # outputs before engines: this one
    if "error" in h:
        doc["error"] = json.loads(h["error"])
    if doc["status"] == "succeeded":
        doc["analyses"] = runnable_analyses(doc["mechanism"], doc["params"],
                                            doc["result"] or {})
    return doc


def runnable_analyses(mechanism: str, params: dict[str, Any],
                      result: dict[str, Any]) -> list[str]:
    """The analyses a succeeded release can run, judged from its design (public)."""
    try:
        mech = mechanisms.get(mechanism)
    except KeyError:
        return []
    return sorted(name for name, analysis in mech.analyses.items()
                  if analysis.applies(mechanism, params, result))


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
    """A result or an analysis output as stored: strict JSON (``_plain``)."""
    return json.dumps(_plain(obj), allow_nan=False)
