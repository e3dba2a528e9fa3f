"""API benchmarks: POST /v1/releases throughput vs a bare Flask endpoint, and latency.

Both servers run under the same gunicorn settings (service/processes/server.py); clients are
32 threads with keep-alive sessions. The worker is started only after the throughput
run (jobs queue up meanwhile), so both servers get the same two cores; its drain
rate and the submit-to-result latency are measured next. Run with `make bench`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from service import apikeys
from service.processes.server import options
from service.processes.valkey import EmbeddedValkey
from service.releases.queue import RELEASES_QUEUE
from service.storage import rkeys
from service.storage.valkey_keys import ValkeyKeyStore
from tests.conftest import ROOT
from tests.e2e.harness import TOKEN, Service, _free_port, wait_until

CLIENTS = 32
SECONDS = 8.0


def _throughput(url: str, make_body: Callable[[int], dict[str, object]]) -> tuple[float, int]:
    """Requests per second with CLIENTS concurrent keep-alive clients for SECONDS."""
    counter = iter(range(10**9))
    lock = threading.Lock()
    done: list[int] = []
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + SECONDS

    def client() -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        n = 0
        while time.monotonic() < deadline:
            with lock:
                i = next(counter)
            status = session.post(url, json=make_body(i), timeout=30).status_code
            statuses[status] = statuses.get(status, 0) + 1
            n += 1
        done.append(n)

    start = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in range(CLIENTS):
            pool.submit(client)
    elapsed = time.monotonic() - start
    return sum(done) / elapsed, statuses.get(202, 0)


class Split:
    """Valkey, the API (gunicorn) and a worker as separate processes, so the API's
    throughput is measured without the worker competing for the same two cores."""

    def __init__(self, data_dir: Path) -> None:
        self.valkey = EmbeddedValkey(data_dir / "valkey")
        self.valkey.start()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
        # one key sends everything: a limit it never reaches keeps the limiter's cost
        # in the measurement without refusing requests
        self.env.update(PRIVRELEASE_REDIS_URL=self.valkey.url,
                        PRIVRELEASE_DATA_DIR=str(data_dir),
                        PRIVRELEASE_RATE_LIMIT="10000000/minute")
        client = rkeys.connect(self.valkey.url)
        apikeys.create(ValkeyKeyStore(client), "operator", token=TOKEN)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = self._spawn("api", "--port", str(self.port))
        self.worker: subprocess.Popen[bytes] | None = None
        # the first answer waits for gunicorn's workers to import every mechanism family
        assert wait_until(self.url + "/healthz").status_code == 200

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "service.processes.cli", *args], cwd=ROOT,
                                env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def start_worker(self) -> None:
        self.worker = self._spawn("worker")
        # /readyz answers 503 until the worker's first heartbeat; wait_until retries it
        assert wait_until(self.url + "/readyz").status_code == 200

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return requests.request(method, self.url + path, headers=headers, timeout=30, **kw)

    upload = Service.upload

    def stop(self) -> None:
        for proc in (self.api, self.worker):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
        self.valkey.stop()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    svc = Split(tmp_path_factory.mktemp("bench"))
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    opts = options("127.0.0.1", port, 2)
    args = [sys.executable, "-m", "gunicorn", "-k", opts["worker_class"],
            "--threads", str(opts["threads"]), "-w", str(opts["workers"]),
            "-b", opts["bind"], "--keep-alive", str(opts["keepalive"]),
            "tests.bench.bare_app:app"]
    proc = subprocess.Popen(args, cwd=ROOT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    assert wait_until(url + "/v1/releases", method="POST",
                      json={"dataset_id": "x"}).status_code == 202
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_release_post_throughput_vs_bare_flask(service: Split, bare: str,
                                               record: Callable[[str, str], None]) -> None:
    ds = service.upload({"epsilon": 1_000_000})

    def body(i: int) -> dict[str, object]:
        return {"dataset_id": ds, "mechanism": "laplace",
                "params": {"statistic": "count",
                           "condition": {"column": "x", "op": "ge", "value": i / 10**9}},
                "budget": {"epsilon": 0.001}}

    bare_rps, _ = _throughput(bare + "/v1/releases", body)
    ours_rps, accepted = _throughput(service.url + "/v1/releases", body)
    ratio = ours_rps / bare_rps
    record("POST /v1/releases, 32 clients", f"{ours_rps:.0f} req/s vs bare Flask "
           f"{bare_rps:.0f} req/s: ratio {ratio:.2f} (target >= 0.33)")
    assert accepted > 0
    assert ratio >= 1 / 3


def test_worker_drain_and_latency(service: Split, record: Callable[[str, str], None]) -> None:
    """Start the worker on the queue the throughput test filled, then time one by one."""
    client = rkeys.connect(service.processes.valkey.url)
    queued = client.llen(RELEASES_QUEUE)
    start = time.monotonic()
    service.start_worker()
    while client.llen(RELEASES_QUEUE) or client.zcard(rkeys.PENDING):
        time.sleep(0.05)
    drain = queued / (time.monotonic() - start)
    record("worker drain rate (1 worker, 2 processes)", f"{drain:.0f} releases/s "
           f"over {queued} queued releases")
    ds = service.upload({"epsilon": 1000})
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    latencies = []
    for i in range(60):
        start = time.perf_counter()
        rid = session.post(service.url + "/v1/releases", json={
            "dataset_id": ds, "mechanism": "laplace",
            "params": {"statistic": "mean", "column": "x"},
            "budget": {"epsilon": 0.001 * (i + 1)}}, timeout=30).json()["id"]
        while session.get(f"{service.url}/v1/releases/{rid}", timeout=30).json()[
                "status"] not in {"succeeded", "failed"}:
            time.sleep(0.002)
        latencies.append(time.perf_counter() - start)
    median_ms = statistics.median(latencies[10:]) * 1000
    record("submit-to-result latency (small Laplace mean)", f"median {median_ms:.1f} ms "
           "(target < 50 ms)")
    assert median_ms < 50


@pytest.fixture(scope="module")
def record() -> Iterator[Callable[[str, str], None]]:
    lines: list[str] = []
    yield lambda name, value: lines.append(f"{name}: {value}")
    out = Path(ROOT / "var" / "bench-api.txt")
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
