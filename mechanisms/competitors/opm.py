"""``opm.mean`` and ``opm.l2ball``: Duchi, Jordan & Wainwright's locally private procedures
(JASA 2018), DIP's OPM competitor (spec §4).

``opm.mean`` (their §3.2.1). Each record releases Z_i = [X_i]_T + W_i, the value
clipped to [c - T, c + T] plus Laplace noise, and the estimate is the mean of the
Z_i. Under E|X - c|^k <= r^k the paper takes T = r (nε²)^(1/(2k)) (k < ∞) and T = r
for k = ∞ (|X - c| <= r). Here r for k = ∞ is the declared bound's radius
R = max(|lo - c|, |hi - c|); for finite k the caller gives the public moment bound
r (``moment_bound``) and T = min(R, r (nε²)^(1/(2k))) (clipping beyond the bounds
is the identity). Values are first clipped to the bounds, then to [c - T, c + T];
the noise is calibrated to the width of [a, b] = [c - T, c + T] ∩ [lo, hi], which
is the paper's 2T/ε whenever [c - T, c + T] lies inside the bounds (e.g. the
``midpoint`` centre with k = ∞) and smaller (still ε-DP) otherwise;
``paper_scale: true`` keeps the paper's 2T/ε there too (on data in [0, hi] with the
zero centre the default is then exactly ``lrm``'s noise, the paper's twice it). Noise is
exact discrete Laplace on a lattice (``common``). Several columns: ε/p each
(the paper's NOPM).

Bias: the estimate is unbiased for the mean of [X]_T. As
(|x| - T)_+ <= |x|^k / T^(k-1) for |x| >= T, |E X - E [X]_T| <= E|X - c|^k / T^(k-1)
<= r^k / T^(k-1); with the paper's T this is r (nε²)^(-(k-1)/(2k)).

``opm.l2ball`` (their §4.2.3), as DIP's paper used it: the whole column is one
point v in R^d, d = n, centred at c, so ||v||_2 <= r = R √n. Then

1. Ṽ = +r v/||v|| with probability 1/2 + ||v||/(2r), else -r v/||v||;
2. with probability π, Z is uniform on the hemisphere {||z|| = B, <z, Ṽ> > 0},
   otherwise on the opposite one;
3. B = r / ((2π - 1) E|U_1|), E|U_1| = Γ(d/2) / (√π Γ((d+1)/2)) for U uniform
   on the unit sphere of R^d, i.e. B = r (e^ε+1)/(e^ε-1) √π Γ((d+1)/2)/Γ(d/2) when
   π = e^ε/(e^ε+1).

Proof that E[Z | v] = v (the constant; we could not read the JASA text, so it is
derived here and tested by Monte Carlo in ``tests/unit/competitors``): given Ṽ,
Z = σ w with w uniform on the sphere of radius B and σ = +1 iff w is in the
chosen hemisphere. By symmetry E[Z | Ṽ] = (2π - 1) B E|U_1| Ṽ/r (the hemisphere
{<z, u> > 0} has mean B E|<U, u>| u = B E|U_1| u). And E[Ṽ | v] = r (||v||/r) v/||v||
= v. So E[Z | v] = (2π - 1) B E|U_1| v / r = v iff B is as in 3. In d = 1,
E|U_1| = 1 and Z = ±B. Also Z Zᵀ = w wᵀ whatever σ, so E[Z Zᵀ] = (B²/d) I and the
mean of Z has variance B²/n² - v̄² (d = n).

Privacy, exactly and in floating point. The hemisphere coin is an exact
Bernoulli(π̂) from one 64-bit word: π̂ = N/2^64 with N = ⌊π 2^64⌋ computed with
a downward margin, so 1/2 < π̂ <= π, and B uses π̂ (so E[Z|v] = v stays exact).
The direction w = B g/||g|| is computed from a Gaussian vector g alone, and the
release is Z = ±w with the sign s = h · t · sgn<g, v>, h the coin (±1), t the Ṽ
sign. For each g the output is w with probability a_g(v) = π̂ q + (1 - π̂)(1 - q)
or (1 - π̂) q + π̂ (1 - q) (q = P(t = +1), by sgn<g, v>) and -w with 1 - a_g(v);
both lie in [1 - π̂, π̂] for every q in [0, 1]. Hence for any output float vector
z, P(Z = z | v) = Σ_g P(g) [a_g(v) 1{w(g) = z} + (1 - a_g(v)) 1{-w(g) = z}] and
the ratio between two inputs is at most π̂/(1 - π̂) <= e^ε. The float sphere
sampler, the float ⟨g, v⟩ and the float q therefore cannot leak: they change
which of ±w(g) is output and with what probability in [1-π̂, π̂], never the set
of floats reachable, and negation is exact. Only the exact coin matters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import Schema, ValidationError, fields, validate, validates_schema
from scipy import special

from mechanisms import sampling
from mechanisms.base import (
    Budget,
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
    check_numeric_column,
    read_epsilon,
)
from mechanisms.competitors.common import (
    PRIVACY_UNIT,
    ROW_COLUMN,
    ColumnsSchema,
    Lattice,
    PerColumnMechanism,
    column_array,
    exact_sum,
    lattice,
    numeric_columns,
    split_epsilon,
)
from mechanisms.exact import fmt

CENTRES = ("zero", "midpoint")
#: largest finite moment order k (the paper's UC-salary run used 20)
MAX_K = 1000
#: the hemisphere coin needs π̂ - 1/2 >= 2^-54 (so B is finite and well above rounding)
_MIN_EXCESS = 1 << 10


def centre(column: ColumnMeta, how: str) -> tuple[float, float]:
    """(c, R): the centre and the bound radius max(|lo - c|, |hi - c|)."""
    assert column.bounds is not None
    lo, hi = float(column.bounds[0]), float(column.bounds[1])
    c = 0.0 if how == "zero" else lo / 2 + hi / 2
    return c, max(abs(lo - c), abs(hi - c))


# --------------------------------------------------------------------------- opm.mean


class OpmMeanParamsSchema(ColumnsSchema):
    k = fields.Integer(strict=True, load_default=None, allow_none=True,
                       validate=validate.Range(min=2, max=MAX_K), metadata={
        "description": "the moment order k >= 2 of the public bound E|X - c|^k <= r^k (needs "
                       "moment_bound); default none: k = infinity, |X - c| bounded by the "
                       "declared bounds"})
    moment_bound = fields.Float(load_default=None, allow_none=True, allow_nan=False, metadata={
        "description": "r, the public moment bound for k, above 0 (with k only); sets the "
                       "truncation T = min(R, r (n eps^2)^(1/(2k)))"})
    center = fields.String(load_default="zero", validate=validate.OneOf(CENTRES), metadata={
        "description": "the centre c the values are clipped around: zero (the default) or "
                       "midpoint (of the declared bounds)"})
    #: calibrate the noise to the paper's 2T/ε even where [c - T, c + T] leaves the bounds
    paper_scale = fields.Boolean(load_default=False, metadata={
        "description": "noise of the paper's scale 2T/epsilon even where [c - T, c + T] leaves "
                       "the bounds (default false: the smaller width of the clipped interval)"})

    @validates_schema
    def _check_moment(self, data: dict[str, Any], **kwargs: Any) -> None:
        k, r = data.get("k"), data.get("moment_bound")
        if k is None and r is not None:
            raise ValidationError("only with a finite k", "moment_bound")
        if k is not None and r is None:
            raise ValidationError("a finite k needs the public moment bound r", "moment_bound")
        if r is not None and not (math.isfinite(r) and r > 0):
            raise ValidationError("must be a positive number", "moment_bound")


@dataclass(frozen=True)
class MeanPlan:
    """One column: centre, truncation T, the noise lattice on [a, b], its bias bound."""

    centre: float
    threshold: float
    lattice: Lattice
    bias_bound: float  # bound on |E X - E [X]_T| from the moment condition (0 for k = ∞)


def truncation(r: float, k: int | None, n: int, epsilon: float) -> float:
    """T = r for k = ∞, else r (nε²)^(1/(2k)) (DJW §3.2.1)."""
    if k is None:
        return r
    return r * math.exp(math.log(max(n, 1) * epsilon * epsilon) / (2 * k))


class OpmMeanMechanism(PerColumnMechanism):
    """DJW's clipped-Laplace locally private mean, ε/p per column."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 96.0
    fixed_bytes = 4 * 2**20

    name = "opm.mean"
    params_schema = OpmMeanParamsSchema
    description = (
        "DIP's OPM competitor (Duchi, Jordan & Wainwright 2018, §3.2.1): pure epsilon-DP"
        " mean of each column from locally privatized values, clipped to [c - T, c + T]"
        " with exact discrete Laplace noise; epsilon/p per column."
    )

    def _plan(self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta
              ) -> dict[str, MeanPlan]:
        columns = numeric_columns(params, meta)
        per = epsilon / len(columns)
        k, r = params.get("k"), params.get("moment_bound")
        out = {}
        for col in columns:
            assert col.bounds is not None
            lo, hi = float(col.bounds[0]), float(col.bounds[1])
            c, radius = centre(col, params.get("center", "zero"))
            t = radius if k is None or r is None else min(
                radius, truncation(float(r), k, meta.n_rows, float(per)))
            a, b = max(lo, c - t), min(hi, c + t)
            if not a < b:
                raise MechanismInputError("params.moment_bound",
                                          "[c - T, c + T] misses the declared bounds")
            if params.get("paper_scale"):  # clipping to [c - T, c + T] is then the same
                a, b = c - t, c + t
            integer = col.type == "integer" and a == math.ceil(a) and b == math.floor(b)
            bias = 0.0 if (k is None or r is None or t >= radius) else r**k / t ** (k - 1)
            out[col.name] = MeanPlan(c, t, lattice(a, b, per, integer=integer), bias)
        return out

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
                 ) -> dict[str, Any]:
        epsilon, per = split_epsilon(cost, self.name, len(params["columns"]))
        return self._accuracy(self._plan(params, epsilon, meta), meta.n_rows, per)

    def run(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        epsilon, per = split_epsilon(cost, self.name, len(params["columns"]))
        plans = self._plan(params, epsilon, meta)
        n = meta.n_rows
        values = []
        for name, plan in plans.items():
            k = plan.lattice.index(column_array(data, name, n))
            k += sampling.discrete_laplace(rng, plan.lattice.scale, n)
            values.append(self.estimate(plan.lattice, exact_sum(k), n))
        return Output(
            result={"columns": list(plans), "values": values,
                    "epsilon": {"total": float(epsilon), "per_column": float(per)},
                    "truncation": {n_: p.threshold for n_, p in plans.items()}},
            accuracy=self._accuracy(plans, n, per),
            guarantee=(f"pure epsilon-DP (OPM mean, epsilon={fmt(epsilon)} nats; epsilon="
                       f"{fmt(per)} per column over {len(plans)} column(s), each record"
                       f" privatized on its own with exact discrete Laplace noise),"
                       f" {PRIVACY_UNIT}"),
        )

    @staticmethod
    def estimate(plan: Lattice, total: int, n: int) -> float:
        """c + g Σ(k + D)/n exactly, then one rounding: a function of the integer sum."""
        if n == 0:
            return math.nan
        return float(Fraction(plan.centre) + Fraction(plan.grid) * Fraction(total, n))

    @staticmethod
    def _accuracy(plans: Mapping[str, MeanPlan], n: int, per: Fraction) -> dict[str, Any]:
        columns = {}
        for name, p in plans.items():
            sd = math.sqrt(p.lattice.noise_variance / n) if n else math.inf
            columns[name] = {
                "truncation": p.threshold, "clip": [p.lattice.lo, p.lattice.hi],
                "noise": "discrete_laplace", "scale": p.lattice.laplace_scale,
                "noise_variance": p.lattice.noise_variance, "noise_sd": sd,
                "ci95_halfwidth_normal": 1.959964 * sd,
                "ci95_halfwidth_chebyshev": math.sqrt(20.0) * sd,
                "bias_bound": p.bias_bound,
            }
        statement = (
            f"Each value is clipped to its column's clip interval and gets independent noise"
            f" (epsilon={float(per):.6g} per column); the released mean is unbiased for the"
            " mean of the clipped values, with noise standard deviation noise_sd (within"
            " ci95_halfwidth_chebyshev with probability >= 95%, or ci95_halfwidth_normal by"
            " the normal approximation), plus the data's own sampling error. With a finite"
            " k the clipping bias is at most bias_bound if E|X - c|^k <= moment_bound^k."
        )
        return {"columns": columns, "statement": statement}


# --------------------------------------------------------------------------- opm.l2ball


class OpmL2BallParamsSchema(Schema):
    column = fields.String(required=True, metadata={
        "description": "the numeric column (declared bounds) released as one point of the l2 "
                       "ball, d = n"})
    center = fields.String(load_default="zero", validate=validate.OneOf(CENTRES), metadata={
        "description": "the centre c the values are clipped around: zero (the default) or "
                       "midpoint (of the declared bounds)"})


@dataclass(frozen=True)
class BallPlan:
    """The ℓ2-ball mechanism on the whole column: centre, radius r, coin N/2^64, B."""

    centre: float
    lo: float
    hi: float
    radius: float
    coin: int  # N: the hemisphere coin is Bernoulli(N / 2^64), N/2^64 <= e^ε/(e^ε + 1)
    big_b: float
    d: int

    @property
    def coin_probability(self) -> Fraction:
        return Fraction(self.coin, 1 << 64)


def coin_word(epsilon: Fraction) -> int:
    """N = ⌊π 2^64⌋ - 1 <= π 2^64, π = 1/(1 + e^-ε) (60 significant digits, then a margin)."""
    with localcontext() as ctx:
        ctx.prec = 60
        e = (-Decimal(epsilon.numerator) / Decimal(epsilon.denominator)).exp()
        pi = Decimal(1) / (1 + e)
        return int(pi * Decimal(1 << 64)) - 1


def mean_abs_coordinate(d: int) -> float:
    """E|U_1| = Γ(d/2) / (√π Γ((d+1)/2)) for U uniform on the unit sphere of R^d."""
    return math.exp(special.gammaln(d / 2) - special.gammaln((d + 1) / 2)) / math.sqrt(math.pi)


def ball_radius(r: float, coin: Fraction, d: int) -> float:
    """B = r / ((2π̂ - 1) E|U_1|): E[Z | v] = v (module docstring)."""
    return r / (float(2 * coin - 1) * mean_abs_coordinate(d))


def l2ball_sample(v: np.ndarray, plan: BallPlan, rng: np.random.Generator) -> np.ndarray:
    """One release Z for the centred vector v (||v|| <= r); see the module docstring."""
    d = v.shape[0]
    norm = float(np.sqrt(np.dot(v, v)))
    q = min(1.0, 0.5 + norm / (2.0 * plan.radius))
    sign = 1.0 if rng.random() < q else -1.0  # the Ṽ sign (any q keeps ε-DP)
    h = 1.0 if int(rng.integers(0, 1 << 64, dtype=np.uint64)) < plan.coin else -1.0
    g: np.ndarray = np.zeros(d)
    while True:  # a zero (or non-finite) Gaussian vector has no direction: redraw
        g = np.asarray(rng.standard_normal(d), dtype=np.float64)
        size = float(np.sqrt(np.dot(g, g)))
        if 0.0 < size < math.inf:
            break
    w = plan.big_b * (g / size)
    side = 1.0 if (norm > 0 and float(np.dot(g, v)) > 0) or (norm == 0 and g[0] > 0) else -1.0
    out: np.ndarray = w if h * sign * side > 0 else -w  # negation is exact
    return out


class OpmL2BallMechanism(Mechanism):
    """DJW's ℓ2-ball sampler on the whole column as one vector (DIP's OPM microdata)."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 96.0
    fixed_bytes = 4 * 2**20

    record_level = True  # one output per record: the dataset's opt-in

    name = "opm.l2ball"
    measures = ("epsilon",)
    params_schema = OpmL2BallParamsSchema
    description = (
        "DIP's OPM competitor (Duchi, Jordan & Wainwright 2018, §4.2.3): the whole column"
        " as one point of the l2 ball of radius R sqrt(n), released as a point on the sphere"
        " of radius B with E[Z] = the centred data; pure epsilon-DP microdata."
    )

    def _plan(self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta
              ) -> BallPlan:
        col = meta.column(params["column"])
        lo, hi = check_numeric_column(col)
        c, radius = centre(col, params.get("center", "zero"))
        d = max(meta.n_rows, 1)
        coin = coin_word(epsilon)
        if coin - (1 << 63) < _MIN_EXCESS:
            raise MechanismInputError("budget.epsilon", "epsilon too small for the coin")
        r = radius * math.sqrt(d)
        big_b = ball_radius(r, Fraction(coin, 1 << 64), d)
        if not math.isfinite(big_b) or big_b > 1e300:
            raise MechanismInputError("budget.epsilon", "the sphere radius B overflows")
        return BallPlan(c, lo, hi, r, coin, big_b, d)

    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
             ) -> dict[str, Fraction]:
        epsilon = read_epsilon(budget, self.name)
        self._plan(params, epsilon, meta)
        return {"epsilon": epsilon}

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
                 ) -> dict[str, Any]:
        plan = self._plan(params, read_epsilon(cost, self.name), meta)
        return self._accuracy(plan)

    def run(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        epsilon = read_epsilon(cost, self.name)
        plan = self._plan(params, epsilon, meta)
        n = meta.n_rows
        name = params["column"]
        x = np.clip(np.asarray(column_array(data, name, n), dtype=np.float64), plan.lo, plan.hi)
        np.copyto(x, plan.lo, where=np.isnan(x))
        z = l2ball_sample(x - plan.centre, plan, rng) + plan.centre if n else x
        return Output(
            result={"n_rows": n, "columns": [name], "row_column": ROW_COLUMN,
                    "epsilon": float(epsilon), "radius": plan.radius, "B": plan.big_b,
                    "mean": float(np.mean(z)) if n else math.nan},
            accuracy=self._accuracy(plan),
            guarantee=(f"pure epsilon-DP (OPM l2-ball, epsilon={fmt(epsilon)} nats: the whole"
                       " column is one epsilon-locally-private point; exact hemisphere coin),"
                       f" {PRIVACY_UNIT}"),
            table={ROW_COLUMN: np.arange(n, dtype=np.int64), name: z},
            row_column=ROW_COLUMN,
        )

    @staticmethod
    def _accuracy(plan: BallPlan) -> dict[str, Any]:
        n = plan.d
        return {
            "radius": plan.radius, "B": plan.big_b,
            "coin_probability": float(plan.coin_probability),
            "value_rms_error_bound": plan.big_b / math.sqrt(n),
            "mean_sd_bound": plan.big_b / n,
            "statement": (
                "The released vector Z lies on the sphere of radius B around the centre and"
                " is unbiased for the clipped column: E[Z] = x, E||Z - x||^2 = B^2 - ||x - c||^2"
                " (rms error per value at most B/sqrt(n)); the released mean has standard"
                " deviation at most B/n. Each value is a coordinate of a random point on a"
                " sphere: the marginal distribution of the data is NOT preserved."
            ),
        }
