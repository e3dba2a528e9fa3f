"""Marshmallow schemas of the four registered mechanisms' ``params``.

Shapes and ranges are checked here (422 at the service); whether the params
fit the dataset (column type, grid size, η range of the summary) is checked
in ``cost`` with MechanismInputError naming the field. Omitted options take
the privacy-safe defaults of ``pss`` (resolved in ``entries``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from mechanisms.iclp.kernels import FAMILIES

#: descriptions shared by several mechanisms' parameters (one copy each)
D_DENSITY_COLUMN = ("the bounded continuous column whose density is released (declared finite "
                    "bounds)")
D_DENSITY_KERNEL = ("the density's base kernel: {family, nu, rho}; default gaussian, rho (the "
                    "bandwidth) auto")
D_ESTIMATOR_KERNEL = ("the kernel of the estimator and of the noise: {family, nu, rho}; default "
                      "Matérn nu 1.5, rho 0.1")
D_GRID_SIZE = ("evenly spaced points over the column's declared bounds the density is evaluated "
               "on (default 200)")
D_MEAN_COLUMN = ("the functional column whose mean function is released (declared grid and norm "
                 "bound)")
D_NOISE_KERNEL = ("the kernel whose eigenbasis carries the noise: {family, nu, rho}; default "
                  "Matérn nu 1.5, rho 0.1")
D_NORMALIZE = ("clip the released density at 0 and rescale it to integrate to 1 (free "
               "post-processing; default true)")


#: largest grid the dense eigen-decomposition is run on (O(M³) time, O(M²) memory)
MAX_GRID_POINTS = 2000
MIN_KDE_GRID = 16
MAX_KDE_GRID = 1000
MAX_LATTICE = 200
MAX_NU = 20.0
MAX_RHO = 10.0
MAX_ETA = 10.0
MAX_PSI = 1e6


class NumberOrChoice(fields.Field):
    """A finite number in (low, high] ([low, high] if ``closed``), or one of a few
    keywords (e.g. ``"auto"``). Its JSON schema says both (``anyOf``), so the catalog,
    the OpenAPI document and the console's forms type it like any other field."""

    default_error_messages = {  # noqa: RUF012 - marshmallow's own convention
        "invalid": "Must be a number in {left}{low:g}, {high:g}] or one of: {choices}.",
    }

    def __init__(self, low: float, high: float, choices: tuple[str, ...],
                 closed: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.low, self.high, self.choices, self.closed = low, high, choices, closed
        number = {"type": "number", "minimum": low, "maximum": high,
                  **({} if closed else {"exclusiveMinimum": True})}
        self.metadata = {"anyOf": [number, {"type": "string", "enum": list(choices)}],
                         **self.metadata}

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> Any:
        if isinstance(value, str) and value in self.choices:
            return value
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (self.low <= value if self.closed else self.low < value)
            and value <= self.high
        ):
            return float(value)
        raise self.make_error(
            "invalid", left="[" if self.closed else "(", low=self.low, high=self.high,
            choices=", ".join(self.choices)
        )


class Strict(Schema):
    class Meta:
        unknown = RAISE


