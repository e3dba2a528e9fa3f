"""PostgreSQL, the system of record (issue #29): the connection pool and the schema.

The privacy budget ledger, the releases and their audit events live in PostgreSQL: it
keeps every acknowledged change on disk (WAL, fsync), replicates it, and lets one ledger
step (a reserve, a start, a settle) be ONE short transaction that checks the caps, moves
the units and appends the audit event that records them, all or nothing. No step holds
a transaction open across I/O other than its own statements, so the pool stays small.

``connect`` opens a pool for a ``postgresql://`` URL; ``upgrade`` brings a database's
schema to the newest Alembic revision (``service/storage/migrations``), and is a no-op on
a database already there. ``service.storage.pg_ledger`` is the ledger on top.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from psycopg_pool import ConnectionPool

#: a small pool: each ledger step holds a connection for one short transaction
POOL_MIN_SIZE = 1
POOL_MAX_SIZE = 8
#: seconds a step waits for a free connection before PoolTimeout, in an API process (the
#: default): the request then answers 503 and its caller re-sends it (an
#: Idempotency-Key makes that safe). A step holds a connection for about a millisecond, so
#: a free one comes within milliseconds unless the pool is exhausted by an overload or
#: its connections are being replaced during a failover or a restart, which lasts
#: seconds to tens of seconds (a replica's promotion): an API request cannot usefully
#: wait that long (its client's own timeout, a gunicorn thread held meanwhile), and a
#: caller told 503 after 2 s re-sends sooner than one told after 10 s. 2 s is still
#: hundreds of times a step's time, so a burst of requests over a busy pool waits
#: rather than fails.
POOL_TIMEOUT = 2.0
#: (a worker process waits half its lease instead, ``service.wiring.build``: a run's
#: steps (start, lease, settle) had better wait through a failover than fail the run,
#: nobody waits on a worker's answer, and a run whose lease renewal waited that long
#: still holds its lease)


def connect(url: str, *, min_size: int = POOL_MIN_SIZE, max_size: int = POOL_MAX_SIZE,
            timeout: float = POOL_TIMEOUT) -> ConnectionPool[Any]:
    """An open pool of connections to ``url`` (``postgresql://...``), autocommit off: the
    caller commits each step's transaction. Close it with ``pool.close()``.

    ``timeout``: seconds a step waits for a free connection (``POOL_TIMEOUT``, an API
    process's; a worker's: half its lease); opening the pool waits as long for
    its first connections. A connection found broken is replaced: ``PgLedger._tx`` has
    the pool check its idle connections at the first one (``pool.check()``), so after a
    failover the step's next attempt gets a connection to the new primary."""
    pool: ConnectionPool[Any] = ConnectionPool(
        url, min_size=min_size, max_size=max_size, timeout=timeout, open=False,
        kwargs={"autocommit": False}, name="privrelease")
    pool.open(wait=True, timeout=timeout)
    return pool


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy URL (psycopg 3 driver) of a ``postgresql://`` or ``postgres://`` URL."""
    for scheme in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    raise ValueError("not a PostgreSQL URL (postgresql://...)")


def migrations_path() -> str:
    """The folder of the package's Alembic migrations (env.py, versions/)."""
    return str(resources.files("service.storage").joinpath("migrations"))


def upgrade(url: str, revision: str = "head") -> None:
    """Run the Alembic migrations on ``url`` up to ``revision`` (newest by default).

    The configuration is built here, not read from an alembic.ini: the script location is
    the installed package's migrations folder. env.py takes an advisory lock first, so
    processes starting together upgrade one after the other (the later ones find nothing
    to do)."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    config = Config()
    config.set_main_option("script_location", migrations_path())
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()
