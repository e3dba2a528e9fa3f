"""gunicorn, embedded: ``privrelease api`` serves the app with a fixed config.

The workers share one prometheus-client multiprocess directory, so ``/metrics``
from any worker reports the requests of all of them. It is prepared before
gunicorn forks (the variable must be set before prometheus_client is imported).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from service import apikeys, wiring
from service.config import Config


class _Gunicorn(BaseApplication):
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from service.api.app import create_app

        return create_app(Config.from_env())


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_metrics_dir(configured: Path | None) -> tuple[Path, bool]:
    """Empty (or create) the metrics directory and export it; returns it and
    whether it is a temporary one to remove at exit.

    Old files would add a previous run's counts to this one's, so a configured
    directory is emptied of its ``*.db`` files (and nothing else).
    """
    if configured is None:
        path, temporary = Path(tempfile.mkdtemp(prefix="privrelease-metrics-")), True
    else:
        path, temporary = configured, False
        path.mkdir(parents=True, exist_ok=True)
        for old in path.glob("*.db"):
            old.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    return path, temporary


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook: forget a dead worker's live gauges (its counters stay summed)."""
    from prometheus_client import multiprocess

    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(worker.pid)


#: gthread, but request heads are read under PRIVRELEASE_HEADER_TIMEOUT by the
#: worker's event loop, so slow clients cannot hold its threads (service/processes/http_worker.py)
WORKER_CLASS = "service.processes.http_worker.HeaderTimeoutWorker"


def options(host: str, port: int, workers: int, fd: int | None = None) -> dict[str, Any]:
    """The production settings (deploy/gunicorn.conf.py mirrors them).

    ``fd``: serve a socket the caller already bound and listens on (``standalone``
    binds the port itself, so a port another server holds fails before anything
    starts, and whatever answers on it is ours).
    """
    return {
        "bind": f"fd://{fd}" if fd is not None else f"{host}:{port}",
        "workers": workers,
        "worker_class": WORKER_CLASS,
        "threads": 8,
        "timeout": 60,
        "graceful_timeout": 10,
        "keepalive": 5,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
        "child_exit": child_exit,
    }


def serve(config: Config, host: str, port: int, workers: int, fd: int | None = None) -> None:
    config.require_redis_url()
    config.require_database_url()  # before gunicorn: one message, not one per worker
    if config.bootstrap_key:  # registered once; a restart keeps the same record
        # (its own connections, closed before gunicorn forks)
        with wiring.key_store(config) as keys:
            apikeys.create(keys, "operator", label="bootstrap", token=config.bootstrap_key)
    path, temporary = prepare_metrics_dir(config.metrics_dir)
    master = os.getpid()
    try:
        _Gunicorn(options(host, port, workers, fd)).run()
    finally:
        # forked workers leave run() by SystemExit through here too: only the master cleans up
        if temporary and os.getpid() == master:
            shutil.rmtree(path, ignore_errors=True)
