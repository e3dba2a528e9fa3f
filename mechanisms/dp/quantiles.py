"""Quantiles of a bounded column: permute-and-flip over a public grid, sampled exactly.

Candidates are ``grid_size`` evenly spaced points of the declared [lo, hi]
(public). The utility of candidate c for quantile q is
u(c) = −|#{x <= c} − q·n|: replacing one record changes #{x <= c} by at most
1 and n is public, so the sensitivity is 1. The ranks are counted per batch of rows
(``RankStatistic``: counts of disjoint rows add), so any engine computes them in bounded
memory.

Permute-and-flip (McKenna & Sheldon 2020) visits the candidates in a uniformly
random order and releases the first one whose coin Bernoulli(exp(ε(u(c) − u*)/2))
comes up heads (u* the best utility, whose coin always does): ε-DP, and never
worse than the exponential mechanism. The coins are EXACT: ε and q·n are
rationals, so γ = ε(u* − u(c))/2 is a Fraction and the coin compares V with
exp(−γ) for V uniform, refining V's bits until the comparison is decided
(``mechanisms.flip``, ``sampling.exact_accept``); no float exponential of a
utility decides the output. Every candidate's coin is flipped, not only those up
to the first head, so the work (m coins per quantile) does not depend on the
data: stopping early made the run time a function of the ranks (issue #27).

Several quantiles split ε evenly (basic composition: k quantiles at ε/k).

Accuracy, from public inputs: each quantile's rank error |#{x <= c} − q·n| exceeds the
best grid point's by at most T with probability >= 95 %, T the exact worst case over all
data (``flip.worst_case_gap``). A candidate whose utility is more than T below the best has
coin p <= exp(−εT/2); the chance permute-and-flip releases one is largest when the best
candidate is unique and every other one sits at exactly that gap (raising a bad coin, or
lowering a good one, only helps the bad), and then, the best's position B uniform among
the m and each candidate ahead of it a tail with probability 1 − p,
P(bad) = 1 − E[(1 − p)^B] = 1 − (1 − (1 − p)^m) / (m p). T solves P(bad) = 5 %; such data
exist (ranks jumping by T at the best grid point, ``tests/unit/dp/test_quantiles.py``
releases at it), so no statement from public inputs can be narrower. The union bound
(2/ε)(ln m + ln 20) used before is about (2/ε)·ln 2 wider: permute-and-flip meets the
best candidate halfway through the order on average.

No interval in the column's units from the point alone: data all at lo and data all at
hi give every candidate the same utility for the median (#{x <= c} is n, resp. 0, at
every c below hi), so both release a uniform grid point, and their medians are lo and
hi: an interval read off the point that covers the median with 95 % on both is nearly
[lo, hi]. ``interval: true`` releases one instead, at a third of each quantile's ε for
the point and a third for each end (``UnitsInterval``): x_q, the ⌈q·n⌉-th smallest
clipped value, lies in [L, U] with probability >= 95 % whatever the data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms import flip
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.columns import clean, declared_bounds
from mechanisms.statistics import Batch, Partial, Statistic, check_rows, whole

DEFAULT_GRID_SIZE = 1001
#: work units (``base.Work``: ~a CPU-minute per 10^9) of one permute-and-flip coin (~5 µs)
COIN_UNITS = 100
_LN_2_63 = 63 * math.log(2.0)


@dataclass(frozen=True)
class Gaps:
    """Utility gaps u* − u(c) = numerators[c] / denominator (>= 0; 0 for the best)."""

    numerators: list[int]
    denominator: int

    @staticmethod
    def of(gaps: list[Fraction]) -> Gaps:
        d = math.lcm(*(g.denominator for g in gaps))
        return Gaps([int(g * d) for g in gaps], d)


#: the level of the stated rank error
RANK_LEVEL = 0.95


def cell_gaps(ranks: NDArray[np.int64], target: Fraction) -> Gaps:
    """The utility gaps of the grid's CELLS for rank ``target``: cell j is (c_{j−1}, c_j]
    (cell 0 is (−∞, lo]), and its loss the distance from ``target`` to [F(c_{j−1}), F(c_j)]
    (F(c_{−1}) = 0), F(c) = #{x <= c}. Replacing one record moves each F by at most 1, so
    each loss by at most 1 (sensitivity 1); the cells' ranges tile [0, n], so a target
    in [0, n] has a cell at loss 0."""
    a, b = target.numerator, target.denominator
    high = [int(r) * b for r in ranks]
    low = [0, *high[:-1]]
    loss = [max(lo - a, a - hi, 0) for lo, hi in zip(low, high, strict=True)]
    best = min(loss)
    return Gaps([v - best for v in loss], b)


@dataclass(frozen=True)
class UnitsInterval:
    """[L, U] around x_q = x_(k), k = max(1, ⌈q·n⌉), from two permute-and-flip draws over
    the grid's cells (``cell_gaps``) at ranks q·n ∓ D, D just above ``flip.worst_case_gap``
    at level 1 − α/2 (α = 5 %): L is the left edge of the lower draw's cell (lo for cell 0
    or when q·n − D <= 0), U the right edge of the upper draw's (hi when q·n + D >= n).
    L fails (x_(k) <= L) only if F(L) >= k, and then the lower cell's gap is at least
    F(L) − (q·n − D) >= k − q·n + D >= D; U fails (x_(k) > U) only if F(U) <= k − 1, and
    then the upper cell's gap is at least q·n + D − k + 1 >= D. Each has probability
    <= α/2 (worst case over all data), so [L, U] holds x_q with >= 95 % (union bound)."""

    margin: float  # D, in ranks

    def draw(self, plan: QuantilePlan, rng: np.random.Generator, ranks: NDArray[np.int64],
             q: float) -> list[float]:
        """Both ends for level ``q`` (two draws always made: the work is public)."""
        centre = Fraction(q) * plan.n
        d = Fraction(self.margin)
        lower = plan.choose(rng, cell_gaps(ranks, min(max(centre - d, Fraction(0)),
                                                      Fraction(plan.n))))
        upper = plan.choose(rng, cell_gaps(ranks, min(max(centre + d, Fraction(0)),
                                                      Fraction(plan.n))))
        lo, hi = float(plan.bounds[0]), float(plan.bounds[1])
        left = lo if centre - d <= 0 or lower == 0 else plan.grid[lower - 1]
        right = hi if centre + d >= plan.n else plan.grid[upper]
        return sorted([left, right])


@dataclass(frozen=True)
class QuantilePlan:
    column: ColumnMeta
    n: int
    bounds: tuple[Fraction, Fraction]
    quantiles: tuple[float, ...]
    grid: tuple[float, ...]
    epsilon: Fraction  # per draw: per quantile, or a third of it with ``interval``
    interval: bool = False

    @property
    def units_interval(self) -> UnitsInterval:
        """Its ends' margin D (``UnitsInterval``), at α/2 = 2.5 % each."""
        gap = flip.worst_case_gap(self.epsilon, len(self.grid), 1.0 - (1.0 - RANK_LEVEL) / 2)
        return UnitsInterval(math.nextafter(gap * (1.0 + 1e-12) + 1e-9, math.inf))

    @property
    def rank_error(self) -> float:
        """The 95 % rank-error bound beyond the best candidate's (see the module doc)."""
        return flip.worst_case_gap(self.epsilon, len(self.grid), RANK_LEVEL)

    def first_pass(self) -> RankStatistic:
        return RankStatistic(self)

    def ranks_from(self, partial: Partial) -> NDArray[np.int64]:
        """#{x <= c} for each candidate c from the merged partial."""
        check_rows(partial, self.n, self.column.name)
        return partial.vector("ranks")

    def ranks(self, data: Mapping[str, np.ndarray]) -> NDArray[np.int64]:
        """#{x <= c} for each candidate c (missing values count as lo, as everywhere)."""
        return self.ranks_from(whole(self.first_pass(), data))

    def gaps(self, ranks: NDArray[np.int64], q: float) -> Gaps:
        """u* − u(c) per candidate, exact: integers over a common denominator."""
        target = Fraction(q) * self.n
        a, b = target.numerator, target.denominator
        loss = [abs(int(r) * b - a) for r in ranks]
        best = min(loss)
        return Gaps([v - best for v in loss], b)

    def choose(self, rng: np.random.Generator, gaps: Gaps | list[Fraction]) -> int:
        """Permute-and-flip with exact coins, every candidate's coin flipped (fixed work:
        ``mechanisms.flip``): the index of the released candidate."""
        if not isinstance(gaps, Gaps):
            gaps = Gaps.of(gaps)
        return int(flip.permute_and_flip(rng, self.coins(gaps), 1).chosen[0])

    def coins(self, gaps: Gaps) -> flip.Coins:
        """Candidate c's coin: Bernoulli(exp(−ε(u* − u(c))/2)), γ exact."""
        # gaps from ``gaps`` are |r·b − a| − best <= n·b (ranks 0 <= r <= n, q·n = a/b <= n),
        # so the bound, and the coins' code path, is public; other callers' gaps may exceed it
        bound = max(self.n * gaps.denominator, max(gaps.numerators))
        return flip.Coins.scaled(self.epsilon / (2 * gaps.denominator), gaps.numerators, bound)

    def run(self, data: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, Any]:
        return self.release_from(whole(self.first_pass(), data), rng)

    def release_from(self, partial: Partial, rng: np.random.Generator) -> dict[str, Any]:
        ranks = self.ranks_from(partial)
        chosen = [self.grid[self.choose(rng, self.gaps(ranks, q))] for q in self.quantiles]
        out: dict[str, Any] = {"values": chosen, "quantiles": list(self.quantiles),
                               "grid_size": len(self.grid)}
        if self.interval:
            ends = self.units_interval
            out["intervals"] = [ends.draw(self, rng, ranks, q) for q in self.quantiles]
            out["interval_level"] = RANK_LEVEL
        return out

    def accuracy(self) -> dict[str, Any]:
        k, m = len(self.quantiles), len(self.grid)
        step = (float(self.bounds[1]) - float(self.bounds[0])) / (m - 1)
        share = f"epsilon/{3 * k}" if self.interval else f"epsilon/{k}"
        statement = (
            f"Each of the {k} quantile(s) is chosen by permute-and-flip ({share} each) among"
            f" {m} public candidates {step:.6g} apart; with probability at least 95% the"
            f" number of (clipped) records at or below it differs from q*n by at most"
            f" {self.rank_error:.6g} more than the best candidate's does."
        )
        out: dict[str, Any] = {
            "noise": "permute_and_flip", "sensitivity": 1.0, "candidates": m,
            "candidate_step": step, "epsilon_per_quantile": float(self.epsilon),
            "ci95_rank_error": self.rank_error, "statement": statement}
        if self.interval:
            margin = self.units_interval.margin
            out["interval_rank_margin"] = margin
            out["statement"] += (
                f" result.intervals: each quantile's [L, U] in the column's units, two more"
                f" permute-and-flip draws ({share} each) over the grid's cells at ranks"
                f" q*n -/+ {margin:.6g}; it contains the ceil(q*n)-th smallest clipped value"
                f" with probability at least 95% (each end fails with at most 2.5%), per"
                f" quantile.")
        return out


