"""The sweeper: resolve reservations whose job is gone.

A job is gone when its release has not ended, nobody holds its lease, and
its message is in neither the broker queue nor the broker's unacked set: its
worker died and nothing will redeliver it, or the message was lost between
reserve and enqueue. A job whose message still exists is left to the
redelivery, which re-runs it. Outputs and commits are stored by one atomic
script, so a gone job never stored a result: the sweeper aborts (refunds) it.
"""

from __future__ import annotations

import json
import logging
import time

import redis

from service import rkeys
from service.ledger import Ledger

log = logging.getLogger("privrelease.sweeper")

QUEUE = "privrelease"
UNACKED = "unacked"  # kombu's Redis transport keeps unacknowledged messages here
LOCK = rkeys.P + "sweeper:lock"


def _in_broker(client: redis.Redis) -> str:
    """Every queued or unacknowledged message as one string to search for ids."""
    queued = client.lrange(QUEUE, 0, -1)
    unacked = client.hvals(UNACKED)
    return "\n".join([*queued, *unacked])


def sweep(client: redis.Redis, ledger: Ledger, min_age: float = 30.0) -> list[str]:
    """One pass; returns the ids it aborted. Only reservations older than ``min_age``."""
    stale = client.zrangebyscore(rkeys.PENDING, 0, time.time() - min_age)
    if not stale:
        return []
    broker = _in_broker(client)
    aborted = []
    for release_id in stale:
        status, raw = client.hmget(rkeys.release(release_id), "status", "request")
        if raw is None:
            client.zrem(rkeys.PENDING, release_id)
            continue
        if client.exists(rkeys.lease(release_id)) or release_id in broker:
            continue
        if status in {"queued", "running"}:
            reason = "worker died" if status == "running" else "job message lost"
            dataset_id = json.loads(raw)["dataset_id"]
            error = json.dumps({"message": f"job gone ({reason}); reservation refunded"})
            if ledger.abort(dataset_id, release_id, error, "sweeper"):
                log.warning("swept job", extra={"release_id": release_id, "reason": reason})
                aborted.append(release_id)
        else:
            client.zrem(rkeys.PENDING, release_id)
    return aborted


def sweep_if_due(client: redis.Redis, ledger: Ledger, interval: float) -> list[str]:
    """Sweep unless another worker swept within ``interval`` (a Redis lock)."""
    if not client.set(LOCK, "1", nx=True, px=max(int(interval * 1000), 1)):
        return []
    return sweep(client, ledger, min_age=max(2 * ledger.lease_seconds, 1))
