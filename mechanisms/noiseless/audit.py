"""Audit entries for noiseless privacy: exhaustive output counts on small domains.

Definition 1: a release is ε-noiselessly private iff for every record i and
every value x_{-i} of the others, sweeping x_i over its domain yields at most
2^ε distinct outputs (bits; the ledger charges log2 of the certified count).
The audit runs the *registered* mechanism (``load_params``, ``cost``, ``run``)
on every dataset of a small domain and counts the distinct released results
(the whole result document, so any data-dependent field counts) per slice
{(x_i, x_{-i}) : x_i}:

* integer columns and counts: the domain is finite, so every i, every
  x_{-i} ∈ D^{n−1} and every x_i ∈ D are enumerated (plus out-of-bounds x_i,
  which must clip): the worst count is the mechanism's exact level on D;
* continuous columns: a search — others placed so that the slice image
  [(s + lo)/n, (s + hi)/n] starts or ends on a bin edge (each target sum also
  a float step either side), and x_i swept over the bounds, a grid, the
  preimages of every bin edge (± one float step) and NaN/±inf/out-of-bounds
  values; a lower bound on the level, like any audit;
* local releases: the record map over its domain (Definition 2), and the
  whole released column over slices of a small dataset — it must change only
  in the swept row, which is why a column costs log2 q once.

It also checks what the spec guarantees per record: the released value lies
within the stated ``max_error`` of the exact (clipped) query or record, and a
replay with another generator gives the identical result (deterministic).
``certified`` is log2 of the largest count found (the case with the largest
excess over its charge), ``charged`` that case's charge: passing means
count <= 2^charged exactly, in every case.

Vector releases are audited like aggregates on finite domains, counting the
joint result (all coordinates at once) per slice.

Negative controls: ``PaperAggregate`` sizes its quantizer by the paper's
Theorem 8 as printed, q = ⌊2^ε·R/S⌋ (off by one bin: an interval of length S
meets ⌈qS/R⌉ + 1 bins), and ``ExtraLevelLocal`` quantizes with one more level
than it charges for; both keep the honest charge. ``MaxChargeVector`` charges a
vector the largest coordinate's bits instead of their sum (composition is a
sum: two grids on the same record multiply, not max, their outputs).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms import registry
from mechanisms.audit.entries import AuditReport, AuditSize, entry
from mechanisms.base import Budget, ColumnMeta, DatasetMeta, Mechanism, Output
from mechanisms.noiseless.bits import at_most_power
from mechanisms.noiseless.central import ScalarPlan
from mechanisms.noiseless.certify import paper_levels
from mechanisms.noiseless.local import LocalPlan
from mechanisms.noiseless.mechanism import (
    MEASURE,
    NoiselessAggregate,
    NoiselessLocal,
    NoiselessVector,
    read_bits,
)
from mechanisms.noiseless.quantizer import EdgeQuantizer, UniformQuantizer

#: relative slack (of the query's range) on the stated maximum error: float rounding of
#: the released midpoint and of the stated half-width
ERROR_SLACK = 1e-12


# --------------------------------------------------------------------------- controls


class PaperAggregate(NoiselessAggregate):
    """Broken on purpose: Theorem 8 as printed, q = ⌊2^ε·R/S⌋, charged as the honest plan."""

    def _plan(self, params: Mapping[str, Any], bits: Fraction, meta: DatasetMeta) -> ScalarPlan:
        plan = super()._plan(params, bits, meta)
        query = plan.query
        levels = paper_levels(bits, query.sensitivity, query.span)
        return dataclasses.replace(
            plan, quantizer=UniformQuantizer(query.lower, query.upper, levels))


class ExtraLevelLocal(NoiselessLocal):
    """Broken on purpose: one more uniform level than the certified count it charges."""

    def _plan(self, params: Mapping[str, Any], bits: Fraction, meta: DatasetMeta) -> LocalPlan:
        plan = super()._plan(params, bits, meta)
        lo, hi = plan.record_bounds
        return dataclasses.replace(plan, quantizer=EdgeQuantizer.uniform(lo, hi, plan.count + 1))


class MaxChargeVector(NoiselessVector):
    """Broken on purpose: charges the largest coordinate's bits, not their sum."""

    def cost(self, params: Mapping[str, Any], budget: Budget,
             meta: DatasetMeta) -> dict[str, Fraction]:
        read_bits(budget)
        return {MEASURE: max(p.bits for p in self._plans(params, meta))}


