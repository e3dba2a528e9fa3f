"""Bad input catalogue: hostile inputs per endpoint against the real app, store and worker.

Every case must be answered with a 4xx problem document that names what is
wrong, within a bounded time and memory, and must spend nothing and write
nothing: no budget moves, no new entry of a dataset, release, reservation,
replay or idempotency record in the session's store (rows on PostgreSQL, keys on
Valkey), no new analysis key, and no new file under the data dir.
The formula-injection cases run real releases and check that the CSV the
service hands out cannot be evaluated by a spreadsheet.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from werkzeug.datastructures import FileStorage
from werkzeug.test import TestResponse, encode_multipart

from service import wiring
from service.config import Config
from tests.integration import record_state
from tests.integration.conftest import PEOPLE_META, Api, people_csv

PROBLEM = "application/problem+json"
#: per-case bounds; generous for a 2-core machine shared with other test runs
MAX_SECONDS = 5.0
MAX_MEMORY_MB = 200
#: cells a spreadsheet would evaluate as formulas (OWASP CSV injection)
FORMULAS = ["=cmd|' /C calc'!A0", "+1", "-1", "@SUM(1)", "\t=1", "\r=1",
            '=HYPERLINK("http://x","y")']


# --------------------------------------------------------------------------- fixtures


@dataclass
class World:
    """Datasets the release cases point at, registered once for the module."""

    api: Api
    people: str  # age integer, income continuous, group categorical (3)
    wide: str  # 64 categories, for subset privacy at its size limits
    curves: str  # a functional column on a 10-point grid
    small: Api  # an app of the same service whose JSON bodies are limited to 64 KiB

    def small_world(self) -> World:
        """The same datasets, through the app with the small JSON limit."""
        return dataclasses.replace(self, api=self.small)


def _small_json_app(service_env: dict[str, str]) -> Flask:
    saved = dict(os.environ)
    os.environ.update(service_env)
    try:
        from service.api.app import create_app

        return create_app(dataclasses.replace(Config.from_env(), max_json_bytes=65_536))
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def world(app: Flask, worker: Any, service_env: dict[str, str]) -> World:
    api = Api(app.test_client())
    people = api.upload(people_csv(), PEOPLE_META)
    assert people.status_code == 201, people.get_json()
    cats = [f"k{i}" for i in range(64)]
    wide_meta = {"name": "wide", "record_level": True, "budgets": {"subset_draws": 1},
                 "columns": {"k": {"type": "categorical", "categories": cats}}}
    wide = api.upload("k\n" + "".join(f"{cats[i % 64]}\n" for i in range(256)), wide_meta)
    assert wide.status_code == 201, wide.get_json()
    grid = [i / 9 for i in range(10)]
    curves_meta = {"name": "curves", "record_level": True, "budgets": {"epsilon": 4},
                   "columns": {"f": {"type": "functional", "grid": grid, "norm_bound": 2}}}
    header = ",".join(f"f.{i}" for i in range(10))
    rows = "".join(",".join(f"{(i * j) % 7 / 7:.3f}" for j in range(10)) + "\n"
                   for i in range(50))
    curves = api.upload(header + "\n" + rows, curves_meta)
    assert curves.status_code == 201, curves.get_json()
    return World(api, people.get_json()["id"], wide.get_json()["id"],
                 curves.get_json()["id"], Api(_small_json_app(service_env).test_client()))


def _files(data_dir: Path) -> set[str]:
    return {str(p.relative_to(data_dir)) for p in data_dir.rglob("*")}


def _keys(app: Flask) -> set[str]:
    """The entries a refused request must never create: the record's (datasets, ledgers,
    releases, reservations, replays, Idempotency-Keys: rows on PostgreSQL, keys on
    Valkey) and the analyses' Valkey keys."""
    svc = wiring.of(app)
    return record_state.record_entries(svc.ledger, svc.client)


def _budgets(api: Api, ids: list[str]) -> dict[str, Any]:
    return {ds: api.get(f"/v1/datasets/{ds}/budget").get_json() for ds in ids}


