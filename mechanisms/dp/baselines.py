"""DP baselines: ``laplace``, ``geometric`` and ``gaussian`` on bounded columns.

Cross-tabs (``group_by``), quantiles, variance/std and covariance are planned and
released by ``tables``, ``quantiles`` and ``moments`` (``extended_plan``); this module
validates their params and charges their budget like any other statistic.

Statistics: ``count`` of rows meeting a condition, bounded ``sum`` and
``mean`` of a numeric column, and ``histogram`` of a categorical column or of
a numeric column over public bins. Privacy unit (DESIGN §3): neighbouring
datasets differ in one record replaced and ``n_rows`` is public, so a count
has sensitivity 1, a histogram L1 sensitivity 2 (L2 √2), a sum hi − lo and a
mean (hi − lo)/n, with hi, lo the *declared* bounds.

Float safety (DESIGN §6): noise is integer-valued and added to the statistic
expressed on a lattice ``grid * Z``:

* integer-valued statistics (counts, histograms, sums of integer columns) use
  grid 1 and are already lattice points, so the lattice sensitivity is the
  sensitivity itself;
* real-valued statistics (sums of continuous columns, means) use a power of
  two ``g <= min(Δ, noise scale) / 2**10``, are rounded to the nearest
  lattice point, and pay ``floor((Δ + 2·err) / g) + 1`` lattice units of
  sensitivity: two reals at distance ≤ D round to integers at distance
  ≤ D + 1, hence ≤ floor(D) + 1, and ``err`` is a public bound on the
  floating-point error of computing the statistic (see ``_real_error``).

Data handling: values are clipped to the declared bounds (missing values
count as the lower bound), category codes outside the declared list and
numeric values outside a histogram's edges fall in no bin; only the needed
column is read.

Streaming (issue #30): the data pass is a ``LatticeStatistic`` (exact integer partials
over batches of rows that merge in any order, ``mechanisms.statistics``) and
``Baseline.release`` adds the noise; ``run`` is the two over whole columns, so both paths
give the same bits. Tables, quantiles and moments hand out their own statistics.
"""

from __future__ import annotations

import abc
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Protocol

import numpy as np
from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema
from numpy.typing import NDArray
from scipy import optimize, special

from mechanisms import sampling, zcdp
from mechanisms.base import MAX_EPSILON as MAX_EPSILON
from mechanisms.base import MIN_DELTA as MIN_DELTA
from mechanisms.base import (
    Budget,
    ColumnMeta,
    DatasetMeta,
    MechanismInputError,
    Output,
    StreamingMechanism,
    Work,
    read_budget,
)
from mechanisms.columns import MAX_BOUND as MAX_BOUND
from mechanisms.columns import Condition, clean, declared_bounds
from mechanisms.dp.confidence import ConfidenceSchema
from mechanisms.exact import float_down, float_up, fmt
from mechanisms.registry import register
from mechanisms.statistics import (
    Batch,
    Partial,
    Statistic,
    check_rows,
    float_sums,
    to_float,
    whole,
)

# MAX_EPSILON, MIN_DELTA (base) and MAX_BOUND (columns) are imported ``X as X`` above:
# they live there now and are still importable from here

STATISTICS = ("count", "sum", "mean", "histogram")
#: statistics released by their own modules (``tables``, ``quantiles``, ``moments``)
EXTENDED = ("quantile", "variance", "std", "covariance")
MAX_QUANTILES = 99
MAX_GRID_SIZE = 10_000
MAX_COVARIANCE_COLUMNS = 10
OPS = ("eq", "ne", "lt", "le", "gt", "ge", "in")
ORDER_OPS = frozenset({"lt", "le", "gt", "ge"})
MAX_BINS = 10_000
MAX_IN_VALUES = 10_000
CI_LEVEL = 0.95
PRIVACY_UNIT = "neighbouring datasets differ in one record replaced; n_rows public"
#: real-valued statistics keep |statistic| / grid below this, so lattice values are exact doubles
LATTICE_LIMIT = 2**52
#: integer sums are computed in int64 and must stay below this
INT_SUM_LIMIT = 2**62


# --------------------------------------------------------------------------- params


class _ConditionValue(fields.Field):
    """A number, a string, or a non-empty list of them (for ``in``)."""

    default_error_messages = {  # noqa: RUF012 - marshmallow's own convention
        "invalid": "Must be a finite number, a string, or a non-empty list of them.",
    }

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> Any:
        if isinstance(value, list):
            if not 1 <= len(value) <= MAX_IN_VALUES:
                raise self.make_error("invalid")
            return [self._scalar(v) for v in value]
        return self._scalar(value)

    def _scalar(self, value: Any) -> str | int | float:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return value
        raise self.make_error("invalid")


class ConditionSchema(Schema):
    """``{"column", "op", "value"}``: which rows a ``count`` counts."""

    class Meta:
        unknown = RAISE

    column = fields.String(required=True, metadata={"description": "the column compared"})
    op = fields.String(required=True, validate=validate.OneOf(OPS), metadata={
        "description": "the comparison: eq, ne, lt, le, gt, ge, or in (a list of values)"})
    value = _ConditionValue(required=True, metadata={
        "description": "what the column is compared with (a category, a number, a list for in)"})

    @validates_schema
    def _check_value_shape(self, data: dict[str, Any], **kwargs: Any) -> None:
        if (data["op"] == "in") != isinstance(data["value"], list):
            raise ValidationError("'in' takes a list; every other op a single value.", "value")


