"""States of the system of record that no API call or ``Store`` method makes, made the
same way on either store (``PgLedger``: SQL through its pool; ``Ledger``, the Valkey store:
its keys), for the tests of the run, the sweeper and the pricing jobs.

And, for a test rig with a broker (a Valkey database) of its own, a record of its own:
in a session whose service runs on PostgreSQL, a fresh migrated database (the sweeper of
a worker on another broker would otherwise take the rig's releases for lost ones, and
the rig's sweeper the session's); in a Valkey session, none (the record is the rig's
Valkey database).
"""

from __future__ import annotations

import pytest
from flask import Flask

from service import wiring
from service.storage import database, rkeys
from service.storage.ledger import Ledger
from service.storage.pg_ledger import PgLedger
from service.storage.store import Store
from tests.conftest import TEST_STORE, database_on


def own_database(request: pytest.FixtureRequest) -> str | None:
    """A new database migrated to head on the session's PostgreSQL server (its URL) if
    the session's service runs on PostgreSQL; None (the Valkey store) otherwise."""
    if TEST_STORE != "postgres":
        return None
    url = database_on(request.getfixturevalue("postgres_url"))
    database.upgrade(url)
    return url


def _sql(ledger: PgLedger, statement: str, *args: object) -> None:
    with ledger.pool.connection() as conn:
        conn.execute(statement, args)


def lapse(ledger: Store, release_id: str) -> None:
    """The release's run lease lapses now (its worker stalled or died): the row's
    ``lease_until`` in the past, or the lease key (whose TTL would have run out) gone."""
    if isinstance(ledger, PgLedger):
        _sql(ledger, "UPDATE releases SET lease_until = now() - interval '1 second' "
                     "WHERE id = %s", release_id)
    else:
        assert isinstance(ledger, Ledger)
        ledger.r.delete(rkeys.lease(release_id))


def backdate(ledger: Store, release_id: str, created: float) -> None:
    """The pending release was created at ``created`` (epoch s) as far as the sweeper
    sees (``Store.stale``): its row's ``created_at``, or its score in the pending index."""
    if isinstance(ledger, PgLedger):
        _sql(ledger, "UPDATE releases SET created_at = to_timestamp(%s) WHERE id = %s",
             created, release_id)
    else:
        assert isinstance(ledger, Ledger)
        ledger.r.zadd(rkeys.PENDING, {release_id: created})


def set_resent(ledger: Store, release_id: str, at: float,
               resends: int | None = None) -> None:
    """The sweeper's last re-send of the release was at ``at`` (epoch s), and (if given)
    it made ``resends`` of them."""
    if isinstance(ledger, PgLedger):
        _sql(ledger, "UPDATE releases SET resent_at = to_timestamp(%s), "
                     "resends = COALESCE(%s, resends) WHERE id = %s",
             at, resends, release_id)
    else:
        assert isinstance(ledger, Ledger)
        ledger.r.hset(rkeys.release(release_id), "resent_at", f"{at:.3f}")
        if resends is not None:
            ledger.r.hset(rkeys.release(release_id), "resends", str(resends))


def field(ledger: Store, release_id: str, name: str) -> str | None:
    """One of the release's stored fields (``store.Fields``), None if it is not set."""
    return (ledger.release(release_id) or {}).get(name)


def on_record(env: dict[str, str], url: str | None) -> dict[str, str]:
    """``env`` (a process's environment) with its record at ``url`` (``own_database``):
    ``PRIVRELEASE_DATABASE_URL`` set to it, or unset for the Valkey store."""
    out = {k: v for k, v in env.items() if k != "PRIVRELEASE_DATABASE_URL"}
    if url is not None:
        out["PRIVRELEASE_DATABASE_URL"] = url
    return out


def run_store(app: Flask, lease_seconds: int) -> Store:
    """The app's record as a worker's store holds it, its runs leased for
    ``lease_seconds``: a Valkey API's ``Ledger`` leases for its default (an API runs no
    job), so a test that starts runs itself makes its own."""
    svc = wiring.of(app)
    if isinstance(svc.ledger, PgLedger):
        return PgLedger(svc.ledger.pool, lease_seconds, documents=svc.ledger.documents)
    return Ledger(svc.client, lease_seconds=lease_seconds, documents=svc.documents)


def close(app: Flask) -> None:
    """Close the connection pool of an app of a rig's own (``own_database``), if it has
    one: the session's PostgreSQL serves many tests' rigs."""
    ledger = wiring.of(app).ledger
    if isinstance(ledger, PgLedger):
        ledger.pool.close()