@dataclass
class Measured:
    response: TestResponse
    seconds: float
    rss_growth_mb: float


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE


def _measure(call: Callable[[], TestResponse]) -> Measured:
    """Run one request, recording wall time and the peak growth of resident memory.

    RSS is sampled every 2 ms from /proc (it counts numpy's buffers too, which a
    Python-level tracer would miss, and costs the request nothing).
    """
    baseline, peak = _rss(), [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        response = call()
        response.get_data()  # a streamed body is produced inside the measurement
    finally:
        seconds = time.perf_counter() - start
        done.set()
        sampler.join()
    growth = max(peak[0], _rss()) - baseline
    return Measured(response, seconds, max(growth, 0) / 2**20)


# --------------------------------------------------------------------------- requests


def _multipart(api: Api, fields: dict[str, Any], *, cut: float | None = None,
               content_type: str | None = None) -> TestResponse:
    """POST /v1/datasets with a hand-built multipart body, optionally cut short."""
    boundary, body = encode_multipart(fields)
    if cut is not None:
        body = body[: int(len(body) * cut)]
    return api.client.post(
        "/v1/datasets", data=body, headers=api._h(),
        content_type=content_type or f"multipart/form-data; boundary={boundary}")


def _file(data: bytes) -> FileStorage:
    return FileStorage(io.BytesIO(data), filename="data.csv", content_type="text/csv")


def _upload_bytes(api: Api, data: bytes, meta: dict[str, Any] | str) -> TestResponse:
    text = meta if isinstance(meta, str) else json.dumps(meta)
    return _multipart(api, {"metadata": text, "file": _file(data)})


def _raw(api: Api, path: str, body: bytes | str,
         content_type: str = "application/json") -> TestResponse:
    return api.client.post(path, data=body, headers=api._h(), content_type=content_type)


def _release(w: World, ds: str, mechanism: str, params: Any,
             budget: Any, path: str = "/v1/releases") -> TestResponse:
    return w.api.post(path, {"dataset_id": ds, "mechanism": mechanism, "params": params,
                             "budget": budget})


def _release_text(w: World, body: str, path: str = "/v1/releases") -> TestResponse:
    return _raw(w.api, path, body)


def _release_json(w: World, mechanism: str, params: str, budget: str) -> TestResponse:
    """A release request with raw JSON text for params and budget (NaN, 1e309, ...)."""
    return _release_text(w, '{"dataset_id": ' + json.dumps(w.people) + ', "mechanism": '
                         + json.dumps(mechanism) + ', "params": ' + params
                         + ', "budget": ' + budget + "}")


MEAN_AGE = '{"statistic": "mean", "column": "age"}'


def _meta(**changes: Any) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(json.dumps(PEOPLE_META))
    meta.update(changes)
    return meta


def _wide_csv(n_columns: int) -> bytes:
    header = ",".join(f"c{i}" for i in range(n_columns))
    return (header + "\n" + ",".join("1" for _ in range(n_columns)) + "\n").encode()


def _wide_meta(n_columns: int) -> dict[str, Any]:
    return {"name": "wide", "record_level": True, "budgets": {"epsilon": 1},
            "columns": {f"c{i}": {"type": "integer", "bounds": [0, 9]}
                        for i in range(n_columns)}}


GOOD = people_csv(20).encode()
DEEP = "[" * 100_000 + "]" * 100_000


@dataclass(frozen=True)
class Case:
    """One hostile request and what a clear refusal of it looks like."""

    id: str
    send: Callable[[World], TestResponse]
    status: int
    #: the problem's ``field`` must start with this (None: no field expected)
    field: str | None
    #: the problem's ``detail`` must contain this (case-insensitive)
    says: str
    secret: list[str] = field(default_factory=list)  # never echoed back


CASES = [
    # ---- uploads: the body itself
    Case("upload: body over the size limit",
         lambda w: _upload_bytes(w.api, b"age,income,group\n" + b"1,2,a\n" * 400_000,
                                 PEOPLE_META),
         413, None, "2097152-byte limit"),
    Case("upload: multipart cut in the middle of the file",
         lambda w: _multipart(w.api, {"metadata": json.dumps(PEOPLE_META),
                                      "file": _file(GOOD)}, cut=0.6),
         400, None, "multipart"),
    Case("upload: multipart cut inside the metadata",
         lambda w: _multipart(w.api, {"metadata": json.dumps(PEOPLE_META),
                                      "file": _file(GOOD)}, cut=0.1),
         400, None, "multipart"),
    Case("upload: JSON without a source (a registration by reference needs one)",
         lambda w: _raw(w.api, "/v1/datasets", json.dumps({"metadata": PEOPLE_META})),
         422, "source", "source: Missing data for required field."),
    Case("upload: text/csv body instead of multipart",
         lambda w: _raw(w.api, "/v1/datasets", GOOD, "text/csv"),
         415, None, "multipart/form-data"),
    Case("upload: multipart without a boundary",
         lambda w: _raw(w.api, "/v1/datasets", GOOD, "multipart/form-data"),
         400, None, "multipart"),
    Case("upload: no file part",
         lambda w: _multipart(w.api, {"metadata": json.dumps(PEOPLE_META)}),
         422, "file", "missing"),
    # ---- uploads: the CSV
    Case("csv: cut mid-record",
         lambda w: _upload_bytes(w.api, GOOD + b"33,12", PEOPLE_META),
         422, "file.line 22", "2 fields, the header has 3"),
    Case("csv: cut inside a quoted field",
         lambda w: _upload_bytes(w.api, GOOD + b'33,12,"a', PEOPLE_META),
         422, "file.line 22", "not closed"),
    Case("csv: 10^5 columns in the header",
         lambda w: _upload_bytes(w.api, _wide_csv(100_000), PEOPLE_META),
         422, "file", "more than 3000 columns"),
    Case("csv: 1001 declared columns",
         lambda w: _upload_bytes(w.api, _wide_csv(1001), _wide_meta(1001)),
         422, "metadata.columns", "at most 1000 columns"),
    Case("csv: header only",
         lambda w: _upload_bytes(w.api, b"age,income,group\n", PEOPLE_META),
         422, "file", "no data rows"),
    Case("csv: empty file",
         lambda w: _upload_bytes(w.api, b"", PEOPLE_META),
         422, "file", "empty"),
    Case("csv: duplicate column names",
         lambda w: _upload_bytes(w.api, b"age,income,group,age\n1,2,a,3\n", PEOPLE_META),
         422, "file.columns.age", "more than once"),
    Case("csv: non-UTF-8 bytes",
         lambda w: _upload_bytes(w.api, b"age,income,group\n1,2,\xff\xfe\n", PEOPLE_META),
         422, "file", "UTF-8"),
    Case("csv: Latin-1 header",
         lambda w: _upload_bytes(w.api, "\u00e2ge,income,group\n1,2,a\n".encode("latin-1"),
                                 PEOPLE_META),
         422, "file", "UTF-8"),
    Case("csv: NUL byte",
         lambda w: _upload_bytes(w.api, b"age,income,group\n1,2\x00,a\n", PEOPLE_META),
         422, "file.columns.income", "not a number"),
    Case("csv: one field over the field size limit",
         lambda w: _upload_bytes(w.api, b"age,income,group\n1,2," + b"a" * 200_000 + b"\n",
                                 PEOPLE_META),
         422, "file.line", "field size limit"),
    Case("csv: huge number in an integer column",
         lambda w: _upload_bytes(w.api, b"age,income,group\n" + b"9" * 4000 + b",2,a\n",
                                 PEOPLE_META),
         422, "file.columns.age", "outside declared bounds", ["9999"]),
    Case("csv: 1e308 and inf in a continuous column",
         lambda w: _upload_bytes(w.api, b"age,income,group\n1,1e308,a\n2,inf,b\n",
                                 PEOPLE_META),
         422, "file.columns.income", "outside declared bounds", ["1e308"]),
    # ---- uploads: the metadata
    Case("metadata: nested 10^5 levels deep",
         lambda w: _upload_bytes(w.api, GOOD, DEEP),
         422, "metadata", "nested"),
    Case("metadata: duplicate column keys",
         lambda w: _upload_bytes(w.api, GOOD, '{"name": "d", "budgets": {}, "columns": {'
                                 '"age": {"type": "integer", "bounds": [0, 9]},'
                                 ' "age": {"type": "integer", "bounds": [0, 9]}}}'),
         422, "metadata", "duplicate key"),
    Case("metadata: NaN bounds",
         lambda w: _upload_bytes(w.api, GOOD, json.dumps(_meta(columns={
             "age": {"type": "integer", "bounds": [0, float("nan")]}}))),
         422, "metadata.columns.age.bounds", "finite"),
    Case("metadata: 1e308 x 10 continuous bounds overflow",
         lambda w: _upload_bytes(w.api, GOOD, '{"name": "x", "budgets": {"epsilon": 1},'
                                 ' "columns": {"income": {"type": "continuous",'
                                 ' "bounds": [-1e309, 1e308]}}}'),
         422, "metadata.columns.income.bounds", "finite"),
    Case("metadata: ±1e308 continuous bounds (finite, but hi - lo overflows)",
         lambda w: _upload_bytes(w.api, GOOD, json.dumps(_meta(columns={
             "income": {"type": "continuous", "bounds": [-1e308, 1e308]}}))),
         422, "metadata.columns.income.bounds", "within"),
    Case("metadata: a prior family name of 10^5 characters",
         lambda w: _upload_bytes(w.api, GOOD, json.dumps(_meta(columns={
             "income": {"type": "continuous", "bounds": [0, 1],
                        "prior": {"family": "c" * 10**5, "loc": 0, "scale": 1}}}))),
         422, "metadata.columns.income.prior.family", "unknown prior family", ["c" * 50]),
    Case("metadata: scipy's lognormal parameter s",
         lambda w: _upload_bytes(w.api, GOOD, json.dumps(_meta(columns={
             "income": {"type": "continuous", "bounds": [0, 1],
                        "prior": {"family": "lognormal", "s": 1, "scale": 1}}}))),
         422, "metadata.columns.income.prior.s", "mu, sigma"),
    Case("metadata: cap 10**400",
         lambda w: _upload_bytes(w.api, GOOD, json.dumps(_meta(budgets={"epsilon": 10**400}))),
         422, "metadata.budgets.epsilon", "between 0 and"),
    Case("metadata: cap NaN",
         lambda w: _upload_bytes(w.api, GOOD, json.dumps(_meta(budgets={
             "epsilon": float("nan")}))),
         422, "metadata.budgets.epsilon", "finite"),
    Case("metadata: cap Infinity",
         lambda w: _upload_bytes(w.api, GOOD, json.dumps(_meta(budgets={
             "epsilon": float("inf")}))),
         422, "metadata.budgets.epsilon", "finite"),
    Case("metadata: integer of 5000 digits",
         lambda w: _upload_bytes(w.api, GOOD, '{"name": "x", "budgets": {"epsilon": '
                                 + "7" * 5000 + "}, " + json.dumps(PEOPLE_META)[1:]),
         422, "metadata", "JSON", ["7777"]),
    Case("metadata: functional grid of 10^4 points",
         lambda w: _upload_bytes(w.api, b"f.0\n1\n", {
             "name": "g", "budgets": {"epsilon": 1},
             "columns": {"f": {"type": "functional", "grid": list(range(10_000)),
                               "norm_bound": 1}}}),
         422, "metadata.columns.f.grid", "2000"),
    Case("metadata: 10^5 categories",
         lambda w: _upload_bytes(w.api, b"k\nc1\n", {
             "name": "g", "budgets": {"subset_draws": 1},
             "columns": {"k": {"type": "categorical",
                               "categories": [f"c{i}" for i in range(100_000)]}}}),
         413, None, "500000-byte limit"),
    Case("metadata: 10^4 + 1 categories",
         lambda w: _upload_bytes(w.api, b"k\nc1\n", {
             "name": "g", "budgets": {"subset_draws": 1},
             "columns": {"k": {"type": "categorical",
                               "categories": [f"c{i}" for i in range(10_001)]}}}),
         422, "metadata.columns.k.categories", "at most 10000"),
    # ---- releases: the body
    Case("release: nested 10^5 levels deep",
         lambda w: _release_text(w, DEEP), 400, None, "nested"),
    Case("estimate: nested 10^5 levels deep",
         lambda w: _release_text(w, DEEP, "/v1/releases/estimate"), 400, None, "nested"),
    Case("release: deeply nested params (depth 900)",
         lambda w: _release_json(w, "dip", '{"columns": ["income"], "order": '
                                 + "[" * 900 + "]" * 900 + "}", '{"epsilon": 1}'),
         400, None, "nested"),
    Case("release: body over the size limit",
         lambda w: _release_text(w, json.dumps({"dataset_id": w.people, "mechanism": "laplace",
                                                "params": {"pad": "x" * 3_000_000},
                                                "budget": {"epsilon": 1}})),
         413, None, "2097152-byte limit"),
    Case("release: JSON body over the JSON limit",
         lambda w: _release(w.small_world(), w.people,
                            "laplace", {"statistic": "histogram", "column": "income",
                                        "edges": list(range(20_000))}, {"epsilon": 1}),
         413, None, "JSON body is larger than the 65536-byte limit"),
    Case("release: 1.9 MB of edges",
         lambda w: _release(w, w.people, "laplace",
                            {"statistic": "histogram", "column": "income",
                             "edges": [i * 1e-3 for i in range(150_000)]},
                            {"epsilon": 1}),
         422, "params.edges", "10001"),
    Case("release: form body instead of JSON",
         lambda w: _raw(w.api, "/v1/releases", "dataset_id=x&mechanism=laplace",
                        "application/x-www-form-urlencoded"),
         415, None, "application/json"),
    Case("release: JSON sent as text/plain",
         lambda w: _raw(w.api, "/v1/releases", json.dumps({
             "dataset_id": w.people, "mechanism": "laplace",
             "params": {"statistic": "mean", "column": "age"}, "budget": {"epsilon": 1}}),
             "text/plain"),
         415, None, "application/json"),
    Case("release: body not JSON",
         lambda w: _raw(w.api, "/v1/releases", b"{\"dataset_id\": \xff"),
         400, None, "JSON"),
    Case("release: body a JSON array",
         lambda w: _raw(w.api, "/v1/releases", "[1, 2]"), 422, "body", "invalid input type"),
    # ---- releases: budgets
    Case("release: budget NaN",
         lambda w: _release_json(w, "laplace", MEAN_AGE, '{"epsilon": NaN}'),
         422, "budget.epsilon", "finite"),
    Case("release: budget Infinity",
         lambda w: _release_json(w, "laplace", MEAN_AGE, '{"epsilon": Infinity}'),
         422, "budget.epsilon", "finite"),
    Case("release: budget 1e308",
         lambda w: _release(w, w.people, "laplace", {"statistic": "mean", "column": "age"},
                            {"epsilon": 1e308}),
         422, "budget.epsilon", "at most 1000000"),
    Case("release: budget 101 (above the mechanism's epsilon range)",
         lambda w: _release(w, w.people, "laplace", {"statistic": "mean", "column": "age"},
                            {"epsilon": 101}),
         422, "budget.epsilon", "must be in (0, 100]"),
    Case("release: budget 10**400",
         lambda w: _release(w, w.people, "laplace", {"statistic": "mean", "column": "age"},
                            {"epsilon": 10**400}),
         422, "budget.epsilon", "at most 1000000"),
    Case("estimate: budget 10**400",
         lambda w: _release(w, w.people, "laplace", {"statistic": "mean", "column": "age"},
                            {"epsilon": 10**400}, "/v1/releases/estimate"),
         422, "budget.epsilon", "at most 1000000"),
    Case("release: delta 10**400 beside a sane epsilon",
         lambda w: _release(w, w.people, "gaussian", {"statistic": "mean", "column": "age"},
                            {"epsilon": 1, "delta": 10**400}),
         422, "budget.delta", "at most 1"),
    Case("release: budget 1e-400 (underflows to zero)",
         lambda w: _release_json(w, "laplace", MEAN_AGE, '{"epsilon": 1e-400}'),
         422, "budget.epsilon", "positive"),
    Case("release: budget as a 5000-digit string",
         lambda w: _release(w, w.people, "laplace", {"statistic": "mean", "column": "age"},
                            {"epsilon": "9" * 5000}),
         422, "budget.epsilon", "at most 1000000", ["9999"]),
    Case("release: interval_leakage 10**400",
         lambda w: _release(w, w.people, "interval.case1",
                            {"column": "income", "anchors": {"family": "logistic",
                                                             "scale": 100}},
                            {"interval_leakage": 10**400}),
         422, "budget.interval_leakage", "at most"),
    Case("release: noiseless_bits 1e308",
         lambda w: _release(w, w.people, "noiseless.aggregate",
                            {"statistic": "mean", "column": "age"},
                            {"noiseless_bits": 1e308}),
         422, "budget.noiseless_bits", "at most"),
    Case("release: subset_draws 10**400",
         lambda w: _release(w, w.people, "subset.uniform",
                            {"column": "group", "artificial_levels": 2},
                            {"subset_draws": 10**400}),
         422, "budget.subset_draws", "at most"),
    # ---- releases: params
    Case("release: param 10**400",
         lambda w: _release(w, w.people, "interval.case1",
                            {"column": "income", "anchors": {"family": "logistic",
                                                             "loc": 10**400, "scale": 1}},
                            {"interval_leakage": 0.5}),
         422, "params.anchors.loc", "too large", ["10000"]),
    Case("release: param NaN",
         lambda w: _release_json(w, "interval.case1", '{"column": "income", "anchors":'
                                 ' {"family": "logistic", "loc": NaN, "scale": 1}}',
                                 '{"interval_leakage": 0.5}'),
         422, "params.anchors.loc", "nan or infinity"),
    Case("release: condition value 1e308 x 10",
         lambda w: _release_json(w, "laplace", '{"statistic": "count", "condition":'
                                 ' {"column": "age", "op": "lt", "value": 1e309}}',
                                 '{"epsilon": 1}'),
         422, "params.condition.value", "finite number"),
    Case("release: 10^9 interval ranges (casek m)",
         lambda w: _release(w, w.people, "interval.casek",
                            {"column": "income", "m": 10**9,
                             "anchors": {"family": "logistic", "scale": 1}},
                            {"interval_leakage": 0.5}),
         422, "params.m", "64"),
    Case("release: 10^9 progressive rounds",
         lambda w: _release(w, w.people, "interval.progressive",
                            {"column": "income", "rounds": 10**9},
                            {"interval_leakage": 0.5}),
         422, "params.rounds", "16"),
    Case("release: iclp.kde grid of 10^7 points",
         lambda w: _release(w, w.people, "iclp.kde", {"column": "income",
                                                      "grid_size": 10**7}, {"epsilon": 1}),
         422, "params.grid_size", "1000"),
    Case("release: bernstein lattice of 10^7",
         lambda w: _release(w, w.people, "bernstein.kde", {"column": "income",
                                                           "lattice_size": 10**7},
                            {"epsilon": 1}),
         422, "params.lattice_size", "200"),
    Case("release: iclp.mean with 10^7 components",
         lambda w: _release(w, w.curves, "iclp.mean", {"column": "f",
                                                       "max_components": 10**7},
                            {"epsilon": 1}),
         422, "params.max_components", "2000"),
    Case("release: frl.mean with 10^7 components",
         lambda w: _release(w, w.curves, "frl.mean", {"column": "f", "components": 10**7},
                            {"epsilon": 1}),
         422, "params.components", "2000"),
    Case("release: DIP with 10^9 bins",
         lambda w: _release(w, w.people, "dip", {"columns": ["income"],
                                                 "reference": {"kind": "dp", "bins": 10**9}},
                            {"epsilon": 1}),
         422, "params.reference.bins", "at most"),
    Case("release: DIP with a 2**62 resolution",
         lambda w: _release(w, w.people, "dip", {"columns": ["income"], "resolution": 2**62},
                            {"epsilon": 1}),
         422, "params.resolution", ""),
    Case("release: DIP with 10^5 atoms",
         lambda w: _release(w, w.people, "dip", {"columns": ["income"],
                                                 "atoms": {"income": list(range(100_000))}},
                            {"epsilon": 1}),
         422, "params.atoms", "1000"),
    Case("release: noiseless.local with 10^5 edges",
         lambda w: _release(w, w.people, "noiseless.local",
                            {"column": "income", "edges": list(range(100_000))},
                            {"noiseless_bits": 1}),
         422, "params.edges", "4097"),
    Case("release: laplace histogram of 10^9 bins",
         lambda w: _release(w, w.people, "laplace", {"statistic": "histogram",
                                                     "column": "income", "bins": 10**9},
                            {"epsilon": 1}),
         422, "params.bins", "10000"),
    Case("release: subset.custom on 64 categories",
         lambda w: _release(w, w.wide, "subset.custom",
                            {"column": "k", "design": {
                                "type": "nu", "subsets": [[f"k{i}" for i in range(32)],
                                                          [f"k{i}" for i in range(32, 64)]],
                                "probabilities": [0.5, 0.5]}},
                            {"subset_draws": 1}),
         422, "params", "16"),
    Case("release: subset.uniform on 64 categories",
         lambda w: _release(w, w.wide, "subset.uniform", {"column": "k"},
                            {"subset_draws": 1}),
         422, "params.column", "at most 63"),
    Case("release: subset.custom with 4096 subsets",
         lambda w: _release(w, w.wide, "subset.custom",
                            {"column": "k", "design": {
                                "type": "nu", "subsets": [["k0", "k1"]] * 4096,
                                "probabilities": [1 / 4096] * 4096}},
                            {"subset_draws": 1}),
         422, "params", "16"),
    Case("release: subset.product with 10^5 columns",
         lambda w: _release(w, w.wide, "subset.product",
                            {"columns": [f"c{i}" for i in range(100_000)]},
                            {"subset_draws": 1}),
         422, "params.columns", "16"),
]


@pytest.fixture()
def guard(world: World, app: Flask, data_dir: Path) -> Iterator[None]:
    """Whatever a case does, nothing new may be spent or written."""
    ids = [world.people, world.wide, world.curves]
    before = (_budgets(world.api, ids), _keys(app), _files(data_dir))
    yield
    after = (_budgets(world.api, ids), _keys(app), _files(data_dir))
    assert after[0] == before[0], "a refused request moved a budget"
    assert after[1] <= before[1], f"new record entries: {sorted(after[1] - before[1])}"
    assert after[2] <= before[2], f"new files: {sorted(after[2] - before[2])}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused_quickly_and_leaves_nothing(
    world: World, guard: None, case: Case
) -> None:
    measured = _measure(lambda: case.send(world))
    resp = measured.response
    body = resp.get_json(silent=True) or {}
    print(f"\n{case.id}: {resp.status_code} {body.get('code')} field={body.get('field')!r}"
          f" detail={body.get('detail')!r} {measured.seconds:.3f}s"
          f" rss+={measured.rss_growth_mb:.1f}MB")
    assert resp.status_code == case.status, body
    assert resp.mimetype == PROBLEM
    assert body["status"] == case.status and body["code"]
    assert case.says.lower() in body["detail"].lower(), body
    if case.field is not None:
        assert str(body.get("field", "")).startswith(case.field), body
    text = resp.get_data(as_text=True)
    for secret in case.secret:
        assert secret not in text, "a data value was echoed back"
    assert measured.seconds < MAX_SECONDS
    assert measured.rss_growth_mb < MAX_MEMORY_MB


