"""The HTTP API with a real Valkey and a real Celery worker."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from flask import Flask

from service import budget, datasets, ingest, wiring
from service.api.app import create_app
from service.releases import pricing, submit
from service.storage import rkeys
from service.storage.ledger import Reservation
from tests.conftest import ROOT
from tests.integration.conftest import PEOPLE_META, Api, people_csv

PROBLEM = "application/problem+json"


def _budget(api: Api, ds: str) -> dict[str, Any]:
    resp = api.get(f"/v1/datasets/{ds}/budget")
    assert resp.status_code == 200
    measures: dict[str, Any] = resp.get_json()["measures"]
    return measures


def _dataset_dirs(data_dir: Path) -> set[str]:
    root = data_dir / "datasets"
    return {p.name for p in root.iterdir() if p.name != ".tmp"} if root.exists() else set()


def test_upload_and_read_metadata(api: Api, dataset: dict[str, Any], data_dir: Path) -> None:
    assert dataset["version"] == 1 and dataset["n_rows"] == 200
    assert dataset["columns"]["group"]["categories"] == ["a", "b", "c"]
    assert dataset["budgets"]["epsilon"] == 5
    assert dataset["id"] in _dataset_dirs(data_dir)
    shown = api.get(f"/v1/datasets/{dataset['id']}").get_json()
    assert shown["id"] == dataset["id"]
    assert "values" not in json.dumps(shown)
    listed = api.get("/v1/datasets").get_json()
    assert dataset["id"] in {d["id"] for d in listed}
    budget = _budget(api, dataset["id"])
    assert budget["epsilon"] == {"cap": 5.0, "committed": 0.0, "reserved": 0.0,
                                 "remaining": 5.0}


def _meta(**changes: Any) -> dict[str, Any]:
    meta = json.loads(json.dumps(PEOPLE_META))
    meta.update(changes)
    return meta


BAD_UPLOADS = [
    ("malformed csv", 'age,income,group\n1,"2,a\n', PEOPLE_META, "file"),
    ("missing column", "age,income\n1,2\n", PEOPLE_META, "group"),
    ("unknown column", "age,income,group,zip\n1,2,a,9\n", PEOPLE_META, "zip"),
    ("non-numeric", "age,income,group\n1,abc,a\n", PEOPLE_META, "income"),
    ("NaN cell", "age,income,group\n1,nan,a\n", PEOPLE_META, "income"),
    ("empty cell", "age,income,group\n1,,a\n", PEOPLE_META, "income"),
    ("out of bounds", "age,income,group\n101,2,a\n", PEOPLE_META, "age"),
    ("unknown category", "age,income,group\n1,2,zz\n", PEOPLE_META, "group"),
    ("metadata not JSON", "age,income,group\n1,2,a\n", "{nope", "metadata"),
    ("unknown measure", "age,income,group\n1,2,a\n", _meta(budgets={"zeta": 1}), "budgets"),
    ("duplicate column", "age,income,group\n1,2,a\n",
     '{"name": "d", "budgets": {}, "columns": {"age": {"type": "integer", "bounds": [0, 9]},'
     ' "age": {"type": "integer", "bounds": [0, 9]}}}', "metadata"),
    ("negative cap", "age,income,group\n1,2,a\n", _meta(budgets={"epsilon": -1}), "epsilon"),
]


@pytest.mark.parametrize(("case", "csv", "meta", "field"), BAD_UPLOADS,
                         ids=[c[0] for c in BAD_UPLOADS])
def test_bad_upload_is_refused_and_leaves_nothing(
    api: Api, data_dir: Path, app: Flask, case: str, csv: str, meta: Any, field: str
) -> None:
    before_dirs = _dataset_dirs(data_dir)
    before_ids = {d["id"] for d in api.get("/v1/datasets").get_json()}
    resp = api.upload(csv, meta)
    assert resp.status_code == 422, (case, resp.get_json())
    assert resp.mimetype == PROBLEM
    body = resp.get_json()
    assert body["code"] == "validation_error"
    assert field in body["field"] or field in body["detail"], body
    assert _dataset_dirs(data_dir) == before_dirs
    assert {d["id"] for d in api.get("/v1/datasets").get_json()} == before_ids


def test_upload_failing_after_stored_chunks_leaves_nothing(
    api: Api, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columns go to disk chunk by chunk; a bad row in a later chunk removes them all."""
    monkeypatch.setattr(ingest, "CHUNK_ROWS", 2)
    before = _dataset_dirs(data_dir)
    resp = api.upload(people_csv(9) + "101,2,a\n", PEOPLE_META)
    assert resp.status_code == 422 and resp.get_json()["field"] == "file.columns.age"
    assert "line 11" in resp.get_json()["detail"]
    assert _dataset_dirs(data_dir) == before
    assert not any((data_dir / ".staging").glob("stage-*"))
    resp = api.upload(people_csv(9), PEOPLE_META)  # the same path, all chunks good
    assert resp.status_code == 201 and resp.get_json()["n_rows"] == 9


