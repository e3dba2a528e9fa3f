"""Paged reads of sorted-set indexes, with opaque cursors.

A list endpoint reads one page of ids from one or more sorted sets (a dataset's releases,
the releases a key may see across its datasets, the pending jobs) instead of every record
in the system: each page costs O(sets * (log N + limit)) whatever the filter or grant.
The cursor names the last item returned (its score and member), so a page boundary stays
put while items are added before it; it is opaque to clients (base64 of JSON) and checked
when read back. Releases are indexed by the reserve script as they are created; those
created before the indexes existed are indexed once (``ensure_release_indexes``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from service.errors import Invalid
from service.storage import rkeys
from service.storage.release_documents import DocumentStore, request_of

#: members sharing the cursor's score read back when the cursor's member left the set
#: (scores are creation times in ms: more ties than this do not happen)
TIE_WINDOW = 1000
#: releases indexed per round trip by the one-time backfill
BACKFILL_BATCH = 500


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the last item's score and member, and a list's phase (a list
    made of several indexes read one after the other, as the jobs list)."""

    score: float
    member: str
    phase: str = ""

    def encode(self) -> str:
        raw = json.dumps([self.score, self.member, self.phase], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str | None) -> Cursor | None:
        """The cursor a client sent back; 422 naming ``cursor`` if it is not one of ours."""
        if token is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            score, member, phase = json.loads(raw)
            if (not isinstance(score, int | float) or isinstance(score, bool)
                    or not math.isfinite(score) or not isinstance(member, str)
                    or not isinstance(phase, str)):
                raise ValueError
        except (ValueError, TypeError, binascii.Error):
            raise Invalid("not a cursor this server returned", code="validation_error",
                      field="cursor") from None
        return cls(float(score), member, phase)


#: the phase of a cursor over the audit events: its member is the store's event id
STREAM_PHASE = "stream"


def stream_cursor(event_id: str | None) -> Cursor | None:
    """The cursor of a page of audit events that ended at ``event_id`` (None: the last)."""
    if event_id is None:
        return None
    return Cursor(float(event_id.partition("-")[0]), event_id, STREAM_PHASE)


def stream_position(token: str | None) -> str | None:
    """The event id a cursor from ``stream_cursor`` names (the store checks its form:
    ``Store.audit_range``); 422 naming ``cursor`` for a list's cursor."""
    cursor = Cursor.decode(token)
    if cursor is None:
        return None
    if cursor.phase != STREAM_PHASE:
        raise Invalid("not a cursor this server returned", code="validation_error",
                      field="cursor")
    return cursor.member


def page(client: redis.Redis, keys: Sequence[str], limit: int, after: Cursor | None = None,
         *, newest_first: bool = True, phase: str = "") -> tuple[list[str], Cursor | None]:
    """Up to ``limit`` members of the union of the sorted sets ``keys``, ordered by score
    (then member) newest or oldest first, after ``after``; and the cursor of the next
    page, None when this page is the last."""
    if not keys or limit < 1:
        return [], None
    ranks: list[int | None] = [None] * len(keys)
    if after is not None:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            (pipe.zrevrank if newest_first else pipe.zrank)(key, after.member)
        ranks = pipe.execute()
    pipe = client.pipeline(transaction=False)
    plan: list[bool] = []  # per command: whether it is a tie read to filter
    for key, rank in zip(keys, ranks, strict=True):
        if after is None or rank is not None:  # by rank: exact and O(log N + limit)
            start = 0 if rank is None else rank + 1
            if newest_first:
                pipe.zrevrange(key, start, start + limit, withscores=True)
            else:
                pipe.zrange(key, start, start + limit, withscores=True)
            plan.append(False)
            continue
        # the cursor's member is not in this set: strictly past its score, plus its ties
        s = repr(after.score)
        if newest_first:
            pipe.zrevrangebyscore(key, f"({s}", "-inf", start=0, num=limit + 1,
                                  withscores=True)
            pipe.zrevrangebyscore(key, s, s, start=0, num=TIE_WINDOW, withscores=True)
        else:
            pipe.zrangebyscore(key, f"({s}", "+inf", start=0, num=limit + 1, withscores=True)
            pipe.zrangebyscore(key, s, s, start=0, num=TIE_WINDOW, withscores=True)
        plan += [False, True]
    found: dict[str, float] = {}
    for is_tie, rows in zip(plan, pipe.execute(), strict=True):
        for member, score in rows:
            if is_tie and after is not None and not (
                    member < after.member if newest_first else member > after.member):
                continue
            found[member] = score
    ordered = sorted(found.items(), key=lambda item: (item[1], item[0]), reverse=newest_first)
    rows = ordered[:limit]
    more = len(ordered) > limit
    nxt = Cursor(rows[-1][1], rows[-1][0], phase) if more else None
    return [member for member, _ in rows], nxt


