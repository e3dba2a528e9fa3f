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
from service.storage.durable import Replication
from service.storage.event_archive import AuditArchive
from service.storage.keys import KeyStore
from service.storage.ledger import Ledger
from service.storage.pg_analyses import PgAnalysisStore
from service.storage.pg_keys import PgKeyStore
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.release_tables import OutputStore
from service.storage.store import Store
from service.storage.valkey_analyses import ValkeyAnalysisStore
from service.storage.valkey_keys import ValkeyKeyStore

#: the ``app.extensions`` key of the API's services
EXTENSION = "privrelease"

#: who builds: the API and the sweeper (the worker's heartbeat thread) answer or give up
#: at once; a worker's runs wait out a failover
Role = Literal["api", "worker", "sweeper"]


@dataclass(frozen=True)
class Services:
    """What the release pipeline works with: the config, Valkey, the ledger, the stores
    (dataset versions, release documents, release tables, precomputations, keys and
    analyses) and the job queue. Dataset versions and release tables share one object
    store (``objects.from_config``: PRIVRELEASE_STORAGE_URL)."""

    config: Config
    client: redis.Redis
    #: the system of record: PostgreSQL (``PgLedger``) when PRIVRELEASE_DATABASE_URL is
    #: set, else the Valkey store before it (``Ledger``)
    ledger: Store
    documents: DocumentStore
    datasets: DatasetStore
    outputs: OutputStore
    queue: Queue
    #: heavy public precomputations shared by every process on the data directory
    precomputed: precompute.Store
    #: API keys and console sessions, beside the ledger (PostgreSQL's pool, or Valkey)
    keys: KeyStore
    #: analyses, beside the ledger
    analyses: AnalysisStore


def build(config: Config, role: Role = "api", *, celery: Any = None) -> Services:
    """The services of one process.

    A worker's client and ledger ride over a Valkey failover, re-sending a run's steps
    (start, lease, settle) for up to half a lease (the run's lease, renewed until the
    compute ended, outlives that), so a commit the old primary took with it is applied
    again, once (``service.storage.durable``), rather than fail a job's read, which would
    refund an accepted release for nothing. The API answers 503 at once instead, and so
    does the sweeper (``sweeper``): it shares a thread with the worker's heartbeat, which
    a sweep waiting out a failover would stop (the next pass sweeps again).

    ``celery``: the Celery app to publish with (a worker's own); default, a new one that
    only sends (``service.releases.queue.make_celery``).
    """
    documents = DocumentStore(config.releases_dir)
    audit = AuditArchive(config.audit_dir)
    replication = Replication.from_config(config)
    ledger: Store
    keys: KeyStore
    analyses: AnalysisStore
    if config.database_url:
        # PostgreSQL: each step one transaction, re-run (bounded) when a connection broke
        client = rkeys.connect(config.require_redis_url())
        # a run waits out a failover or a restart for half a lease (the API answers 503
        # after POOL_TIMEOUT): a run that read its data and could not settle is charged
        pool = database.connect(config.database_url, timeout=max(
            database.POOL_TIMEOUT, config.lease_seconds / 2) if role == "worker"
            else database.POOL_TIMEOUT)
        ledger = PgLedger(pool, config.lease_seconds, documents=documents)
        keys, analyses = PgKeyStore(pool), PgAnalysisStore(pool)
    elif role != "api":  # on the Valkey store a sweeper keeps the worker's retries
        client = rkeys.connect(config.require_redis_url(),
                               retry=rkeys.failover_retry(config.lease_seconds / 2))
        ledger = Ledger(client, config.lease_seconds, replication,
                        run_retry_seconds=config.lease_seconds / 2, documents=documents,
                        audit=audit)
    else:
        client = rkeys.connect(config.require_redis_url())
        ledger = Ledger(client, replication=replication, documents=documents, audit=audit)
    if not config.database_url:
        keys, analyses = ValkeyKeyStore(client), ValkeyAnalysisStore(client)
    store = objects.from_config(config)  # dataset versions and release tables
    return Services(config, client, ledger, documents,
                    DatasetStore(store, staging_dir=config.staging_dir),
                    OutputStore(store, config.staging_dir),
                    Queue(celery if celery is not None else make_celery(config)),
                    pricing.precomputed(config, store), keys, analyses)


@contextmanager
def key_store(config: Config) -> Iterator[KeyStore]:
    """The key store of ``config``'s record alone, for a process that registers a key
    before the API starts (``standalone``, ``privrelease api``'s bootstrap key): on
    PostgreSQL over a small pool closed after, else on Valkey."""
    if config.database_url:
        pool = database.connect(config.database_url, min_size=1, max_size=2)
        try:
            yield PgKeyStore(pool)
        finally:
            pool.close()
    else:
        client = rkeys.connect(config.require_redis_url())
        try:
            yield ValkeyKeyStore(client)
        finally:
            client.close()


def of(app: Any) -> Services:
    """The services of a Flask app (``service.api.app.create_app`` keeps them)."""
    services: Services = app.extensions[EXTENSION]
    return services


def current() -> Services:
    """The services of the Flask app handling this request."""
    from flask import current_app

    return of(current_app)
