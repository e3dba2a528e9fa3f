"""Empirical privacy audit of every ε-DP mechanism (and the Gaussian at its δ).

For each case: neighbours D, D' (one record replaced, chosen so that the
audit has power), many independent runs on each, and ``mechanisms.audit``:
an event chosen on the first half of the runs, certified on the second half
by Clopper–Pearson bounds, giving a lower bound on the mechanism's ε that
holds with probability 1 − 1e-3. It must not exceed the ε the ledger charged
(for ``gaussian``: the ε certified at the mechanism's own δ, from events with
P[M(D) ∈ E] >= e^ε P[M(D') ∈ E] + δ). It must also reach a stated floor, so
that a broken audit cannot pass by certifying nothing. Every case has a
negative control: the same mechanism subclassed to claim (and cost) ε while
calibrating its noise for ``factor``·ε; the audit must refute its claim, which
shows it has the power to catch such a bug.

Runs are drawn with the library functions the mechanisms' ``run`` calls,
vectorised over runs (``test_audit_sampler_is_the_run_path`` checks that
one vectorised draw is exactly what ``run`` releases for the same seed).
Test statistics (the scalar the events are intervals of):

* baselines: the released value (one number; its likelihood ratio is
  monotone, so half-lines are the most powerful events);
* ``dip``: the released value of the differing record (row 0). With the
  default ``dp`` reference every run is a full run of the mechanism; with a
  public (parametric) reference DIP is ε-local-DP per record (``chain``), so
  one run on n identical records gives n independent draws of a record's
  release (``test_dip_certified_bound_is_below_the_exact_loss_of_its_event``
  compares the certified bound with the exact loss of the chosen event from
  ``mechanisms.dip.audit``);
* ``iclp.*``: the privacy-loss statistic of the claimed noise on the released
  coefficients, Σ_j (|y_j − b_j| − |y_j − a_j|)/s_j for the two datasets'
  lattice centres a, b (``CoefficientNoise.privacy_loss``): the Neyman–Pearson
  statistic, whose level sets are the most powerful events. Its power is
  limited by the ℓ1 Laplace noise itself: the loss reaches ε only when every
  coefficient's noise lies beyond its shift, so a many-coefficient release is
  far from tight for events of sampleable probability; a one-coefficient
  configuration (``max_components: 1``) is audited too, where it is tight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import mechanisms
from mechanisms import ColumnMeta, DatasetMeta, baselines
from mechanisms.audit import AuditResult, audit
from mechanisms.base import Budget, Mechanism
from mechanisms.dip.audit import transition_matrix_discrete
from mechanisms.dip.mechanism import DipMechanism, Plan
from mechanisms.dip.noise import NoiseStep
from mechanisms.iclp.entries import IclpKde, IclpMean
from mechanisms.iclp.mean import qr_worst_case

#: runs per dataset and variant (half select the event, half certify it)
RUNS = 40_000
EPSILON = Fraction(1)


# --------------------------------------------------------------------------- negative controls


def _overspent(budget: Budget, factor: int) -> dict[str, Fraction]:
    return {k: v * factor if k == "epsilon" else v for k, v in budget.items()}


def overspending(cls: type[Mechanism], factor: int) -> Mechanism:
    """``cls`` with its noise calibrated for factor·ε while it claims (and costs) ε."""
    if issubclass(cls, baselines._Baseline):

        class Baseline(cls):  # type: ignore[valid-type,misc]
            def _plan(self, params: Any, amounts: Any, meta: DatasetMeta) -> Any:
                return super()._plan(params, _overspent(amounts, factor), meta)

        return Baseline()
    if issubclass(cls, DipMechanism):

        class Dip(DipMechanism):
            def plan(self, params: Mapping[str, Any], budget: Budget,
                     meta: DatasetMeta) -> Plan:
                plan = super().plan(params, _overspent(budget, factor), meta)
                plan.epsilon = Fraction(budget["epsilon"])  # what cost() charges
                return plan

        return Dip()

    class Function(cls):  # type: ignore[valid-type,misc]
        def _plan(self, params: Any, epsilon: Fraction, meta: DatasetMeta) -> Any:
            return super()._plan(params, epsilon * factor, meta)

    return Function()


# --------------------------------------------------------------------------- samplers

Data = dict[str, np.ndarray]


@dataclass(frozen=True)
class Draw:
    """What one variant of a mechanism is run with; ``sample`` draws the statistic."""

    mech: Mechanism
    params: dict[str, Any]
    cost: Budget
    meta: DatasetMeta
    pair: tuple[Data, Data]  # D, D'


#: (draw, which dataset: 0 for D, 1 for D', rng, runs) -> the statistic of each run
Sampler = Callable[[Draw, int, np.random.Generator, int], np.ndarray]


def sample_baseline(d: Draw, which: int, rng: np.random.Generator, runs: int) -> np.ndarray:
    """``run``'s steps with ``runs`` noise draws at once; released values via ``_release``."""
    plan = d.mech._plan(d.params, d.cost, d.meta)  # type: ignore[attr-defined]
    exact = baselines._lattice_values(plan, d.pair[which])
    noisy = exact[0] + d.mech._sample(rng, plan, runs)  # type: ignore[attr-defined]
    values, inverse = np.unique(noisy, return_inverse=True)
    released = [d.mech._release(plan, np.array([v]))["value"]  # type: ignore[attr-defined]
                for v in values]
    return np.asarray(released, dtype=np.float64)[inverse.reshape(-1)]


