"""Marshmallow schemas of the interval mechanisms' ``params`` and of their analyses."""

from __future__ import annotations

import itertools
import math
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from mechanisms.interval.anchors import FAMILIES, FUNCTIONALS, LOCATION_SCALE
from mechanisms.interval.functionals import KINDS as FUNCTIONAL_KINDS
from mechanisms.interval.parametric import FAMILIES as FAMILY_NAMES
from mechanisms.interval.transforms import NAMES

MAX_M = 64
MAX_ROUNDS = 16
MAX_SCALE = 1e12
MAX_LOC = 1e15


def _finite(**kwargs: Any) -> fields.Float:
    return fields.Float(allow_nan=False, validate=validate.Range(-MAX_LOC, MAX_LOC), **kwargs)


class AnchorSchema(Schema):
    """An anchor law: ``{"family": "logistic", "loc": 0, "scale": 2}``.

    ``loc`` defaults to the prior median; ``standardize: true`` reads loc and scale in
    prior-SD units around the median. Uniform: ``low``/``high`` or loc ± scale.
    ``optimal``: Theorem 2's density for ``functional`` ("mean" or "second_moment").
    """

    class Meta:
        unknown = RAISE

    family = fields.String(required=True, validate=validate.OneOf(FAMILIES), metadata={
        "description": "the anchor law: logistic, normal, laplace, uniform, or optimal (Theorem "
                       "2's density for functional)"})
    loc = _finite(metadata={
        "description": "its location (default: the prior median; with standardize: prior SDs "
                       "from the median)"})
    scale = fields.Float(allow_nan=False,
                         validate=validate.Range(0, MAX_SCALE, min_inclusive=False), metadata={
        "description": "its scale, above 0 (uniform: the half-width); needed unless calibrate "
                       "chooses it; with standardize: in prior SDs"})
    low = _finite(metadata={
        "description": "uniform only: the low end (with high, instead of loc and scale)"})
    high = _finite(metadata={
        "description": "uniform only: the high end (with low, instead of loc and scale)"})
    standardize = fields.Boolean(load_default=False, metadata={
        "description": "read loc and scale (or low and high) in prior SDs around the prior "
                       "median (default false)"})
    functional = fields.String(validate=validate.OneOf(FUNCTIONALS), metadata={
        "description": "optimal only: mean or second_moment, the functional whose estimate the "
                       "anchors serve best"})

    @validates_schema
    def _check(self, data: dict[str, Any], **kwargs: Any) -> None:
        family = data["family"]
        if ("low" in data) != ("high" in data):
            raise ValidationError("give both low and high.", "high")
        if "low" in data:
            if family != "uniform":
                raise ValidationError("only uniform anchors take low/high.", "low")
            if "loc" in data or "scale" in data:
                raise ValidationError("give low/high or loc/scale, not both.", "low")
            if not data["low"] < data["high"]:
                raise ValidationError("low must be below high.", "high")
        if family == "optimal":
            if "functional" not in data:
                raise ValidationError("optimal anchors need a functional.", "functional")
            extra = sorted({"loc", "scale"} & set(data))
            if extra or data.get("standardize"):
                raise ValidationError("optimal anchors are fixed by the prior.", "family")
        elif "functional" in data:
            raise ValidationError("only optimal anchors take a functional.", "functional")


class _Common(Schema):
    class Meta:
        unknown = RAISE

    column = fields.String(required=True, validate=validate.Length(min=1, max=256), metadata={
        "description": "the numeric column each row of which is released as a random range (its "
                       "declared prior and bounds price the leakage)"})
    calibrate = fields.Boolean(load_default=False, metadata={
        "description": "choose the design's free parameter (the anchor scale; ring: tau_floor; "
                       "progressive: rounds) so the leakage charged meets the agreed budget "
                       "(default false)"})
    transform = fields.String(load_default="identity", validate=validate.OneOf(NAMES), metadata={
        "description": "the pullback g the design runs on: identity (the default), square, abs, "
                       "log (positive lower bound) or exp; ranges are released as pre-images on "
                       "the data scale"})


class _Canonical(_Common):
    anchors = fields.Nested(AnchorSchema, metadata={
        "description": "the law of the anchors: {family, loc, scale, low, high, standardize, "
                       "functional}; needed unless calibrate"})
    exact_cells = fields.List(fields.Integer(strict=True, validate=validate.Range(1, MAX_M)),
                              validate=validate.Length(max=MAX_M), metadata={
        "description": "ranges, by index from 1 (lowest) to m, whose values are released exactly "
                       "(the acceptable range A; default none)"})
    exact_range = fields.List(_finite(), validate=validate.Length(equal=2), metadata={
        "description": "[low, high] on the data scale: values in it are released exactly and "
                       "other ranges exclude it (default none)"})

    @validates_schema
    def _check_common(self, data: dict[str, Any], **kwargs: Any) -> None:
        _check_anchor_need(data)
        rng = data.get("exact_range")
        if rng is not None and not rng[0] <= rng[1]:
            raise ValidationError("exact_range must be [low, high] with low <= high.",
                                  "exact_range")
        m = data.get("m", self.default_m)
        if any(c > m for c in data.get("exact_cells", ())):
            raise ValidationError(f"range indices run from 1 to m = {m}.", "exact_cells")

    default_m = 2


