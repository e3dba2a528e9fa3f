"""What releases produced: microdata as CSV, and free analyses of released outputs."""

from __future__ import annotations

import contextlib
from typing import Any

import marshmallow
from flask import Response, current_app
from flask_smorest import Blueprint

import mechanisms
from mechanisms.analysis_plot import analysis_plot
from mechanisms.iclp.plot import plot_spec
from service import analyses, wiring
from service.api import responses
from service.api.auth import check_dataset_grant, current_key, require
from service.api.problems import UNAVAILABLE, APIError
from service.api.responses import AUTH, BODY, located, problems
from service.api.schemas import (
    PAGE_HEADERS,
    AnalysisListQuerySchema,
    AnalysisRequestSchema,
    AnalysisSchema,
)
from service.plotting import FORMATS, analysis_figure, bar_figure, render
from service.plotting import release_figure as release_figure_of
from service.releases import documents, pricing
from service.storage.release_tables import csv_chunks
from service.storage.store import Fields

blp = Blueprint("outputs", __name__, url_prefix="/v1/releases",
                description="Release data and analyses")


def _succeeded(release_id: str, field: str = "release_id") -> dict[str, Any]:
    """The release, once succeeded; a release of a dataset the key may not use is
    answered as one that does not exist, before its status is looked at."""
    return _succeeded_fields(release_id, field)[1]


def _succeeded_fields(release_id: str, field: str = "release_id"
                      ) -> tuple[Fields, dict[str, Any]]:
    """:func:`_succeeded` with the release's stored fields it was rendered from (one read
    of the record)."""
    h = wiring.current().ledger.release(release_id)
    not_found = APIError(404, "no such release", code="not_found", field=field)
    if h is None:
        raise not_found
    doc = documents.render(release_id, h)
    check_dataset_grant(doc["dataset_id"], not_found)
    if doc["status"] != "succeeded":
        raise APIError(409, f"the release is {doc['status']}, not succeeded",
                       code="release_not_ready", field=field)
    return h, doc


@blp.route("/<release_id>/data")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.doc(responses={200: {"description": "one CSV row per released record",
                          "content": {"text/csv": {}}}})
def data(release_id: str) -> Response:
    """The privatized microdata as CSV, one row per released record, in the dataset's secret
    row order (the same for every release of the dataset; see mechanisms.rows)."""
    h, _ = _succeeded_fields(release_id)
    table = wiring.current().outputs.load(release_id, documents.table_attempt(h))
    if table is None:
        raise APIError(404, "this release has no record-level data", code="not_found")
    headers = {"Content-Disposition": f'attachment; filename="{release_id}.csv"'}
    return Response(csv_chunks(table), mimetype="text/csv", headers=headers)


def release_figure(release_id: str) -> Any:
    """The figure of a succeeded release the key may read (404 when it has nothing to
    draw): a table as bars with 95 % error bars, or its ``PlotSpec``."""
    doc = _succeeded(release_id)
    result = doc["result"] or {}
    values, labels, errors = result.get("values"), result.get("categories"), result.get("errors")
    if (isinstance(labels, list) and isinstance(values, list) and isinstance(errors, list)
            and len(labels) == len(values) == len(errors)):  # a table: bars, 95 % error bars
        spent = ", ".join(f"{m} = {v}" for m, v in (doc.get("cost") or {}).items())
        title = f"{doc['mechanism']} · {release_id}" + (f" ({spent})" if spent else "")
        return bar_figure(labels, values, errors, title)
    try:
        spec = plot_spec(doc["mechanism"], doc.get("params") or {}, result,
                         doc.get("accuracy") or {}, doc.get("cost") or {})
    except ValueError:
        raise APIError(404, "this release has no function to draw", code="not_found") from None
    return release_figure_of(spec)


def _image(figure: Any, fmt: str) -> Response:
    return Response(render(figure, fmt), mimetype=FORMATS[fmt],
                    headers={"X-Content-Type-Options": "nosniff"})


_PLOT_DOC = ("A drawing of a released function (its 95 % band from the accuracy statement),"
             " curves or surface (heat map), or of a table (bars with 95 % error bars), from"
             " the release's public document only.")


@blp.route("/<release_id>/plot.png")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.doc(description=_PLOT_DOC, responses={200: {"description": "the released function",
                                                 "content": {"image/png": {}}}})
