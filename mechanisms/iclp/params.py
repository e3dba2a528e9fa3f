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
    keywords (e.g. ``"auto"``)."""

    default_error_messages = {  # noqa: RUF012 - marshmallow's own convention
        "invalid": "Must be a number in {left}{low:g}, {high:g}] or one of: {choices}.",
    }

    def __init__(self, low: float, high: float, choices: tuple[str, ...],
                 closed: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.low, self.high, self.choices, self.closed = low, high, choices, closed

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

    family = fields.String(validate=validate.OneOf(FAMILIES))
    nu = fields.Float(
        allow_nan=False, validate=validate.Range(min=0, max=MAX_NU, min_inclusive=False)
    )
    rho = NumberOrChoice(0.0, MAX_RHO, ("auto",))

    @validates_schema
    def _check_nu(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "nu" in data and data.get("family", self.context_family) != "matern":
            raise ValidationError("nu applies only to the matern family.", "nu")

    #: the family assumed when ``family`` is omitted (the noise kernel of the mean)
    context_family = "matern"


class DensityKernelSchema(KernelSchema):
    """The KDE's base kernel C_h; ``rho`` is the bandwidth h (default ``"auto"``)."""

    context_family = "gaussian"


class MeanSmoothingSchema(Strict):
    """η (power of the kernel) and ψ (ridge penalty; 0 = plain projection): numbers or
    privacy-safe rules; the noise covariance profile ("matched": the smoother, "kernel":
    C as in the paper, "auto": "kernel" under the paper's rules, else "matched"); and
    whether the default tuning keeps its FRL guard (``frl_guard``, default true)."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",))
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto", "balanced", "free"), closed=True)
    noise_profile = fields.String(validate=validate.OneOf(("auto", "matched", "kernel")))
    frl_guard = fields.Boolean(truthy={True}, falsy={False})


class KdeSmoothingSchema(Strict):
    """η of the estimation kernel C^η (must exceed 1)."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",))


class IclpMeanSchema(Strict):
    """``iclp.mean``: the ICLP-QR mean of a functional column."""

    column = fields.String(required=True)
    kernel = fields.Nested(KernelSchema)
    smoothing = fields.Nested(MeanSmoothingSchema)
    max_components = fields.Integer(
        strict=True, validate=validate.Range(min=1, max=MAX_GRID_POINTS)
    )


class FrlMeanSchema(Strict):
    """``frl.mean``: i.i.d. Laplace on the first M eigen-coefficients of ``kernel``."""

    column = fields.String(required=True)
    kernel = fields.Nested(KernelSchema)
    components = NumberOrChoice(0.0, float(MAX_GRID_POINTS), ("auto",))

    @validates_schema
    def _check_components(self, data: dict[str, Any], **kwargs: Any) -> None:
        m = data.get("components")
        if isinstance(m, float) and not m.is_integer():
            raise ValidationError("Must be a whole number or 'auto'.", "components")


class IclpKdeSchema(Strict):
    """``iclp.kde``: ICLP-QR density of a bounded continuous column."""

    column = fields.String(required=True)
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_KDE_GRID, max=MAX_KDE_GRID)
    )
    kernel = fields.Nested(DensityKernelSchema)
    smoothing = fields.Nested(KdeSmoothingSchema)
    normalize = fields.Boolean(truthy={True}, falsy={False})


class BernsteinKdeSchema(Strict):
    """``bernstein.kde``: the Bernstein mechanism on a KDE of a bounded continuous column."""

    column = fields.String(required=True)
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_KDE_GRID, max=MAX_KDE_GRID)
    )
    kernel = fields.Nested(DensityKernelSchema)
    lattice_size = fields.Integer(strict=True, validate=validate.Range(min=1, max=MAX_LATTICE))
    normalize = fields.Boolean(truthy={True}, falsy={False})


# ------------------------------------------- ICLP-AR, GP-ADP, FRL-KDE, Bernstein mean


class ArSmoothingSchema(Strict):
    """η (>= 1) and ψ of ICLP-AR; omitted: the PSS rules of ``ar``."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",))
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto",))


class IclpArMeanSchema(Strict):
    """``iclp.ar``: the soft-thresholding (ℓ1-penalised) ICLP mean of a functional column."""

    column = fields.String(required=True)
    kernel = fields.Nested(KernelSchema)
    smoothing = fields.Nested(ArSmoothingSchema)


class GpSmoothingSchema(Strict):
    """η (default 1) and ψ (default: the risk minimiser) of GP-ADP's ridge mean."""

    eta = NumberOrChoice(0.0, MAX_ETA, ("auto",))
    psi = NumberOrChoice(0.0, MAX_PSI, ("auto",))


class GpAdpMeanSchema(Strict):
    """``gp.adp``: the Gaussian-process (ε, δ) mean of a functional column."""

    column = fields.String(required=True)
    kernel = fields.Nested(KernelSchema)
    smoothing = fields.Nested(GpSmoothingSchema)


class FrlKdeSchema(Strict):
    """``frl.kde``: FRL density (first M eigen-coefficients of the KDE, i.i.d. Laplace)."""

    column = fields.String(required=True)
    grid_size = fields.Integer(
        strict=True, validate=validate.Range(min=MIN_KDE_GRID, max=MAX_KDE_GRID)
    )
    kernel = fields.Nested(DensityKernelSchema)
    components = NumberOrChoice(0.0, float(MAX_KDE_GRID), ("auto",))
    normalize = fields.Boolean(truthy={True}, falsy={False})

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

    column = fields.String(required=True)
    lattice_size = fields.Integer(strict=True, validate=validate.Range(min=1, max=MAX_LATTICE))
    sup_bound = NumberOrChoice(0.0, 1e12, ("auto",))
