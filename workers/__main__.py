"""``python -m workers``: a Celery worker serving the release, pricing and analysis queues.

``privrelease worker ARGS`` becomes this process (``service.processes.cli``), so the arguments are
the same and parsed by the same parser.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys

from service import policy, wiring
from service.api.observability import configure_logging
from service.config import Config
from service.processes.cli import build_parser
from service.releases.queue import ANALYSES_QUEUE, QUEUES


def _queues(raw: str) -> list[str]:
    names = [q.strip() for q in raw.split(",") if q.strip()]
    unknown = sorted(set(names) - set(QUEUES))
    if not names or unknown:
        raise SystemExit(f"--queues takes a comma-separated subset of {','.join(QUEUES)}")
    return list(dict.fromkeys(names))


def _die_with_parent() -> None:
    """In a spawned worker: get SIGTERM if the parent dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn_analyses_worker(args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """The analyses queue's own worker process, beside this one's releases."""
    cmd = [sys.executable, "-m", "workers", "--queues", "analyses",
           "--concurrency", str(args.analysis_concurrency), "--loglevel", args.loglevel]
    return subprocess.Popen(cmd, preexec_fn=_die_with_parent)


def run(args: argparse.Namespace) -> int:
    """Configure the Celery app from the environment and serve the chosen queues."""
    from celery import signals

    from service.releases.queue import configure
    from workers.celery_app import app

    queues = _queues(args.queues)
    config = Config.from_env()
    configure_logging(config.log_level)  # before Celery redirects stderr
    configure(app, config)
    svc = wiring.build(config, "worker", celery=app)
    policy.migrate_at_startup(svc.client, svc.ledger, "worker")
    child = None
    if ANALYSES_QUEUE in queues and len(queues) > 1 and not args.one_process:
        # analyses get worker processes of their own: however many long analyses wait,
        # the release slots stay free (one Celery worker serves its queues from one pool)
        child = _spawn_analyses_worker(args)
        queues = [q for q in queues if q != ANALYSES_QUEUE]

        def stop_child(**_: object) -> None:
            if child.poll() is None:
                child.terminate()

        signals.worker_shutting_down.connect(stop_child, weak=False)
    argv = ["--quiet", "worker", "--loglevel", args.loglevel,
            "--concurrency", str(args.concurrency),
            "--queues", ",".join(queues), "--hostname", f"{'-'.join(queues)}-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle"]
    try:
        app.worker_main(argv)
    finally:
        if child is not None:
            if child.poll() is None:
                child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m workers ARGS``: the arguments of ``privrelease worker``."""
    args = sys.argv[1:] if argv is None else argv
    return run(build_parser().parse_args(["worker", *args]))


if __name__ == "__main__":
    sys.exit(main())
