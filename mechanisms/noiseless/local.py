"""Local (record-level) noiseless privacy: every record quantized on its own.

Definition 2: a record map Q is ε-locally noiselessly private iff it has at
most 2^ε outputs on the record domain. Releasing the whole quantized column
(Q(x_1), …, Q(x_n)) changes in one coordinate only when one record is
replaced, so it costs log2(#outputs of Q) once, not n times. The certificate
is exact here: the outputs of Q are its bins that some admissible record
reaches (every bin of positive width for a continuous column; bins holding a
whole number of [lo, hi] for an integer one). No off-by-one, no float issue:
the bins are the float intervals between the edges and ``np.searchsorted``
places values by exact comparisons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.noiseless import exact
from mechanisms.noiseless.bits import Bits, as_bits, bits_upper, levels_for_bits
from mechanisms.noiseless.central import record_bounds
from mechanisms.noiseless.quantizer import EdgeQuantizer, Number

#: most levels of a local quantizer (about 20 bits: beyond that a record is nearly exact anyway)
MAX_LEVELS = 2**20


@dataclass(frozen=True, eq=False)
class LocalPlan:
    """A record quantizer and its certificate, from public inputs only."""

    quantizer: EdgeQuantizer
    record_bounds: tuple[Fraction, Fraction]
    integer: bool
    #: bins chosen by the rule (True) or given by the analyst
    uniform: bool
    #: ⌊2^ε⌋ for the budget, capped at MAX_LEVELS
    allowed: int
    #: distinct outputs of one record: the reachable bins (what is charged)
    count: int
    bits: Fraction

    @property
    def domain_size(self) -> int | None:
        lo, hi = self.record_bounds
        return int(hi - lo) + 1 if self.integer else None

    @property
    def vacuous(self) -> bool:
        """Every admissible record value has its own output: the release is exact."""
        size = self.domain_size
        return size is not None and self.count >= size

    @property
    def max_error(self) -> float:
        """Worst |record − released value| over records in the declared bounds."""
        q = self.quantizer
        reach = reachable_bins(q, self.record_bounds, integer=self.integer)
        reps = q.outputs[reach]
        if self.integer:  # the farthest admissible values of a bin are its integer extent
            first, last = _integer_extent(q, self.record_bounds)
            inner = np.maximum(reps - first[reach], last[reach] - reps)
        else:
            inner = np.maximum(reps - q.edges[:-1][reach], q.edges[1:][reach] - reps)
        lo, hi = (float(b) for b in self.record_bounds)
        tails = (float(q.outputs[0]) - lo, hi - float(q.outputs[-1]))
        return float(max(float(inner.max()), *tails))


def reachable_bins(
    quantizer: EdgeQuantizer, bounds: tuple[Fraction, Fraction], *, integer: bool
) -> NDArray[np.bool_]:
    """Which bins some record in ``bounds`` lands in (records are clipped to the edges' span).

    Continuous records reach every bin of positive width and the closed last
    bin; integer records the bins of ``_integer_extent``.
    """
    if not integer:
        return quantizer.nonempty_bins()
    first, last = _integer_extent(quantizer, bounds)
    reach: NDArray[np.bool_] = first <= last
    return reach


def _integer_extent(
    quantizer: EdgeQuantizer, bounds: tuple[Fraction, Fraction]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Smallest and largest value an integer record in ``bounds`` takes in each bin.

    [a, b) holds the integers ⌈a⌉ … ⌈b⌉ − 1 and the closed last bin ⌈a⌉ … ⌊b⌋
    (within [lo, hi]); when some integer lies below the first edge (above the
    last) it is clipped onto that edge, which adds the edge to its bin. A bin
    with first > last is unreachable.
    """
    lo, hi = (float(b) for b in bounds)
    edges = quantizer.edges
    first = np.maximum(np.ceil(edges[:-1]), lo)
    last = np.minimum(np.ceil(edges[1:]) - 1.0, hi)
    last[-1] = min(math.floor(edges[-1]), hi)
    for end, beyond in ((edges[0], lo < edges[0]), (edges[-1], hi > edges[-1])):
        if beyond:
            k = int(quantizer.index([end])[0])
            first[k], last[k] = min(first[k], end), max(last[k], end)
    return first, last


def _integer_outputs(quantizer: EdgeQuantizer, bounds: tuple[Fraction, Fraction]) -> EdgeQuantizer:
    """The same bins, each released as the middle of the integers it holds (exact if one)."""
    first, last = _integer_extent(quantizer, bounds)
    outputs = np.where(first <= last, first / 2.0 + last / 2.0, quantizer.outputs)
    return EdgeQuantizer(quantizer.edges, outputs)


def plan_local(
    bits: Bits,
    bounds: tuple[Number, Number],
    *,
    edges: ArrayLike | None = None,
    integer: bool = False,
    max_levels: int = MAX_LEVELS,
) -> LocalPlan:
    """The local quantizer for a column with public ``bounds`` and a budget of ``bits``.

    Uniform (no ``edges``): q = min(⌊2^ε⌋, D, max_levels) equal bins on
    [lo, hi], shrunk to the reachable bins until every bin is reachable (only
    degenerate float ranges need it), so the count is q and a charge of
    log2 q re-plans to the same q. Given ``edges`` (inside the bounds,
    strictly increasing): the count of reachable bins must be <= ⌊2^ε⌋.
    """
    budget = as_bits(bits)
    lo, hi = record_bounds(bounds, integer=integer)
    allowed = levels_for_bits(budget, cap=max_levels)
    if edges is None:
        levels = allowed if not integer else min(allowed, int(hi - lo) + 1)
        while True:
            quantizer = EdgeQuantizer.uniform(lo, hi, levels)
            count = int(np.count_nonzero(reachable_bins(quantizer, (lo, hi), integer=integer)))
            if count == levels:
                break
            levels = count
        uniform = True
    else:
        given = np.asarray(edges, dtype=np.float64)
        if given.ndim != 1 or given.shape[0] < 2 or np.any(np.diff(given) <= 0):
            raise ValueError("edges must be strictly increasing, at least two")
        if not (lo <= Fraction(float(given[0])) and Fraction(float(given[-1])) <= hi):
            raise ValueError("edges must lie inside the bounds")
        quantizer = EdgeQuantizer(given)
        count = int(np.count_nonzero(reachable_bins(quantizer, (lo, hi), integer=integer)))
        if count > allowed:
            raise ValueError(
                f"the edges give {count} reachable bins; the budget allows at most {allowed}"
            )
        uniform = False
    if integer:
        quantizer = _integer_outputs(quantizer, (lo, hi))
    return LocalPlan(
        quantizer, (lo, hi), integer, uniform, allowed, count, min(budget, bits_upper(count))
    )


def quantize(x: ArrayLike, local_plan: LocalPlan) -> NDArray[np.float64]:
    """The released column: each record (clipped to the bounds) replaced by its bin's midpoint."""
    lo, hi = local_plan.record_bounds
    if local_plan.integer:
        values = exact.clip_integer(np.asarray(x), int(lo), int(hi)).astype(np.float64)
        return local_plan.quantizer.quantize(values)
    return local_plan.quantizer.quantize(x)  # clips to the edges' span, NaN to the lower end


def local_release(
    x: ArrayLike,
    bits: Bits,
    bounds: tuple[Number, Number],
    *,
    edges: ArrayLike | None = None,
    integer: bool = False,
) -> tuple[LocalPlan, NDArray[np.float64]]:
    """Notebook entry point: plan from public inputs, then quantize the column."""
    local_plan = plan_local(bits, bounds, edges=edges, integer=integer)
    return local_plan, quantize(x, local_plan)


def describe(local_plan: LocalPlan, list_limit: int = 1024) -> dict[str, Any]:
    """The quantizer as JSON: edges and representatives listed up to ``list_limit`` bins."""
    q = local_plan.quantizer
    doc: dict[str, Any] = {
        "kind": "uniform" if local_plan.uniform else "edges",
        "levels": q.levels,
        "lower": q.lower,
        "upper": q.upper,
    }
    if q.levels <= list_limit:
        doc["edges"] = q.edges.tolist()
        doc["representatives"] = q.outputs.tolist()
    return doc
