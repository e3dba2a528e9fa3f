"""The ``privrelease`` command: run the service (standalone, api, worker) or use one.

The server commands parse their arguments with argparse (as they always have); the
client commands are the Click commands of the client distribution
(:mod:`privrelease_client.cli`, alone there as ``privrelease-client``). One Click group
holds both, so ``--help``, ``--version`` and shell completion see every command.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import click
from privrelease_client import __version__ as client_version
from privrelease_client import cli as client_cli

from service.config import Config


def _standalone(args: argparse.Namespace) -> int:
    from service.processes.standalone import Standalone

    return Standalone(Config.from_env(), host=args.host, port=args.port,
                      data_dir=args.data_dir, access_log=args.access_log).run()


def _api(args: argparse.Namespace) -> int:
    from service.processes.server import serve

    serve(Config.from_env(), host=args.host, port=args.port, workers=args.workers,
          fd=args.fd)
    return 0


def _worker_healthcheck() -> int:
    """0 when a worker on this host beats to the configured Valkey (container probes)."""
    import redis

    from service.releases.queue import live_workers
    from service.storage import rkeys

    config = Config.from_env()
    try:
        client = rkeys.connect(config.require_redis_url(), socket_timeout=2)
        alive = live_workers(client, host_suffix="@" + socket.gethostname())
    except redis.RedisError as err:
        print(f"unhealthy: Valkey/Redis is not reachable ({type(err).__name__})", file=sys.stderr)
        return 1
    if not alive:
        print("unhealthy: no worker on this host sends heartbeats", file=sys.stderr)
        return 1
    print(f"healthy: {alive} worker process(es)")
    return 0


def _worker(args: argparse.Namespace) -> int:
    """The worker runs in the ``workers`` package (the Celery edge, which imports the
    service, never the reverse): this process becomes it, with the same arguments."""
    if args.healthcheck:
        return _worker_healthcheck()
    os.execv(sys.executable, [sys.executable, "-m", "workers", *args.argv])
    return 1  # not reached: execv replaced this process


STANDALONE_HELP = "embedded PostgreSQL + Valkey + worker + API in one command"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privrelease", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("standalone", help=STANDALONE_HELP)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--data-dir", default=None, help="overrides PRIVRELEASE_DATA_DIR")
    p.add_argument("--access-log", action="store_true",
                   help="log one JSON line per request (off by default here)")
    p.set_defaults(func=_standalone)

    p = sub.add_parser("api", help="serve the HTTP API with gunicorn")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2)
    # a listening socket inherited from `standalone` (which binds the port itself)
    p.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_api)

    p = sub.add_parser("worker", help="run a Celery worker")
    p.add_argument("--concurrency", type=int, default=2,
                   help="processes running tasks of the queues this process serves")
    p.add_argument("--loglevel", default="warning")
    p.add_argument("--queues", default="releases,analyses,pricing,notifications",
                   help="comma-separated: releases, analyses, pricing, notifications"
                        " (default all: analyses and callbacks then run in a second worker"
                        " process of their own, the pricing jobs beside the releases)")
    p.add_argument("--analysis-concurrency", type=int, default=2,
                   help="processes of that second worker (analyses and callbacks)")
    p.add_argument("--one-process", action="store_true",
                   help="serve every queue from one pool (analyses may then hold every slot)")
    p.add_argument("--healthcheck", action="store_true",
                   help="exit 0 if a worker on this host is alive, else 1 (container probes)")
    p.set_defaults(func=_worker)

    p = sub.add_parser("migrate-from-valkey", help=FROM_VALKEY_HELP,
                       description=FROM_VALKEY_HELP)
    p.set_defaults(func=_migrate_from_valkey)

    p = sub.add_parser("db", help=DB_HELP, description=DB_HELP)
    db = p.add_subparsers(dest="db_command", metavar="{upgrade,current}", required=True)
    q = db.add_parser("upgrade", help=DB_UPGRADE_HELP, description=DB_UPGRADE_HELP)
    q.set_defaults(func=_db_upgrade)
    q = db.add_parser("current", help=DB_CURRENT_HELP, description=DB_CURRENT_HELP)
    q.set_defaults(func=_db_current)
    return parser


DB_HELP = "the PostgreSQL schema of PRIVRELEASE_DATABASE_URL: upgrade it, or show its revision"
DB_UPGRADE_HELP = ("bring the schema to the newest revision (Alembic migrations, one"
                   " transaction; nothing to do on a database already there), then print it")
DB_CURRENT_HELP = "print the revision the schema is at"


def _database_url() -> str | None:
    """PRIVRELEASE_DATABASE_URL, or None once a message says it is missing."""
    try:
        return Config.from_env().require_database_url()
    except SystemExit as err:
        print(err, file=sys.stderr)
        return None


def _db_upgrade(args: argparse.Namespace) -> int:
    """``database.upgrade`` on PRIVRELEASE_DATABASE_URL (safe to run again, and from many
    processes at once: the migrations take an advisory lock)."""
    from service.processes import schema
    from service.storage import database

    url = _database_url()
    if url is None:
        return 2
    try:
        database.upgrade(url)
        revision = schema.current(url)
    except schema.FAILURES as err:
        print(f"cannot upgrade {schema.redacted(url)}: {schema.reason(err)}",
              file=sys.stderr)
        return 1
    print(f"database at revision {schema.describe(revision)}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    from service.processes import schema

    url = _database_url()
    if url is None:
        return 2
    try:
        revision = schema.current(url)
    except schema.FAILURES as err:
        print(f"cannot read {schema.redacted(url)}: {schema.reason(err)}",
              file=sys.stderr)
        return 1
    print(schema.describe(revision))
    return 0


FROM_VALKEY_HELP = ("move the record of a deployment on the Valkey store (datasets, ledgers,"
                    " releases, audit events, replays, the outbox, live Idempotency-Keys,"
                    " API keys, console sessions, analyses)"
                    " from PRIVRELEASE_REDIS_URL into PRIVRELEASE_DATABASE_URL; run it with"
                    " the API and workers stopped; safe to run again (a dataset already"
                    " moved is skipped)")


def _migrate_from_valkey(args: argparse.Namespace) -> int:
    """Upgrade the schema, ``service.storage.valkey_migration.migrate``, then write down
    the legacy policy of the datasets moved (``service.policy.migrate``); refuses while a
    worker is live."""
    from service import policy
    from service.config import Config
    from service.releases.queue import live_workers
    from service.storage import database, rkeys
    from service.storage.pg_ledger import PgLedger
    from service.storage.release_documents import DocumentStore
    from service.storage.valkey_migration import migrate
    from service.storage.valkey_store import ValkeyRecord

    config = Config.from_env()
    url = config.require_database_url()
    client = rkeys.connect(config.require_redis_url())
    if live_workers(client):
        print("a worker is running on this Valkey: stop the API and the workers first",
              file=sys.stderr)
        return 1
    docs = DocumentStore(config.releases_dir)
    database.upgrade(url)
    pool = database.connect(url)
    try:
        target = PgLedger(pool, config.lease_seconds, documents=docs)
        done = migrate(ValkeyRecord(client, docs, config.audit_dir), target)
        written = policy.migrate(target, done.datasets)
    finally:
        pool.close()
    print(f"moved {len(done.datasets)} dataset(s) with {done.releases} release(s) and"
          f" {done.events} audit event(s), {done.outbox} outbox entr(ies) and"
          f" {done.idempotency_keys} live Idempotency-Key(s), {done.keys} API key(s),"
          f" {done.sessions} console session(s) and {done.analyses} analys(es);"
          f" {len(done.skipped)} dataset(s) already in PostgreSQL left as they were."
          + (f" {done.orphan_analyses} analys(es) of releases not in PostgreSQL left"
             " behind." if done.orphan_analyses else "")
          + (f" Recorded the legacy policy of {len(written.datasets)} dataset(s)."
             if written.datasets else "")
          + " Start the service with PRIVRELEASE_DATABASE_URL set.")
    return 0


SERVER_COMMANDS = {"standalone": STANDALONE_HELP,
                   "api": "serve the HTTP API with gunicorn",
                   "worker": "run a Celery worker",
                   "migrate-from-valkey": FROM_VALKEY_HELP,
                   "db": DB_HELP}


def _server(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # as written, for a command that hands them on (worker)
    result: int = args.func(args)
    return result


def _register_server_commands(group: click.Group) -> None:
    """Entries for the server commands in the Click group; their arguments go to argparse
    untouched (``privrelease standalone --help`` shows argparse's own help)."""
    for name, help_text in SERVER_COMMANDS.items():
        def run(args: tuple[str, ...], name: str = name) -> None:
            sys.exit(_server([name, *args]))

        group.add_command(click.Command(
            name, callback=run, help=help_text, short_help=help_text,
            params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
            add_help_option=False,
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True}))


def _version_message() -> str:
    """Both versions: a bug report about a client command needs the client's too."""
    try:
        from importlib.metadata import version

        server = version("privrelease")
    except Exception:  # a source checkout without installed metadata
        server = "unknown"
    return f"privrelease {server} (privrelease-client {client_version})"


@click.group(name="privrelease", context_settings=client_cli.CONTEXT_SETTINGS,
             commands=dict(client_cli.cli.commands))  # a copy: the client's group stays its own
@click.version_option(message="%(version)s", version=_version_message(),
                      package_name="privrelease")
def cli() -> None:
    """privrelease: run the service (standalone, api, worker) or use a running one.

    The client commands read the server from PRIVRELEASE_URL and the key from
    PRIVRELEASE_KEY. Shell completion: `eval "$(privrelease completion bash)"`.
    """


_register_server_commands(cli)


def main(argv: list[str] | None = None) -> int:
    """``privrelease ARGS``; server commands return their status, the others exit."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SERVER_COMMANDS:
        return _server(argv)
    return client_cli.run(cli, argv, "privrelease")


if __name__ == "__main__":
    sys.exit(main())