def control(mechanism: str) -> Mechanism:
    """The negative control of a noiseless mechanism."""
    controls: dict[str, Callable[[], Mechanism]] = {
        "noiseless.aggregate": PaperAggregate, "noiseless.local": ExtraLevelLocal,
        "noiseless.vector": MaxChargeVector}
    return controls[mechanism]()


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One audited request on a small domain."""

    label: str
    params: Mapping[str, Any]
    column: ColumnMeta
    n: int
    bits: Fraction
    #: the record domain swept (integer / categorical columns: all of it)
    domain: tuple[float, ...] = ()

    def meta(self, n: int | None = None) -> DatasetMeta:
        return DatasetMeta(self.n if n is None else n, {self.column.name: self.column})

    @property
    def finite(self) -> bool:
        return self.column.type != "continuous"


def _integers(lo: int, hi: int) -> tuple[float, ...]:
    return tuple(float(v) for v in range(lo, hi + 1))


def aggregate_cases(size: AuditSize) -> list[Case]:
    """Every statistic on finite domains (one released exactly), real ranges, given edges."""
    full = size == "full"
    mean_hi, mean_n = (5, 4) if full else (4, 4)
    sum_hi, sum_n = (9, 3) if full else (7, 3)
    order_hi, order_n = (5, 4) if full else (4, 3)
    real = ColumnMeta("r", "continuous", bounds=(-3.7, 12.1))
    small = ColumnMeta("k", "integer", bounds=(0, order_hi))
    order = [
        Case(f"{stat} integer [0, {order_hi}] n={order_n} {label} bits",
             {"statistic": stat, "column": "k"}, small, order_n, bits, _integers(0, order_hi))
        for stat, bits, label in (("median", Fraction(1), "1"), ("min", Fraction(2), "2"),
                                  ("max", Fraction(1585, 1000), "1.585"))
    ]
    return [
        Case(f"mean integer [0, {mean_hi}] n={mean_n} 1 bit", {"statistic": "mean", "column": "k"},
             ColumnMeta("k", "integer", bounds=(0, mean_hi)), mean_n, Fraction(1),
             _integers(0, mean_hi)),
        Case(f"sum integer [0, {sum_hi}] n={sum_n} 2 bits", {"statistic": "sum", "column": "k"},
             ColumnMeta("k", "integer", bounds=(0, sum_hi)), sum_n, Fraction(2),
             _integers(0, sum_hi)),
        Case("count of g in {g0, g1} n=4 1 bit",
             {"statistic": "count", "condition": {"column": "g", "op": "in",
                                                  "value": ["g0", "g1"]}},
             ColumnMeta("g", "categorical", categories=("g0", "g1", "g2")), 4 if not full else 6,
             Fraction(1), (0.0, 1.0, 2.0)),
        Case("mean real [-3.7, 12.1] n=3 2 bits", {"statistic": "mean", "column": "r"},
             real, 3, Fraction(2)),
        Case("sum real [-3.7, 12.1] n=2 5/2 bits", {"statistic": "sum", "column": "r"},
             real, 2, Fraction(5, 2)),
        Case("mean integer [0, 2] n=3 2 bits (exact)", {"statistic": "mean", "column": "k"},
             ColumnMeta("k", "integer", bounds=(0, 2)), 3, Fraction(2), _integers(0, 2)),
        *order,
        Case("median integer [0, 2] n=4 2 bits (exact, half-integers)",
             {"statistic": "median", "column": "k"}, ColumnMeta("k", "integer", bounds=(0, 2)),
             4, Fraction(2), _integers(0, 2)),
        Case("median integer [0, 4] n=4 2 bits (S = R/2)",
             {"statistic": "median", "column": "k"}, ColumnMeta("k", "integer", bounds=(0, 4)),
             4, Fraction(2), _integers(0, 4)),
        Case("mean real [-3.7, 12.1] n=3 edges 2 bits",
             {"statistic": "mean", "column": "r", "edges": [-3.7, -1.0, 2.5, 3.0, 9.0, 12.1]},
             real, 3, Fraction(2)),
    ]


def vector_cases(size: AuditSize) -> list[Case]:
    """Two and three statistics of one integer column, each with its own bits."""
    hi, n = (5, 3) if size == "full" else (4, 3)
    column = ColumnMeta("k", "integer", bounds=(0, hi))
    return [
        Case(f"vector mean+median integer [0, {hi}] n={n} 1+1 bits",
             {"queries": [{"statistic": "mean", "column": "k", "bits": 1},
                          {"statistic": "median", "column": "k", "bits": 1}]},
             column, n, Fraction(2), _integers(0, hi)),
        Case(f"vector min+max+sum integer [0, {hi}] n={n} 1+1+1.585 bits",
             {"queries": [{"statistic": "min", "column": "k", "bits": 1},
                          {"statistic": "max", "column": "k", "bits": 1},
                          {"statistic": "sum", "column": "k", "bits": 1.585}]},
             column, n, Fraction(4), _integers(0, hi)),
    ]


def local_cases(size: AuditSize) -> list[Case]:
    """Uniform, integer, given-edges and non-dyadic local quantizers."""
    n = 4 if size == "full" else 3
    return [
        Case("local real [0, 10] 3 bits", {"column": "x"},
             ColumnMeta("x", "continuous", bounds=(0.0, 10.0)), n, Fraction(3)),
        Case("local integer [0, 20] 2 bits", {"column": "k"},
             ColumnMeta("k", "integer", bounds=(0, 20)), n, Fraction(2), _integers(0, 20)),
        Case("local edges [0, 1, 2.5, 7, 10] 2 bits", {"column": "x", "edges": [0, 1, 2.5, 7, 10]},
             ColumnMeta("x", "continuous", bounds=(0.0, 10.0)), n, Fraction(2)),
        Case("local real [-3.7, 12.1] 5/2 bits", {"column": "r"},
             ColumnMeta("r", "continuous", bounds=(-3.7, 12.1)), n, Fraction(5, 2)),
    ]


# --------------------------------------------------------------------------- running


def _key(out: Output) -> str:
    """The released output as one comparable value (result and table)."""
    table = {k: np.asarray(v).tolist() for k, v in (out.table or {}).items()}
    return json.dumps({"result": out.result, "table": table}, sort_keys=True, allow_nan=True)


@dataclass
class Tally:
    """Worst slice count and the per-record findings of one case."""

    label: str
    charged: Fraction
    worst: int = 1
    slices: int = 0
    #: datasets whose released value is farther from the exact one than stated
    error_violations: int = 0
    #: replays that differ from the first run
    replay_violations: int = 0
    #: local releases where a row other than the swept one changed
    row_violations: int = 0

    @property
    def passed(self) -> bool:
        return (at_most_power(self.worst, self.charged) and self.error_violations == 0
                and self.replay_violations == 0 and self.row_violations == 0)

    @property
    def excess(self) -> float:
        return math.log2(self.worst) - float(self.charged)

    def text(self) -> str:
        return (f"{self.label}: {self.worst} outputs in the worst of {self.slices} slices vs"
                f" 2^{float(self.charged):.4g}; error/replay/row violations"
                f" {self.error_violations}/{self.replay_violations}/{self.row_violations}")


class Runner:
    """Runs one mechanism on one case's datasets exactly as the service does."""

    def __init__(self, mechanism: Mechanism, case: Case, n: int | None = None) -> None:
        self.mechanism = mechanism
        self.case = case
        self.meta = case.meta(n)
        self.params = mechanism.load_params(dict(case.params))
        self.cost = mechanism.cost(self.params, {MEASURE: case.bits}, self.meta)
        self.accuracy = mechanism.accuracy(self.params, self.cost, self.meta)

    @property
    def charged(self) -> Fraction:
        return self.cost[MEASURE]

    def run(self, values: Sequence[float], seed: int = 0) -> Output:
        column = self.case.column
        dtype = np.float64 if column.type == "continuous" else np.int64
        data = {column.name: np.asarray(values, dtype=dtype)}
        return self.mechanism.run(data, self.params, self.cost, self.meta,
                                  np.random.default_rng(seed))


