"""The ``privrelease`` command: run the service (standalone, api, worker)."""

from __future__ import annotations

import argparse
import sys

from service import commands
from service.config import Config


def _standalone(args: argparse.Namespace) -> int:
    from service.runtime import Standalone

    return Standalone(Config.from_env(), host=args.host, port=args.port,
                      data_dir=args.data_dir).run()


def _api(args: argparse.Namespace) -> int:
    from service.server import serve

    serve(Config.from_env(), host=args.host, port=args.port, workers=args.workers,
          fd=args.fd)
    return 0


def _worker(args: argparse.Namespace) -> int:
    from service.observability import configure_logging
    from workers.celery_app import app, configure

    config = Config.from_env()
    configure_logging(config.log_level)  # before Celery redirects stderr
    configure(app, config)

    argv = ["--quiet", "worker", "--loglevel", args.loglevel,
            "--concurrency", str(args.concurrency),
            "--queues", "privrelease", "--without-gossip", "--without-mingle"]
    app.worker_main(argv)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privrelease", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("standalone", help="embedded Valkey + worker + API in one command")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--data-dir", default=None, help="overrides PRIVRELEASE_DATA_DIR")
    p.set_defaults(func=_standalone)

    p = sub.add_parser("api", help="serve the HTTP API with gunicorn")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2)
    # a listening socket inherited from `standalone` (which binds the port itself)
    p.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_api)

    p = sub.add_parser("worker", help="run a Celery worker")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--loglevel", default="warning")
    p.set_defaults(func=_worker)
    commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