# --------------------------------------------------------------------------- formulas


def _cells(api: Api, release_id: str) -> list[list[str]]:
    resp = api.get(f"/v1/releases/{release_id}/data")
    assert resp.status_code == 200 and resp.mimetype == "text/csv"
    return list(csv.reader(io.StringIO(resp.get_data(as_text=True), newline="")))


def _released(api: Api, ds: str, mechanism: str, params: dict[str, Any],
              budget: dict[str, float]) -> str:
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": budget, "seed": 7})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    release_id: str = doc["id"]
    return release_id


def _unquote(cell: str) -> str:
    return cell[1:] if cell[:1] == "'" and cell[1:2] in ("=", "+", "-", "@", "\t", "\r") \
        else cell


def test_released_csv_neutralises_formula_cells(world: World) -> None:
    """Categories (and a column name) that a spreadsheet would run come back inert."""
    api = world.api
    cats = [*FORMULAS, "plain"]
    alt = [c for c in cats if "|" not in c]  # subset labels are joined with '|'
    meta = {"name": "formulas", "record_level": True, "budgets": {"epsilon": 4, "subset_draws": 1},
            "columns": {"@kind": {"type": "categorical", "categories": cats},
                        "alt": {"type": "categorical", "categories": alt},
                        "x": {"type": "continuous", "bounds": [-10, 10]}}}
    out = io.StringIO(newline="")
    writer = csv.writer(out)  # CRLF: the writer then quotes the "\r=1" category
    writer.writerow(["@kind", "alt", "x"])
    for i in range(240):
        writer.writerow([cats[i % len(cats)], alt[i % len(alt)], f"{(i % 21) - 10}"])
    resp = api.upload(out.getvalue(), meta)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]

    dip = _cells(api, _released(api, ds, "dip", {"columns": ["@kind", "x"]}, {"epsilon": 2}))
    subset = _cells(api, _released(api, ds, "subset.uniform", {"column": "alt",
                                                                "format": "both"},
                                   {"subset_draws": 1}))
    for table in (dip, subset):
        assert len(table) == 241  # a "\r" inside a cell did not split a record
        for row in table:
            for cell in row:
                assert cell[:1] not in ("=", "+", "@", "\t", "\r"), cell
    # every category survives behind one quote; numbers stay numbers (-3 is no formula)
    kind, x = dip[0].index("'@kind"), dip[0].index("x")
    assert {_unquote(row[kind]) for row in dip[1:]} <= set(cats)
    assert {row[kind] for row in dip[1:]} >= {"'=cmd|' /C calc'!A0", "plain"}
    assert all(-10 <= float(row[x]) <= 10 for row in dip[1:])
    assert any(row[x].startswith("-") for row in dip[1:])
    bits, labels = subset[0].index("alt"), subset[0].index("alt_categories")
    for row in subset[1:]:
        assert int(row[bits]) > 0  # bitmasks untouched
        names = _unquote(row[labels]).split("|")
        assert set(names) <= set(alt) and len(names) >= 2


