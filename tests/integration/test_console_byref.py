"""The console's forms by reference (issue #30 item 2): "Register from the store" on the
datasets page and "A new version from the store" on a dataset's page run the API's own
routes in-process, post/redirect/get, and carry an idempotency key, so a form posted twice
(a reload of an answer, a second click) registers once. Errors are the API's own detail
and field, shown with what was typed. The session's app, allowed to read a fresh local
folder (its ``PRIVRELEASE_SOURCE_ROOTS``)."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape

from service import apikeys
from service.storage.keys import KeyStore
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.test_byref import _table
from tests.integration.test_console import _csrf, _signed_in

META = json.dumps(PEOPLE_META, indent=2)
KEY = re.compile(r'name="idempotency_key" value="([0-9a-f]{32})"')


@pytest.fixture()
def folder(app: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A source root of the session's app for this test (a fresh folder)."""
    root = tmp_path / "sources"
    root.mkdir()
    config = dataclasses.replace(app.config["PRIVRELEASE"], source_roots=(root.as_uri(),))
    monkeypatch.setitem(app.config, "PRIVRELEASE", config)
    return root


def _people(folder: Path, name: str, *sizes: int) -> str:
    """Parquet files of PEOPLE_META's columns under ``folder/name``: its URL."""
    (folder / name).mkdir()
    start = 0
    for k, n in enumerate(sizes):
        pq.write_table(_table(start, n), folder / name / f"part-{k}.parquet")
        start += n
    return (folder / name).as_uri()


def _register(client: FlaskClient, **fields: str) -> Any:
    return client.post("/console/datasets/register", data={
        "csrf_token": _csrf(client, "/console/datasets"), **fields})


def _register_version(client: FlaskClient, dataset_id: str, **fields: str) -> Any:
    path = f"/console/datasets/{dataset_id}"
    return client.post(f"{path}/versions/register", data={
        "csrf_token": _csrf(client, path), **fields})


def _ids(api: Api) -> set[str]:
    """The newest datasets' ids (newest first: a registration appears among them)."""
    return {d["id"] for d in api.get("/v1/datasets?limit=20").get_json()}


def test_register_from_the_store_once_per_form(app: Flask, api: Api, folder: Path) -> None:
    """Catches a form that registers twice when posted twice (a reload of its answer,
    a double click), drops the metadata, or answers without a redirect: the form's key
    is new on every page, the second post redirects to the same dataset, and the
    versions table says where the version was read from."""
    # 207 rows: a shape no other test of the session registers (a same-shape dataset
    # earlier would make the answer the one-time re-upload warning, not a redirect)
    source = _people(folder, "people", 121, 86)
    client = _signed_in(app, TOKEN)
    page = client.get("/console/datasets").get_data(as_text=True)
    assert 'id="register-form"' in page and 'id="source-metadata"' in page
    keys = KEY.findall(page)
    assert len(keys) == 2 and len(set(keys + KEY.findall(client.get(
        "/console/datasets").get_data(as_text=True)))) == 4  # every form, every page
    before = _ids(api)
    first = _register(client, source=source, metadata=META, idempotency_key=keys[1])
    assert first.status_code == 302, first.get_data(as_text=True)
    again = _register(client, source=source, metadata=META, idempotency_key=keys[1])
    assert again.status_code == 302 and again.location == first.location
    made = _ids(api) - before
    assert len(made) == 1 and first.location.endswith(f"/console/datasets/{made.pop()}")
    shown = client.get(first.location).get_data(as_text=True)
    assert "207 rows" in shown and f"<code>{source}</code> · 2 objects" in shown
    other = _register(client, source=source, metadata=META.replace('"people"', '"other"'),
                      idempotency_key=keys[1])
    assert other.status_code == 422 and "idempotency" in other.get_data(as_text=True)
    assert len(_ids(api) - before) == 1


