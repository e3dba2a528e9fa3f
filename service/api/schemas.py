"""Marshmallow schemas of the HTTP API; flask-smorest turns them into OpenAPI."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from marshmallow import (
    INCLUDE,
    RAISE,
    Schema,
    ValidationError,
    fields,
    validate,
    validates_schema,
)
from webargs.fields import DelimitedList

import mechanisms
from mechanisms.suggest import did_you_mean
from service.storage.ledger import EVENT_KINDS


class StrictSchema(Schema):
    class Meta:
        unknown = RAISE


class ProblemSchema(Schema):
    """RFC 9457 problem document: the body of every error (``application/problem+json``)."""

    class Meta:
        unknown = INCLUDE  # members of one problem, e.g. ``requested``/``remaining``

    type = fields.String(required=True)
    title = fields.String(required=True)
    status = fields.Integer(required=True, metadata={"description": "the HTTP status"})
    detail = fields.String(required=True)
    code = fields.String(required=True, metadata={"description": "stable machine-readable name"})
    field = fields.String(metadata={"description": "the request field that is wrong"})
    errors = fields.Dict(keys=fields.String(), values=fields.String(),
                         metadata={"description": "field -> message, for schema errors"})
    request_id = fields.String()


class HealthSchema(StrictSchema):
    status = fields.String()


class ProblemTypeSchema(StrictSchema):
    code = fields.String()
    type = fields.String()
    description = fields.String()
    warning = fields.Boolean(metadata={"description": "a warning of a successful answer"})


class DummyQuerySchema(StrictSchema):
    rows = fields.Integer(load_default=100, validate=validate.Range(1, 10_000),
                          metadata={"description": "how many dummy rows (at most 10,000)"})
    seed = fields.Integer(validate=validate.Range(0, 2**63 - 1), metadata={
        "description": "the same seed gives the same rows (they are public anyway)"})


class IndexSchema(StrictSchema):
    service = fields.String()
    version = fields.String()
    links = fields.Dict(keys=fields.String(), values=fields.String(),
                        metadata={"description": "where to go next: the API's entry points"})


class ReadySchema(StrictSchema):
    status = fields.String()
    workers = fields.Integer()


class DatasetUploadSchema(StrictSchema):
    metadata = fields.String(required=True, metadata={
        "description": "metadata JSON (documented as the DatasetMetadata component)"})


class VersionUploadSchema(StrictSchema):
    metadata = fields.String(metadata={
        "description": "omit to keep the dataset's metadata; a changed one needs"
                       " compatible=true (same columns and kinds; budgets, notions and"
                       " policies stay the dataset's)"})
    compatible = fields.Boolean(load_default=False, metadata={
        "description": "the operator declares the changed metadata compatible"})
    make_current = fields.Boolean(load_default=False, metadata={
        "description": "make the new version current at once (default false: releases"
                       " keep using the current version until PATCH ... current=true)"})


class DatasetSourceSchema(StrictSchema):
    """The JSON body of a registration by reference (``service.sources``); documented as
    raw OpenAPI beside the multipart body (``service.api.datasets.UPLOAD_BODY``)."""

    source = fields.String(required=True, validate=validate.Length(min=1, max=2048))
    metadata = fields.Dict(required=True)


class VersionSourceSchema(StrictSchema):
    """A new version's JSON body: ``source``, and the multipart form's other fields."""

    source = fields.String(required=True, validate=validate.Length(min=1, max=2048))
    metadata = fields.Dict()
    compatible = fields.Boolean(load_default=False)
    make_current = fields.Boolean(load_default=False)


class UploadWarningSchema(Schema):
    code = fields.String(metadata={"description": "possible_reupload or skipped_objects"})
    dataset_id = fields.String(metadata={"description": "the existing dataset"})
    version = fields.Integer(metadata={"description": "its version that matches"})
    same_file = fields.Boolean(metadata={"description": "the files' SHA-256 agree"})
    count = fields.Integer(metadata={"description": "skipped_objects: how many"})
    names = fields.List(fields.String(), metadata={
        "description": "skipped_objects: the first of them"})
    message = fields.String()


class SourceSummarySchema(Schema):
    url = fields.String(metadata={"description": "the storage URL registered by reference"})
    objects = fields.Integer(metadata={"description": "Parquet objects read and copied"})
    bytes = fields.Integer(metadata={"description": "their total size"})
    pins_sha256 = fields.String(metadata={
        "description": "SHA-256 of the pins (key, size, ETag, version id of every object as"
                       " read; all of them are in the version's stored manifest): equal"
                       " digests, the same objects unchanged"})
    skipped = fields.Integer(metadata={
        "description": "hidden objects skipped (a name segment starting with '_' or '.')"})


class VersionSchema(Schema):
    dataset_id = fields.String()
    version = fields.Integer()
    n_rows = fields.Integer()
    status = fields.String(validate=validate.OneOf(["active", "retired"]), metadata={
        "description": "retired: no new releases; its releases stay readable"})
    current = fields.Boolean()
    created_at = fields.String()
    created_by = fields.String()
    sha256 = fields.String(metadata={"description": "SHA-256 of the uploaded file"})
    source = fields.Nested(SourceSummarySchema, metadata={
        "description": "registered by reference: what was read (copied into the version)"})
    warnings = fields.List(fields.Nested(UploadWarningSchema), metadata={
        "description": "registration by reference only: skipped_objects"})
    columns = fields.Dict(metadata={
        "description": "this version's column metadata; in a dataset's `versions` (GET"
                       " /v1/datasets and /v1/datasets/{id}) only with expand=versions"})


class VersionPatchSchema(StrictSchema):
    current = fields.Boolean(validate=validate.Equal(True), metadata={
        "description": "true: releases without a version use this one from now on"})
    status = fields.String(validate=validate.OneOf(["retired"]), metadata={
        "description": "retired: no new releases on this version (not the current one)"})


class DatasetFileSchema(StrictSchema):
    file = fields.Raw(required=True, metadata={"type": "string", "format": "binary"})


class DatasetSchema(Schema):
    id = fields.String()
    version = fields.Integer()
    name = fields.String()
    n_rows = fields.Integer()
    columns = fields.Dict()
    budgets = fields.Dict()
    bounds_policy = fields.String()
    public = fields.Boolean(metadata={"description": "public reference data, not private"})
    allow_holdout = fields.Boolean(metadata={
        "description": "dip may hold out rows of it as a reference NOT protected by DP"})
    subset_policy = fields.Dict(metadata={
        "description": "default subset-design thresholds for every categorical column"})
    keep_row_order = fields.Boolean(metadata={
        "description": "microdata keeps the dataset's row order (otherwise a secret"
        " per-dataset order)"})
    holdout_exposure = fields.Dict(keys=fields.String(), values=fields.Integer(), metadata={
        "description": "operators only: rows that have served as a DIP hold-out (not"
        " protected by DP; splits are nested, so the largest hold-out) and releases using one"})
    status = fields.String()
    created_at = fields.String()
    gaussian_accounting = fields.String(metadata={
        "description": "approx_dp: Gaussian releases charge (epsilon, delta); zcdp: every DP"
        " release charges rho"})
    zcdp_delta = fields.Float(metadata={"description": "delta of the shown (epsilon, delta)"
                                        " conversion of rho"})
    notions = fields.List(fields.String(), metadata={
        "description": "privacy notions this dataset admits (stored resolved at"
        " registration: those the metadata named, else those of the measures its budgets"
        " name)"})
    record_level = fields.Boolean(metadata={
        "description": "whether the operator allowed record-level releases (one output per"
        " record: subset.*, interval.*, noiseless.local, dip, lrm, opm.l2ball); false:"
        " they are refused, 422 record_level_not_admitted"})
    allow_mixed_noiseless_dp = fields.Boolean()
    notion_lock = fields.String(allow_none=True, metadata={
        "description": "dp or noiseless: the notion the first release locked this dataset"
        " to (null: none yet, or mixed allowed)"})
    current_version = fields.Integer(metadata={
        "description": "the version releases without a version use (also `version`)"})
    versions = fields.List(fields.Nested(VersionSchema), metadata={
        "description": "every version, oldest first, as GET /v1/datasets/{id}/versions"
                       " shows it; in GET /v1/datasets and /v1/datasets/{id} without"
                       " `columns` unless expand=versions (the top-level `columns` are the"
                       " current version's)"})
    sha256 = fields.String(metadata={"description": "SHA-256 of the first upload's file"})
    source = fields.Nested(SourceSummarySchema, metadata={
        "description": "the first version registered by reference: what was read"})
    warnings = fields.List(fields.Nested(UploadWarningSchema), metadata={
        "description": "upload only: possible_reupload when an active dataset has the same"
                       " column set and row count (the same people must not get a second"
                       " budget: upload a version instead); skipped_objects when a source"
                       " registered by reference had hidden objects"})


class BudgetRowSchema(Schema):
    cap = fields.Float()
    committed = fields.Float()
    reserved = fields.Float()
    remaining = fields.Float()
    approx_dp = fields.Dict(metadata={
        "description": "rho only: the (epsilon, delta)-DP that cap, committed (+ reserved)"
        " and remaining rho imply, epsilon = rho + 2 sqrt(rho log(1/delta)) (Bun & Steinke"
        " 2016, Prop. 1.3)"})


class BudgetSchema(Schema):
    dataset_id = fields.String()
    gaussian_accounting = fields.String()
    notion_lock = fields.String(allow_none=True)
    measures = fields.Dict(keys=fields.String(), values=fields.Nested(BudgetRowSchema))
    allocations = fields.Dict(
        keys=fields.String(),
        values=fields.Dict(keys=fields.String(), values=fields.Nested(BudgetRowSchema)),
        metadata={"description": "per analyst key id: its caps inside the dataset's"},
    )
    allocation_rules = fields.Dict(keys=fields.String(), values=fields.String(), metadata={
        "description": "per analyst key id: listed (the key may spend only the measures its"
                       " allocation lists, none of the others) or legacy (an allocation from"
                       " before that rule: unlisted measures limited by the dataset's caps"
                       " only; any new allocation written for the key makes it listed)"})


class BudgetPatchSchema(StrictSchema):
    caps = fields.Dict(keys=fields.String(), values=fields.Raw(),
                       metadata={"description": "measure -> new cap"})
    allocations = fields.Dict(keys=fields.String(), values=fields.Dict(),
                              metadata={"description": "analyst key id -> measure -> cap"})


CURSOR_DESCRIPTION = ("the X-Next-Cursor header of the previous page (opaque); a page may "
                     "hold fewer than limit items: the list ends when no cursor comes back")
#: the paging headers of a list response (a list body keeps its schema)
PAGE_HEADERS = {
    "X-Next-Cursor": {"description": "pass as ?cursor= for the next page; absent on the last",
                      "schema": {"type": "string"}},
    "Link": {"description": 'rel="next": the next page\'s URL; absent on the last',
             "schema": {"type": "string"}},
}


class DatasetQuerySchema(StrictSchema):
    # an empty ``expand=`` names nothing: refused (422), not read as "no expansion"
    expand = DelimitedList(fields.String(validate=validate.OneOf(["versions"])),
                           validate=validate.Length(min=1), metadata={
        "description": "versions: each `versions` entry with its `columns` (otherwise"
                       " left out, so the answer does not grow with versions x columns)"})


class DatasetListQuerySchema(DatasetQuerySchema):
    limit = fields.Integer(load_default=100, metadata={
        "description": "how many, newest first; 1..1000 (clamped)"})
    cursor = fields.String(validate=validate.Length(1, 1000),
                           metadata={"description": CURSOR_DESCRIPTION})


class LedgerQuerySchema(StrictSchema):
    kind = DelimitedList(fields.String(validate=validate.OneOf(EVENT_KINDS)))
    since = fields.AwareDateTime(default_timezone=UTC)
    until = fields.AwareDateTime(default_timezone=UTC)
    format = fields.String(load_default="json", validate=validate.OneOf(["json", "jsonl"]),
                           metadata={"description": "jsonl: the whole range (from the cursor"
                                     " if given) streamed as JSON Lines; limit pages json only"})
    limit = fields.Integer(load_default=1000, validate=validate.Range(1, 10_000), metadata={
        "description": "events read per page, oldest first (1..10000): a kind filter keeps"
                       " those that match, so a page may hold fewer"})
    cursor = fields.String(validate=validate.Length(1, 1000),
                           metadata={"description": CURSOR_DESCRIPTION})


class LedgerEventSchema(Schema):
    id = fields.String()
    kind = fields.String()
    outcome = fields.String(metadata={
        "description": "commit events: succeeded, or failed after the job read the data "
                       "(charged all the same)"})
    release_id = fields.String()
    code = fields.String(metadata={
        "description": "refuse events: the code of the problem the priced release got"})
    notion_lock = fields.String(metadata={
        "description": "reserve events: the notion (dp or noiseless) this first release"
                       " locked the dataset to"})
    version = fields.Integer(metadata={
        "description": "the dataset version: of the release (reserve, commit, ...), or"
                       " the one a version event is about"})
    action = fields.String(metadata={
        "description": "version events: uploaded, current or retired; policy events:"
                       " migrated"})
    notions = fields.String(metadata={
        "description": "policy events: the notions the dataset admits, comma-separated"})
    record_level = fields.String(metadata={
        "description": "policy events: whether record-level releases are allowed (1 or 0)"})
    legacy_allocations = fields.String(metadata={
        "description": "policy events: keys whose allocations were marked legacy (their"
                       " unlisted measures stay unlimited), comma-separated"})
    actor = fields.String()
    key_id = fields.String()
    at = fields.String()
    amounts = fields.Dict(keys=fields.String(), values=fields.Float())
    units = fields.Dict(keys=fields.String(), values=fields.Integer(),
                        metadata={"description": "exact integer ledger units"})


class RegisteredMechanism(validate.OneOf):
    """One of the registered mechanisms' names, read when a request is validated: a
    mechanism registered after this module was imported (a plugin's, a test's) is
    accepted, and the documents list the names as an enum all the same."""

    def __init__(self) -> None:
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self) -> list[str]:
        return mechanisms.names()

    @choices.setter
    def choices(self, _: Any) -> None:
        return None

    @property
    def choices_text(self) -> str:
        return ", ".join(self.choices)

    @choices_text.setter
    def choices_text(self, _: Any) -> None:
        return None

    def __call__(self, value: Any) -> Any:
        """The name, or a refusal naming the closest registered one (not all of them)."""
        if value not in self.choices:
            raise ValidationError("unknown mechanism" + did_you_mean(value, self.choices)
                                  + "; GET /v1/mechanisms lists them")
        return value


#: no dataset id holds a NUL, and PostgreSQL text refuses one (a 500, not a 422)
NO_NUL = validate.Regexp(r"^[^\x00]*$", error="must not contain NUL characters")


class ReleaseRequestSchema(StrictSchema):
    dataset_id = fields.String(required=True, validate=[validate.Length(1, 100), NO_NUL])
    version = fields.Integer(validate=validate.Range(1, 2**31), metadata={
        "description": "the dataset version (default: its current one); a retired"
                       " version refuses (409 version_retired)"})
    mechanism = fields.String(required=True, validate=RegisteredMechanism(),
                              metadata={"description": "a name from /v1/mechanisms"})
    params = fields.Dict(load_default=dict,
                         metadata={"description": "the mechanism's params_schema"})
    budget = fields.Dict(keys=fields.String(), values=fields.Raw(), required=True)
    callback_url = fields.String(
        validate=validate.Length(1, 2000),
        metadata={"description": "POSTed the release document when it ends (allow-listed "
                                 "hosts only; signed, see README)"})
    seed = fields.Integer(
        allow_none=True, validate=validate.Range(0, 2**63 - 1),
        metadata={"description": "only accepted when the server allows seeds (tests)"},
    )


class TargetSchema(StrictSchema):
    """A target accuracy: every released number's stated 95 % interval within ±half_width."""

    half_width = fields.Float(required=True, allow_nan=False,
                              validate=validate.Range(min=0, min_inclusive=False), metadata={
        "description": "the largest stated 95 % half-width wanted, in the statistic's units"
                       " (the largest over cells, entries or grid points)"})
    level = fields.Float(load_default=0.95, allow_nan=False, validate=validate.Range(
        min=0, max=1, min_inclusive=False, max_inclusive=False), metadata={
        "description": "the interval's level: the one the statement gives (0.95; a table's"
                       " or covariance's params.confidence.level)"})
    delta = fields.Raw(metadata={
        "description": "(epsilon, delta) mechanisms: the delta held fixed while epsilon is"
                       " searched (required for them, refused for others)"})