def _check_anchor_need(data: dict[str, Any]) -> None:
    anchors = data.get("anchors")
    if anchors is None:
        if not data.get("calibrate"):
            raise ValidationError("give anchors, or calibrate: true.", "anchors")
        return
    family = anchors["family"]
    if data.get("calibrate"):
        if family not in LOCATION_SCALE or "low" in anchors:
            raise ValidationError(
                "calibration tunes the scale of a location-scale family (logistic, normal,"
                " laplace, uniform with loc/scale).", "anchors")
        if "scale" in anchors:
            raise ValidationError("with calibrate: true the scale is chosen; omit it.",
                                  "anchors")
    elif family in LOCATION_SCALE and "scale" not in anchors and "low" not in anchors:
        raise ValidationError("anchors need a scale (or calibrate: true).", "anchors")


class Case1Schema(_Canonical):
    """Case-I: one anchor U; the record says whether Y <= U."""


class Case2Schema(_Canonical):
    """Case-II: an ordered anchor pair U < V (sorted iid draws)."""

    default_m = 3


class CaseKSchema(_Canonical):
    """Case-K: m ranges from m − 1 sorted iid anchors, or one anchor plus fixed offsets."""

    m = fields.Integer(strict=True, required=True, validate=validate.Range(2, MAX_M), metadata={
        "description": "the number of ranges, 2 to 64 (m - 1 anchors per row)"})
    offsets = fields.List(_finite(), validate=validate.Length(min=1, max=MAX_M - 1), metadata={
        "description": "m - 1 increasing offsets: one anchor U is drawn and the range ends are U "
                       "+ offsets (default: m - 1 sorted iid anchors)"})

    @validates_schema
    def _check_offsets(self, data: dict[str, Any], **kwargs: Any) -> None:
        offsets = data.get("offsets")
        if offsets is not None:
            if len(offsets) != data["m"] - 1:
                raise ValidationError("give m − 1 offsets.", "offsets")
            if any(b <= a for a, b in itertools.pairwise(offsets)):
                raise ValidationError("offsets must be strictly increasing.", "offsets")


class RingSchema(_Common):
    """Ring (Example 3): two ranges, each with prior coverage >= tau_floor for every record."""

    tau_floor = fields.Float(allow_nan=False, load_default=0.25,
                             validate=validate.Range(0.0, 0.5, max_inclusive=False), metadata={
        "description": "every range's prior mass is at least this, for every record, in [0, 0.5) "
                       "(default 0.25; chosen under calibrate)"})


class SelectiveSchema(_Common):
    """Selective collection (Def 5) over a base partition mechanism."""

    base = fields.String(load_default="case1",
                         validate=validate.OneOf(("case1", "case2", "casek", "ring")), metadata={
        "description": "the partition mechanism a range is drawn from: case1 (the default), "
                       "case2, casek or ring"})
    anchors = fields.Nested(AnchorSchema, metadata={
        "description": "the base's anchor law: {family, loc, scale, low, high, standardize, "
                       "functional}; not for the ring"})
    m = fields.Integer(strict=True, validate=validate.Range(2, MAX_M), metadata={
        "description": "casek base only (and needed there): the number of ranges, 2 to 64"})
    offsets = fields.List(_finite(), validate=validate.Length(min=1, max=MAX_M - 1), metadata={
        "description": "casek base only: m - 1 increasing offsets from one drawn anchor "
                       "(default: iid anchors)"})
    tau_floor = fields.Float(
        allow_nan=False, validate=validate.Range(0.0, 0.5, max_inclusive=False), metadata={
            "description": "ring base only: every range's prior mass is at least this, in"
                           " [0, 0.5) (default 0.25)"})
    tau = fields.Float(required=True, allow_nan=False,
                       validate=validate.Range(0.0, 1.0, min_inclusive=False), metadata={
        "description": "a range is collected only if its prior mass is at least tau, in (0, 1]; "
                       "otherwise the row is null"})
    rho = fields.Float(allow_nan=False, validate=validate.Range(0.0, 1.0, min_inclusive=False),
        metadata={"description": "the probability of collecting a range that qualifies, in (0, "
                                 "1], at most P(mass >= tau) (Prop 2; default: a lower "
                                 "confidence bound of that probability)"})

    @validates_schema
    def _check(self, data: dict[str, Any], **kwargs: Any) -> None:
        base = data["base"]
        if base == "ring":
            if "anchors" in data:
                raise ValidationError("the ring draws its anchors from the prior.", "anchors")
        else:
            _check_anchor_need(data)
            if "tau_floor" in data:
                raise ValidationError("tau_floor belongs to the ring base.", "tau_floor")
        if ("m" in data) != (base == "casek"):
            raise ValidationError("m is given exactly for the casek base.", "m")
        if "offsets" in data:
            if base != "casek":
                raise ValidationError("offsets need the casek base.", "offsets")
            if len(data["offsets"]) != data["m"] - 1:
                raise ValidationError("give m − 1 offsets.", "offsets")


