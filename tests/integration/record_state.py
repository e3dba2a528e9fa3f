"""States of the system of record (PostgreSQL) that no API call or ``Store`` method
makes, made by SQL through the ``PgLedger``'s pool, for the tests of the run, the sweeper
and the pricing jobs.

Also what a test reads or makes of the record that no ``Store`` method does: a field no
method reads (a retired version's mark), another API host's store on the same record, and
every row of the record (to say a refused request wrote none).

And, for a test rig with a broker (a Valkey database) of its own, a record of its own: a
fresh migrated database (the sweeper of a worker on another broker would otherwise take
the rig's releases for lost ones, and the rig's sweeper the session's).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from service import wiring
from service.config import Config
from service.storage import database, rkeys
from service.storage.analysis_store import AnalysisStore
from service.storage.keys import KeyStore
from service.storage.pg_analyses import PgAnalysisStore
from service.storage.pg_keys import PgKeyStore
from service.storage.pg_ledger import PgLedger
from service.storage.store import Store
from tests.conftest import database_on


def own_database(request: pytest.FixtureRequest) -> str:
    """A new database migrated to head on the session's PostgreSQL server: its URL."""
    url = database_on(request.getfixturevalue("postgres_url"))
    database.upgrade(url)
    return url


def _sql(ledger: Store, statement: str, *args: object) -> None:
    assert isinstance(ledger, PgLedger), type(ledger)
    with ledger.pool.connection() as conn:
        conn.execute(statement, args)


def lapse(ledger: Store, release_id: str) -> None:
    """The release's run lease lapses now (its worker stalled or died): the row's
    ``lease_until`` in the past."""
    _sql(ledger, "UPDATE releases SET lease_until = now() - interval '1 second' "
                 "WHERE id = %s", release_id)


def backdate(ledger: Store, release_id: str, created: float) -> None:
    """The pending release was created at ``created`` (epoch s) as far as the sweeper
    sees (``Store.stale``): its row's ``created_at``."""
    _sql(ledger, "UPDATE releases SET created_at = to_timestamp(%s) WHERE id = %s",
         created, release_id)


def set_resent(ledger: Store, release_id: str, at: float,
               resends: int | None = None) -> None:
    """The sweeper's last re-send of the release was at ``at`` (epoch s), and (if given)
    it made ``resends`` of them."""
    _sql(ledger, "UPDATE releases SET resent_at = to_timestamp(%s), "
                 "resends = COALESCE(%s, resends) WHERE id = %s", at, resends, release_id)


def field(ledger: Store, release_id: str, name: str) -> str | None:
    """One of the release's stored fields (``store.Fields``), None if it is not set."""
    return (ledger.release(release_id) or {}).get(name)


def on_record(env: dict[str, str], url: str) -> dict[str, str]:
    """``env`` (a process's environment) with its record at ``url`` (``own_database``)."""
    return {**env, "PRIVRELEASE_DATABASE_URL": url}


def run_store(app: Flask, lease_seconds: int) -> Store:
    """The app's record as a worker's store holds it, its runs leased for
    ``lease_seconds`` (an API's leases for the config's: a test that starts runs itself
    makes its own)."""
    ledger = wiring.of(app).ledger
    assert isinstance(ledger, PgLedger), type(ledger)
    return PgLedger(ledger.pool, lease_seconds, documents=ledger.documents)


def close(app: Flask) -> None:
    """Close the connection pool of an app of a rig's own (``own_database``): the
    session's PostgreSQL serves many tests' rigs."""
    ledger = wiring.of(app).ledger
    assert isinstance(ledger, PgLedger), type(ledger)
    ledger.pool.close()


@dataclasses.dataclass
class WorkerRig:
    """A rig of its own (``worker_rig``): an app on its Valkey database and record, the
    Valkey client, and ``start``, which starts one more worker on the releases queue."""

    app: Flask
    client: redis.Redis
    start: Callable[[], None]
    log: Path


@contextmanager
def worker_rig(request: pytest.FixtureRequest, redis_url: str, service_env: dict[str, str],
               app: Flask, log_dir: Path, db: int, lease: int,
               env: dict[str, str] | None = None) -> Iterator[WorkerRig]:
    """Valkey database ``db`` and a record of the test module's own (``own_database``), an
    app on them whose runs lease for ``lease`` seconds with an operator key (``TOKEN``),
    and workers started on demand (2 processes each, environment ``env`` besides; their
    own sweeper never runs: the tests sweep). The workers stop and the database is
    emptied at the end."""
    from service import apikeys
    from service.api.app import create_app
    from service.releases.queue import RELEASES_QUEUE
    from tests.conftest import ROOT, wait_for_worker
    from tests.integration.conftest import TOKEN

    url = redis_url.rsplit("/", 1)[0] + f"/{db}"
    record = own_database(request)
    client = rkeys.connect(url)
    client.flushdb()
    flask_app = create_app(dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url,
                                               database_url=record, lease_seconds=lease))
    apikeys.create(wiring.of(flask_app).keys, "operator", token=TOKEN)
    worker_env = on_record({**service_env, "PRIVRELEASE_REDIS_URL": url,
                            "PRIVRELEASE_LEASE_SECONDS": str(lease),
                            "PRIVRELEASE_SWEEP_INTERVAL": "3600", **(env or {})}, record)
    log = log_dir / "worker.log"
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        with open(log, "ab") as fh:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "2",
                 "--queues", RELEASES_QUEUE, "--loglevel", "info"], env=worker_env, cwd=ROOT,
                stdout=fh, stderr=subprocess.STDOUT))
        wait_for_worker(client)

    try:
        yield WorkerRig(flask_app, client, start, log)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        client.flushdb()
        close(flask_app)


