"""gunicorn settings for `gunicorn -c deploy/gunicorn.conf.py 'service.api.app:create_app()'`.

`privrelease api` uses the same values (service/processes/server.py); keep them in sync.
"""

import os
import shutil

from service.config import Config
from service.processes.server import WORKER_CLASS, child_exit, prepare_metrics_dir

bind = os.environ.get("PRIVRELEASE_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("PRIVRELEASE_WEB_WORKERS", "2"))
# gthread whose request heads must arrive within PRIVRELEASE_HEADER_TIMEOUT (else 408)
worker_class = WORKER_CLASS
threads = 8
timeout = 60
graceful_timeout = 10
keepalive = 5
errorlog = "-"
loglevel = "warning"

# prometheus-client multiprocess mode: the directory is prepared once in the master,
# before the workers fork and import prometheus_client; dead workers are marked.
__all__ = ["child_exit"]
_metrics: dict[str, object] = {}


def on_starting(server):
    _metrics["dir"], _metrics["temporary"] = prepare_metrics_dir(Config.from_env().metrics_dir)


def on_exit(server):
    if _metrics.get("temporary"):
        shutil.rmtree(str(_metrics["dir"]), ignore_errors=True)
