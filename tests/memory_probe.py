"""Measure a release's peak allocation as the worker makes it (issue #30 item 6).

A real stored version (Parquet in a local object store) of x, y (continuous), k (integer),
g, h, c (categorical; c has 10 categories) and f (functional, ``GRID`` cells per row) is
read and run by the worker's own ``service.releases.run._run``. In a fresh interpreter
per call, each case is first run on a small version (imports, caches), then measured
on the large one: the peak of Python's allocations (tracemalloc, numpy's included) above
what was held before, plus the peak of a fresh Arrow pool (what tracemalloc does not
see). ``python -m tests.memory_probe N`` prints every case's bytes per row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from mechanisms.base import ColumnMeta, DatasetMeta

ROOT = Path(__file__).resolve().parent.parent
#: cells per row of the functional column f
GRID = 8
#: rows of the version each case is first run on (warm-up)
WARM_ROWS = 2000

COLUMNS = {
    "x": ColumnMeta("x", "continuous", (0.0, 100.0)),
    "y": ColumnMeta("y", "continuous", (-1.0, 1.0)),
    "k": ColumnMeta("k", "integer", (0.0, 100.0)),
    "g": ColumnMeta("g", "categorical", categories=("a", "b", "c", "d")),
    "h": ColumnMeta("h", "categorical", categories=("a", "b", "c", "d")),
    "c": ColumnMeta("c", "categorical", categories=tuple(f"c{i}" for i in range(10))),
    "f": ColumnMeta("f", "functional", grid=tuple(np.linspace(0.0, 1.0, GRID).tolist()),
                    norm_bound=1.0),
}

EPS = {"epsilon": 1}
APPROX = {"epsilon": 1, "delta": 1e-6}
BITS = {"noiseless_bits": 3}
DRAW = {"subset_draws": 1}
LEAK = {"interval_leakage": 0.6}
ANCHORS = {"family": "uniform", "low": 0, "high": 100}
PAIRS6 = [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"], ["a", "d"], ["b", "c"]]

#: a case: (mechanism, params, budget)
Case = tuple[str, dict[str, Any], dict[str, Any]]

#: per family, the cases its memory figure is calibrated on and tested against
FAMILIES: dict[str, list[Case]] = {
    "baselines": [
        ("laplace", {"statistic": "mean", "column": "x"}, EPS),
        ("laplace", {"statistic": "quantile", "column": "x", "quantiles": [0.5]}, EPS),
        ("geometric", {"statistic": "count", "group_by": ["g", "h", "c"]}, EPS),
        ("gaussian", {"statistic": "variance", "column": "x"}, APPROX),
        ("noiseless.aggregate", {"statistic": "median", "column": "x"}, BITS),
    ],
    "dip": [("dip", {"columns": ["x", "k", "g"]}, EPS),
            ("dip", {"columns": ["x", "k", "g"], "reference": {"kind": "dp", "model": "copula"}},
             EPS)],
    "interval": [
        ("interval.case1", {"column": "x", "anchors": ANCHORS}, LEAK),
        ("interval.case2", {"column": "x", "anchors": ANCHORS}, LEAK),
        ("interval.casek", {"column": "x", "m": 3, "anchors": ANCHORS}, LEAK),
        ("interval.selective", {"column": "x", "tau": 0.5, "anchors": ANCHORS}, LEAK),
        ("interval.ring", {"column": "x"}, LEAK),
        ("interval.progressive", {"column": "x", "rounds": 2}, {"interval_leakage": 0.9}),
        ("interval.progressive_categorical", {"column": "c", "rounds": 3},
         {"interval_leakage": 0.9}),
        # four piece columns (``Interval.map_bytes``) and 16 rounds of draws (``map_bytes``)
        ("interval.casek", {"column": "x", "m": 3, "transform": "square", "exact_range": [10, 20],
                            "anchors": {"family": "uniform", "low": 0, "high": 10000}},
         {"interval_leakage": 0.9}),
        ("interval.progressive_categorical", {"column": "c", "rounds": 16},
         {"interval_leakage": 0.99}),
    ],
    "subset": [
        ("subset.custom", {"column": "g", "design": {
            "type": "mu", "subsets": PAIRS6,
            "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]}}, DRAW),
        ("subset.dummy", {"column": "h", "alpha": 0.3}, DRAW),
        ("subset.product", {"columns": ["g", "h"]}, DRAW),
        ("subset.uniform", {"column": "c"}, DRAW),
    ],
    "noiseless": [
        ("noiseless.local", {"column": "x"}, BITS),
        ("noiseless.vector", {"queries": [{"statistic": "mean", "column": "x", "bits": 1},
                                          {"statistic": "max", "column": "k", "bits": 2}]},
         BITS),
    ],
    "iclp": [
        ("iclp.mean", {"column": "f"}, EPS),
        ("iclp.kde", {"column": "x"}, EPS),
        ("iclp.kde2d", {"columns": ["x", "y"]}, EPS),
        ("iclp.cov", {"column": "f"}, EPS),
        ("iclp.erm", {"covariate": "x", "response": "k"}, EPS),
        ("iclp.fos", {"response": "f", "covariates": ["x", "k"]}, EPS),
        ("iclp.ar", {"column": "f"}, EPS),
        ("bernstein.mean", {"column": "f"}, EPS),
        ("bernstein.kde", {"column": "x"}, EPS),
        ("frl.mean", {"column": "f"}, EPS),
        ("frl.kde", {"column": "x"}, EPS),
        ("gp.adp", {"column": "f"}, APPROX),
    ],
    "competitors": [
        ("lrm", {"columns": ["x", "k"]}, EPS),
        ("opm.l2ball", {"column": "x"}, EPS),
        ("opm.mean", {"columns": ["x", "k"]}, EPS),
        ("exm", {"column": "c", "draws": 3}, EPS),
    ],
}


def meta(n: int) -> DatasetMeta:
    """The probe dataset's public metadata (records kept in order: no row key needed)."""
    return DatasetMeta(n, COLUMNS, keep_row_order=True, allow_holdout=True)


