"""Registering by reference (issue #30 item 2): time and peak memory of the scan of a
large multi-file Parquet source into a stored version.

The source is ``PRIVRELEASE_BENCH_BYREF_ROWS`` rows (default 10^8: 900 MB of Parquet,
2.3 GB stored; a couple of minutes in all) of the people table (an integer, a continuous
and a categorical column, random values) in ``PRIVRELEASE_BENCH_BYREF_FILES`` files
(default 20) of 1 Mi-row row groups, snappy, as writers make them: in a local folder,
and (``PRIVRELEASE_BENCH_BYREF_S3=1``; moto serves ranges slowly: minutes at 10^8)
under a prefix of moto's S3 server on loopback. Each registration runs in a fresh
process (``sources.Scan`` into ``DatasetStore.staging`` and ``commit``, what
``datasets.register`` does with the record left out), which reports its seconds, its
peak Python allocation (tracemalloc), Arrow's pool peak, its peak resident growth and its peak RSS
(``VmHWM``: imports included, the figure a worker's memory limit sees);
the baseline, in the same run, reads the same objects and writes them plain, unchecked
(``pyarrow.parquet`` batches into one ``ParquetWriter``).

Asserted: every row is stored, and the peak allocation stays under ``MEMORY_BOUND``
whatever the rows (it is a few chunks of the scan, not the table). Run with
``python -m pytest tests/bench/test_byref_bench.py -o addopts="" -s``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import ROOT

ROWS = int(os.environ.get("PRIVRELEASE_BENCH_BYREF_ROWS", str(10**8)))
FILES = int(os.environ.get("PRIVRELEASE_BENCH_BYREF_FILES", "20"))
ON_S3 = os.environ.get("PRIVRELEASE_BENCH_BYREF_S3", "") == "1"
MB = 1 << 20
#: Python's and Arrow's peak allocation allowed, whatever the rows
MEMORY_BOUND = 48 * MB
GROUP = 1 << 20

PROBE = """
import json, sys, time, tracemalloc
from pathlib import Path
import pyarrow as pa
from service import sources
from service.ingest import parse_metadata
from service.storage.dataset_files import DatasetStore
from service.storage.objects import LocalStore
from tests.integration.conftest import PEOPLE_META

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

url, out, endpoint, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3] or None, sys.argv[4]
traced = sys.argv[5] == "1"  # tracemalloc slows every allocation: timed runs go without
store = DatasetStore(LocalStore(out), staging_dir=out / ".staging")
source = sources.resolve(url, [url], endpoint=endpoint, max_files=10_000)
rss = status("VmRSS")
if traced:
    tracemalloc.start()
start = time.perf_counter()
if mode == "copy":  # the baseline: the same objects read and written plain, unchecked
    import pyarrow.parquet as pq
    out.mkdir(parents=True, exist_ok=True)
    rows, writer = 0, None
    for key in source.keys:
        with source.store.open(key) as fh:
            for batch in pq.ParquetFile(fh, pre_buffer=False, buffer_size=1 << 18
                                        ).iter_batches(batch_size=1 << 16, use_threads=False):
                if writer is None:
                    writer = pq.ParquetWriter(out / "copy.parquet", batch.schema,
                                              compression="NONE", use_dictionary=False,
                                              write_statistics=False)
                writer.write_batch(batch, row_group_size=1 << 16)
                rows += batch.num_rows
    writer.close()
    stored = out / "copy.parquet"
else:
    scan = sources.Scan(source, parse_metadata(PEOPLE_META), 10**9)
    with store.staging() as staged:
        for chunk in scan.chunks():
            staged.append(chunk)
        staged.commit("ds_bench", 1, {"source": scan.record()})
    rows, stored = staged.n_rows, out / "datasets/ds_bench/v1/data.parquet"
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rows": rows,
                  "python": tracemalloc.get_traced_memory()[1] if traced else None,
                  "arrow": pa.default_memory_pool().max_memory(),
                  "rss_growth": status("VmHWM") - rss, "rss_peak": status("VmHWM"),
                  "stored_bytes": stored.stat().st_size}))
