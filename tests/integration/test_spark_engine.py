"""The Spark engine (``service.engines.spark``) against a real local Spark Connect server.

For each ported statistic family (a cross-tab, bounded sums and means with exact float
sums, quantiles, moments of two passes, noiseless.aggregate's selection of six passes)
the partial Spark computes over Parquet files (several files and row groups, an empty
file, adversarial doubles) must equal ``statistics.compute`` over the same rows in one
batch, exactly, and the release from it ``run``'s on the whole columns with the same
seeded generator. Tasks of one row group, or a few (``task_rows``), so partials of
several Spark tasks are merged. Then: the files on S3 (moto's server) read through pyarrow's
S3FileSystem, a column missing, a statistic's refusal, and random splits (hypothesis).

One local server for the session (``local[2]``, the ``spark`` fixture: a few seconds to
start); every pass is one small Spark job, so the module stays well under two minutes.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, StreamingMechanism
from mechanisms.statistics import compute
from service.engines.spark import SparkEngineError, compute_on_spark
from service.engines.spark_session import reach, spark_session
from tests.integration.conftest import SPARK_REMOTE

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession

    from tests.conftest import S3Server

pytestmark = pytest.mark.spark

REMOTE = SPARK_REMOTE
COLUMNS = {
    "age": ColumnMeta("age", "integer", (17, 90)),
    "wage": ColumnMeta("wage", "continuous", (-1000.0, 200_000.0)),
    "tiny": ColumnMeta("tiny", "continuous", (-1e-5, 3e-5)),
    #: near the widest bounds a sum may declare (2**62): huge and tiny doubles stay unclipped
    "wide": ColumnMeta("wide", "continuous", (-4e18, 4e18)),
    "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
    "sex": ColumnMeta("sex", "categorical", categories=("F", "M")),
}
#: statistic column -> positional Parquet column, as datasets are stored
PARQUET = {name: f"c{i}" for i, name in enumerate(COLUMNS)}
BUDGETS = {"laplace": {"epsilon": Fraction(1, 2)},
           "gaussian": {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)},
           "noiseless.aggregate": {"noiseless_bits": Fraction(7)}}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("laplace", {"statistic": "count", "group_by": ["race", "sex"]}),
    ("laplace", {"statistic": "sum", "column": "wide"}),
    ("gaussian", {"statistic": "mean", "column": "wide", "group_by": ["race", "sex"]}),
    ("laplace", {"statistic": "mean", "column": "tiny"}),
    ("laplace", {"statistic": "quantile", "column": "wage", "quantiles": [0.1, 0.5, 0.9],
                 "grid_size": 50}),
    ("laplace", {"statistic": "variance", "column": "wage"}),
    ("noiseless.aggregate", {"statistic": "median", "column": "wide"}),
    ("noiseless.aggregate", {"statistic": "sum", "column": "tiny"}),
]
IDS = [f"{name}-{p['statistic']}-{p.get('column', '')}{'-table' if 'group_by' in p else ''}"
       for name, p in CASES]
ROWS = 3000
#: where the rows are cut into files (one of them empty) and rows per row group
CUTS, ROW_GROUP = (1100, 1100, 2500), 400


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Rows as stored (int64 codes and integers, float64 reals), with NaN, values past the
    bounds, undeclared codes, and doubles hard to sum: subnormals, ±0, ties and huge
    values next to tiny ones."""
    rng = np.random.default_rng(seed)
    wage = rng.uniform(-5000.0, 260_000.0, n)
    wage[rng.random(n) < 0.1] = np.nan
    tiny = rng.normal(0.0, 2e-5, n)
    tiny[::3] = rng.choice([5e-324, -0.0, 1e-300, -1e-5, 3e-5, 2.0**-1022], tiny[::3].size)
    wide = rng.normal(size=n) * 10.0 ** rng.integers(-320, 18, n)
    wide[::5] = rng.choice([5e-324, -5e-324, 3e18, -3e18, 2.0**53 + 2, 3 * 2.0**-54, -0.0],
                           wide[::5].size)
    return {"age": rng.integers(0, 120, n), "wage": wage, "tiny": tiny, "wide": wide,
            "race": rng.integers(-1, 4, n), "sex": rng.integers(0, 3, n)}


