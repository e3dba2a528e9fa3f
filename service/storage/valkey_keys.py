"""API keys and console sessions in Valkey (``ValkeyKeyStore``): the keys of the store
before PostgreSQL, unchanged, so a service on the Valkey store keeps working and
``privrelease migrate-from-valkey`` reads them (``service.storage.keys`` has the contract).

- ``pr:key:<digest>``: a key's record as JSON (``KeyRecord``), by its token's digest;
- ``pr:apikeys``: a hash of key id -> token digest (listing, lookups by id);
- ``pr:console:secret``: the console's signing secret (SET NX: made once);
- ``pr:console:session:<digest>``: a session's key id, by the digest of the session id,
  with its expiry as the key's TTL.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from service.storage import rkeys
from service.storage.keys import KeyRecord

#: the shared signing secret of the console (when not configured)
SECRET_KEY = f"{rkeys.P}console:secret"
SESSION_PREFIX = f"{rkeys.P}console:session:"


def session_key(session_digest: str) -> str:
    return SESSION_PREFIX + session_digest


class ValkeyKeyStore:
    """``KeyStore`` on a Valkey client."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def add_key(self, token_digest: str, record: KeyRecord) -> KeyRecord:
        existing = self.key_by_digest(token_digest)
        if existing is not None:
            return existing
        pipe = self.r.pipeline(transaction=True)
        pipe.set(rkeys.api_key(token_digest), json.dumps(record))
        pipe.hset(rkeys.API_KEYS, record["id"], token_digest)
        pipe.execute()
        return record

    def key_by_digest(self, token_digest: str) -> KeyRecord | None:
        raw = self.r.get(rkeys.api_key(token_digest))
        return _loaded(raw)

    def key_by_id(self, key_id: str) -> KeyRecord | None:
        token_digest = self.r.hget(rkeys.API_KEYS, key_id)
        return self.key_by_digest(token_digest) if token_digest else None

    def all_keys(self) -> list[KeyRecord]:
        digests = self.r.hgetall(rkeys.API_KEYS)
        if not digests:
            return []
        raws = self.r.mget([rkeys.api_key(d) for d in digests.values()])
        records = [rec for raw in raws if (rec := _loaded(raw)) is not None]
        return sorted(records, key=lambda rec: (str(rec["created_at"]), str(rec["id"])))

    def digests(self) -> dict[str, str]:
        """key id -> token digest of every key (``privrelease migrate-from-valkey``)."""
        found: dict[str, str] = self.r.hgetall(rkeys.API_KEYS)
        return found

    def has_key(self, key_id: str) -> bool:
        return bool(self.r.hexists(rkeys.API_KEYS, key_id))

    def remove_key(self, key_id: str) -> bool:
        token_digest = self.r.hget(rkeys.API_KEYS, key_id)
        if token_digest is None:
            return False
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(rkeys.api_key(token_digest))
        pipe.hdel(rkeys.API_KEYS, key_id)
        pipe.execute()
        return True

    # -- the console ---------------------------------------------------------------------

    def console_secret(self, candidate: str) -> str:
        self.r.set(SECRET_KEY, candidate, nx=True)
        return str(self.r.get(SECRET_KEY))

    def stored_console_secret(self) -> str | None:
        """The secret if one was made (``privrelease migrate-from-valkey``)."""
        found: str | None = self.r.get(SECRET_KEY)
        return found

    def add_session(self, session_digest: str, key_id: str, seconds: int) -> None:
        self.r.set(session_key(session_digest), key_id, ex=seconds)

    def session_key_id(self, session_digest: str) -> str | None:
        # the key's own check (``apikeys.get``) follows: a revoked key's session is dead
        key_id: str | None = self.r.get(session_key(session_digest))
        return key_id

    def remove_session(self, session_digest: str) -> None:
        self.r.delete(session_key(session_digest))

    def sessions(self) -> list[tuple[str, str, int]]:
        """(session digest, key id, milliseconds left) of every live session
        (``privrelease migrate-from-valkey``)."""
        out = []
        for name in self.r.scan_iter(SESSION_PREFIX + "*", count=500):
            key_id, left = self.r.get(name), self.r.pttl(name)
            if key_id is not None and left is not None and left > 0:
                out.append((name[len(SESSION_PREFIX):], key_id, int(left)))
        return out


def _loaded(raw: Any) -> KeyRecord | None:
    if raw is None:
        return None
    record: KeyRecord = json.loads(raw)
    return record
