"""Redis key names and the client factory, so every process agrees on them."""

from __future__ import annotations

from typing import Any

import redis

P = "pr:"


def ledger(dataset_id: str) -> str:
    return f"{P}ds:{dataset_id}:ledger"


def events(dataset_id: str) -> str:
    return f"{P}ds:{dataset_id}:events"


def dataset(dataset_id: str) -> str:
    return f"{P}ds:{dataset_id}"


DATASETS = f"{P}datasets"
RELEASES = f"{P}releases"
PENDING = f"{P}pending"
API_KEYS = f"{P}apikeys"
WORKERS = f"{P}workers:"


def release(release_id: str) -> str:
    return f"{P}rel:{release_id}"


def reservation(release_id: str) -> str:
    return f"{P}resv:{release_id}"


def replay(fingerprint: str) -> str:
    return f"{P}replay:{fingerprint}"


def idempotency(scope: str, key_digest: str) -> str:
    return f"{P}idem:{scope}:{key_digest}"


def api_key(token_digest: str) -> str:
    return f"{P}key:{token_digest}"


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client that speaks str (decode_responses): the one way we open Redis."""
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30, **kwargs)


def lease(release_id: str) -> str:
    return f"{P}lease:{release_id}"


def analysis(analysis_id: str) -> str:
    return f"{P}ana:{analysis_id}"


def release_analyses(release_id: str) -> str:
    return f"{P}rel:{release_id}:analyses"
