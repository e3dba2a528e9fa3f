"""The job queue: which task runs where, and how a Celery app talks to the broker.

The one source of task and queue names: the API and the pricing job publish by name
(``Queue``); the workers (``workers.tasks``) register the same names; the broker's
routes and time limits (``configure``) and the sweeper's search for lost messages read
the queues from here. The API's Celery app only publishes; the workers' app
(``workers.celery_app``) is configured the same way.

Tasks are acknowledged late and rejected when a worker dies, so a crash redelivers the
job; the ledger's settle script makes redelivery harmless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from kombu.transport import redis as kombu_redis

from service.config import Config
from service.storage import rkeys

#: releases and analyses wait in queues of their own, so analyses (free, and possibly
#: long) never hold the slots releases run in; ``privrelease worker --queues`` picks.
#: Pricing jobs (a cost's cold heavy precomputation, bounded by
#: PRIVRELEASE_MAX_PRECOMPUTE_WORK) have a queue of their own too, served by default
#: beside the releases, so pricing can be given hosts of its own
RELEASES_QUEUE = "releases"
ANALYSES_QUEUE = "analyses"
PRICING_QUEUE = "pricing"
#: callbacks (``NOTIFY``): retried with a countdown of up to 10 minutes, which the broker
#: holds
NOTIFICATIONS_QUEUE = "notifications"
QUEUES = (RELEASES_QUEUE, ANALYSES_QUEUE, PRICING_QUEUE, NOTIFICATIONS_QUEUE)
#: the queues whose every job the record sends again if its message is lost (the
#: sweeper: a release's run and pricing job; a cold estimate's job is sent again once its
#: marker expires). A worker serving only these runs without kombu's acknowledgement
#: emulation (``configure``): a message is popped, run and forgotten, with no unacked
#: record written and removed per message (two MULTI/EXEC round trips; about a fifth of a
#: small release's worker CPU). The others (analyses, callbacks) keep it: kombu restores
#: their messages after a worker dies.
RESENT_QUEUES = (RELEASES_QUEUE, PRICING_QUEUE)

#: run a reserved release (``service.releases.run``)
RUN_RELEASE = "privrelease.run_release"
#: price a release created ``pricing``, reserve it, and send its RUN_RELEASE
PRICE_RELEASE = "privrelease.price_release"
#: compute a cold estimate's heavy precomputation into the store
PRECOMPUTE_ESTIMATE = "privrelease.precompute_estimate"
#: free post-processing of released outputs (``service.analyses``)
RUN_ANALYSIS = "privrelease.run_analysis"
#: POST a finished release's document to its callback URL (``service.notify``)
NOTIFY = "privrelease.notify"

#: the queue of every task not in RELEASES_QUEUE (the broker's default)
ROUTES = {RUN_ANALYSIS: ANALYSES_QUEUE, PRICE_RELEASE: PRICING_QUEUE,
          PRECOMPUTE_ESTIMATE: PRICING_QUEUE, NOTIFY: NOTIFICATIONS_QUEUE}


def pricing_task_id(release_id: str) -> str:
    """The Celery task id of a release's pricing job (the run's is the release id)."""
    return f"{release_id}.pricing"


@dataclass(frozen=True)
class Queue:
    """The jobs the service publishes, each under its name, task id and queue.

    ``app`` is a Celery app bound to the broker (``make_celery``); this
    class only publishes and revokes by name, so the service never imports the tasks.
    """

    app: Any

    def _send(self, name: str, args: list[Any], task_id: str | None = None) -> None:
        self.app.send_task(name, args=args, task_id=task_id,
                           queue=ROUTES.get(name, RELEASES_QUEUE))

    def run(self, release_id: str) -> None:
        """A reserved release's run; its task id is the release id."""
        self._send(RUN_RELEASE, [release_id], release_id)

    def price(self, release_id: str) -> None:
        """A ``pricing`` release's pricing job."""
        self._send(PRICE_RELEASE, [release_id], pricing_task_id(release_id))

    def estimate(self, body_json: str, marker: str) -> None:
        """A cold estimate's precomputation; the job drops ``marker`` when done."""
        self._send(PRECOMPUTE_ESTIMATE, [body_json, marker])

    def analysis(self, analysis_id: str) -> None:
        """An analysis run; its task id is the analysis id (so a cancel can revoke it)."""
        self._send(RUN_ANALYSIS, [analysis_id], analysis_id)

    def notify(self, release_id: str) -> None:
        """A finished release's callback."""
        self._send(NOTIFY, [release_id])

    def revoke(self, task_ids: str | list[str]) -> None:
        """Ask the workers to drop queued messages (best effort: a worker that misses it
        skips the job anyway, its status no longer being queued)."""
        self.app.control.revoke(task_ids)


# ------------------------------------------------------------------ the broker


class _Channel(kombu_redis.Channel):
    """kombu's Redis channel, made to survive being closed after Valkey vanished.

    When the broker connection breaks, Celery closes it, and kombu then tries to
    put the channel's unacknowledged messages back through a connection that is
    already detached: kombu 5.7 fails with AttributeError (``None.hostname``),
    which Celery takes as unrecoverable, so the worker exits instead of
    reconnecting. A connection error here is ignored by Celery's close and the
    worker reconnects; the messages stay in the broker's unacked set, whence
    kombu restores them after ``visibility_timeout``.

    It also keeps one synchronous client per channel: kombu makes a new ``redis.Redis``
    on the channel's pool for every publish, acknowledgement and unacked-set record
    (``conn_or_acquire``), about 50 us each with redis-py 8 (its response callbacks are
    rebuilt), two per task in a worker's consumer and one per POST. A client is only a
    handle on the pool (thread-safe, no connection of its own), so one serves every
    call; a new one is made when kombu replaced the pool (``_disconnect_pools``).
    """

    _sync_client: redis.Redis | None = None

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("broker connection already closed")
        params: dict[str, Any] = super()._connparams(asynchronous)
        return params

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool  # made (or made again after a close) as kombu would
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client(asynchronous=False)
        return client


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


def configure(app: Celery, config: Config, *, ack_emulation: bool = True) -> Celery:
    """Bind ``app`` to the configured broker; results live in our own keys.

    ``ack_emulation``: kombu records each fetched message as unacknowledged until its
    task ends, and restores those of a worker that died; a worker serving only
    ``RESENT_QUEUES`` turns it off (the record re-sends what it loses)."""
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
                                  "ack_emulation": ack_emulation,
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
