"""Datasets: upload, metadata reads, retirement, budget administration and the audit log."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from datetime import datetime
from fractions import Fraction
from typing import Any

from flask import Response, current_app, request
from flask_smorest import Blueprint
from marshmallow import ValidationError

from mechanisms import zcdp
from service import apikeys, budget, datasets, errors, sources, wiring
from service import metadata as metadata_schemas
from service.api import inputs, responses
from service.api.auth import check_dataset_grant, current_key, require
from service.api.problems import APIError, flatten_messages
from service.api.responses import AUTH, BODY, located, problems
from service.api.schemas import (
    PAGE_HEADERS,
    BudgetPatchSchema,
    BudgetSchema,
    DatasetFileSchema,
    DatasetListQuerySchema,
    DatasetQuerySchema,
    DatasetSchema,
    DatasetSourceSchema,
    DatasetUploadSchema,
    LedgerEventSchema,
    LedgerQuerySchema,
    VersionPatchSchema,
    VersionSchema,
    VersionSourceSchema,
    VersionUploadSchema,
)
from service.ingest import PARQUET_TYPE, IngestError, iter_upload, parse_metadata
from service.releases import pricing
from service.storage import index
from service.storage.ledger import CapError

blp = Blueprint("datasets", __name__, url_prefix="/v1/datasets", description="Datasets")


def _invalid(field: str, message: str) -> APIError:
    return APIError(422, message, code="validation_error", field=field)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads would keep the last of two equal keys; a duplicate column is an error."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def dataset_or_404(dataset_id: str) -> dict[str, Any]:
    """The dataset; one the key may not use is answered as one that does not exist,
    before anything of it (or of the request body) is looked at."""
    not_found = APIError(404, "no such dataset", code="not_found")
    check_dataset_grant(dataset_id, not_found)
    doc = datasets.get(wiring.current().ledger, dataset_id)
    if doc is None:
        raise not_found
    return doc


@blp.record_once
def _document_metadata(state: Any) -> None:
    """Register the metadata schemas (by column type, by prior family) as components."""
    api = state.app.extensions["flask-smorest"]["blp_name_to_api"][blp.name]
    metadata_schemas.register_components(api.spec)


#: the upload's file part, and its encoding
FILE_PART = {"type": "string", "format": "binary",
             "description": "CSV (UTF-8, with a header row) or Parquet; a file that "
                            "begins and ends with Parquet's magic bytes is Parquet"}
FILE_ENCODING = {"contentType": f"text/csv, {PARQUET_TYPE}, application/octet-stream"}
#: a source registered by reference (``service.sources``)
SOURCE_PROPERTY = {"type": "string", "format": "uri", "description":
                   "storage URL of a Parquet object or of a folder (prefix) of them, under a"
                   " root the server allows (PRIVRELEASE_SOURCE_ROOTS): s3://bucket/key or"
                   " file:///path; read once and copied into the version"}
#: the multipart body (``metadata`` is a JSON document in a form field holding JSON text),
#: or the JSON body of a registration by reference
UPLOAD_BODY = {"required": True, "content": {
    "multipart/form-data": {
        "schema": {"type": "object", "required": ["metadata", "file"], "properties": {
            "metadata": {"$ref": "#/components/schemas/DatasetMetadata"},
            "file": FILE_PART}},
        "encoding": {"metadata": {"contentType": "application/json"},
                     "file": FILE_ENCODING}},
    "application/json": {
        "schema": {"type": "object", "required": ["source", "metadata"],
                   "additionalProperties": False, "properties": {
                       "source": SOURCE_PROPERTY,
                       "metadata": {"$ref": "#/components/schemas/DatasetMetadata"}}}}}}


@blp.route("", methods=["POST"])
@require("operator")
@problems(blp, *AUTH, *BODY, 403, 409)
@blp.doc(requestBody=UPLOAD_BODY)
@blp.response(201, DatasetSchema)
@located("/v1/datasets/{id}")
def upload(metadata: str | None = None, file: Any = None, source: str | None = None,
           idempotency: str | None = None) -> dict[str, Any]:
    """Register a dataset: CSV with a header row or Parquet, + metadata JSON; or Parquet
    already in storage, by reference.

    Nothing is kept on error. The file's format is read from its bytes (Parquet's magic
    bytes), not from the part's content type, though a part declared Parquet that is
    not Parquet is refused.

    A JSON body ``{"source": "<storage URL>", "metadata": {...}}`` registers Parquet
    already in storage (a file, or every ``*.parquet`` object under a folder or prefix)
    under a root the server allows (``PRIVRELEASE_SOURCE_ROOTS``; 403 otherwise): it is
    validated as an upload of that Parquet and copied into the version, each object
    pinned as read (409 ``source_changed`` if one changed while it was read).

    With an ``Idempotency-Key`` header (1..255 characters), a retry (same key, same
    metadata) answers with the dataset the first attempt registered, without parsing the
    file again; the same key with other metadata is 422 idempotency_mismatch.
    """
    if source is not None:  # the console's form by reference: its fields as the body's
        fields = {"source": source, "metadata": _decode_metadata(metadata or "")}
        body = _load_body(DatasetSourceSchema, fields)
        return _register(_form_text(source, metadata), body["metadata"], body["source"],
                         idempotency=idempotency)
    if metadata is None:  # over HTTP (the console passes its form's fields): the body,
        # whose content type decides (``inputs.check_body``)
        if request.is_json:
            body = _json_body(DatasetSourceSchema)
            return _register(_body_text(), body["metadata"],
                             body["source"])
        metadata = blp.ARGUMENTS_PARSER.parse(DatasetUploadSchema(), location="form")[
            "metadata"]
        file = blp.ARGUMENTS_PARSER.parse(DatasetFileSchema(), location="files")["file"]
    return _register(metadata, None, None, file, idempotency)


def _register(fingerprinted: str, raw_meta: Any, source: str | None,
              file: Any = None, idempotency: str | None = None) -> dict[str, Any]:
    """An upload (``file``, its metadata JSON text ``fingerprinted``) or a registration
    by reference (``source`` and its decoded ``raw_meta``; ``fingerprinted``, the body);
    ``idempotency``: a console form's key (else the request's header)."""
    config = current_app.config["PRIVRELEASE"]
    idem_key = inputs.idempotency_key(current_key().id, idempotency)
    idem = None
    if idem_key is not None:
        kind = b"upload\0" if source is None else b"source\0"
        fingerprint = hashlib.sha256(kind + fingerprinted.encode()).hexdigest()
        idem = datasets.Idempotency(idem_key, fingerprint, config.idempotency_ttl)
        try:
            first = datasets.idempotent(wiring.current().ledger, idem)
        except datasets.IdempotencyMismatch:
            raise errors.idempotency_mismatch() from None
        if first is not None:  # answered as the first time: with its warnings
            return _with_warnings(first)
    if source is None:
        raw_meta = _decode_metadata(fingerprinted)
    scan = None
    try:
        spec = parse_metadata(raw_meta)
        caps = budget.parse_caps(spec.budgets, list(spec.columns))
        scan, chunks, sha256 = _version_rows(source, file, spec)
        doc = datasets.register(
            wiring.current().datasets, wiring.current().ledger,
            spec, caps, chunks, current_key().id, idem, sha256=sha256, source=scan,
        )
    except (IngestError, budget.AmountError) as err:
        raise _invalid(err.field, err.message) from None
    except sources.SourceError as err:
        raise _source_error(err) from None
    except datasets.IdempotencyMismatch:
        raise errors.idempotency_mismatch() from None
    return _with_warnings(doc, scan)


def _scan(source: str, spec: Any) -> sources.Scan:
    """The scan of ``source`` (resolved under the server's roots) for ``spec``."""
    config = current_app.config["PRIVRELEASE"]
    resolved = sources.resolve(source, config.source_roots, endpoint=config.s3_endpoint_url,
                               max_files=config.max_source_files)
    return sources.Scan(resolved, spec, config.max_rows)


def _version_rows(source: str | None, file: Any, spec: Any
                  ) -> tuple[sources.Scan | None, Iterator[Any], str | None]:
    """The version's rows, chunk by chunk: scanned from ``source`` (by reference), or
    parsed from the uploaded ``file`` as werkzeug spooled it (never whole in memory), with
    the file's SHA-256; and the scan (None for an upload)."""
    if source is not None:
        scan = _scan(source, spec)
        return scan, scan.chunks(), None
    config = current_app.config["PRIVRELEASE"]
    sha256 = _file_sha256(file.stream)
    return None, iter_upload(file.stream, spec, max_rows=config.max_rows,
                             content_type=file.mimetype), sha256


def _source_error(err: sources.SourceError) -> APIError:
    return APIError(err.status, err.message, code=err.code, field=err.field)


def _body_text() -> str:
    """The request's JSON body as sent (an ``Idempotency-Key``'s fingerprint, as the
    metadata text is an upload's: the columns' order is part of it)."""
    return request.get_data(cache=True).decode("utf-8", "replace")


def _form_text(source: str, metadata: str | None) -> str:
    """What a console form's ``Idempotency-Key`` fingerprints (as a body's text does):
    the source and the metadata text as typed (the columns' order is part of it)."""
    return json.dumps([source, metadata or ""])


def _json_body(schema: type[Any]) -> dict[str, Any]:
    """The JSON body, duplicate keys refused (a duplicate column would be lost), loaded
    by ``schema`` (422 naming the first field in error)."""
    raw = request.get_data(cache=True)
    try:
        decoded = json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise _invalid("body", f"duplicate key {dup.args[0]!r} in the JSON body") from None
    except ValueError:
        raise APIError(400, "the request body is not valid JSON", code="bad_request",
                       field="body") from None
    if not isinstance(decoded, dict):
        raise _invalid("body", "the JSON body must be an object")
    return _load_body(schema, decoded)


def _load_body(schema: type[Any], decoded: dict[str, Any]) -> dict[str, Any]:
    """A decoded JSON body (or a console form's fields) loaded by ``schema``: 422 naming
    the first field in error."""
    try:
        loaded: dict[str, Any] = schema().load(decoded)
    except ValidationError as err:
        messages = flatten_messages(err.messages)
        where = next(iter(messages))
        raise _invalid(where, f"{where}: {messages[where]}") from None
    return loaded


def _with_warnings(doc: dict[str, Any], scan: sources.Scan | None = None
                   ) -> dict[str, Any]:
    """The upload's answer: the document, with ``warnings`` when it may be a re-upload
    (or when a source's hidden objects were skipped)."""
    warnings = datasets.reupload_warnings(wiring.current().ledger, doc)
    warnings += scan.warnings() if scan is not None else []
    return {**doc, "warnings": warnings} if warnings else doc


def _decode_metadata(metadata: str) -> Any:
    """The metadata form field as JSON (422 naming ``metadata`` otherwise; no value)."""
    if inputs.too_deep(metadata):
        raise _invalid("metadata", f"metadata is nested more than {inputs.MAX_JSON_DEPTH}"
                       " levels deep")
    try:
        return json.loads(metadata, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise _invalid("metadata", f"duplicate key {dup.args[0]!r} in metadata") from None
    except ValueError:
        raise _invalid("metadata", "metadata is not valid JSON") from None


def _file_sha256(stream: Any) -> str:
    """SHA-256 of the uploaded file (werkzeug's spooled copy, read once more in blocks
    and rewound): recorded with the version, so an operator can tell a re-sent file."""
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    stream.seek(0)
    return digest.hexdigest()


@blp.route("")
@require("consumer")
@problems(blp, *AUTH, 422)
@blp.arguments(DatasetListQuerySchema(), location="query", as_kwargs=True)
@blp.response(200, DatasetSchema(many=True), headers=PAGE_HEADERS)
def list_datasets(limit: int = 100, cursor: str | None = None,
                  expand: list[str] | None = None
                  ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Metadata of the datasets this key may see (never values), newest first, a page at
    a time.

    Read from the registry's index (a key limited to some datasets: those only), never
    by reading every dataset. The next page's cursor is in ``X-Next-Cursor`` (and
    ``Link``); the list ends when no cursor comes back. Each ``versions`` entry leaves out
    its ``columns`` unless ``expand=versions`` (``GET .../versions`` has them): the list
    stays small with many versions.
    """
    key = current_key()
    limit = min(max(limit, 1), 1000)
    docs, nxt = datasets.page(wiring.current().ledger, limit, index.Cursor.decode(cursor),
                              None if key.datasets is None else frozenset(key.datasets))
    return [listed(d, expand) for d in docs], responses.page_headers(nxt)


@blp.route("/<dataset_id>")
@require("consumer")
@problems(blp, *AUTH, 403, 404)
@blp.arguments(DatasetQuerySchema(), location="query", as_kwargs=True)
@blp.response(200, DatasetSchema)
def show(dataset_id: str, expand: list[str] | None = None) -> dict[str, Any]:
    """One dataset's public metadata (operators also see its hold-out exposure).

    ``versions`` entries without their ``columns`` unless ``expand=versions``, as the list.
    """
    doc = listed(dataset_or_404(dataset_id), expand)
    doc = {**doc, "notion_lock": wiring.current().ledger.notion_lock(dataset_id)}
    if current_key().role == "operator":
        doc = {**doc, "holdout_exposure": datasets.holdout_exposure(wiring.current().ledger,
                                                                    dataset_id)}
    return doc


#: the multipart body of a new version: the file, and optionally changed metadata
VERSION_BODY = {"required": True, "content": {
    "multipart/form-data": {
        "schema": {"type": "object", "required": ["file"], "properties": {
            "metadata": {"$ref": "#/components/schemas/DatasetMetadata"},
            "compatible": {"type": "boolean", "default": False},
            "make_current": {"type": "boolean", "default": False},
            "file": FILE_PART}},
        "encoding": {"metadata": {"contentType": "application/json"},
                     "file": FILE_ENCODING}},
    "application/json": {
        "schema": {"type": "object", "required": ["source"], "additionalProperties": False,
                   "properties": {
                       "source": SOURCE_PROPERTY,
                       "metadata": {"$ref": "#/components/schemas/DatasetMetadata"},
                       "compatible": {"type": "boolean", "default": False},
                       "make_current": {"type": "boolean", "default": False}}}}}}


def _version_error(err: datasets.VersionError) -> APIError:
    return APIError(err.status, err.message, code=err.code, field=err.field)


def version_doc(doc: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """A ``versions`` entry as the API shows it: with whether it is the current one."""
    return {**entry, "dataset_id": doc["id"],
            "current": entry["version"] == datasets.current_version(doc)}


def listed(doc: dict[str, Any], expand: list[str] | None = None) -> dict[str, Any]:
    """The document as list and show answer it: each ``versions`` entry as
    ``GET .../versions`` shows it, without its ``columns`` unless ``versions`` is in
    ``expand``. Columns per version would make the answer grow with versions x columns;
    the current version's stay at the top level."""
    entries = [version_doc(doc, e) for e in datasets.versions_of(doc)]
    if "versions" not in (expand or ()):
        entries = [{k: v for k, v in e.items() if k != "columns"} for e in entries]
    return {**doc, "versions": entries}


@blp.route("/<dataset_id>/versions", methods=["POST"])
@require("operator")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.doc(requestBody=VERSION_BODY)
@blp.response(201, VersionSchema)
@located("/v1/datasets/{dataset_id}/versions/{version}")
def upload_version(dataset_id: str, file: Any = None, metadata: str | None = None,
                   compatible: bool = False, make_current: bool = False,
                   source: str | None = None, idempotency: str | None = None
                   ) -> dict[str, Any]:
    """Upload the next version of a dataset (the same people, the dataset's budget).

    Parsed and validated as an upload (same size limits; nothing kept on error).
    Without ``metadata`` the dataset's schema is used; a changed one must be declared
    ``compatible=true`` and be so: the same column names and kinds (bounds and
    categories may change), the dataset's budgets, notions and policies. The new
    version becomes current only with ``make_current=true``. ``Idempotency-Key`` as
    for an upload. A retired dataset answers 409. A JSON body with ``source`` (and the
    same optional fields, ``metadata`` as an object) registers Parquet already in
    storage, as ``POST /v1/datasets`` does.
    """
    doc = dataset_or_404(dataset_id)
    if doc.get("status") != "active":
        raise APIError(409, "the dataset is retired: it takes no new version",
                       code="dataset_retired", field="dataset_id")
    if source is not None:  # the console's form by reference: its fields as the body's
        fields: dict[str, Any] = {"source": source, "compatible": compatible,
                                  "make_current": make_current}
        if metadata:
            fields["metadata"] = _decode_metadata(metadata)
        body = _load_body(VersionSourceSchema, fields)
        return _add_version(doc, _form_text(source, metadata), body.get("metadata"),
                            body["compatible"], body["make_current"], body["source"],
                            idempotency=idempotency)
    if file is None:  # over HTTP (the console passes its form's fields): the body
        if request.is_json:
            body = _json_body(VersionSourceSchema)
            return _add_version(doc, _body_text(), body.get("metadata"),
                                body["compatible"], body["make_current"], body["source"])
        form = blp.ARGUMENTS_PARSER.parse(VersionUploadSchema(), location="form")
        file = blp.ARGUMENTS_PARSER.parse(DatasetFileSchema(), location="files")["file"]
        metadata, compatible = form.get("metadata"), form["compatible"]
        make_current = form["make_current"]
    return _add_version(doc, metadata or "", metadata, compatible, make_current, None, file,
                        idempotency)


def _add_version(doc: dict[str, Any], fingerprinted: str, metadata: Any, compatible: bool,
                 make_current: bool, source: str | None, file: Any = None,
                 idempotency: str | None = None) -> dict[str, Any]:
    """A version upload (``file``; ``metadata``, its JSON text or None) or registration
    by reference (``source``; ``metadata``, decoded or None; ``fingerprinted``, the body);
    ``idempotency``: a console form's key (else the request's header)."""
    dataset_id = doc["id"]
    config = current_app.config["PRIVRELEASE"]
    ledger = wiring.current().ledger
    idem_key = inputs.idempotency_key(current_key().id, idempotency)
    idem = None
    if idem_key is not None:
        flags = f"{int(compatible)}{int(make_current)}"
        kind = "version" if source is None else "version-source"
        fingerprint = hashlib.sha256(f"{kind}\0{dataset_id}\0{flags}\0".encode()
                                     + fingerprinted.encode()).hexdigest()
        idem = datasets.Idempotency(idem_key, fingerprint, config.idempotency_ttl)
        try:
            first = datasets.idempotent_version(ledger, idem)
        except datasets.IdempotencyMismatch:
            raise errors.idempotency_mismatch() from None
        if first is not None:
            return version_doc(doc, datasets.find_version(doc, first))
    scan = None
    try:
        if metadata is None:
            spec = datasets.spec_of(doc)
        else:
            if not compatible:
                raise _invalid("compatible", "changed metadata needs compatible=true (or omit"
                               " metadata to keep the dataset's)")
            raw_meta = _decode_metadata(metadata) if source is None else metadata
            if isinstance(raw_meta, dict):
                raw_meta.setdefault("budgets", doc.get("budgets", {}))
                # the dataset's policy, unless the version names one (then it must agree)
                for name in ("notions", "record_level"):
                    if name in doc:
                        raw_meta.setdefault(name, doc[name])
            spec = parse_metadata(raw_meta)
            caps = budget.parse_caps(spec.budgets, list(spec.columns))
            datasets.check_compatible(doc, spec, caps)
        scan, chunks, sha256 = _version_rows(source, file, spec)
        entry = datasets.add_version(wiring.current().datasets, ledger,
                                     dataset_id, spec, chunks, current_key().id,
                                     make_current=make_current, sha256=sha256,
                                     idempotency=idem, source=scan)
    except (IngestError, budget.AmountError) as err:
        raise _invalid(err.field, err.message) from None
    except sources.SourceError as err:
        raise _source_error(err) from None
    except datasets.VersionError as err:
        raise _version_error(err) from None
    except datasets.IdempotencyMismatch:
        raise errors.idempotency_mismatch() from None
    doc = datasets.get(ledger, dataset_id) or doc
    answer = version_doc(doc, entry)
    warnings = scan.warnings() if scan is not None else []
    return {**answer, "warnings": warnings} if warnings else answer


@blp.route("/<dataset_id>/versions")
@require("consumer")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, VersionSchema(many=True))
def list_versions(dataset_id: str) -> list[dict[str, Any]]:
    """Every version of the dataset, oldest first, and which one is current."""
    doc = dataset_or_404(dataset_id)
    return [version_doc(doc, e) for e in datasets.versions_of(doc)]


@blp.route("/<dataset_id>/versions/<int:version>")
@require("consumer")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, VersionSchema)
def show_version(dataset_id: str, version: int) -> dict[str, Any]:
    """One version of the dataset."""
    doc = dataset_or_404(dataset_id)
    try:
        return version_doc(doc, datasets.find_version(doc, version))
    except datasets.VersionError as err:
        raise _version_error(err) from None


