"""Dataset versions on one budget (issue #19 §2): the session's real store, real worker.

A version is a new table of the same people: it spends the dataset's caps, releases
record it (and their replay keys and audit events name it), and composition reads the
releases of the same version only.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from flask import Flask

from service import datasets, wiring
from service.ingest import iter_upload
from service.releases import pricing, submit
from service.storage import database, rkeys
from service.storage.ledger import Reservation
from service.storage.pg_ledger import PgLedger
from service.storage.store import ReleaseView, Store
from tests.integration import record_state
from tests.integration.conftest import PEOPLE_META, Api, people_csv

PROBLEM = "application/problem+json"


def _post_version(api: Api, dataset_id: str, csv: str, *, metadata: Any = None,
                  headers: dict[str, str] | None = None, **form: str) -> Any:
    data: dict[str, Any] = {"file": (io.BytesIO(csv.encode()), "v.csv"), **form}
    if metadata is not None:
        data["metadata"] = metadata if isinstance(metadata, str) else json.dumps(metadata)
    return api.client.post(f"/v1/datasets/{dataset_id}/versions", data=data,
                           content_type="multipart/form-data",
                           headers={"Authorization": f"Bearer {api.token}", **(headers or {})})


def _patch(api: Api, dataset_id: str, version: int, body: dict[str, Any]) -> Any:
    return api.client.patch(f"/v1/datasets/{dataset_id}/versions/{version}", json=body,
                            headers={"Authorization": f"Bearer {api.token}"})


def _count_rows(dataset_id: str, epsilon: float, version: int | None = None,
                value: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "dataset_id": dataset_id, "mechanism": "laplace", "seed": 11,
        "params": {"statistic": "count", "condition": {"column": "age", "op": "ge",
                                                       "value": value}},
        "budget": {"epsilon": epsilon}}
    if version is not None:
        body["version"] = version
    return body


def _upload(api: Api, n: int, budgets: dict[str, float] | None = None) -> dict[str, Any]:
    meta = {**PEOPLE_META, **({"budgets": budgets} if budgets else {})}
    resp = api.upload(people_csv(n), meta)
    assert resp.status_code == 201, resp.get_json()
    doc: dict[str, Any] = resp.get_json()
    return doc


def _version_dirs(data_dir: Path, dataset_id: str) -> set[str]:
    return {p.name for p in (data_dir / "datasets" / dataset_id).iterdir()}


def test_upload_version_keeps_the_current_one_until_made_current(
        api: Api, data_dir: Path) -> None:
    """Catches a version that becomes current by itself, a wrong Location or sha256, and
    a document whose top level does not follow the current version."""
    ds = _upload(api, 200)
    assert (ds["current_version"], [v["version"] for v in ds["versions"]]) == (1, [1])
    assert ds["sha256"] == hashlib.sha256(people_csv(200).encode()).hexdigest()
    csv = people_csv(150)
    resp = _post_version(api, ds["id"], csv)
    assert resp.status_code == 201, resp.get_json()
    assert resp.headers["Location"] == f"/v1/datasets/{ds['id']}/versions/2"
    made = resp.get_json()
    assert (made["version"], made["n_rows"], made["current"], made["status"]) == (
        2, 150, False, "active")
    assert made["sha256"] == hashlib.sha256(csv.encode()).hexdigest()
    assert _version_dirs(data_dir, ds["id"]) == {"v1", "v2"}
    doc = api.get(f"/v1/datasets/{ds['id']}").get_json()
    assert (doc["version"], doc["current_version"], doc["n_rows"]) == (1, 1, 200)
    listed = api.get(f"/v1/datasets/{ds['id']}/versions").get_json()
    assert [(v["version"], v["current"]) for v in listed] == [(1, True), (2, False)]

    resp = _patch(api, ds["id"], 2, {"current": True})
    assert resp.status_code == 200 and resp.get_json()["current"] is True
    doc = api.get(f"/v1/datasets/{ds['id']}").get_json()
    assert (doc["version"], doc["current_version"], doc["n_rows"]) == (2, 2, 150)
    assert api.get(f"/v1/datasets/{ds['id']}/versions/9").status_code == 404

    resp = _post_version(api, ds["id"], people_csv(120), make_current="true")
    assert resp.status_code == 201 and resp.get_json()["current"] is True
    assert api.get(f"/v1/datasets/{ds['id']}").get_json()["n_rows"] == 120
    events = api.get(f"/v1/datasets/{ds['id']}/ledger?kind=version").get_json()
    assert [(e["action"], e["version"]) for e in events] == [
        ("uploaded", 2), ("current", 2), ("uploaded", 3), ("current", 3)]


def test_versions_spend_one_budget_and_replays_are_per_version(
        api: Api, app: Flask, worker: Any) -> None:
    """Catches a version with a fresh budget (the same people twice), a replay key without
    the version (a v2 request answered by the v1 release), a worker that reads the
    current version's files instead of the recorded one, and composition across
    versions (different rows)."""
    ds = _upload(api, 200, budgets={"epsilon": 1.5})
    first = api.post("/v1/releases", _count_rows(ds["id"], 0.6))
    assert first.status_code == 202, first.get_json()
    assert api.wait(first.get_json()["id"])["status"] == "succeeded"
    assert _post_version(api, ds["id"], people_csv(3000)).status_code == 201

    # v2 sees the dataset's remainder: 0.9 of 1.5
    refused = api.post("/v1/releases", _count_rows(ds["id"], 1.0, version=2))
    assert refused.status_code == 409
    assert (refused.get_json()["code"], refused.get_json()["remaining"]) == (
        "budget_exhausted", pytest.approx(0.9))
    second = api.post("/v1/releases", _count_rows(ds["id"], 0.3, version=2))
    assert second.status_code == 202, second.get_json()
    v2 = api.wait(second.get_json()["id"])
    assert v2["status"] == "succeeded" and v2["dataset_version"] == 2
    # Laplace(1/0.3): |noise| > 100 has probability exp(-30); v1 has 200 rows, v2 3000
    assert abs(v2["result"]["value"] - 3000) < 100
    # the same request on v1 is another release (its own replay key), not v2's
    again_v1 = api.post("/v1/releases", _count_rows(ds["id"], 0.3, version=1))
    assert again_v1.status_code == 202
    assert again_v1.get_json()["id"] not in {first.get_json()["id"], v2["id"]}
    v1 = api.wait(again_v1.get_json()["id"])
    assert v1["dataset_version"] == 1 and abs(v1["result"]["value"] - 200) < 100
    # while the same request on v2 replays v2's release and spends nothing
    replay = api.post("/v1/releases", _count_rows(ds["id"], 0.3, version=2))
    assert replay.status_code == 200 and replay.get_json()["id"] == v2["id"]
    budget = api.get(f"/v1/datasets/{ds['id']}/budget").get_json()["measures"]["epsilon"]
    assert (budget["committed"], budget["remaining"]) == (pytest.approx(1.2),
                                                          pytest.approx(0.3))

    ledger = wiring.of(app).ledger
    doc = datasets.get(ledger, ds["id"])
    assert doc is not None
    per_version = {v: pricing.earlier_releases(ledger, datasets.at_version(doc, v))
                   for v in (1, 2)}
    assert [e["cost"]["epsilon"] for e in per_version[1]] == [Fraction("0.6"),
                                                               Fraction("0.3")]
    assert [e["cost"]["epsilon"] for e in per_version[2]] == [Fraction("0.3")]

    events = api.get(f"/v1/datasets/{ds['id']}/ledger?kind=reserve,commit").get_json()
    by_release = {(e["kind"], e["release_id"]): e.get("version") for e in events}
    assert by_release == {(k, r): v for r, v in ((first.get_json()["id"], 1), (v2["id"], 2),
                                                  (v1["id"], 1))
                          for k in ("reserve", "commit")}


def test_retired_version_refuses_new_releases_and_keeps_its_own(
        api: Api, worker: Any, data_dir: Path) -> None:
    """Catches a retired version that still takes releases, a current version that can be
    retired (releases without a version would have none), a retired one made current,
    and retirement that removes files or hides the version's releases."""
    ds = _upload(api, 200)
    done = api.post("/v1/releases", _count_rows(ds["id"], 0.1))
    assert api.wait(done.get_json()["id"])["status"] == "succeeded"
    assert _post_version(api, ds["id"], people_csv(100), make_current="true").status_code == 201
    resp = _patch(api, ds["id"], 2, {"status": "retired"})
    assert (resp.status_code, resp.get_json()["code"]) == (409, "version_current")
    resp = _patch(api, ds["id"], 1, {"status": "retired"})
    assert resp.status_code == 200 and resp.get_json()["status"] == "retired"
    refused = api.post("/v1/releases", _count_rows(ds["id"], 0.1, version=1, value=1))
    assert (refused.status_code, refused.get_json()["code"]) == (409, "version_retired")
    estimate = api.post("/v1/releases/estimate", _count_rows(ds["id"], 0.1, version=1))
    assert estimate.status_code == 409
    resp = _patch(api, ds["id"], 1, {"current": True})
    assert (resp.status_code, resp.get_json()["code"]) == (409, "version_retired")
    assert _patch(api, ds["id"], 1, {"current": True, "status": "retired"}).status_code == 422
    # its release stays readable, its files stay, the current version takes releases
    assert api.get(f"/v1/releases/{done.get_json()['id']}").get_json()["status"] == "succeeded"
    assert _version_dirs(data_dir, ds["id"]) == {"v1", "v2"}
    ok = api.post("/v1/releases", _count_rows(ds["id"], 0.1, value=2))
    assert ok.status_code == 202 and ok.get_json()["dataset_version"] == 2
    events = api.get(f"/v1/datasets/{ds['id']}/ledger?kind=version").get_json()
    assert [(e["action"], e["version"]) for e in events][-1] == ("retired", 1)
    # a retired dataset takes no version
    api.client.delete(f"/v1/datasets/{ds['id']}", headers={"Authorization": f"Bearer {api.token}"})
    resp = _post_version(api, ds["id"], people_csv(10))
    assert (resp.status_code, resp.get_json()["code"]) == (409, "dataset_retired")


