"""The session service's system of record as a test sees it, whichever store it runs on
(``PRIVRELEASE_TEST_STORE``): PostgreSQL (``PgLedger``) or the Valkey store before it
(``Ledger``).

A test reads the record through the ``Store`` methods. These helpers are for what no
``Store`` method does, each written for both stores: a state the API can not make (a
document in a format from before versions, an allocation marked ``legacy`` as the policy
migration leaves it), a field no method reads (a retired version's mark), another API
host's store on the same record, and every row or key of the record (to say a refused
request wrote none).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from service.config import Config
from service.storage import database, rkeys
from service.storage.ledger import Ledger
from service.storage.pg_ledger import PgLedger
from service.storage.store import Store


def on_postgres(store: Store) -> bool:
    return isinstance(store, PgLedger)


def _valkey(store: Store) -> Ledger:
    assert isinstance(store, Ledger), type(store)
    return store


def _pg(store: Store) -> PgLedger:
    assert isinstance(store, PgLedger), type(store)
    return store


def sql(store: Store, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run ``query`` in one committed transaction of a ``PgLedger``'s pool: its rows
    (none for a statement that returns none)."""
    with _pg(store).pool.connection() as conn, conn.cursor() as cur:
        cur.execute(query, args)
        return cur.fetchall() if cur.description is not None else []


def write_document(store: Store, dataset_id: str, text: str) -> None:
    """Store ``text`` as the dataset's document as it is, past every script (a document
    written by an older release of the service)."""
    if on_postgres(store):
        assert sql(store, "UPDATE datasets SET document = %s WHERE id = %s RETURNING 1",
                   text, dataset_id)
    else:
        _valkey(store).r.set(rkeys.dataset(dataset_id), text)


def retired_versions(store: Store, dataset_id: str) -> set[int]:
    """The versions the dataset's ledger marks retired (what the reserve step refuses)."""
    if on_postgres(store):
        rows = sql(store, "SELECT retired_versions FROM ledgers WHERE dataset_id = %s",
                   dataset_id)
        return {int(v) for v in rows[0][0]} if rows else set()
    fields = _valkey(store).r.hgetall(rkeys.ledger(dataset_id))
    return {int(name.removeprefix("retired:v")) for name, value in fields.items()
            if name.startswith("retired:v") and value == "1"}


def set_allocation_scope(store: Store, dataset_id: str, key_id: str, scope: str) -> None:
    """Mark a key's allocation ``listed`` or ``legacy`` (``legacy``: what the policy
    migration leaves on an allocation written before allocations listed measures)."""
    if on_postgres(store):
        assert sql(store, "UPDATE allocation_scopes SET scope = %s "
                          "WHERE dataset_id = %s AND key_id = %s RETURNING 1",
                   scope, dataset_id, key_id)
    else:
        _valkey(store).r.hset(rkeys.ledger(dataset_id), f"alloc:{key_id}:scope", scope)


@contextmanager
def another_host(config: Config) -> Iterator[Store]:
    """The store another API host of the session's service would have: the same record
    over connections of its own."""
    if config.database_url:
        pool = database.connect(config.database_url, max_size=4)
        try:
            yield PgLedger(pool, config.lease_seconds)
        finally:
            pool.close()
    else:
        client = rkeys.connect(config.require_redis_url())
        try:
            yield Ledger(client)
        finally:
            client.close()


#: the Valkey key families of the record (the Valkey store's), and of what Valkey keeps
#: for the service on either store (analyses)
RECORD_KEYS = ("pr:ds:*", "pr:rel:*", "pr:resv:*", "pr:replay:*", "pr:idem:*")
VALKEY_KEYS = ("pr:ana:*",)
#: each PostgreSQL table of the record, and the column naming a row
RECORD_ROWS = {"datasets": "id", "ledgers": "dataset_id", "releases": "id",
               "replays": "fingerprint", "idempotency": "key", "holdouts": "dataset_id",
               "outbox": "release_id"}


def record_entries(store: Store, client: Any) -> set[str]:
    """Every entry of the record (its Valkey keys; on PostgreSQL, ``<table>:<row>`` of
    its tables but the append-only events, and the budget rows) and of the service's
    own Valkey keys: what a request that is refused must not add to."""
    patterns = VALKEY_KEYS if on_postgres(store) else RECORD_KEYS + VALKEY_KEYS
    found = {k for pattern in patterns for k in client.scan_iter(pattern, count=1000)}
    if on_postgres(store):
        for table, column in RECORD_ROWS.items():
            found |= {f"{table}:{name}" for (name,) in
                      sql(store, f"SELECT {column}::text FROM {table}")}
        found |= {f"budgets:{d}:{m}" for d, m in
                  sql(store, "SELECT dataset_id, measure FROM budgets")}
        found |= {f"allocations:{d}:{k}:{m}" for d, k, m in
                  sql(store, "SELECT dataset_id, key_id, measure FROM allocations")}
    return found
