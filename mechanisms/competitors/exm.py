"""``exm``: DIP's EXM competitor, k private draws of a discrete column's value.

Quality q(a) = the count of value a, over a **public** support: an integer column's
declared range lo..hi or a categorical column's categories (never values seen in
the data). Under replace-one one record moves one unit of count from one value to
another, so every q(a) changes by at most Δ = 1. The paper "replaced each record by
a draw" of the exponential mechanism with the sample maximum as Δ (not DP: it is
data-dependent, and Δ = max Z is not the sensitivity of a count): here the release
is ``draws`` = k i.i.d. draws and costs the ε the caller gives, split as ε' = ε/k
per draw (sequential composition; k = n reproduces the paper's n draws honestly,
at ε/n each, i.e. nearly uniform draws).

Each draw is **permute-and-flip** (McKenna & Sheldon 2020, ``mechanisms.flip``) with
coin probabilities p_a = exp(−γ_a), γ_a = ε'(q* − q(a))/2 (q* the largest count):
ε'-DP like the exponential mechanism P(a) ∝ exp(ε' q(a)/2) (McSherry & Talwar
2007), whose quality it never falls below in expectation. It replaces the old
exact rejection sampler of the exponential mechanism's own law, whose number of
proposals was geometric in the data's acceptance rate Σ_a p_a / s: the run time,
which an analyst sees, was a second output that is not ε-DP (issue #27; the audit's
work family certifies ε >= 1.3 against it at charged 1, ``audit.controls``).

Timing: every draw evaluates all s coins (s = support size) and one permutation of
the support, so the work is draws·s coins whatever the counts. The coins' exact tier
(probability <= 2^-48 per coin whatever the data, about 60 µs) runs a public number of
times per call, padded with dummies (``mechanisms.flip``).

Output: the k draws (``draw`` index column and the column's values: integers or
category names; synthetic rows, not linked to records) and their histogram.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import Schema, fields, validate
from numpy.typing import NDArray

from mechanisms import flip
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
from mechanisms.competitors.common import PRIVACY_UNIT, column_array
from mechanisms.exact import fmt

#: largest public support (integer range or categories)
MAX_SUPPORT = 100_000
#: most draws one release may ask for
MAX_DRAWS = 10_000_000
#: work units charged per coin (a coin and its share of the permutation take ~30 ns, about
#: one unit; the old rejection sampler's per-proposal figure is kept, so the work bound,
#: draws·s coins, refuses exactly what it refused before)
COIN_UNITS = 500
DRAW_COLUMN = "_draw"


class ExmParamsSchema(Schema):
    column = fields.String(required=True, metadata={
        "description": "the integer or categorical column drawn from (support: its declared "
                       "range or categories)"})
    draws = fields.Integer(
        strict=True, load_default=1, validate=validate.Range(min=1, max=MAX_DRAWS),
        metadata={"description": "k, the number of private draws, each at epsilon/k (default 1)"})


@dataclass(frozen=True)
class ExmPlan:
    column: ColumnMeta
    support: int
    offset: int  # integer columns: value = offset + index
    per_draw: Fraction  # ε' = ε / draws
    draws: int
    n: int  # public row count: every count lies in 0..n


class ExmMechanism(Mechanism):
    """k permute-and-flip draws of a discrete column's value (count as quality), fixed work."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 96.0
    fixed_bytes = 4 * 2**20

    name = "exm"
    measures = ("epsilon",)
    params_schema = ExmParamsSchema
    description = (
        "DIP's EXM competitor: k independent permute-and-flip draws (the exponential"
        " mechanism's privacy, never worse in expected quality) of a value of a discrete"
        " column (quality = count over the declared support), epsilon/k per draw, exact coins"
        " and a fixed amount of work (every value's coin is flipped)."
    )

    def writes_table(self, params: Mapping[str, Any]) -> bool:
        """Its k draws are a table (not records of the dataset: not record-level)."""
        return True

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
        return ExmPlan(col, support, offset, epsilon / draws, draws, meta.n_rows)

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
        return Work(float(meta.n_rows) + float(draws) * support * COIN_UNITS,
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

    def coins(self, plan: ExmPlan, counts: NDArray[np.int64]) -> flip.Coins:
        """Each value's coin: Bernoulli(exp(−γ_a)), γ_a = ε'(q* − q(a))/2 exactly."""
        return flip.Coins.scaled(plan.per_draw / 2, counts.max() - counts, plan.n)

    def flips(self, plan: ExmPlan, counts: NDArray[np.int64], rng: np.random.Generator,
              draws: int) -> flip.Flips:
        """``draws`` i.i.d. permute-and-flip draws and their work (draws·s coins)."""
        return flip.permute_and_flip(rng, self.coins(plan, counts), draws)

    def sample(self, plan: ExmPlan, counts: NDArray[np.int64], rng: np.random.Generator,
               draws: int) -> NDArray[np.int64]:
        """``draws`` i.i.d. permute-and-flip draws (support indices)."""
        return self.flips(plan, counts, rng, draws).chosen

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
            guarantee=(f"pure epsilon-DP (permute-and-flip, epsilon={fmt(epsilon)} nats:"
                       f" {plan.draws} draw(s) at {fmt(plan.per_draw)} each, count quality of"
                       f" sensitivity 1 over the declared support; its work is fixed by the"
                       f" support and draws, its rare exact-arithmetic steps padded to a"
                       f" public count), {PRIVACY_UNIT}"),
            table={DRAW_COLUMN: np.arange(plan.draws, dtype=np.int64),
                   plan.column.name: values},
            per_record=False,  # draws from a DP distribution, not the dataset's records
        )

    @staticmethod
    def _accuracy(plan: ExmPlan) -> dict[str, Any]:
        eps = float(plan.per_draw)
        shortfall = flip.worst_case_gap(plan.per_draw, plan.support, 0.95)
        return {
            "per_draw_epsilon": eps,
            "support": plan.support,
            "count_shortfall_95": shortfall,
            "statement": (
                "Each draw is permute-and-flip over the support: values visited in random"
                " order, value a taken with probability exp(-epsilon' (q* - q(a))/2), q(a) its"
                " count, q* the largest (epsilon' = epsilon/draws). A draw is a only if a's"
                " own coin came up, so P(a) <= exp(-epsilon' (q* - q(a))/2), and with"
                " probability at least 95% a draw's count is within count_shortfall_95 of"
                " the largest count, the exact worst case over all counts (one largest, the"
                " other s - 1 values that far below it), about (2/epsilon') ln 2 below the"
                " union bound (2/epsilon')(ln s + ln 20). The draws are a synthetic sample"
                " from that law, not the data's distribution: for small epsilon' they are"
                " nearly uniform on the support."
            ),
        }