class StatisticParamsSchema(Schema):
    """A statistic of ``column``, or ``count`` of the rows meeting ``condition``.

    Subclasses restrict ``statistic`` to what they release (the baselines and
    ``noiseless.aggregate`` share the shape, not the list).
    """

    class Meta:
        unknown = RAISE

    statistic = fields.String(required=True, metadata={"description": "what to release"})
    column = fields.String(metadata={
        "description": "the column the statistic reads (a name in the dataset's metadata)"})
    condition = fields.Nested(ConditionSchema, metadata={
        "description": "count only: which rows to count, as {column, op, value}"})

    @validates_schema
    def _check_combination(self, data: dict[str, Any], **kwargs: Any) -> None:
        statistic = data["statistic"]
        if statistic == "count":
            if "condition" not in data:
                raise ValidationError("count needs a condition.", "condition")
            if data.get("column", data["condition"]["column"]) != data["condition"]["column"]:
                raise ValidationError("count reads condition.column; omit column.", "column")
        else:
            if "column" not in data:
                raise ValidationError(f"{statistic} needs a column.", "column")
            if "condition" in data:
                raise ValidationError("only count takes a condition.", "condition")


class BaselineParamsSchema(StatisticParamsSchema):
    """Parameters shared by the three baselines."""

    statistic = fields.String(required=True, validate=validate.OneOf(STATISTICS + EXTENDED),
                              metadata={"description": "what to release"})
    bins = fields.Integer(strict=True, validate=validate.Range(min=1, max=MAX_BINS), metadata={
        "description": "histogram: equal-width bins over the column's declared bounds"})
    edges = fields.List(
        fields.Float(allow_nan=False), validate=validate.Length(min=2, max=MAX_BINS + 1),
        metadata={"description": "histogram: increasing bin edges (instead of bins)"})
    #: cross-tab: count, sum or mean per cell of these categorical columns
    group_by = fields.List(fields.String(), validate=validate.Length(min=1, max=4), metadata={
        "description": "count, sum or mean: one cell per combination of these categorical"
                       " columns' categories (a cross-tab)"})
    consistency = fields.Boolean(metadata={
        "description": "cross-tab: counts made non-negative whole numbers totalling at"
                       " most n, sums clipped to the sign the bounds force (free"
                       " post-processing)"})
    quantiles = fields.List(
        fields.Float(allow_nan=False, validate=validate.Range(min=0, max=1)),
        validate=validate.Length(min=1, max=MAX_QUANTILES),
        metadata={"description": "quantile: the levels, each in [0, 1] (0.5: the median)"})
    grid_size = fields.Integer(strict=True, validate=validate.Range(min=2, max=MAX_GRID_SIZE),
                               metadata={"description": "quantile: evenly spaced candidate"
                                                        " points over the column's bounds"})
    interval = fields.Boolean(metadata={
        "description": "quantile: also an interval in the column's units per quantile (two"
                       " more draws: each quantile's epsilon split in three)"})
    columns = fields.List(
        fields.String(), validate=validate.Length(min=2, max=MAX_COVARIANCE_COLUMNS),
        metadata={"description": "covariance: the numeric columns of the matrix"})
    psd = fields.Boolean(metadata={
        "description": "covariance: project the released matrix onto the positive"
                       " semidefinite ones (free post-processing)"})
    confidence = fields.Nested(ConfidenceSchema, metadata={
        "description": "tables and covariance: per-cell intervals at level (the default,"
                       " 0.95), or with simultaneous: true intervals that hold for every"
                       " cell at once"})

    #: the parameters each statistic may take beyond statistic/column/condition
    _ALLOWED: ClassVar[Mapping[str, frozenset[str]]] = {
        "count": frozenset({"group_by", "consistency", "confidence"}),
        "sum": frozenset({"group_by", "consistency", "confidence"}),
        "mean": frozenset({"group_by", "consistency", "confidence"}),
        "histogram": frozenset({"bins", "edges"}),
        "quantile": frozenset({"quantiles", "grid_size", "interval"}),
        "variance": frozenset(),
        "std": frozenset(),
        "covariance": frozenset({"columns", "psd", "confidence"}),
    }

    @validates_schema
    def _check_combination(self, data: dict[str, Any], **kwargs: Any) -> None:
        statistic = data["statistic"]
        for name in ("group_by", "consistency", "quantiles", "grid_size", "interval", "columns",
                     "psd", "confidence"):
            if name in data and name not in self._ALLOWED[statistic]:
                raise ValidationError(f"{statistic} does not take {name}.", name)
        for name in ("consistency", "confidence"):
            if name in data and "group_by" not in data and statistic != "covariance":
                raise ValidationError(f"{name} applies to group_by tables.", name)
        if statistic == "count" and "group_by" in data:  # a condition filters, optionally
            if "column" in data:
                raise ValidationError("a count table counts rows; omit column.", "column")
            return
        if statistic == "quantile" and "quantiles" not in data:
            raise ValidationError("quantile needs quantiles.", "quantiles")
        if statistic == "covariance":
            if "columns" not in data:
                raise ValidationError("covariance needs columns.", "columns")
            for name in ("column", "condition"):
                if name in data:
                    raise ValidationError(f"covariance reads columns; omit {name}.", name)
            return
        super()._check_combination(data, **kwargs)

    @validates_schema
    def _check_histogram(self, data: dict[str, Any], **kwargs: Any) -> None:
        for name in ("bins", "edges"):
            if name in data and data["statistic"] != "histogram":
                raise ValidationError("only histogram takes bins or edges.", name)
        if "bins" in data and "edges" in data:
            raise ValidationError("give bins or edges, not both.", "edges")
        edges = data.get("edges")
        if edges is not None and any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValidationError("edges must be strictly increasing.", "edges")


