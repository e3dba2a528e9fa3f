"""Per-API-key rate limiting: fixed windows counted in the service's Valkey.

One shared budget of requests per key across all endpoints, so every API process and
host counts against the same window. A request is counted against its API key's id
(never the token) when its bearer token names a registered key; requests without a
token, or with one that names no key, are counted per remote address, so a flood of
made-up tokens shares one bucket instead of getting one each. Behind a reverse proxy set
``PRIVRELEASE_TRUSTED_PROXIES`` so the address is the client's, not the proxy's. A
refused request is a 429 problem document (via the problem handlers, as for any
HTTPException) with ``Retry-After``.

Estimates (``POST /v1/releases/estimate``) also count against a window of their own,
``PRIVRELEASE_ESTIMATE_RATE_LIMIT`` per key: they are free to the caller but a cold one
costs seconds of CPU (see service/releases/pricing.py).

The rates are parsed by the ``limits`` library (``"6000/minute;100000/hour"``) and
counted as its fixed-window strategy counts them (INCRBY, EXPIRE on the window's first
hit), in one script per window that also answers the window's remaining life, and the
``X-RateLimit-*`` headers come from that answer. This is the hook flask-limiter was used
for, without its per-request bookkeeping (a sixth of a POST's CPU in the API benchmark,
issue #29). The counters are the service's own client's (``wiring.Services.client``: a
URL, a socket or Sentinel).

A process takes its requests from a window in leases (``Lease``): one INCRBY of ``size``
requests, used by its next requests without a round trip. The count in Valkey includes
every leased request, so the processes together never admit more than the limit; a
lease is at most ``LEASE_SHARE`` of what the window had left when it was taken (at most
``LEASE_MAX``), so requests that die with a lease unused cost the key at most that share
per process, and near a full window (or for a small limit) a lease is one request: the
limiter is then exact, one round trip per request. At the default 6000/minute a busy key
costs one round trip per 23 requests or fewer; 64 at 16,384/minute and above.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass

import redis
from flask import Flask, Response, current_app, g, has_app_context, request
from limits import RateLimitItem, parse_many
from werkzeug.exceptions import TooManyRequests

from service import wiring
from service.api import auth
from service.api.problems import RETRY_AFTER_SECONDS
from service.config import ENV_PREFIX, Config
from service.storage.store import DOWN

#: probes, scrapes and docs are never limited (load balancers, Prometheus, browsers)
EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"})
#: rate limit counters live under the service's key prefix
KEY_PREFIX = "pr:ratelimit"
#: the ``app.extensions`` key of the app's :class:`RateLimiter`
EXTENSION = "privrelease.limiter"

#: a fixed window's hit (as ``limits``' incr_expire.lua) answering, with the count, the
#: window's remaining life in milliseconds (PTTL)
HIT_SCRIPT = """
local amount = tonumber(ARGV[2])
local current = redis.call("incrby", KEYS[1], amount)
if tonumber(current) == amount then
    redis.call("expire", KEYS[1], ARGV[1])
end
return {current, redis.call("pttl", KEYS[1])}
"""
#: ``g`` attribute: the window whose state this request's headers report
_SEEN = "_ratelimit_window"
#: a lease is at most this fraction of what its window had left, and at most LEASE_MAX
LEASE_SHARE = 256
LEASE_MAX = 64
#: leases a process keeps (the oldest is dropped past this: its requests are lost)
LEASES_KEPT = 4096


@dataclass(frozen=True)
class Window:
    """One window as a hit left it: its limit, its count and when it resets (epoch s)."""

    item: RateLimitItem
    count: int
    reset: float

    @property
    def breached(self) -> bool:
        return self.count > self.item.amount


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


def _parse(raw: str, setting: str) -> list[RateLimitItem]:
    """The rates of a setting, smallest window first; SystemExit naming a bad one."""
    try:
        items = parse_many(raw)
    except ValueError as err:
        raise SystemExit(f"{ENV_PREFIX}{setting}: {err}") from None
    return sorted(items, key=lambda item: item.get_expiry())


@dataclass
class Lease:
    """Requests this process took from one window: counts ``next`` .. ``last`` of it,
    until ``reset`` (epoch s), when the window ends."""

    next: int
    last: int
    reset: float

    def take(self, now: float) -> int | None:
        """The window's count of this request, if the lease still holds one."""
        if self.next > self.last or now >= self.reset:
            return None
        self.next += 1
        return self.next - 1


