"""``exm``: the exponential mechanism on a discrete column, as DIP's paper used it (EXM).

Quality q(a) = the count of value a, over a **public** support: an integer column's
declared range lo..hi or a categorical column's categories (never values seen in
the data). Under replace-one one record moves one unit of count from one value to
another, so every q(a) changes by at most Δ = 1 and one draw with
P(a) ∝ exp(ε' q(a) / 2) is ε'-DP (McSherry & Talwar 2007). The paper "replaced each
record by a draw" with the sample maximum as Δ (not DP: it is data-dependent,
and Δ = max Z is not the sensitivity of a count): here the release is ``draws``
= k i.i.d. draws and costs the ε the caller gives, split as ε' = ε/k per draw
(sequential composition; k = n reproduces the paper's n draws honestly, at
ε/n each, i.e. nearly uniform draws).

Exact sampling (a Gumbel-max in floats is not exact): propose a uniformly (numpy's
bounded ``integers`` is exact), accept with probability exp(-γ_a),
γ_a = ε'(q* - q(a))/2 (q* = the largest count); accepted proposals are exactly
distributed ∝ exp(ε' q(a)/2). The Bernoulli(exp(-γ)) reads a 63-bit word V as the
leading bits of a uniform and accepts iff V < exp(-γ): a float64 test decides
with a margin, the rest go to ``sampling._exact_accept`` (decimal, refining V's
bits; γ is rational and nonzero there, so exp(-γ) is never a cell edge). Expected
proposals per draw: s / Σ_a exp(-γ_a) <= s (s = support size).

Timing: the number of proposals (hence the run time) depends on the counts, as for
any rejection or permute-and-flip sampler; the service exposes a job's duration
only coarsely, and this is not covered by the DP statement.

Output: the k draws (``draw`` index column and the column's values: integers or
category names; synthetic rows, not linked to records) and their histogram.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import Schema, fields, validate
from numpy.typing import NDArray

from mechanisms import sampling
from mechanisms.base import (
    Budget,
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
    Work,
    read_epsilon,
)
from mechanisms.competitors.common import PRIVACY_UNIT, column_array, fmt

#: largest public support (integer range or categories)
MAX_SUPPORT = 100_000
#: most draws one release may ask for
MAX_DRAWS = 10_000_000
#: work units charged per proposal (an exact Bernoulli is a few hundred array elements)
PROPOSAL_UNITS = 500
DRAW_COLUMN = "_draw"
_LN2_63 = 63 * math.log(2.0)


class ExmParamsSchema(Schema):
    column = fields.String(required=True)
    draws = fields.Integer(load_default=1, validate=validate.Range(min=1, max=MAX_DRAWS))


@dataclass(frozen=True)
class ExmPlan:
    column: ColumnMeta
    support: int
    offset: int  # integer columns: value = offset + index
    per_draw: Fraction  # ε' = ε / draws
    draws: int


def exact_bernoulli_exp(rng: np.random.Generator, gamma: list[Fraction]) -> NDArray[np.bool_]:
    """Independent Bernoulli(exp(-γ_i)) for rational γ_i >= 0, exactly."""
    m = len(gamma)
    words = rng.integers(0, 1 << 64, size=m, dtype=np.uint64) >> np.uint64(1)
    g = np.array([float(x) for x in gamma], dtype=np.float64)
    w = words.astype(np.float64)
    ok = words >= np.uint64(1 << 43)
    with np.errstate(divide="ignore"):
        y = _LN2_63 - np.log(np.maximum(w, 1.0))  # -ln V at the cell's low end
    margin = 2.0**-40 * (1.0 + g)
    accept = ok & (y - 2.0**-42 - margin > g)  # the cell's width in -ln V is below 2^-43
    reject = ok & (y + margin < g)
    out = accept.copy()
    zero = np.array([x == 0 for x in gamma], dtype=bool)
    out |= zero
    for i in np.flatnonzero(~(accept | reject | zero)):
        out[i] = sampling._exact_accept(rng, int(words[i]), gamma[i])
    return out


class ExmMechanism(Mechanism):
    """k exact exponential-mechanism draws of a discrete column's value (count as quality)."""

    name = "exm"
    measures = ("epsilon",)
    params_schema = ExmParamsSchema
    description = (
        "DIP's EXM competitor: k independent exponential-mechanism draws of a value of a"
        " discrete column (quality = count over the declared support), epsilon/k per draw,"
        " sampled exactly."
    )

    def _plan(self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> ExmPlan:
        col = meta.column(params["column"])
        if col.type == "categorical":
            support, offset = len(col.categories or ()), 0
        elif col.type == "integer" and col.bounds is not None:
            lo, hi = int(col.bounds[0]), int(col.bounds[1])
            support, offset = hi - lo + 1, lo
        else:
            raise MechanismInputError("params.column", f"column {col.name!r} must be integer"
                                      " (with bounds) or categorical")
        if not 1 <= support <= MAX_SUPPORT:
            raise MechanismInputError("params.column", f"support must have 1 to {MAX_SUPPORT}"
                                      " values")
        draws = int(params.get("draws", 1))
        return ExmPlan(col, support, offset, epsilon / draws, draws)

    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
             ) -> dict[str, Fraction]:
        epsilon = read_epsilon(budget, self.name)
        self._plan(params, epsilon, meta)
        return {"epsilon": epsilon}

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        col = meta.columns.get(str(params.get("column")))
        support = len(col.categories or ()) if col is not None and col.categories else 1
        if col is not None and col.type == "integer" and col.bounds is not None:
            support = int(col.bounds[1]) - int(col.bounds[0]) + 1
        draws = int(params.get("draws", 1))
        return Work(float(meta.n_rows) + float(draws) * support * PROPOSAL_UNITS,
                    "params.draws", "lower draws")

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
                 ) -> dict[str, Any]:
        return self._accuracy(self._plan(params, read_epsilon(cost, self.name), meta))

    def counts(self, plan: ExmPlan, x: NDArray[Any]) -> NDArray[np.int64]:
        """Counts over the support; values outside it move to the nearest end (clipping)."""
        codes = np.asarray(x)
        if codes.dtype.kind == "f":
            codes = np.where(np.isnan(codes), 0, codes)
        idx = np.clip(codes.astype(np.int64) - plan.offset, 0, plan.support - 1)
        return np.bincount(idx, minlength=plan.support).astype(np.int64)

    def sample(self, plan: ExmPlan, counts: NDArray[np.int64], rng: np.random.Generator,
               draws: int) -> NDArray[np.int64]:
        """``draws`` i.i.d. exact EM draws (support indices)."""
        top = int(counts.max())
        by_value = [plan.per_draw * (top - int(c)) / 2 for c in counts]  # γ_a, exact
        out: list[int] = []
        batch = max(16, 2 * draws)
        while len(out) < draws:
            proposals = rng.integers(0, plan.support, size=min(batch, 1 << 20))
            keep = exact_bernoulli_exp(rng, [by_value[int(a)] for a in proposals])
            out.extend(int(p) for p in proposals[keep][: draws - len(out)])
        return np.asarray(out, dtype=np.int64)

    def run(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        epsilon = read_epsilon(cost, self.name)
        plan = self._plan(params, epsilon, meta)
        counts = self.counts(plan, column_array(data, plan.column.name, meta.n_rows))
        idx = self.sample(plan, counts, rng, plan.draws)
        hist = np.bincount(idx, minlength=plan.support)
        values: np.ndarray
        if plan.column.type == "categorical":
            values = np.asarray(plan.column.categories, dtype=str)[idx]
            labels: dict[str, Any] = {"categories": list(plan.column.categories or ())}
        else:
            values = idx + plan.offset
            labels = {"support": [plan.offset, plan.offset + plan.support - 1]}
        return Output(
            result={"draws": plan.draws, "column": plan.column.name, "histogram":
                    [int(v) for v in hist] if plan.support <= 1000 else None, **labels,
                    "epsilon": {"total": float(epsilon), "per_draw": float(plan.per_draw)}},
            accuracy=self._accuracy(plan),
            guarantee=(f"pure epsilon-DP (exponential mechanism, epsilon={fmt(epsilon)} nats:"
                       f" {plan.draws} draw(s) at {fmt(plan.per_draw)} each, count quality of"
                       f" sensitivity 1 over the declared support), {PRIVACY_UNIT}"),
            table={DRAW_COLUMN: np.arange(plan.draws, dtype=np.int64),
                   plan.column.name: values},
            per_record=False,  # draws from a DP distribution, not the dataset's records
        )

    @staticmethod
    def _accuracy(plan: ExmPlan) -> dict[str, Any]:
        eps = float(plan.per_draw)
        shortfall = 2.0 / eps * (math.log(plan.support) + math.log(20.0))
        return {
            "per_draw_epsilon": eps,
            "support": plan.support,
            "count_shortfall_95": shortfall,
            "statement": (
                "Each draw is value a with probability proportional to exp(epsilon' q(a)/2),"
                " q(a) its count (epsilon' = epsilon/draws); with probability at least 95% a"
                " draw's count is within count_shortfall_95 = (2/epsilon')(ln s + ln 20) of"
                " the largest count. The draws are a synthetic sample from that law, not the"
                " data's distribution: for small epsilon' they are nearly uniform on the"
                " support."
            ),
        }