def page_of(rows: Sequence[tuple[str, float]], limit: int, after: Cursor | None = None,
            *, newest_first: bool = True) -> tuple[list[str], Cursor | None]:
    """``page``'s answer for (member, score) rows already in hand (a key's few granted
    datasets, their scores read with one ZMSCORE): the same order and cursors."""
    ordered = sorted(rows, key=lambda row: (row[1], row[0]), reverse=newest_first)
    if after is not None:
        past = (lambda row: (row[1], row[0]) < (after.score, after.member)) if newest_first \
            else (lambda row: (row[1], row[0]) > (after.score, after.member))
        ordered = [row for row in ordered if past(row)]
    taken = ordered[:max(limit, 0)]
    more = len(ordered) > len(taken) > 0
    return [m for m, _ in taken], (Cursor(taken[-1][1], taken[-1][0]) if more else None)


def ensure_release_indexes(client: redis.Redis, docs: DocumentStore | None = None) -> None:
    """Index, once, the releases created before the per-dataset, per-key and failed
    indexes existed (the reserve and settle scripts maintain them from then on).

    Idempotent (ZADD of the same score), so two API processes doing it at once only
    repeat work; the flag is set when all are indexed. A release that ends while this
    runs may be left in its dataset's pending index: the jobs list drops such entries.
    """
    if client.get(rkeys.INDEXED):
        return
    start = 0
    while True:
        rows = client.zrange(rkeys.RELEASES, start, start + BACKFILL_BATCH - 1, withscores=True)
        if not rows:
            break
        start += BACKFILL_BATCH
        read = client.pipeline(transaction=False)
        for release_id, _ in rows:
            read.hmget(rkeys.release(release_id), "request", "status", "actor", "doc")
        write = client.pipeline(transaction=False)
        for (release_id, score), (raw, status, actor, sha) in zip(rows, read.execute(),
                                                                  strict=True):
            # a finished release's request is in ``docs`` (service.storage.release_documents)
            h = {k: v for k, v in (("request", raw), ("doc", sha)) if v is not None}
            try:
                req = request_of(docs, release_id, h) if sha is None or docs else None
            except LookupError:  # its file is missing: not indexed (the read says so)
                req = None
            dataset_id = req.get("dataset_id") if req is not None else None
            if not dataset_id:  # gone, or a bare ledger reservation: no dataset to index
                continue
            write.zadd(rkeys.dataset_releases(dataset_id), {release_id: score})
            if actor:
                write.zadd(rkeys.key_releases(actor), {release_id: score})
            if status in {"pricing", "queued", "running"}:
                write.zadd(rkeys.dataset_pending(dataset_id), {release_id: score})
            elif status in {"failed", "refused"}:
                write.zadd(rkeys.FAILED, {release_id: score})
                write.zadd(rkeys.dataset_failed(dataset_id), {release_id: score})
        write.execute()
    client.set(rkeys.INDEXED, "1")