# --------------------------------------------------------------------------- public query


@dataclass(frozen=True)
class _Query:
    """What is computed, described by public inputs only."""

    statistic: str
    column: ColumnMeta
    n: int
    #: L1 sensitivity in statistic units (exact)
    sensitivity: Fraction
    #: the statistic only takes integer values (so it already lies on grid 1)
    integer: bool
    bounds: tuple[Fraction, Fraction] | None = None  # effective clipping bounds
    condition: Condition | None = None
    edges: tuple[float, ...] | None = None

    @property
    def histogram(self) -> bool:
        return self.statistic == "histogram"

    @property
    def l2_sensitivity(self) -> float:
        """Replace-one moves one unit between two bins: L2 √2 (rounded up)."""
        if self.histogram:
            return math.nextafter(math.sqrt(2.0), math.inf)
        return float_up(self.sensitivity)

    def labels(self) -> dict[str, Any]:
        if self.edges is None:
            assert self.column.categories is not None
            return {"categories": list(self.column.categories)}
        return {"bins": [[a, b] for a, b in itertools.pairwise(self.edges)]}


def resolve_query(params: Mapping[str, Any], meta: DatasetMeta) -> _Query:
    """Check params against the metadata; raises MechanismInputError naming the field."""
    statistic = params["statistic"]
    n = meta.n_rows
    if statistic == "count":
        spec = params["condition"]
        column = meta.column(spec["column"], "params.condition.column")
        return _Query(
            statistic, column, n, Fraction(1), integer=True,
            condition=resolve_condition(spec, column),
        )
    column = meta.column(params["column"])
    if statistic == "histogram":
        return _histogram_query(params, column, n)
    lo, hi = declared_bounds(column, statistic)
    if statistic == "mean" and n < 1:
        raise MechanismInputError("params.statistic", "mean of an empty dataset")
    if column.type == "integer" and 2 * n * (hi - lo) >= INT_SUM_LIMIT:
        # records minus a center within the range, summed in int64
        raise MechanismInputError("params.column", "declared bounds too wide for an exact sum")
    sensitivity = hi - lo if statistic == "sum" else (hi - lo) / n
    integer = statistic == "sum" and column.type == "integer"
    return _Query(statistic, column, n, sensitivity, integer=integer, bounds=(lo, hi))


def _histogram_query(params: Mapping[str, Any], column: ColumnMeta, n: int) -> _Query:
    if column.type == "categorical":
        for name in ("bins", "edges"):
            if name in params:
                raise MechanismInputError(
                    f"params.{name}",
                    f"column {column.name!r} is categorical; its bins are its categories",
                )
        if not column.categories:
            raise MechanismInputError(
                "params.column", f"column {column.name!r} declares no categories"
            )
        return _Query("histogram", column, n, Fraction(2), integer=True)
    lo, hi = declared_bounds(column, "histogram")
    if "edges" in params:
        edges = tuple(float(e) for e in params["edges"])
        if edges[0] < lo or edges[-1] > hi:
            raise MechanismInputError(
                "params.edges", f"edges must lie inside the declared bounds of {column.name!r}"
            )
    elif "bins" in params:
        edges = tuple(float(e) for e in np.linspace(float(lo), float(hi), params["bins"] + 1))
    else:
        raise MechanismInputError(
            "params.bins", f"a histogram of numeric column {column.name!r} needs bins or edges"
        )
    return _Query("histogram", column, n, Fraction(2), integer=True, bounds=(lo, hi), edges=edges)


def resolve_condition(spec: Mapping[str, Any], column: ColumnMeta) -> Condition:
    op, raw = spec["op"], spec["value"]
    values = raw if isinstance(raw, list) else [raw]
    if column.type == "categorical":
        if op in ORDER_OPS:
            raise MechanismInputError(
                "params.condition.op",
                f"column {column.name!r} is categorical; use eq, ne or in",
            )
        categories = list(column.categories or ())
        codes = []
        for value in values:
            if not isinstance(value, str):
                raise MechanismInputError(
                    "params.condition.value",
                    f"column {column.name!r} is categorical; compare with category names",
                )
            if value not in categories:
                raise MechanismInputError(
                    "params.condition.value",
                    f"{value!r} is not a declared category of column {column.name!r}",
                )
            codes.append(float(categories.index(value)))
        return Condition(column.name, op, tuple(codes), None)
    if any(isinstance(value, str) for value in values):
        raise MechanismInputError(
            "params.condition.value", f"column {column.name!r} is numeric; compare with numbers"
        )
    clip = None
    if column.bounds is not None and all(math.isfinite(b) for b in column.bounds):
        clip = (float(column.bounds[0]), float(column.bounds[1]))
    return Condition(column.name, op, tuple(float(v) for v in values), clip)


