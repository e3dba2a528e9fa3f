"""The service on an S3-compatible object store (``PRIVRELEASE_STORAGE_URL=s3://...``,
moto's server on loopback): uploads become Parquet objects in the bucket and nothing in
the data directory but the staging folder, releases read them and store their tables
there, ``/data`` serves a table from the bucket; with the server away an upload answers
503 and leaves nothing.

The app has a data directory, a Valkey database and (on PostgreSQL) a database of its
own, and runs its releases in this process (``run.execute``), so no worker of the
session (on the session's file store) takes them.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from service import apikeys, wiring
from service.api.app import create_app
from service.releases import run
from service.storage.objects import S3Store
from tests.conftest import S3Server
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.record_state import close, own_database

DB = 15


@pytest.fixture()
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The AWS variables the service's S3 clients read (moto takes any key pair)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return s3_server


def _app(app: Flask, tmp_path: Path, request: pytest.FixtureRequest, url: str,
         endpoint: str) -> Flask:
    config = dataclasses.replace(
        app.config["PRIVRELEASE"], data_dir=tmp_path, storage_url=url,
        s3_endpoint_url=endpoint,
        redis_url=app.config["PRIVRELEASE"].redis_url.rsplit("/", 1)[0] + f"/{DB}",
        database_url=own_database(request))
    flask_app = create_app(config)
    wiring.of(flask_app).client.flushdb()
    apikeys.create(wiring.of(flask_app).keys, "operator", "tests", token=TOKEN)
    return flask_app


@pytest.fixture()
def rig(app: Flask, tmp_path: Path, request: pytest.FixtureRequest, s3_env: S3Server
        ) -> Iterator[dict[str, Any]]:
    prefix = "svc-" + uuid.uuid4().hex
    flask_app = _app(app, tmp_path, request, f"s3://{s3_env.bucket}/{prefix}",
                     s3_env.endpoint_url)
    try:
        yield {"app": flask_app, "api": Api(flask_app.test_client()), "data_dir": tmp_path}
    finally:
        wiring.of(flask_app).client.flushdb()
        close(flask_app)


def test_uploads_releases_and_tables_live_in_the_bucket(rig: dict[str, Any]) -> None:
    api, svc, data_dir = rig["api"], wiring.of(rig["app"]), rig["data_dir"]
    objects = svc.datasets.objects
    assert isinstance(objects, S3Store)
    upload = api.upload(people_csv(300), PEOPLE_META)
    assert upload.status_code == 201, upload.get_json()
    ds = upload.get_json()["id"]
    assert list(objects.list(f"datasets/{ds}/")) == [
        f"datasets/{ds}/v1/data.parquet", f"datasets/{ds}/v1/manifest.json",
        f"datasets/{ds}/v1/row_key"]
    assert not (data_dir / "datasets").exists()
    assert not any((data_dir / ".staging").iterdir())
    _, columns = svc.datasets.load(ds, 1)
    assert len(columns["age"]) == 300

    summary = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "laplace",
                                        "budget": {"epsilon": 0.25},
                                        "params": {"statistic": "mean", "column": "age"}})
    assert summary.status_code == 202, summary.get_json()
    assert run.execute(svc, summary.get_json()["id"], "test-worker") == "succeeded"

    table = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "exm",
                                      "budget": {"epsilon": 0.25},
                                      "params": {"column": "group", "draws": 3}})
    assert table.status_code == 202, table.get_json()
    release_id = table.get_json()["id"]
    assert run.execute(svc, release_id, "test-worker") == "succeeded"
    assert [k.rsplit("/", 1)[-1] for k in objects.list(f"tables/{release_id}/")] == [
        "data.parquet", "manifest.json"]
    assert not (data_dir / "tables").exists()
    served = api.get(f"/v1/releases/{release_id}/data")
    assert served.status_code == 200 and served.mimetype == "text/csv"
    rows = list(csv.reader(io.StringIO(served.get_data(as_text=True))))
    assert len(rows) == 1 + 3


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_upload_while_the_store_is_away_is_503_and_leaves_nothing(
        app: Flask, tmp_path: Path, request: pytest.FixtureRequest, s3_env: S3Server) -> None:
    flask_app = _app(app, tmp_path, request, "s3://privrelease-tests/away",
                     f"http://127.0.0.1:{_closed_port()}")
    try:
        api = Api(flask_app.test_client())
        resp = api.upload(people_csv(50), PEOPLE_META)
        assert resp.status_code == 503, resp.get_json()
        assert resp.get_json()["code"] == "storage_unavailable"
        assert resp.headers["Retry-After"]
        assert "127.0.0.1" not in resp.get_data(as_text=True)
        assert not any((tmp_path / ".staging").iterdir())
        assert api.get("/v1/datasets").get_json() == []
    finally:
        wiring.of(flask_app).client.flushdb()
        close(flask_app)
