"""Analyses: free post-processing of releases, run on workers, stored in Redis.

They read only released outputs, so they touch no ledger: any number of
analyses of a release spend nothing.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import redis

from service import rkeys
from service.ledger import now_iso


def create(client: redis.Redis, release_id: str, name: str, params: dict[str, Any],
           others: list[str], actor: str) -> str:
    analysis_id = "ana_" + secrets.token_hex(10)
    pipe = client.pipeline(transaction=True)
    pipe.hset(rkeys.analysis(analysis_id), mapping={
        "release_id": release_id, "analysis": name, "params": json.dumps(params, default=str),
        "releases": json.dumps(others), "status": "queued", "created_at": now_iso(),
        "actor": actor,
    })
    pipe.zadd(rkeys.release_analyses(release_id), {analysis_id: 0})
    pipe.execute()
    return analysis_id


def discard(client: redis.Redis, release_id: str, analysis_id: str) -> None:
    """Remove an analysis whose job could not be queued."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(rkeys.analysis(analysis_id))
    pipe.zrem(rkeys.release_analyses(release_id), analysis_id)
    pipe.execute()


def start(client: redis.Redis, analysis_id: str) -> dict[str, Any] | None:
    """Mark running and return the stored request; None if it already ended."""
    fields = client.hgetall(rkeys.analysis(analysis_id))
    if not fields or fields["status"] in {"succeeded", "failed"}:
        return None
    client.hset(rkeys.analysis(analysis_id), mapping={"status": "running",
                                                      "started_at": now_iso()})
    return dict(fields)


def finish(client: redis.Redis, analysis_id: str, *, result_json: str | None = None,
           error: str | None = None) -> None:
    mapping = {"status": "failed" if error else "succeeded", "finished_at": now_iso()}
    if error:
        mapping["error"] = json.dumps({"message": error})
    else:
        mapping["result"] = result_json or "null"
    client.hset(rkeys.analysis(analysis_id), mapping=mapping)


def document(client: redis.Redis, analysis_id: str) -> dict[str, Any] | None:
    h = client.hgetall(rkeys.analysis(analysis_id))
    if not h:
        return None
    return {
        "id": analysis_id, "release_id": h["release_id"], "analysis": h["analysis"],
        "params": json.loads(h["params"]), "releases": json.loads(h["releases"]),
        "status": h["status"], "created_at": h["created_at"],
        "finished_at": h.get("finished_at"),
        "result": json.loads(h["result"]) if "result" in h else None,
        "error": json.loads(h["error"]) if "error" in h else None,
    }
