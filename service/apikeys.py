"""API keys: random tokens shown once, stored only as their SHA-256 digest.

The tokens are 32 random bytes, so a fast hash is enough: there is no
password to brute-force, and a leaked Redis dump reveals no usable key.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field

import redis

from service import rkeys
from service.ledger import now_iso

ROLES = ("operator", "analyst", "consumer")


@dataclass(frozen=True)
class ApiKey:
    """The public record of a key (never the token)."""

    id: str
    role: str
    label: str = ""
    datasets: tuple[str, ...] | None = None  # None: every dataset
    created_at: str = field(default_factory=now_iso)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "pr_" + secrets.token_urlsafe(32)


def create(client: redis.Redis, role: str, label: str = "", token: str | None = None,
           datasets: tuple[str, ...] | None = None) -> tuple[ApiKey, str]:
    """Store a new key and return it with its token (the only time it is seen).

    A given ``token`` that is already registered (a bootstrap key on restart)
    keeps its existing record.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    if token is not None and (existing := lookup(client, token)) is not None:
        return existing, token
    token = token or new_token()
    key = ApiKey(id="key_" + secrets.token_hex(8), role=role, label=label, datasets=datasets)
    record = json.dumps({"id": key.id, "role": role, "label": label,
                         "datasets": list(datasets) if datasets is not None else None,
                         "created_at": key.created_at})
    pipe = client.pipeline(transaction=True)
    pipe.set(rkeys.api_key(digest(token)), record)
    pipe.hset(rkeys.API_KEYS, key.id, digest(token))
    pipe.execute()
    return key, token


def lookup(client: redis.Redis, token: str) -> ApiKey | None:
    """The key a bearer token belongs to, or None."""
    raw = client.get(rkeys.api_key(digest(token)))
    if raw is None:
        return None
    rec = json.loads(raw)
    datasets = tuple(rec["datasets"]) if rec.get("datasets") is not None else None
    return ApiKey(id=rec["id"], role=rec["role"], label=rec.get("label", ""),
                  datasets=datasets, created_at=rec["created_at"])
