"""Large data: a 10^7-row, 5-column CSV through the real service, with memory peaks.

``python -m tests.large.large_data`` (``make large``) writes the CSV to disk in
chunks, starts ``privrelease standalone`` (gunicorn + Celery worker), uploads
the file over HTTP streamed from disk, then runs a ``laplace`` mean and a
``dip`` release on it. A sampler thread reads ``/proc/<pid>/status`` of the
API's and the worker's processes throughout, so the peaks printed are those
of the real processes; ``VmHWM`` (reset through ``clear_refs`` at each phase)
catches a spike between two samples. The run fails if the API's peak grows
by more than :func:`api_bound` allows, i.e. if the upload is not streamed.

Linux only (``/proc``). The pytest in ``tests/e2e/test_large_upload.py``
runs the same path at 10^6 rows in CI.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests

from tests.e2e.harness import TOKEN, Service

MB = 1024 * 1024
N_COLUMNS = 5
CATEGORIES = ["alpha", "beta", "gamma", "delta", "epsilon"]
METADATA: dict[str, Any] = {
    "name": "large",
    "budgets": {"epsilon": 10},
    "record_level": True,  # dip releases one output per record: the operator's opt-in
    "columns": {
        "x": {"type": "continuous", "bounds": [0, 100]},
        "w": {"type": "continuous", "bounds": [-1000, 1000]},
        "age": {"type": "integer", "bounds": [0, 120]},
        "count": {"type": "integer", "bounds": [0, 1_000_000]},
        "g": {"type": "categorical", "categories": CATEGORIES},
    },
}
#: every column is stored as 8-byte values (float64, int64, int64 codes)
BYTES_PER_ROW = 8 * N_COLUMNS
#: API growth allowed during an upload, whatever its size: pyarrow's read-ahead (up to
#: 32 blocks of ingest.BLOCK_SIZE), one chunk's arrays and allocator slack (ingest alone
#: grows by ~11 MB at 10^7 rows, tests/bench/test_ingest_bench.py; the hand-written
#: parser's Python strings made it 36 MB)
API_BOUND = 56 * MB


def api_bound(n_rows: int) -> int:
    """Largest growth of an API process's RSS that still proves a streamed upload.

    A constant: holding the file (31 bytes a row here) or the columns (40
    bytes a row) in memory even once exceeds it from 2*10^6 rows on.
    """
    return API_BOUND


def worker_bound(n_rows: int) -> int:
    """Largest growth of a worker's anonymous memory during a ``laplace`` mean.

    Half the stored columns: the columns are memory-mapped (file-backed, not
    anonymous), and the mean copies only the one column it reads (a fifth).
    """
    return n_rows * BYTES_PER_ROW // 2


# --------------------------------------------------------------------------- the CSV


def write_csv(path: Path, n_rows: int, seed: int = 0, chunk: int = 1_000_000) -> int:
    """Write ``n_rows`` rows of the five columns to ``path`` chunk by chunk; returns bytes.

    Only one chunk's values and text are in memory at a time; the file is
    written under a temporary name and renamed, so a half-written file is
    never taken for a finished one.
    """
    rng = np.random.default_rng(seed)
    labels = np.array(CATEGORIES)
    partial = path.with_suffix(".partial")
    with open(partial, "w", encoding="utf-8", newline="") as fh:
        fh.write(",".join(METADATA["columns"]) + "\n")
        for start in range(0, n_rows, chunk):
            m = min(chunk, n_rows - start)
            cells = [
                np.round(rng.uniform(0, 100, m), 4).astype(str),
                np.round(np.clip(rng.normal(0, 200, m), -1000, 1000), 3).astype(str),
                rng.integers(0, 121, m).astype(str),
                rng.integers(0, 1_000_001, m).astype(str),
                labels[rng.integers(0, len(CATEGORIES), m)],
            ]
            fh.write("".join(map("{},{},{},{},{}\n".format, *(c.tolist() for c in cells))))
    partial.rename(path)
    return path.stat().st_size


# --------------------------------------------------------------------------- the upload


class MultipartFile(io.RawIOBase):
    """A multipart/form-data body read from disk as it is sent.

    ``requests`` builds ``files=`` bodies in memory; this body instead has a
    length (so it is sent with Content-Length, not chunked) and reads the
    file part in blocks.
    """

    def __init__(self, path: Path, fields: dict[str, str], boundary: str) -> None:
        super().__init__()
        head = b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
            for k, v in fields.items()
        )
        head += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                 f'filename="{path.name}"\r\nContent-Type: text/csv\r\n\r\n').encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        self._size = len(head) + path.stat().st_size + len(tail)
        self._parts = [io.BytesIO(head), open(path, "rb"), io.BytesIO(tail)]  # noqa: SIM115

    def __len__(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._size
        out = b""
        while self._parts and len(out) < size:
            block = self._parts[0].read(size - len(out))
            if block:
                out += block
            else:
                self._parts.pop(0).close()
        return out

    def close(self) -> None:
        for part in self._parts:
            part.close()
        self._parts = []
        super().close()


def upload(url: str, path: Path, metadata: dict[str, Any], timeout: float) -> requests.Response:
    """POST the CSV at ``path`` as a dataset, streamed from disk."""
    boundary = "privrelease-large-" + os.urandom(8).hex()
    with MultipartFile(path, {"metadata": json.dumps(metadata)}, boundary) as body:
        return requests.post(
            url + "/v1/datasets", data=body, timeout=timeout,
            headers={"Authorization": f"Bearer {TOKEN}",
                     "Content-Type": f"multipart/form-data; boundary={boundary}"})


def warm_up(svc: Service) -> None:
    """Small uploads and a release first, so that no measured phase pays for imports.

    Each call opens a new connection, so both gunicorn workers almost surely
    serve some of them.
    """
    for _ in range(6):
        ds = svc.upload({"epsilon": 1})
    release(svc, {"dataset_id": ds, "mechanism": "laplace", "budget": {"epsilon": 1},
                  "params": {"statistic": "mean", "column": "x"}}, 60)


def release(svc: Service, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Submit a release and wait for its final document."""
    resp = svc.call("POST", "/v1/releases", json=body)
    assert resp.status_code == 202, resp.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc: dict[str, Any] = svc.call("GET", f"/v1/releases/{resp.json()['id']}").json()
        if doc["status"] in {"succeeded", "failed"}:
            return doc
        time.sleep(0.1)
    raise TimeoutError(f"release not finished in {timeout} s")