def _upload_file(api: Api, content: bytes, meta: dict[str, Any], mimetype: str) -> Any:
    data = {"metadata": json.dumps(meta),
            "file": (io.BytesIO(content), "data.bin", mimetype)}
    return api.client.post("/v1/datasets", data=data, content_type="multipart/form-data",
                           headers={"Authorization": f"Bearer {api.token}"})


def _people_parquet(n: int) -> bytes:
    table = pa_csv.read_csv(io.BytesIO(people_csv(n).encode()))
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=max(n // 3, 1))
    return sink.getvalue()


@pytest.mark.parametrize("mimetype", ["application/vnd.apache.parquet",
                                      "application/octet-stream"])
def test_parquet_upload_stores_what_the_csv_upload_stores(
        api: Api, app: Flask, mimetype: str) -> None:
    """Parquet is told by its magic bytes, whatever the part's type; the stored columns
    are those of the same table uploaded as CSV."""
    store = wiring.of(app).datasets
    as_csv = api.upload(people_csv(3000), PEOPLE_META)
    as_parquet = _upload_file(api, _people_parquet(3000), PEOPLE_META, mimetype)
    assert as_csv.status_code == as_parquet.status_code == 201, as_parquet.get_json()
    assert as_parquet.get_json()["n_rows"] == 3000
    _, want = store.load(as_csv.get_json()["id"], 1)
    _, got = store.load(as_parquet.get_json()["id"], 1)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        assert got[name].tolist() == want[name].tolist()


SECRET = "4111111111111111"
#: (file bytes, part type): each holds SECRET in a cell that the upload refuses
LEAKY_UPLOADS = [
    ((people_csv(10) + f"{SECRET},1.5,a\n").encode(), "text/csv"),  # out of bounds
    ((people_csv(10) + f"20,{SECRET}x,a\n").encode(), "text/csv"),  # not a number
    ((people_csv(10) + f"20,1.5,{SECRET}\n").encode(), "text/csv"),  # unknown category
    ((people_csv(10) + f"20,1.5,a,{SECRET}\n").encode(), "text/csv"),  # ragged
    ((people_csv(10) + f'20,1.5,"a{SECRET}\n').encode(), "text/csv"),  # unclosed quote
    ((people_csv(10) + "20,1.5,").encode() + SECRET.encode() + b"\xff\n", "text/csv"),
    ((people_csv(30_000) + f"20,0x{SECRET},a\n").encode(), "text/csv"),  # spooled to disk
    (_people_parquet(10)[:-60] + SECRET.encode() * 3 + _people_parquet(10)[-12:],
     "application/vnd.apache.parquet"),
    (SECRET.encode() * 4, "application/vnd.apache.parquet"),
]


@pytest.mark.parametrize(("content", "mimetype"), LEAKY_UPLOADS)
def test_refused_upload_never_shows_a_cell_in_the_answer_or_the_logs(
        api: Api, data_dir: Path, caplog: pytest.LogCaptureFixture, content: bytes,
        mimetype: str) -> None:
    """pyarrow's error messages quote the offending cell; none reaches the problem
    document or any log record (tracebacks included), and nothing is left on disk."""
    before = _dataset_dirs(data_dir)
    with caplog.at_level("DEBUG"):
        resp = _upload_file(api, content, PEOPLE_META, mimetype)
    assert resp.status_code == 422, resp.get_json()
    assert resp.get_json()["code"] == "validation_error"
    assert SECRET not in resp.get_data(as_text=True)
    assert SECRET not in caplog.text
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        if record.exc_info:
            assert SECRET not in "".join(map(str, record.exc_info[1:2]))
    assert _dataset_dirs(data_dir) == before
    assert not any((data_dir / ".staging").glob("stage-*"))


def test_oversized_upload_is_413(api: Api, data_dir: Path) -> None:
    before = _dataset_dirs(data_dir)
    big = people_csv(10) + ("1,2,a\n" * 400_000)  # > 2 MiB limit of the test config
    resp = api.upload(big, PEOPLE_META)
    assert resp.status_code == 413
    assert resp.mimetype == PROBLEM and resp.get_json()["code"] == "payload_too_large"
    assert _dataset_dirs(data_dir) == before


def _upload(api: Api, csv: str, meta: dict[str, Any], key: str) -> Any:
    data = {"metadata": json.dumps(meta), "file": (io.BytesIO(csv.encode()), "data.csv")}
    return api.client.post("/v1/datasets", data=data, content_type="multipart/form-data",
                           headers={"Authorization": f"Bearer {api.token}",
                                    "Idempotency-Key": key})


def test_upload_retried_with_its_idempotency_key_registers_once(
        api: Api, data_dir: Path) -> None:
    """A retry answers with the first dataset and does not parse its file again (a broken
    file proves it); other metadata under the same key is refused, leaving nothing."""
    before = _dataset_dirs(data_dir)
    first = _upload(api, people_csv(20), PEOPLE_META, "upload-1")
    assert first.status_code == 201, first.get_json()
    retry = _upload(api, "not,a\ncsv", PEOPLE_META, "upload-1")
    assert retry.status_code == 201 and retry.get_json() == first.get_json()
    other = _upload(api, people_csv(20), {**PEOPLE_META, "name": "other"}, "upload-1")
    assert other.status_code == 422 and other.get_json()["code"] == "idempotency_mismatch"
    dataset = first.get_json()["id"]
    assert _dataset_dirs(data_dir) - before == {dataset}
    events = api.get(f"/v1/datasets/{dataset}/ledger").get_json()
    assert [e["kind"] for e in events] == ["cap"]


def test_concurrent_uploads_with_one_idempotency_key_register_once(
        app: Flask, data_dir: Path) -> None:
    """Both parse (neither has registered yet); one registers, the other's files go and it
    answers with the winner's dataset."""
    before = _dataset_dirs(data_dir)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(
            lambda _: _upload(Api(app.test_client()), people_csv(100_000), PEOPLE_META, "race"),
            range(4)))
    assert {a.status_code for a in answers} == {201}
    ids = {a.get_json()["id"] for a in answers}
    assert len(ids) == 1
    assert _dataset_dirs(data_dir) - before == ids


