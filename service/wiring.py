"""One place that builds the service's dependencies, for the API and the workers alike.

Every process builds one ``Services`` from its ``Config`` (per process, after any fork:
clients are never shared across a fork) and hands it down; nothing else creates a
client, a ledger or a store. The API keeps it in ``app.extensions`` (``current``), a
worker in its task module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import redis

from mechanisms import precompute
from service.config import Config
from service.releases import pricing
from service.releases.queue import Queue, make_celery
from service.storage import database, objects, rkeys
from service.storage.analysis_store import AnalysisStore
from service.storage.dataset_files import DatasetStore
from service.storage.keys import KeyStore
from service.storage.pg_analyses import PgAnalysisStore
from service.storage.pg_keys import PgKeyStore
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.release_tables import OutputStore
from service.storage.store import Store

#: the ``app.extensions`` key of the API's services
EXTENSION = "privrelease"

#: who builds: the API and the sweeper (the worker's heartbeat thread) answer or give up
#: at once; a worker's runs wait out a failover
Role = Literal["api", "worker", "sweeper"]


@dataclass(frozen=True)
class Services:
    """What the release pipeline works with: the config, Valkey (the broker's server:
    rate limits, caches, heartbeats; nothing that may not be lost), the record on
    PostgreSQL (the ledger, keys and analyses), the stores (dataset versions, release
    documents, release tables, precomputations) and the job queue. Dataset versions and
    release tables share one object store (``objects.from_config``:
    PRIVRELEASE_STORAGE_URL)."""

    config: Config
    client: redis.Redis
    #: the system of record (PRIVRELEASE_DATABASE_URL)
    ledger: Store
    documents: DocumentStore
    datasets: DatasetStore
    outputs: OutputStore
    queue: Queue
    #: heavy public precomputations shared by every process on the data directory
    precomputed: precompute.Store
    #: API keys and console sessions, beside the ledger (the same pool)
    keys: KeyStore
    #: analyses, beside the ledger
    analyses: AnalysisStore


def build(config: Config, role: Role = "api", *, celery: Any = None) -> Services:
    """The services of one process; exits with one message without
    PRIVRELEASE_DATABASE_URL (``Config.require_database_url``): PostgreSQL is the one
    system of record, and no process runs without it.

    Each ledger step is one transaction, run again (bounded) when its connection broke.
    A worker's pool waits out a PostgreSQL failover or restart for up to half a lease (the
    run's lease, renewed until the compute ended, outlives that) rather than fail a job's
    read, which would refund an accepted release for nothing; the API answers 503 after
    ``database.POOL_TIMEOUT`` instead, and so does the sweeper (``sweeper``): it shares a
    thread with the worker's heartbeat, which a sweep waiting out a failover would stop
    (the next pass sweeps again).

    ``celery``: the Celery app to publish with (a worker's own); default, a new one that
    only sends (``service.releases.queue.make_celery``).
    """
    url = config.require_database_url()
    client = rkeys.connect(config.require_redis_url())
    documents = DocumentStore(config.releases_dir)
    pool = database.connect(url, timeout=max(database.POOL_TIMEOUT, config.lease_seconds / 2)
                            if role == "worker" else database.POOL_TIMEOUT)
    ledger = PgLedger(pool, config.lease_seconds, documents=documents)
    store = objects.from_config(config)  # dataset versions and release tables
    return Services(config, client, ledger, documents,
                    DatasetStore(store, staging_dir=config.staging_dir),
                    OutputStore(store, config.staging_dir),
                    Queue(celery if celery is not None else make_celery(config)),
                    pricing.precomputed(config, store), PgKeyStore(pool),
                    PgAnalysisStore(pool))


@contextmanager
def key_store(config: Config) -> Iterator[KeyStore]:
    """The key store alone, over a small pool closed after, for a process that registers
    a key before the API starts (``standalone``, ``privrelease api``'s bootstrap key)."""
    pool = database.connect(config.require_database_url(), min_size=1, max_size=2)
    try:
        yield PgKeyStore(pool)
    finally:
        pool.close()


def of(app: Any) -> Services:
    """The services of a Flask app (``service.api.app.create_app`` keeps them)."""
    services: Services = app.extensions[EXTENSION]
    return services


def current() -> Services:
    """The services of the Flask app handling this request."""
    from flask import current_app

    return of(current_app)