class KernelSchema(Strict):
    """``{"family": "matern" | "gaussian" | "exponential", "nu": ν, "rho": ρ}``.

    ``nu`` is for the Matérn only (default 1.5); ``rho`` is a length-scale as a
    fraction of the domain (the grid span, or a density column's declared range).
    """

    family = fields.String(validate=validate.OneOf(FAMILIES), metadata={
        "description": "the kernel family: matern, gaussian or exponential (default matern for a "
                       "noise kernel, gaussian for a density's kernel)"})
    nu = fields.Float(
        allow_nan=False, validate=validate.Range(min=0, max=MAX_NU, min_inclusive=False),
        metadata={"description": "matern only: the smoothness nu (default 1.5)"},
    )
    rho = NumberOrChoice(0.0, MAX_RHO, ("auto",), metadata={
        "description": "the length-scale, as a fraction of the grid's span; omitted or auto: 0.1 "
                       "(iclp.mean: tuned among 0.1 to 0.01)"})

    @validates_schema
    def _check_nu(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "nu" in data and data.get("family", self.context_family) != "matern":
            raise ValidationError("nu applies only to the matern family.", "nu")

    #: the family assumed when ``family`` is omitted (the noise kernel of the mean)
    context_family = "matern"


class DensityKernelSchema(KernelSchema):
    """The KDE's base kernel C_h; ``rho`` is the bandwidth h (default ``"auto"``)."""

    rho = NumberOrChoice(0.0, MAX_RHO, ("auto",), metadata={
        "description": "the bandwidth h, as a fraction of the column's declared range; omitted"
                       " or auto: max(0.2 n^(-1/5), 2 grid spacings) (iclp.kde, gaussian kernel,"
                       " eta open: tuned with eta)"})

    context_family = "gaussian"


class MeanSmoothingSchema(Strict):
    """η (power of the kernel) and ψ (ridge penalty; 0 = plain projection): numbers or
    privacy-safe rules; the noise covariance profile ("matched": the smoother, "kernel":
    C as in the paper, "auto": "kernel" under the paper's rules, else "matched"); and
    whether the default tuning keeps its FRL guard (``frl_guard``, default true)."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",), metadata={
        "description": "the power eta of the kernel in the smoother, above 1/2; omitted or auto: "
                       "chosen by the public tuning rule"})
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto", "balanced", "free"), closed=True, metadata={
        "description": "the ridge penalty psi (0: plain projection), or a rule: auto (minimum "
                       "predicted risk, the default), balanced ((n eps^2)^(-eta beta/(beta+1))) "
                       "or free (1/n)"})
    noise_profile = fields.String(validate=validate.OneOf(("auto", "matched", "kernel")), metadata={
        "description": "the noise covariance: matched (shaped like the smoother), kernel (the "
                       "kernel's eigenvalues, as in the paper) or auto (kernel under balanced or "
                       "free psi, else matched; the default)"})
    frl_guard = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": "the default tuning keeps the predicted risk at or below FRL's (default "
                       "true)"})


class KdeSmoothingSchema(Strict):
    """η of the estimation kernel C^η (must exceed 1)."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",), metadata={
        "description": "the power eta of the estimation kernel C^eta, above 1; omitted or auto: "
                       "tuned with the bandwidth (gaussian kernel, bandwidth open), else 1 + "
                       "2/beta"})


class IclpMeanSchema(Strict):
    """``iclp.mean``: the ICLP-QR mean of a functional column."""

    column = fields.String(required=True, metadata={
        "description": D_MEAN_COLUMN})
    kernel = fields.Nested(KernelSchema, metadata={
        "description": "the kernel whose eigenbasis carries the noise: {family, nu, rho}; "
                       "default Matérn nu 1.5 with rho tuned"})
    smoothing = fields.Nested(MeanSmoothingSchema, metadata={
        "description": "{eta, psi, noise_profile, frl_guard}: how the mean is smoothed and the "
                       "noise shaped; omitted: the public tuning rules"})
    max_components = fields.Integer(
        strict=True, validate=validate.Range(min=1, max=MAX_GRID_POINTS),
        metadata={"description": "caps the number of the kernel's leading eigen-components"
                                 " used (default: no cap; the tuning picks how many, or all"
                                 " under a fixed psi)"},
    )


class FrlMeanSchema(Strict):
    """``frl.mean``: i.i.d. Laplace on the first M eigen-coefficients of ``kernel``."""

    column = fields.String(required=True, metadata={
        "description": D_MEAN_COLUMN})
    kernel = fields.Nested(KernelSchema, metadata={
        "description": D_NOISE_KERNEL})
    components = NumberOrChoice(0.0, float(MAX_GRID_POINTS), ("auto",), metadata={
        "description": "M, the number of leading eigen-coefficients released, a whole number; "
                       "omitted or auto: the M minimising a data-free risk (privacy error + "
                       "bias and sampling error for a reference smooth mean); the paper's "
                       "floor(sqrt(n) * epsilon) must be given"})

    @validates_schema
    def _check_components(self, data: dict[str, Any], **kwargs: Any) -> None:
        m = data.get("components")
        if isinstance(m, float) and not m.is_integer():
            raise ValidationError("Must be a whole number or 'auto'.", "components")


class IclpKdeSchema(Strict):
    """``iclp.kde``: ICLP-QR density of a bounded continuous column."""

    column = fields.String(required=True, metadata={
        "description": D_DENSITY_COLUMN})
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_KDE_GRID, max=MAX_KDE_GRID),
        metadata={"description": D_GRID_SIZE},
    )
    kernel = fields.Nested(DensityKernelSchema, metadata={
        "description": D_DENSITY_KERNEL})
    smoothing = fields.Nested(KdeSmoothingSchema, metadata={
        "description": "{eta}: the power of the estimation kernel; omitted: tuned"})
    normalize = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": D_NORMALIZE})