def test_an_upload_that_loses_the_idempotency_race_returns_the_winner(
        app: Flask, data_dir: Path) -> None:
    """Deterministically, the path of a concurrent retry: it parsed its file before the
    first registered, so only the registration script can turn it away."""
    store, ledger = wiring.of(app).datasets, wiring.of(app).ledger
    spec = ingest.parse_metadata(PEOPLE_META)
    caps = budget.parse_caps(spec.budgets, list(spec.columns))

    def register(idem: datasets.Idempotency) -> dict[str, Any]:
        rows = ingest.iter_csv(io.BytesIO(people_csv(50).encode()), spec, max_rows=1000)
        return datasets.register(store, ledger, spec, caps, rows, "op", idem)

    key = rkeys.idempotency("key_test", "race-direct")
    before = _dataset_dirs(data_dir)
    first = register(datasets.Idempotency(key, "fp", 60))
    assert register(datasets.Idempotency(key, "fp", 60)) == first
    with pytest.raises(datasets.IdempotencyMismatch):
        register(datasets.Idempotency(key, "other metadata", 60))
    assert _dataset_dirs(data_dir) - before == {first["id"]}


def test_laplace_mean_end_to_end(api: Api, dataset: dict[str, Any], worker: Any) -> None:
    req = {"dataset_id": dataset["id"], "mechanism": "laplace",
           "params": {"statistic": "mean", "column": "age"}, "budget": {"epsilon": 0.5}}
    resp = api.post("/v1/releases", req)
    assert resp.status_code == 202, resp.get_json()
    created = resp.get_json()
    assert created["status"] in {"queued", "running", "succeeded"}
    assert created["cost"] == {"epsilon": 0.5}
    assert created["engine"] is None  # not run yet
    doc = api.wait(created["id"])
    assert doc["status"] == "succeeded", doc
    assert isinstance(doc["result"]["value"], float)
    assert doc["accuracy"]["ci95_halfwidth"] > 0
    assert "epsilon" in doc["guarantee"]
    assert doc["engine"] == "embedded"  # the worker read the data (no Spark configured)
    assert doc["dataset_version"] == 1 and doc["mechanism"] == "laplace"
    assert doc["finished_at"] and doc["created_at"]
    assert _budget(api, dataset["id"])["epsilon"]["committed"] == 0.5

    # an identical request is a replay: same release, nothing spent
    again = api.post("/v1/releases", req)
    assert again.status_code == 200
    assert again.get_json()["id"] == created["id"] and again.get_json()["replayed"]
    assert _budget(api, dataset["id"])["epsilon"] == {
        "cap": 5.0, "committed": 0.5, "reserved": 0.0, "remaining": 4.5}


