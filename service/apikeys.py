"""API keys: random tokens shown once, stored only as their SHA-256 digest.

The tokens are 32 random bytes, so a fast hash is enough: there is no
password to brute-force, and a leaked dump of the store (PostgreSQL, or Valkey on the
store before it: ``service.storage.keys``) reveals no usable key.
Each key also has a callback secret, used to sign the notifications sent to
its ``callback_url`` (shown once too, stored as is because signing needs it).

The API looks a bearer token's key up through a ``KeyCache`` (one per process): a key
found is kept for ``PRIVRELEASE_KEY_CACHE_SECONDS`` (1 s), by its token's digest, so a
client's requests within that second cost no lookup. An unknown token is never kept (the
next request looks again). ``revoke`` empties this process's caches of the key at once;
another API process accepts a revoked key until its entry lapses, at most that long.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.storage.keys import KeyRecord, KeyStore
from service.storage.ledger import now_iso

ROLES = ("operator", "analyst", "consumer")


@dataclass(frozen=True)
class ApiKey:
    """The public record of a key (never the token)."""

    id: str
    role: str
    label: str = ""
    datasets: tuple[str, ...] | None = None  # None: every dataset
    expires_at: str | None = None
    created_at: str = field(default_factory=now_iso)

    def expired(self, now: datetime | None = None) -> bool:
        if self.expires_at is None:
            return False
        return parse_time(self.expires_at) <= (now or datetime.now(UTC))

    def public(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["datasets"] = list(self.datasets) if self.datasets is not None else None
        return doc


def parse_time(value: str) -> datetime:
    """ISO 8601 with a timezone (``Z`` accepted); naive times are taken as UTC."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def utc_text(at: datetime) -> str:
    """A time as a key's ``expires_at`` is kept: UTC, ISO 8601, ``Z``."""
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "pr_" + secrets.token_urlsafe(32)


def create(store: KeyStore, role: str, label: str = "", token: str | None = None,
           datasets: tuple[str, ...] | None = None,
           expires_at: str | None = None) -> tuple[ApiKey, str]:
    """Store a new key and return it with its token (the only time it is seen).

    A given ``token`` that is already registered (a bootstrap key on restart)
    keeps its existing record. ``expires_at`` (ISO 8601) is kept in UTC.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    if expires_at is not None:
        expires_at = utc_text(parse_time(expires_at))
    if token is not None and (existing := lookup(store, token)) is not None:
        return existing, token
    token = token or new_token()
    key = ApiKey(id="key_" + secrets.token_hex(8), role=role, label=label, datasets=datasets,
                 expires_at=expires_at)
    record = {**key.public(), "callback_secret": secrets.token_hex(32)}
    # the same token registered meanwhile by another process: its record wins
    return _from_record(store.add_key(digest(token), record)), token


def _from_record(rec: KeyRecord) -> ApiKey:
    datasets = tuple(rec["datasets"]) if rec.get("datasets") is not None else None
    return ApiKey(id=rec["id"], role=rec["role"], label=rec.get("label", ""),
                  datasets=datasets, expires_at=rec.get("expires_at"),
                  created_at=rec["created_at"])


def lookup(store: KeyStore, token: str) -> ApiKey | None:
    """The key a bearer token belongs to (expired ones included), or None."""
    return _by_digest(store, digest(token))


def _by_digest(store: KeyStore, token_digest: str) -> ApiKey | None:
    rec = store.key_by_digest(token_digest)
    return _from_record(rec) if rec is not None else None


#: every live ``KeyCache`` of this process: ``revoke`` empties them of the key it revokes
_CACHES: weakref.WeakSet[KeyCache] = weakref.WeakSet()
_CACHES_LOCK = threading.Lock()


class KeyCache:
    """Keys found by token, kept ``seconds`` in this process (the API's lookups).

    Entries are keyed by the token's digest (never the token) and hold the key's public
    record; only keys found are kept, so made-up tokens neither fill it nor get a cached
    "no". Expiry (``ApiKey.expired``) is checked on every request against the record, so
    an expired key is refused on time. What can lag is a change made elsewhere: a key
    revoked (or its record changed) by another process is still answered from here until
    its entry lapses, ``seconds`` after it was read. ``revoke`` in this process drops the
    key's entries from every cache of the process at once. ``seconds`` 0: no cache.

    At most ``max_entries`` keys are kept: when full, lapsed entries go, then, if still
    full, the cache is emptied (a burst of distinct valid keys costs lookups, not memory).
    """

    def __init__(self, seconds: float, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[str, tuple[float, ApiKey]] = {}
        with _CACHES_LOCK:
            _CACHES.add(self)

    def lookup(self, store: KeyStore, token: str) -> ApiKey | None:
        """``lookup(store, token)``, answered from the cache while its entry is fresh."""
        if self.seconds <= 0:
            return lookup(store, token)
        token_digest = digest(token)
        now = self.clock()
        entry = self._entries.get(token_digest)
        if entry is not None and entry[0] > now:
            return entry[1]
        key = _by_digest(store, token_digest)
        if key is None:
            self._entries.pop(token_digest, None)
            return None
        if len(self._entries) >= self.max_entries:
            self._prune(now)
        self._entries[token_digest] = (now + self.seconds, key)
        return key

    def forget(self, key_id: str) -> None:
        """Drop every entry of the key ``key_id`` (it was revoked)."""
        for token_digest, (_, key) in list(self._entries.items()):
            if key.id == key_id:
                self._entries.pop(token_digest, None)

    def _prune(self, now: float) -> None:
        for token_digest, (until, _) in list(self._entries.items()):
            if until <= now:
                self._entries.pop(token_digest, None)
        if len(self._entries) >= self.max_entries:
            self._entries.clear()


def list_all(store: KeyStore) -> list[ApiKey]:
    """Every key, oldest first."""
    return [_from_record(rec) for rec in store.all_keys()]


def callback_secret(store: KeyStore, key_id: str) -> str | None:
    """The signing secret of a key, for notifications; None if the key is gone."""
    rec = store.key_by_id(key_id)
    return str(rec["callback_secret"]) if rec else None


def revoke(store: KeyStore, key_id: str) -> bool:
    """Delete a key at once: its console sessions end, and the next request with its
    token gets 401 from this process (its ``KeyCache`` entries dropped now) and from every
    other API process once their entry lapses (``KeyCache``: at most
    ``PRIVRELEASE_KEY_CACHE_SECONDS``)."""
    removed = store.remove_key(key_id)
    with _CACHES_LOCK:
        caches = list(_CACHES)
    for cache in caches:
        cache.forget(key_id)
    return removed


def exists(store: KeyStore, key_id: str) -> bool:
    return store.has_key(key_id)


def get(store: KeyStore, key_id: str) -> ApiKey | None:
    """A key's public record by id, or None."""
    rec = store.key_by_id(key_id)
    return _from_record(rec) if rec else None


def data_dir_bootstrap(store: KeyStore, path: Path) -> tuple[str, bool]:
    """The operator key of a data directory, for ``standalone``: (token, newly made).

    The token lives in ``path`` (mode 0600, next to the data it guards), so a restart
    keeps the same key instead of minting another valid one each time. A key that is
    no longer valid (revoked, expired, or a new store) is replaced by a new one: that
    is how an operator rotates it (revoke, restart).
    """
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token and (key := lookup(store, token)) is not None and not key.expired():
        return token, False
    key, token = create(store, "operator", label="bootstrap")
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(tmp, path)
    return token, True
