"""A `privrelease standalone` process driven over HTTP, for e2e tests and benchmarks."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

from tests.conftest import ROOT

TOKEN = "pr_e2e_bootstrap_token_0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.extra_env = dict(env or {})  # PRIVRELEASE_* settings for this service only
        self.args = args  # extra `standalone` flags
        self.access_lines = 0  # JSON lines of the privrelease.access logger seen
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None
        self.banner = ""

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
        env["PRIVRELEASE_BOOTSTRAP_KEY"] = TOKEN
        env.update(self.extra_env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.processes.cli", "standalone", "--port", str(self.port),
             "--data-dir", str(self.data_dir), *self.args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError("standalone exited:\n" + self.banner)
            self.banner += line
            if "operator key" in line:
                break
        else:
            raise TimeoutError(self.banner)
        # keep draining the shared stdout (JSON logs): a full pipe would block the service
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
        # wait until the workers are serving too (/readyz answers 503 until their first
        # beats); two: `privrelease worker` runs the analyses queue in a process of its own
        while True:
            ready = wait_until(self.url + "/readyz", timeout=max(deadline - time.monotonic(), 1))
            if ready.status_code == 200 and ready.json()["workers"] >= 2:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"workers never ready ({ready.status_code})")
            time.sleep(0.2)

    def _drain(self, stream: Any) -> None:
        for line in stream:
            if line.startswith("{") and '"logger":"privrelease.access"' in line:
                self.access_lines += 1
            if "privrelease" in line and not line.startswith("{"):
                self.banner += line  # the supervisor's own lines, not the access logs

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=90)
        time.sleep(0.2)  # let the drain thread read the last lines
        return self.proc.returncode

    def database_url(self) -> str:
        """The URL of the PostgreSQL the banner names (the latest start's)."""
        found = re.findall(r"^PostgreSQL: (\S+)", self.banner, re.MULTILINE)
        assert found, self.banner
        return str(found[-1])

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {TOKEN}", **kw.pop("headers", {})}
        return requests.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def wait(self, release_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            doc: dict[str, Any] = self.call("GET", f"/v1/releases/{release_id}").json()
            if doc["status"] in {"succeeded", "failed"}:
                return doc
            time.sleep(0.05)
        raise TimeoutError(release_id)

    def upload(self, budgets: dict[str, float], n: int = 100, **policy: Any) -> str:
        """A small two-column dataset; returns its id. ``policy``: more metadata (notions,
        record_level: what the operator opts in to)."""
        meta = {"name": "e2e", "budgets": budgets, **policy,
                "columns": {"x": {"type": "continuous", "bounds": [0, 1]},
                            "g": {"type": "categorical", "categories": ["u", "v"]}}}
        csv = "x,g\n" + "".join(f"{(i % 10) / 10},{'uv'[i % 2]}\n" for i in range(n))
        resp = self.call("POST", "/v1/datasets", files={"file": ("d.csv", csv)},
                         data={"metadata": json.dumps(meta)})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])


def child_pids(pid: int, *needles: str) -> list[int]:
    """Direct children of ``pid`` whose command line contains every one of ``needles``
    (arguments joined by spaces), e.g. ``child_pids(standalone, "valkey-server")``."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return []
    out = []
    for child in map(int, children):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except FileNotFoundError:
            continue
        if all(n in cmdline for n in needles):
            out.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_until(url: str, timeout: float = 120.0, method: str = "GET",
               **kw: Any) -> requests.Response:
    """The first answer from ``url`` that is not a 5xx, retried until ``timeout``.

    A server still starting refuses connections, or accepts them and answers only
    once its workers have imported the application (over a second for ours, which
    imports every mechanism family): both are retried, never raised, until the
    deadline; then TimeoutError says what was last seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            resp = requests.request(method, url, timeout=5, **kw)
            if resp.status_code < 500:
                return resp
            last = resp.status_code
        except requests.RequestException as err:
            last = type(err).__name__
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {timeout:g} s (last: {last})")
