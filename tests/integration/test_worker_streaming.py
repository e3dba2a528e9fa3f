"""The worker's read of a stored version (issue #30 item 3): a streaming mechanism's run
reads the version's row groups, each pass only the columns it needs, and releases what
``run`` on the whole columns releases with the same generator; its memory is one batch,
not the rows. The store is real (Parquet objects in a local object store)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mechanisms import registry
from mechanisms.base import StreamingMechanism
from mechanisms.rng import secure_generator
from service.releases import run
from service.storage.dataset_files import DatasetStore
from service.storage.objects import LocalStore
from tests.conftest import ROOT
from tests.unit.dp.test_streaming import BUDGETS, CASES, IDS, _data, _meta

#: rows of the stored version: three row groups and a part
ROWS = 3 * (1 << 16) + 1234


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[DatasetStore, dict[str, np.ndarray]]:
    root: Path = tmp_path_factory.mktemp("objects")
    store = DatasetStore(LocalStore(root), staging_dir=root / ".staging")
    columns = _data(ROWS, seed=30)
    store.write("ds_stream", 1, {"kind": "test"}, columns)
    return store, columns


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_streamed_run_releases_what_the_whole_columns_release(
        stored: tuple[DatasetStore, dict[str, np.ndarray]],
        case: tuple[str, dict[str, object]]) -> None:
    store, columns = stored
    name, raw = case
    mech = registry.get(name)
    assert isinstance(mech, StreamingMechanism)
    meta = _meta(ROWS)
    params = mech.load_params(raw)
    cost = mech.cost(params, BUDGETS[name], meta)
    job = run._Job("ds_stream", 1, mech, params, cost, meta, seed=7)
    streamed, engine = run._run(store, job)
    whole = mech.run(columns, params, cost, meta, secure_generator(7))
    assert repr(streamed) == repr(whole) and engine == "embedded"


#: run in a fresh interpreter, so Arrow's pool peak (``max_memory``: what tracemalloc does
#: not see) is the run's alone
PEAK_SCRIPT = """
import sys, tracemalloc
from pathlib import Path
import pyarrow as pa
from mechanisms import registry
from service.releases import run
from service.storage.dataset_files import DatasetStore
from service.storage.objects import LocalStore
from tests.unit.dp.test_streaming import BUDGETS, _meta
root, n = Path(sys.argv[1]), int(sys.argv[2])
store = DatasetStore(LocalStore(root), staging_dir=root / ".staging")
mech = registry.get("laplace")
meta = _meta(n)
params = mech.load_params({"statistic": "mean", "column": "wage"})
cost = mech.cost(params, BUDGETS["laplace"], meta)
tracemalloc.start()
run._run(store, run._Job("ds_big", 1, mech, params, cost, meta, seed=3))
print(tracemalloc.get_traced_memory()[1] + pa.default_memory_pool().max_memory())
"""


def test_a_streamed_run_holds_one_batch_not_the_rows(tmp_path: Path) -> None:
    """A mean over 2,000,000 stored rows: the run's peak allocation (Python's and Arrow's)
    is bounded by a row group of the one column it reads, far below the 16 MB the column
    takes whole, let alone the 48 MB of the three columns."""
    n = 2_000_000
    store = DatasetStore(LocalStore(tmp_path), staging_dir=tmp_path / ".staging")
    rng = np.random.default_rng(5)
    store.write("ds_big", 1, {"kind": "test"},
                {"age": rng.integers(0, 120, n), "wage": rng.uniform(0, 1e5, n),
                 "tiny": rng.normal(0, 1, n)})
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path), str(n)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'client' / 'src'}"})
    peak = int(out.stdout.split()[-1])
    # a 65,536-row batch of doubles is 0.5 MB; the exact sums' scratch a few chunks
    assert peak < 8 * 2**20, peak


#: rows of the stored version with functional columns: a row group and a part
FUNCTION_ROWS = (1 << 16) + 2345


@pytest.fixture(scope="module")
def stored_functions(tmp_path_factory: pytest.TempPathFactory
                     ) -> tuple[DatasetStore, dict[str, np.ndarray]]:
    from tests.unit.iclp.streaming_cases import data

    root: Path = tmp_path_factory.mktemp("functions")
    store = DatasetStore(LocalStore(root), staging_dir=root / ".staging")
    columns = data(FUNCTION_ROWS, 31)
    store.write("ds_functions", 1, {"kind": "test"}, columns)
    return store, columns


def test_the_streamed_functionals_and_vector_release_what_the_whole_columns_release(
        stored_functions: tuple[DatasetStore, dict[str, np.ndarray]]) -> None:
    """The ICLP functionals and noiseless.vector on a stored version whose functional
    columns come back as (rows, grid points) batches, a row group at a time."""
    from tests.unit.iclp.streaming_cases import CASES, meta

    store, columns = stored_functions
    for name, raw, budget in CASES:
        mech = registry.get(name)
        assert isinstance(mech, StreamingMechanism)
        params = mech.load_params(raw)
        cost = mech.cost(params, budget, meta(FUNCTION_ROWS))
        job = run._Job("ds_functions", 1, mech, params, cost, meta(FUNCTION_ROWS), seed=9)
        streamed, engine = run._run(store, job)
        whole = mech.run(columns, params, cost, meta(FUNCTION_ROWS), secure_generator(9))
        assert repr(streamed) == repr(whole) and engine == "embedded", (name, raw)