def queued_messages(client: redis.Redis, release_id: str) -> int:
    """The release's messages waiting in the releases queue or fetched and not yet
    acknowledged (kombu's unacked set)."""
    from service.releases import sweeper
    from service.releases.queue import RELEASES_QUEUE

    queued = sum(release_id in m for m in client.lrange(RELEASES_QUEUE, 0, -1))
    return queued + sum(release_id in m for m in client.hvals(sweeper.UNACKED))


# -- reading and making the record ----------------------------------------------------

def sql(store: Store, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run ``query`` in one committed transaction of a ``PgLedger``'s pool: its rows
    (none for a statement that returns none)."""
    assert isinstance(store, PgLedger), type(store)
    with store.pool.connection() as conn, conn.cursor() as cur:
        cur.execute(query, args)
        return cur.fetchall() if cur.description is not None else []


def write_document(store: Store, dataset_id: str, text: str) -> None:
    """Store ``text`` as the dataset's document as it is, past every script (a document
    written by an older release of the service)."""
    assert sql(store, "UPDATE datasets SET document = %s WHERE id = %s RETURNING 1",
               text, dataset_id)


def retired_versions(store: Store, dataset_id: str) -> set[int]:
    """The versions the dataset's ledger marks retired (what the reserve step refuses)."""
    rows = sql(store, "SELECT retired_versions FROM ledgers WHERE dataset_id = %s",
               dataset_id)
    return {int(v) for v in rows[0][0]} if rows else set()


def set_allocation_scope(store: Store, dataset_id: str, key_id: str, scope: str) -> None:
    """Mark a key's allocation ``listed`` or ``legacy`` (``legacy``: what the policy
    migration leaves on an allocation written before allocations listed measures)."""
    assert sql(store, "UPDATE allocation_scopes SET scope = %s "
                      "WHERE dataset_id = %s AND key_id = %s RETURNING 1",
               scope, dataset_id, key_id)


@contextmanager
def another_host(config: Config) -> Iterator[Store]:
    """The store another API host of the session's service would have: the same record
    over connections of its own."""
    pool = database.connect(config.require_database_url(), max_size=4)
    try:
        yield PgLedger(pool, config.lease_seconds)
    finally:
        pool.close()


#: the Valkey key families of the old Valkey store's record (none is written any more)
RECORD_KEYS = ("pr:ds:*", "pr:rel:*", "pr:resv:*", "pr:replay:*", "pr:idem:*", "pr:ana:*",
               "pr:key:*", "pr:apikeys")
#: each PostgreSQL table of the record, and the column naming a row
RECORD_ROWS = {"datasets": "id", "ledgers": "dataset_id", "releases": "id",
               "replays": "fingerprint", "idempotency": "key", "holdouts": "dataset_id",
               "outbox": "release_id", "analyses": "id", "api_keys": "id",
               "console_sessions": "digest"}


def record_entries(store: Store, client: Any) -> set[str]:
    """Every entry of the record (``<table>:<row>`` of its tables but the append-only
    events, and the budget rows): what a request that is refused must not add to.
    Valkey keeps nothing of the record: any key of the old store's families found there
    counts too."""
    found = {k for pattern in RECORD_KEYS for k in client.scan_iter(pattern, count=1000)}
    for table, column in RECORD_ROWS.items():
        found |= {f"{table}:{name}" for (name,) in
                  sql(store, f"SELECT {column}::text FROM {table}")}
    found |= {f"budgets:{d}:{m}" for d, m in
              sql(store, "SELECT dataset_id, measure FROM budgets")}
    found |= {f"allocations:{d}:{k}:{m}" for d, k, m in
              sql(store, "SELECT dataset_id, key_id, measure FROM allocations")}
    return found


# -- keys, console sessions and analyses -----------------------------------------------

def _pg_keys(keys: KeyStore) -> PgKeyStore:
    assert isinstance(keys, PgKeyStore), type(keys)
    return keys


def key_digests(keys: KeyStore) -> list[str]:
    """The token digest of every stored key (one per key: a digest twice is a bug)."""
    return list(_pg_keys(keys).digests().values())


def key_store_text(keys: KeyStore) -> list[str]:
    """Everything the key store keeps, as text: every row of its tables (to say a token is
    in none of them)."""
    with _pg_keys(keys).pool.connection() as conn, conn.cursor() as cur:
        out = []
        for table in ("api_keys", "console_sessions", "service_secrets"):
            cur.execute(f"SELECT t::text FROM {table} AS t")
            out += [row[0] for row in cur.fetchall()]
        return out


def expire_sessions(keys: KeyStore, key_id: str) -> None:
    """Every console session of ``key_id`` expires now (its time ran out)."""
    with _pg_keys(keys).pool.connection() as conn:
        conn.execute("UPDATE console_sessions SET expires_at = now() WHERE key_id = %s",
                     (key_id,))


def session_count(keys: KeyStore, key_id: str) -> int:
    """How many sessions of ``key_id`` the store still holds, live or not."""
    with _pg_keys(keys).pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM console_sessions WHERE key_id = %s",
                           (key_id,)).fetchone()
        return int(row[0]) if row else 0


def analysis_ids(analyses: AnalysisStore) -> set[str]:
    """Every stored analysis's id."""
    assert isinstance(analyses, PgAnalysisStore), type(analyses)
    with analyses.pool.connection() as conn:
        return {row[0] for row in conn.execute("SELECT id FROM analyses").fetchall()}
