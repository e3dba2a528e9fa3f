"""Per-API-key rate limiting with flask-limiter, counted in the service's Redis.

One shared budget of requests per key across all endpoints (an application
limit), so every API process and host counts against the same window. A
request is counted against its API key's id (never the token) when its bearer
token names a registered key; requests without a token, or with one that
names no key, are counted per remote address, so a flood of made-up tokens
shares one bucket instead of getting one each. Behind a reverse proxy set
``PRIVRELEASE_TRUSTED_PROXIES`` so the address is the client's, not the
proxy's. A refused request is a 429 problem document (via the problem
handlers, as for any HTTPException) with ``Retry-After``.

Estimates (``POST /v1/releases/estimate``) also count against a window of their own,
``PRIVRELEASE_ESTIMATE_RATE_LIMIT`` per key: they are free to the caller but a cold one
costs seconds of CPU (see service/releases/pricing.py).

A request costs one Valkey round trip per window it counts against (``OneTripWindow``):
the hit's script answers the window's count and its expiry along with the decision, and
the ``X-RateLimit-*`` headers are written from that answer. flask-limiter's own
fixed-window strategy reads the count (GET) and the expiry (TTL) again for the headers:
three round trips.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, Response, current_app, g, has_app_context, has_request_context, request
from flask_limiter import ApplicationLimit, Limiter
from limits import RateLimitItem, parse_many
from limits.storage import RedisStorage
from limits.strategies import FixedWindowRateLimiter
from limits.util import WindowStats

from service.api import auth
from service.api.problems import RETRY_AFTER_SECONDS
from service.config import ENV_PREFIX, Config
from service.storage import rkeys
from service.storage.store import DOWN

#: probes, scrapes and docs are never limited (load balancers, Prometheus, browsers)
EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"})
#: rate limit counters live under the service's key prefix
KEY_PREFIX = "pr:ratelimit"


#: flask-limiter's fixed-window hit (``limits``' incr_expire.lua) answering, with the
#: count, the window's remaining life in milliseconds (PTTL: -1 without expiry)
HIT_SCRIPT = """
local amount = tonumber(ARGV[2])
local current = redis.call("incrby", KEYS[1], amount)
if tonumber(current) == amount then
    redis.call("expire", KEYS[1], ARGV[1])