@blp.route("/<dataset_id>/versions/<int:version>", methods=["PATCH"])
@require("operator")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(VersionPatchSchema())
@blp.response(200, VersionSchema)
def patch_version(body: dict[str, Any], dataset_id: str, version: int) -> dict[str, Any]:
    """Make a version current (``{"current": true}``) or retire it
    (``{"status": "retired"}``): a retired version takes no new release, its releases
    stay readable and its files are kept; the current version can not be retired."""
    dataset_or_404(dataset_id)
    if ("current" in body) == ("status" in body):
        raise _invalid("current", "give one of current=true or status=retired")
    try:
        doc = datasets.change_version(
            wiring.current().ledger, dataset_id,
            version, current_key().id, current="current" in body, retire="status" in body)
        return version_doc(doc, datasets.find_version(doc, version))
    except datasets.VersionError as err:
        raise _version_error(err) from None


@blp.route("/<dataset_id>", methods=["DELETE"])
@require("operator")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, DatasetSchema)
def retire(dataset_id: str) -> dict[str, Any]:
    """Retire a dataset: no new releases; its releases and ledger stay readable."""
    dataset_or_404(dataset_id)
    key = current_key()
    wiring.current().ledger.retire(dataset_id, key.id)
    return datasets.set_status(wiring.current().ledger, dataset_id, "retired")


