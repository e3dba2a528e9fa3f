"""API keys: random tokens shown once, stored only as their SHA-256 digest.

The tokens are 32 random bytes, so a fast hash is enough: there is no
password to brute-force, and a leaked Redis dump reveals no usable key.
Each key also has a callback secret, used to sign the notifications sent to
its ``callback_url`` (shown once too, stored as is because signing needs it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from service.storage import rkeys
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


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "pr_" + secrets.token_urlsafe(32)


def create(client: redis.Redis, role: str, label: str = "", token: str | None = None,
           datasets: tuple[str, ...] | None = None,
           expires_at: str | None = None) -> tuple[ApiKey, str]:
    """Store a new key and return it with its token (the only time it is seen).

    A given ``token`` that is already registered (a bootstrap key on restart)
    keeps its existing record.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    if token is not None and (existing := lookup(client, token)) is not None:
        return existing, token
    token = token or new_token()
    key = ApiKey(id="key_" + secrets.token_hex(8), role=role, label=label, datasets=datasets,
                 expires_at=expires_at)
    record = {**key.public(), "callback_secret": secrets.token_hex(32)}
    pipe = client.pipeline(transaction=True)
    pipe.set(rkeys.api_key(digest(token)), json.dumps(record))
    pipe.hset(rkeys.API_KEYS, key.id, digest(token))
    pipe.execute()
    return key, token


def _from_record(raw: str) -> ApiKey:
    rec = json.loads(raw)
    datasets = tuple(rec["datasets"]) if rec.get("datasets") is not None else None
    return ApiKey(id=rec["id"], role=rec["role"], label=rec.get("label", ""),
                  datasets=datasets, expires_at=rec.get("expires_at"),
                  created_at=rec["created_at"])


def lookup(client: redis.Redis, token: str) -> ApiKey | None:
    """The key a bearer token belongs to (expired ones included), or None."""
    raw = client.get(rkeys.api_key(digest(token)))
    return _from_record(raw) if raw is not None else None


def list_all(client: redis.Redis) -> list[ApiKey]:
    digests = client.hgetall(rkeys.API_KEYS)
    if not digests:
        return []
    raws = client.mget([rkeys.api_key(d) for d in digests.values()])
    keys = [_from_record(raw) for raw in raws if raw is not None]
    return sorted(keys, key=lambda k: k.created_at)


def _record(client: redis.Redis, key_id: str) -> str | None:
    token_digest = client.hget(rkeys.API_KEYS, key_id)
    raw: str | None = client.get(rkeys.api_key(token_digest)) if token_digest else None
    return raw


def callback_secret(client: redis.Redis, key_id: str) -> str | None:
    """The signing secret of a key, for notifications; None if the key is gone."""
    raw = _record(client, key_id)
    return str(json.loads(raw)["callback_secret"]) if raw else None


def revoke(client: redis.Redis, key_id: str) -> bool:
    """Delete a key at once; the next request with its token gets 401."""
    token_digest = client.hget(rkeys.API_KEYS, key_id)
    if token_digest is None:
        return False
    pipe = client.pipeline(transaction=True)
    pipe.delete(rkeys.api_key(token_digest))
    pipe.hdel(rkeys.API_KEYS, key_id)
    pipe.execute()
    return True


def exists(client: redis.Redis, key_id: str) -> bool:
    return bool(client.hexists(rkeys.API_KEYS, key_id))


def get(client: redis.Redis, key_id: str) -> ApiKey | None:
    """A key's public record by id, or None."""
    raw = _record(client, key_id)
    return _from_record(raw) if raw else None


def data_dir_bootstrap(client: redis.Redis, path: Path) -> tuple[str, bool]:
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
    if token and (key := lookup(client, token)) is not None and not key.expired():
        return token, False
    key, token = create(client, "operator", label="bootstrap")
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(tmp, path)
    return token, True
