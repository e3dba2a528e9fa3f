"""The ``dip`` mechanism's parameter schema (shapes only; meaning is checked in ``cost``).

::

    {"columns": ["age", "wage"],                 # 1+ columns, processed in this order
     "reference": {"kind": "dp", "share": 0.5},  # default; or parametric / holdout / public
     "order": "random",                          # optional: a permutation of columns, or "random"
     "release": ["wage"],                        # optional: columns in the table (default all)
     "atoms": {"wage": [0]},                     # optional: public atoms of continuous columns
     "resolution": 1048576}                      # optional: quantization K of the noise step

Reference kinds: ``{"kind": "parametric", "family": ..., "params": {...}}``,
``{"kind": "holdout", "fraction": 0.25}``, ``{"kind": "public", "dataset_id": ...,
"columns": {private: public}}``, ``{"kind": "dp", "share": 0.5, "bins": 32 | {column: n},
"model": "joint" | "copula", "correlation_share": 0.5}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from mechanisms.dip.families import FAMILIES

KINDS = ("parametric", "holdout", "public", "dp")
#: fields each reference kind accepts besides ``kind``
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "parametric": ("family", "params"),
    "holdout": ("fraction",),
    "public": ("dataset_id", "columns"),
    "dp": ("share", "bins", "model", "correlation_share"),
}
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "parametric": ("family",),
    "public": ("dataset_id",),
}
#: columns a release may process; the run's work (``DipMechanism.work``, from p, n, bins
#: and the reference kind) is what the service bounds (e.g. Table 1's p = 250)
MAX_COLUMNS = 1000
MAX_ATOMS = 1000


class _Bins(fields.Field):
    """A positive integer for every binned column, or an object column -> integer."""

    default_error_messages = {  # noqa: RUF012 - marshmallow's own convention
        "invalid": "Must be a positive integer or an object of column names to positive integers.",
    }

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> Any:
        def whole(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 1

        if whole(value):
            return value
        if isinstance(value, dict) and value and all(
            isinstance(k, str) and whole(v) for k, v in value.items()
        ):
            return dict(value)
        raise self.make_error("invalid")


class ReferenceSchema(Schema):
    """Where the reference distribution F comes from."""

    class Meta:
        unknown = RAISE

    kind = fields.String(required=True, validate=validate.OneOf(KINDS), metadata={
        "description": "dp (default): a DP histogram of the data, paid from the budget;"
        " parametric: a public family; public: another registered dataset; holdout: a share"
        " of the rows, never released and NOT protected by DP"})
    family = fields.String(validate=validate.OneOf(FAMILIES), metadata={
        "description": "parametric: the family (product / multivariate_normal for several"
        " columns)"})
    params = fields.Dict(keys=fields.String(), metadata={
        "description": "parametric: the family's public parameters"})
    fraction = fields.Float(allow_nan=False, metadata={
        "description": "holdout: share of the rows held out, in (0, 0.9]; default 0.25"})
    dataset_id = fields.String(validate=validate.Length(min=1, max=200), metadata={
        "description": "public: the public dataset whose rows form the reference"})
    columns = fields.Dict(keys=fields.String(), values=fields.String(), metadata={
        "description": "public: column of this dataset -> column of the public one"})
    share = fields.Float(allow_nan=False, metadata={
        "description": "dp: share of epsilon spent on the histogram, in (0, 1); default 0.5"})
    model = fields.String(validate=validate.OneOf(("joint", "copula")), metadata={
        "description": "dp: joint (one histogram, at most 4 columns; default up to 4) or"
        " copula (a DP histogram per column and a DP correlation matrix; default beyond 4)"})
    correlation_share = fields.Float(allow_nan=False, metadata={
        "description": "dp copula: share of the reference's epsilon spent on the correlation"
        " matrix, in (0, 1); default 0.5"})
    bins = _Bins(metadata={
        "description": "dp: bins per numeric column (an integer or column -> integer);"
        " default from n and epsilon"})

    @validates_schema
    def _check_kind_fields(self, data: dict[str, Any], **kwargs: Any) -> None:
        kind = data["kind"]
        for name in data:
            if name != "kind" and name not in KIND_FIELDS[kind]:
                raise ValidationError(f"reference kind {kind!r} takes no {name!r}.", name)
        for name in REQUIRED_FIELDS.get(kind, ()):
            if name not in data:
                raise ValidationError(f"reference kind {kind!r} needs {name!r}.", name)


class DipParamsSchema(Schema):
    """Parameters of the ``dip`` mechanism."""

    class Meta:
        unknown = RAISE

    columns = fields.List(
        fields.String(), required=True, validate=validate.Length(min=1, max=MAX_COLUMNS),
        metadata={"description": "columns processed (each costs epsilon/p), in chain order"},
    )
    reference = fields.Nested(ReferenceSchema, metadata={
        "description": "where the reference distribution comes from; default {kind: dp}"})
    order = fields.Raw(metadata={
        "description": 'variable order of the chain: a permutation of columns, or "random"'})
    release = fields.List(
        fields.String(), validate=validate.Length(min=1, max=MAX_COLUMNS),
        metadata={"description": "columns in the released table (default: all processed)"},
    )
    atoms = fields.Dict(
        keys=fields.String(),
        values=fields.List(fields.Float(allow_nan=False), validate=validate.Length(1, MAX_ATOMS)),
        metadata={"description": "public atoms (point masses) of continuous columns"},
    )
    resolution = fields.Integer(strict=True, metadata={
        "description": "quantization K of the exact discrete noise step (power of two);"
        " default 2**20"})

    @validates_schema
    def _check_shapes(self, data: dict[str, Any], **kwargs: Any) -> None:
        columns = data["columns"]
        if len(set(columns)) != len(columns):
            raise ValidationError("columns must be distinct.", "columns")
        order = data.get("order")
        if order is not None and order != "random" and not (
            isinstance(order, list) and all(isinstance(c, str) for c in order)
        ):
            raise ValidationError('order is a list of column names or "random".', "order")
