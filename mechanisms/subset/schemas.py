"""Marshmallow schemas of the subset mechanisms' and analyses' parameters.

Only shape and range are checked here; whatever needs the dataset's
metadata (column names, categories, design validity) is checked by
``plan.resolve`` and reported as ``MechanismInputError`` naming the field.
"""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from mechanisms.subset.design import ENUMERATION_LIMIT
from mechanisms.subset.estimation import METHODS
from mechanisms.subset.independence import TEST_METHODS

FORMATS = ("bitmask", "categories", "both")
MAX_SUBSETS = 1 << ENUMERATION_LIMIT
MAX_PRIOR_DRAWS = 8
MAX_PRODUCT_COLUMNS = 16


class _Strict(Schema):
    class Meta:
        unknown = RAISE


def _format() -> fields.String:
    return fields.String(load_default="bitmask", validate=validate.OneOf(FORMATS),
                         metadata={"description": "table columns: bitmask (int64, bit j ="
                                   " category j), categories (names joined by '|'), or both"})


def _prior_draws() -> fields.Integer:
    return fields.Integer(
        strict=True, load_default=0, validate=validate.Range(min=0, max=MAX_PRIOR_DRAWS),
        metadata={"description": "independent draws of the same column already released (the"
                  " accuracy then reports the composed design's disclosure risk)"})


class CustomDesignSchema(_Strict):
    """An explicit design: ν (independent) or μ (conditional) over named subsets."""

    type = fields.String(required=True, validate=validate.OneOf(("nu", "mu")), metadata={
        "description": "nu: probabilities (summing to 1) of subsets drawn without looking at"
                       " the value, the subset or its complement, whichever holds the value,"
                       " released; mu: the conditional design, mu_a = P(A = a | X = j) for j in"
                       " a (each category's subsets summing to 1)"})
    subsets = fields.List(
        fields.List(fields.String(), validate=validate.Length(min=1)),
        required=True, validate=validate.Length(min=1, max=MAX_SUBSETS), metadata={
        "description": "the subsets, each a list of the column's category names"})
    probabilities = fields.List(fields.Float(allow_nan=False),
                                required=True, validate=validate.Length(min=1, max=MAX_SUBSETS),
                                metadata={"description": "one probability per subset, in the"
                                          " same order"})

    @validates_schema
    def _same_length(self, data: dict[str, Any], **kwargs: Any) -> None:
        if len(data["subsets"]) != len(data["probabilities"]):
            raise ValidationError("give one probability per subset.", "probabilities")


class ColumnDesignSchema(_Strict):
    """One column's design inside ``subset.product``."""

    type = fields.String(load_default="uniform", validate=validate.OneOf(("uniform", "nu", "mu")),
        metadata={"description": "uniform (the default; p >= 4, or artificial_levels), nu or mu "
                                 "(explicit, with subsets and probabilities)"})
    subsets = fields.List(fields.List(fields.String(), validate=validate.Length(min=1)),
                          validate=validate.Length(min=1, max=MAX_SUBSETS), metadata={
        "description": "nu or mu: the subsets, each a list of category names"})
    probabilities = fields.List(fields.Float(allow_nan=False),
                                validate=validate.Length(min=1, max=MAX_SUBSETS), metadata={
        "description": "nu or mu: one probability per subset"})
    artificial_levels = fields.Integer(strict=True, validate=validate.Range(min=2, max=16),
        metadata={"description": "uniform only: pair the column with an artificial uniform "
                                 "variable of this many levels (for p < 4)"})

    @validates_schema
    def _combination(self, data: dict[str, Any], **kwargs: Any) -> None:
        explicit = data["type"] != "uniform"
        for name in ("subsets", "probabilities"):
            if explicit and name not in data:
                raise ValidationError(f"a {data['type']} design needs {name}.", name)
            if not explicit and name in data:
                raise ValidationError("the uniform design takes no subsets.", name)
        if explicit and "artificial_levels" in data:
            raise ValidationError("only the uniform design takes artificial_levels.",
                                  "artificial_levels")
        if explicit and len(data["subsets"]) != len(data["probabilities"]):
            raise ValidationError("give one probability per subset.", "probabilities")


class UniformParamsSchema(_Strict):
    """``subset.uniform``: the uniform independent design on one column (p ≥ 4)."""

    column = fields.String(required=True, metadata={
        "description": "the categorical column each record's category of which is released as a "
                       "subset (the uniform design needs 4 or more categories)"})
    combine_with = fields.List(
        fields.String(), validate=validate.Length(min=1, max=7),
        metadata={"description": "further categorical columns joined with `column` into one"
                  " variable (small-domain strategy: gender x income has 4 categories)"})
    artificial_levels = fields.Integer(
        strict=True, validate=validate.Range(min=2, max=16),
        metadata={"description": "pair the variable with an artificial uniform variable of this"
                  " many levels (small-domain strategy for p < 4)"})
    format = _format()
    prior_draws = _prior_draws()


