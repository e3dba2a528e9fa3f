"""Record-level releases on Spark (``service.engines.spark_records``) against a local Spark
Connect server: the same job secret gives the embedded release's records, in the
dataset's v2 secret order (``rows.permute``), stored as parts that read back as one table.

Small on purpose (two row groups, a few buckets), on the session's local server."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from mechanisms import ColumnMeta, DatasetMeta, get, record_maps, rows
from mechanisms.base import RecordMechanism
from mechanisms.rng import job_secret, secure_generator
from service import datasets, wiring
from service.engines import spark_records
from service.releases import run
from service.storage.dataset_files import DatasetStore
from service.storage.ledger import Run
from service.storage.objects import LocalStore
from service.storage.release_tables import INLINE_ROWS, OutputStore
from tests.integration.conftest import PEOPLE_META, SPARK_REMOTE, Api, people_csv

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession

pytestmark = pytest.mark.spark

REMOTE = SPARK_REMOTE
#: two row groups of the store (65,536 rows) and a part
N = (1 << 16) + 4321
META = DatasetMeta(N, {"x": ColumnMeta("x", "continuous", (0.0, 10.0)),
                       "k": ColumnMeta("k", "integer", (0, 20)),
                       "c": ColumnMeta("c", "categorical", categories=("a", "b", "c")),
                       "g": ColumnMeta("g", "categorical", categories=tuple("uvwxyz"))})
KEY = rows.RowKey(bytes(range(32)), rows.V2)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[DatasetStore, OutputStore]:
    root: Path = tmp_path_factory.mktemp("objects")
    objects = LocalStore(root)
    store = DatasetStore(objects, staging_dir=root / ".staging")
    rng = np.random.default_rng(11)
    store.write("ds_rec", 1, {"kind": "test"}, {
        "x": rng.gamma(2.0, 1.5, N), "k": rng.integers(0, 21, N), "c": rng.integers(0, 3, N),
        "g": rng.integers(0, 6, N)})
    return store, OutputStore(objects, root / ".staging")


def _embedded(store: DatasetStore, mech: RecordMechanism, params: Any, cost: Any,
              key: rows.RowKey | None) -> tuple[Any, dict[str, np.ndarray]]:
    """The embedded release (the worker's path) in its released order."""
    def read(columns: Any) -> Any:
        return store.batches("ds_rec", 1, columns)

    job = record_maps.fit(mech, read, params, cost, META, secure_generator(8), job_secret(8))
    out = record_maps.release(job, read(job.columns))
    assert out.table is not None
    table = dict(out.table) if key is None else rows.permute(out.table, key, N, out.row_column)
    return out, table


@pytest.mark.parametrize(("name", "raw", "budget", "key", "bucket_rows"), [
    ("dip", {"columns": ["x", "c"]}, {"epsilon": Fraction(2)}, KEY, 8192),
    # the copula's second exact pass (its correlation sums) on Spark too
    ("dip", {"columns": ["x", "k", "c"], "reference": {"kind": "dp", "model": "copula"}},
     {"epsilon": Fraction(2)}, None, 1 << 20),
    ("lrm", {"columns": ["x", "k"]}, {"epsilon": Fraction(1)}, KEY, 1 << 20),
    ("lrm", {"columns": ["k"]}, {"epsilon": Fraction(1)}, None, 30_000),
    # a stream per variable spawned from each partition's generator, in the Spark workers
    ("subset.uniform", {"column": "g", "format": "both"}, {"subset_draws:g": Fraction(1)},
     KEY, 30_000),
    # int8 columns (the paper's compact form), NaN cells, an exact summary of coverage
    ("interval.case2", {"column": "x", "anchors": {"family": "uniform", "low": 0, "high": 10}},
     {"interval_leakage:x": Fraction(6, 10)}, KEY, 1 << 20),
    # a data-width design: the pieces padded to the design's four, all-NaN ones included
    ("interval.casek", {"column": "x", "m": 3, "transform": "square", "exact_range": [1, 2],
                        "anchors": {"family": "uniform", "low": 0, "high": 100}},
     {"interval_leakage:x": Fraction(6, 10)}, None, 1 << 20),
    ("interval.progressive_categorical", {"column": "g", "rounds": 2},
     {"interval_leakage:g": Fraction(1)}, KEY, 1 << 20),
], ids=["dip-16-buckets", "dip-copula", "lrm-1-bucket", "lrm-row-order", "subset-4-buckets",
        "interval-1-bucket", "interval-data-width", "interval-categorical"])
def test_spark_release_is_the_embedded_one_in_the_same_order(
        spark: SparkSession, stored: tuple[DatasetStore, OutputStore], name: str,
        raw: dict[str, Any], budget: dict[str, Any], key: rows.RowKey | None,
        bucket_rows: int) -> None:
    store, outputs = stored
    mech = get(name)
    assert isinstance(mech, RecordMechanism)
    params = mech.load_params(raw)
    cost = mech.cost(params, budget, META)
    embedded, table = _embedded(store, mech, params, cost, key)
    source = store.parquet_source("ds_rec", 1)
    assert source is not None
    job = record_maps.fit(mech, lambda columns: store.batches("ds_rec", 1, columns), params,
                          cost, META, secure_generator(8), job_secret(8))
    order = spark_records.plan_order(key, N, mech.record_row_column, bucket_rows)
    release = name.replace(".", "_")
    attempt = len(outputs.store.versions(release)) + 1
    output, parts = spark_records.release_on_spark(
        spark, job, [source.path], source.columns, source.filesystem, order,
        outputs.parts_place(release, attempt), task_rows=1 << 16)
    assert len(parts) == 1 << order.bits
    assert repr(output.result) == repr(embedded.result)
    assert output.guarantee == embedded.guarantee and output.row_column == embedded.row_column
    assert outputs.commit_parts(release, attempt, parts) == N
    loaded = outputs.load(release, attempt)
    assert loaded is not None and list(loaded) == list(table)
    for column, values in table.items():
        assert loaded[column].dtype == np.asarray(values).dtype, column
        assert np.array_equal(loaded[column], values,
                              equal_nan=loaded[column].dtype.kind == "f"), column
    with pytest.raises(FileExistsError):
        outputs.commit_parts(release, attempt, parts)
    outputs.discard(release, attempt)
    assert outputs.load(release, attempt) is None


def test_v2_order_on_spark_is_the_embedded_order(
        spark: SparkSession, stored: tuple[DatasetStore, OutputStore]) -> None:
    """noiseless.local has no row column and no noise: the stored values are the
    quantized rows in exactly ``rows.order``'s order."""
    store, outputs = stored
    mech = get("noiseless.local")
    assert isinstance(mech, RecordMechanism)
    params = mech.load_params({"column": "x"})
    cost = mech.cost(params, {"noiseless_bits": Fraction(4)}, META)
    _, table = _embedded(store, mech, params, cost, KEY)
    source = store.parquet_source("ds_rec", 1)
    assert source is not None
    job = record_maps.fit(mech, lambda columns: store.batches("ds_rec", 1, columns), params,
                          cost, META, secure_generator(1), job_secret(1))
    _, parts = spark_records.release_on_spark(
        spark, job, [source.path], source.columns, source.filesystem,
        spark_records.plan_order(KEY, N, None, 4096), outputs.parts_place("nl", 1))
    outputs.commit_parts("nl", 1, parts)
    loaded = outputs.load("nl", 1)
    assert loaded is not None
    x = np.concatenate([b["x"] for b in store.batches("ds_rec", 1, ["x"])])
    quantized = job.privatize(0, 0, {"x": x})["x"]
    assert np.array_equal(loaded["x"], quantized[rows.order(KEY, N)])
    assert np.array_equal(loaded["x"], table["x"])


@pytest.mark.parametrize("n", [80, 700], ids=["inline-records", "stored-only"])
def test_the_worker_releases_on_spark_what_it_releases_embedded(
        spark: SparkSession, api: Api, n: int) -> None:
    """The worker's own step (``run._compute``) on an uploaded dataset (a v2 key), once
    with the Spark remote set and once without: the same result and records, the
    engine named; the table read back is the embedded one."""
    resp = api.upload(people_csv(n), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    dataset_id = resp.get_json()["id"]
    embedded_svc = wiring.of(api.client.application)
    spark_svc = dataclasses.replace(embedded_svc, config=dataclasses.replace(
        embedded_svc.config, spark_remote=REMOTE))
    doc = datasets.get(embedded_svc.ledger, dataset_id)
    assert doc is not None
    assert datasets.row_key(embedded_svc.datasets, dataset_id, 1).version == rows.V2
    meta = datasets.meta(doc)
    mech = get("lrm")
    params = mech.load_params({"columns": ["age", "income"]})
    cost = mech.cost(params, {"epsilon": Fraction(1)}, meta)
    job = run._Job(dataset_id, 1, mech, params, cost, meta, seed=13)
    payloads, tables = {}, {}
    for kind, svc in (("spark", spark_svc), ("embedded", embedded_svc)):
        release_id = f"rel_{kind}_{n}"
        payload, attempt = run._compute(svc, job, Run(release_id, "token", 1),
                                        run._record_source(svc, job))
        assert attempt == 1
        payloads[kind] = json.loads(payload)
        tables[kind] = svc.outputs.load(release_id, 1)
    assert payloads["spark"].pop("engine") == f"spark {REMOTE}"
    assert payloads["embedded"].pop("engine") == "embedded"
    assert payloads["spark"] == payloads["embedded"]
    assert ("records" in payloads["spark"]["result"]) == (n <= INLINE_ROWS)
    spark_table, embedded_table = tables["spark"], tables["embedded"]
    assert spark_table is not None and embedded_table is not None
    assert list(spark_table) == list(embedded_table)
    for column, values in embedded_table.items():
        assert np.array_equal(spark_table[column], values), column


def test_a_v1_version_keeps_its_order_and_runs_embedded(api: Api) -> None:
    """A version whose key file is a bare v1 key (stored before v2): its rows cannot be
    ordered in partitions, so even with Spark set the release runs embedded, in exactly
    its old order (no Spark job is started)."""
    svc = wiring.of(api.client.application)
    spark_svc = dataclasses.replace(svc, config=dataclasses.replace(svc.config,
                                                                    spark_remote=REMOTE))
    n = 500
    meta = DatasetMeta(n, {"x": ColumnMeta("x", "continuous", (0.0, 10.0))})
    x = np.random.default_rng(2).uniform(0, 10, n)
    with svc.datasets.staging() as staged:
        staged.append({"x": x})
        staged.write_private(datasets.ROW_KEY, bytes(range(32)))
        staged.commit("ds_v1_order", 1, {"kind": "test"})
    mech = get("noiseless.local")
    params = mech.load_params({"column": "x"})
    cost = mech.cost(params, {"noiseless_bits": Fraction(3)}, meta)
    job = run._Job("ds_v1_order", 1, mech, params, cost, meta, seed=1)
    assert run._record_source(spark_svc, job) is None
    payload, attempt = run._compute(spark_svc, job, Run("rel_v1_order", "token", 1),
                                    run._record_source(spark_svc, job))
    assert json.loads(payload)["engine"] == "embedded" and attempt == 1
    table = spark_svc.outputs.load("rel_v1_order", 1)
    assert table is not None
    quantized = mech.run({"x": x}, params, cost, meta, secure_generator(1)).table
    assert quantized is not None
    assert np.array_equal(table["x"], quantized["x"][rows.order(bytes(range(32)), n)])
