"""Valkey's key names and the client factory, so every process agrees on them.

Valkey holds only what may be lost (the Celery broker's queues, rate-limit counters,
caches, heartbeats, metrics counters): the record is PostgreSQL's. The old Valkey store's
layout, which ``privrelease migrate-from-valkey`` reads, is ``service.storage.valkey_store``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

P = "pr:"
#: a worker's heartbeat: ``<WORKERS><hostname>`` = the server's run id, with a TTL
WORKERS = f"{P}workers:"


def idempotency(scope: str, key_digest: str) -> str:
    """The name an Idempotency-Key is kept under (``scope``: what it was sent to)."""
    return f"{P}idem:{scope}:{key_digest}"


#: Seconds to wait for a connection / for a reply. Without them a Valkey that hangs
#: (stopped with SIGSTOP, a partitioned host) would hold every API thread forever;
#: with them a request fails with TimeoutError, which the API answers with 503.
#: Every command we send is short (no blocking reads), so 5 s is far above normal.
CONNECT_TIMEOUT = 2.0
REPLY_TIMEOUT = 5.0
#: redis-py re-sends a command after a connection error or timeout; one retry rides
#: over a dropped connection, more would only multiply REPLY_TIMEOUT before the 503.
RETRIES = 1


@dataclass(frozen=True)
class SentinelURL:
    """``sentinel://[user:pass@]host1:26379,host2:26379/<master name>[/<db>]``.

    The user and password are the data nodes' (the primary's and replicas' ACL user);
    the sentinels' own, if they require one, are the query parameters
    ``sentinel_username`` and ``sentinel_password`` (sentinels usually have none).
    """

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    @property
    def sentinel_auth(self) -> dict[str, str | None]:
        """Credentials for the sentinels (explicit Nones: never the data nodes')."""
        return {"username": self.sentinel_username, "password": self.sentinel_password}

    def kombu(self) -> tuple[str, dict[str, Any]]:
        """The broker URL and transport options kombu's sentinel transport reads."""
        auth = ""
        if self.password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        url = ";".join(f"sentinel://{auth}{host}:{port}/{self.db}"
                       for host, port in self.sentinels)
        kwargs: dict[str, Any] = {k: v for k, v in self.sentinel_auth.items() if v is not None}
        kwargs |= {"socket_timeout": REPLY_TIMEOUT, "socket_connect_timeout": CONNECT_TIMEOUT}
        return url, {"master_name": self.master, "sentinel_kwargs": kwargs}


def parse_sentinel(url: str) -> SentinelURL | None:
    """The sentinel URL's parts, or None for any other URL (redis://, rediss://, unix://)."""
    parts = urlsplit(url)
    if parts.scheme != "sentinel":
        return None
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    sentinels = []
    for item in hostlist.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:  # no port given
            host, port = port, ""
        sentinels.append((host, int(port or SENTINEL_PORT)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or not all(h for h, _ in sentinels):
        raise ValueError("a sentinel URL is sentinel://[user:pass@]host:port[,host:port...]"
                         "/<master name>[/<db>]")
    query = dict(parse_qsl(parts.query))
    return SentinelURL(tuple(sentinels), unquote(path[0]), int(path[1]) if len(path) == 2 else 0,
                       unquote(username) or None if userinfo else None,
                       unquote(password) if userinfo and password else None,
                       query.get("sentinel_username"), query.get("sentinel_password"))


SENTINEL_PORT = 26379


class SentinelConnection(SentinelManagedConnection):
    """redis-py's connection to the master the sentinels name, asking them again on
    every reconnect.

    redis-py 8 asks the sentinels in ``connect()`` only, but a command re-sent after a
    connection error reconnects through ``connect_check_health()`` to the address the
    connection had: a re-send after a failover went back, for as long as it retried,
    to the demoted primary (a replica once it is back: READONLY each time).
    """

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> None:
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health, retry_socket_connect)


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client that speaks str (decode_responses): the one way we open Redis.

    A ``sentinel://`` URL gives a client of the master the sentinels name: after a
    failover its next connection goes to the promoted replica, and a connection still
    open to the demoted primary fails with ConnectionError (redis-py turns the replica's
    READONLY into one), which the API answers with 503.
    """
    kwargs.setdefault("socket_connect_timeout", CONNECT_TIMEOUT)
    kwargs.setdefault("socket_timeout", REPLY_TIMEOUT)
    kwargs.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5),
                                     RETRIES))
    sentinel = parse_sentinel(url)
    if sentinel is None:
        return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30,
                                    **kwargs)
    sentinels = Sentinel(
        list(sentinel.sentinels),
        sentinel_kwargs={**sentinel.sentinel_auth,
                         "socket_timeout": kwargs["socket_timeout"],
                         "socket_connect_timeout": kwargs["socket_connect_timeout"]})
    client: redis.Redis = sentinels.master_for(
        sentinel.master, connection_class=SentinelConnection, db=sentinel.db,
        username=sentinel.username,
        password=sentinel.password, decode_responses=True, health_check_interval=30, **kwargs)
    return client


def pricing_job(job_key: str) -> str:
    """Set (with expiry) while a cold estimate's job for this precomputation is under way."""
    return f"{P}pricing:{job_key}"