def test_register_errors_are_the_apis_with_what_was_typed(app: Flask, api: Api,
                                                          folder: Path, tmp_path: Path
                                                          ) -> None:
    """A source outside the roots (the API's 403), metadata that is not JSON or gives a
    key twice (422, field metadata) and a folder without Parquet (422): the API's detail
    and field for the same input, the typed source and metadata kept, nothing
    registered (catches a form that words errors itself or forgets what was typed)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    pq.write_table(_table(0, 10), outside / "x.parquet")
    (folder / "empty").mkdir()
    client = _signed_in(app, TOKEN)
    before = _ids(api)
    duplicate = '{"name": "a", "name": "b"}'
    for source, metadata in [(outside.as_uri(), META), (_people(folder, "p", 5), "{oops"),
                             ((folder / "p").as_uri(), duplicate),
                             ((folder / "empty").as_uri(), META)]:
        resp = _register(client, source=source, metadata=metadata, idempotency_key="k" * 8)
        page = resp.get_data(as_text=True)
        if metadata in ("{oops", duplicate):  # the API judges a body, the form a field
            assert resp.status_code == 422 and 'id="problem-field">metadata<' in page
        else:
            expected = api.post("/v1/datasets", {"source": source,
                                                 "metadata": PEOPLE_META}).get_json()
            assert resp.status_code == expected["status"], page
            assert str(escape(expected["detail"])) in page
            assert f'id="problem-field">{expected["field"]}<' in page
        assert f'value="{escape(source)}"' in page and str(escape(metadata)) in page
    assert _ids(api) == before


def test_a_new_version_from_the_store_once_per_form(app: Flask, api: Api,
                                                    folder: Path) -> None:
    """The dataset page's form by reference: a version made current, posted twice under
    one key (one version), changed metadata without ``compatible`` refused with the API's
    field, and the upload form's key answering a second post of the same file once."""
    ds = api.upload(people_csv(50), PEOPLE_META).get_json()["id"]
    source = _people(folder, "v2", 60)
    client = _signed_in(app, TOKEN)
    page = client.get(f"/console/datasets/{ds}").get_data(as_text=True)
    assert 'id="register-version-form"' in page and len(KEY.findall(page)) == 2
    fields = {"source": source, "make_current": "on", "idempotency_key": "v2-key"}
    for _ in range(2):
        resp = _register_version(client, ds, **fields)
        assert resp.status_code == 302, resp.get_data(as_text=True)
    versions = api.get(f"/v1/datasets/{ds}/versions").get_json()
    assert [(v["version"], v["n_rows"], v["current"]) for v in versions] == [
        (1, 50, False), (2, 60, True)]
    assert versions[1]["source"]["url"] == source
    refused = _register_version(client, ds, source=source, metadata=META,
                                idempotency_key="v3-key")
    page = refused.get_data(as_text=True)
    assert refused.status_code == 422 and 'id="problem-field">compatible<' in page
    assert f'value="{escape(source)}"' in page

    path = f"/console/datasets/{ds}"
    upload = {"file": people_csv(30), "idempotency_key": "v3-upload"}
    for _ in range(2):
        resp = client.post(f"{path}/versions", content_type="multipart/form-data", data={
            "csrf_token": _csrf(client, path), **upload,
            "file": (io.BytesIO(upload["file"].encode()), "v.csv")})
        assert resp.status_code == 302, resp.get_data(as_text=True)
    assert [v["version"] for v in api.get(f"/v1/datasets/{ds}/versions").get_json()] == [
        1, 2, 3]


def test_the_forms_by_reference_are_for_operators_only(app: Flask, api: Api, keys: KeyStore,
                                                       folder: Path) -> None:
    ds = api.upload(people_csv(20), PEOPLE_META).get_json()["id"]
    source = _people(folder, "no", 10)
    client = _signed_in(app, apikeys.create(keys, "analyst", label="no-byref")[1])
    assert 'id="register-form"' not in client.get("/console/datasets").get_data(as_text=True)
    assert 'id="register-version-form"' not in client.get(
        f"/console/datasets/{ds}").get_data(as_text=True)
    before = _ids(api)
    assert _register(client, source=source, metadata=META).status_code == 403
    assert _register_version(client, ds, source=source).status_code == 403
    assert _ids(api) == before and len(api.get(f"/v1/datasets/{ds}/versions").get_json()) == 1
