"""Empirical coverage of a mechanism's stated intervals, by seeded simulation.

A case runs one registered mechanism through its public entry points (``load_params``,
``cost``, ``run``) many times on a synthetic dataset whose truth is known, reads every
release the way the service and the client do (``privrelease_client.reading``: one
interval per released number, at the stated level; ``mechanisms.target.stated``: the
level the statement gives), and counts how often the truth lies inside.

The tolerance is the Monte Carlo error, never a fudge: with ``R`` runs a statement of
level ``p`` fails when its hits are in the lower ``ALPHA`` tail of Binomial(R, p), with a
Bonferroni split over the checks of one case (each cell, and the joint claim). A
deterministic bound (level 1) must hold on every run. ``width ratio``: the stated
half-width over the tightest valid one, the ``p``-quantile of |error|/half-width (for a
joint claim, of the largest over the cells): 1 is as tight as the truth allows, above 1
conservative, below 1 a statement that does not hold. A stated ``rmse`` is held against
the runs' mean squared error per released number (``rms_check``).

This module knows no mechanism: the cases (``tests.coverage.cases``) say what to run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from privrelease_client.reading import Reading, read_release
from scipy import stats

import mechanisms
from mechanisms import target
from mechanisms.base import DatasetMeta, Output

#: a case fails when its hits are this unlikely under the stated level (Bonferroni-split)
ALPHA = 1e-3
#: float slack of an inclusive end point (a deterministic bound's midpoint ± half a bin is
#: computed in float64); far below any stated width
ROUNDING = 1e-9

Columns = dict[str, NDArray[Any]]
#: the truth of every released number of a reading, from the dataset it was run on
Truth = Callable[[Columns, Reading], NDArray[np.float64]]
#: where the truth comes from: ``exact``, the statistic of the dataset a run read (the
#: case's ``truth``: of the data, or of the population when the statement is about one);
#: ``others_mean``, the mean of the other runs on the same dataset (an unbiased release of
#: a smoother whose exact value only the mechanism computes)
TruthKind = Literal["exact", "others_mean"]
Size = Literal["ci", "full"]
#: a statement checked on the run's output itself (see ``Case.check``)
Check = Callable[[Columns, Output], tuple[NDArray[np.float64], float]]


@dataclass(frozen=True)
class Case:
    """One configuration of one mechanism, with its dataset and its truth."""

    label: str
    mechanism: str
    params: Mapping[str, Any]
    budget: Mapping[str, Fraction]
    meta: DatasetMeta
    #: the synthetic dataset drawn from a generator
    data: Callable[[np.random.Generator], Columns]
    truth: Truth
    truth_kind: TruthKind = "exact"
    #: a fresh dataset for every run (a statement about a population, or a deterministic
    #: bound tried on many datasets); else one dataset for all runs
    fresh: bool = False
    #: runs at each size
    runs: tuple[int, int] = (400, 5000)
    #: negative controls only: every stated interval scaled by this before it is checked
    shrink: float = 1.0
    #: a statement the client's reading does not draw (records, draws, ranks): the run's
    #: scaled errors (<= 1: held) and the stated level; None: read the release
    check: Check | None = None


@dataclass(frozen=True)
class Outcome:
    """What the runs of one case found (a row of the coverage table)."""

    label: str
    mechanism: str
    #: "per cell", "simultaneous" or "always" (a deterministic bound)
    claim: str
    level: float
    cells: int
    runs: int
    #: the least per-cell coverage, and the share of runs where every cell held
    worst_cell: float
    joint: float
    #: the joint level the statement claims (simultaneous, or all_entries_at_least), if any
    joint_level: float | None
    #: the fewest hits per cell (of ``runs``) the Monte Carlo error allows at the level
    floor: int
    #: stated over tightest valid half-width: pooled over the cells (the joint one for a
    #: simultaneous claim), and of the cell whose statement is the most optimistic
    width_ratio: float
    narrowest_ratio: float
    passed: bool
    failures: tuple[str, ...] = field(default=())
    #: stated ``rmse`` over the empirical root mean square error (None: none stated)
    rms_ratio: float | None = None


def _release(case: Case, loaded: Mapping[str, Any], cost: Mapping[str, Fraction],
             data: Columns, rng: np.random.Generator) -> tuple[Output, Mapping[str, Any]]:
    """One run through the public entry point, and its release document."""
    out = mechanisms.get(case.mechanism).run(data, loaded, cost, case.meta, rng)
    doc = {"mechanism": case.mechanism, "params": dict(case.params), "result": out.result,
           "accuracy": out.accuracy, "cost": {k: float(v) for k, v in cost.items()}}
    return out, doc


def _array(values: list[float | None]) -> NDArray[np.float64]:
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def scaled_errors(truth: NDArray[np.float64], estimate: NDArray[np.float64],
                  lower: NDArray[np.float64], upper: NDArray[np.float64]
                  ) -> NDArray[np.float64]:
    """|error| over the half-width on the truth's side of the estimate: <= 1 inside the
    interval (an asymmetric one too)."""
    above = truth >= estimate
    side = np.where(above, upper - estimate, estimate - lower)
    gap = np.abs(truth - estimate) - ROUNDING * (1.0 + np.abs(truth))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(gap <= 0, 0.0, gap / side)
    return np.asarray(out, dtype=np.float64)


def hits_floor(runs: int, level: float, alpha: float) -> int:
    """The fewest hits in ``runs`` that a level-``level`` statement allows at ``alpha``:
    the smallest k with P(Binomial(runs, level) <= k) >= alpha (fewer hits refute the
    level at ``alpha``). A level of 1 allows no miss."""
    if level >= 1.0:
        return runs
    return int(stats.binom.ppf(alpha, runs, level))


def _joint_claim(accuracy: Mapping[str, Any], level: float) -> tuple[str, float | None]:
    confidence = accuracy.get("confidence")
    if isinstance(confidence, Mapping):
        if confidence.get("simultaneous"):
            return "simultaneous", level
        joint = confidence.get("all_entries_at_least")
        if isinstance(joint, int | float) and not isinstance(joint, bool):
            return "per cell", float(joint)
    return ("always" if level >= 1.0 else "per cell"), None


@dataclass
class _Runs:
    """What the runs of a case collect: per run, the estimates and intervals the reading
    draws with their truths, or the scaled errors a ``check`` gives."""

    level: float = math.nan
    claim: str = ""
    joint_level: float | None = None
    estimates: list[NDArray[np.float64]] = field(default_factory=list)
    bounds: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = field(default_factory=list)
    truths: list[NDArray[np.float64]] = field(default_factory=list)
    scaled: list[NDArray[np.float64]] = field(default_factory=list)
    #: the statement's root mean square error per released number (``accuracy.rmse``)
    rmse: float | None = None

    def stated(self, label: str, level: float, claim: str, joint: float | None) -> None:
        """The level of one run: the same on every run."""
        if math.isnan(self.level):
            self.level, self.claim, self.joint_level = level, claim, joint
        elif (level, claim, joint) != (self.level, self.claim, self.joint_level):
            raise AssertionError(f"{label}: the stated level changed between runs")


def _read(case: Case, runs: _Runs, data: Columns, doc: Mapping[str, Any]) -> None:
    """A release read as the client reads it (``read_release``), at the level that
    ``target.stated`` reads too."""
    reading = read_release(doc)
    if reading is None or reading.level is None:
        raise AssertionError(f"{case.label}: the release states no interval at a level")
    accuracy = doc["accuracy"]
    said = target.stated(case.mechanism, accuracy)
    if said is not None and said.level != reading.level:
        raise AssertionError(f"{case.label}: target reads level {said.level},"
                             f" the client {reading.level}")
    runs.stated(case.label, reading.level, *_joint_claim(accuracy, reading.level))
    rmse = accuracy.get("rmse")
    runs.rmse = float(rmse) if isinstance(rmse, int | float) else None
    est = _array(reading.estimates)
    lo, hi = _array(reading.lower), _array(reading.upper)
    runs.estimates.append(est)
    runs.bounds.append((est - case.shrink * (est - lo), est + case.shrink * (hi - est)))
    if case.truth_kind == "exact":
        runs.truths.append(case.truth(data, reading))


def run_case(case: Case, size: Size, seed: int = 0) -> Outcome:
    """Run ``case`` ``case.runs`` times (at ``size``) from ``seed`` and check its claims."""
    count = case.runs[0] if size == "ci" else case.runs[1]
    mech = mechanisms.get(case.mechanism)
    loaded = mech.load_params(dict(case.params))
    cost = mech.cost(loaded, case.budget, case.meta)
    fixed = case.data(np.random.default_rng([seed, 0]))
    runs = _Runs()
    for r in range(count):
        data = case.data(np.random.default_rng([seed, 1, r])) if case.fresh else fixed
        out, doc = _release(case, loaded, cost, data, np.random.default_rng([seed, 2, r]))
        if case.check is None:
            _read(case, runs, data, doc)
            continue
        scaled, level = case.check(data, out)
        runs.stated(case.label, level, "always" if level >= 1.0 else "per cell", None)
        runs.scaled.append(scaled / case.shrink)
    if case.check is None:
        if case.truth_kind == "others_mean":  # leave-one-out: independent of each run
            total = np.vstack(runs.estimates).sum(axis=0)
            runs.truths = [(total - e) / (count - 1) for e in runs.estimates]
        runs.scaled = [scaled_errors(t, e, lo, hi) for t, e, (lo, hi)
                       in zip(runs.truths, runs.estimates, runs.bounds, strict=True)]
    outcome = _outcome(case, runs, np.vstack(runs.scaled))
    if runs.rmse is None:
        return outcome
    squares = np.nanmean((np.vstack(runs.estimates) - np.vstack(runs.truths)) ** 2, axis=1)
    return rms_check(outcome, runs.rmse, squares)


def rms_check(outcome: Outcome, rmse: float, squares: NDArray[np.float64]) -> Outcome:
    """``accuracy.rmse`` against the runs' mean squared error per released number: it
    fails when even the lower (1 - ALPHA) normal bound on that mean exceeds rmse²."""
    mean = float(squares.mean())
    lower = mean - float(stats.norm.ppf(1 - ALPHA)) * float(squares.std(ddof=1)) \
        / math.sqrt(squares.size)
    failures = outcome.failures
    if lower > rmse**2:
        failures += (f"rmse: stated {rmse:.4g}, empirical {math.sqrt(mean):.4g}"
                     f" (lower bound {math.sqrt(lower):.4g})",)
    return dataclasses.replace(outcome, rms_ratio=_ratio(math.sqrt(mean) / rmse),
                               passed=not failures, failures=failures)


def _outcome(case: Case, runs: _Runs, scaled: NDArray[np.float64]) -> Outcome:
    """The checks on ``scaled`` (runs x cells; NaN: no interval or truth in that run)."""
    count, cells = scaled.shape
    level, joint_level = runs.level, runs.joint_level
    held = ~np.isnan(scaled)
    if not held.any(axis=0).all():
        raise AssertionError(f"{case.label}: a cell has no interval or truth on any run")
    inside = held & (scaled <= 1.0)
    checks = cells + (joint_level is not None)
    floor = hits_floor(count, level, ALPHA / checks)
    failures: list[str] = []
    per_cell = inside.sum(axis=0)
    counted = held.sum(axis=0)
    for j in range(cells):
        need = hits_floor(int(counted[j]), level, ALPHA / checks)
        if per_cell[j] < need:
            failures.append(f"cell {j}: {per_cell[j]}/{counted[j]} inside, need {need}")
    all_in = (inside | ~held).all(axis=1)  # a cell with no interval in a run states nothing
    if joint_level is not None:
        need = hits_floor(count, joint_level, ALPHA / checks)
        if all_in.sum() < need:
            failures.append(f"joint: {all_in.sum()}/{count} all inside, need {need}")
    if runs.claim == "simultaneous":
        tightest = float(np.quantile(np.where(held, scaled, 0.0).max(axis=1), level))
    else:
        tightest = float(np.quantile(scaled[held], level))
    cell_tightest = max(float(np.quantile(scaled[held[:, j], j], level))
                        for j in range(cells))
    return Outcome(case.label, case.mechanism, runs.claim, level, cells, count,
                   float((per_cell / counted).min()), float(all_in.mean()), joint_level,
                   floor, _ratio(tightest), _ratio(cell_tightest), not failures,
                   tuple(failures[:5]))


def _ratio(tightest: float) -> float:
    return math.inf if tightest == 0 else 1.0 / tightest


HEADER = ("| case | mechanism | claim | stated level | cells | runs | worst cell (least"
          " allowed) | joint"
          " (claimed) | width vs tightest: pooled, narrowest cell | rmse vs empirical"
          " | passed |\n|---|---|---|---|---|---|---|---|---|---|---|")


def row(outcome: Outcome) -> str:
    """One markdown row of the coverage table."""
    joint = f"{outcome.joint:.4f}"
    if outcome.joint_level is not None:
        joint += f" (≥ {outcome.joint_level:.4g})"
    ratio = ", ".join("∞" if math.isinf(r) else f"{r:.3g}"
                      for r in (outcome.width_ratio, outcome.narrowest_ratio))
    return (f"| `{outcome.label}` | `{outcome.mechanism}` | {outcome.claim} |"
            f" {outcome.level:.4g} | {outcome.cells} | {outcome.runs} |"
            f" {outcome.worst_cell:.4f} (≥ {outcome.floor / outcome.runs:.4f}) | {joint} |"
            f" {ratio} |"
            f" {'' if outcome.rms_ratio is None else f'{outcome.rms_ratio:.3g}'} |"
            f" {'yes' if outcome.passed else '**NO**'} |")
