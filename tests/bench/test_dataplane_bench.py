"""The data plane of issue #30: a release's cost against its rows, and a 3-way cross-tab
of 10^8 stored rows against DuckDB's aggregate of the same Parquet file.

Each dataset is a real stored version (``DatasetStore`` over a local object store:
Parquet, positional columns, row groups of 65,536 rows), written once per size in
bounded memory (chunks of 2^20 rows) into a cache folder (``DATAPLANE_CACHE``, default
``/tmp/privrelease-dataplane``) and reused by later runs: ``table`` (x continuous in
[0, 100]; a, b, c categorical with 10, 8 and 5 categories) and ``curves`` (f functional,
``GRID`` points). Every measurement runs in a fresh process, as a worker would run it:

- ``test_cross_tab_against_duckdb``: the ``laplace`` count cross-tab of a, b, c through
  the worker's ``service.releases.run._run`` (the statistic streamed over the version's
  row groups, then the release), against DuckDB's ``GROUP BY`` count of the same three
  columns of the same ``data.parquet``; alternated, two rounds. Reported: CPU seconds of
  the work (the process's, all threads), wall seconds, the process's peak RSS
  (``VmHWM``, imports included); DuckDB's counts must equal our exact counts cell by
  cell. Asserted: our peak RSS <= 1 GiB and our CPU <= 1.5x DuckDB's.
- ``test_cost_against_rows``: mean, cross-tab, quantile (``laplace``), ICLP mean and DIP,
  each through ``_run`` at each size, embedded and on Spark ``local[2]`` (the session
  started and a small release run first, so a cell measures a warm worker; the driver's
  peak RSS and the local server's, sampled, apart). A mechanism that is not a
  ``StreamingMechanism`` reads whole columns (and has no Spark path): its sizes are
  capped where ``Mechanism.memory``'s bound (public) passes ``MEMORY_CAP``. Every cell is
  kept in ``results.json`` of the cache; the table of all kept cells is written to
  ``var/bench-dataplane.md`` and the plot to ``docs/bench/dataplane.png``.

Sizes: ``DATAPLANE_ROWS`` (default ``1e5,1e6,1e7,1e8``); ``DATAPLANE_MECHANISMS`` and
``DATAPLANE_ENGINES`` pick cells (default all). Run with ``make bench`` or
``pytest tests/bench/test_dataplane_bench.py -o addopts="" -s``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.bench.test_spark_bench import _tree_peak, peak_rss
from tests.conftest import ROOT

pytestmark = pytest.mark.bench

CACHE = Path(os.environ.get("DATAPLANE_CACHE", "/tmp/privrelease-dataplane"))
SIZES = [int(float(s)) for s in os.environ.get("DATAPLANE_ROWS", "1e5,1e6,1e7,1e8").split(",")]
REMOTE = "local[2]"
ENGINES = os.environ.get("DATAPLANE_ENGINES", "embedded,spark").split(",")
#: rows of the version each process first runs its release on (imports, caches, Spark's
#: Python workers), before the measured one
WARM_ROWS = 1000
#: rows generated and appended at a time (the writer's memory)
CHUNK_ROWS = 1 << 20
#: cells per row of the functional column f
GRID = 8
#: the sizes of the categorical columns a, b, c
SHAPE = (10, 8, 5)
GIB = 1 << 30
#: a mechanism reading whole columns is not run where its memory bound passes this
MEMORY_CAP = 6 * GIB
#: the issue's goals for the 10^8-row cross-tab
RSS_GOAL, CPU_RATIO_GOAL = 1 * GIB, 1.5
EPS = {"epsilon": 1}
#: label -> (dataset kind, mechanism, params, budget)
MECHANISMS: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    "mean": ("table", "laplace", {"statistic": "mean", "column": "x"}, EPS),
    "cross-tab": ("table", "laplace", {"statistic": "count", "group_by": ["a", "b", "c"]}, EPS),
    "quantile": ("table", "laplace",
                 {"statistic": "quantile", "column": "x", "quantiles": [0.5]}, EPS),
    "ICLP mean": ("curves", "iclp.mean", {"column": "f"}, EPS),
    "DIP": ("table", "dip", {"columns": ["x"]}, EPS),
}
PICKED = os.environ.get("DATAPLANE_MECHANISMS", ",".join(MECHANISMS)).split(",")
RESULTS = CACHE / "results.json"
SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
TABLE = ROOT / "var" / "bench-dataplane.md"
PLOT = ROOT / "docs" / "bench" / "dataplane.png"


# ------------------------------------------------------------------------ the data


def _meta(kind: str, rows: int) -> Any:
    from mechanisms.base import ColumnMeta, DatasetMeta

    if kind == "table":
        columns = {"x": ColumnMeta("x", "continuous", (0.0, 100.0))} | {
            name: ColumnMeta(name, "categorical", categories=tuple(f"{name}{i}" for i in range(k)))
            for name, k in zip("abc", SHAPE, strict=True)}
    else:
        grid = tuple(np.linspace(0.0, 1.0, GRID).tolist())
        columns = {"f": ColumnMeta("f", "functional", grid=grid, norm_bound=1.0)}
    return DatasetMeta(rows, columns, keep_row_order=True)


def _chunk(kind: str, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if kind == "table":
        return {"x": rng.uniform(0.0, 100.0, rows)} | {
            name: rng.integers(0, k, rows) for name, k in zip("abc", SHAPE, strict=True)}
    return {"f": 0.3 * rng.standard_normal((rows, GRID)) / np.sqrt(GRID)}


def _store(kind: str, rows: int) -> Any:
    from service.storage.dataset_files import DatasetStore
    from service.storage.objects import LocalStore

    root = CACHE / kind / str(rows)
    return DatasetStore(LocalStore(root), staging_dir=root / ".staging")


def stored(kind: str, rows: int) -> Path:
    """The version of ``rows`` rows of ``kind`` (written now unless the cache has it); its
    data object's path."""
    store = _store(kind, rows)
    if not store.exists("bench", 1):
        shutil.rmtree(CACHE / kind / str(rows), ignore_errors=True)  # a write cut short
        store = _store(kind, rows)
        rng = np.random.default_rng([30, rows, len(kind)])
        with store.staging() as staged:
            for start in range(0, rows, CHUNK_ROWS):
                staged.append(_chunk(kind, min(CHUNK_ROWS, rows - start), rng))
            staged.commit("bench", 1, {"kind": kind})
    return CACHE / kind / str(rows) / store.key("bench", 1) / "data.parquet"


