"""What releases produced: microdata as CSV, and free analyses of released outputs."""

from __future__ import annotations

import contextlib
from typing import Any

import marshmallow
from flask import Response, current_app
from flask_smorest import Blueprint

import mechanisms
from service import analyses, releases
from service.api.responses import AUTH, BODY, problems
from service.auth import check_dataset_grant, current_key, require
from service.outputs import OutputStore, csv_chunks
from service.plotting import function_png
from service.problems import UNAVAILABLE, APIError
from service.schemas import AnalysisRequestSchema, AnalysisSchema

blp = Blueprint("outputs", __name__, url_prefix="/v1/releases",
                description="Release data and analyses")

TASK = "privrelease.run_analysis"


def _succeeded(release_id: str, field: str = "release_id") -> dict[str, Any]:
    """The release, once succeeded; a release of a dataset the key may not use is
    answered as one that does not exist, before its status is looked at."""
    doc = releases.document(current_app.extensions["redis"], release_id)
    not_found = APIError(404, "no such release", code="not_found", field=field)
    if doc is None:
        raise not_found
    check_dataset_grant(doc["dataset_id"], not_found)
    if doc["status"] != "succeeded":
        raise APIError(409, f"the release is {doc['status']}, not succeeded",
                       code="release_not_ready", field=field)
    return doc


@blp.route("/<release_id>/data")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.doc(responses={200: {"description": "one CSV row per released record",
                          "content": {"text/csv": {}}}})
def data(release_id: str) -> Response:
    """The privatized microdata as CSV, one row per released record, in row order."""
    _succeeded(release_id)
    config = current_app.config["PRIVRELEASE"]
    attempt = releases.table_attempt(current_app.extensions["redis"], release_id)
    table = OutputStore(config.releases_dir).load(release_id, attempt)
    if table is None:
        raise APIError(404, "this release has no record-level data", code="not_found")
    headers = {"Content-Disposition": f'attachment; filename="{release_id}.csv"'}
    return Response(csv_chunks(table), mimetype="text/csv", headers=headers)


@blp.route("/<release_id>/plot.png")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.doc(responses={200: {"description": "the released function", "content": {
    "image/png": {}}}})
def plot(release_id: str) -> Response:
    """A drawing of a released function (values on its grid); nothing else is drawn."""
    doc = _succeeded(release_id)
    result = doc["result"] or {}
    grid, values = result.get("grid"), result.get("values")
    if not isinstance(grid, list) or not isinstance(values, list) or len(grid) != len(values):
        raise APIError(404, "this release has no function to draw", code="not_found")
    title = f"{doc['mechanism']} · {release_id}"
    return Response(function_png(grid, values, title), mimetype="image/png")


@blp.route("/<release_id>/analyses", methods=["POST"])
@require("consumer")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(AnalysisRequestSchema())
@blp.response(202, AnalysisSchema())
def create(body: dict[str, Any], release_id: str) -> dict[str, Any]:
    """Queue free post-processing of a succeeded release; spends no budget."""
    doc = _succeeded(release_id)
    mech = mechanisms.get(doc["mechanism"])
    analysis = mech.analyses.get(body["analysis"])
    if analysis is None:
        raise APIError(422, f"{doc['mechanism']} offers analyses {sorted(mech.analyses)}",
                       code="validation_error", field="analysis")
    try:
        params = analysis.load_params(body.get("params"))
    except marshmallow.ValidationError as err:
        errors = releases.prefixed("params", err.messages)
        first = next(iter(errors))
        raise APIError(422, f"invalid request: {first}: {errors[first]}",
                       code="validation_error", field=first, errors=errors) from None
    others = body.get("releases") or []
    if len(others) != analysis.n_others:
        raise APIError(422, f"{analysis.name} takes {analysis.n_others} other release(s)",
                       code="validation_error", field="releases")
    for i, other in enumerate(others):
        other_doc = _succeeded(other, field=f"releases.{i}")
        same = (other_doc["dataset_id"], other_doc["dataset_version"])
        if same != (doc["dataset_id"], doc["dataset_version"]):  # rows must pair up
            raise APIError(422, "releases must be of the same dataset version",
                           code="validation_error", field=f"releases.{i}")
    client = current_app.extensions["redis"]
    analysis_id = analyses.create(client, release_id, analysis.name, params, others,
                                  current_key().id)
    try:
        current_app.extensions["celery"].send_task(TASK, args=[analysis_id],
                                                   task_id=analysis_id)
    except UNAVAILABLE:
        # never queued: drop the record rather than leave it "queued" forever (the 503
        # tells the client to retry); if Valkey itself is gone the record is too stale
        # to matter and the error handler answers the same 503
        with contextlib.suppress(*UNAVAILABLE):
            analyses.discard(client, release_id, analysis_id)
        raise
    created = analyses.document(client, analysis_id)
    assert created is not None
    return created


@blp.route("/<release_id>/analyses/<analysis_id>")
@require("consumer")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, AnalysisSchema())
def show(release_id: str, analysis_id: str) -> dict[str, Any]:
    """An analysis: status, and when done its result with diagnostics and warnings."""
    doc = releases.document(current_app.extensions["redis"], release_id)
    not_found = APIError(404, "no such release", code="not_found")
    if doc is None:
        raise not_found
    check_dataset_grant(doc["dataset_id"], not_found)
    found = analyses.document(current_app.extensions["redis"], analysis_id)
    if found is None or found["release_id"] != release_id:
        raise APIError(404, "no such analysis", code="not_found")
    return found
