"""A 10^7-row, 3-column cross-tab from Parquet: embedded vs Spark.

Two statistics of ``laplace`` cross-tabs, each over its own Parquet files (two files of
row groups of 10^6 rows, positional columns c0-c2): the counts of 10 x 8 x 5 cells of
three categorical columns, and the exact sums (``float_sums``) of a real column in
10 x 8 cells of two, where the per-row work is larger. Each is computed these ways, each
in a fresh process so its peak RSS is its own:

- embedded: ``statistics.compute`` over the row groups read one at a time in this process;
- spark: ``compute_on_spark`` on a local Spark Connect server (``local[2]``), one
  ``mapInArrow`` task per row group; the driver's peak RSS is the thin client's, the
  local server's (JVM and Python workers, which a cluster would hold) is sampled apart;
- spark-sql (the counts only): Spark's own ``groupBy(c0, c1, c2).count()`` on the same
  files, the alternative a native aggregation would be (no clipping, undeclared codes or
  exact float sums), checked cell by cell against the others.

Each is timed cold (Spark's first job starts its Python workers) and warm (best of 2);
the driver's RSS is given before the passes (imports, session) and at its peak. Run
with ``make bench`` or ``pytest tests/bench/test_spark_bench.py -o addopts="" -s``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.bench

ROWS, ROW_GROUP, FILES = 10**7, 10**6, 2
REMOTE = "local[2]"
#: per case: the categorical columns' sizes, and whether a real column c2 is summed
CASES = {"count": ((10, 8, 5), False), "fsum": ((10, 8), True)}
#: the real column's declared bounds (its values are drawn a little beyond them)
BOUNDS = (0.0, 1e5)


def _names(case: str) -> tuple[str, ...]:
    shape, summed = CASES[case]
    return tuple(f"k{i}" for i in range(len(shape))) + (("x",) if summed else ())


def _write(folder: Path, case: str) -> list[str]:
    """The files, written a row group at a time (never the whole table in memory)."""
    shape, summed = CASES[case]
    rng = np.random.default_rng(0)
    schema = pa.schema([(f"c{i}", pa.int64()) for i in range(len(shape))]
                       + ([("c2", pa.float64())] if summed else []))
    paths = []
    for f in range(FILES):
        path = str(folder / f"{case}-{f}.parquet")
        with pq.ParquetWriter(path, schema) as writer:
            for _ in range(ROWS // FILES // ROW_GROUP):
                columns: dict[str, np.ndarray] = {
                    f"c{i}": rng.integers(0, k, ROW_GROUP) for i, k in enumerate(shape)}
                if summed:
                    columns["c2"] = rng.uniform(-10.0, 1.1e5, ROW_GROUP)
                writer.write_table(pa.table(columns, schema=schema))
        paths.append(path)
    return paths


def _statistic(case: str) -> Any:
    from mechanisms import registry
    from mechanisms.base import ColumnMeta, DatasetMeta

    shape, summed = CASES[case]
    names = _names(case)
    columns = {n: ColumnMeta(n, "categorical", categories=tuple(map(str, range(k))))
               for n, k in zip(names, shape, strict=False)}
    raw: dict[str, Any] = {"statistic": "count", "group_by": list(columns)}
    if summed:
        columns["x"] = ColumnMeta("x", "continuous", BOUNDS)
        raw = {"statistic": "sum", "column": "x", "group_by": list(names[:-1])}
    meta = DatasetMeta(ROWS, columns)
    mech = registry.get("laplace")
    params = mech.load_params(raw)
    cost = mech.cost(params, {"epsilon": Fraction(1)}, meta)
    return mech.statistic(params, cost, meta)


def peak_rss() -> int:
    """This process's peak resident set, in bytes (``VmHWM``: of its own image; Linux's
    ``ru_maxrss`` of a child also counts the image it was exec'ed from, here the whole
    pytest process, which was larger than the embedded pass)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _tree_peak(stop: threading.Event, peak: list[int]) -> None:
    """The largest summed RSS of this process's descendants (the local Spark), sampled."""
    me = psutil.Process()
    while not stop.wait(0.1):
        total = 0
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):  # a worker that just ended
                total += child.memory_info().rss
        peak[0] = max(peak[0], total)