end
return {current, redis.call("pttl", KEYS[1])}
"""
#: ``g`` attribute: the windows this request's hits saw, by limit key
_SEEN = "_ratelimit_windows"


class OneTripWindow(FixedWindowRateLimiter):
    """flask-limiter's ``fixed-window`` strategy, same keys, counts and expiries, in one
    round trip per window: ``hit`` keeps the count and expiry its script answered (in
    the request's ``g``), and ``get_window_stats``, which the headers read after the
    view, answers from them instead of a GET and a TTL. Outside a request, or for a
    window this request did not hit, it reads Valkey as the stock strategy does."""

    def __init__(self, storage: RedisStorage) -> None:
        super().__init__(storage)
        self.redis_storage = storage
        self.script = storage.get_connection().register_script(HIT_SCRIPT.encode())

    def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        key = item.key_for(*identifiers)
        count, pttl = self.script([self.redis_storage.prefixed_key(key)],
                                  [item.get_expiry(), cost])
        count = int(count)
        if has_request_context():
            g.setdefault(_SEEN, {})[key] = (count, time.time() + max(int(pttl), 0) / 1000)
        return count <= item.amount

    def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        key = item.key_for(*identifiers)
        seen = g.get(_SEEN) if has_request_context() else None
        if seen is None or key not in seen:
            return super().get_window_stats(item, *identifiers)
        count, reset = seen[key]
        return WindowStats(reset, max(0, item.amount - count))


def client_key() -> str:
    """Who a request counts against: its registered key, else its address.

    The key is looked up once per request (``auth.request_key``, reused by the
    role check). If the key store is unreachable the address is used, and the route
    reports the outage.
    """
    try:
        key = auth.request_key()
    except DOWN:
        key = None
    if key is not None:
        return "key:" + key.id
    return "addr:" + (request.remote_addr or "unknown")


def _exempt() -> bool:
    return request.path in EXEMPT_PATHS


def _storage_uri(redis_url: str) -> str:
    """limits spells a Unix socket ``redis+unix://`` (redis-py ``unix://``), and
    Sentinel ``redis+sentinel://`` (see ``rkeys.SentinelURL.limits``)."""
    sentinel = rkeys.parse_sentinel(redis_url)
    if sentinel is not None:
        return sentinel.limits()[0]
    return "redis+" + redis_url if redis_url.startswith("unix://") else redis_url


def _storage_options(redis_url: str) -> dict[str, Any]:
    """The storage's connection options beyond its URI (Sentinel's master db, auth)."""
    sentinel = rkeys.parse_sentinel(redis_url)
    return {} if sentinel is None else sentinel.limits()[1]


def _one_line(record: logging.LogRecord) -> bool:
    """While Valkey is down the limiter fails on every request; its error type is news,
    the same stack trace per request is not."""
    if record.exc_info and record.exc_info[1] is not None:
        record.error_type = type(record.exc_info[1]).__name__
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


_LOG = logging.getLogger("privrelease.ratelimit")
_LOG.addFilter(_one_line)


def _retry_after(response: Response) -> Response:
    """Keep ``Retry-After`` meaningful: flask-limiter writes its window's reset onto
    every response, merged (by max) with any value already there.

    A 429 keeps the limiter's value, at least 1 s (it truncates to an int, which can
    be 0 in the window's last second, inviting an immediate retry). A 503 (Valkey or
    the broker unreachable) gets back the service's own short delay, not the end of
    the rate window. A view that set ``g.retry_after`` (a 202 ``pricing``) gets that
    value. Any other response loses the header: it means nothing there.
    """
    own = g.get("retry_after") if has_app_context() else None
    if own is not None and response.status_code not in {429, 503}:
        response.headers["Retry-After"] = str(own)
    elif response.status_code == 429:
        if response.headers.get("Retry-After") == "0":
            response.headers["Retry-After"] = "1"
    elif response.status_code == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    else:
        response.headers.pop("Retry-After", None)
    return response


def init_app(app: Flask) -> Limiter | None:
    """Limit every request per key to ``config.rate_limit`` and estimates to
    ``config.estimate_rate_limit``; None when both are off."""
    config: Config = app.config["PRIVRELEASE"]
    if not config.rate_limit and not config.estimate_rate_limit:
        return None
    try:
        if config.rate_limit:
            parse_many(config.rate_limit)
    except ValueError as err:
        raise SystemExit(f"{ENV_PREFIX}RATE_LIMIT: {err}") from None
    # registered before the limiter's own after_request, so it runs after it
    app.after_request(_retry_after)
    def message() -> str:
        breached = limiter.current_limit
        return f"rate limit exceeded: {breached.limit if breached else config.rate_limit}"

    limiter = Limiter(
        client_key,
        application_limits=[ApplicationLimit(limit_provider=config.rate_limit,
                                             error_message=message)]
        if config.rate_limit else [],
        storage_uri=_storage_uri(config.require_redis_url()),
        storage_options={"key_prefix": KEY_PREFIX,
                         **_storage_options(config.require_redis_url())},
        strategy="fixed-window",
        headers_enabled=True,
        # Valkey down: fail open. The limiter guards throughput, not privacy; the route
        # itself needs Valkey and answers 503 (problems.UNAVAILABLE), so refusing here
        # too would add nothing but a second failure to log.
        swallow_errors=True,
    )
    limiter.logger = _LOG  # JSON lines, no messages
    limiter.request_filter(_exempt)
    limiter.init_app(app)
    # the headers from the hit's own answer (one round trip, not three)
    assert isinstance(limiter._storage, RedisStorage)
    limiter._limiter = OneTripWindow(limiter._storage)
    _limit_estimates(app, limiter, config)
    return limiter


def _limit_estimates(app: Flask, limiter: Limiter, config: Config) -> None:
    """Estimates get their own, tighter per-key window on top of the shared one: a cold
    estimate can cost seconds of CPU while the other endpoints cost milliseconds."""
    if not config.estimate_rate_limit:
        return
    try:
        parse_many(config.estimate_rate_limit)
    except ValueError as err:
        raise SystemExit(f"{ENV_PREFIX}ESTIMATE_RATE_LIMIT: {err}") from None
    rate = config.estimate_rate_limit
    # flask-limiter checks a decorated limit when the decorated function runs; the route
    # calls this one (count_estimate). Counted per key in Valkey like the shared limit,
    # so every API process and host counts against the same window
    app.extensions[_ESTIMATE] = limiter.limit(
        rate, error_message=f"estimate rate limit exceeded: {rate}")(_estimate_window)


_ESTIMATE = "privrelease.estimate_limit"


def _estimate_window() -> None:
    """The function the estimate limit is attached to (its name keys the window)."""


def count_estimate() -> None:
    """Count one estimate against the caller's estimate window; 429 when it is full."""
    check = current_app.extensions.get(_ESTIMATE)
    if check is not None:
        check()