# --------------------------------------------------------------------------- memory


def _status(pid: int) -> dict[str, int]:
    """The kB fields of /proc/<pid>/status (VmRSS, RssAnon, RssFile, VmHWM), in bytes."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in {"VmRSS", "RssAnon", "RssFile", "VmHWM"}:
                    out[key] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rpartition(")")[2].split()[1])
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def service_processes(root: int) -> dict[str, list[int]]:
    """PIDs of the API (gunicorn master and workers) and the worker (Celery and its pool)."""
    kids = _children()
    groups: dict[str, list[int]] = {"api": [], "worker": []}
    for child in kids.get(root, []):
        cmd = _cmdline(child)
        group = "api" if " api " in cmd + " " else "worker" if " worker " in cmd + " " else None
        if group is None:
            continue
        stack = [child]
        while stack:
            pid = stack.pop()
            groups[group].append(pid)
            stack.extend(kids.get(pid, []))
    return groups


@dataclass
class Peak:
    """Peaks of one group over a phase, each the largest of any one process, in bytes."""

    rss: int = 0
    anon: int = 0  # anonymous memory (heap): what the process itself allocated
    file: int = 0  # file-backed pages, e.g. memory-mapped columns
    growth: int = 0  # largest rise of one process's RSS above its own start
    anon_growth: int = 0  # the same for anonymous memory
    baselines: dict[int, tuple[int, int]] = field(default_factory=dict)

    def see(self, pid: int, status: dict[str, int]) -> None:
        rss = max(status.get("VmRSS", 0), status.get("VmHWM", 0))
        base, base_anon = self.baselines.setdefault(
            pid, (status.get("VmRSS", 0), status.get("RssAnon", 0)))
        self.rss = max(self.rss, rss)
        self.anon = max(self.anon, status.get("RssAnon", 0))
        self.file = max(self.file, status.get("RssFile", 0))
        self.growth = max(self.growth, rss - base)
        self.anon_growth = max(self.anon_growth, status.get("RssAnon", 0) - base_anon)

    def __str__(self) -> str:
        return (f"peak RSS {self.rss / MB:.0f} MB, +{self.growth / MB:.0f} MB over its start "
                f"(anon +{self.anon_growth / MB:.0f} MB; peaks anon {self.anon / MB:.0f} MB, "
                f"file-backed {self.file / MB:.0f} MB)")


class Sampler:
    """Samples the service's processes every ``interval`` s while a phase runs."""

    def __init__(self, root: int, interval: float = 0.02) -> None:
        self.root, self.interval = root, interval

    @contextmanager
    def phase(self) -> Iterator[dict[str, Peak]]:
        peaks = {"api": Peak(), "worker": Peak()}
        groups = service_processes(self.root)
        for pids in groups.values():
            for pid in pids:  # restart VmHWM so it holds this phase's peak only
                try:
                    with open(f"/proc/{pid}/clear_refs", "w") as fh:
                        fh.write("5")
                except OSError:
                    pass
        for name, pids in groups.items():
            for pid in pids:
                status = _status(pid)
                status.pop("VmHWM", None)
                peaks[name].see(pid, status)
        stop = threading.Event()

        def run() -> None:
            refreshed = time.monotonic()
            while True:
                for name, pids in groups.items():
                    for pid in pids:
                        peaks[name].see(pid, _status(pid))
                if stop.wait(self.interval):
                    return
                if time.monotonic() - refreshed > 1.0:
                    groups.update(service_processes(self.root))
                    refreshed = time.monotonic()

        thread = threading.Thread(target=run, daemon=True, name="rss-sampler")
        thread.start()
        try:
            yield peaks
        finally:
            stop.set()
            thread.join()
            for name, pids in groups.items():  # VmHWM covers spikes between samples
                for pid in pids:
                    peaks[name].see(pid, _status(pid))


