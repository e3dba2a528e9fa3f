"""One short transaction on a pool of ``service.storage.database.connect``, run again
(bounded) when PostgreSQL rolled it back or its connection broke: what the stores beside
the ledger (``pg_keys``, ``pg_analyses``) run each step in. Their steps change nothing
twice when run again (an insert finds its row, a compare-and-set finds it done); what a
re-run step answers may differ (a delete re-run after its lost COMMIT reply finds nothing
to delete), as a command re-sent to Valkey would."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import errors
from psycopg_pool import ConnectionPool

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]

#: how many times a step is run when PostgreSQL rolled it back or the connection broke
RETRIES = 5


def retryable(err: Exception) -> bool:
    """A transaction PostgreSQL rolled back, or a connection that broke (the pool replaces
    it). Any other error (a bad query, a constraint) is raised."""
    if isinstance(err, errors.SerializationFailure | errors.DeadlockDetected
                  | errors.TransactionRollback):
        return True
    return broken(err)


def broken(err: Exception) -> bool:
    """The error of a connection that broke (or of a server shutting down / starting):
    the other connections the pool holds to that server may be dead too."""
    return type(err) in (psycopg.OperationalError, errors.AdminShutdown,
                         errors.CannotConnectNow)


def transaction(pool: ConnectionPool[Any], step: Callable[[Cursor], T]) -> T:
    """Run ``step`` in one transaction of ``pool``, committed if it returns."""
    for attempt in range(RETRIES):
        try:
            # the pool's connection context commits on success, rolls back on error
            with pool.connection() as conn, conn.cursor() as cur:
                return step(cur)
        except psycopg.OperationalError as err:
            if attempt == RETRIES - 1 or not retryable(err):
                raise
            time.sleep(0.005 * 2 ** attempt + secrets.randbelow(5) / 1000)
    raise AssertionError("unreachable")
