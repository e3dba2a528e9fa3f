"""Marshmallow schemas of the dataset metadata an operator uploads.

One schema per column type and one per prior family, chosen by the object's
``type`` / ``family`` (a hand-written one-of: plain marshmallow has none).
``service.ingest.parse_metadata`` loads with ``MetadataSchema`` and reports the
first error as ``IngestError(field, message)``, the field being the full path
(``metadata.columns.x.prior.scale``); messages never hold a cell value, only
public names and limits. ``register_components`` puts every schema into the
OpenAPI document, so ``/openapi.json`` describes the format the upload checks.

The limits are those the mechanisms can compute with (``mechanisms.base``
bounds rule, ``mechanisms.interval.priors.RANGES``): a dataset the upload
accepts can be released from without a numeric failure.
"""

from __future__ import annotations

import itertools
import math
import unicodedata
from collections.abc import Mapping
from typing import Any, ClassVar

from apispec import APISpec
from marshmallow import (
    RAISE,
    Schema,
    ValidationError,
    fields,
    post_load,
    validate,
    validates_schema,
)

from mechanisms.base import MAX_ABS_BOUND, MechanismInputError, bounds_problem
from mechanisms.interval.priors import FAMILIES, RANGES, make_prior
from mechanisms.zcdp import ACCOUNTINGS, DEFAULT_DELTA
from service.budget import NOTIONS

MAX_NAME_LENGTH = 200
MAX_CATEGORIES = 10_000
MAX_GRID = 2000  # the functional mechanisms refuse larger grids
#: declared columns in an upload's metadata (a functional column counts once)
MAX_COLUMNS = 1000
#: fields in the CSV header: every declared scalar column alongside one full-size
#: functional column (MAX_GRID cells), so the largest advertised grid can be uploaded;
#: the byte limit (MAX_UPLOAD_BYTES) and ingest's cell-bounded chunks bound the rest
MAX_CSV_FIELDS = MAX_COLUMNS + MAX_GRID
COLUMN_TYPES = ("continuous", "integer", "categorical", "functional")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Number(fields.Float):
    """A JSON number (never a string or a boolean), finite; loads as float."""

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> float:
        if not _is_number(value) or not math.isfinite(value):
            raise ValidationError("must be a finite number")
        return float(value)


class StrictBoolean(fields.Boolean):
    """Only JSON true/false (marshmallow's Boolean also takes "yes", 1, "on")."""

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise ValidationError("must be true or false")
        return value


class _Strict(Schema):
    class Meta:
        unknown = RAISE


def _tag(name: str) -> fields.String:
    """The discriminator field (``type`` / ``family``): exactly this schema's name."""
    return fields.String(required=True, validate=validate.OneOf([name]))


def _param(name: str, family: str, *, required: bool = True) -> Number:
    low, high = RANGES[family][name]
    doc = {"description": f"in [{low:g}, {high:g}]", "minimum": low, "maximum": high}
    return Number(required=required, validate=validate.Range(low, high, error=(
        f"must be in [{low:g}, {high:g}]")), metadata=doc)