# --------------------------------------------------------------------------- strangers


def test_strangers_hear_401_or_403_before_their_body_is_read(world: World) -> None:
    """Body checks wait for the key: wrong media type, deep JSON or a huge body are not
    looked at for a caller the endpoint does not admit (no token, unknown token, wrong role)."""
    client = world.api.client
    consumer = world.api.post("/v1/keys", {"role": "consumer"}).get_json()["token"]
    deep = b"[" * 100_000 + b"]" * 100_000
    huge = b'{"x": "' + b"a" * (9 * 2**20) + b'"}'
    bodies = [
        ("text/plain", b"hello"),
        ("application/json", deep),
        ("application/json", huge),
    ]
    callers = [({}, 401), ({"Authorization": "Bearer pr_nobody"}, 401),
               ({"Authorization": f"Bearer {consumer}"}, 403)]
    for path in ("/v1/releases", "/v1/datasets"):
        for headers, status in callers:
            for content_type, body in bodies:
                resp = client.post(path, data=body, headers={**headers,
                                                             "Content-Type": content_type})
                assert resp.status_code == status, (path, headers, content_type,
                                                    resp.get_json())
                assert resp.mimetype == PROBLEM
    # an admitted caller still gets the body checks
    resp = client.post("/v1/releases", data=b"hello", headers={
        "Authorization": f"Bearer {world.api.token}", "Content-Type": "text/plain"})
    assert resp.status_code == 415