class BernsteinKdeSchema(Strict):
    """``bernstein.kde``: the Bernstein mechanism on a KDE of a bounded continuous column."""

    column = fields.String(required=True, metadata={
        "description": D_DENSITY_COLUMN})
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_KDE_GRID, max=MAX_KDE_GRID),
        metadata={"description": D_GRID_SIZE},
    )
    kernel = fields.Nested(DensityKernelSchema, metadata={
        "description": D_DENSITY_KERNEL})
    lattice_size = fields.Integer(strict=True, validate=validate.Range(min=1, max=MAX_LATTICE),
        metadata={"description": "K: the KDE is evaluated, with noise, at K + 1 lattice points, "
                                 "the Bernstein polynomial's degree (default 20)"})
    normalize = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": D_NORMALIZE})


# ------------------------------------------- ICLP-AR, GP-ADP, FRL-KDE, Bernstein mean


class ArSmoothingSchema(Strict):
    """η (>= 1) and ψ of ICLP-AR; omitted: the PSS rules of ``ar``."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",), metadata={
        "description": "the power eta in the soft thresholds, at least 1; omitted or auto: 1 + "
                       "2/beta"})
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto",), metadata={
        "description": "the l1 penalty psi of the soft thresholds, above 0; omitted or auto: the "
                       "balanced public rule"})


class IclpArMeanSchema(Strict):
    """``iclp.ar``: the soft-thresholding (ℓ1-penalised) ICLP mean of a functional column."""

    column = fields.String(required=True, metadata={
        "description": D_MEAN_COLUMN})
    kernel = fields.Nested(KernelSchema, metadata={
        "description": D_NOISE_KERNEL})
    smoothing = fields.Nested(ArSmoothingSchema, metadata={
        "description": "{eta, psi}: the soft thresholds psi / (2 lambda^(eta/2)); omitted: the "
                       "public rules"})


class GpSmoothingSchema(Strict):
    """η (default 1) and ψ (default: the risk minimiser) of GP-ADP's ridge mean."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",), metadata={
        "description": "the power eta of the kernel in the ridge mean, at least 1/2 (default 1)"})
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto",), metadata={
        "description": "the ridge penalty psi, above 0; omitted or auto: the minimiser of the "
                       "predicted risk"})


class GpAdpMeanSchema(Strict):
    """``gp.adp``: the Gaussian-process (ε, δ) mean of a functional column."""

    column = fields.String(required=True, metadata={
        "description": D_MEAN_COLUMN})
    kernel = fields.Nested(KernelSchema, metadata={
        "description": "the kernel of the ridge mean and of the Gaussian process noise: {family, "
                       "nu, rho}; default Matérn nu 1.5, rho 0.1"})
    smoothing = fields.Nested(GpSmoothingSchema, metadata={
        "description": "{eta, psi} of the ridge mean; omitted: eta 1, psi tuned"})


class FrlKdeSchema(Strict):
    """``frl.kde``: FRL density (first M eigen-coefficients of the KDE, i.i.d. Laplace)."""

    column = fields.String(required=True, metadata={
        "description": D_DENSITY_COLUMN})
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_KDE_GRID, max=MAX_KDE_GRID),
        metadata={"description": D_GRID_SIZE},
    )
    kernel = fields.Nested(DensityKernelSchema, metadata={
        "description": D_DENSITY_KERNEL})
    components = NumberOrChoice(0.0, float(MAX_KDE_GRID), ("auto",), metadata={
        "description": "M, the number of leading eigen-coefficients of the KDE released, a whole "
                       "number; omitted or auto: the M minimising a data-free risk (privacy "
                       "error + bias and sampling error for reference normal densities)"})
    normalize = fields.Boolean(truthy={True}, falsy={False}, metadata={
        "description": D_NORMALIZE})

    @validates_schema
    def _check_components(self, data: dict[str, Any], **kwargs: Any) -> None:
        m = data.get("components")
        if isinstance(m, float) and not m.is_integer():
            raise ValidationError("Must be a whole number or 'auto'.", "components")


class BernsteinMeanSchema(Strict):
    """``bernstein.mean``: the Bernstein mechanism on the mean of a functional column.

    ``sup_bound`` τ_∞ clips every curve value to [−τ_∞, τ_∞]; ``"auto"`` (default)
    uses the column's declared norm bound.
    """

    column = fields.String(required=True, metadata={
        "description": D_MEAN_COLUMN})
    lattice_size = fields.Integer(strict=True, validate=validate.Range(min=1, max=MAX_LATTICE),
        metadata={"description": "K: the mean is evaluated, with noise, at K + 1 lattice points, "
                                 "the Bernstein polynomial's degree (default 10)"})
    sup_bound = NumberOrChoice(0.0, 1e12, ("auto",), metadata={
        "description": "tau_inf: every curve value is clipped to [-tau_inf, tau_inf]; omitted or "
                       "auto: the column's declared norm bound"})
