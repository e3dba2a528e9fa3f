"""API keys and console sessions in PostgreSQL (``PgKeyStore``; tables of migration
0005_keys), on the ledger's connection pool. ``service.storage.keys`` has the contract.

Each call is one short transaction, most of them one statement: a key is an index lookup
by its token's digest (``api_keys.digest``, unique) or by id (the primary key); the list
is one scan of ``api_keys_created`` in creation order; a session is a primary-key lookup
that only answers while it has not expired; revoking a key deletes its sessions with it
(ON DELETE CASCADE), in the same transaction. Expired sessions are pruned on the next
sign-in (an index range of ``console_sessions_expiry``: only the rows expired since).

A record's times read back in the forms the service writes: ``created_at`` as
``ledger.now_iso`` (milliseconds, ``Z``), ``expires_at`` in UTC as the API's key creation
writes it (``isoformat``, ``Z``; fractions only when there are any).
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from psycopg import errors
from psycopg_pool import ConnectionPool

from service.storage.keys import KeyRecord
from service.storage.pg_steps import Cursor, transaction

#: ``service_secrets.name`` of the console's signing secret
CONSOLE_SECRET = "console"
#: the ``api_keys`` columns ``_record`` reads, in its order
KEY_COLUMNS = "id, role, label, datasets, expires_at, created_at, callback_secret"


def iso_ms(at: datetime) -> str:
    """``ledger.now_iso``'s form of a time: UTC, milliseconds, ``Z``."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_utc(at: datetime) -> str:
    """A time in UTC as ``datetime.isoformat`` writes it, ``+00:00`` as ``Z``."""
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _time(value: Any) -> datetime | None:
    """An ISO 8601 time of a record (``Z`` accepted; naive taken as UTC), or None."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _record(row: tuple[Any, ...]) -> KeyRecord:
    key_id, role, label, datasets, expires_at, created_at, callback_secret = row
    return {"id": key_id, "role": role, "label": label,
            "datasets": list(datasets) if datasets is not None else None,
            "expires_at": iso_utc(expires_at) if expires_at is not None else None,
            "created_at": iso_ms(created_at), "callback_secret": callback_secret}


def insert_key(cur: Cursor, token_digest: str, record: KeyRecord) -> bool:
    """Insert ``record`` under ``token_digest`` unless that digest or id is taken:
    whether it was inserted (also what ``privrelease migrate-from-valkey`` runs)."""
    datasets = record.get("datasets")
    cur.execute(
        "INSERT INTO api_keys (id, digest, role, label, datasets, expires_at, created_at, "
        "callback_secret) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (record["id"], token_digest, record["role"], record.get("label") or "",
         list(datasets) if datasets is not None else None, _time(record.get("expires_at")),
         _time(record["created_at"]), record["callback_secret"]))
    return cur.rowcount == 1


class PgKeyStore:
    """``KeyStore`` on a PostgreSQL pool (``database.connect``; the ledger's)."""

    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    def add_key(self, token_digest: str, record: KeyRecord) -> KeyRecord:
        def step(cur: Cursor) -> KeyRecord:
            if insert_key(cur, token_digest, record):
                return record
            found = self._by(cur, "digest", token_digest)
            if found is None:  # the id was taken (a 64-bit random id: never in practice)
                raise ValueError("a key with this id exists")
            return found

        return transaction(self.pool, step)

    @staticmethod
    def _by(cur: Cursor, column: str, value: str) -> KeyRecord | None:
        if "\x00" in value:  # no stored id or digest has one (PostgreSQL text cannot)
            return None
        cur.execute(f"SELECT {KEY_COLUMNS} FROM api_keys WHERE {column} = %s", (value,))
        row = cur.fetchone()
        return _record(row) if row is not None else None

    def key_by_digest(self, token_digest: str) -> KeyRecord | None:
        return transaction(self.pool, lambda cur: self._by(cur, "digest", token_digest))

    def key_by_id(self, key_id: str) -> KeyRecord | None:
        return transaction(self.pool, lambda cur: self._by(cur, "id", key_id))

    def all_keys(self) -> list[KeyRecord]:
        def step(cur: Cursor) -> list[KeyRecord]:
            cur.execute(f"SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, id")
            return [_record(row) for row in cur.fetchall()]

        return transaction(self.pool, step)

    def has_key(self, key_id: str) -> bool:
        def step(cur: Cursor) -> bool:
            cur.execute("SELECT 1 FROM api_keys WHERE id = %s", (key_id,))
            return cur.fetchone() is not None

        return transaction(self.pool, step)

    def remove_key(self, key_id: str) -> bool:
        def step(cur: Cursor) -> bool:
            # its console sessions go in the same statement (ON DELETE CASCADE)
            cur.execute("DELETE FROM api_keys WHERE id = %s", (key_id,))
            return cur.rowcount == 1

        return transaction(self.pool, step)

    def digests(self) -> dict[str, str]:
        """key id -> token digest of every key (tests; the migration's comparison)."""
        def step(cur: Cursor) -> dict[str, str]:
            cur.execute("SELECT id, digest FROM api_keys")
            return {key_id: token_digest for key_id, token_digest in cur.fetchall()}

        return transaction(self.pool, step)

    # -- the console ---------------------------------------------------------------------

    def console_secret(self, candidate: str) -> str:
        def step(cur: Cursor) -> str:
            cur.execute("INSERT INTO service_secrets (name, value) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING", (CONSOLE_SECRET, candidate))
            # a new statement, a new snapshot: it sees the row another process committed
            cur.execute("SELECT value FROM service_secrets WHERE name = %s",
                        (CONSOLE_SECRET,))
            row = cur.fetchone()
            assert row is not None
            return str(row[0])

        return transaction(self.pool, step)

    def add_session(self, session_digest: str, key_id: str, seconds: int) -> None:
        def step(cur: Cursor) -> None:
            cur.execute("DELETE FROM console_sessions WHERE expires_at <= now()")
            cur.execute("INSERT INTO console_sessions (digest, key_id, expires_at) "
                        "VALUES (%s, %s, now() + make_interval(secs => %s))",
                        (session_digest, key_id, seconds))

        # the key revoked meanwhile: no session (it would answer nothing anyway)
        with contextlib.suppress(errors.ForeignKeyViolation):
            transaction(self.pool, step)

    def session_key_id(self, session_digest: str) -> str | None:
        def step(cur: Cursor) -> str | None:
            cur.execute("SELECT key_id FROM console_sessions "
                        "WHERE digest = %s AND expires_at > now()", (session_digest,))
            row = cur.fetchone()
            return str(row[0]) if row is not None else None

        return transaction(self.pool, step)

    def remove_session(self, session_digest: str) -> None:
        transaction(self.pool, lambda cur: cur.execute(
            "DELETE FROM console_sessions WHERE digest = %s", (session_digest,)))