@pytest.mark.parametrize(("mechanism", "params", "budget"), [
    ("geometric", {"statistic": "histogram", "column": "group"}, {"epsilon": 1}),
    ("gaussian", {"statistic": "count",
                  "condition": {"column": "age", "op": "ge", "value": 40}},
     {"epsilon": 1, "delta": 1e-6}),
    ("laplace", {"statistic": "sum", "column": "income"}, {"epsilon": 1}),
])
def test_other_baselines_end_to_end(api: Api, dataset: dict[str, Any], worker: Any,
                                    mechanism: str, params: dict[str, Any],
                                    budget: dict[str, float]) -> None:
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": mechanism,
                                     "params": params, "budget": budget})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    assert doc["cost"] == budget
    spent = {m: row["committed"] for m, row in _budget(api, dataset["id"]).items()
             if m in budget}
    assert spent == budget


def test_idempotency_key_spends_once(api: Api, dataset: dict[str, Any], worker: Any) -> None:
    req = {"dataset_id": dataset["id"], "mechanism": "laplace", "seed": 7,
           "params": {"statistic": "count", "condition": {"column": "group", "op": "eq",
                                                          "value": "a"}},
           "budget": {"epsilon": 1}}
    first = api.post("/v1/releases", req, {"Idempotency-Key": "abc"})
    retry = api.post("/v1/releases", req, {"Idempotency-Key": "abc"})
    assert first.status_code == 202 and retry.status_code == 202
    assert first.get_json()["id"] == retry.get_json()["id"]
    other = api.post("/v1/releases", {**req, "seed": 8}, {"Idempotency-Key": "abc"})
    assert other.status_code == 422 and other.get_json()["code"] == "idempotency_mismatch"
    api.wait(first.get_json()["id"])
    assert _budget(api, dataset["id"])["epsilon"]["committed"] == 1.0


def test_retry_after_commit_of_history_dependent_release(api: Api, worker: Any) -> None:
    """subset.* completes params from the ledger (prior_draws): a retry or an identical
    request after the first committed must still find the first release (found by the soak:
    the retry was 422 idempotency_mismatch, the identical request a second paid draw)."""
    meta = {"name": "cats", "record_level": True, "budgets": {"subset_draws": 2},
            "columns": {"c": {"type": "categorical", "categories": ["a", "b", "c", "d"]}}}
    ds = api.upload("c\n" + "".join(f"{'abcd'[i % 4]}\n" for i in range(40)), meta)
    req = {"dataset_id": ds.get_json()["id"], "mechanism": "subset.uniform",
           "params": {"column": "c"}, "budget": {"subset_draws": 1}}
    first = api.post("/v1/releases", req, {"Idempotency-Key": "draw-c"})
    assert first.status_code == 202
    assert api.wait(first.get_json()["id"])["status"] == "succeeded"
    retry = api.post("/v1/releases", req, {"Idempotency-Key": "draw-c"})
    assert retry.status_code in {200, 202}, retry.get_json()
    assert retry.get_json()["id"] == first.get_json()["id"]
    again = api.post("/v1/releases", req)
    assert again.status_code == 200 and again.get_json()["replayed"]
    assert again.get_json()["id"] == first.get_json()["id"]
    assert _budget(api, req["dataset_id"])["subset_draws:c"]["committed"] == 1.0