# --------------------------------------------------------------------------- aggregate


def _edges(runner: Runner) -> list[Fraction]:
    """The quantizer's exact edges: given in the params, or from the accuracy statement."""
    if "edges" in runner.params:
        return [Fraction(e) for e in runner.params["edges"]]
    lo, hi = (Fraction(v) for v in runner.accuracy["range"])
    q = int(runner.accuracy["levels"])
    return [lo + (hi - lo) * k / q for k in range(q + 1)]


def _near(x: Fraction) -> list[float]:
    """The float nearest x and its neighbours on either side."""
    v = float(x)
    return [float(np.nextafter(v, -math.inf)), v, float(np.nextafter(v, math.inf))]


def _exact(case: Case, values: Sequence[float], params: Mapping[str, Any] | None = None,
           ) -> Fraction:
    """The query's exact value on clipped records, computed independently of the mechanism."""
    statistic = (case.params if params is None else params)["statistic"]
    if statistic == "count":
        return Fraction(sum(1 for v in values if v in (0.0, 1.0)))
    assert case.column.bounds is not None
    lo, hi = case.column.bounds
    clipped = []
    for v in values:
        v = lo if math.isnan(v) else v
        v = float(np.rint(v)) if case.finite else v
        clipped.append(Fraction(min(max(v, lo), hi)))
    ordered = sorted(clipped)
    if statistic == "min":
        return ordered[0]
    if statistic == "max":
        return ordered[-1]
    if statistic == "median":
        return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    total = sum(clipped, Fraction(0))
    return total / len(values) if statistic == "mean" else total