def _phase(kind: str, case: str, paths: list[str]) -> dict[str, Any]:
    """One way of computing the cells, in this (fresh) process."""
    from mechanisms.statistics import compute

    statistic = _statistic(case)
    names = _names(case)
    part = "fsum" if CASES[case][1] else "count"
    out: dict[str, Any] = {"kind": kind}
    if kind == "embedded":
        def batches() -> Any:
            for path in paths:
                with pq.ParquetFile(path) as parquet:
                    for g in range(parquet.metadata.num_row_groups):
                        table = parquet.read_row_group(g, use_threads=False)
                        yield {n: table.column(f"c{i}").to_numpy()
                               for i, n in enumerate(names)}
        out["driver_base_mb"] = psutil.Process().memory_info().rss / 2**20
        times = []
        for _ in range(3):  # as Spark: cold, then warm twice
            start = time.perf_counter()
            _, partial = compute(statistic, batches())
            times.append(time.perf_counter() - start)
        out["seconds"], out["cells"] = times, list(partial.parts[part])
    else:
        from service.engines.spark import compute_on_spark
        from service.engines.spark_session import spark_session, stop

        sampling, server_peak = threading.Event(), [0]
        sampler = threading.Thread(target=_tree_peak, args=(sampling, server_peak))
        sampler.start()
        start = time.perf_counter()
        session = spark_session(REMOTE)
        out["start_seconds"] = time.perf_counter() - start
        out["driver_base_mb"] = psutil.Process().memory_info().rss / 2**20
        times = []
        for _ in range(3):  # cold, then warm twice
            start = time.perf_counter()
            if kind == "spark":
                _, partial = compute_on_spark(session, statistic, paths,
                                              {n: f"c{i}" for i, n in enumerate(names)})
                cells = list(partial.parts[part])
            else:
                rows = (session.read.parquet(*[f"file://{p}" for p in paths])
                        .groupBy("c0", "c1", "c2").count().collect())
                table = np.zeros(CASES[case][0], dtype=np.int64)
                for row in rows:
                    table[row.c0, row.c1, row.c2] = row["count"]
                cells = table.ravel().tolist()
            times.append(time.perf_counter() - start)
        out["seconds"], out["cells"] = times, cells
        stop(REMOTE)
        sampling.set()
        sampler.join()
        out["server_peak_mb"] = server_peak[0] / 2**20
    out["driver_peak_mb"] = peak_rss() / 2**20
    return out


def _compare(tmp_path: Path, case: str, kinds: tuple[str, ...]) -> None:
    paths = _write(tmp_path, case)
    results = {}
    for kind in kinds:
        done = subprocess.run([sys.executable, "-m", "tests.bench.test_spark_bench", kind,
                               case, *paths], check=True, capture_output=True, text=True)
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    cells = results["embedded"]["cells"]
    for kind in kinds:
        assert results[kind]["cells"] == cells, kind  # cell by cell, every bit
    shape = CASES[case][0]
    print(f"\n{case}: {ROWS:,} rows, {FILES} files, row groups of {ROW_GROUP:,}, "
          f"{int(np.prod(shape))} cells")
    for kind, r in results.items():
        seconds = r["seconds"]
        timing = f"cold {seconds[0]:.2f} s, warm {min(seconds[1:]):.2f} s"
        extra = (f" (server start {r['start_seconds']:.1f} s; its peak RSS, JVM and Python"
                 f" workers, {r['server_peak_mb']:.0f} MB)") if "server_peak_mb" in r else ""
        print(f"{kind:>10}: {timing}; driver peak RSS {r['driver_peak_mb']:.0f} MB"
              f" (before the passes {r['driver_base_mb']:.0f} MB){extra}")


@pytest.mark.timeout(1800)  # three processes over 10^7 rows on a shared 2-core machine
def test_cross_tab_counts_of_ten_million_rows_embedded_and_on_spark(tmp_path: Path) -> None:
    _compare(tmp_path, "count", ("embedded", "spark", "spark-sql"))


@pytest.mark.timeout(1800)
def test_exact_float_sums_of_ten_million_rows_embedded_and_on_spark(tmp_path: Path) -> None:
    _compare(tmp_path, "fsum", ("embedded", "spark"))


if __name__ == "__main__":
    print(json.dumps(_phase(sys.argv[1], sys.argv[2], sys.argv[3:])))