def sample_dip_runs(d: Draw, which: int, rng: np.random.Generator, runs: int) -> np.ndarray:
    """Full runs of ``dip``; the statistic is the released value of record 0."""
    data = d.pair[which]
    out = np.empty(runs)
    for i in range(runs):
        table = d.mech.run(data, d.params, d.cost, d.meta, rng).table
        assert table is not None
        out[i] = table["x"][0]
    return out


def sample_dip_local(d: Draw, which: int, rng: np.random.Generator, runs: int) -> np.ndarray:
    """One run on ``runs`` copies of record 0 (public reference: records are independent)."""
    copies = DatasetMeta(runs, d.meta.columns)
    record = d.pair[which]["x"][:1]
    table = d.mech.run({"x": np.repeat(record, runs)}, d.params, d.cost, copies, rng).table
    assert table is not None
    return np.asarray(table["x"], dtype=np.float64)


def _iclp_centres(d: Draw) -> tuple[Any, np.ndarray, np.ndarray]:
    """The plan ``run`` releases with, and the lattice centres of D and D'."""
    plan = d.mech._calibrated(d.params, d.cost["epsilon"], d.meta)  # type: ignore[attr-defined]
    column = d.params["column"]
    a, b = (plan.noise.centre(plan.summary(data[column])) for data in d.pair)
    return plan, a, b


def sample_iclp(d: Draw, which: int, rng: np.random.Generator, runs: int) -> np.ndarray:
    """Released lattice coefficients (centre + noise, ``runs`` at once) -> the privacy-loss
    statistic between the centres of D and D' (the auditor knows both)."""
    plan, a, b = _iclp_centres(d)
    units = (a, b)[which] + plan.noise.sample(rng, runs)
    return np.asarray(plan.noise.privacy_loss(units, a, b), dtype=np.float64)


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    id: str
    cls: type[Mechanism]
    mechanism: str  # registered name (the correctly calibrated variant is the registered one)
    params: dict[str, Any]
    meta: DatasetMeta
    pair: tuple[Data, Data]
    sample: Sampler
    budget: dict[str, Fraction]
    #: the negative control calibrates for FACTOR·ε
    factor: int = 2
    runs: int = RUNS
    #: what the correct mechanism's audit is expected to certify at least (power check)
    expect: float = 0.0

    @property
    def delta(self) -> float:
        return float(self.budget.get("delta", 0))


def _int_meta(n: int = 20) -> DatasetMeta:
    return DatasetMeta(n, {"x": ColumnMeta("x", "integer", bounds=(0, 10))})


def _int_pair(n: int = 20) -> tuple[Data, Data]:
    base = np.arange(n, dtype=np.int64) % 10
    other = base.copy()
    base[0], other[0] = 0, 10  # the statistic moves by its full sensitivity
    return {"x": base}, {"x": other}


def _unit_meta(n: int) -> DatasetMeta:
    return DatasetMeta(n, {"x": ColumnMeta("x", "continuous", bounds=(0.0, 1.0))})