"""


def _write(folder: Path) -> int:
    """The source's files; their total size."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(30)
    groups = np.array(["a", "b", "c"])
    per_file = -(-ROWS // FILES)
    schema = pa.schema([("age", pa.int64()), ("income", pa.float64()), ("group", pa.string())])
    for k in range(FILES):
        rows = min(per_file, ROWS - k * per_file)
        with pq.ParquetWriter(folder / f"part-{k:05d}.parquet", schema) as writer:
            for start in range(0, rows, GROUP):
                n = min(GROUP, rows - start)
                writer.write_table(pa.table({
                    "age": rng.integers(0, 101, n), "income": rng.uniform(0, 1000, n),
                    "group": groups[rng.integers(0, 3, n)]}, schema=schema))
    return sum(f.stat().st_size for f in folder.iterdir())


def _probe(url: str, out: Path, endpoint: str = "", env: dict[str, str] | None = None,
           mode: str = "register") -> dict[str, Any]:
    """One timed run, then one under tracemalloc (its Python peak), each in a fresh
    process writing to a fresh folder."""
    results = []
    for traced in ("0", "1"):
        proc = subprocess.run([sys.executable, "-c", PROBE, url, str(out / traced), endpoint,
                               mode, traced], cwd=ROOT, capture_output=True, text=True,
                              check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        results.append(json.loads(proc.stdout))
        shutil.rmtree(out / traced)
    timed, traced_run = results
    result: dict[str, Any] = {**timed, "python": traced_run["python"],
                              "arrow": max(timed["arrow"], traced_run["arrow"]),
                              "rss_growth": max(timed["rss_growth"], traced_run["rss_growth"]),
                              "rss_peak": timed["rss_peak"]}
    return result


def _report(where: str, source_bytes: int, result: dict[str, Any],
            baseline: dict[str, Any]) -> None:
    print(f"\nby reference, {where}: {result['rows']:,} rows in {FILES} files "
          f"({source_bytes / MB:.0f} MB of Parquet) in {result['seconds']:.1f} s "
          f"({result['rows'] / result['seconds'] / 1e6:.2f} M rows/s); stored "
          f"{result['stored_bytes'] / MB:.0f} MB; peak allocation: Python "
          f"{result['python'] / MB:.1f} MB + Arrow {result['arrow'] / MB:.1f} MB; peak RSS "
          f"growth {result['rss_growth'] / MB:.0f} MB (the process's peak RSS, imports included, "
          f"{result['rss_peak'] / MB:.0f} MB); baseline (read and written plain,"
          f" unchecked) {baseline['seconds']:.1f} s, peak Python "
          f"{baseline['python'] / MB:.1f} MB + Arrow {baseline['arrow'] / MB:.1f} MB: ratio "
          f"{result['seconds'] / baseline['seconds']:.2f}x its time")
    assert result["rows"] == baseline["rows"] == ROWS
    assert result["python"] + result["arrow"] < MEMORY_BOUND


def test_register_a_large_local_source(tmp_path: Path) -> None:
    source_bytes = _write(tmp_path / "src")
    url = (tmp_path / "src").as_uri()
    baseline = _probe(url, tmp_path / "copy", mode="copy")
    result = _probe(url, tmp_path / "out")
    _report("a local folder", source_bytes, result, baseline)


def test_register_a_large_s3_source(tmp_path: Path) -> None:
    if not ON_S3:
        print("\nby reference from S3: set PRIVRELEASE_BENCH_BYREF_S3=1 to run it")
        return
    import boto3
    from moto.server import ThreadedMotoServer

    source_bytes = _write(tmp_path / "src")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "AKIABENCH", "AWS_SECRET_ACCESS_KEY": uuid.uuid4().hex,
                 "AWS_REGION": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"])
        s3.create_bucket(Bucket="bench")
        for path in sorted((tmp_path / "src").iterdir()):
            s3.upload_file(str(path), "bench", f"src/{path.name}")
        baseline = _probe("s3://bench/src", tmp_path / "copy", endpoint, creds, mode="copy")
        result = _probe("s3://bench/src", tmp_path / "out", endpoint, creds)
        _report("S3 (moto on loopback)", source_bytes, result, baseline)
    finally:
        server.stop()