def test_queued_draw_counts_in_the_composed_design(api: Api, app: Flask) -> None:
    """A draw that is reserved but not yet committed is an earlier draw too: a request
    behind it in the queue must report the composed design, not a single draw."""
    meta = {"name": "cats", "record_level": True, "budgets": {"subset_draws": 2},
            "columns": {"c": {"type": "categorical", "categories": ["a", "b", "c", "d"]}}}
    ds = api.upload("c\n" + "".join(f"{'abcd'[i % 4]}\n" for i in range(40)), meta)
    ds_id = ds.get_json()["id"]
    req = {"dataset_id": ds_id, "mechanism": "subset.uniform", "params": {"column": "c"},
           "budget": {"subset_draws": 1}}
    # a queued draw: reserved as the API does, its job not sent (so not run yet)
    ledger = wiring.of(app).ledger
    first = pricing.prepare(ledger, {**req, "params": {"column": "c",
                                                                "format": "both"}},
                             allow_seeds=False)
    rid = submit.new_id()
    held = ledger.reserve(Reservation(ds_id, rid, first.cost_units, actor="k",
                          fingerprint=first.fingerprint, request_json=first.job().to_json()))
    assert held.outcome == "reserved"
    estimate = api.post("/v1/releases/estimate", req)
    ledger.abort(ds_id, rid, '{"message": "test"}', "k")
    assert estimate.status_code == 200, estimate.get_json()
    assert "composed" in json.dumps(estimate.get_json()["accuracy"])


def test_estimate_spends_nothing(api: Api, dataset: dict[str, Any]) -> None:
    req = {"dataset_id": dataset["id"], "mechanism": "laplace",
           "params": {"statistic": "mean", "column": "income"}, "budget": {"epsilon": 0.25}}
    resp = api.post("/v1/releases/estimate", req)
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["cost"] == {"epsilon": 0.25}
    # mean of [0, 1000] over 200 rows: sensitivity 5, scale 20
    assert body["accuracy"]["scale"] == pytest.approx(20, rel=0.01)
    assert body["remaining"] == {"epsilon": 5.0}
    assert body["fits"] is True and body["shortfall"] == {}
    assert _budget(api, dataset["id"])["epsilon"]["reserved"] == 0
    # beyond what remains: still answered (spending nothing), with the shortfall
    over = api.post("/v1/releases/estimate", {**req, "budget": {"epsilon": 7}}).get_json()
    assert over["fits"] is False and over["shortfall"] == {"epsilon": 2.0}


def test_budget_exhausted_is_409_with_amounts(api: Api, dataset: dict[str, Any]) -> None:
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age"},
                                     "budget": {"epsilon": 6}})
    assert resp.status_code == 409
    body = resp.get_json()
    assert resp.mimetype == PROBLEM
    assert (body["code"], body["requested"], body["remaining"]) == ("budget_exhausted", 6, 5)


BAD_RELEASES = [
    ({"mechanism": "nope"}, "mechanism"),
    ({"params": {"statistic": "mean", "column": "zip"}}, "params.column"),
    ({"params": {"statistic": "median", "column": "age"}}, "params.statistic"),
    ({"budget": {"epsilon": -1}}, "budget.epsilon"),
    ({"budget": {"epsilon": "NaN"}}, "budget.epsilon"),
    ({"budget": {"zeta": 1}}, "budget.zeta"),
    ({"budget": {"epsilon": 1, "delta": 1e-6}}, "budget"),
    ({"budget": {"epsilon": 1e9}}, "budget.epsilon"),
]


@pytest.mark.parametrize(("change", "field"), BAD_RELEASES, ids=[b[1] for b in BAD_RELEASES])
def test_bad_release_is_422_and_spends_nothing(api: Api, dataset: dict[str, Any],
                                               change: dict[str, Any], field: str) -> None:
    req = {"dataset_id": dataset["id"], "mechanism": "laplace",
           "params": {"statistic": "mean", "column": "age"}, "budget": {"epsilon": 1}}
    req.update(change)
    resp = api.post("/v1/releases", req)
    assert resp.status_code == 422, resp.get_json()
    body = resp.get_json()
    assert resp.mimetype == PROBLEM and body["code"] == "validation_error"
    assert body["field"].startswith(field), body
    assert _budget(api, dataset["id"])["epsilon"] == {
        "cap": 5.0, "committed": 0.0, "reserved": 0.0, "remaining": 5.0}
    assert api.get("/v1/releases?dataset_id=" + dataset["id"]).get_json() == []