# --------------------------------------------------------------------------- budget


# --------------------------------------------------------------------------- lattice plan


@dataclass(frozen=True)
class _Plan:
    """Everything about a release that follows from public inputs."""

    query: _Query
    grid: float  # lattice step g, statistic units (a power of two; 1 for integer statistics)
    #: the statistic is released as center * (n for sums, 1 for means) + g * lattice value
    center: float
    #: lattice units a neighbour can move the lattice value (per moved bin for histograms)
    lattice_sensitivity: int
    noise: str
    noise_scale: float  # discrete Laplace scale or discrete Gaussian sigma, lattice units
    halfwidth: int  # 95% half-width of the noise, lattice units
    divisor: int = 1  # geometric mean: the released noisy sum is divided by n
    l2: bool = False
    label: str = ""  # the statistic the analyst asked for (geometric releases a mean as sum / n)

    def offset(self) -> Fraction:
        """Public part of the release: n·center for sums, center for means."""
        q = self.query
        return Fraction(self.center) * (q.n if q.statistic == "sum" else 1)


def _lattice(query: _Query, noise_scale: float) -> tuple[float, float, int]:
    """Grid, center and lattice sensitivity of a statistic whose noise has ``noise_scale``.

    Integer statistics: grid 1, center lo for sums (0 otherwise), sensitivity
    as is. Real ones: g <= min(Δ, noise_scale) / 2**10, center lo snapped to
    the grid, and floor((Δ + 2 err) / g) + 1 units, where err bounds the
    floating-point error of each neighbour's computed statistic.
    """
    if query.integer:
        lo = query.bounds[0] if query.bounds is not None else 0
        return 1.0, float(lo), int(query.sensitivity)
    assert query.bounds is not None
    try:
        grid = sampling.grid_for(min(float_down(query.sensitivity), noise_scale))
    except ValueError:
        raise MechanismInputError(
            "params.column", f"declared range of {query.column.name!r} is too narrow for a grid"
        ) from None
    center = sampling.snap(float(query.bounds[0]), grid)
    err = _real_error(query, grid)
    units = math.floor((query.sensitivity + 2 * err) / Fraction(grid)) + 1
    # |centered statistic| <= rows * (hi - lo + g) must be an exact multiple of g in a double
    rows = query.n if query.statistic == "sum" else 1
    if (
        rows * (query.bounds[1] - query.bounds[0] + Fraction(grid)) / Fraction(grid)
        >= LATTICE_LIMIT
    ):
        raise MechanismInputError("params.column", "too many rows for exact lattice arithmetic")
    return grid, center, units


def _per_bin(query: _Query, units: int) -> int:
    """A histogram's lattice shift per moved bin (Gaussian noise is calibrated to one unit
    out of one bin and into another, L2 √2); ``_lattice`` gives its L1 total, 2. Using the
    total as the per-bin shift calibrated the Gaussian for L2 2√2: twice the noise needed."""
    return units // 2 if query.histogram else units


def _real_error(query: _Query, grid: float) -> Fraction:
    """Public bound on |computed − exact| for a real-valued sum or mean.

    Each record contributes v = fl(clip(x) − c) with |v| <= V = (hi − lo) + g/2
    and relative rounding u = 2**-53; ``math.fsum`` rounds the total once.
    So a sum errs by at most 2u·nV(1 + u) <= 2**-51·nV, and a mean (one more
    division, or an exact integer sum divided once) by at most 2**-50·V.
    """
    assert query.bounds is not None
    spread = query.bounds[1] - query.bounds[0] + Fraction(grid)
    if query.statistic == "sum":
        return query.n * spread / 2**51
    return spread / 2**50


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class LatticeStatistic(Statistic):
    """The data pass of a count, sum, mean or histogram: exact integers that add.

    Parts: ``count`` (rows meeting the condition), ``bins`` (histogram counts), ``sum``
    (integer columns: the int sum of clip(x) − center, as the whole-column pass took it
    in int64, which ``resolve_query`` keeps from overflowing) or ``fsum`` (real columns:
    the exact sum of the doubles fl(clip(x) − center) in units of 2**-SCALE, which
    ``to_float`` rounds to what ``math.fsum`` of the whole column gave).
    """

    plan: _Plan

    @property
    def columns(self) -> tuple[str, ...]:
        q = self.plan.query
        return (q.condition.column if q.condition is not None else q.column.name,)

    def sizes(self) -> Mapping[str, int]:
        q = self.plan.query
        if q.condition is not None:
            return {"count": 1}
        if q.histogram:
            return {"bins": len(q.column.categories or ()) if q.edges is None
                    else len(q.edges) - 1}
        return {"sum" if q.column.type == "integer" else "fsum": 1}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64] | Sequence[int]]:
        q = self.plan.query
        x = np.asarray(chunk[self.columns[0]])
        if q.condition is not None:
            return {"count": np.array([np.count_nonzero(q.condition.mask(x))], dtype=np.int64)}
        if q.histogram:
            return {"bins": _histogram(q, x)}
        assert q.bounds is not None
        lo, hi = q.bounds
        if q.column.type == "integer":
            if x.dtype.kind not in "iu":
                raise TypeError(f"integer column {q.column.name!r} must hold integers")
            centered = np.clip(x.astype(np.int64), int(lo), int(hi)) - int(self.plan.center)
            return {"sum": np.array([centered.sum(dtype=np.int64)], dtype=np.int64)}
        centered_f = clean(x, float(lo), float(hi))
        centered_f -= self.plan.center  # in place: one copy of the chunk in all
        return {"fsum": float_sums(centered_f)}