def data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Rows inside the declared domains (fixed seed)."""
    rng = np.random.default_rng(seed)
    curves = 0.3 * rng.standard_normal((n, GRID)) / np.sqrt(GRID)
    return {"x": rng.uniform(0.0, 100.0, n), "y": rng.uniform(-1.0, 1.0, n),
            "k": rng.integers(0, 101, n), "g": rng.integers(0, 4, n), "h": rng.integers(0, 4, n),
            "c": rng.integers(0, 10, n), "f": curves}


def budget(raw: dict[str, Any]) -> dict[str, Fraction]:
    return {m: Fraction(v) for m, v in raw.items()}


_SCRIPT = """
import json, sys, tracemalloc
from pathlib import Path
import pyarrow as pa
from mechanisms import registry
from service.releases import run
from service.storage.dataset_files import DatasetStore
from service.storage.objects import LocalStore
from tests.memory_probe import WARM_ROWS, budget, meta
root, n, cases = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
store = DatasetStore(LocalStore(root), staging_dir=root / ".staging")
def job(version, rows, name, raw, spend):
    mech = registry.get(name)
    params = mech.load_params(raw)
    cost = mech.cost(params, budget(spend), meta(rows))
    return run._Job("probe", version, mech, params, cost, meta(rows), seed=11)
out = []
pools = []  # every pool outlives its buffers (a kept version's arrays outlive the run)
tracemalloc.start()
for name, raw, spend in cases:
    run._run(store, job(1, WARM_ROWS, name, raw, spend))
    big = job(2, n, name, raw, spend)
    pool = pa.proxy_memory_pool(pa.system_memory_pool())
    pools.append(pool)
    pa.set_memory_pool(pool)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    run._run(store, big)
    out.append(tracemalloc.get_traced_memory()[1] - held + pool.max_memory())
print(json.dumps(out))
"""


def stored(root: Path, n: int, seed: int = 30) -> None:
    """Write the probe dataset: version 1 of ``WARM_ROWS`` rows, version 2 of ``n``."""
    from service.storage.dataset_files import DatasetStore
    from service.storage.objects import LocalStore

    store = DatasetStore(LocalStore(root), staging_dir=root / ".staging")
    store.write("probe", 1, {"kind": "probe"}, data(WARM_ROWS, seed))
    store.write("probe", 2, {"kind": "probe"}, data(n, seed + 1))


def peaks(root: Path, n: int, cases: Sequence[Case]) -> list[int]:
    """Each case's peak bytes on the stored version 2 (``stored(root, n)``), measured in a
    fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(root), str(n),
                           json.dumps(list(cases))], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-4000:])
    return [int(v) for v in json.loads(proc.stdout.strip().splitlines()[-1])]


if __name__ == "__main__":  # calibration: bytes per row of each case at N rows
    import tempfile

    rows = int(sys.argv[1])
    wanted = sys.argv[2:] or list(FAMILIES)
    with tempfile.TemporaryDirectory() as tmp:
        stored(Path(tmp), rows)
        for family in wanted:
            for case, peak in zip(FAMILIES[family], peaks(Path(tmp), rows, FAMILIES[family]),
                                  strict=True):
                print(f"{family:12s} {case[0]:34s} {peak:12d} B  {peak / rows:8.1f} B/row",
                      flush=True)
