"""Noiselessly private aggregates (central model): a bounded query, exactly evaluated, quantized.

The privacy unit is the paper's: neighbouring datasets differ in one record
replaced, n is public. Records are clipped to public bounds [lo, hi], which
fixes the query's range [ymin, ymax] and its global sensitivity S:

    ================  =====  =====  =========  ===========================
    statistic         ymin   ymax   S          D (values of one record)
    ================  =====  =====  =========  ===========================
    mean              lo     hi     (hi−lo)/n  hi−lo+1 (integer), else ∞
    sum               n·lo   n·hi   hi−lo      hi−lo+1 (integer), else ∞
    count             0      n      1          2 (meets the condition or not)
    min, max, median  lo     hi     hi−lo      hi−lo+1 (integer), else ∞
    median (n even)   lo     hi     (hi−lo)/2  hi−lo+1 (integer), else ∞
    ================  =====  =====  =========  ===========================

(R/S = n for the first three, 1 for the order statistics: with the others
at lo and hi one record moves a min, max or odd-n median across the whole
range; an even-n median, the mean of the two middle records, half of it).
A budget of ε bits buys K = ⌊2^ε⌋ outputs (capped at D, where more would buy
nothing, and at 2^40). The query is evaluated *exactly* (fractions of the
clipped records) and indexed exactly, so the slice image really lies in an
interval of length S and the exact corrected Theorem 8 applies: q* =
``exact_levels(K)`` bins, certified ``max_outputs_uniform(q*) = K`` outputs,
charged as log2 K rounded up. (The spec's floating-point-safe rule, one
level fewer, is only needed when f is evaluated in floats.) When K reaches D
on a query whose values lie on a lattice (counts, integer columns) the value
is released exactly: the slice image has at most D points whatever the
quantizer, so exactness costs the same bits. Vector queries give each
coordinate its own budget and their charges add (Theorem 6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.noiseless import exact
from mechanisms.noiseless.bits import (
    Bits,
    as_bits,
    at_most_power,
    bits_upper,
    levels_for_bits,
    split_bits,
)
from mechanisms.noiseless.certify import (
    certified_count_edges,
    exact_levels,
    max_outputs_uniform,
    paper_levels,
)
from mechanisms.noiseless.quantizer import ExactEdgeQuantizer, Number, UniformQuantizer

STATISTICS = ("mean", "sum", "count", "median", "min", "max")
#: statistics one record can move across the whole range (S = R)
ORDER_STATISTICS = ("median", "min", "max")
#: most outputs one aggregate release certifies; below 2^40 a charge re-plans to the same count
MAX_COUNT = 2**40

ScalarQuantizer = UniformQuantizer | ExactEdgeQuantizer


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
    #: every value of the query is lower + j·step (None: a continuum)
    step: Fraction | None = None

    @property
    def span(self) -> Fraction:
        return self.upper - self.lower


def bounded_query(
    statistic: str, bounds: tuple[Number, Number], n: int, *, integer: bool = False
) -> Query:
    """The table above: a statistic of n records clipped to ``bounds``.

    ``integer`` records are whole numbers (bounds rounded inwards). For a
    count, ``bounds`` is ignored: a record meets the condition or not.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}")
    if n < 1:
        raise ValueError("n must be >= 1")
    if statistic == "count":
        return Query("count", Fraction(0), Fraction(n), Fraction(1), 2, n, step=Fraction(1))
    lo, hi = record_bounds(bounds, integer=integer)
    size = int(hi - lo) + 1 if integer else None
    whole = Fraction(1) if integer else None
    if statistic == "mean":
        step = Fraction(1, n) if integer else None
        return Query("mean", lo, hi, (hi - lo) / n, size, n, (lo, hi), integer, step)
    if statistic in ORDER_STATISTICS:
        # an even-n median is the mean of the two middle records (half-integers), and one
        # record moves it only between (o_{m-1} + o_m)/2 and (o_m + o_{m+1})/2 (the others
        # sorted, m = n/2): S = (hi − lo)/2
        even = statistic == "median" and n % 2 == 0
        step = Fraction(1, 2) if integer and even else whole
        s_ = (hi - lo) / 2 if even else hi - lo
        return Query(statistic, lo, hi, s_, size, n, (lo, hi), integer, step)
    if not (_finite(n * lo) and _finite(n * hi)):
        raise ValueError("n times the bounds overflows a double")
    return Query("sum", n * lo, n * hi, hi - lo, size, n, (lo, hi), integer, whole)


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


