"""Registry entries ``noiseless.aggregate``, ``noiseless.vector`` and ``noiseless.local``.

Both spend the ``noiseless_bits`` measure: bits of output count, composed by
plain addition (Theorem 6), never mixed with DP's nats. The charge is log2 of
the certified count, rounded up to a multiple of 2^-40 and never above the
request (``bits.charge``); handed back to ``accuracy``/``run`` as the budget,
it re-plans to the very same quantizer. Costs and accuracy read public
inputs only; ``run`` is deterministic (its ``rng`` is unused), so a replay
reproduces the release exactly. Every result carries ``guarantees_bits``: the
paper's information-theoretic bounds (Theorems 1, 2, 3, 5), each at most the
charged ε.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema
from numpy.typing import NDArray

from mechanisms import selection
from mechanisms.base import (
    Budget,
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
    RecordMechanism,
    StreamingMechanism,
    Work,
    batch_columns,
    read_number,
)

# ConditionSchema is the shared shape of "rows meeting a condition"; resolve_condition resolves it
# against the metadata exactly as the DP baselines do, so a count means the same everywhere.
from mechanisms.dp.baselines import StatisticParamsSchema, resolve_condition
from mechanisms.exact import fmt
from mechanisms.noiseless import central, local, passes
from mechanisms.noiseless.central import STATISTICS, ScalarPlan, ScalarRelease
from mechanisms.noiseless.certify import exact_levels
from mechanisms.noiseless.local import LocalPlan
from mechanisms.noiseless.quantizer import ExactEdgeQuantizer
from mechanisms.registry import register
from mechanisms.statistics import Joint, Partial, Statistic

MEASURE = "noiseless_bits"
#: budgets above this are refused as absurd (aggregates certify at most 2^40 outputs anyway)
MAX_BITS = Fraction(1024)
#: bins of a custom quantizer (local or aggregate)
MAX_EDGES = 4096
#: coordinates of one vector release
MAX_COORDINATES = 32
#: the nominal budget of paper mode (the paper's q = ⌊2^ε·R/S⌋ must stay below 2^50)
MAX_PAPER_BITS = 40
#: quantizers with at most this many bins list their edges in the result
LIST_LIMIT = 256
PRIVACY_UNIT = (
    "neighbouring datasets differ in one record replaced; n_rows public; worst case over"
    " every value of the other records"
)


# --------------------------------------------------------------------------- params


def _strictly_increasing(data: Mapping[str, Any]) -> None:
    edges = data.get("edges")
    if edges is not None and any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValidationError("edges must be strictly increasing.", "edges")


def _edges_field(**kwargs: Any) -> fields.List:
    return fields.List(
        fields.Float(allow_nan=False), validate=validate.Length(min=2, max=MAX_EDGES + 1),
        **kwargs,
    )


class AggregateParamsSchema(StatisticParamsSchema):
    """``statistic`` mean | sum | median | min | max (of ``column``) | count (rows meeting
    ``condition``); optional public ``edges`` (non-uniform bins inside the query's range),
    or ``paper_mode`` with ``paper_bits`` (the paper's Theorem 8 as printed, charged at
    its true level)."""

    statistic = fields.String(required=True, validate=validate.OneOf(STATISTICS), metadata={
        "description": "what to release: mean, sum, median, min or max of column, or count of "
                       "the rows meeting condition"})
    edges = _edges_field(metadata={
        "description": "increasing public bin edges inside the statistic's range: the value is "
                       "released as its bin (default: uniform bins, as many as the budget "
                       "certifies)"})
    paper_mode = fields.Boolean(metadata={
        "description": "quantize by the paper's Theorem 8 as printed (uniform bins at "
                       "paper_bits), charged at its true level (default false)"})
    paper_bits = fields.Float(
        allow_nan=False, validate=validate.Range(min=0, max=MAX_PAPER_BITS),
        metadata={"description": "paper_mode only (and needed there): the paper's nominal "
                                 "budget, in bits, 0 to 40"},
    )

    @validates_schema
    def _check_quantizer(self, data: dict[str, Any], **kwargs: Any) -> None:
        _strictly_increasing(data)
        paper = data.get("paper_mode", False)
        if paper and "paper_bits" not in data:
            raise ValidationError("paper_mode needs paper_bits, the paper's nominal ε.",
                                  "paper_bits")
        if not paper and "paper_bits" in data:
            raise ValidationError("paper_bits is read only with paper_mode: true.", "paper_bits")
        if paper and "edges" in data:
            raise ValidationError("paper_mode uses the paper's uniform bins; omit edges.",
                                  "edges")


class VectorItemSchema(StatisticParamsSchema):
    """One coordinate of a vector release: a statistic, its own ``bits``, optional edges."""

    statistic = fields.String(required=True, validate=validate.OneOf(STATISTICS), metadata={
        "description": "what to release: mean, sum, median, min or max of column, or count of "
                       "the rows meeting condition"})
    edges = _edges_field(metadata={
        "description": "increasing public bin edges inside the statistic's range (default: "
                       "uniform bins from bits)"})
    bits = fields.Float(
        required=True, allow_nan=False, validate=validate.Range(min=1, max=float(MAX_BITS)),
        metadata={"description": "this coordinate's budget, in bits, 1 to 1024"},
    )

    @validates_schema
    def _check_edges(self, data: dict[str, Any], **kwargs: Any) -> None:
        _strictly_increasing(data)


class VectorParamsSchema(Schema):
    """``queries``: the coordinates, each with its own budget; their charges add."""

    class Meta:
        unknown = RAISE

    queries = fields.List(
        fields.Nested(VectorItemSchema), required=True,
        validate=validate.Length(min=1, max=MAX_COORDINATES),
        metadata={"description": "the coordinates, 1 to 32, each {statistic, column, condition, "
                                 "edges, bits}; their charges add"},
    )


class LocalParamsSchema(Schema):
    """``column`` to quantize record by record; optional ``edges`` for non-uniform bins."""

    class Meta:
        unknown = RAISE

    column = fields.String(required=True, metadata={
        "description": "the numeric column (declared bounds) each record's value of which is "
                       "quantized and released"})
    edges = _edges_field(metadata={
        "description": "increasing public bin edges inside the column's declared bounds "
                       "(default: floor(2^bits) uniform levels)"})

    @validates_schema
    def _check_edges(self, data: dict[str, Any], **kwargs: Any) -> None:
        _strictly_increasing(data)


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
    bits = read_number(budget[MEASURE], f"budget.{MEASURE}")
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


def _guarantee(count: int, bits: Fraction, local_release: bool, note: str = "") -> str:
    kind = "local noiseless privacy" if local_release else "noiseless privacy"
    scope = " for the whole released column" if local_release else ""
    return (
        f"{kind}: at most {count} distinct outputs per record{scope}"
        f" (ε = {fmt(bits, significant=12)} bits, log2 of the count{note}); not epsilon-DP;"
        f" {PRIVACY_UNIT}; deterministic, so a replay reveals nothing new"
    )


def guarantees_bits(bits: Fraction) -> dict[str, float]:
    """The paper's guarantees for a release charged ``bits``: each is at most ε (bits).

    Theorem 1: maximin information I_⋆ <= symmetrized leakage L0^s <= leakage
    L0(Y; X_i) <= ε, whatever the other records are set to; Theorem 2: zero-error
    capacity of a stream of such releases <= ε; Theorem 3: performance of any
    non-stochastic hypothesis test on one record <= ε; Theorem 5: maximal
    leakage <= ε. All are upper bounds, in bits (log2).
    """
    value = float(bits)
    return {
        "nonstochastic_leakage_L0": value,
        "symmetrized_leakage_L0s": value,
        "maximin_information": value,
        "zero_error_capacity": value,
        "hypothesis_test_performance": value,
        "maximal_leakage": value,
    }


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


def _query(params: Mapping[str, Any], meta: DatasetMeta) -> central.Query:
    """The public query of one statistic (count: of the rows meeting a condition)."""
    statistic = params["statistic"]
    n = meta.n_rows
    if n < 1:
        raise MechanismInputError("params.statistic", "the dataset has no rows")
    if statistic == "count":
        spec = params["condition"]
        resolve_condition(spec, meta.column(spec["column"], "params.condition.column"))
        return central.bounded_query("count", (0, 1), n)
    column = meta.column(params["column"])
    bounds, integer = _numeric(column, statistic)
    try:
        return central.bounded_query(statistic, bounds, n, integer=integer)
    except ValueError:
        raise MechanismInputError(
            "params.column",
            f"n_rows times the declared bounds of {column.name!r} overflows a double",
        ) from None


def scalar_plan(
    params: Mapping[str, Any], bits: Fraction, meta: DatasetMeta, prefix: str = "params"
) -> ScalarPlan:
    """The plan of one statistic: corrected uniform rule, given edges, or paper mode."""
    query = _query(params, meta)
    edges = params.get("edges")
    if edges is not None:
        try:
            return central.plan_edges(query, bits, edges)
        except ValueError as exc:  # outside the range, too many outputs, or a constant
            raise MechanismInputError(f"{prefix}.edges", str(exc)) from None
    if params.get("paper_mode", False):
        try:
            return central.plan_paper(query, params["paper_bits"], bits)
        except ValueError as exc:
            field = "budget.noiseless_bits" if "true level" in str(exc) else f"{prefix}.paper_bits"
            raise MechanismInputError(field, str(exc)) from None
    return central.plan(query, bits)


def _describe_quantizer(plan: ScalarPlan) -> dict[str, Any]:
    q = plan.quantizer
    kind = "exact" if plan.exact else "edges" if isinstance(q, ExactEdgeQuantizer) else "uniform"
    doc: dict[str, Any] = {
        "kind": kind,
        "levels": q.levels,
        "lower": float(q.lower),
        "upper": float(q.upper),
        "width": float(q.width),
    }
    if q.levels <= LIST_LIMIT:
        doc["edges"] = [float(e) for e in q.edges]
    return doc


def _paper(plan: ScalarPlan) -> dict[str, Any] | None:
    """Paper mode's labels: the nominal ε, the true one, and what the corrected rule gives."""
    if plan.paper_bits is None:
        return None
    query = plan.query
    allowed = central.levels_for_bits(plan.paper_bits)
    corrected = 1 if allowed < 2 else exact_levels(
        central.capped_count(allowed, query), query.sensitivity, query.span)
    return {
        "nominal_bits": float(plan.paper_bits),
        "true_bits": math.log2(plan.count),
        "true_count": plan.count,
        "nominal_count": allowed,
        "corrected_levels": corrected,
    }


def _scalar_result(
    params: Mapping[str, Any], plan: ScalarPlan, released: ScalarRelease
) -> dict[str, Any]:
    result = {
        "statistic": params["statistic"],
        "column": params.get("column", params.get("condition", {}).get("column")),
        **released.as_dict(),
        "quantizer": _describe_quantizer(plan),
        "certified_count": plan.count,
        "bits": float(plan.bits),
        "bits_exact": str(plan.bits),
        "guarantees_bits": guarantees_bits(plan.bits),
    }
    paper = _paper(plan)
    if paper is not None:
        result["paper_mode"] = paper
    return result


def _scalar_accuracy(params: Mapping[str, Any], plan: ScalarPlan) -> dict[str, Any]:
    q = plan.quantizer
    error = float(plan.max_error)
    exact = (
        "number of rows meeting the condition"
        if params["statistic"] == "count"
        else f"{params['statistic']} of the data clipped to the declared bounds"
    )
    if plan.exact:
        statement = (
            f"The released value is the exact {exact}: the budget already allows as many"
            " outputs as one record can cause, so no bin is wider than one possible value."
        )
    else:
        shape = (f"one of {q.levels} of width {float(q.width):.6g}"
                 if isinstance(q, central.UniformQuantizer)
                 else f"one of {q.levels} given bins, the widest {float(q.width):.6g}")
        statement = (
            f"The released value is the midpoint of the bin ({shape}) holding the exact"
            f" {exact}, so it is always within ±{error:.6g} of it (no randomness)."
        )
    warnings = [VACUOUS] if plan.vacuous else []
    paper = _paper(plan)
    if paper is not None:
        warnings.append(
            f"paper mode: Theorem 8 as printed sizes {q.levels} bins for"
            f" {paper['nominal_bits']:.6g} bits, but one record can cause {plan.count}"
            f" outputs (true ε = {paper['true_bits']:.6g} bits, charged); the corrected rule"
            f" uses {paper['corrected_levels']} bins for {paper['nominal_count']} outputs"
        )
    return {
        "deterministic": True,
        "exact": plan.exact,
        "levels": q.levels,
        "bin_width": float(q.width),
        "max_error": error,
        "range": [float(q.lower), float(q.upper)],
        "sensitivity": float(plan.query.sensitivity),
        "certified_count": plan.count,
        "bits": float(plan.bits),
        "statement": statement,
        "warnings": warnings,
    }


class NoiselessAggregate(StreamingMechanism):
    """A bounded statistic, exactly evaluated and quantized (corrected Theorem 8, exact)."""

    name = "noiseless.aggregate"
    measures = (MEASURE,)
    params_schema = AggregateParamsSchema
    description = (
        "Noiseless privacy (bits of output count, not DP): a bounded mean, sum, median, min,"
        " max or count, computed exactly and released as the midpoint of one of q uniform"
        " bins (q from the exact corrected Theorem 8 rule; exactly when the budget allows as"
        " many outputs as one record can cause), or of given public edges."
    )

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        return {MEASURE: self._plan(params, read_bits(budget), meta).bits}

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        return _scalar_accuracy(params, self._plan(params, read_bits(cost), meta))

    def statistic(self, params: Mapping[str, Any], cost: Budget,
                  meta: DatasetMeta) -> Statistic:
        return passes.statistic(_records(params, meta, self._plan(params, read_bits(cost), meta)))

    def release(self, params: Mapping[str, Any], partial: Partial, cost: Budget,
                meta: DatasetMeta, rng: np.random.Generator,
                statistic: Statistic | None = None) -> Output:
        plan = self._plan(params, read_bits(cost), meta)
        value = passes.value(_records(params, meta, plan), partial)
        released = central.release(value, plan)
        note = ""
        if plan.paper_bits is not None:
            nominal = fmt(plan.paper_bits, significant=12)
            note = f"; paper mode, nominal {nominal} bits, true level charged"
        return Output(
            result=_scalar_result(params, plan, released),
            accuracy=_scalar_accuracy(params, plan),
            guarantee=_guarantee(plan.count, plan.bits, local_release=False, note=note),
        )

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        """A pass over the rows; an order statistic's exact selection makes a fixed number."""
        return Work(float(max(meta.n_rows, 1)) * _passes(params), "dataset_id")

    def _plan(self, params: Mapping[str, Any], bits: Fraction, meta: DatasetMeta) -> ScalarPlan:
        return scalar_plan(params, bits, meta)


def _passes(params: Mapping[str, Any]) -> int:
    """Passes over the rows of one statistic's data pass (public: its name)."""
    return selection.PASSES if params["statistic"] in central.ORDER_STATISTICS else 1


def _records(params: Mapping[str, Any], meta: DatasetMeta, plan: ScalarPlan) -> passes.Records:
    """How a statistic reads its records: its column, or the condition's mask for a count."""
    if params["statistic"] == "count":
        spec = params["condition"]
        column = meta.column(spec["column"], "params.condition.column")
        return passes.Records(plan.query, spec["column"], resolve_condition(spec, column))
    return passes.Records(plan.query, params["column"])


# --------------------------------------------------------------------------- vector


class NoiselessVector(StreamingMechanism):
    """Several statistics in one release, each quantized with its own bits; charges add.
    Its data pass reads every coordinate's statistic together (``statistics.Joint``): the
    rows once per pass of the longest (an order statistic's selection), not per query."""

    name = "noiseless.vector"
    measures = (MEASURE,)
    params_schema = VectorParamsSchema
    description = (
        "Noiseless privacy (bits of output count, not DP): several bounded statistics in"
        " one release, each planned as noiseless.aggregate with its own bits; the charge is"
        " the sum of the coordinates' charges (composition, Theorem 6)."
    )

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        total = read_bits(budget)
        charged = sum((p.bits for p in self._plans(params, meta)), Fraction(0))
        if charged > total:
            raise MechanismInputError(
                f"budget.{MEASURE}",
                f"the coordinates' charges add up to {float(charged):.6g} bits, above the budget",
            )
        return {MEASURE: charged}

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        self.cost(params, cost, meta)
        return self._accuracy(params, self._plans(params, meta))

    def statistic(self, params: Mapping[str, Any], cost: Budget,
                  meta: DatasetMeta) -> Statistic:
        self.cost(params, cost, meta)
        return Joint(tuple(passes.statistic(records)
                           for records in self._records(params, meta)))

    def release(self, params: Mapping[str, Any], partial: Partial, cost: Budget,
                meta: DatasetMeta, rng: np.random.Generator,
                statistic: Statistic | None = None) -> Output:
        bits = self.cost(params, cost, meta)[MEASURE]
        plans = self._plans(params, meta)
        coordinates = []
        for i, (item, plan, records) in enumerate(zip(
                params["queries"], plans, self._records(params, meta, plans), strict=True)):
            value = passes.value(records, Joint.member(partial, i))
            coordinates.append(_scalar_result(item, plan, central.release(value, plan)))
        count = math.prod(p.count for p in plans)
        result = {
            "values": [c["value"] for c in coordinates],
            "coordinates": coordinates,
            "certified_count": count,
            "bits": float(bits),
            "bits_exact": str(bits),
            "guarantees_bits": guarantees_bits(bits),
        }
        return Output(
            result=result,
            accuracy=self._accuracy(params, plans),
            guarantee=_guarantee(count, bits, local_release=False,
                                 note=", the coordinates' charges added (Theorem 6)"),
        )

    def _records(self, params: Mapping[str, Any], meta: DatasetMeta,
                 plans: list[ScalarPlan] | None = None) -> list[passes.Records]:
        """How each coordinate reads its records (as ``noiseless.aggregate`` does)."""
        plans = self._plans(params, meta) if plans is None else plans
        return [_records(item, meta, plan)
                for item, plan in zip(params["queries"], plans, strict=True)]

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        passes_ = sum(_passes(item) for item in params["queries"])
        return Work(float(max(meta.n_rows, 1)) * passes_, "params.queries")

    def _plans(self, params: Mapping[str, Any], meta: DatasetMeta) -> list[ScalarPlan]:
        return [scalar_plan(item, Fraction(item["bits"]), meta, f"params.queries.{j}")
                for j, item in enumerate(params["queries"])]

    def _accuracy(self, params: Mapping[str, Any], plans: list[ScalarPlan]) -> dict[str, Any]:
        parts = [_scalar_accuracy(item, p) for item, p in zip(params["queries"], plans,
                                                              strict=True)]
        warnings = sorted({w for part in parts for w in part["warnings"]})
        return {
            "deterministic": True,
            "max_error": [part["max_error"] for part in parts],
            "coordinates": parts,
            "certified_count": math.prod(p.count for p in plans),
            "bits": float(sum((p.bits for p in plans), Fraction(0))),
            "statement": (
                f"{len(plans)} statistics, each the midpoint of the bin holding its exact value"
                " (see coordinates); the joint release has at most the product of their"
                " counts per record"
            ),
            "warnings": warnings,
        }


# --------------------------------------------------------------------------- local


class NoiselessLocal(RecordMechanism):
    """Each record quantized to ⌊2^ε⌋ levels (or given edges); the column costs log2 q once.
    A row map without noise (its model: the public plan), so it runs in partitions."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 72.0
    fixed_bytes = 8 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 8.0
    map_fixed_bytes = 2 * 2**20

    record_level = True  # one output per record: the dataset's opt-in

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

    def fit(self, params: Mapping[str, Any], partial: Partial | None, cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> LocalPlan:
        return self._plan(params, read_bits(cost), meta)

    def privatize(self, rows: Mapping[str, np.ndarray], start: int,
                  params: Mapping[str, Any], cost: Budget, meta: DatasetMeta, model: Any,
                  rng: np.random.Generator) -> dict[str, np.ndarray]:
        name = params["column"]
        return {name: local.quantize(batch_columns(rows, [name])[name], model)}

    def describe(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 model: Any, released: Partial | None) -> Output:
        plan: LocalPlan = model
        result = {
            "column": params["column"],
            "quantizer": local.describe(plan, LIST_LIMIT),
            "certified_count": plan.count,
            "bits": float(plan.bits),
            "bits_exact": str(plan.bits),
            "guarantees_bits": guarantees_bits(plan.bits),
        }
        return Output(
            result=result,
            accuracy=self._accuracy(plan),
            guarantee=_guarantee(plan.count, plan.bits, local_release=True),
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
    certificate of ``central.certify_scalar`` (proofs in
    ``certify.max_outputs_uniform`` and ``certify.certified_count_edges``);
    for a vector, the product of its coordinates' (Theorem 6); for a local
    release, the reachable bins of the record quantizer (exact: the released
    column changes only in the replaced record's row, ``local``).
    """
    if isinstance(mechanism, NoiselessVector):
        mechanism.cost(params, budget, meta)
        return math.prod(p.count for p in mechanism._plans(params, meta))
    if not isinstance(mechanism, NoiselessAggregate | NoiselessLocal):
        raise TypeError(f"{mechanism.name} is not a noiseless mechanism")
    return mechanism._plan(params, read_bits(budget), meta).count


aggregate_mechanism = register(NoiselessAggregate())
vector_mechanism = register(NoiselessVector())
local_mechanism = register(NoiselessLocal())
