"""Analyses in PostgreSQL (``PgAnalysisStore``; table ``analyses`` of migration 0005_keys),
on the ledger's connection pool. ``service.storage.analysis_store`` has the contract.

Each call is one statement in one short transaction. A status change is a single
``UPDATE ... WHERE id = %s AND status = ANY(expected) ... RETURNING prior_status``: at
READ COMMITTED a concurrent change of the same row makes it wait, then re-check the
status on the row as committed, so exactly one of two racing changes from the same
status applies. ``SET prior_status =
status`` keeps the status the change found (the right-hand side of SET reads the row
before the change), which the statement returns. A release's page is one backward
range scan of ``analyses_release_newest`` from the cursor, fields included.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg_pool import ConnectionPool

from service.storage.analysis_store import Fields, Position
from service.storage.pg_keys import iso_ms
from service.storage.pg_steps import Cursor, transaction

#: the columns ``_fields`` reads, in its order
COLUMNS = ("release_id, analysis, params, releases, actor, status, work, created_at, "
           "started_at, deadline, finished_at, error, result, stored")
#: the fields a change may set, and how each is stored
_TEXT = frozenset({"status", "error", "result"})
_TIMES = frozenset({"started_at", "finished_at"})


def _time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _fields(row: tuple[Any, ...]) -> Fields:
    (release_id, analysis, params, releases, actor, status, work, created_at, started_at,
     deadline, finished_at, error, result, stored) = row
    out: Fields = {"release_id": release_id, "analysis": analysis, "params": params,
                   "releases": releases, "actor": actor, "status": status,
                   "created_at": iso_ms(created_at)}
    optional: dict[str, str | None] = {
        "work": repr(float(work)) if work is not None else None,
        "started_at": iso_ms(started_at) if started_at is not None else None,
        "deadline": repr(float(deadline)) if deadline is not None else None,
        "finished_at": iso_ms(finished_at) if finished_at is not None else None,
        "error": error, "result": result, "stored": "1" if stored else None}
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def _column_value(name: str, value: str) -> Any:
    """A field of a change as its column stores it."""
    if name in _TEXT:
        return value
    if name in _TIMES:
        return _time(value)
    if name == "stored":
        return value == "1"
    if name == "deadline":
        return float(value)
    raise ValueError(f"an analysis's {name!r} is not changed after it is made")


def insert(cur: Cursor, analysis_id: str, fields: Fields, order_us: int) -> bool:
    """Insert an analysis unless its id is taken: whether it was inserted (also what
    ``privrelease migrate-from-valkey`` runs, with the Valkey hash's fields)."""
    cur.execute(
        "INSERT INTO analyses (id, release_id, analysis, params, releases, actor, status, "
        "work, order_us, created_at, started_at, deadline, finished_at, error, result, "
        "stored) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (analysis_id, fields["release_id"], fields["analysis"], fields["params"],
         fields["releases"], fields.get("actor", ""), fields["status"],
         float(fields["work"]) if "work" in fields else None, order_us,
         _time(fields["created_at"]),
         _time(fields["started_at"]) if "started_at" in fields else None,
         float(fields["deadline"]) if "deadline" in fields else None,
         _time(fields["finished_at"]) if "finished_at" in fields else None,
         fields.get("error"), fields.get("result"), fields.get("stored") == "1"))
    return cur.rowcount == 1


class PgAnalysisStore:
    """``AnalysisStore`` on a PostgreSQL pool (``database.connect``; the ledger's)."""

    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    def add(self, analysis_id: str, fields: Fields, order_us: int) -> None:
        def step(cur: Cursor) -> None:
            if not insert(cur, analysis_id, fields, order_us):
                raise ValueError(f"analysis {analysis_id} exists")

        transaction(self.pool, step)

    def discard(self, release_id: str, analysis_id: str) -> None:
        transaction(self.pool, lambda cur: cur.execute(
            "DELETE FROM analyses WHERE id = %s AND release_id = %s",
            (analysis_id, release_id)))

    def start(self, analysis_id: str, started_at: str, deadline: float,
              lost_error: str) -> Fields | None:
        at = _time(started_at)

        def step(cur: Cursor) -> Fields | None:
            # the right-hand sides read the row as it was: ``status`` is the old status
            cur.execute(
                "UPDATE analyses SET prior_status = status, "
                "status = CASE WHEN status = 'queued' THEN 'running' ELSE 'failed' END, "
                "started_at = CASE WHEN status = 'queued' THEN %s ELSE started_at END, "
                "deadline = CASE WHEN status = 'queued' THEN %s ELSE deadline END, "
                "finished_at = CASE WHEN status = 'running' THEN %s ELSE finished_at END, "
                "error = CASE WHEN status = 'running' THEN %s ELSE error END "
                "WHERE id = %s AND status IN ('queued', 'running') "
                f"RETURNING prior_status, {COLUMNS}",
                (at, deadline, at, lost_error, analysis_id))
            row = cur.fetchone()
            if row is None or row[0] != "queued":
                return None  # ended or unknown; or ``running``: now failed, worker lost
            return _fields(row[1:])

        return transaction(self.pool, step)

    def transition(self, analysis_id: str, expected: tuple[str, ...],
                   changes: Fields) -> str | None:
        names = sorted(changes)
        values = [_column_value(name, changes[name]) for name in names]
        assignments = "".join(f", {name} = %s" for name in names)

        def step(cur: Cursor) -> str | None:
            cur.execute(f"UPDATE analyses SET prior_status = status{assignments} "
                        "WHERE id = %s AND status = ANY(%s) RETURNING prior_status",
                        (*values, analysis_id, list(expected)))
            row = cur.fetchone()
            return str(row[0]) if row is not None else None

        return transaction(self.pool, step)

    def fields(self, analysis_id: str) -> Fields | None:
        def step(cur: Cursor) -> Fields | None:
            cur.execute(f"SELECT {COLUMNS} FROM analyses WHERE id = %s", (analysis_id,))
            row = cur.fetchone()
            return _fields(row) if row is not None else None

        return transaction(self.pool, step)

    def status(self, analysis_id: str) -> str | None:
        def step(cur: Cursor) -> str | None:
            cur.execute("SELECT status FROM analyses WHERE id = %s", (analysis_id,))
            row = cur.fetchone()
            return str(row[0]) if row is not None else None

        return transaction(self.pool, step)

    def page(self, release_id: str, limit: int, after: Position | None
             ) -> list[tuple[str, int, Fields | None]]:
        def step(cur: Cursor) -> list[tuple[str, int, Fields | None]]:
            where = "release_id = %s"
            args: list[Any] = [release_id]
            if after is not None:
                where += " AND (order_us, id) < (%s, %s)"
                args += [after[0], after[1]]
            cur.execute(f"SELECT id, order_us, {COLUMNS} FROM analyses WHERE {where} "
                        "ORDER BY order_us DESC, id DESC LIMIT %s", (*args, limit + 1))
            return [(row[0], int(row[1]), _fields(row[2:])) for row in cur.fetchall()]

        return transaction(self.pool, step)

    def count(self, release_id: str) -> int:
        def step(cur: Cursor) -> int:
            cur.execute("SELECT count(*) FROM analyses WHERE release_id = %s", (release_id,))
            row = cur.fetchone()
            return int(row[0]) if row is not None else 0

        return transaction(self.pool, step)
