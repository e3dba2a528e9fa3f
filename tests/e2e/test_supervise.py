"""`privrelease standalone` supervises its children (Valkey, worker, gunicorn).

A child that dies is restarted on the same data and port, with backoff, and the
supervisor says so on stderr; one that keeps dying beyond the restart budget stops
everything with a non-zero exit. A port another server holds fails at once, with no
key printed.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT
from tests.e2e.harness import Service, _free_port, alive, child_pids

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
        children = [_one(svc, n) for n in (VALKEY, WORKER, API)]
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
