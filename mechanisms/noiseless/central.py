"""Noiselessly private aggregates (central model): a bounded query, exactly evaluated, quantized.

The privacy unit is the paper's: neighbouring datasets differ in one record
replaced, n is public. Records are clipped to public bounds [lo, hi], which
fixes the query's range [ymin, ymax] and its global sensitivity S:

    =========  =====  =====  =========  ===========================
    statistic  ymin   ymax   S          D (values of one record)
    =========  =====  =====  =========  ===========================
    mean       lo     hi     (hi−lo)/n  hi−lo+1 (integer), else ∞
    sum        n·lo   n·hi   hi−lo      hi−lo+1 (integer), else ∞
    count      0      n      1          2 (meets the condition or not)
    =========  =====  =====  =========  ===========================

so R/S = n in every case. A budget of ε bits buys K = ⌊2^ε⌋ outputs
(capped at D, where more would buy nothing, and at 2^40); the quantizer gets
``safe_levels(K)`` bins and the certificate is exactly K (the rule's fixed
point), charged as log2 K rounded up. Vector queries split the budget over
coordinates and their charges add (Theorem 6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from mechanisms.noiseless import exact
from mechanisms.noiseless.bits import Bits, as_bits, bits_upper, levels_for_bits, split_bits
from mechanisms.noiseless.certify import certified_count, safe_levels
from mechanisms.noiseless.quantizer import Number, UniformQuantizer

STATISTICS = ("mean", "sum", "count")
#: most outputs one aggregate release certifies; below 2^40 a charge re-plans to the same count
MAX_COUNT = 2**40


@dataclass(frozen=True)
class Query:
    """A scalar query in public terms: its range, sensitivity and per-record domain size."""

    statistic: str
    lower: Fraction
    upper: Fraction
    sensitivity: Fraction
    #: distinct values one record can contribute (None: a continuum)
    domain_size: int | None = None
    #: number of records (public); 0 for a free-standing query
    n: int = 0
    #: bounds each record is clipped to, and whether records are whole numbers
    record_bounds: tuple[Fraction, Fraction] | None = None
    integer: bool = False

    @property
    def span(self) -> Fraction:
        return self.upper - self.lower


def bounded_query(
    statistic: str, bounds: tuple[Number, Number], n: int, *, integer: bool = False
) -> Query:
    """The table above: a mean, sum or count over n records clipped to ``bounds``.

    ``integer`` records are whole numbers (bounds rounded inwards). For a
    count, ``bounds`` is ignored: a record meets the condition or not.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}")
    if n < 1:
        raise ValueError("n must be >= 1")
    if statistic == "count":
        return Query("count", Fraction(0), Fraction(n), Fraction(1), 2, n)
    lo, hi = record_bounds(bounds, integer=integer)
    size = int(hi - lo) + 1 if integer else None
    if statistic == "mean":
        return Query("mean", lo, hi, (hi - lo) / n, size, n, (lo, hi), integer)
    if not (_finite(n * lo) and _finite(n * hi)):
        raise ValueError("n times the bounds overflows a double")
    return Query("sum", n * lo, n * hi, hi - lo, size, n, (lo, hi), integer)


def _finite(x: Fraction) -> bool:
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def record_bounds(
    bounds: tuple[Number, Number], *, integer: bool = False
) -> tuple[Fraction, Fraction]:
    """Finite bounds lo < hi as fractions; integer records round them inwards."""
    if len(bounds) != 2 or not all(math.isfinite(float(b)) for b in bounds):
        raise ValueError("bounds must be two finite numbers")
    lo, hi = Fraction(bounds[0]), Fraction(bounds[1])
    if integer:
        lo, hi = Fraction(math.ceil(lo)), Fraction(math.floor(hi))
        if max(abs(lo), abs(hi)) >= 2**53:
            raise ValueError("integer bounds must lie within ±2**53")
    if not lo < hi:
        raise ValueError("bounds must satisfy lower < upper")
    return lo, hi


@dataclass(frozen=True)
class ScalarPlan:
    """Everything about one scalar release that follows from public inputs."""

    query: Query
    quantizer: UniformQuantizer
    #: ⌊2^ε⌋ for the budget, before the caps
    allowed: int
    #: certified number of distinct outputs per record (what is charged)
    count: int
    #: the charge in bits: log2 ``count`` rounded up, at most the budget
    bits: Fraction

    @property
    def max_error(self) -> Fraction:
        """Worst-case distance from the exact query to the released midpoint."""
        return self.quantizer.width / 2

    @property
    def vacuous(self) -> bool:
        """No protection: the query could take only ``count`` values per record anyway."""
        size = self.query.domain_size
        return size is not None and self.count >= size


