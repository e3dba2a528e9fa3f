"""A 10^7-row DIP release on Spark ``local[2]``: the thin client's memory (issue #30 item 4).

A stored dataset version of 10^7 rows (``DatasetStore``: Parquet row groups of 65,536
rows, one continuous column and a categorical one) is released with DIP and a
joint-histogram reference, as the worker does it on Spark
(``service.engines.spark_records``): the histogram's exact counts as a Spark pass, the
noisy reference on the driver, each row group privatized by a Spark Python worker with
its own generator, the rows ordered by the dataset's v2 key in buckets and written as
parts (``release_tables``). Measured in a fresh process each: the driver's (the thin
Spark Connect client's) peak RSS, the goal being 2 GiB and never the rows; the local
Spark's (JVM and Python workers, which a cluster would hold) sampled apart; the time.
For scale, the same release embedded (the worker holds the table it builds). The two
stored tables are checked equal row by row (the same job secret). Run with
``pytest tests/bench/test_spark_records_bench.py -o addopts="" -s``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

pytestmark = pytest.mark.bench

ROWS = 10**7
REMOTE = "local[2]"
#: the driver's goal
GOAL_MB = 2048
SEED = 20261129


def _meta() -> Any:
    from mechanisms.base import ColumnMeta, DatasetMeta

    return DatasetMeta(ROWS, {"x": ColumnMeta("x", "continuous", (0.0, 100.0)),
                              "c": ColumnMeta("c", "categorical", categories=tuple("abcdefgh"))})


def _store(root: Path) -> Any:
    from service.storage.dataset_files import DatasetStore
    from service.storage.objects import LocalStore

    return DatasetStore(LocalStore(root), staging_dir=root / ".staging")


def _write(root: Path) -> None:
    """The version, staged a million rows at a time."""
    rng = np.random.default_rng(0)
    store = _store(root)
    with store.staging() as staged:
        for _ in range(ROWS // 10**6):
            staged.append({"x": rng.gamma(3.0, 8.0, 10**6), "c": rng.integers(0, 8, 10**6)})
        staged.commit("ds_bench", 1, {"kind": "bench"})


def _phase(kind: str, root: Path) -> dict[str, Any]:
    """One release in this (fresh) process; its table stored as release ``kind``."""
    from mechanisms import get, record_maps, rows
    from mechanisms.base import RecordMechanism
    from mechanisms.rng import job_secret, secure_generator
    from service.storage.release_tables import OutputStore

    store, meta = _store(root), _meta()
    outputs = OutputStore(store.objects, root / ".staging")
    mech = get("dip")
    assert isinstance(mech, RecordMechanism)
    params = mech.load_params({"columns": ["x", "c"]})
    cost = mech.cost(params, {"epsilon": Fraction(1)}, meta)
    key = rows.RowKey(bytes(range(32)), rows.V2)
    out: dict[str, Any] = {"kind": kind}
    if kind == "embedded":
        out["driver_base_mb"] = psutil.Process().memory_info().rss / 2**20
        start = time.perf_counter()

        def read(columns: Any) -> Any:
            return store.batches("ds_bench", 1, columns)

        job = record_maps.fit(mech, read, params, cost, meta, secure_generator(SEED),
                              job_secret(SEED))
        released = record_maps.release(job, read(job.columns))
        assert released.table is not None
        table = rows.permute(released.table, key, ROWS, released.row_column)
        out["rows"] = outputs.save(kind, 1, table)
        out["seconds"] = time.perf_counter() - start
    else:
        from service.engines import spark_records
        from service.engines.spark import compute_on_spark
        from service.engines.spark_session import spark_session, stop

        sampling, server_peak = threading.Event(), [0]
        sampler = threading.Thread(target=_tree_peak, args=(sampling, server_peak))
        sampler.start()
        start = time.perf_counter()
        session = spark_session(REMOTE)
        out["start_seconds"] = time.perf_counter() - start
        out["driver_base_mb"] = psutil.Process().memory_info().rss / 2**20
        start = time.perf_counter()
        source = store.parquet_source("ds_bench", 1)
        assert source is not None
        job = record_maps.fit_from(
            mech, lambda statistic: compute_on_spark(session, statistic, [source.path],
                                                     source.columns, source.filesystem)[1],
            params, cost, meta, secure_generator(SEED), job_secret(SEED))
        _, parts = spark_records.release_on_spark(
            session, job, [source.path], source.columns, source.filesystem,
            spark_records.plan_order(key, ROWS, mech.record_row_column),
            outputs.parts_place(kind, 1))
        out["rows"] = outputs.commit_parts(kind, 1, parts)
        out["parts"] = len(parts)
        out["seconds"] = time.perf_counter() - start
        stop(REMOTE)
        sampling.set()
        sampler.join()
        out["server_peak_mb"] = server_peak[0] / 2**20
    out["driver_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _tree_peak(stop: threading.Event, peak: list[int]) -> None:
    """The largest summed RSS of this process's descendants (the local Spark), sampled."""
    me = psutil.Process()
    while not stop.wait(0.2):
        total = 0
        for child in me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.NoSuchProcess:  # a worker that just ended
                continue
        peak[0] = max(peak[0], total)


def _same_tables(root: Path) -> bool:
    """The two stored tables, a column at a time (one column of each in memory)."""
    import pyarrow.parquet as pq

    from service.storage.release_tables import OutputStore

    outputs = OutputStore(_store(root).objects, root / ".staging")
    base = outputs.store.key("spark", 1)
    listed = json.loads(outputs.store.objects.get(f"{base}/parts.json"))["parts"]
    embedded_base = outputs.store.key("embedded", 1)
    for index, name in enumerate(["_row", "x", "c"]):
        with outputs.store.objects.open(f"{embedded_base}/data.parquet") as fh:
            mine = pq.read_table(fh, columns=[f"c{index}"]).column(0).to_numpy()
        theirs = []
        for part in listed:
            with outputs.store.objects.open(f"{base}/{part['key']}") as fh:
                theirs.append(pq.read_table(fh, columns=[name]).column(0).to_numpy(
                    zero_copy_only=False))
        if not np.array_equal(np.asarray(mine).astype(str) if name == "c" else mine,
                              np.concatenate(theirs).astype(str) if name == "c"
                              else np.concatenate(theirs)):
            return False
    return True


@pytest.mark.timeout(3600)
def test_ten_million_row_dip_release_on_spark_in_a_thin_driver(tmp_path: Path) -> None:
    _write(tmp_path)
    results = {}
    for kind in ("spark", "embedded"):
        done = subprocess.run([sys.executable, "-m", "tests.bench.test_spark_records_bench",
                               kind, str(tmp_path)], check=True, capture_output=True,
                              text=True)
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nDIP (x continuous, c categorical; joint histogram reference), {ROWS:,} rows")
    for kind, r in results.items():
        extra = (f"; {r['parts']} parts; server start {r['start_seconds']:.1f} s, local Spark"
                 f" peak RSS (JVM and Python workers) {r['server_peak_mb']:.0f} MB"
                 if kind == "spark" else "")
        print(f"{kind:>9}: {r['seconds']:.1f} s; driver peak RSS {r['driver_peak_mb']:.0f} MB"
              f" (before the release {r['driver_base_mb']:.0f} MB){extra}")
    same = _same_tables(tmp_path)
    print(f"stored tables equal row by row: {same}")
    assert results["spark"]["rows"] == results["embedded"]["rows"] == ROWS
    assert same
    assert results["spark"]["driver_peak_mb"] < GOAL_MB


if __name__ == "__main__":
    print(json.dumps(_phase(sys.argv[1], Path(sys.argv[2]))))