# --------------------------------------------------------------------------- the run


@dataclass
class Result:
    csv_bytes: int
    upload_seconds: float
    upload: dict[str, Peak]
    releases: dict[str, tuple[float, dict[str, Peak], dict[str, Any]]]


def run(n_rows: int, csv_path: Path, work: Path, *, dip: bool, timeout: float) -> Result:
    """Upload ``csv_path`` to a fresh service, run the releases; return timings and peaks."""
    size = csv_path.stat().st_size
    env = {"PRIVRELEASE_MAX_UPLOAD_BYTES": str(size + 4 * MB),
           "PRIVRELEASE_MAX_ROWS": str(n_rows), "PRIVRELEASE_RATE_LIMIT": "off"}
    svc = Service(work / "service", env=env)
    svc.start()
    try:
        assert svc.proc is not None
        sampler = Sampler(svc.proc.pid)
        warm_up(svc)
        with sampler.phase() as up_peaks:
            started = time.perf_counter()
            resp = upload(svc.url, csv_path, METADATA, timeout)
            seconds = time.perf_counter() - started
        assert resp.status_code == 201, resp.text[:2000]
        doc = resp.json()
        assert doc["n_rows"] == n_rows, doc
        bodies = {"laplace mean": {"mechanism": "laplace",
                                   "params": {"statistic": "mean", "column": "x"}}}
        if dip:
            bodies["dip x"] = {"mechanism": "dip", "params": {"columns": ["x"]}}
        done: dict[str, tuple[float, dict[str, Peak], dict[str, Any]]] = {}
        for name, body in bodies.items():
            with sampler.phase() as peaks:
                started = time.perf_counter()
                out = release(svc, {"dataset_id": doc["id"], "budget": {"epsilon": 1},
                                    **body}, timeout)
                elapsed = time.perf_counter() - started
            assert out["status"] == "succeeded", out
            done[name] = (elapsed, peaks, out)
        return Result(size, seconds, up_peaks, done)
    finally:
        svc.stop()


def report(n_rows: int, res: Result) -> str:
    arrays = n_rows * BYTES_PER_ROW
    lines = [
        f"CSV: {n_rows:,} rows x {N_COLUMNS} columns, {res.csv_bytes / MB:.0f} MB on disk; "
        f"stored columns {arrays / MB:.0f} MB",
        f"upload: {res.upload_seconds:.1f} s ({n_rows / res.upload_seconds:,.0f} rows/s, "
        f"{res.csv_bytes / MB / res.upload_seconds:.1f} MB/s)",
        f"  API (gunicorn worker): {res.upload['api']}",
        f"  worker (Celery):       {res.upload['worker']}",
        f"  API bound on growth:   {api_bound(n_rows) / MB:.0f} MB; worker bound on "
        f"anon growth in the mean: {worker_bound(n_rows) / MB:.0f} MB",
    ]
    for name, (seconds, peaks, out) in res.releases.items():
        lines += [f"release {name}: {seconds:.1f} s (submit to succeeded)",
                  f"  worker (Celery):       {peaks['worker']}",
                  f"  API (gunicorn worker): {peaks['api']}"]
        if "value" in (out.get("result") or {}):
            lines.append(f"  result {out['result']['value']:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.large.large_data",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "privrelease-large",
                        help="where the CSV is kept between runs (reused if present)")
    parser.add_argument("--no-dip", action="store_true", help="skip the DIP release")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds allowed for the upload and for each release")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    csv_path = args.dir / f"large-{args.rows}.csv"
    if not csv_path.exists():
        started = time.perf_counter()
        write_csv(csv_path, args.rows)
        print(f"generated {csv_path} in {time.perf_counter() - started:.1f} s", flush=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.dir))
    try:
        res = run(args.rows, csv_path, work, dip=not args.no_dip, timeout=args.timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(args.rows, res), flush=True)
    failed = False
    growth = res.upload["api"].growth
    if growth > api_bound(args.rows):
        print(f"FAIL: the API grew by {growth / MB:.0f} MB during the upload, more than "
              f"{api_bound(args.rows) / MB:.0f} MB: the upload is not streamed", file=sys.stderr)
        failed = True
    anon = res.releases["laplace mean"][1]["worker"].anon_growth
    if anon > worker_bound(args.rows):
        print(f"FAIL: the worker allocated {anon / MB:.0f} MB for a mean, more than "
              f"{worker_bound(args.rows) / MB:.0f} MB: columns are not memory-mapped",
              file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
