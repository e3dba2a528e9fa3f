"""An infrastructure fault never burns budget (issue #29 item 6).

With the release documents' folder full or read-only, main answered 202 and later
charged the releases, failed with no output (49 of 65 releases, 0.51 epsilon): the run
found out it could not store its output only after it had read the data, when the
failure rule charges. Now the POST answers 507 (full) or 503 (unavailable) and spends
nothing, and a run that meets a store gone bad after its POST finds out before it reads
the data (``OutputStore.preflight``: tables go to the object store), so it is refunded.

The release folder and the object store are on a small tmpfs of their own (the tests run
as root, as CI does); the app has a data directory, a Valkey database and (on PostgreSQL)
a database of its own, and runs its releases in this process (``run.execute``), so no
worker of the session takes them.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from service import apikeys, wiring
from service.api.app import create_app
from service.releases import run
from service.storage.store import ReleaseView
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.record_state import close, field, own_database

DB = 10
SMALL_FS = "4m"


def _mount(path: Path, options: str) -> None:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"mounting a tmpfs needs root (as CI runs): {done.stderr}"


def _fill(path: Path) -> None:
    """Write under ``path`` until its file system is full."""
    with open(path / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(bytes(1 << 16))
        except OSError as err:
            assert err.errno == errno.ENOSPC


@pytest.fixture()
def rig(app: Flask, tmp_path: Path, request: pytest.FixtureRequest
        ) -> Iterator[dict[str, Any]]:
    """An app whose release folder is a 4 MiB tmpfs."""
    config = dataclasses.replace(
        app.config["PRIVRELEASE"], data_dir=tmp_path,
        redis_url=app.config["PRIVRELEASE"].redis_url.rsplit("/", 1)[0] + f"/{DB}",
        database_url=own_database(request))
    releases = config.releases_dir
    releases.mkdir(parents=True)
    _mount(releases, f"size={SMALL_FS}")
    # the object store (datasets and release tables) on the same small file system
    config = dataclasses.replace(config, storage_url=(releases / "objects").as_uri())
    try:
        flask_app = create_app(config)
        client = wiring.of(flask_app).client
        client.flushdb()
        apikeys.create(wiring.of(flask_app).keys, "operator", "tests", token=TOKEN)
        api = Api(flask_app.test_client())
        upload = api.upload(people_csv(), PEOPLE_META)
        assert upload.status_code == 201, upload.get_json()
        yield {"app": flask_app, "api": api, "releases": releases,
               "dataset": upload.get_json()["id"]}
        client.flushdb()
        close(flask_app)
    finally:
        subprocess.run(["umount", "-l", str(releases)], check=True)


def _body(ds: str) -> dict[str, Any]:
    return {"dataset_id": ds, "mechanism": "laplace", "budget": {"epsilon": 0.25},
            "params": {"statistic": "mean", "column": "age"}}


def _table_body(ds: str) -> dict[str, Any]:
    """A release whose run writes a table (exm's draws), a file in the output store."""
    return {"dataset_id": ds, "mechanism": "exm", "budget": {"epsilon": 0.25},
            "params": {"column": "group", "draws": 3}}


def _epsilon(api: Api, ds: str) -> dict[str, float]:
    row: dict[str, float] = api.get(f"/v1/datasets/{ds}/budget").get_json()[
        "measures"]["epsilon"]
    return row


def test_a_full_or_read_only_output_store_is_refused_at_the_post(
        rig: dict[str, Any]) -> None:
    """A release that writes a table is refused while the store could not take it; a
    summary, whose output goes into the record, is accepted all the same."""
    api, ds, releases = rig["api"], rig["dataset"], rig["releases"]
    before = _epsilon(api, ds)
    _fill(releases)
    full = api.post("/v1/releases", _table_body(ds))
    assert (full.status_code, full.get_json()["code"]) == (507, "insufficient_storage")
    summary = api.post("/v1/releases", _body(ds))
    assert summary.status_code == 202, summary.get_json()
    os.remove(releases / "filler")
    subprocess.run(["mount", "-o", "remount,ro", str(releases)], check=True)
    down = api.post("/v1/releases", _table_body(ds))
    assert (down.status_code, down.get_json()["code"]) == (503, "storage_unavailable")
    assert down.headers["Retry-After"]
    held = _epsilon(api, ds)
    assert held["reserved"] == pytest.approx(before["reserved"] + 0.25)  # the summary's only
    assert held["committed"] == before["committed"]
    listed, _ = wiring.of(rig["app"]).ledger.release_page(
        ReleaseView("datasets", datasets=frozenset({ds})), 10)
    assert listed == [summary.get_json()["id"]]
    subprocess.run(["mount", "-o", "remount,rw", str(releases)], check=True)
    ok = api.post("/v1/releases", _table_body(ds))
    assert ok.status_code == 202, ok.get_json()


@pytest.fixture(params=["full", "read-only"])
def bad_store(rig: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    """A callable that makes the rig's release store full (or read-only) until the test
    ends."""
    releases, made = rig["releases"], []

    def spoil() -> None:
        if request.param == "full":
            _fill(releases)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(releases)], check=True)
        made.append(request.param)

    yield spoil
    if made == ["full"]:
        os.remove(releases / "filler")
    elif made == ["read-only"]:
        subprocess.run(["mount", "-o", "remount,rw", str(releases)], check=True)