class EstimateRequestSchema(ReleaseRequestSchema):
    """A release request to price: with a ``budget``, or a ``target`` accuracy whose
    smallest budget is found (exactly one of the two)."""

    budget = fields.Dict(keys=fields.String(), values=fields.Raw(), metadata={
        "description": "the most the release may spend per measure (or give a target)"})
    target = fields.Nested(TargetSchema, metadata={
        "description": "instead of a budget: the smallest budget whose stated 95 % interval"
                       " is within ±half_width is found and estimated (spends nothing)"})

    @validates_schema
    def _budget_or_target(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "budget" in data and "target" in data:
            raise ValidationError("give a budget or a target, not both", "target")
        if "budget" not in data and "target" not in data:
            raise ValidationError("Missing data for required field (or give a target).",
                                  "budget")


class ReleaseListQuerySchema(StrictSchema):
    dataset_id = fields.String(validate=[validate.Length(1, 100), NO_NUL])
    limit = fields.Integer(load_default=100,
                           metadata={"description": "how many, newest first; 1..1000 (clamped)"})
    cursor = fields.String(validate=validate.Length(1, 1000),
                           metadata={"description": CURSOR_DESCRIPTION})
    mine = fields.Boolean(load_default=False,
                          metadata={"description": "only releases this key requested"})


#: a release's statuses: ``pricing`` (its cost is being computed by a worker; nothing
#: held yet), ``queued``, ``running``, then ``succeeded``, ``failed``, ``cancelled``, or
#: ``refused`` (priced, then refused as the POST would have been; nothing charged)
RELEASE_STATUSES = ("pricing", "queued", "running", "succeeded", "failed", "cancelled",
                    "refused")


class ReleaseSchema(Schema):
    id = fields.String()
    status = fields.String(validate=validate.OneOf(RELEASE_STATUSES), metadata={
        "description": "pricing (a worker computes its cost; nothing held yet), queued,"
                       " running, succeeded, failed, cancelled, or refused (its priced"
                       " reservation was refused; error is the problem the POST would have"
                       " answered, nothing charged)"})
    dataset_id = fields.String()
    dataset_version = fields.Integer()
    privacy = fields.Dict(allow_none=True, metadata={
        "description": "the notions the release uses; on a zcdp dataset its rho and the"
        " (epsilon, delta) it implies; on a dataset allowing both noiseless and DP releases,"
        " that the pair has no finite guarantee in either notion"})
    mechanism = fields.String()
    params = fields.Dict()
    cost = fields.Dict()
    seeded = fields.Boolean()
    result = fields.Dict(allow_none=True)
    accuracy = fields.Dict(allow_none=True)
    guarantee = fields.String(allow_none=True)
    engine = fields.String(allow_none=True, metadata={
        "description": "where the statistics were computed: ``embedded`` (the worker) or"
                       " ``spark local[N]`` / ``spark sc://host:port``; null until the"
                       " release succeeds"})
    error = fields.Dict()
    replayed = fields.Boolean()
    created_at = fields.String(allow_none=True)
    started_at = fields.String(allow_none=True)
    finished_at = fields.String(allow_none=True)
    analyses = fields.List(fields.String(), metadata={
        "description": "analyses this succeeded release can run (POST .../analyses)"})


class EstimateSchema(Schema):
    mechanism = fields.String()
    cost = fields.Dict()
    accuracy = fields.Dict()
    remaining = fields.Dict(metadata={
        "description": "per measure charged: what this key may still spend (the dataset's "
                       "remainder, or its allocation's if smaller)"})
    fits = fields.Boolean(metadata={"description": "whether the cost fits what remains"})
    shortfall = fields.Dict(metadata={
        "description": "per measure the cost exceeds what remains: by how much"})
    budget = fields.Dict(metadata={
        "description": "a target's estimate only: the smallest budget meeting it, as a"
                       " release request sends it (whole ledger units, exact decimals)"})
    target = fields.Dict(metadata={
        "description": "a target's estimate only: the target as asked, the measure"
                       " searched, the half-width (and level) stated at the budget found,"
                       " how many budgets were evaluated"})


class PricingSchema(Schema):
    status = fields.String(metadata={"description": "pricing"})
    mechanism = fields.String()
    retry_after = fields.Integer(metadata={"description": "seconds, as Retry-After"})


class MechanismSchema(Schema):
    name = fields.String()
    measures = fields.List(fields.String())
    description = fields.String()
    summary = fields.String(metadata={"description": "the description's first sentence"})
    params_schema = fields.Dict()
    analyses = fields.Dict(metadata={"description": "analysis name -> its params schema"})


class KeyCreateSchema(StrictSchema):
    role = fields.String(required=True, validate=validate.OneOf(["operator", "analyst",
                                                                 "consumer"]))
    label = fields.String(load_default="", validate=validate.Length(0, 200))
    datasets = fields.List(fields.String(validate=validate.Length(1, 100)), allow_none=True,
                           load_default=None, validate=validate.Length(0, 1000),
                           metadata={"description": "grants; null means every dataset"})
    expires_at = fields.AwareDateTime(allow_none=True, load_default=None,
                                      default_timezone=UTC,
                                      metadata={"description": "ISO 8601; naive means UTC"})


class KeySchema(Schema):
    id = fields.String()
    role = fields.String()
    label = fields.String()
    datasets = fields.List(fields.String(), allow_none=True)
    expires_at = fields.String(allow_none=True)
    created_at = fields.String()
    token = fields.String(metadata={"description": "shown once, at creation"})
    callback_secret = fields.String(metadata={"description": "HMAC key for notifications; "
                                                             "shown once"})


class JobListQuerySchema(StrictSchema):
    status = fields.String(validate=validate.OneOf(
        ["pricing", "queued", "running", "failed", "refused"]))
    limit = fields.Integer(load_default=100,
                           metadata={"description": "how many; 1..1000 (clamped)"})
    cursor = fields.String(validate=validate.Length(1, 1000),
                           metadata={"description": CURSOR_DESCRIPTION})


class JobSchema(Schema):
    id = fields.String(metadata={"description": "the release id"})
    dataset_id = fields.String()
    mechanism = fields.String()
    status = fields.String()
    created_at = fields.String()
    age_seconds = fields.Float()
    error = fields.Dict(allow_none=True)


class AnalysisRequestSchema(StrictSchema):
    analysis = fields.String(required=True, validate=validate.Length(1, 100))
    params = fields.Dict(load_default=dict)
    releases = fields.List(fields.String(validate=validate.Length(1, 100)),
                           load_default=list, validate=validate.Length(0, 10),
                           metadata={"description": "other releases the analysis combines"})


class AnalysisErrorSchema(Schema):
    code = fields.String(metadata={"description": "invalid_input, analysis_failed, "
                                   "time_limit, worker_lost or cancelled"})
    field = fields.String(metadata={"description": "the input to blame (invalid_input)"})
    message = fields.String()


class AnalysisSchema(Schema):
    id = fields.String()
    release_id = fields.String()
    analysis = fields.String()
    params = fields.Dict()
    releases = fields.List(fields.String())
    status = fields.String(metadata={"description": "queued, running, succeeded, failed"
                                     " or cancelled"})
    work = fields.Float(allow_none=True, metadata={
        "description": "the work estimate checked against the ceiling at POST"})
    result = fields.Raw(allow_none=True)
    error = fields.Nested(AnalysisErrorSchema, allow_none=True)
    created_at = fields.String()
    started_at = fields.String(allow_none=True)
    finished_at = fields.String(allow_none=True)


class AnalysisListQuerySchema(StrictSchema):
    limit = fields.Integer(load_default=20, validate=validate.Range(1, 100),
                           metadata={"description": "page size, newest first"})
    cursor = fields.String(validate=validate.Regexp(r"^[0-9]{1,20}:[A-Za-z0-9_]{1,100}$"),
                           metadata={"description": CURSOR_DESCRIPTION})