def _rows(table: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    return {m: {k: budget.display(m, v) for k, v in row.items()}
            for m, row in sorted(table.items())}


def budget_doc(dataset_id: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The dataset's balance and its allocations (an analyst sees only its own); a ρ row
    also as the (ε, δ)-DP it implies, and the notion lock (public release history)."""
    ledger = wiring.current().ledger
    rows, allocations = ledger.budget(dataset_id)
    key = current_key()
    rules = ledger.allocation_scopes(dataset_id)
    if key.role != "operator":
        allocations = {k: v for k, v in allocations.items() if k == key.id}
        rules = {k: v for k, v in rules.items() if k == key.id}
    delta = pricing.zcdp_delta(doc)
    measures: dict[str, dict[str, Any]] = dict(_rows(rows))
    if "rho" in rows:
        measures["rho"]["approx_dp"] = _rho_conversion(rows["rho"], delta)
    return {"dataset_id": dataset_id,
            "gaussian_accounting": doc.get("gaussian_accounting", "approx_dp"),
            "notion_lock": ledger.notion_lock(dataset_id), "measures": measures,
            "allocations": {k: _rows(v) for k, v in sorted(allocations.items())},
            "allocation_rules": dict(sorted(rules.items()))}


def _rho_conversion(row: dict[str, int], delta: Fraction) -> dict[str, float]:
    """ε at ``delta`` of the cap, of what is committed or held, and of what remains."""
    def eps(units: int) -> float:
        return zcdp.epsilon_for(budget.from_units("rho", max(units, 0)), delta)
    return {"delta": float(delta), "cap_epsilon": eps(row["cap"]),
            "committed_epsilon": eps(row["committed"] + row["reserved"]),
            "remaining_epsilon": eps(row["remaining"])}


@blp.route("/<dataset_id>/budget")
@require("analyst")
@problems(blp, *AUTH, 403, 404)
@blp.response(200, BudgetSchema)
def show_budget(dataset_id: str) -> dict[str, Any]:
    """Cap, committed, reserved and remaining for each measure, and allocations."""
    return budget_doc(dataset_id, dataset_or_404(dataset_id))


@blp.route("/<dataset_id>/budget", methods=["PATCH"])
@require("operator")
@problems(blp, *AUTH, *BODY, 403, 404, 409)
@blp.arguments(BudgetPatchSchema())
@blp.response(200, BudgetSchema)
def set_budget(body: dict[str, Any], dataset_id: str) -> dict[str, Any]:
    """Raise or lower caps, or set analyst keys' allocations; never below what is spent."""
    doc = dataset_or_404(dataset_id)
    ledger = wiring.current().ledger
    columns = list(doc["columns"])
    changes: list[tuple[str | None, dict[str, int]]] = []
    try:
        if body.get("caps"):
            changes.append((None, budget.parse_caps(body["caps"], columns, where="caps")))
        for key_id, caps in (body.get("allocations") or {}).items():
            where = f"allocations.{key_id}"
            key = apikeys.get(wiring.current().keys, key_id)
            if key is None or key.role != "analyst":
                raise _invalid(where, "allocations are for existing analyst keys")
            changes.append((key_id, budget.parse_caps(caps, columns, where=where)))
    except budget.AmountError as err:
        raise _invalid(err.field, err.message) from None
    _check_notions_of_caps(doc, body)
    if doc.get("gaussian_accounting") == "zcdp":  # as the upload: such a cap is never spent
        for key_id, caps in changes:
            for measure in caps:
                if budget.base_measure(measure) in ("epsilon", "delta"):
                    where = f"allocations.{key_id}" if key_id else "caps"
                    raise _invalid(f"{where}.{measure}", "a zcdp dataset charges DP releases"
                                   " in rho: set rho")
    try:  # all or nothing: a refused allocation leaves the caps as they were
        ledger.change_caps(dataset_id, changes, current_key().id)
    except CapError as err:
        limit = budget.display(err.measure, err.units)
        where = f"allocations.{err.key_id}" if err.key_id else "caps"
        if err.reason == "below_spent":
            raise APIError(409, f"{err.measure} cap below committed + reserved ({limit})",
                           code="cap_below_spent", measure=err.measure, held=limit,
                           field=f"{where}.{err.measure}") from None
        raise APIError(409, f"allocation above the dataset's {err.measure} cap ({limit})",
                       code="allocation_above_cap", measure=err.measure, cap=limit,
                       field=f"{where}.{err.measure}") from None
    return budget_doc(dataset_id, doc)


def _check_notions_of_caps(doc: dict[str, Any], body: dict[str, Any]) -> None:
    """Refuse (422 naming it) a cap or allocation of a measure whose notion the dataset does
    not admit: no release could spend it, and a cap must not read as an opt-in the
    dataset's ``notions`` (its metadata, fixed at registration) do not make."""
    admitted = budget.admitted_notions(doc)
    named = [("caps", m) for m in body.get("caps") or {}]
    named += [(f"allocations.{k}", m) for k, caps in (body.get("allocations") or {}).items()
              for m in caps]
    for where, measure in named:
        notion = budget.NOTION_OF[budget.base_measure(str(measure))]
        if notion not in admitted:
            raise _invalid(f"{where}.{measure}", f"this dataset does not admit {notion}"
                           f" releases (its notions: {', '.join(admitted) or 'none'}), so a"
                           f" {measure} cap would never be spent")


@blp.route("/<dataset_id>/ledger")
@require("operator")
@problems(blp, *AUTH, 403, 404, 422)
@blp.arguments(LedgerQuerySchema(), location="query", as_kwargs=True)
@blp.response(200, LedgerEventSchema(many=True), headers=PAGE_HEADERS)
@blp.doc(responses={200: {"content": {"application/x-ndjson": {
    "schema": {"type": "string", "description": "format=jsonl: one event per line"}}}}})
def audit(dataset_id: str, kind: list[str] | None = None, since: datetime | None = None,
          until: datetime | None = None, format: str = "json", limit: int = 1000,
          cursor: str | None = None) -> Any:
    """The ledger's events (reserve, commit, abort, cancel, cap, allocation, retire, ...),
    oldest first, a page at a time.

    A page reads ``limit`` events after the cursor and returns those of ``kind``: it may
    hold fewer than ``limit`` (even none), and the list ends when no ``X-Next-Cursor``
    (and ``Link``) comes back, so a request's work is bounded whatever the filter.
    ``format=jsonl`` streams the whole range (after the cursor, if one is given) as JSON
    Lines for export, read in batches.
    """
    dataset_or_404(dataset_id)
    ledger = wiring.current().ledger
    start, end = ledger.audit_range(since, until, index.stream_position(cursor))
    kinds = set(kind) if kind else None
    if format == "jsonl":
        lines = (json.dumps(_with_amounts(e), sort_keys=True) + "\n"
                 for e in ledger.iter_events(dataset_id, start, end, kinds))
        # the first line read now: a Valkey or archive error is a problem answer, not a
        # body cut short (later ones can only cut the stream)
        first = next(lines, None)
        body = itertools.chain([] if first is None else [first], lines)
        return Response(body, mimetype="application/x-ndjson")
    events, last = ledger.events_page(dataset_id, start, end, kinds, limit)
    return ([_with_amounts(e) for e in events],
            responses.page_headers(index.stream_cursor(last)))


def _with_amounts(event: dict[str, Any]) -> dict[str, Any]:
    """The event with its units as display ``amounts`` too."""
    event["amounts"] = {m: budget.display(m, u) for m, u in event["units"].items()}
    return event
