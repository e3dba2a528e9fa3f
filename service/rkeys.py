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
#: releases reserved whose job message is not yet known to be published (the outbox):
#: score = reservation time; the API removes its entry once the task is sent, and the
#: sweeper or a retry sends whatever a dead API left behind (never refunds it)
OUTBOX = f"{P}outbox"
#: failed releases (score: when they failed), for the jobs list
FAILED = f"{P}failed"
#: set once every release made before the per-dataset indexes existed is indexed
INDEXED = f"{P}indexed:v1"


def dataset_releases(dataset_id: str) -> str:
    """The dataset's releases, score = creation time (epoch s)."""
    return f"{P}ds:{dataset_id}:releases"


def dataset_pending(dataset_id: str) -> str:
    """The dataset's queued and running releases, score = creation time."""
    return f"{P}ds:{dataset_id}:pending"


def dataset_failed(dataset_id: str) -> str:
    """The dataset's failed releases, score = when they failed."""
    return f"{P}ds:{dataset_id}:failed"


def key_releases(key_id: str) -> str:
    """The releases one API key requested, score = creation time."""
    return f"{P}keyrel:{key_id}"


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


def pricing_job(job_key: str) -> str:
    """Set (with expiry) while a cold estimate's job for this precomputation is under way."""
    return f"{P}pricing:{job_key}"


def lease(release_id: str) -> str:
    return f"{P}lease:{release_id}"


def analysis(analysis_id: str) -> str:
    return f"{P}ana:{analysis_id}"


def release_analyses(release_id: str) -> str:
    return f"{P}rel:{release_id}:analyses"
