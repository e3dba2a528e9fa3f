"""``python -m workers``: a Celery worker serving the release, pricing, analysis and
callback queues.

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

from service.api.observability import configure_logging
from service.config import Config
from service.processes.cli import build_parser
from service.releases.queue import QUEUES, RESENT_QUEUES


def _queues(raw: str) -> list[str]:
    names = [q.strip() for q in raw.split(",") if q.strip()]
    unknown = sorted(set(names) - set(QUEUES))
    if not names or unknown:
        raise SystemExit(f"--queues takes a comma-separated subset of {','.join(QUEUES)}")
    return list(dict.fromkeys(names))


def split(queues: list[str], one_process: bool) -> tuple[list[str], list[str], bool]:
    """The queues this process serves, those a second worker process serves (none: no
    second process), and whether this one keeps kombu's acknowledgement emulation.

    Analyses and callbacks get a worker process of their own: however many long analyses
    wait, the release slots stay free (one Celery worker serves its queues from one pool),
    and the release and pricing queues run without kombu's acknowledgements, which only
    ``RESENT_QUEUES`` may do (the record re-sends every job they lose)."""
    resent = [q for q in queues if q in RESENT_QUEUES]
    acked = [q for q in queues if q not in RESENT_QUEUES]
    served, other = (resent, acked) if resent and acked and not one_process else (queues, [])
    return served, other, not set(served) <= set(RESENT_QUEUES)


def _die_with_parent() -> None:
    """In a spawned worker: get SIGTERM if the parent dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn_acked_worker(args: argparse.Namespace, queues: list[str]
                        ) -> subprocess.Popen[bytes]:
    """The worker process of the queues kombu must keep (analyses, callbacks), beside
    this one's releases."""
    cmd = [sys.executable, "-m", "workers", "--queues", ",".join(queues),
           "--concurrency", str(args.analysis_concurrency), "--loglevel", args.loglevel]
    return subprocess.Popen(cmd, preexec_fn=_die_with_parent)


def run(args: argparse.Namespace) -> int:
    """Configure the Celery app from the environment and serve the chosen queues."""
    from celery import signals

    from service.releases.queue import configure
    from workers.celery_app import app

    queues, others, ack_emulation = split(_queues(args.queues), args.one_process)
    config = Config.from_env()
    configure_logging(config.log_level)  # before Celery redirects stderr
    configure(app, config, ack_emulation=ack_emulation)
    config.require_database_url()  # no worker without the record: one message, at once
    child = _spawn_acked_worker(args, others) if others else None
    if child is not None:

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