class ProgressiveSchema(_Common):
    """Progressive narrowing (Example 4): anchors uniform on the current range."""

    rounds = fields.Integer(strict=True, load_default=3, validate=validate.Range(1, MAX_ROUNDS),
        metadata={"description": "at most this many Case-I questions per row, each anchor "
                                 "uniform on the current range, 1 to 16 (default 3; chosen under "
                                 "calibrate)"})
    tau_stop = fields.Float(allow_nan=False, load_default=0.0,
                            validate=validate.Range(0.0, 1.0, max_inclusive=False), metadata={
        "description": "stop before a round whose anchor would leave either side with prior mass "
                       "below this, in [0, 1) (default 0: never stop early)"})

    @validates_schema
    def _check(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data["transform"] != "identity":
            raise ValidationError("progressive narrowing runs on the raw column.", "transform")


class ProgressiveCategoricalSchema(Schema):
    """Progressive questions on a categorical column: random halving of the options."""

    class Meta:
        unknown = RAISE

    column = fields.String(required=True, validate=validate.Length(min=1, max=256), metadata={
        "description": "the categorical column each row of which is released as a set of "
                       "categories"})
    rounds = fields.Integer(strict=True, load_default=3, validate=validate.Range(1, MAX_ROUNDS),
        metadata={"description": "at most this many questions halving the feasible categories, 1 "
                                 "to 16 (default 3; fewer when one is left)"})


# --------------------------------------------------------------------------- analyses


class NPMLEParams(Schema):
    class Meta:
        unknown = RAISE

    method = fields.String(load_default="auto",
                           validate=validate.OneOf(("auto", "pava", "cnm", "em")))
    tol = fields.Float(load_default=1e-6, validate=validate.Range(1e-12, 1e-2))
    max_iter = fields.Integer(strict=True, validate=validate.Range(1, 1_000_000))


class MeanParams(Schema):
    class Meta:
        unknown = RAISE

    clip = fields.Boolean(load_default=False)


class MomentsParams(NPMLEParams):
    orders = fields.List(fields.Integer(strict=True, validate=validate.Range(1, 8)),
                         load_default=lambda: [1, 2], validate=validate.Length(min=1, max=8))
    convention = fields.String(load_default="right",
                               validate=validate.OneOf(("right", "left", "midpoint")))


class FunctionalSpec(Schema):
    """One functional: ``{"type": "cdf", "t": 1.5}``, ``{"type": "probability",
    "low": a, "high": b}``, ``{"type": "truncated_mean", "low": a, "high": b}`` (either
    end may be omitted: unbounded) or ``{"type": "quantile", "p": 0.5}``."""

    class Meta:
        unknown = RAISE

    type = fields.String(required=True, validate=validate.OneOf(FUNCTIONAL_KINDS))
    t = _finite()
    low = _finite()
    high = _finite()
    p = fields.Float(validate=validate.Range(0, 1, min_inclusive=False, max_inclusive=False))

    @validates_schema
    def _check(self, data: dict[str, Any], **kwargs: Any) -> None:
        kind = data["type"]
        needs = {"cdf": {"t"}, "quantile": {"p"}}.get(kind, set())
        allowed = needs | ({"low", "high"} if kind in ("probability", "truncated_mean")
                           else set())
        missing = sorted(needs - set(data))
        if missing:
            raise ValidationError(f"{kind} needs {missing[0]}.", missing[0])
        extra = sorted(set(data) - allowed - {"type"})
        if extra:
            raise ValidationError(f"{kind} takes no {extra[0]}.", extra[0])
        if "low" in data and "high" in data and not data["low"] < data["high"]:
            raise ValidationError("low must be below high.", "high")


class FunctionalsParams(NPMLEParams):
    functionals = fields.List(fields.Nested(FunctionalSpec), required=True,
                              validate=validate.Length(min=1, max=100))
    convention = fields.String(load_default="right",
                               validate=validate.OneOf(("right", "left", "midpoint")))
    bootstrap = fields.Integer(strict=True, load_default=200, validate=validate.Range(0, 2000))
    level = fields.Float(load_default=0.95, validate=validate.Range(0.5, 0.999))


class CategoriesParams(Schema):
    """NPMLE of the category probabilities from released sets (EM with a certificate)."""

    class Meta:
        unknown = RAISE

    tol = fields.Float(load_default=1e-9, validate=validate.Range(1e-12, 1e-2))
    max_iter = fields.Integer(strict=True, load_default=100_000,
                              validate=validate.Range(1, 1_000_000))


class EDParams(NPMLEParams):
    """Table III's ED = ∫ (F̂ − F)² dy over ``domain`` (default: the column's bounds)."""

    source = fields.String(load_default="final",
                           validate=validate.OneOf(("final", "first_round")))
    domain = fields.List(_finite(), validate=validate.Length(equal=2))
    integer_grid = fields.Boolean(load_default=False)

    @validates_schema
    def _check(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "domain" in data and not data["domain"][0] < data["domain"][1]:
            raise ValidationError("the domain's low end must be below its high end.",
                                  "domain")


class MLEParams(Schema):
    """Parametric MLE (spec §3.2): ``family`` among parametric.FAMILIES."""

    class Meta:
        unknown = RAISE

    family = fields.String(load_default="normal", validate=validate.OneOf(FAMILY_NAMES))
    max_iter = fields.Integer(strict=True, load_default=200, validate=validate.Range(1, 10_000))
    tol = fields.Float(load_default=1e-8, validate=validate.Range(1e-12, 1e-2))


class _ScaleField(fields.Field):
    """A positive number, or "estimate" (Gaussian EM update)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if value == "estimate":
            return None
        if (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and 0 < value <= MAX_SCALE):
            return float(value)
        raise ValidationError('Must be a positive number or "estimate".')


class NoiseSchema(Schema):
    class Meta:
        unknown = RAISE

    family = fields.String(load_default="gaussian", validate=validate.OneOf(("gaussian",
                                                                              "logistic")))
    scale = _ScaleField(load_default=1.0)


class LearnerSchema(Schema):
    """``linear`` (with intercept), ``polynomial`` (all monomials up to degree), or a
    scikit-learn regressor by class name (only where scikit-learn is installed)."""

    class Meta:
        unknown = RAISE

    type = fields.String(load_default="linear",
                         validate=validate.OneOf(("linear", "polynomial", "sklearn")))
    degree = fields.Integer(strict=True, validate=validate.Range(1, 6))
    estimator = fields.String(validate=validate.Regexp(r"^[A-Z][A-Za-z]{1,60}$"))
    options = fields.Dict(keys=fields.String(), values=fields.Raw())

    @validates_schema
    def _check(self, data: dict[str, Any], **kwargs: Any) -> None:
        kind = data["type"]
        if ("degree" in data) != (kind == "polynomial"):
            raise ValidationError("degree is given exactly for polynomial learners.", "degree")
        if ("estimator" in data) != (kind == "sklearn"):
            raise ValidationError("estimator is given exactly for sklearn learners.",
                                  "estimator")
        if "options" in data and kind != "sklearn":
            raise ValidationError("options are for sklearn learners.", "options")
        for value in data.get("options", {}).values():
            if not isinstance(value, str | int | float | bool) and value is not None:
                raise ValidationError("options take plain values only.", "options")


_Row = fields.List(fields.Float(allow_nan=False), validate=validate.Length(min=1, max=1000))


class _RegressionCommon(Schema):
    class Meta:
        unknown = RAISE

    learner = fields.Nested(LearnerSchema, load_default=lambda: {"type": "linear"})
    noise = fields.Nested(NoiseSchema, load_default=lambda: {"family": "gaussian", "scale": 1.0})
    max_iter = fields.Integer(strict=True, load_default=10_000,
                              validate=validate.Range(1, 100_000))
    tol = fields.Float(load_default=1e-8, validate=validate.Range(1e-14, 1e-1))
    init = fields.String(load_default="zero", validate=validate.OneOf(("zero", "midpoint")))
    predict = fields.List(_Row, validate=validate.Length(max=100_000))


class RegressionParams(_RegressionCommon):
    """Features inline: ``features`` is n rows × d numbers, in the dataset's row order."""

    features = fields.List(_Row, required=True, validate=validate.Length(min=1))
    feature_names = fields.List(fields.String(validate=validate.Length(max=64)))


class RegressionReleaseParams(_RegressionCommon):
    """Features from the other release's table: ``columns`` are its numeric table columns."""

    columns = fields.List(fields.String(validate=validate.Length(min=1, max=256)),
                          required=True, validate=validate.Length(min=1, max=1000))
