"""``privrelease migrate-from-valkey``: move a deployment's record from the old Valkey
store (read by ``service.storage.valkey_store``) into PostgreSQL
(``service.storage.pg_ledger``).

What moves, per dataset, in ONE transaction (all of a dataset or none of it): its
document and registration time, its ledger (caps, committed and reserved units, the
allocations with their rule, the notion lock, retirements, the interval recharge mark),
its hold-out counters, its audit events (the archived ones and those still in the
stream, in order), and its releases (status, request, output or the run attempt whose
result file holds it, error, times, run counts, the reservation a pending one holds,
whether it read the data or was charged, its re-sends) with their replays. Then, once
for the deployment: the outbox and the live Idempotency-Keys (with what is left of
their time), so a client's retry after the move is still recognised; the API keys (ids,
token digests, roles, grants, expiry, creation times and callback secrets: every token
keeps working, every notification is signed as before), the console's signing secret
and its live sessions (with what is left of their time: a signed-in operator stays
signed in), and the analyses (status, times, request, error or where their result is),
in their releases' order. The caller then writes down the implicit policy of the moved
datasets registered before the policy fields (``service.policy.migrate``), as the old
store's processes did at start-up.

A dataset already in PostgreSQL is skipped, and so is a key, a session or an analysis
already there: the command is safe to run again, and a run cut short resumes where it
stopped. An analysis whose release is not in PostgreSQL (its dataset was not moved: its
document was gone) is left behind and counted. Run it with the API and the workers stopped (it
refuses while a worker's heartbeat is live): a step taken on Valkey during the move
could be missed. Nothing is deleted from Valkey; once the service runs with
``PRIVRELEASE_DATABASE_URL``, Valkey's keys of the record are no longer read. A completed
move is marked in Valkey (``MOVED``): ``privrelease standalone``, whose API and workers
it starts itself (so none runs yet), moves an unmarked record at start-up; a deployment
of several hosts runs the command, with its processes stopped.

Result files, tables and dataset files stay where they are (the data directory), so
a release's output reads the same after the move. Leases are not moved: with the
workers stopped none is live, and a running release left behind is re-sent by the
sweeper (or charged, if it had read its data), as after any worker loss.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from psycopg.types.json import Jsonb

from service.storage import release_documents, valkey_store
from service.storage.pg_analyses import insert as insert_analysis
from service.storage.pg_keys import CONSOLE_SECRET, insert_key
from service.storage.pg_ledger import Cursor, PgLedger
from service.storage.pg_steps import transaction
from service.storage.rkeys import P
from service.storage.valkey_store import ValkeyRecord


@dataclass
class Moved:
    """What ``migrate`` did: datasets moved (and skipped, already there), releases and
    events moved with them, and the deployment-wide rows."""

    datasets: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    releases: int = 0
    events: int = 0
    outbox: int = 0
    idempotency_keys: int = 0
    keys: int = 0
    sessions: int = 0
    console_secret: bool = False
    analyses: int = 0
    #: analyses left behind: their release is not in PostgreSQL
    orphan_analyses: int = 0


def _at(value: str | None) -> datetime | None:
    """An ISO 8601 time as Valkey stored it (``now_iso``), or None."""
    return datetime.fromisoformat(value) if value else None


def _epoch(value: str | float | None) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if value not in (None, "") else None


def _ledger_rows(fields: dict[str, str]) -> tuple[dict[str, dict[str, int]],
                                                  dict[tuple[str, str], dict[str, int]],
                                                  dict[str, str]]:
    """The ledger hash as rows: per measure {cap, committed, reserved}; per (key,
    measure) the same for allocations; each key's allocation rule."""
    budgets: dict[str, dict[str, int]] = {}
    allocations: dict[tuple[str, str], dict[str, int]] = {}
    scopes: dict[str, str] = {}
    for name, value in fields.items():
        parts = name.split(":")
        if parts[0] in ("cap", "committed", "reserved") and len(parts) >= 2:
            measure = name.split(":", 1)[1]
            budgets.setdefault(measure, {"cap": 0, "committed": 0, "reserved": 0})[
                parts[0]] = int(value)
        elif parts[0] == "alloc" and len(parts) == 3 and parts[2] == "scope":
            scopes[parts[1]] = value
        elif parts[0] == "alloc" and len(parts) >= 4:
            key_id, kind, measure = parts[1], parts[2], name.split(":", 3)[3]
            allocations.setdefault((key_id, measure), {"cap": 0, "committed": 0,
                                                       "reserved": 0})[kind] = int(value)
    return budgets, allocations, scopes


