"""Redis key names and the client factory, so every process agrees on them."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

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


#: Seconds to wait for a connection / for a reply. Without them a Valkey that hangs
#: (stopped with SIGSTOP, a partitioned host) would hold every API thread forever;
#: with them a request fails with TimeoutError, which the API answers with 503.
#: Every command we send is short (no blocking reads), so 5 s is far above normal.
CONNECT_TIMEOUT = 2.0
REPLY_TIMEOUT = 5.0
#: redis-py re-sends a command after a connection error or timeout; one retry rides
#: over a dropped connection, more would only multiply REPLY_TIMEOUT before the 503.
RETRIES = 1


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client that speaks str (decode_responses): the one way we open Redis."""
    kwargs.setdefault("socket_connect_timeout", CONNECT_TIMEOUT)
    kwargs.setdefault("socket_timeout", REPLY_TIMEOUT)
    kwargs.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5),
                                     RETRIES))
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30, **kwargs)


def lease(release_id: str) -> str:
    return f"{P}lease:{release_id}"


def analysis(analysis_id: str) -> str:
    return f"{P}ana:{analysis_id}"


def release_analyses(release_id: str) -> str:
    return f"{P}rel:{release_id}:analyses"
