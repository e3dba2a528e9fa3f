"""A client generated from ``/openapi.json`` works (issue #18 §2).

``openapi-python-client`` generates a package from the live document into a temporary
directory; the test imports it and, over a real socket, uploads the documented example
dataset (multipart, with an Idempotency-Key), estimates and requests the documented
``dip`` example release through its typed request model, waits for it, and reads its
``/data`` CSV. What the generator cannot understand it drops with a warning: the
test fails on any such warning, so the document stays complete for clients.
"""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from flask import Flask

from service.api import openapi
from tests.integration.conftest import TOKEN
from tests.integration.liveserver import serve

PACKAGE = "privrelease_generated"


@pytest.fixture(scope="module")
def generated(app: Flask, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The generated package's name, importable for the module's tests."""
    root = tmp_path_factory.mktemp("generated")
    spec = root / "openapi.json"
    spec.write_text(json.dumps(app.test_client().get("/openapi.json").get_json()))
    # the generator knows no image types: a plot is bytes (the one setting a user needs)
    config = root / "config.json"
    config.write_text(json.dumps({"content_type_overrides": {
        "image/png": "application/octet-stream",
        "image/svg+xml": "application/octet-stream"}}))
    done = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(spec),
         "--output-path", str(root / PACKAGE), "--meta", "none", "--config", str(config)],
        capture_output=True, text=True, timeout=120, check=False, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    # the only warning allowed: ruff (its post-generation formatter) not on PATH
    output = done.stdout + done.stderr
    warnings = [block for block in output.split("\n\n")
                if block.strip().startswith(("WARNING", "ERROR", "Cannot parse"))]
    assert not warnings, output
    sys.path.insert(0, str(root))
    try:
        yield PACKAGE
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def _mod(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_generated_client_uploads_releases_waits_and_reads_data(
        app: Flask, worker: Any, generated: str) -> None:
    """Catches a document a generated client cannot use: untyped or wrongly typed
    bodies, a multipart upload it cannot send, a response it cannot parse."""
    models, types = _mod("models"), _mod("types")
    upload = _mod("api.datasets.datasets_upload")
    estimate = _mod("api.releases.releases_estimate")
    create = _mod("api.releases.releases_create")
    show = _mod("api.releases.releases_show")
    data = _mod("api.outputs.outputs_data")
    spec = app.test_client().get("/openapi.json").get_json()
    example = spec["paths"]["/v1/releases"]["post"]["requestBody"]["content"][
        "application/json"]["examples"]["dip"]["value"]

    with serve(app) as url:
        client = _mod("client").AuthenticatedClient(base_url=url, token=TOKEN,
                                                    raise_on_unexpected_status=True)
        body = models.DatasetsUploadFilesBody(
            metadata=models.DatasetMetadata.from_dict(openapi.EXAMPLE_METADATA),
            file=types.File(payload=io.BytesIO(openapi.EXAMPLE_CSV.encode()),
                            file_name="people.csv", mime_type="text/csv"))
        made = upload.sync_detailed(client=client, body=body, idempotency_key="generated")
        assert made.status_code == 201, made.content
        dataset = made.parsed
        assert isinstance(dataset, models.Dataset) and dataset.n_rows == 60
        assert made.headers["Location"] == f"/v1/datasets/{dataset.id}"
        # the same Idempotency-Key answers with the same dataset
        again = upload.sync_detailed(client=client, body=body, idempotency_key="generated")
        assert again.parsed.id == dataset.id
        # the JSON body of a registration by reference is sent as JSON (this server allows
        # no source root: the documented 403, parsed as a problem)
        by_ref = upload.sync_detailed(client=client, body=models.DatasetsUploadJsonBody(
            source="file:///srv/exports/people.parquet",
            metadata=models.DatasetMetadata.from_dict(openapi.EXAMPLE_METADATA)))
        assert by_ref.status_code == 403 and isinstance(by_ref.parsed, models.Problem)
        assert by_ref.parsed.code == "source_not_allowed"

        request = models.DipRequest.from_dict({**example, "dataset_id": dataset.id})
        assert request.to_dict()["params"] == example["params"]  # typed, round-trips
        # an estimate's body is its own type: a budget or a target accuracy
        priced = models.DipEstimate.from_dict({**example, "dataset_id": dataset.id})
        cost = estimate.sync(client=client, body=priced)
        assert isinstance(cost, models.Estimate) and cost.fits is True
        for_target = models.LaplaceEstimate.from_dict({
            **openapi.TARGET_EXAMPLES["target"][1], "dataset_id": dataset.id})
        found = estimate.sync(client=client, body=for_target)
        assert isinstance(found, models.Estimate) and found.fits is True
        assert found.to_dict()["budget"]["epsilon"] > 0
        accepted = create.sync_detailed(client=client, body=request)
        assert accepted.status_code == 202, accepted.content
        release = accepted.parsed
        assert isinstance(release, models.Release)
        deadline = time.monotonic() + 60
        while release.status not in {"succeeded", "failed", "refused", "cancelled"}:
            assert time.monotonic() < deadline, release.status
            time.sleep(0.1)
            release = show.sync(client=client, release_id=release.id)
        assert release.status == "succeeded", release.error
        csv = data.sync_detailed(client=client, release_id=release.id)
        assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
        lines = csv.content.decode().splitlines()
        assert lines[0].split(",") == ["_row", "age", "group"] and len(lines) == 61
        assert all(row.split(",")[2] in {"a", "b", "c", "d"} for row in lines[1:])