def _event_row(fields: dict[str, str]) -> tuple[str, str, str, datetime | None,
                                                dict[str, int], dict[str, Any]]:
    """A stream event's fields as an ``events`` row: kind, release, actor, time, units
    (``m:<measure>``), the rest as detail (``version`` a number, as PgLedger writes it)."""
    units = {k[2:]: int(v) for k, v in fields.items() if k.startswith("m:")}
    detail: dict[str, Any] = {}
    for key, value in fields.items():
        if key.startswith("m:") or key in ("kind", "release_id", "actor", "at"):
            continue
        detail[key] = int(value) if key == "version" else value
    return (fields.get("kind", ""), fields.get("release_id", ""), fields.get("actor", ""),
            _at(fields.get("at")), units, detail)


class Migrator:
    """One move from ``source`` (the old store, its document store and audit archive)
    into ``target``."""

    def __init__(self, source: ValkeyRecord, target: PgLedger) -> None:
        self.source, self.target, self.r = source, target, source.r

    def run(self) -> Moved:
        moved = Moved()
        scores = dict(self.r.zrange(valkey_store.DATASETS, 0, -1, withscores=True))
        releases = self._releases_by_dataset()
        for dataset_id, score in scores.items():
            self._dataset(dataset_id, score, releases.get(dataset_id, []), moved)
        self._deployment(moved)
        self._keys(moved)
        self._analyses(moved)
        return moved

    def _releases_by_dataset(self) -> dict[str, list[tuple[str, float]]]:
        """Every release id with its creation score, by dataset (from its request)."""
        out: dict[str, list[tuple[str, float]]] = {}
        start, batch = 0, 500
        while rows := self.r.zrange(valkey_store.RELEASES, start, start + batch - 1,
                                    withscores=True):
            start += batch
            scores = dict(rows)
            for release_id, fields in self.source.releases(list(scores)):
                request = json.loads(fields.get("request") or "{}")
                if isinstance(request, dict) and request.get("dataset_id"):
                    out.setdefault(str(request["dataset_id"]), []).append(
                        (release_id, scores[release_id]))
        return out

    def _dataset(self, dataset_id: str, score: float, releases: list[tuple[str, float]],
                 moved: Moved) -> None:
        document = self.source.dataset_document(dataset_id)
        if document is None:
            return
        ledger = self.r.hgetall(valkey_store.ledger(dataset_id))
        holdout = self.r.hgetall(valkey_store.holdout(dataset_id))
        events = [_event_row(fields) for fields in self.source.events(dataset_id)]
        rows = [(rid, self.source.release(rid), self._reservation(rid)) for rid, _ in releases]
        replays = self._replays(dict(releases))

        def step(cur: Cursor) -> bool:
            cur.execute("SELECT 1 FROM datasets WHERE id = %s", (dataset_id,))
            if cur.fetchone() is not None:
                return False
            doc = json.loads(document)
            cur.execute("INSERT INTO datasets (id, document, created_at, created_by) "
                        "VALUES (%s, %s, %s, %s)",
                        (dataset_id, document, _epoch(score), doc.get("created_by", "")))
            budgets, allocations, scopes = _ledger_rows(ledger)
            retired_versions = sorted(int(k[len("retired:v"):]) for k in ledger
                                      if k.startswith("retired:v"))
            cur.execute("INSERT INTO ledgers (dataset_id, retired, retired_versions, "
                        "notion_lock, opened_by, recharged_interval) VALUES "
                        "(%s, %s, %s, %s, %s, %s)",
                        (dataset_id, ledger.get("retired") == "1", retired_versions,
                         ledger.get("notion_lock") or None, doc.get("created_by"),
                         "recharged:interval" in ledger))
            for measure, row in sorted(budgets.items()):
                cur.execute("INSERT INTO budgets (dataset_id, measure, cap, committed, "
                            "reserved) VALUES (%s, %s, %s, %s, %s)",
                            (dataset_id, measure, row["cap"], row["committed"],
                             row["reserved"]))
            for (key_id, measure), row in sorted(allocations.items()):
                cur.execute("INSERT INTO allocations (dataset_id, key_id, measure, cap, "
                            "committed, reserved) VALUES (%s, %s, %s, %s, %s, %s)",
                            (dataset_id, key_id, measure, row["cap"], row["committed"],
                             row["reserved"]))
            for key_id, scope in sorted(scopes.items()):
                cur.execute("INSERT INTO allocation_scopes (dataset_id, key_id, scope) "
                            "VALUES (%s, %s, %s)", (dataset_id, key_id, scope))
            if holdout:
                cur.execute("INSERT INTO holdouts (dataset_id, rows, releases) "
                            "VALUES (%s, %s, %s)", (dataset_id, int(holdout.get("rows", 0)),
                                                    int(holdout.get("releases", 0))))
            for kind, release_id, actor, at, units, detail in events:
                cur.execute("INSERT INTO events (dataset_id, kind, release_id, actor, at, "
                            "units, detail) VALUES (%s, %s, %s, %s, "
                            "COALESCE(%s::timestamptz, now()), %s, %s)",
                            (dataset_id, kind, release_id, actor, at, Jsonb(units),
                             Jsonb(detail)))
            for release_id, fields, reservation in rows:
                if fields is not None:
                    self._release(cur, dataset_id, release_id, fields, reservation)
            for fingerprint, release_id in replays:
                cur.execute("INSERT INTO replays (fingerprint, release_id) VALUES (%s, %s) "
                            "ON CONFLICT DO NOTHING", (fingerprint, release_id))
            return True

        if self.target._tx(step):
            moved.datasets.append(dataset_id)
            moved.releases += sum(1 for _, fields, _ in rows if fields is not None)
            moved.events += len(events)
        else:
            moved.skipped.append(dataset_id)

    def _reservation(self, release_id: str) -> tuple[dict[str, int], dict[str, int]]:
        """What a pending release holds: on the dataset (``m:``) and on its key's
        allocation (``a:``), in units (reserve.lua's reservation hash)."""
        held = self.r.hgetall(valkey_store.reservation(release_id))
        return ({k[2:]: int(v) for k, v in held.items() if k.startswith("m:")},
                {k[2:]: int(v) for k, v in held.items() if k.startswith("a:")})

    def _replays(self, releases: dict[str, float]) -> list[tuple[str, str]]:
        """(fingerprint, release) of the replays naming one of ``releases``."""
        out = []
        for release_id in releases:
            key = self.r.hget(valkey_store.release(release_id), "replay_key")
            if key and self.r.get(key) == release_id:
                out.append((key[len(valkey_store.REPLAY_PREFIX):], release_id))
        return out

    @staticmethod
    def _release(cur: Cursor, dataset_id: str, release_id: str, fields: dict[str, str],
                 reservation: tuple[dict[str, int], dict[str, int]]) -> None:
        request = fields["request"]
        version = json.loads(request).get("dataset_version")
        pending = fields["status"] in ("queued", "running")
        cost, alloc_cost = reservation if pending else ({}, {})
        result = fields.get(release_documents.RESULT_ATTEMPT)
        cur.execute(
            "INSERT INTO releases (id, dataset_id, actor, status, request, replay_key, "
            "version, cost, alloc_cost, error, output, result_attempt, output_table, worker, "
            "created_at, started_at, finished_at, attempt, data_read, charged, resends, "
            "resent_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s, %s, %s, %s, %s, %s)",
            (release_id, dataset_id, fields.get("actor", ""), fields["status"], request,
             None, version if isinstance(version, int) else None, Jsonb(cost),
             Jsonb(alloc_cost), fields.get("error"),
             None if result is not None else fields.get("output"),
             int(result) if result is not None else None,
             int(fields["table"]) if fields.get("table") else None, fields.get("worker"),
             _at(fields.get("created_at")) or datetime.now(UTC), _at(fields.get("started_at")),
             _at(fields.get("finished_at")), int(fields.get("attempts") or 0),
             fields.get("data_read") == "1", fields.get("charged") == "1",
             int(fields["resends"]) if fields.get("resends") else None,
             _epoch(fields.get("resent_at"))))

    def _deployment(self, moved: Moved) -> None:
        """The outbox and the live Idempotency-Keys (releases and datasets of any dataset
        moved now or before)."""
        outbox = self.r.zrange(valkey_store.OUTBOX, 0, -1, withscores=True)
        keys = []
        for key in self.r.scan_iter(valkey_store.IDEMPOTENCY_PATTERN, count=500):
            fp, made, version = self.r.hmget(key, "fp", "id", "version")
            ttl = self.r.pttl(key)
            if fp is None or (made is None and version is None) or ttl is None or ttl <= 0:
                continue  # expired, or not a key a request stored
            keys.append((key, fp, made or "", None if version is None else int(version), ttl))

        def step(cur: Cursor) -> tuple[int, int]:
            sent = kept = 0
            for release_id, score in outbox:
                cur.execute("INSERT INTO outbox (release_id, due_at) SELECT %s, %s WHERE "
                            "EXISTS (SELECT 1 FROM releases WHERE id = %s) "
                            "ON CONFLICT DO NOTHING", (release_id, _epoch(score), release_id))
                sent += cur.rowcount
            for key, fp, made, version, ttl in keys:
                # a release's key names it; an upload's its dataset; a version upload's
                # only the version (version.lua: what ``idempotent_version`` reads)
                is_release = made.startswith("rel_")
                cur.execute(
                    "INSERT INTO idempotency (key, fingerprint, release_id, dataset_id, "
                    "version, expires_at) VALUES (%s, %s, %s, %s, %s, now() + %s) "
                    "ON CONFLICT DO NOTHING",
                    (key, fp, made if is_release else None,
                     made if made and not is_release else None, version,
                     timedelta(milliseconds=ttl)))
                kept += cur.rowcount
            return sent, kept

        moved.outbox, moved.idempotency_keys = self.target._tx(step)

    def _keys(self, moved: Moved) -> None:
        """The API keys, as they are (same id, token digest, callback secret), the
        console's secret and the live sessions of keys that exist, in one transaction."""
        source = self.source
        records = [(digest, rec) for digest in source.key_digests().values()
                   if (rec := source.key_by_digest(digest)) is not None]
        secret = source.console_secret()
        sessions = source.sessions()

        def step(cur: Cursor) -> tuple[int, bool, int]:
            keys = sum(insert_key(cur, digest, rec) for digest, rec in records)
            made_secret = False
            if secret is not None:
                cur.execute("INSERT INTO service_secrets (name, value) VALUES (%s, %s) "
                            "ON CONFLICT DO NOTHING", (CONSOLE_SECRET, secret))
                made_secret = cur.rowcount == 1
            live = 0
            for digest, key_id, left_ms in sessions:
                # a revoked key's session (Valkey lets it run out) is not moved
                cur.execute("INSERT INTO console_sessions (digest, key_id, expires_at) "
                            "SELECT %s, %s, now() + %s WHERE EXISTS "
                            "(SELECT 1 FROM api_keys WHERE id = %s) ON CONFLICT DO NOTHING",
                            (digest, key_id, timedelta(milliseconds=left_ms), key_id))
                live += cur.rowcount
            return keys, made_secret, live

        moved.keys, moved.console_secret, moved.sessions = transaction(self.target.pool, step)

    def _analyses(self, moved: Moved, batch: int = 500) -> None:
        """Every analysis whose release is in PostgreSQL, ``batch`` to a transaction, at
        its place in its release's list (its creation time when it has none)."""
        for chunk in self.source.analyses(batch):

            def step(cur: Cursor, chunk: list[tuple[str, int | None, dict[str, str]]] = chunk
                     ) -> tuple[int, int]:
                cur.execute("SELECT id FROM releases WHERE id = ANY(%s)",
                            (sorted({h["release_id"] for _, _, h in chunk}),))
                known = {row[0] for row in cur.fetchall()}
                made = orphans = 0
                for analysis_id, order_us, h in chunk:
                    if h["release_id"] not in known:
                        orphans += 1
                        continue
                    if order_us is None:
                        order_us = int(datetime.fromisoformat(
                            h["created_at"].replace("Z", "+00:00")).timestamp() * 1_000_000)
                    made += insert_analysis(cur, analysis_id, h, order_us)
                return made, orphans

            made, orphans = transaction(self.target.pool, step)
            moved.analyses += made
            moved.orphan_analyses += orphans


#: set in Valkey once a move completed: a standalone start then does not look again
MOVED = f"{P}moved:postgres"


def migrate(source: ValkeyRecord, target: PgLedger) -> Moved:
    """Move every dataset not yet in ``target`` (see the module docstring), then mark
    Valkey as moved (``MOVED``)."""
    moved = Migrator(source, target).run()
    source.r.set(MOVED, datetime.now(UTC).isoformat())
    return moved


def pending(client: redis.Redis) -> bool:
    """Whether Valkey holds a record not moved yet (a deployment from before PostgreSQL:
    datasets, or keys alone): ``privrelease standalone`` then moves it before the API and
    workers start."""
    return (bool(client.zcard(valkey_store.DATASETS))
            or bool(client.hlen(valkey_store.API_KEYS))) and not client.exists(MOVED)
