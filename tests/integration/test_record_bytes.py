"""On PostgreSQL, Valkey carries only what can be lost (issue #29 §3): once a release has
finished, nothing of it is left in Valkey (0 B per finished release), and what it costs
PostgreSQL (its row, its events, their indexes) is measured and bounded."""

from __future__ import annotations

from typing import Any

import psycopg
import redis
from flask import Flask

from service import wiring
from service.storage.pg_ledger import PgLedger
from tests.integration.conftest import Api

#: PostgreSQL bytes one finished release may take (row, its events, index entries): the
#: request and the result documents are a few hundred bytes each
MAX_PG_BYTES = 8192


def _valkey_keys(r: redis.Redis) -> dict[str, int]:
    """Every key of the session's Valkey DB with its memory (bytes)."""
    return {key: int(r.memory_usage(key) or 0) for key in r.scan_iter(count=1000)}


def _pg_bytes(url: str) -> int:
    """The table and index bytes of what a release writes: releases, events, replays."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c)) FROM unnest(ARRAY['releases',"
            " 'events', 'replays', 'outbox', 'idempotency']::regclass[]) AS c").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _release(api: Api, ds: str, i: int) -> str:
    """A small Laplace mean; each a different budget, so none replays another."""
    resp = api.post("/v1/releases", {
        "dataset_id": ds, "mechanism": "laplace", "budget": {"epsilon": 0.001 + i * 1e-6},
        "params": {"statistic": "mean", "column": "age"}})
    assert resp.status_code == 202, resp.get_json()
    rid: str = resp.get_json()["id"]
    return rid


def test_a_finished_release_leaves_nothing_in_valkey(app: Flask, api: Api, worker: Any,
                                                     dataset: dict[str, Any],
                                                     r: redis.Redis) -> None:
    ledger = wiring.of(app).ledger
    assert isinstance(ledger, PgLedger)
    url = str(ledger.pool.conninfo)
    for i in range(3):  # warm: the worker's first run makes its constant keys
        api.wait(_release(api, dataset["id"], i))
    before, pg_before = _valkey_keys(r), _pg_bytes(url)
    n = 40
    ids = [_release(api, dataset["id"], 10 + i) for i in range(n)]
    for rid in ids:
        assert api.wait(rid)["status"] == "succeeded"
    after = _valkey_keys(r)
    grown = {k for k in after if k not in before}
    # no key names a release, and the keyspace did not grow with the releases: what a
    # finished release leaves in Valkey is 0 B (metrics counters and heartbeats are per
    # mechanism and per worker, present before)
    assert not [k for k in after if any(rid in k for rid in ids)]
    assert grown <= {k for k in after if k.startswith(("pr:workers:", "pr:sweeper:"))}, grown
    assert sum(after.values()) - sum(before.values()) < 4096  # counters' own growth only
    per_release = (_pg_bytes(url) - pg_before) / n
    print(f"PostgreSQL bytes per finished release (tables + indexes): {per_release:.0f}")
    assert 0 < per_release <= MAX_PG_BYTES
