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
    D_ESTIMATOR_KERNEL,
    D_NORMALIZE,
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

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",), metadata={
        "description": "the power eta of the kernel, omitted or auto: 1 + 2/beta from the kernel "
                       "(must exceed 1 for iclp.erm, 1/2 otherwise)"})
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto",), metadata={
        "description": "the ridge penalty psi, above 0; omitted or auto: a public rule from n, "
                       "epsilon and the bounds (no data)"})


def _share(**kwargs: Any) -> fields.Float:
    return fields.Float(allow_nan=False, validate=validate.Range(
        min=0, max=1, min_inclusive=False, max_inclusive=False), **kwargs)


class IclpErmSchema(Strict):
    """``iclp.erm``: regularised ERM of ``response`` on one bounded ``covariate``."""

    covariate = fields.String(required=True, metadata={
        "description": "the bounded continuous column the released function is a function of "
                       "(declared finite bounds)"})
    response = fields.String(required=True, metadata={
        "description": "the bounded numeric column regressed on the covariate (in [0, 1] for the "
                       "logistic loss)"})
    loss = fields.String(validate=validate.OneOf(("square", "logistic")), metadata={
        "description": "square (kernel ridge regression, the default) or logistic (a 0/1 "
                       "response)"})
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_ERM_GRID, max=MAX_ERM_GRID), metadata={
        "description": "M: each covariate value is binned to the nearest of M evenly spaced"
                       " points over its declared bounds, where the function is fitted and"
                       " released (default 100)"})
    kernel = fields.Nested(KernelSchema, metadata={
        "description": D_ESTIMATOR_KERNEL})
    smoothing = fields.Nested(SmoothingSchema, metadata={
        "description": "{eta, psi} of the regularised fit; omitted: the public rules"})


class IclpCovSchema(Strict):
    """``iclp.cov``: covariance function of a functional column (grid <= MAX_COV_GRID)."""

    column = fields.String(required=True, metadata={
        "description": "the functional column whose covariance function is released (declared "
                       "grid of at most 200 points, norm bound)"})
    kernel = fields.Nested(KernelSchema, metadata={
        "description": D_ESTIMATOR_KERNEL})
    smoothing = fields.Nested(SmoothingSchema, metadata={
        "description": "{eta, psi} of the second moment; omitted: the public rules"})
    max_components = fields.Integer(
        strict=True, validate=validate.Range(min=1, max=cov.MAX_COV_GRID), metadata={
        "description": "at most this many of the kernel's eigen-components per axis (default: "
                       "all retained)"})
    centred = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": "subtract a separately released mean (the covariance); false: the "
                       "uncentred second moment (default true)"})
    mean_share = _share(metadata={
        "description": "centred: the share of epsilon spent on the mean, in (0, 1), read exactly "
                       "(default 0.25)"})


class IclpFosSchema(Strict):
    """``iclp.fos``: functional ``response`` on scalar ``covariates`` (+ intercept)."""

    response = fields.String(required=True, metadata={
        "description": "the functional column regressed on the covariates (declared grid and "
                       "norm bound)"})
    covariates = fields.List(fields.String(), required=True, validate=validate.Length(
        min=1, max=fos.MAX_COVARIATES - 1), metadata={
        "description": "the bounded numeric columns, distinct, at most 9; one coefficient "
                       "function each"})
    intercept = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": "also fit an intercept function (default true; counts toward the 10 "
                       "functions)"})
    kernel = fields.Nested(KernelSchema, metadata={
        "description": D_ESTIMATOR_KERNEL})
    smoothing = fields.Nested(SmoothingSchema, metadata={
        "description": "{eta, psi} of the ICLP-QR means of x_k Y; omitted: the public rules"})
    gram_share = _share(metadata={
        "description": "the share of epsilon spent on the Gram matrix of the covariates, in (0, "
                       "1), read exactly (default 0.25)"})

    @validates_schema
    def _distinct(self, data: dict[str, Any], **kwargs: Any) -> None:
        names = data.get("covariates", [])
        if len(set(names)) != len(names):
            raise ValidationError("covariates must be distinct", "covariates")


class IclpKde2dSchema(Strict):
    """``iclp.kde2d``: density of two bounded continuous ``columns`` on an m × m grid."""

    columns = fields.List(fields.String(), required=True, validate=validate.Length(
        equal=2), metadata={
        "description": "the two distinct bounded continuous columns (declared finite bounds) "
                       "whose joint density is released"})
    grid_size = fields.Integer(strict=True, validate=validate.Range(
        min=kde2d.MIN_GRID_SIZE, max=kde2d.MAX_GRID_SIZE), metadata={
        "description": "m: the density is evaluated on an m x m grid over the declared bounds "
                       "(default 32)"})
    bandwidth = NumberOrChoice(0.0, MAX_RHO, ("auto",), metadata={
        "description": "the exponential kernel's bandwidth per axis, as a fraction of each "
                       "declared range; omitted or auto: with eta, the minimiser of a data-free "
                       "risk (privacy error + bias and sampling error for reference normal "
                       "densities) from n, epsilon and the grid"})
    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",), metadata={
        "description": "the power eta of the estimation kernel C^eta, above 1; omitted or auto: "
                       "tuned with the bandwidth (1 + 2/beta when the bandwidth is given)"})
    normalize = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": D_NORMALIZE})

    @validates_schema
    def _distinct(self, data: dict[str, Any], **kwargs: Any) -> None:
        cols = data.get("columns", [])
        if len(cols) == 2 and cols[0] == cols[1]:
            raise ValidationError("the two columns must differ", "columns")
