"""Dataset registry: metadata in Redis, columns on disk, caps in the ledger.

Registration is all-or-nothing: files are written atomically first, then
metadata and caps go to Redis in one script (``ledger.open``, at most once);
if that fails the files are removed, so a refused or failed upload leaves
nothing behind (files whose registration may have been stored stay until
the orphan sweep knows it was not). Columns
arrive in chunks and go straight to disk, so an upload never holds a whole
dataset in memory.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from mechanisms import ColumnMeta, DatasetMeta, rows
from service import budget, rkeys
from service.ingest import DatasetSpec
from service.ledger import Ledger, now_iso
from service.store import DatasetStore

#: the version's private file holding its row-order key (``mechanisms.rows``)
ROW_KEY = "row_key"


def row_key(store: DatasetStore, dataset_id: str, version: int) -> bytes:
    """The dataset's secret row-order key (made now for a dataset stored before keys)."""
    return store.private_file(dataset_id, version, ROW_KEY, rows.new_key)


def column_doc(col: ColumnMeta, fill: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": col.type}
    if col.bounds is not None:
        doc["bounds"] = list(col.bounds)
    if col.categories is not None:
        doc["categories"] = list(col.categories)
    if col.subset_policy is not None:
        doc["subset_policy"] = dict(col.subset_policy)
    if col.prior is not None:
        doc["prior"] = dict(col.prior)
    if col.grid is not None:
        doc["grid"] = list(col.grid)
        doc["norm_bound"] = col.norm_bound
    if fill is not None:
        doc["allow_missing"] = True
        doc["fill"] = fill
    return doc


def register(
    client: redis.Redis,
    store: DatasetStore,
    ledger: Ledger,
    spec: DatasetSpec,
    caps: dict[str, int],
    chunks: Iterable[Mapping[str, np.ndarray]],
    actor: str,
    idempotency: Idempotency | None = None,
) -> dict[str, Any]:
    """Store a new dataset (version 1) and open its ledger; returns its document.

    ``chunks`` are consecutive row blocks of every column (``ingest.iter_upload``);
    an error raised while iterating them leaves nothing behind. With an
    ``idempotency`` key that another upload registered first (concurrently),
    this upload's files go and that dataset's document is returned.
    """
    dataset_id = "ds_" + secrets.token_hex(8)
    with store.staging() as staged:
        for chunk in chunks:
            staged.append(chunk)
        # the secret row order of its microdata releases: private, beside the columns
        staged.write_private(ROW_KEY, rows.new_key())
        doc = {
            "id": dataset_id,
            "version": 1,
            "name": spec.name,
            "n_rows": staged.n_rows,
            "columns": {n: column_doc(c, spec.fill.get(n)) for n, c in spec.columns.items()},
            "bounds_policy": spec.bounds_policy,
            "public": spec.public,
            "allow_holdout": spec.allow_holdout,
            "keep_row_order": spec.keep_row_order,
            **({"subset_policy": spec.subset_policy} if spec.subset_policy else {}),
            "budgets": {m: budget.display(m, u) for m, u in sorted(caps.items())},
            **spec.accounting,
            "status": "active",
            "created_at": now_iso(),
            "created_by": actor,
        }
        staged.commit(dataset_id, 1, doc)
    try:
        outcome, registered = ledger.open(
            dataset_id, caps, actor, json.dumps(doc),
            idempotency_key=idempotency.key if idempotency else None,
            fingerprint=idempotency.fingerprint if idempotency else "",
            idempotency_ttl=idempotency.ttl if idempotency else 0)
    except Exception:
        if not _maybe_stored(client, dataset_id):
            store.remove(dataset_id, 1)
        raise
    if registered == dataset_id:
        return doc
    store.remove(dataset_id, 1)
    if outcome == "idem_mismatch":
        raise IdempotencyMismatch
    first = get(client, registered)
    assert first is not None  # the key and the dataset are written together
    return first


@dataclass(frozen=True)
class Idempotency:
    """An upload's ``Idempotency-Key`` (its Valkey key), what it was for, how long it holds."""

    key: str
    fingerprint: str
    ttl: int


class IdempotencyMismatch(Exception):
    """The Idempotency-Key registered a dataset from other metadata."""


def idempotent(client: redis.Redis, idempotency: Idempotency) -> dict[str, Any] | None:
    """The dataset an earlier upload with this key registered (None: none yet).

    Asked before the file is parsed, so a retried upload costs no second parse.
    """
    first, fingerprint = client.hmget(idempotency.key, "id", "fp")
    if first is None:
        return None
    if fingerprint != idempotency.fingerprint:
        raise IdempotencyMismatch
    return get(client, first)


def _maybe_stored(client: redis.Redis, dataset_id: str) -> bool:
    """Whether a registration whose script call raised may be stored all the same.

    A reply lost after the script ran leaves the metadata in Valkey: removing the
    files then would leave a dataset no file backs. Valkey is asked again;
    when it cannot answer, the files stay and ``DatasetStore.sweep_orphans``
    removes them once the id is known to be unregistered.
    """
    try:
        return bool(client.exists(rkeys.dataset(dataset_id)))
    except redis.RedisError:
        return True


def get(client: redis.Redis, dataset_id: str) -> dict[str, Any] | None:
    raw = client.get(rkeys.dataset(dataset_id))
    return json.loads(raw) if raw is not None else None


def list_all(client: redis.Redis) -> list[dict[str, Any]]:
    ids = [i for i in client.zrange(rkeys.DATASETS, 0, -1)]
    if not ids:
        return []
    raws = client.mget([rkeys.dataset(i) for i in ids])
    return [json.loads(raw) for raw in raws if raw is not None]


def meta(doc: dict[str, Any]) -> DatasetMeta:
    """The public metadata mechanisms see, rebuilt from the stored document."""
    cols = {
        name: ColumnMeta(
            name=name,
            type=c["type"],
            bounds=tuple(c["bounds"]) if "bounds" in c else None,
            categories=tuple(c["categories"]) if "categories" in c else None,
            prior=c.get("prior"),
            grid=tuple(c["grid"]) if "grid" in c else None,
            norm_bound=c.get("norm_bound"),
            subset_policy=c.get("subset_policy"),
        )
        for name, c in doc["columns"].items()
    }
    return DatasetMeta(n_rows=int(doc["n_rows"]), columns=cols,
                       allow_holdout=bool(doc.get("allow_holdout", False)),
                       gaussian_accounting=str(doc.get("gaussian_accounting", "approx_dp")),
                       subset_policy=doc.get("subset_policy"),
                       keep_row_order=bool(doc.get("keep_row_order", False)))


def set_status(client: redis.Redis, dataset_id: str, status: str) -> dict[str, Any]:
    """Update a dataset's status in its stored document; returns the document."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(rkeys.dataset(dataset_id))
                doc = json.loads(pipe.get(rkeys.dataset(dataset_id)))
                doc["status"] = status
                pipe.multi()
                pipe.set(rkeys.dataset(dataset_id), json.dumps(doc))
                pipe.execute()
                return dict(doc)
            except redis.WatchError:
                continue


#: rows held out so far: the largest hold-out (DIP's default splits are nested, so the
#: rows that have served are those of the largest one) and how many releases used one
_HOLDOUT_MAX = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'rows') or '0')
if tonumber(ARGV[1]) > cur then redis.call('HSET', KEYS[1], 'rows', ARGV[1]) end
return redis.call('HINCRBY', KEYS[1], 'releases', 1)
"""


def _holdout_key(dataset_id: str) -> str:
    return f"{rkeys.dataset(dataset_id)}:holdout"


def record_holdout(client: redis.Redis, dataset_id: str, payload: str) -> None:
    """Count hold-out exposure after a committed release that held rows out of DP.

    The release's result says so (``reference.kind == "holdout"`` with its
    ``holdout_rows``); those rows are not protected by DP, so the operator
    sees how many have served (spec §8.4: ``holdout_exposures``).
    """
    reference = json.loads(payload).get("result", {}).get("reference")
    if not isinstance(reference, dict) or reference.get("kind") != "holdout":
        return
    client.eval(_HOLDOUT_MAX, 1, _holdout_key(dataset_id), int(reference["holdout_rows"]))


def holdout_exposure(client: redis.Redis, dataset_id: str) -> dict[str, int]:
    """Rows that have served as a hold-out reference, and the releases that used one."""
    rows, count = client.hmget(_holdout_key(dataset_id), "rows", "releases")
    return {"rows": int(rows or 0), "releases": int(count or 0)}
