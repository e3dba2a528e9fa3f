"""Marshmallow schemas of the HTTP API; flask-smorest turns them into OpenAPI."""

from __future__ import annotations

from marshmallow import RAISE, Schema, fields, validate


class StrictSchema(Schema):
    class Meta:
        unknown = RAISE


class DatasetUploadSchema(StrictSchema):
    metadata = fields.String(required=True, metadata={"description": "metadata JSON"})


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
    status = fields.String()
    created_at = fields.String()


class BudgetRowSchema(Schema):
    cap = fields.Float()
    committed = fields.Float()
    reserved = fields.Float()
    remaining = fields.Float()


class BudgetSchema(Schema):
    dataset_id = fields.String()
    measures = fields.Dict(keys=fields.String(), values=fields.Nested(BudgetRowSchema))


class ReleaseRequestSchema(StrictSchema):
    dataset_id = fields.String(required=True, validate=validate.Length(1, 100))
    mechanism = fields.String(required=True, validate=validate.Length(1, 100))
    params = fields.Dict(load_default=dict)
    budget = fields.Dict(keys=fields.String(), values=fields.Raw(), required=True)
    seed = fields.Integer(
        allow_none=True, validate=validate.Range(0, 2**63 - 1),
        metadata={"description": "only accepted when the server allows seeds (tests)"},
    )


class ReleaseSchema(Schema):
    id = fields.String()
    status = fields.String()
    dataset_id = fields.String()
    dataset_version = fields.Integer()
    mechanism = fields.String()
    params = fields.Dict()
    cost = fields.Dict()
    seeded = fields.Boolean()
    result = fields.Dict(allow_none=True)
    accuracy = fields.Dict(allow_none=True)
    guarantee = fields.String(allow_none=True)
    error = fields.Dict()
    replayed = fields.Boolean()
    created_at = fields.String(allow_none=True)
    started_at = fields.String(allow_none=True)
    finished_at = fields.String(allow_none=True)


class EstimateSchema(Schema):
    mechanism = fields.String()
    cost = fields.Dict()
    accuracy = fields.Dict()
    remaining = fields.Dict()


class MechanismSchema(Schema):
    name = fields.String()
    measures = fields.List(fields.String())
    description = fields.String()
    params_schema = fields.Dict()