def _unit_pair(n: int, lo: float = 0.0, hi: float = 1.0) -> tuple[Data, Data]:
    base = np.linspace(0.0, 1.0, n)
    other = base.copy()
    base[0], other[0] = lo, hi
    return {"x": base}, {"x": other}


def _baseline_cases() -> list[Case]:
    meta, pair = _int_meta(), _int_pair()
    one = {"epsilon": EPSILON}
    count = {"statistic": "count", "condition": {"column": "x", "op": "ge", "value": 5}}
    cases = [
        Case("laplace-count", baselines.LaplaceMechanism, "laplace", count, meta, pair,
             sample_baseline, one, expect=0.85),
        Case("laplace-sum", baselines.LaplaceMechanism, "laplace",
             {"statistic": "sum", "column": "x"}, meta, pair, sample_baseline, one, expect=0.85),
        Case("laplace-mean", baselines.LaplaceMechanism, "laplace",
             {"statistic": "mean", "column": "x"}, meta, pair, sample_baseline, one, expect=0.85),
        Case("geometric-count", baselines.GeometricMechanism, "geometric", count, meta, pair,
             sample_baseline, one, expect=0.85),
        Case("geometric-mean", baselines.GeometricMechanism, "geometric",
             {"statistic": "mean", "column": "x"}, meta, pair, sample_baseline, one, expect=0.85),
        Case("gaussian-count", baselines.GaussianMechanism, "gaussian", count, meta, pair,
             sample_baseline, {"epsilon": EPSILON, "delta": Fraction(1, 100)}, expect=0.5),
        Case("gaussian-mean", baselines.GaussianMechanism, "gaussian",
             {"statistic": "mean", "column": "x"}, meta, pair, sample_baseline,
             {"epsilon": EPSILON, "delta": Fraction(1, 10**5)}, factor=3, expect=0.25),
    ]
    return cases


UNIFORM = {"kind": "parametric", "family": "uniform", "params": {"low": 0.0, "high": 1.0}}
DIP_RUNS = 4000  # full runs of the default dp reference are slow (~0.4 ms each)


def _dip_cases() -> list[Case]:
    """Record 0 at the two ends of the declared range: u = 0 against u = 1."""
    one = {"epsilon": EPSILON}
    return [
        Case("dip-public-reference", DipMechanism, "dip", {"columns": ["x"], "reference": UNIFORM},
             _unit_meta(2), _unit_pair(2), sample_dip_local, one, expect=0.85),
        Case("dip-dp-reference", DipMechanism, "dip", {"columns": ["x"]}, _unit_meta(2),
             _unit_pair(2), sample_dip_runs, one, factor=3, runs=DIP_RUNS, expect=0.3),
    ]


def _functional_meta(n: int, points: int = 50) -> DatasetMeta:
    grid = tuple(float(t) for t in np.linspace(0.0, 1.0, points))
    return DatasetMeta(n, {"f": ColumnMeta("f", "functional", grid=grid, norm_bound=1.0)})


def _iclp_mean_case(id: str, params: dict[str, Any], factor: int, expect: float) -> Case:
    """Record 0: the curve attaining the sensitivity (``qr_worst_case``) against its negative.

    The default ψ rule depends on ε; it is pinned to its value at ε so that the negative
    control differs from the mechanism in its noise only.
    """
    n, meta = 20, _functional_meta(20)
    mech = mechanisms.get("iclp.mean")
    plan = mech._calibrated(mech.load_params(params), EPSILON, meta)  # type: ignore[attr-defined]
    params = {**params, "smoothing": {"psi": plan.smoothing["psi"]}}
    curve = qr_worst_case(plan.eig, plan.tau, plan.smoothing["eta"], plan.smoothing["psi"])
    base = np.zeros((n, curve.size))
    other = base.copy()
    base[0], other[0] = curve, -curve
    return Case(id, IclpMean, "iclp.mean", params, meta, ({"f": base}, {"f": other}),
                sample_iclp, {"epsilon": EPSILON}, factor=factor, expect=expect)


