"""Analyses in Valkey (``ValkeyAnalysisStore``): the keys of the store before PostgreSQL,
unchanged, so a service on the Valkey store keeps its analyses and ``privrelease
migrate-from-valkey`` reads them (``service.storage.analysis_store`` has the contract).

- ``pr:ana:<id>``: the analysis's fields (``analysis_store.Fields``) as a hash;
- ``pr:rel:<release>:analyses``: the release's analyses, a sorted set scored by their
  creation time in microseconds (ties: the id, as sorted sets order members).

Every status change is one Lua compare-and-set script.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis

from service.storage import rkeys
from service.storage.analysis_store import Fields, Position

# KEYS[1] the analysis; ARGV: started_at, deadline (unix seconds), lost error JSON.
# Returns the stored request fields (flat) when this run may start, 'lost' when an
# earlier run started it (the message was redelivered), nil otherwise.
_START = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[1], 'deadline', ARGV[2])
  return redis.call('HGETALL', KEYS[1])
end
if status == 'running' then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'finished_at', ARGV[1], 'error', ARGV[3])
  return 'lost'
end
return false
"""

# KEYS[1] the analysis; ARGV: expected statuses (comma-separated), then field/value pairs.
# Sets the fields only while the status is one of the expected; returns the old status.
_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
for expected in string.gmatch(ARGV[1], '[^,]+') do
  if status == expected then
    redis.call('HSET', KEYS[1], unpack(ARGV, 2))
    return status
  end
end
return false
"""


class ValkeyAnalysisStore:
    """``AnalysisStore`` on a Valkey client."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def add(self, analysis_id: str, fields: Fields, order_us: int) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(rkeys.analysis(analysis_id), mapping=fields)
        pipe.zadd(rkeys.release_analyses(fields["release_id"]), {analysis_id: order_us})
        pipe.execute()

    def discard(self, release_id: str, analysis_id: str) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(rkeys.analysis(analysis_id))
        pipe.zrem(rkeys.release_analyses(release_id), analysis_id)
        pipe.execute()

    def start(self, analysis_id: str, started_at: str, deadline: float,
              lost_error: str) -> Fields | None:
        reply = self.r.eval(_START, 1, rkeys.analysis(analysis_id), started_at,
                            repr(deadline), lost_error)
        if not isinstance(reply, list):
            return None
        return dict(zip(reply[::2], reply[1::2], strict=True))

    def transition(self, analysis_id: str, expected: tuple[str, ...],
                   changes: Fields) -> str | None:
        args: list[str] = [",".join(expected)]
        for key, value in changes.items():
            args += [key, value]
        old = self.r.eval(_TRANSITION, 1, rkeys.analysis(analysis_id), *args)
        return str(old) if old else None

    def fields(self, analysis_id: str) -> Fields | None:
        found: Fields = self.r.hgetall(rkeys.analysis(analysis_id))
        return found or None

    def status(self, analysis_id: str) -> str | None:
        found: str | None = self.r.hget(rkeys.analysis(analysis_id), "status")
        return found

    def page(self, release_id: str, limit: int, after: Position | None
             ) -> list[tuple[str, int, Fields | None]]:
        key = rkeys.release_analyses(release_id)
        rows: list[tuple[Any, Any]]
        if after is None:
            rows = self.r.zrevrange(key, 0, limit, withscores=True)
        else:
            score, last = after
            ties = int(self.r.zcount(key, score, score))
            rows = [(m, s) for m, s in self.r.zrevrangebyscore(
                        key, score, "-inf", start=0, num=limit + 1 + ties, withscores=True)
                    if s < score or m < last][:limit + 1]
        pipe = self.r.pipeline(transaction=False)
        for analysis_id, _ in rows:
            pipe.hgetall(rkeys.analysis(analysis_id))
        found = pipe.execute() if rows else []
        return [(str(analysis_id), int(score), h or None)
                for (analysis_id, score), h in zip(rows, found, strict=True)]

    def count(self, release_id: str) -> int:
        return int(self.r.zcard(rkeys.release_analyses(release_id)))

    def every(self, batch: int = 500) -> Iterator[list[tuple[str, int | None, Fields]]]:
        """Every analysis, ``batch`` at a time: (id, creation time in microseconds,
        fields), the time None for one without a place in its release's list (none is
        made so) (``privrelease migrate-from-valkey``)."""
        names: list[str] = []
        for name in self.r.scan_iter(rkeys.analysis("*"), count=batch):
            if name.count(":") == 2:  # pr:ana:<id> only
                names.append(name)
            if len(names) >= batch:
                yield self._read(names)
                names = []
        if names:
            yield self._read(names)

    def _read(self, names: list[str]) -> list[tuple[str, int | None, Fields]]:
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        found = [(name.rsplit(":", 1)[1], h) for name, h in zip(names, pipe.execute(),
                                                                 strict=True)
                 if h.get("release_id") and h.get("status")]
        for analysis_id, h in found:
            pipe.zscore(rkeys.release_analyses(h["release_id"]), analysis_id)
        scores = pipe.execute() if found else []
        return [(analysis_id, int(score) if score is not None else None, h)
                for (analysis_id, h), score in zip(found, scores, strict=True)]