def lattice_from(plan: _Plan, partial: Partial) -> NDArray[np.int64]:
    """The exact statistic minus its public offset, in lattice units (a 1-D int array),
    from the data pass's merged partial."""
    q = plan.query
    check_rows(partial, q.n, LatticeStatistic(plan).columns[0])
    if q.condition is not None:
        return partial.vector("count")
    if q.histogram:
        return partial.vector("bins")
    if q.column.type == "integer":
        total = partial.parts["sum"][0]
        if q.integer:  # integer sum, grid 1: exact
            return np.array([total], dtype=np.int64)
        value = total if q.statistic == "sum" else total / q.n  # int / int rounds once
    else:
        total_f = to_float(partial.parts["fsum"][0])
        value = total_f if q.statistic == "sum" else total_f / q.n
    return np.array([round(value / plan.grid)], dtype=np.int64)


def lattice_values(plan: _Plan, data: Mapping[str, np.ndarray]) -> NDArray[np.int64]:
    """``lattice_from`` the whole columns (one update)."""
    return lattice_from(plan, whole(LatticeStatistic(plan), data))


def _histogram(q: _Query, x: NDArray[Any]) -> NDArray[np.int64]:
    if q.edges is None:
        k = len(q.column.categories or ())
        codes = x.astype(np.int64)
        return np.bincount(codes[(codes >= 0) & (codes < k)], minlength=k).astype(np.int64)
    assert q.bounds is not None
    edges = np.asarray(q.edges)
    nbins = len(edges) - 1
    values = clean(x, float(q.bounds[0]), float(q.bounds[1]))
    index = np.searchsorted(edges, values, side="right") - 1
    index[values == edges[-1]] = nbins - 1
    inside = (index >= 0) & (index < nbins)
    return np.bincount(index[inside], minlength=nbins).astype(np.int64)


# --------------------------------------------------------------------------- Gaussian accounting


def analytic_gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """Exact δ(ε) of the continuous Gaussian mechanism (Balle & Wang 2018, Thm 8)."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return float(special.ndtr(a - b) - math.exp(epsilon) * special.ndtr(-a - b))


@functools.lru_cache(maxsize=1024)
def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ with continuous Gaussian δ(ε) <= δ (used to place the grid)."""

    def excess(log_sigma: float) -> float:
        return analytic_gaussian_delta(math.exp(log_sigma), 1.0, epsilon) - delta

    lo, hi = _bracket(excess, 0.0, limit=690.0)
    return sensitivity * math.exp(optimize.brentq(excess, lo, hi, xtol=1e-13))


def _bracket(excess: Any, start: float, limit: float) -> tuple[float, float]:
    """[lo, hi] in log σ with excess(lo) > 0 >= excess(hi); excess decreases in σ."""
    lo, hi = start - 0.5, start + 0.5
    while excess(lo) <= 0:
        lo -= 1.0
        if lo < -limit:
            raise ValueError("no sigma small enough")
    while excess(hi) > 0:
        hi += 1.0
        if hi > limit:
            raise ValueError("sigma beyond the sampler's range")
    return lo, hi


def _pair_sf_bounds(sigma: float, k: int) -> tuple[float, float]:
    """Bounds on P(W >= k) for W = Y1 − Y2, Y_i i.i.d. discrete Gaussian(σ).

    P(W = w) = exp(−w²/(4σ²)) θ_{w mod 2} / Z² with θ_0 = Σ_y exp(−y²/σ²),
    θ_1 = Σ_y exp(−(y + ½)²/σ²). Small σ: summed exactly. Large σ: by Poisson
    summation θ_j = σ√π (1 ± 2e^{−π²σ²}), so W is a discrete Gaussian(√2σ)
    up to a factor 1 ± 3e^{−π²σ²} (= 1 in double precision).
    """
    if k <= 0:
        lo, hi = _pair_sf_bounds(sigma, 1 - k)
        return 1.0 - hi, 1.0 - lo
    if sigma > sampling.EXACT_SIGMA:
        lo, hi = sampling.discrete_gaussian_sf_bounds(math.sqrt(2.0) * sigma, k)
        eta = 3.0 * math.exp(-((math.pi * sigma) ** 2))
        return lo * (1.0 - eta), hi * (1.0 + eta)
    y = np.arange(-math.ceil(10.0 * sigma) - 3, math.ceil(10.0 * sigma) + 4, dtype=np.float64)
    s2 = sigma * sigma
    theta0 = float(np.sum(np.exp(-(y * y) / s2)))
    theta1 = float(np.sum(np.exp(-((y + 0.5) ** 2) / s2)))
    z = sampling.discrete_gaussian_normalizer(sigma)
    w = np.arange(k, k + math.ceil(15.0 * sigma) + 10)
    theta = np.where(w % 2 == 0, theta0, theta1)
    s = float(np.sum(np.exp(-(w.astype(np.float64) ** 2) / (4.0 * s2)) * theta)) / (z * z)
    return s * (1.0 - 1e-12), s * (1.0 + 1e-12)