def certify_scalar(quantizer: ScalarQuantizer, query: Query) -> int:
    """Outputs one record can cause: bins a length-S interval meets, at most D. Exact.

    Valid because ``evaluate`` is exact: the slice image {f(x_i, x_{-i}) : x_i}
    lies in a closed interval of length S and has at most D points, and the
    quantizer indexes exactly (``certify.max_outputs_uniform`` for uniform
    bins, ``certify.certified_count_edges`` for given edges).
    """
    if isinstance(quantizer, UniformQuantizer):
        count = max_outputs_uniform(
            quantizer.levels, query.sensitivity, quantizer.upper - quantizer.lower
        )
    else:
        count = certified_count_edges(quantizer.edges, query.sensitivity)
    return count if query.domain_size is None else min(count, query.domain_size)


def lattice_quantizer(query: Query) -> UniformQuantizer:
    """One bin per possible value, centred on it: the release is the exact query value."""
    if query.step is None:
        raise ValueError("the query's values do not lie on a lattice")
    half = query.step / 2
    levels = int(query.span / query.step) + 1
    return UniformQuantizer(query.lower - half, query.upper + half, levels)


@dataclass(frozen=True)
class ScalarPlan:
    """Everything about one scalar release that follows from public inputs."""

    query: Query
    quantizer: ScalarQuantizer
    #: ⌊2^ε⌋ for the budget, before the caps
    allowed: int
    #: certified number of distinct outputs per record (what is charged)
    count: int
    #: the charge in bits: log2 ``count`` rounded up, at most the budget
    bits: Fraction
    #: the released value is the exact query value (one bin per possible value)
    exact: bool = False
    #: paper mode: the nominal ε the paper's Theorem 8 sized the quantizer for (its true
    #: level, log2 ``count``, is higher); None for the corrected rule
    paper_bits: Fraction | None = None

    @property
    def max_error(self) -> Fraction:
        """Worst-case distance from the exact query to the released value."""
        if self.exact:
            return Fraction(0)
        q = self.quantizer
        if isinstance(q, UniformQuantizer):
            return q.width / 2
        tails = (q.representative(0) - self.query.lower,
                 self.query.upper - q.representative(q.levels - 1))
        return max(q.width / 2, *tails)

    @property
    def vacuous(self) -> bool:
        """No protection: the query could take only ``count`` values per record anyway."""
        size = self.query.domain_size
        return size is not None and self.count >= size


def capped_count(allowed: int, query: Query) -> int:
    """K capped at the number of values one record can contribute (more buys nothing)."""
    return allowed if query.domain_size is None else min(allowed, query.domain_size)


def plan(query: Query, bits: Bits, *, max_count: int = MAX_COUNT) -> ScalarPlan:
    """Choose the quantizer for ``bits`` and certify it (corrected Theorem 8, exact).

    K = min(⌊2^ε⌋, D, max_count). If K = D and the query lives on a lattice,
    the value is released exactly (one bin per value: still K outputs);
    otherwise q = exact_levels(K) uniform bins, whose certificate
    max_outputs_uniform(q) is exactly K (checked here). Charge: min(ε, log2 K
    rounded up), which re-plans to the same quantizer.
    """
    budget = as_bits(bits)
    allowed = levels_for_bits(budget, cap=max_count)
    count = capped_count(allowed, query)
    lattice = query.step is not None and count == query.domain_size
    if lattice:
        quantizer = lattice_quantizer(query)
    else:
        quantizer = UniformQuantizer(
            query.lower, query.upper, exact_levels(count, query.sensitivity, query.span)
        )
    if certify_scalar(quantizer, query) != count:  # a failure is a bug, not bad input
        raise AssertionError("certificate does not match the planned count")
    return ScalarPlan(query, quantizer, allowed, count, min(budget, bits_upper(count)), lattice)


def plan_edges(
    query: Query, bits: Bits, edges: Sequence[Number], *, max_count: int = MAX_COUNT
) -> ScalarPlan:
    """A public non-uniform quantizer: ``edges`` inside [ymin, ymax], certified exactly.

    Values are clipped to [edges[0], edges[-1]]. The certificate (spec §6.6,
    capped at D) must be at most ⌊2^ε⌋ and at least 2 (one reachable bin would
    be a constant); the charge is log2 of it.
    """
    budget = as_bits(bits)
    allowed = levels_for_bits(budget, cap=max_count)
    quantizer = ExactEdgeQuantizer(list(edges))
    if not (query.lower <= quantizer.lower and quantizer.upper <= query.upper):
        raise ValueError("edges must lie inside the query's range")
    count = certify_scalar(quantizer, query)
    if count > allowed:
        raise ValueError(
            f"the edges let one record cause {count} outputs; the budget allows at most {allowed}"
        )
    if count < 2:
        raise ValueError("one record can reach only one bin: the output would be a constant")
    return ScalarPlan(query, quantizer, allowed, count, min(budget, bits_upper(count)))


