"""Registering a dataset (and a new version) by reference to Parquet already in storage
(issue #30 item 2, ``service.sources``): real S3 (moto's server on loopback) and a real
local directory, the session's app with source roots configured.

The stored version is compared with what uploading the same Parquet gives; sources
outside the roots are refused before anything is read; an object changed while it is
read refuses the registration and leaves nothing; bad cells are refused with the
upload's own messages, prefixed with the object's key.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flask import Flask

from service import budget, datasets, sources, wiring
from service.ingest import parse_metadata
from service.storage.dataset_files import MANIFEST
from tests.conftest import ROOT, S3Server
from tests.integration.conftest import PEOPLE_META, Api

GROUPS = ["a", "b", "c"]


def _table(start: int, n: int) -> pa.Table:
    """Rows ``start`` .. ``start + n`` of a people table (deterministic)."""
    i = np.arange(start, start + n)
    return pa.table({"age": pa.array(20 + i % 50, pa.int64()),
                     "income": pa.array((i * 37) % 1000 + 0.5, pa.float64()),
                     "group": pa.array([GROUPS[k % 3] for k in i], pa.string())})


def _parquet(table: pa.Table, row_group_size: int | None = None) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


@dataclasses.dataclass
class Rig:
    api: Api
    app: Flask
    s3: Any  # boto3 client
    bucket: str
    prefix: str  # the S3 root's prefix
    local: Path  # the local root

    def put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=body)

    def s3_url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}" + (f"/{key}" if key else "")

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        """A JSON body as written (Flask's test client would sort its keys, and so the
        metadata's columns)."""
        return self.api.client.post(path, data=json.dumps(body), content_type="application/json",
                                    headers={"Authorization": f"Bearer {self.api.token}",
                                             **(headers or {})})

    def register(self, source: str, metadata: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> Any:
        return self.post("/v1/datasets", {"source": source,
                                          "metadata": metadata or PEOPLE_META}, headers)

    def upload_parquet(self, body: bytes, metadata: dict[str, Any] | None = None) -> Any:
        data = {"metadata": json.dumps(metadata or PEOPLE_META),
                "file": (io.BytesIO(body), "data.parquet")}
        return self.api.client.post("/v1/datasets", data=data, content_type="multipart/form-data",
                                    headers={"Authorization": f"Bearer {self.api.token}"})

    def load(self, dataset_id: str, version: int = 1) -> tuple[dict[str, Any], dict[str, Any]]:
        return wiring.of(self.app).datasets.load(dataset_id, version)

    def stored(self) -> set[str]:
        return set(wiring.of(self.app).datasets.objects.list("datasets/"))


@pytest.fixture()
def rig(app: Flask, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> Iterator[Rig]:
    """The session's app (its store: the data directory) allowed to read sources under a
    fresh S3 prefix and a fresh local folder."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    prefix = "exports-" + uuid.uuid4().hex[:12]
    local = tmp_path / "sources"
    local.mkdir()
    config = dataclasses.replace(
        app.config["PRIVRELEASE"], s3_endpoint_url=s3_server.endpoint_url,
        source_roots=(f"s3://{s3_server.bucket}/{prefix}", local.as_uri()),
        max_source_files=50)
    monkeypatch.setitem(app.config, "PRIVRELEASE", config)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1",
                          aws_access_key_id=s3_server.access_key,
                          aws_secret_access_key=s3_server.secret_key)
    yield Rig(Api(app.test_client()), app, client, s3_server.bucket, prefix, local)


def _equal_columns(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert np.array_equal(a[name], b[name]), name


# -- registering ---------------------------------------------------------------------


def test_an_s3_prefix_of_several_files_registers_as_its_upload_would(rig: Rig) -> None:
    parts = [_table(0, 700), _table(700, 0), _table(700, 1500), _table(2200, 300)]
    for k, part in enumerate(parts):
        rig.put(f"people/part-{k:05d}.parquet", _parquet(part, row_group_size=400))
    rig.put("people/_SUCCESS", b"")
    resp = rig.register(rig.s3_url("people"))
    assert resp.status_code == 201, resp.get_json()
    doc = resp.get_json()
    assert resp.headers["Location"] == f"/v1/datasets/{doc['id']}"
    assert doc["n_rows"] == 2500 and doc["version"] == 1
    assert doc["warnings"] == [{
        "code": "skipped_objects", "count": 1, "names": ["_SUCCESS"],
        "message": "objects whose name has a segment starting with '_' or '.' were skipped"
                   " (hidden files: markers, checksums); the version's manifest lists them"
                   " all"}]
    # what the whole table uploaded as one Parquet file stores
    whole = rig.upload_parquet(_parquet(pa.concat_tables(parts)))
    assert whole.status_code == 201, whole.get_json()
    manifest, columns = rig.load(doc["id"])
    _, uploaded = rig.load(whole.get_json()["id"])
    _equal_columns(columns, uploaded)
    # pinned as read: key, size and ETag of every Parquet object, in key order
    pins = manifest["source"]["pins"]
    assert [p["key"] for p in pins] == [f"part-{k:05d}.parquet" for k in range(4)]
    for pin in pins:
        head = rig.s3.head_object(Bucket=rig.bucket, Key=f"{rig.prefix}/people/{pin['key']}")
        assert (pin["size"], pin["etag"]) == (head["ContentLength"], head["ETag"].strip('"'))
        assert "version_id" not in pin  # the bucket keeps no versions
    assert manifest["source"]["skipped_keys"] == ["_SUCCESS"]
    summary = doc["source"]
    assert summary["url"] == rig.s3_url("people") and summary["objects"] == 4
    assert summary["bytes"] == sum(p["size"] for p in pins) and summary["skipped"] == 1
    shown = rig.api.get(f"/v1/datasets/{doc['id']}/versions/1").get_json()
    assert shown["source"] == summary


def test_a_local_folder_registers_and_a_new_version_by_reference(rig: Rig) -> None:
    folder = rig.local / "people"
    (folder / "2024").mkdir(parents=True)
    (folder / "2025").mkdir()
    pq.write_table(_table(0, 300), folder / "2024" / "a.parquet")
    pq.write_table(_table(300, 200), folder / "2025" / "a.parquet")
    resp = rig.register((folder).as_uri())
    assert resp.status_code == 201, resp.get_json()
    doc = resp.get_json()
    assert doc["n_rows"] == 500 and "warnings" not in doc
    _, columns = rig.load(doc["id"])
    _, uploaded = rig.load(rig.upload_parquet(
        _parquet(pa.concat_tables([_table(0, 300), _table(300, 200)]))).get_json()["id"])
    _equal_columns(columns, uploaded)

    # one file, as a new version, with changed bounds (declared compatible)
    pq.write_table(_table(1000, 50), rig.local / "fresh.parquet")
    meta = json.loads(json.dumps(PEOPLE_META))
    meta["columns"]["age"]["bounds"] = [0, 120]
    path = f"/v1/datasets/{doc['id']}/versions"
    body = {"source": (rig.local / "fresh.parquet").as_uri(), "metadata": meta,
            "compatible": True, "make_current": True}
    made = rig.post(path, body, {"Idempotency-Key": "fresh-version"})
    assert made.status_code == 201, made.get_json()
    version = made.get_json()
    assert version["version"] == 2 and version["current"] and version["n_rows"] == 50
    assert version["columns"]["age"]["bounds"] == [0, 120]
    assert version["source"]["objects"] == 1
    assert made.headers["Location"] == f"{path}/2"
    _, v2 = rig.load(doc["id"], 2)
    _equal_columns(v2, rig.load(rig.upload_parquet(_parquet(_table(1000, 50)))
                                .get_json()["id"])[1])
    # the same key again: the same version, nothing scanned or stored again
    again = rig.post(path, body, {"Idempotency-Key": "fresh-version"})
    assert again.status_code == 201 and again.get_json()["version"] == 2
    other = rig.post(path, {**body, "make_current": False},
                         {"Idempotency-Key": "fresh-version"})
    assert other.status_code == 422 and other.get_json()["code"] == "idempotency_mismatch"
    assert wiring.of(rig.app).datasets.versions(doc["id"]) == [1, 2]


def test_an_idempotent_registration_is_answered_once(rig: Rig) -> None:
    rig.put("one.parquet", _parquet(_table(0, 40)))
    first = rig.register(rig.s3_url("one.parquet"), headers={"Idempotency-Key": "by-ref-1"})
    second = rig.register(rig.s3_url("one.parquet"), headers={"Idempotency-Key": "by-ref-1"})
    assert first.status_code == second.status_code == 201
    assert first.get_json()["id"] == second.get_json()["id"]
    upload = rig.upload_parquet(_parquet(_table(0, 40)))
    assert upload.status_code == 201
    mixed = rig.api.client.post(
        "/v1/datasets", data={"metadata": json.dumps(PEOPLE_META),
                              "file": (io.BytesIO(_parquet(_table(0, 40))), "d.parquet")},
        content_type="multipart/form-data",
        headers={"Authorization": f"Bearer {rig.api.token}", "Idempotency-Key": "by-ref-1"})
    assert mixed.status_code == 422 and mixed.get_json()["code"] == "idempotency_mismatch"


def test_a_versioned_bucket_pins_the_version_ids(rig: Rig, s3_server: S3Server,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = "versioned-" + uuid.uuid4().hex[:8]
    rig.s3.create_bucket(Bucket=bucket)
    rig.s3.put_bucket_versioning(Bucket=bucket,
                                 VersioningConfiguration={"Status": "Enabled"})
    body = _parquet(_table(0, 60))
    put = rig.s3.put_object(Bucket=bucket, Key="x/a.parquet", Body=body)
    config = dataclasses.replace(rig.app.config["PRIVRELEASE"],
                                 source_roots=(f"s3://{bucket}/x",))
    monkeypatch.setitem(rig.app.config, "PRIVRELEASE", config)
    resp = rig.register(f"s3://{bucket}/x")
    assert resp.status_code == 201, resp.get_json()
    manifest, _ = rig.load(resp.get_json()["id"])
    assert manifest["source"]["pins"][0]["version_id"] == put["VersionId"]


# -- where a source may be -----------------------------------------------------------


def test_sources_outside_the_roots_are_refused_before_reading(rig: Rig, tmp_path: Path
                                                              ) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    pq.write_table(_table(0, 10), outside / "a.parquet")
    rig.s3.put_object(Bucket=rig.bucket, Key=f"{rig.prefix}2/a.parquet",
                      Body=_parquet(_table(0, 10)))
    (rig.local / "escape").symlink_to(outside, target_is_directory=True)
    sibling = Path(str(rig.local) + "2")
    sibling.mkdir()
    pq.write_table(_table(0, 10), sibling / "a.parquet")
    before = rig.stored()
    for url in [outside.as_uri(), (outside / "a.parquet").as_uri(),
                f"file://{rig.local}/escape", f"file://{rig.local}/escape/a.parquet",
                sibling.as_uri(), "file:///etc/passwd.parquet",
                f"s3://{rig.bucket}/{rig.prefix}2", f"s3://{rig.bucket}/{rig.prefix}2/a.parquet",
                f"s3://{rig.bucket}", f"s3://other-bucket/{rig.prefix}/a.parquet"]:
        resp = rig.register(url)
        assert resp.status_code == 403, (url, resp.get_json())
        problem = resp.get_json()
        assert (problem["code"], problem["field"]) == ("source_not_allowed", "source"), url
        assert problem["detail"] == (f"source {url} is not under a source root the server"
                                     " allows (PRIVRELEASE_SOURCE_ROOTS)")
    for url in [f"file://{rig.local}/../elsewhere", f"file://{rig.local}/./x",
                f"s3://{rig.bucket}/{rig.prefix}/../{rig.prefix}2",
                f"s3://{rig.bucket}/{rig.prefix}//a.parquet",
                f"file://{rig.local}/%2e%2e/elsewhere", "http://example.com/a.parquet",
                "file://host/tmp/a.parquet", f"s3://{rig.bucket}/{rig.prefix}?x=1"]:
        resp = rig.register(url)
        assert resp.status_code == 422, (url, resp.get_json())
        assert resp.get_json()["code"] == "source_invalid", url
    # a symbolic link inside a source folder is refused, not followed
    folder = rig.local / "linked"
    folder.mkdir()
    pq.write_table(_table(0, 10), folder / "a.parquet")
    (folder / "b.parquet").symlink_to(outside / "a.parquet")
    resp = rig.register(folder.as_uri())
    assert resp.status_code == 422 and resp.get_json()["code"] == "source_invalid"
    assert resp.get_json()["detail"] == (
        f"b.parquet in source {folder.as_uri()} is a symbolic link: a source folder holds"
        " regular files and folders only")
    assert rig.stored() == before


def test_registering_by_reference_is_off_without_roots(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    pq.write_table(_table(0, 10), rig.local / "a.parquet")
    config = dataclasses.replace(rig.app.config["PRIVRELEASE"], source_roots=())
    monkeypatch.setitem(rig.app.config, "PRIVRELEASE", config)
    resp = rig.register((rig.local / "a.parquet").as_uri())
    assert resp.status_code == 403
    assert resp.get_json()["code"] == "source_not_allowed"
    assert "PRIVRELEASE_SOURCE_ROOTS" in resp.get_json()["detail"]


def test_missing_other_and_too_many_objects_are_refused(rig: Rig) -> None:
    before = rig.stored()
    url = rig.s3_url("nothing-here")
    resp = rig.register(url)
    assert resp.status_code == 422
    assert resp.get_json()["code"] == "source_not_found"
    assert resp.get_json()["detail"] == f"no Parquet object at or under {url}"
    missing = (rig.local / "gone.parquet").as_uri()
    assert rig.register(missing).get_json()["detail"] == (
        f"no Parquet object at or under {missing}")
    rig.put("mixed/a.parquet", _parquet(_table(0, 10)))
    rig.put("mixed/notes.csv", b"age\n1\n")
    resp = rig.register(rig.s3_url("mixed"))
    assert resp.status_code == 422 and resp.get_json()["code"] == "source_invalid"
    assert resp.get_json()["detail"].startswith(
        f"notes.csv in source {rig.s3_url('mixed')} is not a .parquet file")
    for k in range(51):  # the rig allows 50 objects a source
        rig.put(f"many/p{k:03d}.parquet", b"x")
    resp = rig.register(rig.s3_url("many"))
    assert resp.status_code == 422
    assert resp.get_json()["detail"] == (f"source {rig.s3_url('many')} holds more than 50"
                                         " objects (PRIVRELEASE_MAX_SOURCE_FILES)")
    assert rig.stored() == before


def test_a_bucket_the_store_refuses_is_422_without_its_answer(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = "no-such-bucket-" + uuid.uuid4().hex[:8]
    config = dataclasses.replace(rig.app.config["PRIVRELEASE"],
                                 source_roots=(f"s3://{bucket}/exports",))
    monkeypatch.setitem(rig.app.config, "PRIVRELEASE", config)
    url = f"s3://{bucket}/exports/people"
    resp = rig.register(url)
    assert resp.status_code == 422, resp.get_json()
    assert (resp.get_json()["code"], resp.get_json()["detail"]) == (
        "source_unreadable", f"source {url} cannot be read: the store refused (no such"
        " bucket, or no permission)")
    assert "127.0.0.1" not in resp.get_data(as_text=True)
    # a HEAD's 404 does not say whether the bucket or the object is missing
    url = f"s3://{bucket}/exports/a.parquet"
    assert rig.register(url).get_json()["code"] == "source_not_found"


def test_bad_cells_are_refused_with_the_uploads_messages(rig: Rig) -> None:
    bad = _table(0, 30).to_pydict()
    bad["age"][11] = 1000  # out of bounds in row 12 of the second object
    bad_body = _parquet(pa.table(bad, schema=_table(0, 1).schema))
    rig.put("bad/p0.parquet", _parquet(_table(0, 20)))
    rig.put("bad/p1.parquet", bad_body)
    rig.put("bad/p2.parquet", b"PAR1 not really")
    before = rig.stored()
    resp = rig.register(rig.s3_url("bad"))
    assert resp.status_code == 422
    upload = rig.upload_parquet(bad_body).get_json()
    problem = resp.get_json()
    assert upload["detail"] == "column 'age', row 12: value outside declared bounds [0, 100]"
    assert (problem["field"], problem["detail"]) == (
        "source.columns.age", f"p1.parquet: {upload['detail']}")
    assert "1000" not in json.dumps(problem)
    resp = rig.register(rig.s3_url("bad/p2.parquet"))
    assert resp.get_json()["detail"] == "p2.parquet: not a readable Parquet file"
    renamed = pa.table({"years": [1], "income": [1.0], "group": ["a"]})
    rig.put("names.parquet", _parquet(renamed))
    resp = rig.register(rig.s3_url("names.parquet")).get_json()
    assert resp["detail"] == ("names.parquet: declared column 'age' is missing from the"
                              " Parquet schema")
    assert rig.stored() == before
    # bad metadata: as an upload's, before the source is read
    meta = {**PEOPLE_META, "columns": {"age": {"type": "integer"}}}
    resp = rig.register(rig.s3_url("bad"), meta)
    assert resp.status_code == 422 and resp.get_json()["field"].startswith("metadata.columns")
    for body in [{"source": rig.s3_url("bad")}, {"source": 3, "metadata": PEOPLE_META},
                 {"source": rig.s3_url("bad"), "metadata": PEOPLE_META, "file": "x"}]:
        resp = rig.post("/v1/datasets", body)
        assert resp.status_code == 422 and resp.get_json()["code"] == "validation_error"
    dup = ('{"source": ' + json.dumps(rig.s3_url("bad"))
           + ', "metadata": {"name": "x", "columns": {"a": {}, "a": {}}}}')
    resp = rig.api.client.post("/v1/datasets", data=dup, content_type="application/json",
                               headers={"Authorization": f"Bearer {rig.api.token}"})
    assert resp.status_code == 422 and "duplicate key 'a'" in resp.get_json()["detail"]


# -- a source that changes ---------------------------------------------------------------


def _spec_and_caps() -> tuple[Any, dict[str, int]]:
    spec = parse_metadata(PEOPLE_META)
    return spec, budget.parse_caps(spec.budgets, list(spec.columns))


@pytest.mark.parametrize("where", ["s3", "local"])
def test_an_object_changed_while_it_is_read_is_refused_and_nothing_stays(
        rig: Rig, where: str) -> None:
    """The change is made by the test between two chunks of the object's scan: the
    registration consumes the scan's chunks through a generator that overwrites the
    object once it has handed on the first chunk (a real second write to the store, no
    wrapper around the reads)."""
    rows = 3 * (1 << 16)  # three chunks of the scan
    body = _parquet(_table(0, rows))
    if where == "s3":
        rig.put("moving/a.parquet", _parquet(_table(0, 10)))
        rig.put("moving/b.parquet", body)
        url = rig.s3_url("moving")

        def change() -> None:
            rig.put("moving/b.parquet", _parquet(_table(5, rows)))
    else:
        folder = rig.local / "moving"
        folder.mkdir()
        pq.write_table(_table(0, 10), folder / "a.parquet")
        (folder / "b.parquet").write_bytes(body)
        url = folder.as_uri()

        def change() -> None:
            (folder / "b.tmp").write_bytes(_parquet(_table(5, rows)))
            os.replace(folder / "b.tmp", folder / "b.parquet")
    config = rig.app.config["PRIVRELEASE"]
    scan = sources.Scan(sources.resolve(url, config.source_roots,
                                        endpoint=config.s3_endpoint_url, max_files=50),
                        parse_metadata(PEOPLE_META), config.max_rows)

    def chunks() -> Iterator[dict[str, Any]]:
        for n, chunk in enumerate(scan.chunks()):
            yield chunk
            if n == 1:  # the first object's one chunk, then the second's first
                change()

    svc = wiring.of(rig.app)
    spec, caps = _spec_and_caps()
    before, listed = rig.stored(), svc.ledger.datasets_page(1000, None, None)[0]
    with pytest.raises(sources.SourceError) as caught:
        datasets.register(svc.datasets, svc.ledger, spec, caps, chunks(), "tests",
                          source=scan)
    err = caught.value
    assert (err.status, err.code) == (409, "source_changed")
    assert err.message == (f"b.parquet in source {url} changed while it was read (its"
                           " size, ETag or version is not the one first read): nothing"
                           " was stored; register it once it is stable")
    assert rig.stored() == before
    assert svc.ledger.datasets_page(1000, None, None)[0] == listed
    # registered again once it is stable: a version of what is there now
    resp = rig.register(url)
    assert resp.status_code == 201, resp.get_json()
    _, columns = rig.load(resp.get_json()["id"])
    assert np.array_equal(columns["age"][10:], np.asarray(_table(5, rows)["age"]))


def test_a_file_or_folder_swapped_for_a_link_after_the_listing_is_never_read(
        rig: Rig, tmp_path: Path) -> None:
    """A local source is listed, then a file of it (or a folder above one) is replaced
    by a link out of the root before the scan reads it: refused as changed, and nothing
    of the file the link names is read into a version."""
    outside = tmp_path / "secret"
    outside.mkdir()
    pq.write_table(_table(0, 10), outside / "a.parquet")
    folder = rig.local / "swap"
    (folder / "sub").mkdir(parents=True)
    config = rig.app.config["PRIVRELEASE"]

    def scan() -> sources.Scan:
        pq.write_table(_table(0, 10), folder / "sub" / "a.parquet")
        return sources.Scan(sources.resolve(folder.as_uri(), config.source_roots,
                                            endpoint=None, max_files=50),
                            parse_metadata(PEOPLE_META), config.max_rows)

    def refused(current: sources.Scan) -> None:
        with pytest.raises(sources.SourceError) as caught:
            list(current.chunks())
        assert (caught.value.status, caught.value.code) == (409, "source_changed")
        assert current.pins == []

    listed = scan()  # the file swapped for a link
    (folder / "sub" / "a.parquet").unlink()
    (folder / "sub" / "a.parquet").symlink_to(outside / "a.parquet")
    refused(listed)
    (folder / "sub" / "a.parquet").unlink()
    listed = scan()  # the folder above it swapped for a link
    (folder / "sub").rename(folder / "old")
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    refused(listed)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_source_store_that_is_away_is_503_and_leaves_nothing(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    config = dataclasses.replace(rig.app.config["PRIVRELEASE"],
                                 s3_endpoint_url=f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setitem(rig.app.config, "PRIVRELEASE", config)
    before = rig.stored()
    resp = rig.register(rig.s3_url("people"))
    assert resp.status_code == 503, resp.get_json()
    assert resp.get_json()["code"] == "storage_unavailable"
    assert "127.0.0.1" not in resp.get_data(as_text=True)
    assert rig.stored() == before


def test_the_manifest_pins_are_in_the_stored_version(rig: Rig) -> None:
    """The pins live in the version's manifest object, the document has their digest."""
    rig.put("pinned/a.parquet", _parquet(_table(0, 25)))
    doc = rig.register(rig.s3_url("pinned")).get_json()
    raw = wiring.of(rig.app).datasets.objects.get(f"datasets/{doc['id']}/v1/{MANIFEST}")
    stored = json.loads(raw)["manifest"]["source"]
    assert stored["pins_sha256"] == doc["source"]["pins_sha256"]
    assert len(stored["pins"]) == 1 and stored["url"] == rig.s3_url("pinned")


# -- memory ----------------------------------------------------------------------------


#: run in a fresh interpreter, so Arrow's pool peak (``max_memory``) is the scan's alone
PEAK_SCRIPT = """
import sys, tracemalloc
from pathlib import Path
import pyarrow as pa
from service import sources
from service.ingest import parse_metadata
from service.storage.dataset_files import DatasetStore
from service.storage.objects import LocalStore
from tests.integration.conftest import PEOPLE_META
root, out = Path(sys.argv[1]), Path(sys.argv[2])
store = DatasetStore(LocalStore(out), staging_dir=out / ".staging")
tracemalloc.start()
scan = sources.Scan(sources.resolve(root.as_uri(), [root.as_uri()], endpoint=None,
                                    max_files=100),
                    parse_metadata(PEOPLE_META), 10**8)
with store.staging() as staged:
    for chunk in scan.chunks():
        staged.append(chunk)
    staged.commit("ds_big", 1, {"source": scan.record()})
print(tracemalloc.get_traced_memory()[1], pa.default_memory_pool().max_memory(),
      staged.n_rows)
"""


def write_source(folder: Path, files: int, rows: int) -> None:
    """``files`` Parquet files of ``rows`` rows each (row groups of 1 Mi rows, snappy, as
    writers make them), written a row group at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    schema = _table(0, 1).schema
    for k in range(files):
        with pq.ParquetWriter(folder / f"part-{k:05d}.parquet", schema) as writer:
            for start in range(0, rows, 1 << 20):
                writer.write_table(_table(k * rows + start, min(1 << 20, rows - start)))


def peak(root: Path, out: Path) -> tuple[int, int, int]:
    """(Python's peak, Arrow's pool peak, rows) of a registration scan of ``root``."""
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(root), str(out)],
                          cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    python, arrow, rows = map(int, proc.stdout.split())
    return python, arrow, rows


def test_a_multi_file_source_registers_in_bounded_memory(tmp_path: Path) -> None:
    """3,000,000 rows in three files (72 MB of values as the version stores them): the
    scan's peak allocation, Python's and Arrow's, is a few chunks, not the rows."""
    write_source(tmp_path / "src", files=3, rows=1_000_000)
    python, arrow, rows = peak(tmp_path / "src", tmp_path / "out")
    assert rows == 3_000_000
    assert python + arrow < 24 << 20, (python, arrow)  # measured: 4.2 MB + 4.2 MB


def test_the_openapi_document_has_both_bodies(rig: Rig) -> None:
    """Both endpoints document the multipart upload and the JSON body by reference, and
    the statuses a registration by reference answers."""
    spec = rig.api.client.get("/openapi.json").get_json()
    for path, required in [("/v1/datasets", ["source", "metadata"]),
                           ("/v1/datasets/{dataset_id}/versions", ["source"])]:
        op = spec["paths"][path]["post"]
        content = op["requestBody"]["content"]
        assert list(content) == ["multipart/form-data", "application/json"], path
        body = content["application/json"]["schema"]
        assert body["required"] == required and body["additionalProperties"] is False
        assert body["properties"]["source"]["format"] == "uri"
        assert body["properties"]["metadata"] == {"$ref": "#/components/schemas/DatasetMetadata"}
        assert {"403", "409", "422", "503"} <= set(op["responses"]), path
    example = spec["paths"]["/v1/datasets"]["post"]["requestBody"]["content"][
        "application/json"]["example"]
    assert example["source"].startswith("s3://") and "columns" in example["metadata"]
