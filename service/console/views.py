"""Console pages: each one runs the API operation it shows (``ops``) for the session's key."""

from __future__ import annotations

import functools
import json
import tempfile
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import (
    Blueprint,
    Response,
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_wtf.csrf import CSRFError, generate_csrf, validate_csrf
from privrelease_client.draft import draft as metadata_draft
from privrelease_client.reading import accuracy_sentence, read_release
from werkzeug.wrappers import Response as BaseResponse
from wtforms import ValidationError

from service import apikeys, wiring
from service.api import auth, problems
from service.api import catalog as catalog_api
from service.api import datasets as datasets_api
from service.api import jobs as jobs_api
from service.api import keys as keys_api
from service.api import outputs as outputs_api
from service.api import releases as releases_api
from service.api.problems import APIError
from service.api.schemas import (
    AnalysisListQuerySchema,
    AnalysisRequestSchema,
    BudgetPatchSchema,
    DatasetFileSchema,
    DatasetListQuerySchema,
    DatasetUploadSchema,
    EstimateRequestSchema,
    JobListQuerySchema,
    KeyCreateSchema,
    LedgerQuerySchema,
    ReleaseListQuerySchema,
    ReleaseRequestSchema,
    VersionPatchSchema,
    VersionUploadSchema,
)
from service.console import burndown, ops, session
from service.plotting import FORMATS, budget_figure, render
from service.storage.ledger import EVENT_KINDS

bp = Blueprint("console", __name__, url_prefix=session.PREFIX, template_folder="templates",
               static_folder="static")

#: pages reachable without a session
PUBLIC = frozenset({"console.signin", "console.static"})
#: what the upload form starts with: a valid metadata document to edit
EXAMPLE_METADATA = {
    "name": "people",
    "columns": {"age": {"type": "integer", "bounds": [0, 100]},
                "income": {"type": "continuous", "bounds": [0, 1000]},
                "group": {"type": "categorical", "categories": ["a", "b", "c"]}},
    "budgets": {"epsilon": 5, "delta": 1e-5},
}

Page = Callable[..., Any]


@bp.before_request
def _guard() -> BaseResponse | None:
    """The key store reachable (the console's secret), the CSRF token on every POST, then
    a live session."""
    if request.environ.get(session.UNAVAILABLE_FLAG):
        raise problems.UNAVAILABLE[0]("console session store unavailable")
    if request.method == "POST":
        try:
            validate_csrf(request.form.get("csrf_token"))
        except ValidationError as err:
            raise CSRFError(str(err)) from None
    if request.endpoint in PUBLIC:
        return None
    key = session.signed_in()
    if auth.key_refusal(key, "consumer") is not None:
        session.sign_out()
        return redirect(url_for("console.signin", next=request.path))
    g.api_key = key
    return None


@bp.after_request
def _headers(resp: BaseResponse) -> BaseResponse:
    """Pages show secrets once and data: never cached, never framed, no foreign assets."""
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self'; style-src 'self'; script-src 'none';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
    resp.headers["Referrer-Policy"] = "same-origin"
    return resp


@bp.context_processor
def _context() -> dict[str, Any]:
    return {"csrf_token": generate_csrf, "key": g.get("api_key"), "allowed": ops.allowed,
            "api": {"upload": datasets_api.upload, "retire": datasets_api.retire,
                    "budget": datasets_api.show_budget, "audit": datasets_api.audit,
                    "set_budget": datasets_api.set_budget,
                    "upload_version": datasets_api.upload_version,
                    "patch_version": datasets_api.patch_version,
                    "list_keys": keys_api.list_keys, "list_jobs": jobs_api.list_jobs,
                    "request": releases_api.create, "estimate": releases_api.estimate,
                    "analyses": outputs_api.create,
                    "cancel_analysis": outputs_api.cancel},
            # ensure_ascii=False: "±" and "ε" shown as themselves, not \u00b1
            "pretty": lambda v: json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False),
            "sentence": accuracy_sentence, "num": _num,
            "new_key": new_key}


