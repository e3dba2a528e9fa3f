"""API benchmarks: POST /v1/releases throughput vs a bare Flask endpoint, and latency.

Both servers run under the same gunicorn settings (service/server.py); clients are
32 threads with keep-alive sessions. Run with `make bench`.
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

import pytest
import requests

from service.server import options
from tests.conftest import ROOT
from tests.e2e.harness import TOKEN, Service, _free_port

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


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = Service(tmp_path_factory.mktemp("bench"))
    svc.start()
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
    for _ in range(100):
        try:
            requests.post(url + "/v1/releases", json={"dataset_id": "x"}, timeout=1)
            break
        except requests.ConnectionError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_release_post_throughput_vs_bare_flask(service: Service, bare: str,
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


def test_submit_to_result_latency(service: Service,
                                  record: Callable[[str, str], None]) -> None:
    ds = service.upload({"epsilon": 1000})
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    time.sleep(5)  # let the throughput test's queue drain
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