def _write(data: Mapping[str, np.ndarray], folder: Path, cuts: tuple[int, ...],
           row_group: int, filesystem: pafs.FileSystem | None = None) -> list[str]:
    """The rows as Parquet files cut at ``cuts`` (positional names), ``row_group`` rows
    per row group; the paths in ``filesystem`` (local by default)."""
    edges = [0, *cuts, len(next(iter(data.values())))]
    paths = []
    for i, (a, b) in enumerate(itertools.pairwise(edges)):
        table = pa.table({PARQUET[name]: pa.array(values[a:b]) for name, values in data.items()})
        path = f"{folder}/part-{i}.parquet"
        pq.write_table(table, path, row_group_size=row_group, filesystem=filesystem)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], list[str]]:
    data = _data(ROWS, 20261129)
    return data, _write(data, tmp_path_factory.mktemp("parquet"), CUTS, ROW_GROUP)


def _setup(name: str, raw: dict[str, Any], n: int
           ) -> tuple[StreamingMechanism, dict[str, Any], dict[str, Fraction], DatasetMeta]:
    mech = registry.get(name)
    assert isinstance(mech, StreamingMechanism)
    meta = DatasetMeta(n, COLUMNS)
    params = mech.load_params(raw)
    return mech, params, mech.cost(params, BUDGETS[name], meta), meta


def test_the_session_is_started_once_per_process(spark: SparkSession) -> None:
    assert spark_session(REMOTE) is spark and not spark.is_stopped
    assert spark.range(0, 3, 1, 3).count() == 3


def test_a_server_that_answers_is_reached_within_the_timeout(spark: SparkSession) -> None:
    """``reach`` (what a run calls before it reads the data) keeps the running server's
    session and answers at once; its retries are the bounded ones."""
    start = time.monotonic()
    assert reach(REMOTE, 5.0) is spark and not spark.is_stopped
    assert time.monotonic() - start < 5.0
    policies = spark.client.get_retry_policies()
    assert [(p.max_retries, p.max_backoff) for p in policies] == [(7, 7500)]  # 30 s


def test_the_files_have_several_row_groups_and_an_empty_file(
        stored: tuple[dict[str, np.ndarray], list[str]]) -> None:
    _, paths = stored
    groups = [pq.ParquetFile(p).metadata.num_row_groups for p in paths]
    rows = [pq.ParquetFile(p).metadata.num_rows for p in paths]
    assert rows == [1100, 0, 1400, 500] and groups[0] == 3 and groups[2] == 4


@pytest.mark.parametrize(("name", "raw"), CASES, ids=IDS)
def test_spark_computes_the_embedded_partial_and_release(
        spark: SparkSession, stored: tuple[dict[str, np.ndarray], list[str]], name: str,
        raw: dict[str, Any]) -> None:
    data, paths = stored
    mech, params, cost, meta = _setup(name, raw, ROWS)
    statistic = mech.statistic(params, cost, meta)
    last, partial = compute_on_spark(spark, statistic, paths, PARQUET, task_rows=ROW_GROUP)
    embedded_last, embedded = compute(statistic, [data])
    assert partial == embedded  # every count cell by cell, every exact sum bit for bit
    assert last == embedded_last
    seed = 7
    released = mech.release(params, partial, cost, meta, np.random.default_rng(seed), last)
    assert repr(released) == repr(mech.run(data, params, cost, meta,
                                           np.random.default_rng(seed)))


def test_a_cross_tab_counts_each_cell_as_numpy_does(
        spark: SparkSession, stored: tuple[dict[str, np.ndarray], list[str]]) -> None:
    """An oracle outside the mechanisms: the cells are the declared (race, sex) pairs."""
    data, paths = stored
    mech, params, cost, meta = _setup("laplace", {"statistic": "count",
                                                  "group_by": ["race", "sex"]}, ROWS)
    _, partial = compute_on_spark(spark, mech.statistic(params, cost, meta), paths, PARQUET,
                                  task_rows=2 * ROW_GROUP)
    race, sex = data["race"], data["sex"]
    assert list(partial.parts["count"]) == [int(np.sum((race == r) & (sex == s)))
                                            for r in range(3) for s in range(2)]


def test_files_on_s3_are_read_through_pyarrow(spark: SparkSession, s3_server: S3Server) -> None:
    """moto's S3 over HTTP: the workers get the S3FileSystem (endpoint, credentials) in
    the pickled function, so Spark needs no Hadoop S3 jars; rooted at a prefix
    (SubTreeFileSystem, as an object store hands it out), the paths are object keys."""
    s3 = pafs.S3FileSystem(endpoint_override=s3_server.endpoint_url.split("://")[1],
                           scheme="http", access_key=s3_server.access_key,
                           secret_key=s3_server.secret_key, region="us-east-1")
    store = pafs.SubTreeFileSystem(f"{s3_server.bucket}/spark-{uuid.uuid4().hex}", s3)
    data = _data(900, 5)
    keys = _write(data, Path("datasets/d1/v1"), (300,), 200, store)
    mech, params, cost, meta = _setup("laplace", {"statistic": "variance", "column": "wage"},
                                      900)
    statistic = mech.statistic(params, cost, meta)
    assert compute_on_spark(spark, statistic, keys, PARQUET, store, task_rows=200) == \
        compute(statistic, [data])