def _reserve(app: Flask, prepared: pricing.Prepared, release_id: str) -> Any:
    """Reserve ``prepared`` as the API's POST does (same fingerprints and request)."""
    return wiring.of(app).ledger.reserve(Reservation(
        prepared.dataset["id"], release_id, prepared.cost_units, actor="t",
        fingerprint=prepared.request_fingerprint, replay_fingerprint=prepared.fingerprint,
        request_json=prepared.job().to_json(), replay=False))


def test_a_version_retired_after_prepare_is_refused_by_the_ledger(app: Flask,
                                                                    api: Api) -> None:
    """Catches a retirement checked only in ``prepare``: a version retired (by the real
    version script) between prepare and reserve -- another API process's PATCH -- got a
    release reserved and run on it. The ledger script refuses it, holds nothing, records
    nothing; a release reserved before the retirement stays held (no new releases only)."""
    ds = _upload(api, 50)
    assert _post_version(api, ds["id"], people_csv(40)).status_code == 201
    ledger = wiring.of(app).ledger
    before = pricing.prepare(ledger, _count_rows(ds["id"], 0.2, version=2),
                              allow_seeds=True)
    late = pricing.prepare(ledger, _count_rows(ds["id"], 0.3, version=2, value=1),
                            allow_seeds=True)
    held_id = submit.new_id()
    assert _reserve(app, before, held_id).outcome == "reserved"
    datasets.change_version(ledger, ds["id"], 2, "t", retire=True)

    balance, events = ledger.balance(ds["id"]), len(ledger.events(ds["id"]))
    refused_id = submit.new_id()
    res = _reserve(app, late, refused_id)
    assert (res.outcome, res.release_id) == ("version_retired", "2")
    problem = submit.refusal(res)
    assert problem is not None
    assert (problem.status, problem.code, problem.field) == (409, "version_retired", "version")
    assert ledger.balance(ds["id"]) == balance
    assert balance["epsilon"]["reserved"] == before.cost_units["epsilon"]
    assert len(ledger.events(ds["id"])) == events
    assert ledger.release(refused_id) is None
    pending, _ = ledger.release_page(ReleaseView("pending", frozenset({ds["id"]})), 100)
    assert refused_id not in pending and held_id in pending
    assert refused_id not in ledger.unsent_ids()
    assert record_state.retired_versions(ledger, ds["id"]) == {2}
    # the release reserved before the retirement is still held; v1 still takes releases
    held = ledger.release(held_id)
    assert held is not None and held["status"] == "queued"
    assert ledger.cancel(ds["id"], held_id, "t") == "settled"
    v1 = pricing.prepare(ledger, _count_rows(ds["id"], 0.1, version=1),
                          allow_seeds=True)
    ok_id = submit.new_id()
    assert _reserve(app, v1, ok_id).outcome == "reserved"
    assert ledger.cancel(ds["id"], ok_id, "t") == "settled"