class CustomParamsSchema(_Strict):
    """``subset.custom``: an explicit ν or μ on one column (p ≤ 16)."""

    column = fields.String(required=True, metadata={
        "description": "the categorical column each record's category of which is released as a "
                       "subset (at most 16 categories)"})
    design = fields.Nested(CustomDesignSchema, required=True, metadata={
        "description": "the design: {type: nu or mu, subsets, probabilities}, subsets naming the "
                       "column's categories"})
    format = _format()
    prior_draws = _prior_draws()


class DummyParamsSchema(_Strict):
    """``subset.dummy``: dummy-category augmentation with coverage floor alpha."""

    column = fields.String(required=True, metadata={
        "description": "the categorical column each record's category of which is released as a "
                       "subset"})
    alpha = fields.Float(required=True, allow_nan=False, validate=validate.Range(
        min=0, max=0.5, min_inclusive=False, max_inclusive=False), metadata={
        "description": "the coverage floor, in (0, 0.5): two dummy categories of share alpha "
                       "each are added, and every released subset holds one"})
    base = fields.String(load_default="auto", validate=validate.OneOf(("auto", "uniform",
                                                                        "proper")), metadata={
        "description": "the design on the real categories: uniform, proper (every non-empty "
                       "proper subset) or auto (uniform for 4 or more categories, else proper; "
                       "the default)"})
    format = _format()


class ProductParamsSchema(_Strict):
    """``subset.product``: one design per column, drawn independently (Definition 8)."""

    columns = fields.List(fields.String(), required=True,
                          validate=validate.Length(min=2, max=MAX_PRODUCT_COLUMNS), metadata={
        "description": "2 to 16 distinct categorical columns, each released as a subset drawn "
                       "independently"})
    designs = fields.Dict(keys=fields.String(), values=fields.Nested(ColumnDesignSchema), metadata={
        "description": "a design per column name: {type, subsets, probabilities, "
                       "artificial_levels}; a column not named gets the uniform design"})
    format = _format()
    prior_draws = _prior_draws()

    @validates_schema
    def _distinct(self, data: dict[str, Any], **kwargs: Any) -> None:
        if len(set(data["columns"])) != len(data["columns"]):
            raise ValidationError("a column is listed twice.", "columns")


class EstimateParamsSchema(_Strict):
    """``estimate``: the distribution of one privatized variable, with privacy metrics."""

    column = fields.String(metadata={"description": "which privatized variable (table column);"
                                     " required when the release has several"})
    method = fields.String(load_default="em", validate=validate.OneOf(METHODS))
    project = fields.Boolean(load_default=True)
    tol = fields.Float(load_default=1e-10, validate=validate.Range(min=1e-14, max=1e-3))
    max_iter = fields.Integer(strict=True, load_default=100_000,
                              validate=validate.Range(min=1, max=1_000_000))
    accelerate = fields.Boolean(load_default=True, metadata={
        "description": "EM with safeguarded SQUAREM steps (same MLE, monotone likelihood);"
                       " false runs the plain EM"})


class _TestOptions(_Strict):
    methods = fields.List(fields.String(validate=validate.OneOf(TEST_METHODS)),
                          load_default=lambda: ["lrt_mom"],
                          validate=validate.Length(min=1, max=len(TEST_METHODS)))
    alpha = fields.Float(load_default=0.05, validate=validate.Range(
        min=0, max=1, min_inclusive=False, max_inclusive=False))
    calibration = fields.String(load_default="asymptotic",
                                validate=validate.OneOf(("asymptotic", "permutation")))
    n_perm = fields.Integer(strict=True, load_default=999,
                            validate=validate.Range(min=99, max=9999))
    df_mode = fields.String(load_default="model", validate=validate.OneOf(("model", "paper")))

    @validates_schema
    def _distinct(self, data: dict[str, Any], **kwargs: Any) -> None:
        if len(set(data["methods"])) != len(data["methods"]):
            raise ValidationError("a method is listed twice.", "methods")


class PairTestParamsSchema(_TestOptions):
    """``independence_test`` against one other subset release of the same rows."""

    column = fields.String(metadata={"description": "variable of this release"})
    other_column = fields.String(metadata={"description": "variable of the other release"})


class ProductTestParamsSchema(_TestOptions):
    """``independence_test`` between two variables of one product release."""

    columns = fields.List(fields.String(), validate=validate.Length(equal=2),
                          metadata={"description": "two privatized variables (default: the"
                                    " first two)"})
