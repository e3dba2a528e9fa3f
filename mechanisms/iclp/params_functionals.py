"""Marshmallow schemas of ``iclp.erm``, ``iclp.cov``, ``iclp.fos`` and ``iclp.kde2d``.

Shapes and ranges only (422 at the service); whether the named columns fit
(types, bounds, grid size) is checked in ``cost`` with MechanismInputError.
ε shares are decimal numbers in (0, 1), read exactly (0.25 is 1/4) so the
split of the charged ε is exact.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate, validates_schema

from mechanisms.iclp import cov, fos, kde2d
from mechanisms.iclp.params import (
    MAX_ETA,
    MAX_PSI,
    MAX_RHO,
    KernelSchema,
    NumberOrChoice,
    Strict,
)

MIN_ERM_GRID = 16
MAX_ERM_GRID = 500


class SmoothingSchema(Strict):
    """η (power of the kernel) and ψ (ridge penalty); omitted or "auto": the public rules."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",))
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto",))


def _share() -> fields.Float:
    return fields.Float(allow_nan=False, validate=validate.Range(
        min=0, max=1, min_inclusive=False, max_inclusive=False))


class IclpErmSchema(Strict):
    """``iclp.erm``: regularised ERM of ``response`` on one bounded ``covariate``."""

    covariate = fields.String(required=True)
    response = fields.String(required=True)
    loss = fields.String(validate=validate.OneOf(("square", "logistic")))
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_ERM_GRID, max=MAX_ERM_GRID))
    kernel = fields.Nested(KernelSchema)
    smoothing = fields.Nested(SmoothingSchema)


class IclpCovSchema(Strict):
    """``iclp.cov``: covariance function of a functional column (grid <= MAX_COV_GRID)."""

    column = fields.String(required=True)
    kernel = fields.Nested(KernelSchema)
    smoothing = fields.Nested(SmoothingSchema)
    max_components = fields.Integer(
        strict=True, validate=validate.Range(min=1, max=cov.MAX_COV_GRID))
    centred = fields.Boolean(truthy={True}, falsy={False})
    mean_share = _share()


class IclpFosSchema(Strict):
    """``iclp.fos``: functional ``response`` on scalar ``covariates`` (+ intercept)."""

    response = fields.String(required=True)
    covariates = fields.List(fields.String(), required=True, validate=validate.Length(
        min=1, max=fos.MAX_COVARIATES - 1))
    intercept = fields.Boolean(truthy={True}, falsy={False})
    kernel = fields.Nested(KernelSchema)
    smoothing = fields.Nested(SmoothingSchema)
    gram_share = _share()

    @validates_schema
    def _distinct(self, data: dict[str, Any], **kwargs: Any) -> None:
        names = data.get("covariates", [])
        if len(set(names)) != len(names):
            raise ValidationError("covariates must be distinct", "covariates")


class IclpKde2dSchema(Strict):
    """``iclp.kde2d``: density of two bounded continuous ``columns`` on an m × m grid."""

    columns = fields.List(fields.String(), required=True, validate=validate.Length(
        equal=2))
    grid_size = fields.Integer(strict=True, validate=validate.Range(
        min=kde2d.MIN_GRID_SIZE, max=kde2d.MAX_GRID_SIZE))
    bandwidth = NumberOrChoice(0.0, MAX_RHO, ("auto",))
    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",))
    normalize = fields.Boolean(truthy={True}, falsy={False})

    @validates_schema
    def _distinct(self, data: dict[str, Any], **kwargs: Any) -> None:
        cols = data.get("columns", [])
        if len(cols) == 2 and cols[0] == cols[1]:
            raise ValidationError("the two columns must differ", "columns")