def _num(value: Any) -> str:
    """A released number for a person: six significant digits; empty for none."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@bp.errorhandler(APIError)
def _api_error(err: APIError) -> tuple[str, int]:
    return render_template("error.html", error=err), err.status


@bp.errorhandler(CSRFError)
def _csrf_error(err: CSRFError) -> tuple[str, int]:
    error = APIError(400, "the form's CSRF token is missing or invalid: reload the page",
                     code="csrf")
    return render_template("error.html", error=error), 400


def page(view: Callable[..., Any]) -> Callable[[Page], Page]:
    """A page needing what the API route ``view`` needs (its role, checked the API's way)."""

    def decorator(fn: Page) -> Page:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ops.check(view)
            return fn(*args, **kwargs)

        return wrapper

    return decorator


#: the amounts an exhausted budget's answer names, shown with its detail on the form
_AMOUNTS = ("measure", "requested", "remaining")


def _form_error(err: APIError) -> dict[str, Any]:
    """The error shown on a form: the API's detail and field, and for an exhausted budget
    the measure with the amounts requested and remaining (public budget figures)."""
    return {"detail": err.detail, "field": err.field, "status": err.status,
            **{k: err.extra[k] for k in _AMOUNTS if k in err.extra}}


def _image(figure: Any, fmt: str) -> Response:
    return Response(render(figure, fmt), mimetype=FORMATS[fmt])


#: how many earlier cursors a page's "previous" trail keeps (the URL stays short)
MAX_TRAIL = 50


def _pages(next_cursor: str | None) -> dict[str, str | None]:
    """Next and previous links of a list page over the API's forward-only cursors: the
    links carry the trail of the cursors that led here (``back``; "" is the first page),
    so "previous" is the page before, not a guess."""
    trail = request.args.getlist("back")[-MAX_TRAIL:]
    current = request.args.get("cursor", "")
    view_args = dict(request.view_args or {})
    # every value of a repeated filter (the audit page's kind checkboxes), not the first
    kept = {k: v for k, v in request.args.lists() if k not in {"cursor", "back"}}

    def link(cursor: str, back: list[str]) -> str:
        values: dict[str, Any] = {**view_args, **kept, "cursor": cursor or None,
                                  "back": back or None}
        return url_for(str(request.endpoint), **values)

    return {"next": link(next_cursor, [*trail, current][-MAX_TRAIL:]) if next_cursor else None,
            "previous": link(trail[-1], trail[:-1]) if trail else
            link("", []) if current else None}


def _every_dataset() -> list[dict[str, Any]]:
    """Every dataset the key may see, a page at a time (a form's choice of datasets)."""
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        docs, headers = ops.call(datasets_api.list_datasets, limit=1000, cursor=cursor)
        out += docs
        cursor = headers.get("X-Next-Cursor")
        if not cursor:
            return out


def _query(schema: Any, names: tuple[str, ...], **defaults: Any) -> dict[str, Any]:
    """The page's list query (its paging and filters) validated by the API route's own
    query schema: a bad cursor or limit is the API's 422."""
    raw = {**defaults, **{n: request.args[n] for n in names if request.args.get(n)}}
    loaded: dict[str, Any] = ops.load(schema, raw)
    return loaded


# -- sign in / out ---------------------------------------------------------------------

@bp.route("/signin", methods=["GET", "POST"])
def signin() -> Any:
    error = None
    if request.method == "POST":
        token = request.form.get("token", "").strip()
        key = apikeys.lookup(wiring.current().keys, token) if token else None
        refusal = auth.key_refusal(key, "consumer")
        if refusal is None and key is not None:
            session.sign_in(key)
            target = request.args.get("next", "")
            # only a console path: never an open redirect
            if not target.startswith(session.PREFIX + "/") or target.startswith("//"):
                target = url_for("console.home")
            return redirect(target)
        error = {"detail": refusal.detail if refusal else "no key given", "field": "token"}
    status = 401 if error else 200
    return render_template("signin.html", error=error), status


@bp.route("/signout", methods=["POST"])
def signout() -> BaseResponse:
    session.sign_out()
    return redirect(url_for("console.signin"))


@bp.route("/")
def home() -> BaseResponse:
    return redirect(url_for("console.datasets"))


# -- datasets --------------------------------------------------------------------------

def _idempotency() -> str | None:
    """The key the posted form carries (``new_key`` made it when the form was shown): a
    reload or a second click posts it again and gets the first answer, not a second
    dataset or version. None from a form without one."""
    return request.form.get("idempotency_key") or None


def new_key() -> str:
    """A fresh idempotency key for a form about to be shown."""
    return uuid.uuid4().hex


def _registered(doc: dict[str, Any]) -> Any:
    """After a new dataset: its page. A possible re-upload is shown once, with it (not in
    a redirect); otherwise post/redirect/get, so a reload shows the page again."""
    reupload = [w for w in doc.get("warnings") or () if w.get("code") == "possible_reupload"]
    if reupload:
        return _dataset_page(doc["id"], warnings=reupload), 201
    return redirect(url_for("console.dataset", dataset_id=doc["id"]))


@bp.route("/datasets", methods=["GET", "POST"])
@page(datasets_api.list_datasets)
def datasets() -> Any:
    error, metadata, status = None, json.dumps(EXAMPLE_METADATA, indent=2), 200
    if request.method == "POST":
        metadata = request.form.get("metadata", "")
        ops.check(datasets_api.upload)  # as the API: the role before anything of the body
        try:
            form = ops.load(DatasetUploadSchema(), {"metadata": metadata})
            files = ops.load(DatasetFileSchema(), dict(request.files))
            doc = ops.call(datasets_api.upload, form["metadata"], files["file"],
                           idempotency=_idempotency())
            return _registered(doc)
        except APIError as err:
            error, status = _form_error(err), err.status
    return _datasets_page(error=error, metadata=metadata), status


@bp.route("/datasets/draft", methods=["POST"])
def draft() -> Any:
    """The upload form with metadata drafted from a posted file (``privrelease datasets
    draft``: names, types, categories; bounds and budgets left to the operator, the notes
    say why). Registers nothing; the file is read in batches and deleted."""
    ops.check(datasets_api.upload)  # as an upload: the role before anything of the body
    upload = request.files.get("file")
    if upload is None or not upload.filename:
        error = {"detail": "choose a CSV or Parquet file to draft from", "field": "file",
                 "status": 422}
        return _datasets_page(error=error), 422
    with tempfile.NamedTemporaryFile(suffix=".draft") as staged:
        upload.save(staged)
        staged.flush()
        try:
            made = metadata_draft(staged.name)
        except (OSError, ValueError):  # unreadable, neither CSV nor Parquet: no value shown
            error = {"detail": "the file is neither CSV (UTF-8, a header row) nor Parquet",
                     "field": "file", "status": 422}
            return _datasets_page(error=error), 422
    made.metadata["name"] = Path(upload.filename).stem[:200]
    return _datasets_page(metadata=json.dumps(made.metadata, indent=2),
                          draft_notes=made.notes)


def _datasets_page(error: dict[str, Any] | None = None, metadata: str | None = None,
                   source_error: dict[str, Any] | None = None,
                   source: Any = None, draft_notes: list[str] | None = None) -> str:
    """The datasets list with the upload form and the form by reference (each with what
    was typed into it and its error, if it was the one posted)."""
    example = json.dumps(EXAMPLE_METADATA, indent=2)
    query = _query(DatasetListQuerySchema(), ("limit", "cursor"))
    docs, headers = ops.call(datasets_api.list_datasets, **query)
    return render_template("datasets.html", datasets=docs, error=error,
                           metadata=example if metadata is None else metadata,
                           source_error=source_error,
                           source=source or {"metadata": example},
                           draft_notes=draft_notes or [],
                           pages=_pages(headers.get("X-Next-Cursor")))


@bp.route("/datasets/register", methods=["POST"])
def register() -> Any:
    """A dataset from Parquet already in storage (the API's JSON body by reference, as a
    form): the same checks and errors, shown on the datasets page with what was typed."""
    ops.check(datasets_api.upload)  # as the API: the role before anything of the body
    source = request.form.get("source", "").strip()
    try:
        doc = ops.call(datasets_api.upload, request.form.get("metadata", ""),
                       source=source, idempotency=_idempotency())
    except APIError as err:  # a source outside the roots is the API's 403: shown here
        return _datasets_page(source_error=_form_error(err), source=request.form), err.status
    return _registered(doc)


@bp.route("/datasets/<dataset_id>")
@page(datasets_api.show)
def dataset(dataset_id: str) -> str:
    return _dataset_page(dataset_id)


def _dataset_page(dataset_id: str, error: dict[str, Any] | None = None,
                  form: Any = None, warnings: list[dict[str, Any]] | None = None,
                  version_error: dict[str, Any] | None = None,
                  source_error: dict[str, Any] | None = None,
                  source_form: Any = None) -> str:
    doc = ops.call(datasets_api.show, dataset_id)
    versions = ops.call(datasets_api.list_versions, dataset_id)
    budget = (ops.call(datasets_api.show_budget, dataset_id)
              if ops.allowed(datasets_api.show_budget) else None)
    analysts = ([k for k in ops.call(keys_api.list_keys) if k.get("role") == "analyst"
                 and not k.get("revoked_at")]
                if ops.allowed(datasets_api.set_budget) else [])
    return render_template("dataset.html", dataset=doc, budget=budget, error=error,
                           analysts=analysts, form=form or {}, versions=versions,
                           warnings=warnings or [], version_error=version_error,
                           source_error=source_error, source_form=source_form or {})


@bp.route("/datasets/<dataset_id>/budget", methods=["POST"])
def set_budget(dataset_id: str) -> Any:
    """Change caps or one analyst key's allocation through the API's PATCH route: the
    empty fields are left out, the rest goes as typed (the route validates amounts)."""
    ops.check(datasets_api.set_budget)  # the role before anything of the body
    caps = {name[len("cap."):]: value.strip() for name, value in request.form.items()
            if name.startswith("cap.") and value.strip()}
    new_measure = request.form.get("new_measure", "").strip()
    if new_measure and request.form.get("new_cap", "").strip():
        caps[new_measure] = request.form["new_cap"].strip()
    body: dict[str, Any] = {"caps": caps} if caps else {}
    key_id = request.form.get("alloc_key", "").strip()
    measure = request.form.get("alloc_measure", "").strip()
    amount = request.form.get("alloc_cap", "").strip()
    try:
        if amount and not key_id:
            raise APIError(422, "choose the analyst key the allocation is for",
                           code="validation_error", field="alloc_key")
        if key_id:
            body["allocations"] = {key_id: {measure: amount}}
        if not body:
            raise APIError(422, "nothing to change: give a cap or an allocation",
                           code="validation_error", field="body")
        ops.call(datasets_api.set_budget, ops.load(BudgetPatchSchema(), body), dataset_id)
    except APIError as err:
        if err.status in {401, 403, 404}:
            raise
        return _dataset_page(dataset_id, _form_error(err), request.form), err.status
    return redirect(url_for("console.dataset", dataset_id=dataset_id))


@bp.route("/datasets/<dataset_id>/versions", methods=["POST"])
def upload_version(dataset_id: str) -> Any:
    """A new version through the API's own route: the same ingest, checks and errors."""
    ops.check(datasets_api.upload_version)  # the role before anything of the body
    fields: dict[str, Any] = {"compatible": "compatible" in request.form,
                              "make_current": "make_current" in request.form}
    metadata = request.form.get("metadata", "").strip()
    if metadata:
        fields["metadata"] = metadata
    try:
        form = ops.load(VersionUploadSchema(), fields)
        files = ops.load(DatasetFileSchema(), dict(request.files))
        ops.call(datasets_api.upload_version, dataset_id, files["file"], **form,
                 idempotency=_idempotency())
    except APIError as err:
        if err.status in {401, 403, 404}:
            raise
        return _dataset_page(dataset_id, version_error=_form_error(err)), err.status
    return redirect(url_for("console.dataset", dataset_id=dataset_id))


@bp.route("/datasets/<dataset_id>/versions/register", methods=["POST"])
def register_version(dataset_id: str) -> Any:
    """A new version from Parquet already in storage through the API's own route (its
    JSON body's fields, as a form); errors on the dataset's page with what was typed."""
    ops.check(datasets_api.upload_version)  # the role before anything of the body
    try:
        ops.call(datasets_api.upload_version, dataset_id,
                 metadata=request.form.get("metadata", "").strip() or None,
                 compatible="compatible" in request.form,
                 make_current="make_current" in request.form,
                 source=request.form.get("source", "").strip(),
                 idempotency=_idempotency())
    except APIError as err:
        if err.status in {401, 404}:  # a source outside the roots (403) is shown here
            raise
        return _dataset_page(dataset_id, source_error=_form_error(err),
                             source_form=request.form), err.status
    return redirect(url_for("console.dataset", dataset_id=dataset_id))


@bp.route("/datasets/<dataset_id>/versions/<int:version>", methods=["GET", "POST"])
@page(datasets_api.show_version)
def version(dataset_id: str, version: int) -> Any:
    """One version (its columns); operators make it current or retire it (the API's PATCH)."""
    if request.method == "POST":
        body = ({"current": True} if request.form.get("action") == "current"
                else {"status": "retired"})
        try:
            ops.call(datasets_api.patch_version, ops.load(VersionPatchSchema(), body),
                     dataset_id, version)
        except APIError as err:
            if err.status in {401, 403, 404}:
                raise
            return _dataset_page(dataset_id, version_error=_form_error(err)), err.status
        return redirect(url_for("console.dataset", dataset_id=dataset_id))
    entry = ops.call(datasets_api.show_version, dataset_id, version)
    return render_template("version.html", dataset_id=dataset_id, version=entry)


@bp.route("/datasets/<dataset_id>/retire", methods=["POST"])
def retire(dataset_id: str) -> BaseResponse:
    ops.call(datasets_api.retire, dataset_id)
    return redirect(url_for("console.dataset", dataset_id=dataset_id))


#: audit events the budget chart replays at most (the newest): its steps, whatever the
#: history
CHART_EVENTS = 1000


@bp.route("/datasets/<dataset_id>/budget.<any(png, svg):fmt>")
@page(datasets_api.audit)
def budget_chart(dataset_id: str, fmt: str = "png") -> Response:
    """Committed and reserved over time, from the audit stream the ledger page reads:
    its newest ``CHART_EVENTS`` events, from what held before them (``burndown``), so
    the chart costs the same whatever the dataset's history."""
    # the route's own grant and dataset checks first
    ops.check(datasets_api.audit)
    datasets_api.dataset_or_404(dataset_id)
    window = wiring.current().ledger.budget_window(dataset_id, CHART_EVENTS)
    series = {}
    for measure, steps in burndown.replay_window(window).items():
        # the last state holds until now: without this point its step has no width
        times = [apikeys.parse_time(t) for t in steps.times] + [datetime.now(UTC)]
        rows = {name: [*values, values[-1]]
                for name, values in steps.display(measure).items()}
        series[measure] = (times, rows)
    return _image(budget_figure(series, f"budget of {dataset_id}"), fmt)


def _when(name: str) -> str | None:
    """A datetime-local form value (naive: UTC) as ISO 8601, or None when empty."""
    raw = request.args.get(name, "").strip()
    return raw + ("" if raw.endswith("Z") or "+" in raw[10:] else "Z") if raw else None


#: events the audit page reads per page (the API's ``limit``; oldest first)
AUDIT_PAGE = 200


@bp.route("/datasets/<dataset_id>/audit")
@page(datasets_api.audit)
def audit(dataset_id: str) -> Any:
    query: dict[str, Any] = {"format": request.args.get("format", "json")}
    kinds = [k for k in request.args.getlist("kind") if k]
    if kinds:
        query["kind"] = ",".join(kinds)
    for name in ("since", "until"):
        if (value := _when(name)) is not None:
            query[name] = value
    query["limit"] = AUDIT_PAGE
    if request.args.get("cursor"):
        query["cursor"] = request.args["cursor"]
    error, events, pages = None, [], None
    try:
        loaded = ops.load(LedgerQuerySchema(), query)
        result = ops.call(datasets_api.audit, dataset_id, **loaded)
        if isinstance(result, Response):  # format=jsonl: the export, as the API streams it
            result.headers["Content-Disposition"] = (
                f'attachment; filename="{dataset_id}-audit.jsonl"')
            return result
        events, headers = result
        pages = _pages(headers.get("X-Next-Cursor"))
    except APIError as err:
        if err.status in {401, 403, 404}:
            raise
        error = _form_error(err)
    doc = ops.call(datasets_api.show, dataset_id)
    return render_template("audit.html", dataset=doc, events=events, error=error,
                           kinds=EVENT_KINDS, chosen=set(kinds), args=request.args,
                           pages=pages)


# -- keys ------------------------------------------------------------------------------

@bp.route("/keys", methods=["GET", "POST"])
@page(keys_api.list_keys)
def keys() -> Any:
    error, created, status = None, None, 200
    if request.method == "POST":
        body: dict[str, Any] = {"role": request.form.get("role", ""),
                                "label": request.form.get("label", "")}
        scope = request.form.get("scope", "")
        grants = [d for d in request.form.getlist("datasets") if d]
        if scope == "some":
            body["datasets"] = grants
        expires = request.form.get("expires_at", "").strip()
        if expires:
            body["expires_at"] = expires
        try:
            _check_scope(scope, grants)
            created = ops.call(keys_api.create, ops.load(KeyCreateSchema(), body))
            status = 201
        except APIError as err:
            error, status = _form_error(err), err.status
    docs = ops.call(keys_api.list_keys)
    grantable = _every_dataset()
    return render_template("keys.html", keys=docs, created=created, error=error,
                           datasets=grantable, now=datetime.now(UTC)), status


def _check_scope(scope: str, grants: list[str]) -> None:
    """A key's datasets are the operator's explicit choice, never a form's default: every
    dataset (also later ones) only when asked for, and some at least one ticked."""
    if scope not in ("some", "all"):
        raise APIError(422, "choose the datasets the key may use: only those ticked, or"
                       " every dataset", code="validation_error", field="scope")
    if scope == "some" and not grants:
        raise APIError(422, "tick at least one dataset, or choose every dataset",
                       code="validation_error", field="datasets")
    if scope == "all" and grants:
        raise APIError(422, "datasets are ticked but every dataset is chosen: choose one",
                       code="validation_error", field="scope")


@bp.route("/keys/<key_id>/revoke", methods=["POST"])
def revoke(key_id: str) -> BaseResponse:
    ops.call(keys_api.revoke, key_id)
    return redirect(url_for("console.keys"))


# -- jobs ------------------------------------------------------------------------------

@bp.route("/jobs")
@page(jobs_api.list_jobs)
def jobs() -> str:
    query = _query(JobListQuerySchema(), ("status", "limit", "cursor"), limit=200)
    docs, headers = ops.call(jobs_api.list_jobs, **query)
    return render_template("jobs.html", jobs=docs, status=query.get("status"),
                           pages=_pages(headers.get("X-Next-Cursor")))


@bp.route("/jobs/<release_id>/cancel", methods=["POST"])
def cancel_job(release_id: str) -> BaseResponse:
    ops.call(jobs_api.cancel, release_id)
    return redirect(url_for("console.jobs"))


# -- mechanisms, estimates and requests ------------------------------------------------

def _choices(prop: dict[str, Any]) -> list[Any]:
    """The keywords a "number or keyword" parameter also takes (its ``anyOf``'s enum)."""
    return [v for branch in prop.get("anyOf") or [] for v in branch.get("enum") or []]


def _field_kind(prop: dict[str, Any]) -> str:
    """How the form asks for a parameter, from its JSON schema."""
    if "enum" in prop:
        return "enum"
    if _choices(prop):
        return "number or " + " / ".join(str(v) for v in _choices(prop))
    kind = prop.get("type")
    if kind in {"boolean", "integer", "number", "string"}:
        return str(kind)
    if kind == "array" and (prop.get("items") or {}).get("type") == "string":
        return "strings"
    return "json"


def _fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    required = set(schema.get("required") or [])
    out = []
    for name, prop in (schema.get("properties") or {}).items():
        default = prop.get("default")
        out.append({"name": name, "kind": _field_kind(prop), "required": name in required,
                    "enum": prop.get("enum") or [], "choices": _choices(prop),
                    "description": prop.get("description", ""),
                    "default": "" if default is None else
                    (json.dumps(default) if isinstance(default, dict | list) else
                     str(default).lower() if isinstance(default, bool) else str(default))})
    return out


def _params(fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The form's parameter fields as the request's ``params`` (empty fields left out)."""
    params: dict[str, Any] = {}
    for spec in fields:
        raw = request.form.get("p." + spec["name"], "").strip()
        if not raw:
            continue
        where = f"params.{spec['name']}"
        try:
            if spec["kind"] == "boolean":
                params[spec["name"]] = raw == "true"
            elif spec["kind"] in {"integer", "number"}:
                number = float(raw)
                params[spec["name"]] = int(number) if number.is_integer() and \
                    spec["kind"] == "integer" else number
            elif spec["kind"] == "strings":
                params[spec["name"]] = [s.strip() for s in raw.split(",") if s.strip()]
            elif spec["kind"] == "json":
                params[spec["name"]] = json.loads(raw)
            elif spec["kind"].startswith("number or "):  # a keyword as typed, else a number
                params[spec["name"]] = raw if raw in spec["choices"] else float(raw)
            else:
                params[spec["name"]] = raw
        except ValueError:
            raise APIError(422, "not a valid value for this field", code="validation_error",
                           field=where) from None
    return params


def _mechanism(name: str) -> dict[str, Any]:
    for mech in ops.call(catalog_api.list_mechanisms):
        if mech["name"] == name:
            return dict(mech)
    raise APIError(404, "no such mechanism", code="not_found")


def _target(form: Any, amounts: dict[str, Any]) -> dict[str, Any] | None:
    """The form's target accuracy (``t.half_width``), None when empty; an (ε, δ)
    mechanism's δ, given among the budget's fields, is held fixed (taken out of them)."""
    raw = form.get("t.half_width", "").strip()
    if not raw:
        return None
    try:
        wanted: dict[str, Any] = {"half_width": float(raw), "level": 0.95}
    except ValueError:
        raise APIError(422, "not a number", code="validation_error",
                       field="target.half_width") from None
    if "delta" in amounts:
        wanted["delta"] = amounts.pop("delta")
    return wanted


@bp.route("/mechanisms")
@page(catalog_api.list_mechanisms)
def mechanisms() -> str:
    return render_template("mechanisms.html", mechanisms=ops.call(catalog_api.list_mechanisms))


@bp.route("/mechanisms/<name>", methods=["GET", "POST"])
@page(catalog_api.list_mechanisms)
def mechanism(name: str) -> Any:
    mech = _mechanism(name)
    fields = _fields(mech["params_schema"])
    datasets = _every_dataset()
    error, estimate, status = None, None, 200
    form: Mapping[str, Any] = request.form if request.method == "POST" else request.args
    if request.method == "POST":
        action = request.form.get("action", "estimate")
        ops.check(releases_api.create if action == "request" else releases_api.estimate)
        try:
            amounts: dict[str, Any] = {}
            for measure in mech["measures"]:
                raw = request.form.get("b." + measure, "").strip()
                if raw:
                    try:
                        amounts[measure] = float(raw)
                    except ValueError:
                        raise APIError(422, "not a number", code="validation_error",
                                       field=f"budget.{measure}") from None
            asked: dict[str, Any] = {"dataset_id": request.form.get("dataset_id", ""),
                                     "mechanism": name, "params": _params(fields),
                                     "budget": amounts}
            wanted = _target(request.form, amounts) if action == "estimate" else None
            if wanted is not None:  # the smallest budget for it (a budget too: refused)
                asked = {**{k: v for k, v in asked.items() if k != "budget" or v},
                         "target": wanted}
            schema = ReleaseRequestSchema() if wanted is None else EstimateRequestSchema()
            body = ops.load(schema, asked)
            if action == "request":
                doc, _status, _location = ops.call(releases_api.create, body)
                return redirect(url_for("console.release", release_id=doc["id"]))
            estimate = ops.call(releases_api.estimate, body)
            if isinstance(estimate, Response):  # 202 pricing: a worker prices it
                estimate = estimate.get_json()
            elif wanted is not None:  # the budget found fills the form, ready to request
                form = {**request.form.to_dict(), "t.half_width": "",
                        **{f"b.{m}": str(a) for m, a in estimate["budget"].items()}}
        except APIError as err:
            error, status = _form_error(err), err.status
    return render_template("mechanism.html", mechanism=mech, fields=fields, form=form,
                           datasets=datasets, error=error, estimate=estimate), status


# -- releases and analyses -------------------------------------------------------------

@bp.route("/releases")
@page(releases_api.list_releases)
def releases() -> str:
    query = _query(ReleaseListQuerySchema(), ("dataset_id", "mine", "limit", "cursor"))
    docs, headers = ops.call(releases_api.list_releases, **query)
    return render_template("releases.html", releases=docs, query=query,
                           pages=_pages(headers.get("X-Next-Cursor")))


@bp.route("/releases/<release_id>", methods=["GET", "POST"])
@page(releases_api.show)
def release(release_id: str) -> Any:
    doc = ops.call(releases_api.show, release_id)
    error, status = None, 200
    if request.method == "POST":  # run an analysis
        try:
            raw = request.form.get("params", "").strip() or "{}"
            try:
                params = json.loads(raw)
            except ValueError:
                raise APIError(422, "params is not valid JSON", code="validation_error",
                               field="params") from None
            others = [r.strip() for r in request.form.get("releases", "").split(",")
                      if r.strip()]
            body = ops.load(AnalysisRequestSchema(), {
                "analysis": request.form.get("analysis", ""), "params": params,
                "releases": others})
            created = ops.call(outputs_api.create, body, release_id)
            return redirect(url_for("console.analysis", release_id=release_id,
                                    analysis_id=created["id"]))
        except APIError as err:
            error, status = _form_error(err), err.status
    analyses, pages = [], {}
    if doc["status"] == "succeeded":
        query = _query(AnalysisListQuerySchema(), ("limit", "cursor"), limit=50)
        analyses, headers = ops.call(outputs_api.list_analyses, query, release_id)
        pages = _pages(headers.get("X-Next-Cursor"))
    has_plot = doc["status"] == "succeeded" and _drawable(outputs_api.release_figure,
                                                          release_id)
    reading = read_release(doc) if doc["status"] == "succeeded" else None
    return render_template("release.html", release=doc, analyses=analyses, error=error,
                           has_plot=has_plot, pages=pages, reading=reading,
                           shown_rows=_SHOWN_ROWS), status


#: result rows a release page lists (the plot and the client's frames have them all)
_SHOWN_ROWS = 50


def _drawable(figure_of: Callable[..., Any], *args: str) -> bool:
    """Whether the API would draw it: the route's own checks and figure, not rendered."""
    try:
        figure_of(*args)
    except APIError:
        return False
    return True


@bp.route("/releases/<release_id>/plot.<any(png, svg):fmt>")
@page(outputs_api.plot)
def plot(release_id: str, fmt: str = "png") -> Response:
    resp: Response = ops.call(outputs_api.plot if fmt == "png" else outputs_api.plot_svg,
                              release_id)
    return resp


@bp.route("/datasets/<dataset_id>/dummy.csv")
@page(datasets_api.dummy_rows)
def dummy(dataset_id: str) -> Response:
    """100 dummy rows (the API's ``dummy.csv``: from the metadata only, not data)."""
    resp: Response = ops.call(datasets_api.dummy_rows, dataset_id)
    return resp


@bp.route("/releases/<release_id>/data")
@page(outputs_api.data)
def data(release_id: str) -> Response:
    resp: Response = ops.call(outputs_api.data, release_id)
    return resp


@bp.route("/releases/<release_id>/analyses/<analysis_id>")
@page(outputs_api.show)
def analysis(release_id: str, analysis_id: str) -> str:
    return _analysis_page(release_id, analysis_id)


def _analysis_page(release_id: str, analysis_id: str,
                   error: dict[str, Any] | None = None) -> str:
    doc = ops.call(outputs_api.show, release_id, analysis_id)
    has_plot = doc["status"] == "succeeded" and _drawable(outputs_api.analysis_figure_of,
                                                          release_id, analysis_id)
    return render_template("analysis.html", analysis=doc, release_id=release_id,
                           has_plot=has_plot, error=error)


@bp.route("/releases/<release_id>/analyses/<analysis_id>/cancel", methods=["POST"])
def cancel_analysis(release_id: str, analysis_id: str) -> Any:
    """Cancel a queued or running analysis (its creator or an operator, as the API
    decides); a refusal (409 ended, 403 not the creator) is shown on the analysis page."""
    try:
        ops.call(outputs_api.cancel, release_id, analysis_id)
    except APIError as err:
        if err.status in {401, 404}:
            raise
        return _analysis_page(release_id, analysis_id, _form_error(err)), err.status
    return redirect(url_for("console.analysis", release_id=release_id,
                            analysis_id=analysis_id))


@bp.route("/releases/<release_id>/analyses/<analysis_id>/plot.<any(png, svg):fmt>")
@page(outputs_api.analysis_plot_png)
def analysis_plot(release_id: str, analysis_id: str, fmt: str = "png") -> Response:
    view = outputs_api.analysis_plot_png if fmt == "png" else outputs_api.analysis_plot_svg
    resp: Response = ops.call(view, release_id, analysis_id)
    return resp
