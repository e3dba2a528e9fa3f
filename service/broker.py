"""The job broker: how a Celery app talks to Valkey, for the API (which only publishes)
and the workers (``workers.celery_app``) alike.

Tasks are acknowledged late and rejected when a worker dies, so a crash
redelivers the job; the ledger's settle script makes redelivery harmless.
Task and queue names are ``service.releases.queue``'s.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from kombu.transport import redis as kombu_redis

from service import rkeys
from service.config import Config
from service.releases.queue import (
    PRECOMPUTE_ESTIMATE,
    PRICE_RELEASE,
    RELEASES_QUEUE,
    ROUTES,
    RUN_ANALYSIS,
    RUN_RELEASE,
)


class _Channel(kombu_redis.Channel):
    """kombu's Redis channel, made to survive being closed after Valkey vanished.

    When the broker connection breaks, Celery closes it, and kombu then tries to
    put the channel's unacknowledged messages back through a connection that is
    already detached: kombu 5.7 fails with AttributeError (``None.hostname``),
    which Celery takes as unrecoverable, so the worker exits instead of
    reconnecting. A connection error here is ignored by Celery's close and the
    worker reconnects; the messages stay in the broker's unacked set, whence
    kombu restores them after ``visibility_timeout``.
    """

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("broker connection already closed")
        params: dict[str, Any] = super()._connparams(asynchronous)
        return params


class BrokerTransport(kombu_redis.Transport):
    """The Redis transport with :class:`_Channel`."""

    Channel = _Channel


class _SentinelChannel(_Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (the master the sentinels name), with :class:`_Channel`'s
    survival of a close after the connection vanished (a failover is such a moment)."""


class SentinelBrokerTransport(kombu_redis.SentinelTransport):
    """The Sentinel transport with :class:`_SentinelChannel`."""

    Channel = _SentinelChannel


def broker(url: str) -> tuple[str, type[kombu_redis.Transport], dict[str, Any]]:
    """The broker URL, transport and its extra options for PRIVRELEASE_REDIS_URL.

    Our ``sentinel://h1,h2,h3/<master>/<db>`` becomes kombu's spelling (one
    ``sentinel://`` URL per sentinel, joined by ``;``, and ``master_name``).
    """
    sentinel = rkeys.parse_sentinel(url)
    if sentinel is None:
        return url, BrokerTransport, {}
    kombu_url, options = sentinel.kombu()
    return kombu_url, SentinelBrokerTransport, options


#: seconds before kombu redelivers a message that was fetched but never acknowledged
#: (its worker died or lost Valkey before starting it). Longer than any countdown a
#: task is retried with (notifications back off up to 600 s; kombu holds those as
#: unacked too), so no retry is delivered twice; a release redelivered while its run
#: is still going waits for that run's lease. kombu's default is an hour.
VISIBILITY_TIMEOUT = 900

def time_limits(config: Config) -> dict[str, dict[str, float]]:
    """Per task: the soft limit (the task's code is interrupted and ends the task as it
    must) and the hard limit (the process running it is killed), from the config.

    An analysis's hard limit must end before kombu redelivers its unacknowledged message
    (``VISIBILITY_TIMEOUT``): a redelivered analysis that had started is failed as
    ``worker_lost``, so a longer limit would fail analyses that are still running.
    """
    if config.analysis_time_limit + config.time_limit_grace >= VISIBILITY_TIMEOUT:
        raise SystemExit(f"PRIVRELEASE_ANALYSIS_TIME_LIMIT + PRIVRELEASE_TIME_LIMIT_GRACE must"
                         f" stay below {VISIBILITY_TIMEOUT} seconds")
    return {
        RUN_RELEASE: {"soft_time_limit": config.release_time_limit,
                      "time_limit": config.release_time_limit + config.time_limit_grace},
        RUN_ANALYSIS: {"soft_time_limit": config.analysis_time_limit,
                       "time_limit": config.analysis_time_limit + config.time_limit_grace},
        # a pricing job's work is bounded at the POST (PRIVRELEASE_MAX_PRECOMPUTE_WORK):
        # the release's limits are its backstop
        PRICE_RELEASE: {"soft_time_limit": config.release_time_limit,
                        "time_limit": config.release_time_limit + config.time_limit_grace},
        PRECOMPUTE_ESTIMATE: {"soft_time_limit": config.release_time_limit,
                              "time_limit": config.release_time_limit
                              + config.time_limit_grace},
    }


def configure(app: Celery, config: Config) -> Celery:
    """Bind ``app`` to the configured broker; results live in our own keys."""
    url, transport, options = broker(config.require_redis_url())
    app.conf.update(
        broker_url=url,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=RELEASES_QUEUE,
        task_routes={name: {"queue": queue} for name, queue in ROUTES.items()},
        task_annotations=time_limits(config),
        broker_connection_retry_on_startup=True,
        broker_transport=transport,
        # timeouts as for our own clients: a hung Valkey fails a publish, not hangs it
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT,
                                  "socket_timeout": rkeys.REPLY_TIMEOUT,
                                  "socket_connect_timeout": rkeys.CONNECT_TIMEOUT, **options},
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


def make_celery(config: Config) -> Celery:
    """A Celery app for the API process: it only sends tasks, by name."""
    return configure(Celery("privrelease"), config)


def live_workers(client: redis.Redis, host_suffix: str = "") -> int:
    """Workers whose heartbeat names this Valkey run (and, if given, ends in ``host_suffix``).

    A heartbeat restored from the AOF after a restart names the previous run id, so it
    does not count until its worker has reconnected and beaten again.
    """
    run_id = client.info("server")["run_id"]
    keys = [k for k in client.scan_iter(rkeys.WORKERS + "*", count=100)
            if k.endswith(host_suffix)]
    return sum(1 for beat in (client.mget(keys) if keys else []) if beat == run_id)