def lease_size(item: RateLimitItem, counted: int) -> int:
    """How many requests to take from a window whose count was last seen at ``counted``:
    a share of what it had left, at least one."""
    return max(1, min(LEASE_MAX, (item.amount - counted) // LEASE_SHARE))


class RateLimiter:
    """The shared per-key windows (checked before every request but the exempt ones)
    and the estimates' own (``count_estimate``)."""

    def __init__(self, client: redis.Redis, shared: list[RateLimitItem],
                 estimates: list[RateLimitItem]) -> None:
        self.client = client
        self.shared = shared
        self.estimates = estimates
        self.script = client.register_script(HIT_SCRIPT)
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._pid = os.getpid()

    def _count(self, item: RateLimitItem, key: str, now: float) -> Window:
        """Count this request in one window: from this process's lease, or a new one."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's leases are its own
                self._leases.clear()
                self._pid = os.getpid()
            lease = self._leases.get(key)
            if lease is not None:
                count = lease.take(now)
                if count is not None:
                    return Window(item, count, lease.reset)
            size = lease_size(item, lease.last if lease and now < lease.reset else 0)
        count, pttl = self.script([key], [item.get_expiry(), size])
        count, reset = int(count), now + max(int(pttl), 0) / 1000
        first = count - size + 1  # this request's count; the lease holds the rest
        with self._lock:  # kept even when empty: its ``last`` sizes the next lease
            self._leases.pop(key, None)
            self._leases[key] = Lease(first + 1, min(count, item.amount), reset)
            if len(self._leases) > LEASES_KEPT:
                del self._leases[next(iter(self._leases))]
        return Window(item, first, reset)

    def hit(self, items: list[RateLimitItem], scope: str) -> None:
        """Count this request in each window of ``items``; 429 if one is full.

        The headers report the first full window, else the smallest one. Valkey away:
        the request goes through (the limiter guards throughput, not privacy; a route
        that needs Valkey answers 503 itself), logged as one line.
        """
        who = client_key()
        now = time.time()
        try:
            windows = [self._count(item, f"{KEY_PREFIX}:{item.key_for(scope, who)}", now)
                       for item in items]
        except (redis.RedisError, OSError):
            _LOG.exception("rate limit check failed; request let through")
            return
        shown = next((w for w in windows if w.breached), None)
        if shown is None:
            g.setdefault(_SEEN, windows[0])  # a shared window seen first stays reported
            return
        setattr(g, _SEEN, shown)
        raise TooManyRequests(f"rate limit exceeded: {shown.item}")

    def before_request(self) -> None:
        if self.shared and request.path not in EXEMPT_PATHS:
            self.hit(self.shared, "shared")

    def headers(self, response: Response) -> Response:
        """The reported window's ``X-RateLimit-*`` headers; on a 429 its ``Retry-After``
        (at least 1 s). Then ``_retry_after``'s rule for the other statuses."""
        seen: Window | None = g.get(_SEEN) if has_app_context() else None
        if seen is not None:
            response.headers["X-RateLimit-Limit"] = str(seen.item.amount)
            response.headers["X-RateLimit-Remaining"] = str(max(0, seen.item.amount
                                                                - seen.count))
            response.headers["X-RateLimit-Reset"] = str(int(seen.reset))
            if response.status_code == 429:
                response.headers["Retry-After"] = str(
                    max(1, math.ceil(seen.reset - time.time())))
        return _retry_after(response)


def _retry_after(response: Response) -> Response:
    """``Retry-After`` only where it means something: a 429 keeps the window's (set by
    ``RateLimiter.headers``), a 503 (Valkey or the broker unreachable) gets the
    service's own short delay, a view that set ``g.retry_after`` (a 202 ``pricing``)
    gets that value, and any other response has none."""
    own = g.get("retry_after") if has_app_context() else None
    if own is not None and response.status_code not in {429, 503}:
        response.headers["Retry-After"] = str(own)
    elif response.status_code == 429:
        if response.headers.get("Retry-After", "0") == "0":
            response.headers["Retry-After"] = "1"
    elif response.status_code == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    else:
        response.headers.pop("Retry-After", None)
    return response


def init_app(app: Flask) -> RateLimiter | None:
    """Limit every request per key to ``config.rate_limit`` and estimates to
    ``config.estimate_rate_limit``; None when both are off."""
    config: Config = app.config["PRIVRELEASE"]
    if not config.rate_limit and not config.estimate_rate_limit:
        return None
    shared = _parse(config.rate_limit, "RATE_LIMIT") if config.rate_limit else []
    estimates = (_parse(config.estimate_rate_limit, "ESTIMATE_RATE_LIMIT")
                 if config.estimate_rate_limit else [])
    limiter = RateLimiter(wiring.of(app).client, shared, estimates)
    app.extensions[EXTENSION] = limiter
    app.before_request(limiter.before_request)
    app.after_request(limiter.headers)
    return limiter


def count_estimate() -> None:
    """Count one estimate against the caller's estimate window; 429 when it is full."""
    limiter: RateLimiter | None = current_app.extensions.get(EXTENSION)
    if limiter is not None and limiter.estimates:
        limiter.hit(limiter.estimates, "estimate")