def plan_paper(query: Query, paper_bits: Bits, bits: Bits) -> ScalarPlan:
    """The paper's Theorem 8 as printed, q = ⌊2^ε·R/S⌋ for the nominal ``paper_bits``.

    Reproduction only: its true level is log2 of the exact certificate
    (up to log2(⌈2^ε⌉ + 1), spec §6.2), which is what is charged, so the
    budget ``bits`` must cover the true level, not the nominal one.
    """
    nominal = as_bits(paper_bits)
    budget = as_bits(bits)
    quantizer = UniformQuantizer(
        query.lower, query.upper, paper_levels(nominal, query.sensitivity, query.span)
    )
    count = certify_scalar(quantizer, query)
    if not at_most_power(count, budget):
        raise ValueError(
            f"paper mode at {float(nominal):.6g} nominal bits lets one record cause {count}"
            f" outputs, a true level of {math.log2(count):.6g} bits, above the budget"
        )
    return ScalarPlan(
        query, quantizer, levels_for_bits(budget, cap=MAX_COUNT), count,
        min(budget, bits_upper(count)), paper_bits=nominal,
    )


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
    """Quantize an exact query value (clipped to the quantizer's range) with the plan's bins."""
    quantizer = scalar_plan.quantizer
    k = quantizer.index(value)
    left, right = quantizer.bin(k)
    return ScalarRelease(
        float(quantizer.representative(k)),
        k,
        (float(left), float(right)),
        k == quantizer.levels - 1,
    )


def _order_statistic(values: NDArray[Any], statistic: str) -> Fraction:
    """Exact min, max or median (mean of the two middle records for even n)."""
    n = values.shape[0]
    if statistic == "min":
        return Fraction(values.min().item())
    if statistic == "max":
        return Fraction(values.max().item())
    lo_k, hi_k = (n - 1) // 2, n // 2
    part = np.partition(values, [lo_k, hi_k])
    return (Fraction(part[lo_k].item()) + Fraction(part[hi_k].item())) / 2


def evaluate(query: Query, x: ArrayLike) -> Fraction:
    """The exact query value on records ``x`` (a 0/1 or boolean mask for a count).

    Records are clipped to the query's bounds (missing values count as the
    lower bound), and summed or ordered exactly, so the value is the true one.
    """
    values = np.asarray(x)
    n = values.shape[0]
    if values.ndim != 1 or n != query.n:
        raise ValueError("the query was planned for a different number of records")
    if query.statistic == "count":
        return Fraction(int(np.count_nonzero(values)))
    assert query.record_bounds is not None
    lo, hi = query.record_bounds
    clipped: NDArray[Any] = (
        exact.clip_integer(values, int(lo), int(hi))
        if query.integer
        else exact.clip_float(values, float(lo), float(hi))
    )
    if query.statistic in ORDER_STATISTICS:
        return _order_statistic(clipped, query.statistic)
    if query.integer:
        total: Fraction | int = exact.exact_int_sum(clipped)
    else:
        total = exact.exact_float_sum(clipped)
    return exact.exact_mean(total, n) if query.statistic == "mean" else Fraction(total)


def aggregate(
    x: ArrayLike,
    statistic: str,
    bits: Bits,
    bounds: tuple[Number, Number] = (0, 1),
    *,
    integer: bool = False,
    edges: Sequence[Number] | None = None,
    paper_bits: Bits | None = None,
) -> tuple[ScalarPlan, ScalarRelease]:
    """Notebook entry point: a noiselessly private statistic of ``x``.

    ``bounds`` (and ``edges``) must be public, never computed from ``x``; for
    a count, ``x`` is the mask of rows meeting the condition. ``paper_bits``
    reproduces the paper's (unsafe) quantizer, charged at its true level.
    """
    values = np.asarray(x)
    query = bounded_query(statistic, bounds, values.shape[0], integer=integer)
    if edges is not None and paper_bits is not None:
        raise ValueError("edges and paper_bits are exclusive")
    if edges is not None:
        scalar_plan = plan_edges(query, bits, edges)
    elif paper_bits is not None:
        scalar_plan = plan_paper(query, paper_bits, bits)
    else:
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