def plan(query: Query, bits: Bits, *, max_count: int = MAX_COUNT) -> ScalarPlan:
    """Choose the quantizer for ``bits`` and certify it.

    K = min(⌊2^ε⌋, D, max_count); q = safe_levels(K); certificate
    min(certified_count_uniform(q), D) = K (the fixed point of the rule, checked
    here); charge = min(ε, log2 K rounded up).
    """
    budget = as_bits(bits)
    allowed = levels_for_bits(budget, cap=max_count)
    count = allowed if query.domain_size is None else min(allowed, query.domain_size)
    levels = safe_levels(count, query.sensitivity, query.span)
    quantizer = UniformQuantizer(query.lower, query.upper, levels)
    certified = certified_count(quantizer, query.sensitivity, query.domain_size)
    if certified != count:  # the fixed point of safe_levels; a failure is a bug, not bad input
        raise AssertionError("certificate does not match the planned count")
    return ScalarPlan(query, quantizer, allowed, count, min(budget, bits_upper(count)))


@dataclass(frozen=True)
class ScalarRelease:
    """One quantized value: the bin's midpoint, its index and its interval."""

    value: float
    index: int
    bin: tuple[float, float]
    right_closed: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "bin_index": self.index,
            "bin": list(self.bin),
            "bin_right_closed": self.right_closed,
        }


def release(value: Number, scalar_plan: ScalarPlan) -> ScalarRelease:
    """Quantize an exact query value (clipped to the plan's range) with the plan's quantizer."""
    quantizer = scalar_plan.quantizer
    k = quantizer.index(value)
    left, right = quantizer.bin(k)
    return ScalarRelease(
        float(quantizer.representative(k)),
        k,
        (float(left), float(right)),
        k == quantizer.levels - 1,
    )


def evaluate(query: Query, x: ArrayLike) -> Fraction:
    """The exact query value on records ``x`` (a 0/1 or boolean mask for a count).

    Records are clipped to the query's bounds (missing values count as the
    lower bound), and summed exactly, so the value is the true one.
    """
    values = np.asarray(x)
    n = values.shape[0]
    if values.ndim != 1 or n != query.n:
        raise ValueError("the query was planned for a different number of records")
    if query.statistic == "count":
        return Fraction(int(np.count_nonzero(values)))
    assert query.record_bounds is not None
    lo, hi = query.record_bounds
    if query.integer:
        total: Fraction | int = exact.exact_int_sum(exact.clip_integer(values, int(lo), int(hi)))
    else:
        total = exact.exact_float_sum(exact.clip_float(values, float(lo), float(hi)))
    return exact.exact_mean(total, n) if query.statistic == "mean" else Fraction(total)


def aggregate(
    x: ArrayLike,
    statistic: str,
    bits: Bits,
    bounds: tuple[Number, Number] = (0, 1),
    *,
    integer: bool = False,
) -> tuple[ScalarPlan, ScalarRelease]:
    """Notebook entry point: a noiselessly private mean, sum or count of ``x``.

    ``bounds`` must be public (never computed from ``x``); for a count, ``x``
    is the mask of rows meeting the condition.
    """
    values = np.asarray(x)
    query = bounded_query(statistic, bounds, values.shape[0], integer=integer)
    scalar_plan = plan(query, bits)
    return scalar_plan, release(evaluate(query, values), scalar_plan)


@dataclass(frozen=True)
class VectorPlan:
    """Per-coordinate plans; the charge is their sum (composition, Theorem 6)."""

    plans: tuple[ScalarPlan, ...]

    @property
    def bits(self) -> Fraction:
        return sum((p.bits for p in self.plans), Fraction(0))

    @property
    def count(self) -> int:
        """Certified joint outputs: at most the product of the coordinates' counts."""
        return math.prod(p.count for p in self.plans)


def plan_vector(
    queries: Sequence[Query], bits: Bits, shares: Sequence[Bits] | None = None
) -> VectorPlan:
    """Split ``bits`` over the coordinates (equally, or by ``shares`` summing to at most it)."""
    if not queries:
        raise ValueError("a vector query needs at least one coordinate")
    total = as_bits(bits)
    if shares is None:
        parts = split_bits(total, len(queries))
    else:
        parts = [as_bits(s) for s in shares]
        if len(parts) != len(queries) or sum(parts) > total:
            raise ValueError("shares must give one budget per coordinate, summing to at most bits")
    return VectorPlan(tuple(plan(q, b) for q, b in zip(queries, parts, strict=True)))


def release_vector(values: Sequence[Number], vector_plan: VectorPlan) -> list[ScalarRelease]:
    """Quantize each coordinate with its own plan."""
    if len(values) != len(vector_plan.plans):
        raise ValueError("one value per coordinate")
    return [release(v, p) for v, p in zip(values, vector_plan.plans, strict=True)]