def test_failed_job_refunds(api: Api, dataset: dict[str, Any], data_dir: Path,
                            worker: Any) -> None:
    shutil.rmtree(data_dir / "datasets" / dataset["id"])  # the worker cannot load it
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age"},
                                     "budget": {"epsilon": 1}})
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "failed" and doc["error"]["message"]
    assert _budget(api, dataset["id"])["epsilon"] == {
        "cap": 5.0, "committed": 0.0, "reserved": 0.0, "remaining": 5.0}


def test_seeds_refused_in_production(app: Flask, dataset: dict[str, Any]) -> None:
    prod = create_app(dataclasses.replace(app.config["PRIVRELEASE"], allow_seeds=False))
    resp = Api(prod.test_client()).post("/v1/releases", {
        "dataset_id": dataset["id"], "mechanism": "laplace", "seed": 1,
        "params": {"statistic": "mean", "column": "age"}, "budget": {"epsilon": 1}})
    assert resp.status_code == 422 and resp.get_json()["field"] == "seed"


def test_errors_are_problem_json(api: Api, app: Flask) -> None:
    client = app.test_client()
    for resp, status in [
        (api.get("/v1/nowhere"), 404),
        (api.get("/v1/releases/rel_missing"), 404),
        (client.delete("/v1/datasets"), 405),
        (client.get("/v1/datasets"), 401),
        (client.get("/v1/datasets", headers={"Authorization": "Bearer wrong"}), 401),
        (api.post("/v1/releases", {"dataset_id": "x"}), 422),
    ]:
        assert resp.status_code == status
        assert resp.mimetype == PROBLEM
        assert resp.get_json()["status"] == status


def test_app_loads_every_mechanism_before_serving(service_env: dict[str, str]) -> None:
    """The soak saw a ~2 s first request per gunicorn worker: the mechanism imports."""
    code = ("import sys; from service.api.app import create_app; create_app();"
            " from mechanisms import registry;"
            " sys.exit(not all(m in sys.modules for m in registry.BUILTIN))")
    done = subprocess.run([sys.executable, "-c", code], env=service_env, cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_openapi_docs_and_probes(api: Api, app: Flask, worker: Any) -> None:
    client = app.test_client()
    spec = client.get("/openapi.json").get_json()
    assert spec["openapi"].startswith("3.")
    assert {"/v1/datasets", "/v1/releases", "/v1/releases/estimate"} <= set(spec["paths"])
    # issue #18: every operation has a unique operationId and a summary (generated clients)
    operations = [op for item in spec["paths"].values() for method, op in item.items()
                  if method in {"get", "post", "patch", "put", "delete"}]
    ids = [op.get("operationId") for op in operations]
    assert None not in ids and len(set(ids)) == len(ids), ids
    assert all(op.get("summary") for op in operations)
    assert spec["paths"]["/v1/releases"]["post"]["operationId"] == "releases_create"
    assert client.get("/docs").status_code == 200
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["workers"] >= 1
    catalog = api.get("/v1/mechanisms").get_json()
    assert {"laplace", "geometric", "gaussian"} <= {m["name"] for m in catalog}
    laplace = next(m for m in catalog if m["name"] == "laplace")
    assert "$ref" not in json.dumps(laplace["params_schema"])
    assert "condition" in laplace["params_schema"]["properties"]


def test_functional_and_prior_metadata_round_trip(api: Api, app: Flask) -> None:
    meta = {"name": "curves", "record_level": True, "budgets": {"epsilon": 1},
            "columns": {"f": {"type": "functional", "grid": [0, 0.5, 1], "norm_bound": 3},
                        "x": {"type": "continuous", "bounds": [0, 1],
                              "prior": {"family": "beta", "a": 2, "b": 2}}}}
    resp = api.upload("f.0,f.1,f.2,x\n1,2,3,0.5\n4,5,6,0.25\n", meta)
    assert resp.status_code == 201, resp.get_json()
    doc = resp.get_json()
    assert doc["columns"]["f"] == {"type": "functional", "grid": [0, 0.5, 1], "norm_bound": 3}
    assert doc["columns"]["x"]["prior"] == {"family": "beta", "a": 2, "b": 2}
    _, columns = wiring.of(app).datasets.load(doc["id"], 1)
    assert columns["f"].shape == (2, 3) and columns["f"][1].tolist() == [4, 5, 6]
