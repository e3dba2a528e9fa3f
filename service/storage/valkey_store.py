"""The old Valkey store's record, read only: what ``privrelease migrate-from-valkey``
moves into PostgreSQL (``service.storage.valkey_migration``).

Before issue #29 the record lived in Valkey, written by Lua scripts that are gone; this
module keeps only its key layout and the reads the move needs, answering as that store's
own readers did (a release's fields with its request and output read back from the
document store where a settle had moved them; a dataset's audit events from its archive
file then its stream). The layout, under the prefix ``pr:``:

- ``pr:datasets`` (sorted set: dataset id by registration time, epoch s),
  ``pr:ds:<id>`` (the document), ``pr:ds:<id>:ledger`` (hash: ``cap:<m>``,
  ``committed:<m>``, ``reserved:<m>``, ``alloc:<key>:<kind>:<m>``, ``alloc:<key>:scope``,
  ``notion_lock``, ``retired``, ``retired:v<n>``, ``recharged:interval``),
  ``pr:ds:<id>:holdout`` (hash: ``rows``, ``releases``), ``pr:ds:<id>:events`` (stream);
- ``pr:releases`` (sorted set: release id by creation time), ``pr:rel:<id>`` (hash: the
  fields of ``service.storage.store``, with ``doc`` / ``result`` naming files of the
  document store, and ``replay_key``), ``pr:resv:<id>`` (what a pending one holds:
  ``m:<measure>``, ``a:<measure>``), ``pr:replay:<fingerprint>`` (a release id),
  ``pr:outbox`` (sorted set: unsent release by reservation time), ``pr:idem:*`` (hash:
  ``fp``, ``id``, ``version``; its TTL what is left of its time);
- ``pr:apikeys`` (hash: key id -> token digest), ``pr:key:<digest>`` (the key's record
  as JSON), ``pr:console:secret``, ``pr:console:session:<digest>`` (a key id; TTL);
- ``pr:ana:<id>`` (hash: an analysis's fields), ``pr:rel:<release>:analyses`` (sorted
  set: analysis id by creation time in microseconds);
- ``<data dir>/audit/<dataset>.jsonl``: events the store had archived out of the stream
  (one ``{"id": stream id, "fields": {...}}`` per line, oldest first; a torn last line
  is still in the stream).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from service.storage import release_documents
from service.storage.analysis_store import Fields
from service.storage.keys import KeyRecord
from service.storage.ledger import READ_BATCH
from service.storage.release_documents import DocumentStore
from service.storage.rkeys import P

DATASETS = f"{P}datasets"
RELEASES = f"{P}releases"
OUTBOX = f"{P}outbox"
API_KEYS = f"{P}apikeys"
CONSOLE_SECRET = f"{P}console:secret"
SESSION_PREFIX = f"{P}console:session:"
IDEMPOTENCY_PATTERN = f"{P}idem:*"
REPLAY_PREFIX = f"{P}replay:"
ANALYSIS_PATTERN = f"{P}ana:*"


def dataset(dataset_id: str) -> str:
    return f"{P}ds:{dataset_id}"


def ledger(dataset_id: str) -> str:
    return f"{P}ds:{dataset_id}:ledger"


def holdout(dataset_id: str) -> str:
    return f"{P}ds:{dataset_id}:holdout"


def events(dataset_id: str) -> str:
    return f"{P}ds:{dataset_id}:events"


def release(release_id: str) -> str:
    return f"{P}rel:{release_id}"


def reservation(release_id: str) -> str:
    return f"{P}resv:{release_id}"


def api_key(token_digest: str) -> str:
    return f"{P}key:{token_digest}"


def release_analyses(release_id: str) -> str:
    return f"{P}rel:{release_id}:analyses"


def _stream_id(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


class ValkeyRecord:
    """The old store's record on ``client``, its documents in ``docs`` and its archived
    audit events in ``audit_dir``. Read with every process of the service stopped: no
    step changes the record while it is read."""

    def __init__(self, client: redis.Redis, docs: DocumentStore, audit_dir: Path) -> None:
        self.r, self.docs, self.audit_dir = client, docs, Path(audit_dir)

    def dataset_document(self, dataset_id: str) -> str | None:
        raw = self.r.get(dataset(dataset_id))
        return None if raw is None else str(raw)

    def release(self, release_id: str) -> dict[str, str] | None:
        """The release's fields, its request and output read back from the document
        store where they moved (``release_documents.fields``: DocumentMissing if a file
        it names is gone); None if there is no such release."""
        raw = self.r.hgetall(release(release_id))
        return release_documents.fields(self.docs, release_id, raw) if raw else None

    def releases(self, ids: list[str]) -> list[tuple[str, dict[str, str]]]:
        """``release`` of each of ``ids`` that exists, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for release_id in ids:
            pipe.hgetall(release(release_id))
        return [(release_id, release_documents.fields(self.docs, release_id, raw))
                for release_id, raw in zip(ids, pipe.execute(), strict=True) if raw]

    def events(self, dataset_id: str) -> Iterator[dict[str, str]]:
        """The dataset's audit events' fields, oldest first: the archived ones, then those
        of the stream after the archive's last (an event in both, left by a crash
        between the archive's append and its trim, is read once)."""
        last = (-1, -1)
        if "/" not in dataset_id and not dataset_id.startswith("."):
            try:
                with (self.audit_dir / f"{dataset_id}.jsonl").open("rb") as f:
                    for line in f:
                        if not line.endswith(b"\n"):
                            break  # a torn last line: its event is still in the stream
                        item = json.loads(line)
                        last = _stream_id(item["id"])
                        yield item["fields"]
            except FileNotFoundError:
                pass
        low = "-" if last < (0, 0) else f"({last[0]}-{last[1]}"
        while batch := self.r.xrange(events(dataset_id), low, "+", count=READ_BATCH):
            yield from (fields for _, fields in batch)
            low = f"({batch[-1][0]}"

    # -- keys and the console --------------------------------------------------------------

    def key_digests(self) -> dict[str, str]:
        """key id -> token digest of every API key."""
        found: dict[str, str] = self.r.hgetall(API_KEYS)
        return found

    def key_by_digest(self, token_digest: str) -> KeyRecord | None:
        raw = self.r.get(api_key(token_digest))
        record: KeyRecord | None = None if raw is None else json.loads(raw)
        return record

    def console_secret(self) -> str | None:
        found: str | None = self.r.get(CONSOLE_SECRET)
        return found

    def sessions(self) -> list[tuple[str, str, int]]:
        """(session digest, key id, milliseconds left) of every live console session."""
        out = []
        for name in self.r.scan_iter(SESSION_PREFIX + "*", count=500):
            key_id, left = self.r.get(name), self.r.pttl(name)
            if key_id is not None and left is not None and left > 0:
                out.append((name[len(SESSION_PREFIX):], key_id, int(left)))
        return out

    # -- analyses --------------------------------------------------------------------------

    def analyses(self, batch: int = 500) -> Iterator[list[tuple[str, int | None, Fields]]]:
        """Every analysis, ``batch`` at a time: (id, creation time in microseconds: its
        place in its release's list, None without one, fields)."""
        names: list[str] = []
        for name in self.r.scan_iter(ANALYSIS_PATTERN, count=batch):
            if name.count(":") == 2:  # pr:ana:<id> only
                names.append(name)
            if len(names) >= batch:
                yield self._analyses(names)
                names = []
        if names:
            yield self._analyses(names)

    def _analyses(self, names: list[str]) -> list[tuple[str, int | None, Fields]]:
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        found: list[tuple[str, Any]] = [
            (name.rsplit(":", 1)[1], h) for name, h in zip(names, pipe.execute(), strict=True)
            if h.get("release_id") and h.get("status")]
        for analysis_id, h in found:
            pipe.zscore(release_analyses(h["release_id"]), analysis_id)
        scores = pipe.execute() if found else []
        return [(analysis_id, int(score) if score is not None else None, h)
                for (analysis_id, h), score in zip(found, scores, strict=True)]