def plot(release_id: str) -> Response:
    """The release's drawing as PNG."""
    return _image(release_figure(release_id), "png")


@blp.route("/<release_id>/plot.svg")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.doc(description=_PLOT_DOC, responses={200: {"description": "the released function",
                                                 "content": {"image/svg+xml": {}}}})
def plot_svg(release_id: str) -> Response:
    """The release's drawing as SVG (the same figure as the PNG)."""
    return _image(release_figure(release_id), "svg")


def _input_error(err: mechanisms.MechanismInputError) -> APIError:
    return APIError(422, err.message, code="validation_error", field=err.field)


@blp.route("/<release_id>/analyses", methods=["POST"])
@require("consumer")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(AnalysisRequestSchema())
@blp.response(202, AnalysisSchema())
@located("/v1/releases/{release_id}/analyses/{id}")
def create(body: dict[str, Any], release_id: str) -> dict[str, Any]:
    """Queue free post-processing of a succeeded release; spends no budget.

    Everything the analysis would refuse is checked here, from the release's design
    and its table (public outputs), and its work is bounded: a request above the
    server's ceiling is refused (422 ``work_limit``, naming the parameter).
    """
    doc = _succeeded(release_id)
    mech = mechanisms.get(doc["mechanism"])
    analysis = mech.analyses.get(body["analysis"])
    runnable = documents.runnable_analyses(doc["mechanism"], doc["params"], doc["result"] or {})
    if analysis is None or body["analysis"] not in runnable:
        raise APIError(422, f"this release can run analyses {runnable}",
                       code="validation_error", field="analysis")
    try:
        params = analysis.load_params(body.get("params"))
    except marshmallow.ValidationError as err:
        errors = pricing.prefixed("params", err.messages)
        first = next(iter(errors))
        raise APIError(422, f"invalid request: {first}: {errors[first]}",
                       code="validation_error", field=first, errors=errors) from None
    others = body.get("releases") or []
    if len(others) != analysis.n_others:
        raise APIError(422, f"{analysis.name} takes {analysis.n_others} other release(s)",
                       code="validation_error", field="releases")
    store = wiring.current().analyses
    config = current_app.config["PRIVRELEASE"]
    outputs = wiring.current().outputs
    other_docs = []
    for i, other in enumerate(others):
        other_doc = _succeeded(other, field=f"releases.{i}")
        same = (other_doc["dataset_id"], other_doc["dataset_version"])
        if same != (doc["dataset_id"], doc["dataset_version"]):  # rows must pair up
            raise APIError(422, "releases must be of the same dataset version",
                           code="validation_error", field=f"releases.{i}")
        other_docs.append(other_doc)
    try:
        main = analyses.view(wiring.current().ledger, outputs, doc)
        views = [analyses.view(wiring.current().ledger, outputs, d) for d in other_docs]
        analysis.check(main, params, views)
        work = analysis.work(main, params, views)
    except mechanisms.MechanismInputError as err:
        raise _input_error(err) from None
    except LookupError:
        raise APIError(404, "no such release", code="not_found", field="release_id") from None
    pricing.check_work(work, config.max_analysis_work, "this analysis")
    analysis_id = analyses.create(store, release_id, analysis.name, params, others,
                                  current_key().id, work.units)
    try:
        wiring.current().queue.analysis(analysis_id)
    except UNAVAILABLE:
        # never queued: drop the record rather than leave it "queued" forever (the 503
        # tells the client to retry); if the record itself is away it is too stale to
        # matter and the error handler answers the same 503
        with contextlib.suppress(*UNAVAILABLE):
            analyses.discard(store, release_id, analysis_id)
        raise
    created = analyses.document(store, analysis_id, wiring.current().documents)
    assert created is not None
    return created


def _release(release_id: str) -> dict[str, Any]:
    """The release (any status), answered as missing for a dataset the key may not use."""
    doc = documents.document(wiring.current().ledger, release_id)
    not_found = APIError(404, "no such release", code="not_found")
    if doc is None:
        raise not_found
    check_dataset_grant(doc["dataset_id"], not_found)
    return doc


def _analysis(release_id: str, analysis_id: str) -> dict[str, Any]:
    _release(release_id)
    found = analyses.document(wiring.current().analyses, analysis_id,
                               wiring.current().documents)
    if found is None or found["release_id"] != release_id:
        raise APIError(404, "no such analysis", code="not_found")
    return found


