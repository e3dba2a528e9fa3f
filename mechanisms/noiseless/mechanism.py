"""Registry entries ``noiseless.aggregate`` and ``noiseless.local`` (DESIGN §5).

Both spend the ``noiseless_bits`` measure: bits of output count, composed by
plain addition (Theorem 6), never mixed with DP's nats. The charge is log2 of
the certified count, rounded up to a multiple of 2^-40 and never above the
request (``bits.charge``); handed back to ``accuracy``/``run`` as the budget,
it re-plans to the very same quantizer. Costs and accuracy read public
inputs only; ``run`` is deterministic (its ``rng`` is unused), so a replay
reproduces the release exactly.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema
from numpy.typing import NDArray

from mechanisms.base import (
    Budget,
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
)

# ConditionSchema is the shared shape of "rows meeting a condition"; resolve_condition resolves it
# against the metadata exactly as the DP baselines do, so a count means the same everywhere.
from mechanisms.baselines import StatisticParamsSchema, resolve_condition
from mechanisms.noiseless import central, local
from mechanisms.noiseless.central import STATISTICS, ScalarPlan
from mechanisms.noiseless.local import LocalPlan
from mechanisms.registry import register

MEASURE = "noiseless_bits"
#: budgets above this are refused as absurd (aggregates certify at most 2^40 outputs anyway)
MAX_BITS = Fraction(1024)
#: bins of a custom local quantizer
MAX_EDGES = 4096
#: quantizers with at most this many bins list their edges in the result
LIST_LIMIT = 256
PRIVACY_UNIT = (
    "neighbouring datasets differ in one record replaced; n_rows public; worst case over"
    " every value of the other records"
)


# --------------------------------------------------------------------------- params


class AggregateParamsSchema(StatisticParamsSchema):
    """``statistic`` mean | sum (of ``column``) | count (rows meeting ``condition``)."""

    statistic = fields.String(required=True, validate=validate.OneOf(STATISTICS))


class LocalParamsSchema(Schema):
    """``column`` to quantize record by record; optional ``edges`` for non-uniform bins."""

    class Meta:
        unknown = RAISE

    column = fields.String(required=True)
    edges = fields.List(
        fields.Float(allow_nan=False), validate=validate.Length(min=2, max=MAX_EDGES + 1)
    )

    @validates_schema
    def _check_edges(self, data: dict[str, Any], **kwargs: Any) -> None:
        edges = data.get("edges")
        if edges is not None and any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValidationError("edges must be strictly increasing.", "edges")


# --------------------------------------------------------------------------- shared


def read_bits(budget: Budget) -> Fraction:
    """The ``noiseless_bits`` amount, exactly; only that measure, in [1, MAX_BITS]."""
    extra = sorted(set(budget) - {MEASURE})
    if extra:
        raise MechanismInputError(
            "budget", f"noiseless mechanisms spend only {MEASURE}; got {', '.join(extra)}"
        )
    if MEASURE not in budget:
        raise MechanismInputError(f"budget.{MEASURE}", f"needs a {MEASURE} budget")
    value = budget[MEASURE]
    if isinstance(value, bool) or not isinstance(value, numbers.Rational | float):
        raise MechanismInputError(f"budget.{MEASURE}", "must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise MechanismInputError(f"budget.{MEASURE}", "must be finite")
    bits = Fraction(value)
    if bits < 1:
        raise MechanismInputError(
            f"budget.{MEASURE}",
            f"{MEASURE} must be at least 1: below 1 bit 2^ε < 2, so the only admissible"
            " output is a constant that does not depend on the data",
        )
    if bits > MAX_BITS:
        raise MechanismInputError(f"budget.{MEASURE}", f"{MEASURE} must be at most {MAX_BITS}")
    return bits


def _numeric(column: ColumnMeta, what: str) -> tuple[tuple[float, float], bool]:
    """Declared bounds of a numeric column and whether it holds whole numbers."""
    if column.type not in ("continuous", "integer"):
        raise MechanismInputError(
            "params.column", f"column {column.name!r} is {column.type}; {what} needs numbers"
        )
    if column.bounds is None or not all(math.isfinite(b) for b in column.bounds):
        raise MechanismInputError(
            "params.column", f"column {column.name!r} has no finite declared bounds"
        )
    integer = column.type == "integer"
    try:
        central.record_bounds(column.bounds, integer=integer)
    except ValueError:
        raise MechanismInputError(
            "params.column",
            f"declared bounds of column {column.name!r} are empty, a single point, or beyond"
            " ±2**53 for an integer column",
        ) from None
    return column.bounds, integer


def _fmt(bits: Fraction) -> str:
    return str(bits.numerator) if bits.denominator == 1 else f"{float(bits):.12g}"


def _guarantee(count: int, bits: Fraction, local_release: bool) -> str:
    kind = "local noiseless privacy" if local_release else "noiseless privacy"
    scope = " for the whole released column" if local_release else ""
    return (
        f"{kind}: at most {count} distinct outputs per record{scope} (ε = {_fmt(bits)} bits,"
        f" log2 of the count); not epsilon-DP; {PRIVACY_UNIT}; deterministic, so a replay"
        " reveals nothing new"
    )


def _column(data: Mapping[str, np.ndarray], name: str, n: int) -> NDArray[Any]:
    x = np.asarray(data[name])
    if x.ndim != 1 or x.shape[0] != n:
        raise ValueError(f"column {name!r} does not have n_rows entries")
    return x


VACUOUS = (
    "the budget allows as many outputs as one record has values: an adversary who knows"
    " every other record learns this record's contribution exactly"
)


# --------------------------------------------------------------------------- aggregate


class NoiselessAggregate(Mechanism):
    """Mean, sum or count, exactly evaluated and uniformly quantized (corrected Theorem 8)."""

    name = "noiseless.aggregate"
    measures = (MEASURE,)
    params_schema = AggregateParamsSchema
    description = (
        "Noiseless privacy (bits of output count, not DP): a bounded mean, sum or count,"
        " computed exactly and released as the midpoint of one of q uniform bins, q from the"
        " corrected, floating-point-safe Theorem 8 rule."
    )

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        return {MEASURE: self._plan(params, read_bits(budget), meta).bits}

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        return self._accuracy(params, self._plan(params, read_bits(cost), meta))

    def run(
        self,
        data: Mapping[str, np.ndarray],
        params: Mapping[str, Any],
        cost: Budget,
        meta: DatasetMeta,
        rng: np.random.Generator,
    ) -> Output:
        plan = self._plan(params, read_bits(cost), meta)
        if params["statistic"] == "count":
            spec = params["condition"]
            column = meta.column(spec["column"], "params.condition.column")
            condition = resolve_condition(spec, column)
            values = condition.mask(_column(data, spec["column"], meta.n_rows))
        else:
            values = _column(data, params["column"], meta.n_rows)
        released = central.release(central.evaluate(plan.query, values), plan)
        q = plan.quantizer
        quantizer: dict[str, Any] = {
            "kind": "uniform",
            "levels": q.levels,
            "lower": float(q.lower),
            "upper": float(q.upper),
            "width": float(q.width),
        }
        if q.levels <= LIST_LIMIT:
            quantizer["edges"] = [float(q.lower + q.width * k) for k in range(q.levels + 1)]
        result = {
            "statistic": params["statistic"],
            "column": params.get("column", params.get("condition", {}).get("column")),
            **released.as_dict(),
            "quantizer": quantizer,
            "certified_count": plan.count,
            "bits": float(plan.bits),
            "bits_exact": str(plan.bits),
        }
        return Output(
            result=result,
            accuracy=self._accuracy(params, plan),
            guarantee=_guarantee(plan.count, plan.bits, local_release=False),
        )

    def _plan(self, params: Mapping[str, Any], bits: Fraction, meta: DatasetMeta) -> ScalarPlan:
        statistic = params["statistic"]
        n = meta.n_rows
        if n < 1:
            raise MechanismInputError("params.statistic", "the dataset has no rows")
        if statistic == "count":
            spec = params["condition"]
            resolve_condition(spec, meta.column(spec["column"], "params.condition.column"))
            query = central.bounded_query("count", (0, 1), n)
        else:
            column = meta.column(params["column"])
            bounds, integer = _numeric(column, statistic)
            try:
                query = central.bounded_query(statistic, bounds, n, integer=integer)
            except ValueError:
                raise MechanismInputError(
                    "params.column",
                    f"n_rows times the declared bounds of {column.name!r} overflows a double",
                ) from None
        return central.plan(query, bits)

    def _accuracy(self, params: Mapping[str, Any], plan: ScalarPlan) -> dict[str, Any]:
        q = plan.quantizer
        error = float(plan.max_error)
        exact = (
            "number of rows meeting the condition"
            if params["statistic"] == "count"
            else f"{params['statistic']} of the data clipped to the declared bounds"
        )
        statement = (
            f"The released value is the midpoint of the bin (one of {q.levels} of width"
            f" {float(q.width):.6g}) holding the exact {exact}, so it is always within"
            f" ±{error:.6g} of it (no randomness)."
        )
        return {
            "deterministic": True,
            "levels": q.levels,
            "bin_width": float(q.width),
            "max_error": error,
            "range": [float(q.lower), float(q.upper)],
            "sensitivity": float(plan.query.sensitivity),
            "certified_count": plan.count,
            "bits": float(plan.bits),
            "statement": statement,
            "warnings": [VACUOUS] if plan.vacuous else [],
        }


# --------------------------------------------------------------------------- local


class NoiselessLocal(Mechanism):
    """Each record quantized to ⌊2^ε⌋ levels (or given edges); the column costs log2 q once."""

    name = "noiseless.local"
    measures = (MEASURE,)
    params_schema = LocalParamsSchema
    description = (
        "Local noiseless privacy (bits of output count, not DP): every record of a numeric"
        " column replaced by the midpoint of its bin, floor(2^bits) uniform bins or given"
        " edges; releases the quantized column, charged log2(bins) once."
    )

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        return {MEASURE: self._plan(params, read_bits(budget), meta).bits}

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        return self._accuracy(self._plan(params, read_bits(cost), meta))

    def run(
        self,
        data: Mapping[str, np.ndarray],
        params: Mapping[str, Any],
        cost: Budget,
        meta: DatasetMeta,
        rng: np.random.Generator,
    ) -> Output:
        plan = self._plan(params, read_bits(cost), meta)
        name = params["column"]
        released = local.quantize(_column(data, name, meta.n_rows), plan)
        result = {
            "column": name,
            "quantizer": local.describe(plan, LIST_LIMIT),
            "certified_count": plan.count,
            "bits": float(plan.bits),
            "bits_exact": str(plan.bits),
        }
        return Output(
            result=result,
            accuracy=self._accuracy(plan),
            guarantee=_guarantee(plan.count, plan.bits, local_release=True),
            table={name: released},
        )

    def _plan(self, params: Mapping[str, Any], bits: Fraction, meta: DatasetMeta) -> LocalPlan:
        column = meta.column(params["column"])
        bounds, integer = _numeric(column, "noiseless.local")
        edges = params.get("edges")
        if edges is not None:
            lo, hi = central.record_bounds(bounds, integer=integer)
            if not (lo <= Fraction(edges[0]) and Fraction(edges[-1]) <= hi):
                raise MechanismInputError(
                    "params.edges", f"edges must lie inside the declared bounds of {column.name!r}"
                )
        try:
            plan = local.plan_local(bits, bounds, edges=edges, integer=integer)
        except ValueError as exc:  # the only one left: more reachable bins than the budget
            raise MechanismInputError("params.edges", str(exc)) from None
        if plan.count < 2:
            field = "params.edges" if edges is not None else "params.column"
            raise MechanismInputError(
                field, "only one bin is reachable: the output would be a constant"
            )
        return plan

    def _accuracy(self, plan: LocalPlan) -> dict[str, Any]:
        q = plan.quantizer
        widths = np.diff(q.edges)
        error = plan.max_error
        statement = (
            f"Each released record is the midpoint of its bin ({plan.count} reachable bins),"
            f" within ±{error:.6g} of the record clipped to the declared bounds (no randomness)."
        )
        return {
            "deterministic": True,
            "levels": q.levels,
            "bin_width": float(widths.max()),
            "max_error": error,
            "range": [q.lower, q.upper],
            "certified_count": plan.count,
            "bits": float(plan.bits),
            "statement": statement,
            "warnings": [VACUOUS.replace("contribution", "value")] if plan.vacuous else [],
        }


def certify(
    mechanism: Mechanism,
    params: Mapping[str, Any],
    budget: Budget,
    meta: DatasetMeta,
) -> int:
    """Distinct outputs one record can cause through this release, from public inputs only.

    It is the count whose log2 ``cost`` charges: for an aggregate, the
    certificate of ``central.plan`` (proof in ``certify.max_outputs_uniform``
    and ``certify.safe_levels``); for a local release, the reachable bins of
    the record quantizer (exact: the released column changes only in the
    replaced record's row, ``local``).
    """
    if not isinstance(mechanism, NoiselessAggregate | NoiselessLocal):
        raise TypeError(f"{mechanism.name} is not a noiseless mechanism")
    return mechanism._plan(params, read_bits(budget), meta).count


aggregate_mechanism = register(NoiselessAggregate())
local_mechanism = register(NoiselessLocal())