def discrete_gaussian_delta(sigma: float, epsilon: float, shift: int, pair: bool = False) -> float:
    """Upper bound on δ(ε) of adding discrete Gaussian(σ) noise on the integers.

    ``pair=False``: neighbours' values differ by at most the integer ``shift``;
    CKS 2020 Thm 7 gives δ = P[Y > t] − e^ε P[Y > t + shift], t = εσ²/Δ − Δ/2.
    ``pair=True``: a histogram, where a neighbour moves ``shift`` units out of
    one bin into another (or out of/into only one, which is a projection of
    this, hence no worse); the privacy loss is (a² + aW)/σ² with W = Y1 − Y2,
    so δ = P[W > t] − e^ε P[W > t + 2a], t = εσ²/a − a. The threshold is
    also tried one step either side, as the max over thresholds is δ itself
    and rounding of t must not make the bound optimistic.
    """
    tail = _pair_sf_bounds if pair else sampling.discrete_gaussian_sf_bounds
    step = 2 * shift if pair else shift
    t = epsilon * sigma**2 / shift - step / 2
    base = math.floor(t) + 1
    growth = math.exp(epsilon)
    candidates = (
        tail(sigma, k)[1] - growth * tail(sigma, k + step)[0] for k in range(base - 1, base + 2)
    )
    return max(0.0, *candidates)


@functools.lru_cache(maxsize=1024)
def discrete_gaussian_sigma(epsilon: float, delta: float, shift: int, pair: bool = False) -> float:
    """Smallest σ (to ~1e-6 relative) with ``discrete_gaussian_delta`` <= δ."""

    def excess(log_sigma: float) -> float:
        return discrete_gaussian_delta(math.exp(log_sigma), epsilon, shift, pair) - delta

    start = analytic_gaussian_sigma(epsilon, delta, shift * (math.sqrt(2.0) if pair else 1.0))
    lo, hi = _bracket(excess, math.log(start), limit=math.log(sampling.MAX_SIGMA) + 1.0)
    sigma = math.exp(optimize.brentq(excess, lo, hi, xtol=1e-12)) * (1.0 + 1e-9)
    while discrete_gaussian_delta(sigma, epsilon, shift, pair) > delta:
        sigma *= 1.0 + 1e-7
    return sigma


# --------------------------------------------------------------------------- extended statistics


class ExtendedPlan(Protocol):
    """A release planned by ``tables``, ``quantiles`` or ``moments`` from public inputs."""

    def accuracy(self) -> dict[str, Any]: ...

    def first_pass(self) -> Statistic:
        """The first pass of its data pass."""
        ...

    def release_from(self, partial: Partial, rng: np.random.Generator) -> dict[str, Any]:
        """The result from the last pass's merged partial (the noise step)."""
        ...


def extended(params: Mapping[str, Any]) -> bool:
    """Whether another module releases this statistic (group-by tables included)."""
    return params["statistic"] in EXTENDED or "group_by" in params


def extended_plan(mechanism: str, params: Mapping[str, Any],
                  amounts: Mapping[str, Fraction], meta: DatasetMeta) -> ExtendedPlan:
    """Dispatch: those modules import this one, so they are imported here, late."""
    from mechanisms.dp import moments, quantiles, tables

    if "group_by" in params:
        return tables.plan(mechanism, params, amounts, meta)
    if params["statistic"] == "quantile":
        return quantiles.plan(mechanism, params, amounts, meta)
    return moments.plan(mechanism, params, amounts, meta)


# --------------------------------------------------------------------------- mechanisms