def test_a_missing_column_is_refused_by_name_before_any_job(
        spark: SparkSession, stored: tuple[dict[str, np.ndarray], list[str]]) -> None:
    _, paths = stored
    mech, params, cost, meta = _setup("laplace", {"statistic": "sum", "column": "wage"}, ROWS)
    statistic = mech.statistic(params, cost, meta)
    with pytest.raises(ValueError, match=r"column 'c99' is not in the Parquet file .*part-0"):
        compute_on_spark(spark, statistic, paths, {**PARQUET, "wage": "c99"})
    with pytest.raises(ValueError, match="no Parquet column is given for column 'wage'"):
        compute_on_spark(spark, statistic, paths, {"age": "c0"})


def test_no_rows_give_the_empty_partial(spark: SparkSession, tmp_path: Path) -> None:
    paths = _write(_data(0, 1), tmp_path, (), 10)
    mech, params, cost, meta = _setup("laplace", {"statistic": "count",
                                                  "group_by": ["race"]}, 1)
    statistic = mech.statistic(params, cost, meta)
    assert compute_on_spark(spark, statistic, paths, PARQUET) == (statistic, statistic.empty())


def test_the_statistics_refusal_comes_back_as_it_is_raised_embedded(
        spark: SparkSession, tmp_path: Path) -> None:
    """An integer column holding floats: the same TypeError, the same words (no values)."""
    data = _data(50, 2)
    data["age"] = np.full(50, 31337.5)
    paths = _write(data, tmp_path, (20,), 10)
    mech, params, cost, meta = _setup("laplace", {"statistic": "sum", "column": "age"}, 50)
    statistic = mech.statistic(params, cost, meta)
    with pytest.raises(TypeError) as embedded:
        compute(statistic, [data])
    with pytest.raises(TypeError) as on_spark:
        compute_on_spark(spark, statistic, paths, PARQUET, task_rows=10)
    assert str(on_spark.value) == str(embedded.value) and "31337" not in str(on_spark.value)


def test_a_file_that_is_not_a_stored_dataset_fails_the_job(
        spark: SparkSession, tmp_path: Path) -> None:
    """Stored columns have no nulls: a file with one is foreign, and the job says so."""
    path = str(tmp_path / "nulls.parquet")
    pq.write_table(pa.table({"c1": pa.array([1.5, None, 2.5])}), path)
    mech, params, cost, meta = _setup("laplace", {"statistic": "sum", "column": "wage"}, 3)
    with pytest.raises(SparkEngineError, match="over 1 row groups failed") as failed:
        compute_on_spark(spark, mech.statistic(params, cost, meta), [path], PARQUET)
    assert "has null cells" in str(failed.value.__cause__)


def test_the_iclp_mean_of_a_list_column_is_the_embedded_partial_and_release(
        spark: SparkSession, tmp_path: Path) -> None:
    """A functional column as a Parquet fixed-size list (Arrow hands its rows to the
    statistic as (rows, grid points)): the clipped curves' exact column sums Spark merges
    from its tasks are the embedded ones, bit for bit, and so is the released mean. (The
    engine plans from the footers' top-level names: the list's item has its own name.)"""
    rng = np.random.default_rng(30)
    n, grid = 700, 6
    curves = np.sin(np.linspace(0.0, 3.0, grid))[None, :] + rng.normal(size=(n, grid))
    curves[::9] *= 40.0  # clipped
    curves[::7] *= 1e-250  # tiny next to the others: exact sums only
    curves[3, 2] = np.nan
    paths = []
    for i, (a, b) in enumerate(((0, 250), (250, 250), (250, n))):
        cells = pa.FixedSizeListArray.from_arrays(
            pa.array(curves[a:b].ravel()), type=pa.list_(pa.float64(), grid))
        path = str(tmp_path / f"curves-{i}.parquet")
        pq.write_table(pa.table({"c0": cells}), path, row_group_size=100)
        paths.append(path)
    meta = DatasetMeta(n, {"f": ColumnMeta("f", "functional", grid=tuple(
        np.linspace(0.0, 1.0, grid).tolist()), norm_bound=2.0)})
    mech = registry.get("iclp.mean")
    assert isinstance(mech, StreamingMechanism)
    params = mech.load_params({"column": "f"})
    cost = mech.cost(params, {"epsilon": Fraction(2)}, meta)
    statistic = mech.statistic(params, cost, meta)
    last, partial = compute_on_spark(spark, statistic, paths, {"f": "c0"}, task_rows=200)
    assert partial == compute(statistic, [{"f": curves}])[1]
    released = mech.release(params, partial, cost, meta, np.random.default_rng(3), last)
    assert repr(released) == repr(mech.run({"f": curves}, params, cost, meta,
                                           np.random.default_rng(3)))


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 400), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_any_split_into_files_and_row_groups_gives_the_same_partial(
        spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, n: int, seed: int,
        data: st.DataObject) -> None:
    columns = _data(n, seed)
    cuts = tuple(sorted(data.draw(st.lists(st.integers(0, n), max_size=3), label="cuts")))
    row_group = data.draw(st.integers(1, 150), label="row group")
    task_rows = data.draw(st.integers(1, 400), label="task rows")
    paths = _write(columns, tmp_path_factory.mktemp("split"), cuts, row_group)
    mech, params, cost, meta = _setup("gaussian", {"statistic": "sum", "column": "wide",
                                                   "group_by": ["race", "sex"]}, n)
    statistic = mech.statistic(params, cost, meta)
    assert compute_on_spark(spark, statistic, paths, PARQUET, task_rows=task_rows) == \
        compute(statistic, [columns])