@dataclass(frozen=True)
class RankStatistic(Statistic):
    """Rank counts over the public candidates: part ``ranks`` holds #{v <= c} for each
    candidate c over the rows seen (v the clipped values), counted in each sorted chunk as
    the whole-column pass counted in the sorted column; counts of disjoint rows add."""

    plan: QuantilePlan

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.plan.column.name,)

    def sizes(self) -> Mapping[str, int]:
        return {"ranks": len(self.plan.grid)}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64]]:
        lo, hi = self.plan.bounds
        values = np.sort(clean(chunk[self.plan.column.name], float(lo), float(hi)))
        return {"ranks": np.searchsorted(values, np.asarray(self.plan.grid), side="right")
                .astype(np.int64)}


def plan(mechanism: str, params: Mapping[str, Any], amounts: Mapping[str, Fraction],
         meta: DatasetMeta) -> QuantilePlan:
    if mechanism != "laplace":
        raise MechanismInputError(
            "params.statistic",
            "quantile is released by the exponential mechanism (pure epsilon-DP): use laplace")
    column = meta.column(params["column"])
    lo, hi = declared_bounds(column, "quantile")
    if meta.n_rows < 1:
        raise MechanismInputError("params.statistic", "quantile of an empty dataset")
    m = params.get("grid_size", DEFAULT_GRID_SIZE)
    grid = tuple(float(c) for c in np.linspace(float(lo), float(hi), m))
    if len(set(grid)) != m:
        raise MechanismInputError("params.grid_size", "grid_size exceeds the declared range's"
                                  " distinct float values")
    quantiles = tuple(float(q) for q in params["quantiles"])
    interval = bool(params.get("interval", False))
    draws = len(quantiles) * (3 if interval else 1)
    return QuantilePlan(column, meta.n_rows, (lo, hi), quantiles, grid,
                        amounts["epsilon"] / draws, interval)