# -------------------------------------------------------------- one measured process


def _job(label: str, rows: int) -> Any:
    from mechanisms import registry
    from service.releases import run

    kind, name, raw, spend = MECHANISMS[label]
    mech = registry.get(name)
    params = mech.load_params(raw)
    meta = _meta(kind, rows)
    cost = mech.cost(params, {m: Fraction(v) for m, v in spend.items()}, meta)
    return run._Job("bench", 1, mech, params, cost, meta, seed=11)


def _cpu_of_tree() -> float:
    """CPU seconds of this process's live descendants (the local Spark)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def measure(engine: str, label: str, rows: int, cells: bool) -> dict[str, Any]:
    """One release of ``label`` over the cached version of ``rows`` rows, in this (fresh)
    process, after one over ``WARM_ROWS`` rows; with ``cells``, the exact cross-tab counts
    too (computed after the measurement, by the same streamed statistic)."""
    import psutil

    from service.releases import run

    kind = MECHANISMS[label][0]
    remote = REMOTE if engine == "spark" else None
    out: dict[str, Any] = {}
    sampling, server_peak = threading.Event(), [0]
    sampler = threading.Thread(target=_tree_peak, args=(sampling, server_peak), daemon=True)
    if remote is not None:
        from service.engines.spark_session import spark_session

        sampler.start()
        start = time.perf_counter()
        spark_session(remote)
        out["start_seconds"] = time.perf_counter() - start
    run._run(_store(kind, WARM_ROWS), _job(label, WARM_ROWS), remote)
    job, store = _job(label, rows), _store(kind, rows)
    out["base_rss"] = psutil.Process().memory_info().rss
    server_cpu = _cpu_of_tree()
    load, cpu, wall = os.getloadavg()[0], time.process_time(), time.perf_counter()
    _, out["engine"] = run._run(store, job, remote)
    out["cpu"] = time.process_time() - cpu
    out["wall"] = time.perf_counter() - wall
    out["load"] = [load, os.getloadavg()[0]]
    out["rss"] = peak_rss()
    if remote is not None:
        from service.engines.spark_session import stop

        out["server_cpu"] = _cpu_of_tree() - server_cpu
        stop(remote)
        sampling.set()
        sampler.join()
        out["server_rss"] = server_peak[0]
    out["process_cpu"] = _process_cpu()
    if cells:
        from mechanisms.statistics import compute_over

        statistic = job.mechanism.statistic(job.params, job.cost, job.meta)
        _, partial = compute_over(statistic, lambda c: store.batches("bench", 1, c))
        out["cells"] = list(partial.parts["count"])
    return out


def duckdb_counts(path: str) -> dict[str, Any]:
    """DuckDB's count per (a, b, c) of the stored file (c1, c2, c3), in this process."""
    import duckdb

    connection = duckdb.connect()
    load, cpu, wall = os.getloadavg()[0], time.process_time(), time.perf_counter()
    rows = connection.execute(f"SELECT c1, c2, c3, count(*) FROM read_parquet('{path}')"
                              " GROUP BY c1, c2, c3").fetchall()
    out: dict[str, Any] = {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
                           "load": [load, os.getloadavg()[0]], "engine": "duckdb"}
    out["rss"] = peak_rss()
    out["process_cpu"] = _process_cpu()
    table = np.zeros(SHAPE, dtype=np.int64)
    for a, b, c, n in rows:
        table[a, b, c] = n
    out["cells"] = table.ravel().tolist()
    return out


