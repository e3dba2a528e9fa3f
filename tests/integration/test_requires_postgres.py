"""PostgreSQL is the one system of record (issue #29): without PRIVRELEASE_DATABASE_URL the
API, the worker and the sweeper refuse to start, each with the same one message, before
they serve or take anything (there is no other store to fall back on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import wiring
from service.api.app import create_app
from service.config import Config
from tests.conftest import ROOT

MESSAGE = ("PRIVRELEASE_DATABASE_URL is not set: PostgreSQL is the system of record (Valkey"
           " is only the broker).")


def _env(redis_url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
    env.update(PRIVRELEASE_REDIS_URL=redis_url, PRIVRELEASE_DATA_DIR=str(data_dir))
    return env


@pytest.mark.parametrize("command", [["api", "--port", "0"], ["worker", "--concurrency", "1"]])
def test_the_api_and_the_worker_refuse_to_start(command: list[str], redis_url: str,
                                                tmp_path: Path) -> None:
    """``privrelease api`` exits before gunicorn starts, ``privrelease worker`` before
    Celery does: exit 1, the message once on stderr, nothing on stdout."""
    done = subprocess.run([sys.executable, "-m", "service.processes.cli", *command],
                          env=_env(redis_url, tmp_path), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == "" and done.stderr.count(MESSAGE) == 1, done.stderr
    assert "standalone" in done.stderr and "migrate-from-valkey" in done.stderr


@pytest.mark.parametrize("role", ["api", "worker", "sweeper"])
def test_no_process_builds_its_services_without_the_record(role: str, redis_url: str,
                                                           tmp_path: Path) -> None:
    """``wiring.build`` (every process's services: a gunicorn worker's app, a Celery
    task's, the sweeper's thread) and ``create_app`` exit with the message."""
    config = Config(data_dir=tmp_path, redis_url=redis_url, database_url=None)
    with pytest.raises(SystemExit, match=r"PRIVRELEASE_DATABASE_URL is not set: PostgreSQL"):
        wiring.build(config, role)  # type: ignore[arg-type]
    with pytest.raises(SystemExit, match=r"PRIVRELEASE_DATABASE_URL is not set: PostgreSQL"):
        create_app(config)
