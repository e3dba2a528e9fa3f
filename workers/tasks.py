"""Named Celery tasks. A release runs once: start, compute, commit — or abort."""

from __future__ import annotations

import json
import logging
import os
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np
import redis

import mechanisms
from service import datasets, rkeys
from service.config import Config
from service.ledger import Ledger
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
    return config, client, Ledger(client), DatasetStore(config.datasets_dir)


def fresh_rng(seed: int | None) -> np.random.Generator:
    """OS entropy per job; a seed only when the server allows seeds (tests)."""
    if seed is not None:
        return np.random.default_rng(seed)
    return np.random.default_rng(np.random.SeedSequence(int.from_bytes(os.urandom(32))))


def execute(release_id: str, worker: str) -> str:
    """Run one release; returns the final status. Safe to call again (redelivery)."""
    _, client, ledger, store = _deps()
    raw = client.hget(rkeys.release(release_id), "request")
    if raw is None:
        log.warning("release not found", extra={"release_id": release_id})
        return "missing"
    req = json.loads(raw)
    dataset_id = req["dataset_id"]
    if not ledger.mark_running(release_id, worker):
        return "skipped"
    try:
        doc = datasets.get(client, dataset_id)
        if doc is None:
            raise LookupError("dataset metadata missing")
        meta = datasets.meta(doc)
        mech = mechanisms.get(req["mechanism"])
        _, columns = store.load(dataset_id, req["dataset_version"])
        cost = {m: Fraction(v) for m, v in req["cost"].items()}
        output = mech.run(columns, req["params"], cost, meta, fresh_rng(req.get("seed")))
        payload = json.dumps({"result": output.result, "accuracy": output.accuracy,
                              "guarantee": output.guarantee}, default=_json_default)
    except Exception as err:  # any failure before storing: refund
        log.error("release failed", extra={"release_id": release_id,
                                           "error_type": type(err).__name__})
        message = err.message if isinstance(err, mechanisms.MechanismInputError) else (
            f"mechanism failed ({type(err).__name__})")
        ledger.abort(dataset_id, release_id, json.dumps({"message": message}), worker)
        return "failed"
    ledger.commit(dataset_id, release_id, payload, worker)
    return "succeeded"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


@app.task(name="privrelease.run_release", bind=True, acks_late=True)
def run_release(self: Any, release_id: str) -> str:
    return execute(release_id, self.request.hostname or "worker")
