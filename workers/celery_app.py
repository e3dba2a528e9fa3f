"""The Celery application (Redis-protocol broker) and the worker heartbeat.

Tasks are acknowledged late and rejected when a worker dies, so a crash
redelivers the job; the ledger's settle script makes redelivery harmless.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import redis
from celery import Celery, signals
from kombu.transport import redis as kombu_redis

from service import rkeys
from service.audit import AuditArchive, archive_if_due
from service.config import Config
from service.documents import DocumentStore
from service.durable import Replication
from service.ledger import Ledger
from service.outputs import OutputStore
from service.store import DatasetStore

HEARTBEAT_SECONDS = 3
HEARTBEAT_TTL = 10


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

#: releases and analyses wait in queues of their own, so analyses (free, and possibly
#: long) never hold the slots releases run in; ``privrelease worker --queues`` picks.
#: Pricing jobs (a cost's cold heavy precomputation, bounded by
#: PRIVRELEASE_MAX_PRECOMPUTE_WORK) have a queue of their own too, served by default
#: beside the releases, so pricing can be given hosts of its own
RELEASES_QUEUE = "releases"
ANALYSES_QUEUE = "analyses"
PRICING_QUEUE = "pricing"
QUEUES = (RELEASES_QUEUE, ANALYSES_QUEUE, PRICING_QUEUE)
RUN_RELEASE = "privrelease.run_release"
RUN_ANALYSIS = "privrelease.run_analysis"
PRICE_RELEASE = "privrelease.price_release"
PRECOMPUTE_ESTIMATE = "privrelease.precompute_estimate"


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
        task_routes={RUN_ANALYSIS: {"queue": ANALYSES_QUEUE},
                     PRICE_RELEASE: {"queue": PRICING_QUEUE},
                     PRECOMPUTE_ESTIMATE: {"queue": PRICING_QUEUE}},
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


def worker_client(config: Config) -> redis.Redis:
    """The workers' client: it rides over a failover (re-sending for half a lease) rather
    than fail a job's read, which would refund an accepted release for nothing."""
    return rkeys.connect(config.require_redis_url(),
                         retry=rkeys.failover_retry(config.lease_seconds / 2))


def worker_ledger(client: redis.Redis, config: Config) -> Ledger:
    """The workers' ledger: a run's steps (start, lease, settle) are re-sent across a
    failover for up to half a lease (the run's lease, renewed until the compute ended,
    outlives that), so a commit the old primary took with it is applied again, once, and
    a run waits for its data-read marker to be replicated (``service.durable``)."""
    return Ledger(client, config.lease_seconds, Replication.from_config(config),
                  run_retry_seconds=config.lease_seconds / 2,
                  documents=DocumentStore(config.releases_dir),
                  audit=AuditArchive(config.audit_dir))


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


def _beat(config: Config, name: str, stop: threading.Event) -> None:
    """Heartbeat for /readyz, and the sweeper when it is due (one worker at a time)."""
    from workers.sweeper import sweep_if_due, sweep_orphans_if_due

    client = rkeys.connect(config.require_redis_url())
    ledger = worker_ledger(client, config)
    store = DatasetStore(config.datasets_dir)
    outputs = OutputStore(config.releases_dir)
    next_sweep = time.monotonic() + config.sweep_interval
    while not stop.is_set():
        with contextlib.suppress(redis.RedisError):
            # the server's run id: a beat restored from the AOF after a restart is not current
            client.set(rkeys.WORKERS + name, client.info("server")["run_id"], ex=HEARTBEAT_TTL)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + config.sweep_interval
                sweep_if_due(client, ledger, config.sweep_interval, outputs,
                             max_resends=config.max_resends)
                sweep_orphans_if_due(client, store)  # logs and survives file-system errors
                if ledger.audit:  # logs and survives file-system errors too
                    archive_if_due(client, ledger.audit, config.sweep_interval,
                                   config.audit_hot_seconds)
        stop.wait(min(HEARTBEAT_SECONDS, config.sweep_interval))
    with contextlib.suppress(redis.RedisError):
        client.delete(rkeys.WORKERS + name)


_stop = threading.Event()


@signals.worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    """Announce this worker so /readyz can tell the queue is being served."""
    name = getattr(sender, "hostname", None) or socket.gethostname()
    threading.Thread(target=_beat, args=(Config.from_env(), name, _stop), daemon=True,
                     name="privrelease-heartbeat").start()


@signals.worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    _stop.set()


#: the worker's app; `privrelease worker` configures it from the environment
app = Celery("privrelease", include=["workers.tasks"])