# --------------------------------------------------------------------------- the worker's run

@pytest.mark.parametrize("backend", ["local", "s3"])
def test_the_worker_runs_a_stored_version_on_spark_as_embedded(
        spark: SparkSession, backend: str, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """A version stored by the service's DatasetStore (Parquet objects with a pinned
    manifest, several row groups), on a local or an S3 store: the worker's run on Spark
    releases exactly what it releases embedded, and names its engine; a version replaced
    while Spark read it is refused."""
    from service.releases import run
    from service.storage.dataset_files import ChangedObject, DatasetStore
    from service.storage.objects import Credentials, LocalStore, ObjectStore, S3Store

    objects: ObjectStore
    if backend == "local":
        objects = LocalStore(tmp_path / "objects")
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        objects = S3Store(s3.bucket, "spark-" + uuid.uuid4().hex, s3.endpoint_url,
                          Credentials(s3.access_key, s3.secret_key), "us-east-1")
    store = DatasetStore(objects, staging_dir=tmp_path / "staging")
    data = _data(ROWS, 11)
    with store.staging() as staged:  # three row groups' worth of appends
        for a in range(0, ROWS, 1000):
            staged.append({name: values[a:a + 1000] for name, values in data.items()})
        staged.commit("ds_spark", 1, {"kind": "test"})
    assert store.parquet_source("ds_spark", 1) is not None
    for name, raw in CASES[:3]:
        mech, params, cost, meta = _setup(name, raw, ROWS)
        job = run._Job("ds_spark", 1, mech, params, cost, meta, seed=5)
        (on_spark, engine), (embedded, here) = run._run(store, job, REMOTE), run._run(store, job)
        assert (engine, here) == (f"spark {REMOTE}", "embedded")
        assert repr(on_spark) == repr(embedded)
    source = store.parquet_source("ds_spark", 1)
    assert source is not None
    key = source.path
    body = objects.get(key)
    objects.delete(key)
    objects.put_new(key, body[:-1] + bytes([body[-1] ^ 1]))  # another object, same size
    with pytest.raises(ChangedObject):
        store.check_source(source)


def test_the_worker_runs_a_stored_functional_version_on_spark(
        spark: SparkSession, tmp_path: Path) -> None:
    """The worker hands Spark a stored version with a functional column (a fixed-size
    list of its grid points, read back as (rows, width)); the release is the embedded
    run's, bit for bit, and names the engine. (Before, such a version ran embedded.)"""
    from mechanisms.rng import secure_generator
    from service.releases import run
    from service.storage.dataset_files import DatasetStore
    from service.storage.objects import LocalStore
    from tests.unit.iclp.streaming_cases import data, meta

    rows = 2 * 700 + 11
    store = DatasetStore(LocalStore(tmp_path), staging_dir=tmp_path / ".staging")
    columns = data(rows, 32)
    store.write("ds_curves", 1, {"kind": "test"}, columns)
    assert store.parquet_source("ds_curves", 1) is not None
    mech = registry.get("iclp.mean")
    assert isinstance(mech, StreamingMechanism)
    params = mech.load_params({"column": "f"})
    cost = mech.cost(params, {"epsilon": Fraction(1)}, meta(rows))
    job = run._Job("ds_curves", 1, mech, params, cost, meta(rows), seed=4)
    output, engine = run._run(store, job, SPARK_REMOTE)
    assert engine.startswith("spark")
    whole = mech.run(columns, params, cost, meta(rows), secure_generator(4))
    assert repr(output) == repr(whole)