class _PriorSchema(_Strict):
    """A public prior; ``family`` picks the parameters (scipy's names are not accepted)."""

    family_name: ClassVar[str]

    @validates_schema
    def _low_below_high(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "low" in data and "high" in data and not data["low"] < data["high"]:
            raise ValidationError("must be greater than low", "high")


class NormalPriorSchema(_PriorSchema):
    family_name = "normal"
    family = _tag("normal")
    loc = _param("loc", "normal")
    scale = _param("scale", "normal")


class LogisticPriorSchema(_PriorSchema):
    family_name = "logistic"
    family = _tag("logistic")
    loc = _param("loc", "logistic")
    scale = _param("scale", "logistic")


class LaplacePriorSchema(_PriorSchema):
    family_name = "laplace"
    family = _tag("laplace")
    loc = _param("loc", "laplace")
    scale = _param("scale", "laplace")


class StudentTPriorSchema(_PriorSchema):
    family_name = "t"
    family = _tag("t")
    df = _param("df", "t")
    loc = _param("loc", "t")
    scale = _param("scale", "t")


class UniformPriorSchema(_PriorSchema):
    family_name = "uniform"
    family = _tag("uniform")
    low = _param("low", "uniform")
    high = _param("high", "uniform")


class BetaPriorSchema(_PriorSchema):
    """Beta(a, b) on [low, high] (default [0, 1])."""

    family_name = "beta"
    family = _tag("beta")
    a = _param("a", "beta")
    b = _param("b", "beta")
    low = _param("low", "beta", required=False)
    high = _param("high", "beta", required=False)

    @validates_schema
    def _both_ends(self, data: dict[str, Any], **kwargs: Any) -> None:
        if ("low" in data) != ("high" in data):
            missing = "high" if "low" in data else "low"
            raise ValidationError("give both low and high, or neither", missing)


class LognormalPriorSchema(_PriorSchema):
    """log Y ~ normal(mu, sigma)."""

    family_name = "lognormal"
    family = _tag("lognormal")
    mu = _param("mu", "lognormal")
    sigma = _param("sigma", "lognormal")


class GammaPriorSchema(_PriorSchema):
    family_name = "gamma"
    family = _tag("gamma")
    shape = _param("shape", "gamma")
    scale = _param("scale", "gamma")


PRIOR_SCHEMAS: dict[str, type[_PriorSchema]] = {
    cls.family_name: cls for cls in (
        NormalPriorSchema, LogisticPriorSchema, LaplacePriorSchema, StudentTPriorSchema,
        UniformPriorSchema, BetaPriorSchema, LognormalPriorSchema, GammaPriorSchema)
}
assert set(PRIOR_SCHEMAS) == set(FAMILIES)


def _ref(cls: type[Schema]) -> dict[str, str]:
    """An OpenAPI reference to the component ``register_components`` names after ``cls``."""
    return {"$ref": f"#/components/schemas/{cls.__name__.removesuffix('Schema')}"}


def _one_of(mapping: Mapping[str, type[Schema]], value: Any, key: str, what: str) -> Any:
    """Load ``value`` with the schema its ``key`` names; errors nest under the field."""
    if not isinstance(value, dict):
        raise ValidationError(f"must be a JSON object with a {key!r}")
    name = value.get(key)
    if not isinstance(name, str):
        raise ValidationError({key: [f"required: one of {', '.join(mapping)}"]})
    if name not in mapping:
        shown = name if len(name) <= 40 else name[:37] + "..."
        raise ValidationError({key: [f"unknown {what} {shown!r}; one of {', '.join(mapping)}"]})
    schema = mapping[name]()
    known = set(schema.fields)
    for other in value:
        if other not in known:
            raise ValidationError({str(other): [_unknown_message(mapping, name, other, what)]})
    return schema.load(value)


def _unknown_message(mapping: Mapping[str, type[Schema]], name: str, key: Any,
                     what: str) -> str:
    allowed = [f for f in mapping[name]().fields if f not in ("family", "type")]
    elsewhere = any(key in cls().fields for cls in mapping.values())
    if what == "column type":
        article = "an" if name[0] in "aeiou" else "a"
        return (f"not allowed for {article} {name} column" if elsewhere
                else f"unknown key; a {name} column takes {', '.join(['type', *allowed])}")
    return f"a {name} prior takes {', '.join(allowed)}"


class Prior(fields.Field):
    """A prior object, checked by the schema of its ``family``."""

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = _one_of(PRIOR_SCHEMAS, value, "family", "prior family")
        return loaded


class Bounds(fields.Field):
    """``[lo, hi]``: two JSON numbers; the column schema checks the domain rule."""

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> tuple[float | int, float | int]:
        if (not isinstance(value, list | tuple) or len(value) != 2
                or not all(map(_is_number, value))):
            raise ValidationError("must be a list [lo, hi] of two numbers")
        return value[0], value[1]


class _ColumnSchema(_Strict):
    type_name: ClassVar[str]
    allow_missing = StrictBoolean(load_default=False)
    fill = fields.Raw(metadata={"description": "the value of a missing cell (allow_missing); "
                                               "default: the lower bound"})

    @validates_schema
    def _fill_needs_missing(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "fill" in data and not data["allow_missing"]:
            raise ValidationError("only allowed with allow_missing: true", "fill")


class _NumericColumnSchema(_ColumnSchema):
    bounds = Bounds(required=True, metadata={
        "type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
        "description": "[lo, hi]: finite, lo < hi, |lo|, |hi| <= 1e100 (2**53 for integer "
                       "columns), hi - lo >= max(1e-100, 1e-9 max(|lo|, |hi|))"})

    @validates_schema
    def _domain(self, data: dict[str, Any], **kwargs: Any) -> None:
        lo, hi = data["bounds"]
        integer = self.type_name == "integer"
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValidationError("bounds must be finite", "bounds")
        if integer and not all(isinstance(b, int) or float(b).is_integer() for b in (lo, hi)):
                raise ValidationError("bounds of an integer column must be integers", "bounds")
        problem = bounds_problem(float(lo), float(hi), integer)
        if problem is not None:
            raise ValidationError(problem, "bounds")
        if "fill" in data:
            fill = data["fill"]
            if not _is_number(fill) or not math.isfinite(fill):
                raise ValidationError("must be a finite number", "fill")
            if integer and not (isinstance(fill, int) or float(fill).is_integer()):
                raise ValidationError("must be an integer for an integer column", "fill")
            if not lo <= fill <= hi:
                raise ValidationError(f"must lie within the column's bounds [{lo}, {hi}]", "fill")

    @post_load
    def _typed(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        convert = int if self.type_name == "integer" else float
        data["bounds"] = tuple(convert(b) for b in data["bounds"])
        if "fill" in data:
            data["fill"] = convert(data["fill"])
        return data


class ContinuousColumnSchema(_NumericColumnSchema):
    type_name = "continuous"
    type = _tag("continuous")
    prior = Prior(metadata={"description": "the public prior interval privacy measures "
                                           "coverage against; default uniform on bounds",
                            "oneOf": [_ref(cls) for cls in PRIOR_SCHEMAS.values()]})

    @validates_schema
    def _prior_on_bounds(self, data: dict[str, Any], **kwargs: Any) -> None:
        """A prior with no mass on the bounds, or numerically a point there, is refused."""
        if "prior" not in data:
            return
        lo, hi = data["bounds"]
        try:
            make_prior(data["prior"], (float(lo), float(hi)))
        except MechanismInputError as err:
            raise ValidationError(err.message, "prior") from None


class IntegerColumnSchema(_NumericColumnSchema):
    type_name = "integer"
    type = _tag("integer")


class SubsetPolicySchema(_Strict):
    """Operator thresholds on subset-privacy designs (spec §9.4), checked before a release
    is charged against the design's metrics under a uniform prior (public inputs only)."""

    min_size_coverage = Number(validate=validate.Range(0, 1, error="must be in [0, 1]"),
                               metadata={"description": "lowest allowed size coverage E[L(A)]"})
    max_mi_bits = Number(validate=validate.Range(0, 64, error="must be in [0, 64]"),
                         metadata={"description": "highest allowed I(X;A) in bits"})
    max_prediction_risk = Number(validate=validate.Range(0, 1, error="must be in [0, 1]"),
                                 metadata={"description": "highest allowed probability that"
                                           " the best guess of a record's category is right"})


def _subset_policy(where: str) -> fields.Nested:
    return fields.Nested(SubsetPolicySchema, metadata={
        "description": f"subset-privacy thresholds for {where}"})


class CategoricalColumnSchema(_ColumnSchema):
    type_name = "categorical"
    type = _tag("categorical")
    subset_policy = _subset_policy("this column (each key overrides the dataset's default)")
    categories = fields.Raw(required=True, metadata={
        "type": "array", "items": {"type": "string"}, "minItems": 1,
        "maxItems": MAX_CATEGORIES, "uniqueItems": True})

    @validates_schema
    def _categories(self, data: dict[str, Any], **kwargs: Any) -> None:
        raw = data["categories"]
        if (not isinstance(raw, list | tuple) or not raw
                or not all(isinstance(c, str) for c in raw)):
            raise ValidationError("must be a non-empty list of strings", "categories")
        if len(raw) > MAX_CATEGORIES:
            raise ValidationError(f"at most {MAX_CATEGORIES} categories are allowed",
                                  "categories")
        seen: set[str] = set()
        for cat in raw:
            if cat in seen:
                shown = cat if len(cat) <= 80 else cat[:77] + "..."
                raise ValidationError(f"category {shown!r} is listed more than once",
                                      "categories")
            seen.add(cat)
        if data["allow_missing"]:
            if "fill" not in data:
                raise ValidationError("required for a categorical column with allow_missing",
                                      "fill")
            if not isinstance(data["fill"], str) or data["fill"] not in raw:
                raise ValidationError("must be one of the column's categories", "fill")

    @post_load
    def _typed(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        data["categories"] = tuple(data["categories"])
        return data


class FunctionalColumnSchema(_Strict):
    """A curve per row, on a public grid, with an L2 norm bound (CSV: f.0 ... f.<M-1>)."""

    type_name: ClassVar[str] = "functional"
    type = _tag("functional")
    grid = fields.Raw(required=True, metadata={
        "type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": MAX_GRID,
        "description": "strictly increasing"})
    norm_bound = Number(required=True, validate=validate.Range(
        0, MAX_ABS_BOUND, min_inclusive=False,
        error=f"required: a number > 0 and <= {MAX_ABS_BOUND:g}"))

    @validates_schema
    def _increasing(self, data: dict[str, Any], **kwargs: Any) -> None:
        grid = data["grid"]
        if (not isinstance(grid, list) or not 2 <= len(grid) <= MAX_GRID
                or not all(_is_number(g) and math.isfinite(g) for g in grid)):
            raise ValidationError(f"required: a list of 2 to {MAX_GRID} finite numbers", "grid")
        if any(b <= a for a, b in itertools.pairwise(data["grid"])):
            raise ValidationError("must be strictly increasing", "grid")

    @post_load
    def _typed(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        data["grid"] = tuple(float(g) for g in data["grid"])
        return data


COLUMN_SCHEMAS: dict[str, type[Schema]] = {
    cls.type_name: cls for cls in (
        ContinuousColumnSchema, IntegerColumnSchema, CategoricalColumnSchema,
        FunctionalColumnSchema)
}


class Columns(fields.Field):
    """Column name -> column object, each checked by the schema of its ``type``."""

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> dict[str, dict[str, Any]]:
        max_columns = self.parent.context_max_columns  # type: ignore[union-attr]
        if not isinstance(value, dict) or not value:
            raise ValidationError("required, a non-empty JSON object")
        if len(value) > max_columns:
            raise ValidationError(f"at most {max_columns} columns are allowed")
        out: dict[str, dict[str, Any]] = {}
        for name, raw in value.items():
            if not isinstance(name, str) or not name:
                raise ValidationError("column names must be non-empty strings")
            if len(name) > MAX_NAME_LENGTH:
                raise ValidationError(
                    f"column names must be at most {MAX_NAME_LENGTH} characters")
            if any(unicodedata.category(ch) == "Cc" for ch in name):
                # names appear in error fields, logs and CSV headers: no line breaks or tabs
                raise ValidationError("column names must not contain control characters")
            try:
                if not isinstance(raw, dict):
                    raise ValidationError("must be a JSON object")
                if not isinstance(raw.get("type"), str) or raw["type"] not in COLUMN_SCHEMAS:
                    raise ValidationError(
                        {"type": [f"must be one of {', '.join(map(repr, COLUMN_TYPES))}"]})
                out[name] = _one_of(COLUMN_SCHEMAS, raw, "type", "column type")
            except ValidationError as err:
                raise ValidationError({name: err.messages}) from None
        return out


class MetadataSchema(_Strict):
    """The ``metadata`` JSON of ``POST /v1/datasets``."""

    name = fields.String(required=True, validate=[
        validate.Length(max=MAX_NAME_LENGTH, error=f"at most {MAX_NAME_LENGTH} characters"),
        validate.Predicate("strip", error="required, a non-empty string")],
        metadata={"description": "a label; not unique"})
    columns = Columns(required=True, metadata={
        "type": "object", "description": "column name -> its description, by type",
        "additionalProperties": {"oneOf": [
            _ref(cls) for cls in COLUMN_SCHEMAS.values()]}})
    budgets = fields.Dict(required=True, metadata={
        "description": "measure -> cap (see README: budgets)"})
    subset_policy = _subset_policy("every categorical column (the default)")
    keep_row_order = StrictBoolean(load_default=False, metadata={
        "description": "release microdata in the dataset's row order (collection is local by"
                       " design); by default records come in a secret per-dataset order"})
    bounds_policy = fields.String(load_default="reject",
                                  validate=validate.OneOf(("reject", "clip")))
    public = StrictBoolean(load_default=False)
    allow_holdout = StrictBoolean(load_default=False)

    def __init__(self, *, max_columns: int = MAX_COLUMNS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.context_max_columns = max_columns

    # -- accounting: how DP releases are charged, and which privacy notions are admitted
    gaussian_accounting = fields.String(
        load_default="approx_dp", validate=validate.OneOf(ACCOUNTINGS), metadata={
            "description": "approx_dp: Gaussian releases charge (epsilon, delta); zcdp: every"
            " DP release charges rho (Gaussian: Delta^2/(2 sigma^2); pure epsilon:"
            " epsilon^2/2) against one rho cap"})
    zcdp_delta = Number(load_default=float(DEFAULT_DELTA), validate=validate.Range(
        min=0, max=1, min_inclusive=False, max_inclusive=False, error="must be in (0, 1)"),
        metadata={"description": "public delta at which rho amounts are shown as"
                  " (epsilon, delta)-DP"})
    notions = fields.List(
        fields.String(validate=validate.OneOf(NOTIONS)),
        validate=validate.Length(min=1, error="name at least one notion"), metadata={
            "description": "privacy notions releases may use: dp, noiseless, interval,"
            " subset. Default: the notions of the measures the budgets name (epsilon,"
            " delta, rho: dp; noiseless_bits: noiseless; interval_leakage: interval;"
            " subset_draws: subset); stored resolved"})
    record_level = StrictBoolean(load_default=False, metadata={
        "description": "allow record-level releases, one output per record (subset.*,"
                       " interval.*, noiseless.local, dip, lrm, opm.l2ball): the operator's"
                       " explicit opt-in; by default they are refused (422"
                       " record_level_not_admitted)"})
    allow_mixed_noiseless_dp = StrictBoolean(load_default=False, metadata={
        "description": "allow both noiseless and DP releases (then neither has a finite"
        " guarantee); by default the first one locks the dataset to its notion"})

    @validates_schema
    def _accounting(self, data: dict[str, Any], **kwargs: Any) -> None:
        """A zcdp dataset charges every DP release in rho: an epsilon or delta cap there
        would never be spent, so it is a mistake to report, not to keep."""
        notions = data.get("notions", [])
        if len(set(notions)) != len(notions):
            raise ValidationError("names a notion twice", field_name="notions")
        if data.get("gaussian_accounting") == "zcdp":
            for name in data.get("budgets", {}):
                if str(name).partition(":")[0] in ("epsilon", "delta"):
                    raise ValidationError(
                        "a zcdp dataset charges DP releases in rho: give budgets.rho",
                        field_name=f"budgets.{name}")


def accounting_fields(loaded: Mapping[str, Any]) -> dict[str, Any]:
    """The accounting part of loaded metadata, as the dataset document stores it."""
    return {name: loaded[name] for name in ACCOUNTING_FIELDS if name in loaded}


#: ``notions`` is absent when the metadata names none (registration resolves it from the
#: budgets, ``budget.default_notions``); ``record_level`` is the record-level opt-in
ACCOUNTING_FIELDS = ("gaussian_accounting", "zcdp_delta", "notions", "allow_mixed_noiseless_dp",
                     "record_level")


def first_error(messages: Any, prefix: str = "metadata") -> tuple[str, str]:
    """The first (field path, message) of marshmallow's nested error dict."""
    while isinstance(messages, dict):
        key, messages = next(iter(messages.items()))
        if key != "_schema":
            prefix = f"{prefix}.{key}"
    while isinstance(messages, list | tuple):
        messages = messages[0]
        if isinstance(messages, dict):
            return first_error(messages, prefix)
    text = str(messages)
    if text == "Unknown field.":
        text = "unknown key"
    elif text == "Missing data for required field.":
        text = "required"
    return prefix, text


def register_components(spec: APISpec) -> None:
    """Put the metadata schemas into the OpenAPI document (``components.schemas``)."""
    schemas: list[type[Schema]] = [*PRIOR_SCHEMAS.values(), *COLUMN_SCHEMAS.values(),
                                   SubsetPolicySchema]
    for cls in schemas:
        name = cls.__name__.removesuffix("Schema")
        if name not in spec.components.schemas:
            spec.components.schema(name, schema=cls)
    if "DatasetMetadata" not in spec.components.schemas:
        spec.components.schema("DatasetMetadata", schema=MetadataSchema)


__all__ = ["ACCOUNTING_FIELDS", "COLUMN_SCHEMAS", "PRIOR_SCHEMAS", "MetadataSchema",
           "accounting_fields", "first_error", "register_components"]