def _iclp_cases() -> list[Case]:
    # KDE: record 0 in the middle bin against the lowest one, others in the middle (the pair
    # with the largest exact loss among a few tried)
    kde = _unit_pair(20, lo=0.5, hi=0.0)
    for data in kde:
        data["x"][1:] = 0.5
    return [
        _iclp_mean_case("iclp.mean", {"column": "f"}, factor=3, expect=0.3),
        _iclp_mean_case("iclp.mean-one-component", {"column": "f", "max_components": 1},
                        factor=2, expect=0.8),
        Case("iclp.kde", IclpKde, "iclp.kde", {"column": "x"}, _unit_meta(20), kde, sample_iclp,
             {"epsilon": EPSILON}, factor=3, expect=0.4),
    ]


CASES = _baseline_cases() + _dip_cases() + _iclp_cases()


# --------------------------------------------------------------------------- the audit


def _audit(case: Case, mech: Mechanism, seed: int) -> AuditResult:
    params = mech.load_params(case.params)
    cost = mech.cost(params, case.budget, case.meta)
    assert cost == case.budget  # the negative control charges what it claims, too
    draw = Draw(mech, params, cost, case.meta, case.pair)
    a, b = (case.sample(draw, which, np.random.default_rng([seed, which]), case.runs)
            for which in (0, 1))
    return audit(a, b, delta=case.delta)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_certified_loss_never_exceeds_the_charge_and_a_miscalibration_is_caught(
        case: Case) -> None:
    claimed = float(case.budget["epsilon"])
    honest = _audit(case, mechanisms.get(case.mechanism), seed=1)
    control = _audit(case, overspending(case.cls, case.factor), seed=2)
    print(f"\n{case.id}: certified {honest.epsilon_lb:.3f} (claim {claimed:g}), control "
          f"({case.factor}x) {control.epsilon_lb:.3f}; {honest.event}")
    assert honest.epsilon_lb <= claimed
    assert honest.epsilon_lb >= case.expect  # the audit is not vacuous
    assert control.epsilon_lb > claimed


VECTORISED = [c for c in CASES if c.sample in (sample_baseline, sample_iclp)]


@pytest.mark.parametrize("case", VECTORISED, ids=[c.id for c in VECTORISED])
def test_audit_sampler_is_the_run_path(case: Case) -> None:
    """One vectorised draw is what ``run`` releases with the same seed, for both datasets."""
    mech = mechanisms.get(case.mechanism)
    params = mech.load_params(case.params)
    cost = mech.cost(params, case.budget, case.meta)
    draw = Draw(mech, params, cost, case.meta, case.pair)
    for seed in range(5):
        for which in (0, 1):
            drawn = case.sample(draw, which, np.random.default_rng(seed), 1)
            out = mech.run(case.pair[which], params, cost, case.meta,
                           np.random.default_rng(seed))
            if case.sample is sample_baseline:
                assert drawn.tolist() == [out.result["value"]]
            else:
                plan, a, b = _iclp_centres(draw)
                units = np.asarray(out.result["coefficients"]) / plan.noise.steps
                assert np.array_equal(units, np.rint(units))
                assert drawn.tolist() == plan.noise.privacy_loss(units[None, :], a, b).tolist()


def test_dip_certified_bound_is_below_the_exact_loss_of_its_event() -> None:
    """Cross-check with ``mechanisms.dip.audit``: the event the audit chose has an exact
    log-ratio (from DIP's exact output law) at least the certified bound, and at most ε.

    A coarse resolution K keeps the exact law small; a uniform reference makes the
    released value the noise step's g itself.
    """
    params = {"columns": ["x"], "reference": UNIFORM, "resolution": 256}
    case = Case("dip-exact", DipMechanism, "dip", params, _unit_meta(2), _unit_pair(2),
                sample_dip_local, {"epsilon": EPSILON})
    result = _audit(case, mechanisms.get("dip"), seed=3)
    step = NoiseStep.calibrate(EPSILON, 256)
    event = [[max(result.event.lo, 0.0), min(result.event.hi, 1.0)]]
    matrix, lost = transition_matrix_discrete([[0.0, 0.0], [1.0, 1.0]], event, step)
    p_d, p_d2 = matrix[:, 0]
    exact = math.log(p_d / p_d2) if result.event.forward else math.log(p_d2 / p_d)
    print(f"\ndip K=256: certified {result.epsilon_lb:.3f} <= exact {exact:.3f} of {result.event}")
    assert lost < 1e-15
    assert 0.8 < result.epsilon_lb <= exact <= float(EPSILON) * (1 + 1e-9)