class Baseline(StreamingMechanism):
    """Cost = budget; noise calibrated to it on a lattice; one class per noise."""

    params_schema = BaselineParamsSchema

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        amounts = self._amounts(budget, meta)
        if extended(params):
            extended_plan(self.name, params, amounts, meta)
        else:
            self._plan(params, amounts, meta)  # fits the metadata and the sampler's range
        return amounts

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        amounts = self._amounts(cost, meta)
        if extended(params):
            return extended_plan(self.name, params, amounts, meta).accuracy()
        return self._accuracy(self._plan(params, amounts, meta))

    def price(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
              ) -> tuple[dict[str, Fraction], dict[str, Any]]:
        """``cost`` and ``accuracy`` with one plan: both calibrate the same noise to the
        same amounts (the cost is the budget read), so the plan is made once. A subclass
        with its own ``cost`` or ``accuracy``, or amounts that read differently from the
        cost than from the budget, gets the two calls."""
        mine = type(self)
        if mine.cost is not Baseline.cost or mine.accuracy is not Baseline.accuracy:
            return super().price(params, budget, meta)
        amounts = self._amounts(budget, meta)
        if self._amounts(amounts, meta) != amounts:
            return super().price(params, budget, meta)
        if extended(params):
            return amounts, extended_plan(self.name, params, amounts, meta).accuracy()
        return amounts, self._accuracy(self._plan(params, amounts, meta))

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        """Tables, quantiles and moments make a few passes over the rows (sorts included),
        whatever their grid or cell count; the rest keeps the default."""
        if not extended(params):
            return super().work(params, meta)
        passes = len(params.get("group_by", ())) + len(params.get("columns", ())) ** 2 + 4
        units = float(max(meta.n_rows, 1)) * passes
        if params["statistic"] == "quantile":  # at most one exact coin per candidate
            from mechanisms.dp.quantiles import COIN_UNITS, DEFAULT_GRID_SIZE

            coins = (len(params["quantiles"]) * params.get("grid_size", DEFAULT_GRID_SIZE)
                     * (3 if params.get("interval") else 1))
            if coins * COIN_UNITS > units:
                return Work(units + coins * COIN_UNITS, "params.grid_size")
        field = "params.columns" if "columns" in params else "dataset_id"
        return Work(units, field)

    def statistic(self, params: Mapping[str, Any], cost: Budget,
                  meta: DatasetMeta) -> Statistic:
        amounts = self._amounts(cost, meta)
        if extended(params):
            return extended_plan(self.name, params, amounts, meta).first_pass()
        return LatticeStatistic(self._plan(params, amounts, meta))

    def release(self, params: Mapping[str, Any], partial: Partial, cost: Budget,
                meta: DatasetMeta, rng: np.random.Generator,
                statistic: Statistic | None = None) -> Output:
        amounts = self._amounts(cost, meta)
        if extended(params):
            planned = extended_plan(self.name, params, amounts, meta)
            return Output(
                result=planned.release_from(partial, rng),
                accuracy=planned.accuracy(),
                guarantee=self._guarantee(amounts),
            )
        plan = (statistic.plan if isinstance(statistic, LatticeStatistic)
                else self._plan(params, amounts, meta))
        exact = lattice_from(plan, partial)
        noisy = exact + self._sample(rng, plan, exact.shape[0])
        return Output(
            result=self._release(plan, noisy),
            accuracy=self._accuracy(plan),
            guarantee=self._guarantee(amounts),
        )

    # -- pieces the subclasses specialise

    def _amounts(self, budget: Budget, meta: DatasetMeta) -> dict[str, Fraction]:
        """The budget as exact fractions (the Gaussian reads ρ on a zcdp dataset)."""
        return read_budget(budget, self.measures, self.name)

    @abc.abstractmethod
    def _plan(
        self, params: Mapping[str, Any], amounts: Mapping[str, Fraction], meta: DatasetMeta
    ) -> _Plan:
        """Resolve params against the metadata and calibrate the noise to the budget."""

    def _sample(self, rng: np.random.Generator, plan: _Plan, size: int) -> NDArray[np.int64]:
        return sampling.discrete_laplace(rng, plan.noise_scale, size)

    def _guarantee(self, amounts: Mapping[str, Fraction]) -> str:
        return f"pure epsilon-DP (epsilon={fmt(amounts['epsilon'])} nats), {PRIVACY_UNIT}"

    # -- shared

    def _laplace_plan(
        self, query: _Query, epsilon: Fraction, *, divisor: int = 1, label: str = ""
    ) -> _Plan:
        scale = query.sensitivity / epsilon
        grid, center, units = _lattice(query, float_down(scale))
        noise_scale = float_up(Fraction(units) / epsilon)
        if noise_scale > sampling.MAX_SCALE:
            raise MechanismInputError(
                "budget.epsilon", "epsilon too small: the noise would exceed the sampler's range"
            )
        return _Plan(
            query,
            grid,
            center,
            units,
            "discrete_laplace",
            noise_scale,
            sampling.discrete_laplace_halfwidth(noise_scale, CI_LEVEL),
            divisor=divisor,
            label=label or query.statistic,
        )

    def _release(self, plan: _Plan, noisy: NDArray[np.int64]) -> dict[str, Any]:
        """Lattice value -> statistic units, exactly, then one rounding to float."""
        q = plan.query
        if q.histogram:
            return {"values": [int(v) for v in noisy], **q.labels()}
        exact = plan.offset() + int(noisy[0]) * Fraction(plan.grid)
        if plan.divisor > 1:
            return {"value": float(exact / plan.divisor)}
        if q.integer:
            return {"value": int(exact)}
        return {"value": float(exact)}

    def _accuracy(self, plan: _Plan) -> dict[str, Any]:
        q = plan.query
        rounding = 0.0 if q.integer else 0.5
        unit = plan.grid / plan.divisor
        halfwidth = (plan.halfwidth + rounding) * unit
        sensitivity = q.l2_sensitivity if plan.l2 else float(q.sensitivity / plan.divisor)
        kind = "discrete Laplace" if plan.noise == "discrete_laplace" else "discrete Gaussian"
        what = "each bin" if q.histogram else "the released value"
        statement = (
            f"With probability at least {CI_LEVEL:.0%}, {what} is within ±{halfwidth:.6g} of the"
            f" exact {plan.label} of the data clipped to the declared bounds ({kind} noise of"
            f" scale {plan.noise_scale * unit:.6g} on a lattice of step {unit:.6g})."
        )
        return {
            "noise": plan.noise,
            "scale": plan.noise_scale * unit,
            "sensitivity": sensitivity,
            "sensitivity_norm": "l2" if plan.l2 else "l1",
            "grid": unit,
            "grid_sensitivity": plan.lattice_sensitivity,
            "ci95_halfwidth": halfwidth,
            "statement": statement,
        }