def test_a_post_racing_a_version_retirement_answers_409_and_spends_nothing(
        app: Flask, api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the API path of the same race: the version is retired (the real PATCH
    path, ``datasets.change_version``) after this POST's ``prepare`` read the document
    and before its reservation; the answer is the retired version's 409 and the budget
    and the dataset's releases are as before. Also: a retired version can not be made
    current, so the ledger's field is never cleared for it."""
    ds = _upload(api, 50)
    assert _post_version(api, ds["id"], people_csv(40)).status_code == 201
    ledger = wiring.of(app).ledger
    real = submit.prepare

    retired: list[bool] = []

    def prepare_then_retire(svc: Any, body: dict[str, Any], **kw: Any) -> Any:
        prepared = real(svc, body, **kw)
        if not retired:  # the first prepare: its reservation finds the registry moved on
            datasets.change_version(ledger, ds["id"], 2, "other", retire=True)
            retired.append(True)
        return prepared

    monkeypatch.setattr(submit, "prepare", prepare_then_retire)
    budget = api.get(f"/v1/datasets/{ds['id']}/budget").get_json()
    resp = api.post("/v1/releases", _count_rows(ds["id"], 0.2, version=2))
    assert (resp.status_code, resp.get_json()["code"]) == (409, "version_retired")
    monkeypatch.undo()
    assert api.get(f"/v1/datasets/{ds['id']}/budget").get_json() == budget
    assert ledger.dataset_history(ds["id"], 0) == ([], False)  # no release at all
    resp = _patch(api, ds["id"], 2, {"current": True})
    assert (resp.status_code, resp.get_json()["code"]) == (409, "version_retired")
    assert record_state.retired_versions(ledger, ds["id"]) == {2}
    # making an active version current keeps the field unset
    assert _post_version(api, ds["id"], people_csv(30), make_current="true").status_code == 201
    assert record_state.retired_versions(ledger, ds["id"]) == {2}


@contextmanager
def _blind(app: Flask, redis_url: str) -> Iterator[Store]:
    """The session's record through an account that reads the registry's dataset ids but
    is refused their documents, by the real server: a role whose ``datasets`` (first on
    its search_path) is a view of the real table whose ``document`` the server refuses to
    produce (insufficient_resources, an OperationalError: the record can not answer)."""
    name = f"blind{uuid.uuid4().hex[:8]}"
    ledger = wiring.of(app).ledger
    record_state.sql(ledger, f"""
        CREATE SCHEMA {name};
        CREATE FUNCTION {name}.refuse(text) RETURNS text LANGUAGE plpgsql STABLE AS $$
          BEGIN RAISE EXCEPTION 'documents refused' USING ERRCODE = 'insufficient_resources';
          END $$;
        CREATE VIEW {name}.datasets AS
          SELECT id, created_at, {name}.refuse(id) AS document FROM public.datasets;
        CREATE ROLE {name} LOGIN;
        ALTER ROLE {name} SET search_path = {name}, public;
        GRANT USAGE ON SCHEMA {name} TO {name};
        GRANT SELECT ON {name}.datasets TO {name};
        GRANT EXECUTE ON FUNCTION {name}.refuse(text) TO {name};""")
    url = app.config["PRIVRELEASE"].database_url
    pool = database.connect(psycopg.conninfo.make_conninfo(url, user=name), max_size=1)
    try:
        yield PgLedger(pool)
    finally:
        pool.close()
        record_state.sql(ledger, f"DROP SCHEMA {name} CASCADE; DROP ROLE {name}")


def test_the_orphan_sweep_removes_old_unregistered_version_folders(
        api: Api, app: Flask, data_dir: Path, redis_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Catches a version folder whose registration never landed (a stray ``v9`` under a
    registered dataset) kept forever, and a sweep that removes a registered version (even
    old), a fresh folder (an upload between commit and registration), or anything while
    the registrations can not be read (the real store refusing the documents' read:
    ``_blind``)."""
    from service.releases import sweeper

    ds = _upload(api, 20)
    assert _post_version(api, ds["id"], people_csv(15)).status_code == 201
    folder = data_dir / "datasets" / ds["id"]
    old = time.time() - 2 * sweeper.ORPHAN_INTERVAL
    (folder / "v9").mkdir()
    (folder / "v9" / "data.parquet").touch()  # a commit that died before its manifest
    for name in ("v1", "v2", "v9"):
        for path in (folder / name).iterdir():
            os.utime(path, (old, old))
    (folder / "v10").mkdir()  # fresh: an upload that is registering now
    (folder / "v10" / "data.parquet").touch()
    client, store = wiring.of(app).client, wiring.of(app).datasets
    # the session worker's own hourly sweep must not take the folder first
    client.set(sweeper.ORPHAN_LOCK, "test", px=600_000)
    with _blind(app, redis_url) as blind:
        assert ds["id"] in blind.dataset_ids()  # the ids read; the documents do not
        with caplog.at_level(logging.WARNING, "privrelease.sweeper"):
            assert sweeper.sweep_orphans(blind, store) == []
        assert [r.getMessage() for r in caplog.records
                if r.name == "privrelease.sweeper"] == ["orphan version sweep failed"]
        assert _version_dirs(data_dir, ds["id"]) == {"v1", "v2", "v9", "v10"}
    removed = sweeper.sweep_orphans(wiring.of(app).ledger, store)
    assert [r for r in removed if r.startswith(ds["id"])] == [f"{ds['id']}/v9"]
    assert _version_dirs(data_dir, ds["id"]) == {"v1", "v2", "v10"}
    assert store.exists(ds["id"], 1) and store.exists(ds["id"], 2)
    shutil.rmtree(folder / "v10")


INCOMPATIBLE = [
    ({"budgets": {"epsilon": 50, "delta": 1e-5}}, "metadata.budgets"),
    ({"notions": ["dp"]}, "metadata.notions"),
    ({"bounds_policy": "clip"}, "metadata.bounds_policy"),
    ({"keep_row_order": True}, "metadata.keep_row_order"),
    ({"columns": {**PEOPLE_META["columns"],
                  "age": {"type": "continuous", "bounds": [0, 100]}}}, "metadata.columns.age.type"),
    # (without the column's subset_draws cap, which names a column the version lacks)
    ({"columns": {k: v for k, v in PEOPLE_META["columns"].items() if k != "group"},
      "budgets": {"epsilon": 5, "delta": 1e-5}}, "metadata.columns.group"),
]


@pytest.mark.parametrize(("change", "field"), INCOMPATIBLE, ids=[c[1] for c in INCOMPATIBLE])
def test_incompatible_metadata_is_422_naming_the_field_and_leaves_nothing(
        api: Api, app: Flask, data_dir: Path, change: dict[str, Any], field: str) -> None:
    """Catches a version that changes the dataset's budget, notions, policies or column
    kinds (the same people under other rules), and a refusal that leaves files or a
    Valkey change behind."""
    ds = _upload(api, 30)
    ledger = wiring.of(app).ledger
    before = (ledger.dataset_document(ds["id"]), _version_dirs(data_dir, ds["id"]),
              len(ledger.events(ds["id"])))
    csv = people_csv(30) if "group" not in field else "age,income\n30,4.5\n"
    resp = _post_version(api, ds["id"], csv, metadata={**PEOPLE_META, **change},
                         compatible="true")
    assert resp.status_code == 422 and resp.mimetype == PROBLEM, resp.get_json()
    assert resp.get_json()["field"] == field
    assert before[0] is not None
    assert (ledger.dataset_document(ds["id"]), _version_dirs(data_dir, ds["id"]),
            len(ledger.events(ds["id"]))) == before
    assert not any((data_dir / ".staging").glob("stage-*"))


def test_compatible_change_needs_the_declaration_and_bad_cells_leave_nothing(
        api: Api, app: Flask, data_dir: Path) -> None:
    """Catches changed metadata taken without ``compatible=true``, bounds of the new
    version not used for its validation, and a cell value in a version's error."""
    ds = _upload(api, 30)
    wider = {**PEOPLE_META, "columns": {**PEOPLE_META["columns"],
                                        "age": {"type": "integer", "bounds": [0, 130]}}}
    csv = people_csv(30) + "125,3.5,b\n"
    resp = _post_version(api, ds["id"], csv, metadata=wider)
    assert (resp.status_code, resp.get_json()["field"]) == (422, "compatible")
    # the dataset's own bounds refuse 125 (no value in the answer), nothing is kept
    ledger = wiring.of(app).ledger
    before = (ledger.dataset_document(ds["id"]), _version_dirs(data_dir, ds["id"]))
    assert before[0] is not None
    resp = _post_version(api, ds["id"], people_csv(30) + "12345,3.5,b\n")
    assert resp.status_code == 422 and resp.get_json()["field"] == "file.columns.age"
    assert "12345" not in resp.get_data(as_text=True)
    assert (ledger.dataset_document(ds["id"]), _version_dirs(data_dir, ds["id"])) == before
    assert not any((data_dir / ".staging").glob("stage-*"))
    # declared compatible: accepted, with its own bounds (budgets omitted: the dataset's)
    no_budgets = {k: v for k, v in wider.items() if k != "budgets"}
    resp = _post_version(api, ds["id"], csv, metadata=no_budgets, compatible="true")
    assert resp.status_code == 201, resp.get_json()
    assert resp.get_json()["columns"]["age"]["bounds"] == [0, 130]
    assert resp.get_json()["n_rows"] == 31


def test_version_upload_with_an_idempotency_key_stores_once(
        api: Api, data_dir: Path) -> None:
    """Catches a retried version upload that stores a second version, and a key reused
    for another request answered with the first one's version."""
    ds = _upload(api, 20)
    key = {"Idempotency-Key": f"v-{ds['id']}"}
    first = _post_version(api, ds["id"], people_csv(20), headers=key)
    again = _post_version(api, ds["id"], people_csv(20), headers=key)
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.get_json()["version"] == again.get_json()["version"] == 2
    assert _version_dirs(data_dir, ds["id"]) == {"v1", "v2"}
    other = _post_version(api, ds["id"], people_csv(20), headers=key, make_current="true")
    assert (other.status_code, other.get_json()["code"]) == (422, "idempotency_mismatch")


def test_concurrent_version_uploads_each_get_a_number(app: Flask, data_dir: Path,
                                                      api: Api) -> None:
    """Catches lost updates of the document (two versions, one recorded) and two uploads
    taking one number; a folder a crashed upload left (v2 here) is skipped, not reused."""
    ds = _upload(api, 10)
    svc = wiring.of(app)
    store, ledger = svc.datasets, svc.ledger
    doc = datasets.get(ledger, ds["id"])
    assert doc is not None
    spec = datasets.spec_of(doc)
    store.write(ds["id"], 2, {"orphan": True}, {"age": np.arange(3)})  # a kept orphan
    made: list[int] = []

    def one(n: int) -> None:
        chunks = iter_upload(io.BytesIO(people_csv(n).encode()), spec, max_rows=100)
        made.append(datasets.add_version(store, ledger, ds["id"], spec, chunks,
                                         "tests")["version"])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(1, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == [3, 4, 5, 6, 7]
    doc = datasets.get(ledger, ds["id"])
    assert doc is not None
    assert sorted(e["version"] for e in doc["versions"]) == [1, 3, 4, 5, 6, 7]
    assert sorted(e["n_rows"] for e in doc["versions"]) == [1, 2, 3, 4, 5, 10]


def test_reupload_as_a_new_dataset_is_warned(api: Api) -> None:
    """Catches a silent second budget for the same people: a new dataset with an active
    dataset's column set and row count names that dataset (same_file when identical)."""
    n = 777
    first = _upload(api, n)
    second = _upload(api, n)
    warnings = [w for w in second.get("warnings", []) if w["dataset_id"] == first["id"]]
    assert warnings and warnings[0]["code"] == "possible_reupload"
    assert warnings[0]["same_file"] is True
    different = api.upload(people_csv(n + 1), PEOPLE_META).get_json()
    assert all(w["dataset_id"] != first["id"] for w in different.get("warnings", []))



HEIGHTS = {"name": "heights", "record_level": True, "budgets": {"interval_leakage": 0.9},
           "columns": {"h": {"type": "continuous", "bounds": [100, 220],
                             "prior": {"family": "normal", "loc": 170, "scale": 10}}}}


def test_a_priced_release_keeps_the_version_it_was_asked_on(api: Api, app: Flask) -> None:
    """Catches a pricing job that prepares the request again on whatever version is
    current by then: a release asked (without ``version``) while v1 was current must
    run on v1 even if v2 became current before its cost was known."""
    csv = "h\n" + "\n".join(str(150 + i % 40) for i in range(50)) + "\n"
    resp = api.upload(csv, HEIGHTS)
    assert resp.status_code == 201
    ds = resp.get_json()["id"]
    ledger = wiring.of(app).ledger
    config = app.config["PRIVRELEASE"]
    budget = 0.1 + (uuid.uuid4().int % 10**6) / 10**8  # fresh: its calibration is cold
    body = {"dataset_id": ds, "mechanism": "interval.case1",
            "params": {"column": "h", "calibrate": True},
            "budget": {"interval_leakage": budget}}
    shared = wiring.of(app).precomputed
    with pytest.raises(pricing.Unpriced) as cold, pricing.api_scope(config, shared):
        pricing.prepare(ledger, body, allow_seeds=True)
    assert cold.value.request.body["version"] == 1
    assert json.loads(cold.value.request.job().to_json())["dataset_version"] == 1
    assert _post_version(api, ds, csv, make_current="true").status_code == 201
    with pytest.raises(pricing.Unpriced) as again, pricing.api_scope(config, shared):
        # what the pricing job runs (it computes instead; the version is chosen first)
        pricing.prepare(ledger, cold.value.request.body, allow_seeds=True)
    assert again.value.request.dataset["version"] == 1


def test_a_document_from_before_versions_gets_its_next_version(
        api: Api, app: Flask) -> None:
    """Catches code that needs ``versions``/``current_version`` in the document: a
    dataset stored before versions existed (only ``version: 1``) takes a version 2 and
    lists both."""
    ds = _upload(api, 12)
    ledger = wiring.of(app).ledger
    raw = ledger.dataset_document(ds["id"])
    assert raw is not None
    doc = json.loads(raw)
    legacy = {k: v for k, v in doc.items()
              if k not in {"versions", "current_version", "sha256"}}
    record_state.write_document(ledger, ds["id"], json.dumps(legacy))
    assert json.loads(ledger.dataset_document(ds["id"]) or "") == legacy
    listed = api.get(f"/v1/datasets/{ds['id']}/versions").get_json()
    assert [(v["version"], v["current"], v["n_rows"]) for v in listed] == [(1, True, 12)]
    assert _post_version(api, ds["id"], people_csv(7), make_current="true").status_code == 201
    listed = api.get(f"/v1/datasets/{ds['id']}/versions").get_json()
    assert [(v["version"], v["current"], v["n_rows"]) for v in listed] == [
        (1, False, 12), (2, True, 7)]


def test_a_version_step_sent_twice_changes_the_document_once(app: Flask, api: Api) -> None:
    """Catches a re-sent version step (a lost reply, a failover) that reads its own
    Idempotency-Key as another upload's (the caller would then remove the files of the
    version it had just stored), or records a second event."""
    ds = _upload(api, 5)
    ledger = wiring.of(app).ledger
    raw = ledger.dataset_document(ds["id"])
    assert raw is not None
    doc = json.loads(raw)
    entry = {**datasets.version_entry(doc), "version": 2}
    new = json.dumps(datasets._version_doc(doc, entry, False))
    idem: dict[str, Any] = {"idempotency_key": f"{rkeys.P}idem:test:{ds['id']}",
                            "fingerprint": "fp", "idempotency_ttl": 60}
    events = len(ledger.events(ds["id"]))
    first = ledger.version_change(ds["id"], raw, new, "uploaded", 2, "t", **idem)
    again = ledger.version_change(ds["id"], raw, new, "uploaded", 2, "t", **idem)
    assert first == again == ("ok", 2)
    assert len(ledger.events(ds["id"])) == events + 1
    assert ledger.dataset_document(ds["id"]) == new
    other = ledger.version_change(ds["id"], raw, new + " ", "uploaded", 3, "t", **idem)
    assert other == ("idempotent", 2)