def aggregate_slices(case: Case, runner: Runner) -> Iterator[tuple[int, list[float], list[float]]]:
    """(i, x_{-i}, the x_i swept) for every slice the audit tries."""
    n = case.n
    if case.finite:
        assert case.column.bounds is not None or case.column.type == "categorical"
        sweep = list(case.domain)
        if case.column.type == "integer":
            sweep += [case.domain[0] - 2, case.domain[-1] + 3]  # must clip
        for i in range(n):
            for others in itertools.product(case.domain, repeat=n - 1):
                yield i, list(others), sweep
        return
    assert case.column.bounds is not None
    lo, hi = (Fraction(b) for b in case.column.bounds)
    edges = _edges(runner)
    scale = n if case.params["statistic"] == "mean" else 1
    targets = [scale * e - end for e in edges for end in (lo, hi)]
    targets += [(n - 1) * (lo + (hi - lo) * k / 8) for k in range(9)]
    grid = [float(lo + (hi - lo) * k / 16) for k in range(17)]
    outside = [float(lo) - 1.0, float(hi) + 1.0, math.nan, math.inf, -math.inf]
    count = 0
    for target in targets:
        if not (n - 1) * lo <= target <= (n - 1) * hi:
            continue
        for v in _near(target / (n - 1)):
            if not float(lo) <= v <= float(hi):
                continue
            s = (n - 1) * Fraction(v)  # the others' exact sum, as the mechanism computes it
            preimages = [x for e in edges for x in _near(scale * e - s)
                         if float(lo) <= x <= float(hi)]
            yield count % n, [v] * (n - 1), grid + preimages + outside
            count += 1


def audit_aggregate_with(mechanism: Mechanism, case: Case) -> Tally:
    """Worst slice count of ``mechanism`` on ``case``, and the per-record checks."""
    runner = Runner(mechanism, case)
    tally = Tally(case.label, runner.charged)
    assert case.column.bounds is not None or case.column.type == "categorical"
    span = Fraction(runner.accuracy["range"][1]) - Fraction(runner.accuracy["range"][0])
    allowed = Fraction(runner.accuracy["max_error"]) + ERROR_SLACK * span
    for i, others, sweep in aggregate_slices(case, runner):
        outputs = set()
        for k, x in enumerate(sweep):
            values = [*others[:i], x, *others[i:]]
            out = runner.run(values)
            outputs.add(_key(out))
            if abs(Fraction(out.result["value"]) - _exact(case, values)) > allowed:
                tally.error_violations += 1
            if k == 0 and _key(runner.run(values, seed=1)) != _key(out):
                tally.replay_violations += 1
        tally.slices += 1
        tally.worst = max(tally.worst, len(outputs))
    return tally


# --------------------------------------------------------------------------- vector


def audit_vector_with(mechanism: Mechanism, case: Case) -> Tally:
    """Worst joint count over every slice of a finite domain, and each coordinate's error."""
    runner = Runner(mechanism, case)
    tally = Tally(case.label, runner.charged)
    items = runner.params["queries"]
    slack = [ERROR_SLACK * (Fraction(a["range"][1]) - Fraction(a["range"][0]))
             for a in runner.accuracy["coordinates"]]
    for i, others, sweep in aggregate_slices(case, runner):
        outputs = set()
        for k, x in enumerate(sweep):
            values = [*others[:i], x, *others[i:]]
            out = runner.run(values)
            outputs.add(_key(out))
            for item, got, allowed, extra in zip(items, out.result["values"],
                                                 out.accuracy["max_error"], slack, strict=True):
                if abs(Fraction(got) - _exact(case, values, item)) > Fraction(allowed) + extra:
                    tally.error_violations += 1
            if k == 0 and _key(runner.run(values, seed=1)) != _key(out):
                tally.replay_violations += 1
        tally.slices += 1
        tally.worst = max(tally.worst, len(outputs))
    return tally