class LaplaceMechanism(Baseline):
    """Pure ε-DP: discrete Laplace noise on a power-of-two lattice."""

    name = "laplace"
    measures = ("epsilon",)
    description = (
        "Pure epsilon-DP count, sum, mean or histogram, group_by cross-tabs, variance, std,"
        " covariance (discrete Laplace noise on a power-of-two lattice, float-safe) and"
        " quantiles (permute-and-flip with exact coins)."
    )

    def _plan(
        self, params: Mapping[str, Any], amounts: Mapping[str, Fraction], meta: DatasetMeta
    ) -> _Plan:
        return self._laplace_plan(resolve_query(params, meta), amounts["epsilon"])


class GeometricMechanism(Baseline):
    """Pure ε-DP on integer statistics: two-sided geometric noise, integer outputs."""

    name = "geometric"
    measures = ("epsilon",)
    description = (
        "Pure epsilon-DP integer statistics (count, histogram, sum or mean of an integer"
        " column, and their group_by cross-tabs); two-sided geometric noise, integer outputs."
    )

    def _plan(
        self, params: Mapping[str, Any], amounts: Mapping[str, Fraction], meta: DatasetMeta
    ) -> _Plan:
        query = resolve_query(params, meta)
        divisor = 1
        if query.statistic in ("sum", "mean"):
            if query.column.type != "integer":
                raise MechanismInputError(
                    "params.column",
                    f"geometric needs an integer column; {query.column.name!r} is"
                    f" {query.column.type}",
                )
            if query.statistic == "mean":  # release the noisy sum / n (post-processing)
                query = resolve_query({**params, "statistic": "sum"}, meta)
                divisor = meta.n_rows
        return self._laplace_plan(
            query, amounts["epsilon"], divisor=divisor, label=params["statistic"]
        )


class GaussianMechanism(Baseline):
    """(ε, δ)-DP: discrete Gaussian noise with exactly accounted δ."""

    name = "gaussian"
    measures = ("epsilon", "delta")
    zcdp_native = True
    description = (
        "Approximate (epsilon, delta)-DP count, sum, mean or histogram, group_by cross-tabs,"
        " variance, std, covariance; discrete Gaussian noise on a power-of-two lattice, sigma"
        " calibrated to the exact privacy curve (vectors: through zCDP). On a dataset with"
        " gaussian_accounting zcdp it spends rho instead: sigma with Delta^2/(2 sigma^2) <= rho."
    )

    def _plan(
        self, params: Mapping[str, Any], amounts: Mapping[str, Fraction], meta: DatasetMeta
    ) -> _Plan:
        query = resolve_query(params, meta)
        if "rho" in amounts:
            return self._zcdp_plan(query, amounts["rho"])
        epsilon, delta = float_down(amounts["epsilon"]), float_down(amounts["delta"])
        sigma_real = analytic_gaussian_sigma(epsilon, delta, query.l2_sensitivity)
        grid, center, units = _lattice(query, sigma_real)
        units = _per_bin(query, units)
        try:
            sigma = discrete_gaussian_sigma(epsilon, delta, units, query.histogram)
        except ValueError:
            sigma = math.inf
        if sigma > sampling.MAX_SIGMA:
            raise MechanismInputError(
                "budget.epsilon", "budget too small: the noise would exceed the sampler's range"
            )
        return _Plan(
            query,
            grid,
            center,
            units,
            "discrete_gaussian",
            sigma,
            sampling.discrete_gaussian_halfwidth(sigma, CI_LEVEL),
            l2=True,
            label=query.statistic,
        )

    def _zcdp_plan(self, query: _Query, rho: Fraction) -> _Plan:
        """σ for ρ-zCDP: the lattice shift Δ (units; a histogram moves Δ out of one bin into
        another, so Δ² twice) gives σ with Δ²/(2σ²) <= ρ exactly (CKS 2020 Thm 14)."""
        grid, center, units = _lattice(query, zcdp.sigma_real(query.l2_sensitivity, rho))
        units = _per_bin(query, units)
        l2sq = units * units * (2 if query.histogram else 1)
        sigma = zcdp.sigma_for_rho(l2sq, rho)
        if sigma > sampling.MAX_SIGMA:
            raise MechanismInputError(
                "budget.rho", "rho too small: the noise would exceed the sampler's range")
        return _Plan(query, grid, center, units, "discrete_gaussian", sigma,
                     sampling.discrete_gaussian_halfwidth(sigma, CI_LEVEL), l2=True,
                     label=query.statistic)

    def _amounts(self, budget: Budget, meta: DatasetMeta) -> dict[str, Fraction]:
        if meta.gaussian_accounting == "zcdp":
            return {"rho": zcdp.read_rho(budget, self.name)}
        return read_budget(budget, self.measures, self.name)

    def _sample(self, rng: np.random.Generator, plan: _Plan, size: int) -> NDArray[np.int64]:
        return sampling.discrete_gaussian(rng, plan.noise_scale, size)

    def _guarantee(self, amounts: Mapping[str, Fraction]) -> str:
        if "rho" in amounts:
            return (f"rho-zCDP (rho={fmt(amounts['rho'])}; discrete Gaussian, Canonne, Kamath"
                    f" & Steinke 2020 Thm 14), {PRIVACY_UNIT}")
        return (
            f"approximate (epsilon, delta)-DP (epsilon={fmt(amounts['epsilon'])} nats,"
            f" delta={fmt(amounts['delta'])}), {PRIVACY_UNIT}"
        )


laplace = register(LaplaceMechanism())
geometric = register(GeometricMechanism())
gaussian = register(GaussianMechanism())