def test_a_run_whose_output_store_went_bad_is_refunded_before_reading(
        rig: dict[str, Any], bad_store: Any) -> None:
    """Accepted while the store had room; the store then fills up (or turns read-only)
    before a worker runs a release that writes a table there: the run fails before
    ``data_read`` and is refunded, saying why (main read the data, failed storing the
    result and charged it)."""
    api, ds = rig["api"], rig["dataset"]
    before = _epsilon(api, ds)
    posted = api.post("/v1/releases", _table_body(ds))
    assert posted.status_code == 202, posted.get_json()
    release_id = posted.get_json()["id"]
    bad_store()
    svc = wiring.of(rig["app"])
    assert run.execute(svc, release_id, "test-worker") == "failed"
    doc = api.get(f"/v1/releases/{release_id}").get_json()
    assert doc["status"] == "failed"
    assert "refunded before the data was read" in doc["error"]["message"]
    assert field(svc.ledger, release_id, "data_read") is None
    assert _epsilon(api, ds) == before  # refunded: the failure rule's "before the read"


def test_a_run_recovers_once_the_store_has_room_again(rig: dict[str, Any]) -> None:
    """With room again, a table release runs and is charged once."""
    api, ds = rig["api"], rig["dataset"]
    before = _epsilon(api, ds)
    again = api.post("/v1/releases", _table_body(ds))
    assert again.status_code == 202
    assert run.execute(wiring.of(rig["app"]), again.get_json()["id"], "test-worker") \
        == "succeeded"
    assert _epsilon(api, ds)["committed"] == pytest.approx(before["committed"] + 0.25)


def test_a_summary_run_needs_no_room_in_the_store(rig: dict[str, Any], bad_store: Any
                                                  ) -> None:
    """On PostgreSQL a summary's output is written by its commit's transaction, so a
    release accepted before the store went bad runs, is charged and reads back: no file
    of it is needed."""
    api, ds = rig["api"], rig["dataset"]
    svc = wiring.of(rig["app"])
    assert svc.ledger.results_inline
    before = _epsilon(api, ds)
    posted = api.post("/v1/releases", _body(ds))
    assert posted.status_code == 202, posted.get_json()
    release_id = posted.get_json()["id"]
    bad_store()
    assert run.execute(svc, release_id, "test-worker") == "succeeded"
    doc = api.get(f"/v1/releases/{release_id}").get_json()
    assert doc["status"] == "succeeded" and "value" in doc["result"], doc
    assert not svc.documents.folder(release_id).exists()
    assert _epsilon(api, ds)["committed"] == pytest.approx(before["committed"] + 0.25)