# --------------------------------------------------------------------------- local


def local_domain(case: Case, runner: Runner) -> list[float]:
    """Record values swept: the whole integer domain, or the bin edges ± a float step."""
    assert case.column.bounds is not None
    lo, hi = case.column.bounds
    if case.finite:
        return [*case.domain, lo - 2, hi + 3]
    # the quantizer is public: the result lists its float edges (the bins are exactly those)
    quantizer = runner.run([lo] * case.n).result["quantizer"]
    near = [x for e in quantizer["edges"] for x in _near(Fraction(e))]
    grid = [lo + (hi - lo) * k / 32 for k in range(33)]
    outside = [lo - 1.0, hi + 1.0, math.nan, math.inf, -math.inf]
    return sorted({*near, *grid}) + outside


def _clipped(case: Case, values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Records as the spec clips them: NaN as the lower bound, integers rounded."""
    assert case.column.bounds is not None
    lo, hi = case.column.bounds
    out = np.where(np.isnan(values), lo, values)
    if case.finite:
        out = np.rint(out)
    return np.clip(out, lo, hi)


def audit_local_with(mechanism: Mechanism, case: Case, seed: int) -> Tally:
    """The record map over its domain, then whole-column slices of a small dataset."""
    domain = local_domain(case, Runner(mechanism, case))
    everything = Runner(mechanism, case, n=len(domain))
    tally = Tally(case.label, everything.charged)
    out = everything.run(domain)
    assert out.table is not None
    released = np.asarray(out.table[case.column.name], dtype=np.float64)
    image = {float(v) for v in released}
    tally.worst = len(image)
    tally.slices = 1
    values = np.asarray(domain, dtype=np.float64)
    errors = np.abs(released - _clipped(case, values))
    tally.error_violations = int(np.count_nonzero(errors > everything.accuracy["max_error"]))
    if _key(everything.run(domain, seed=1)) != _key(out):
        tally.replay_violations += 1
    record = dict(zip(values.tolist(), released.tolist(), strict=True))
    small = Runner(mechanism, case)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        background = rng.choice(values[np.isfinite(values)], size=case.n).tolist()
        for i in range(case.n):
            outputs = set()
            for x in domain:
                column = [*background[:i], x, *background[i + 1:]]
                run = small.run(column)
                assert run.table is not None
                got = np.asarray(run.table[case.column.name], dtype=np.float64)
                others = [j for j in range(case.n) if j != i]
                if any(got[j] != record[column[j]] for j in others):
                    tally.row_violations += 1
                outputs.add(_key(run))
            tally.slices += 1
            tally.worst = max(tally.worst, len(outputs))
    return tally


# --------------------------------------------------------------------------- entries


def _report(mechanism: str, honest: Sequence[Tally], broken: Sequence[Tally]) -> AuditReport:
    top = max(honest, key=lambda t: t.excess)
    worst_control = max(broken, key=lambda t: t.excess)
    return AuditReport(
        mechanism=mechanism, notion="noiseless", events_tried=sum(t.slices for t in honest),
        certified=math.log2(top.worst), charged=float(top.charged),
        passed=all(t.passed for t in honest), control_caught=not all(t.passed for t in broken),
        detail=(f"worst: {top.text()}; control: {worst_control.text()}"))


def _cases(mechanism: str, size: AuditSize) -> list[Case]:
    return {"noiseless.aggregate": aggregate_cases, "noiseless.local": local_cases,
            "noiseless.vector": vector_cases}[mechanism](size)


def audit_with(mechanism: Mechanism, cases: Iterable[Case], seed: int) -> list[Tally]:
    """Every case of a noiseless mechanism (the registered one or a control)."""
    if isinstance(mechanism, NoiselessLocal):
        return [audit_local_with(mechanism, c, seed) for c in cases]
    if isinstance(mechanism, NoiselessVector):
        return [audit_vector_with(mechanism, c) for c in cases]
    return [audit_aggregate_with(mechanism, c) for c in cases]


@entry("noiseless.aggregate", "noiseless.local", "noiseless.vector")
def audit_noiseless(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    """Exhaustive distinct-output counts of the registered mechanism and its control."""
    chosen = _cases(mechanism, size)
    honest = audit_with(registry.get(mechanism), chosen, seed)
    broken = audit_with(control(mechanism), chosen, seed)
    return _report(mechanism, honest, broken)