@blp.route("/<release_id>/analyses")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 422)
@blp.arguments(AnalysisListQuerySchema(), location="query")
@blp.response(200, AnalysisSchema(many=True), headers=PAGE_HEADERS)
def list_analyses(query: dict[str, Any], release_id: str
                  ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """A release's analyses, newest first, a page at a time: the next page's cursor is in
    ``X-Next-Cursor`` (and ``Link``), as for every other list; the list ends when no
    cursor comes back."""
    _release(release_id)
    items, cursor = analyses.page(wiring.current().analyses, release_id,
                                  query["limit"], query.get("cursor"),
                                  wiring.current().documents)
    return items, responses.page_headers(cursor)


@blp.route("/<release_id>/analyses/<analysis_id>")
@require("consumer")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, AnalysisSchema())
def show(release_id: str, analysis_id: str) -> dict[str, Any]:
    """An analysis: status, and when done its result with diagnostics and warnings."""
    return _analysis(release_id, analysis_id)


@blp.route("/<release_id>/analyses/<analysis_id>/cancel", methods=["POST"])
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.response(200, AnalysisSchema())
def cancel(release_id: str, analysis_id: str) -> dict[str, Any]:
    """Cancel a queued or running analysis (its creator or an operator): it ends
    ``cancelled`` at once; a queued one never runs, a running one is stopped by its
    worker within a second (or, stuck in native code, when that code returns) and
    anything it still produces is discarded. 409 ``analysis_ended`` once it has ended."""
    found = _analysis(release_id, analysis_id)
    key = current_key()
    store = wiring.current().analyses
    if key.role != "operator" and (store.fields(analysis_id) or {}).get("actor") != key.id:
        raise APIError(403, "only the analysis's creator or an operator may cancel it",
                       code="forbidden")
    if analyses.cancel(store, analysis_id) is None:
        raise APIError(409, f"the analysis is {found['status']}; nothing to cancel",
                       code="analysis_ended")
    # a queued message is dropped by the workers (best effort: a worker that misses the
    # broadcast skips it anyway, the status no longer being queued); a running analysis
    # is stopped by its own worker, which watches the status (workers/tasks.py)
    with contextlib.suppress(Exception):
        wiring.current().queue.revoke(analysis_id)
    ended = analyses.document(store, analysis_id, wiring.current().documents)
    assert ended is not None
    return ended



def analysis_figure_of(release_id: str, analysis_id: str) -> Any:
    """The figure of a succeeded analysis the key may read (as ``show`` checks it); 409
    while it has no result, 404 when its result has nothing to draw."""
    found = _analysis(release_id, analysis_id)
    if found["status"] != "succeeded":
        raise APIError(409, f"the analysis is {found['status']}, not succeeded",
                       code="analysis_not_ready")
    try:
        spec = analysis_plot(found["analysis"], found.get("result"),
                             f"{found['analysis']} · {release_id}")
    except ValueError:
        raise APIError(404, "this analysis has nothing to draw", code="not_found") from None
    return analysis_figure(spec)


_ANALYSIS_PLOT_DOC = (
    "A drawing of an analysis's result: the NPMLE's CDF as a step function with the cells"
    " carrying its mass (npmle), the fitted CDF (mle), cdf and quantile functionals with"
    " their bootstrap intervals (functionals), estimated shares with 95 % intervals"
    " (estimate). 404 for analyses with nothing to draw.")


@blp.route("/<release_id>/analyses/<analysis_id>/plot.png")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.doc(description=_ANALYSIS_PLOT_DOC, responses={
    200: {"description": "the analysis's result", "content": {"image/png": {}}}})
def analysis_plot_png(release_id: str, analysis_id: str) -> Response:
    """The analysis's drawing as PNG."""
    return _image(analysis_figure_of(release_id, analysis_id), "png")


@blp.route("/<release_id>/analyses/<analysis_id>/plot.svg")
@require("consumer")
@problems(blp, *AUTH, 403, 404, 409)
@blp.doc(description=_ANALYSIS_PLOT_DOC, responses={
    200: {"description": "the analysis's result", "content": {"image/svg+xml": {}}}})
def analysis_plot_svg(release_id: str, analysis_id: str) -> Response:
    """The analysis's drawing as SVG (the same figure as the PNG)."""
    return _image(analysis_figure_of(release_id, analysis_id), "svg")