def _process_cpu() -> float:
    """CPU seconds of this whole process so far (imports and warm-up included) and of its
    children that ended (a local Spark, once stopped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime


def _child(*args: str) -> dict[str, Any]:
    """One measurement in a fresh interpreter (``measure`` or ``duckdb_counts``)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.test_dataplane_bench", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: {stderr[-3000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


# ------------------------------------------------------------------------ reporting


def _machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}"


def _load() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def _keep(key: str, record: dict[str, Any]) -> None:
    kept = _load()
    kept[key] = {**record, "date": datetime.datetime.now(datetime.UTC).strftime(
        "%Y-%m-%d %H:%M UTC"), "machine": _machine()}
    RESULTS.write_text(json.dumps(kept, indent=1))


def _mb(value: float) -> str:
    return f"{value / 2**20:,.0f}"


def _rows(rows: int) -> str:
    exponent = round(np.log10(rows))
    return f"10{str(exponent).translate(SUPERSCRIPTS)}" if 10**exponent == rows else f"{rows:,}"


def write_table() -> None:
    """Every kept cell as a Markdown table (``TABLE``)."""
    kept = _load()
    lines = ["# Data-plane benchmark (tests/bench/test_dataplane_bench.py)", "",
             f"Machine: {_machine()}.", "",
             "| mechanism | engine | rows | CPU s | wall s | peak RSS MB | Spark server "
             "peak RSS MB / CPU s | load (start–end) | when |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = {label: i for i, label in enumerate([*MECHANISMS, "duckdb"])}
    for key in sorted(kept, key=lambda k: (order.get(kept[k]["label"], 99), kept[k]["engine"],
                                            kept[k]["rows"])):
        r = kept[key]
        if "skipped" in r:
            lines.append(f"| {r['label']} | {r['engine']} | {_rows(r['rows'])} | "
                         f"{r['skipped']} | | | | | {r['date']} |")
            continue
        server = (f"{_mb(r['server_rss'])} / {r['server_cpu']:.1f}"
                  if "server_rss" in r else "")
        lines.append(f"| {r['label']} | {r['engine']} | {_rows(r['rows'])} | {r['cpu']:.2f} | "
                     f"{r['wall']:.2f} | {_mb(r['rss'])} | {server} | "
                     f"{r['load'][0]:.1f}–{r['load'][1]:.1f} | {r['date']} |")
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text("\n".join([*lines, "", *_compact(kept)]) + "\n")


def _compact(kept: dict[str, Any]) -> list[str]:
    """The cells of ``test_cost_against_rows`` as one line per mechanism and engine (the
    README's table): wall seconds (CPU seconds) / peak RSS MB per size; Spark's local
    server apart."""
    sizes = sorted({r["rows"] for r in kept.values() if r["label"] in MECHANISMS})
    lines = ["| mechanism | engine | " + " | ".join(_rows(n) for n in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for label in MECHANISMS:
        for engine in ("embedded", "spark"):
            cells = {r["rows"]: r for r in kept.values()
                     if r["label"] == label and r["kind"] == engine}
            if not cells:
                continue
            shown = []
            for n in sizes:
                r = cells.get(n)
                if r is None:
                    shown.append("–")
                elif "skipped" in r:
                    shown.append(r["skipped"])
                else:
                    shown.append(f"{r['wall']:.2g} s ({r['cpu']:.2g} CPU s) / {_mb(r['rss'])} MB"
                                 + (f"; server {r['server_cpu']:.2g} CPU s / "
                                    f"{_mb(r['server_rss'])} MB" if "server_rss" in r else ""))
            name = "embedded" if engine == "embedded" else f"Spark {REMOTE}"
            lines.append(f"| {label} | {name} | " + " | ".join(shown) + " |")
    return lines


def write_plot() -> None:
    """Wall time and peak RSS against rows, log-log, a line per mechanism and engine."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mechanisms import registry
    from mechanisms.base import RecordMechanism, StreamingMechanism

    everything = _load().values()
    kept = [r for r in everything if "skipped" not in r and r["label"] in MECHANISMS]
    skipped = {r["label"]: f"{_rows(r['rows'])}: {r['skipped']}" for r in
               sorted(everything, key=lambda r: r["rows"]) if "skipped" in r}
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 7.5), layout="constrained")
    colours = dict(zip(MECHANISMS, plt.rcParams["axes.prop_cycle"].by_key()["color"],
                       strict=False))
    for label in MECHANISMS:
        for engine, style in (("embedded", "-"), ("spark", "--")):
            points = sorted((r["rows"], r) for r in kept
                            if r["label"] == label and r["kind"] == engine)
            if not points:
                continue
            rows = [n for n, _ in points]
            name = f"{label}, {'embedded' if engine == 'embedded' else 'Spark ' + REMOTE}"
            mech = registry.get(MECHANISMS[label][1])
            if not isinstance(mech, StreamingMechanism):
                kind = ("row map: holds the released table" if isinstance(mech, RecordMechanism)
                        else "whole columns")
                name += f" ({kind}" + (f"; {skipped[label]})" if label in skipped else ")")
            left.plot(rows, [r["wall"] for _, r in points], style, marker="o",
                      color=colours[label], label=name)
            right.plot(rows, [r["rss"] / 2**20 for _, r in points], style, marker="o",
                       color=colours[label], label=name + (" (driver)" if engine == "spark"
                                                           else ""))
            if engine == "spark":
                right.plot(rows, [r["server_rss"] / 2**20 for _, r in points], ":",
                           marker="x", color=colours[label], label=f"{label}, Spark server")
    right.axhline(RSS_GOAL / 2**20, color="grey", linewidth=0.8, linestyle="-.",
                  label="1 GiB (the 10⁸-row cross-tab's goal)")
    for axis, title, unit in ((left, "Time of one release", "wall time (s)"),
                              (right, "Peak memory of the process", "peak RSS (MiB)")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("rows of the stored version")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    right.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    right.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    handles, labels = right.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8)
    figure.suptitle("Release cost against rows (issue #30): embedded worker (solid) and "
                    f"Spark {REMOTE} (dashed: driver; dotted: local server)\n{_machine()}")
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(PLOT, dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------------------- tests


@pytest.mark.timeout(7200)
def test_cross_tab_against_duckdb() -> None:
    rows = max(SIZES)
    path = str(stored("table", rows))
    stored("table", WARM_ROWS)
    ours, theirs = [], []
    for _ in range(2):  # alternated: both see the same load
        ours.append(_child("measure", "embedded", "cross-tab", str(rows), "cells"))
        theirs.append(_child("duckdb", path))
    assert all(r["cells"] == ours[0]["cells"] for r in ours + theirs)  # cell by cell
    assert sum(ours[0]["cells"]) == rows
    best, duck = min(ours, key=lambda r: r["cpu"]), min(theirs, key=lambda r: r["cpu"])
    ratio = best["cpu"] / duck["cpu"]
    print(f"\n3-way cross-tab ({int(np.prod(SHAPE))} cells) of {rows:,} stored rows:")
    for name, results in (("ours", ours), ("duckdb", theirs)):
        for r in results:
            print(f"{name:>7}: CPU {r['cpu']:.2f} s, wall {r['wall']:.2f} s, peak RSS "
                  f"{_mb(r['rss'])} MB, load {r['load'][0]:.1f}–{r['load'][1]:.1f}; the whole "
                  f"process (imports, warm-up) {r['process_cpu']:.2f} CPU s")
    print(f"CPU ours / DuckDB: {ratio:.2f} (goal <= {CPU_RATIO_GOAL}); same counts: checked")
    for name, r in (("cross-tab", best), ("duckdb", duck)):
        _keep(f"duckdb-test/{name}/{rows}", {k: v for k, v in r.items() if k != "cells"}
              | {"label": "duckdb" if name == "duckdb" else "cross-tab (vs DuckDB)",
                 "kind": r["engine"], "rows": rows, "ratio": ratio})
    write_table()
    assert best["rss"] <= RSS_GOAL
    assert ratio <= CPU_RATIO_GOAL


@pytest.mark.timeout(14400)
def test_cost_against_rows() -> None:
    from mechanisms import registry
    from mechanisms.base import StreamingMechanism

    for label in PICKED:
        kind, name, raw, _ = MECHANISMS[label]
        mech = registry.get(name)
        streaming = isinstance(mech, StreamingMechanism)
        for rows in SIZES:
            for engine in ENGINES:
                key = f"{engine}/{label}/{rows}"
                base = {"label": label, "kind": engine, "engine": engine, "rows": rows}
                if engine == "spark" and not streaming:
                    # a record-level row map runs on Spark through the worker's whole step
                    # (its table stored as parts): test_spark_records_bench.py measures it
                    print(f"{key}: not run here (no streamed statistic; a row map's Spark"
                          " run is tests/bench/test_spark_records_bench.py)")
                    continue
                need = mech.memory(mech.load_params(raw), _meta(kind, rows)).bytes
                if need > MEMORY_CAP:
                    _keep(key, base | {"skipped": f"not run: needs {need / GIB:.0f} GiB"})
                    print(f"{key}: not run: needs {need / GIB:.1f} GiB")
                    continue
                stored(kind, rows)
                stored(kind, WARM_ROWS)
                result = _child("measure", engine, label, str(rows))
                if engine == "spark" and not str(result.get("engine", "")).startswith("spark"):
                    # the worker chose to read it itself (a version Spark does not read:
                    # functional columns): not a Spark figure
                    _keep(key, base | {"skipped": "ran embedded: no Spark path for it"})
                    print(f"{key}: ran embedded (the worker gives Spark no such version)")
                    continue
                _keep(key, base | result)
                print(f"{key}: CPU {result['cpu']:.2f} s, wall {result['wall']:.2f} s, peak "
                      f"RSS {_mb(result['rss'])} MB"
                      + (f", server {_mb(result['server_rss'])} MB" if engine == "spark"
                         else ""), flush=True)
                write_table()
                write_plot()
    write_table()
    write_plot()


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        print(json.dumps(measure(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                 sys.argv[5:] == ["cells"])))
    else:
        print(json.dumps(duckdb_counts(sys.argv[2])))
