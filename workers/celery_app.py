"""The workers' Celery app and heartbeat: the edge where Celery meets the service.

The app is configured from the environment by ``privrelease worker`` (``python -m workers``)
through ``service.releases.queue.configure``, the same configuration the API publishes with.
Each worker beats to Valkey (``/readyz`` counts the beats) and, one worker at a time,
runs the sweeper and the audit archive when they are due.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import Any

import redis
from celery import Celery, signals

from service.config import Config
from service.releases.sweeper import sweep_if_due, sweep_orphans_if_due
from service.storage import release_metrics, rkeys
from service.storage.store import DOWN
from service.wiring import Services, build

log = logging.getLogger("privrelease.worker")

HEARTBEAT_SECONDS = 3
HEARTBEAT_TTL = 10


def _beat(config: Config, name: str, stop: threading.Event) -> None:
    """Heartbeat for /readyz, and the sweeper when it is due (one worker at a time)."""
    beats = rkeys.connect(config.require_redis_url())
    svc = build(config, "sweeper", celery=app)
    next_sweep = time.monotonic() + config.sweep_interval
    while not stop.is_set():
        # Valkey or the record (PostgreSQL) away: beat and sweep again at the next turn
        with contextlib.suppress(*DOWN):
            # the server's run id: a beat restored from the AOF after a restart is not current
            beats.set(rkeys.WORKERS + name, beats.info("server")["run_id"], ex=HEARTBEAT_TTL)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + config.sweep_interval
                _sweep(svc, config)
        stop.wait(min(HEARTBEAT_SECONDS, config.sweep_interval))
    with contextlib.suppress(redis.RedisError):
        beats.delete(rkeys.WORKERS + name)


def _sweep(svc: Services, config: Config) -> None:
    """One turn of the sweeps. A fault of the record passes up (the next turn retries);
    anything else is logged by its type and the heartbeat goes on: a thread that died
    here would stop the worker's beats and every later sweep."""
    try:
        sweep_if_due(svc, config.sweep_interval, max_resends=config.max_resends)
        sweep_orphans_if_due(svc.client, svc.ledger, svc.datasets)  # survives file errors
    except DOWN:
        raise
    except Exception as err:
        log.error("sweep failed", extra={"error_type": type(err).__name__})


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
    release_metrics.flush()  # a pool that runs tasks in this process (solo, threads)


@signals.worker_process_shutdown.connect
def _flush_metrics(**_: Any) -> None:
    """A pool process about to exit writes the release metrics it still holds."""
    release_metrics.flush()


#: the worker's app; `privrelease worker` configures it from the environment
app = Celery("privrelease", include=["workers.tasks"])
