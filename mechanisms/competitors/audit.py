"""The adversarial audit of DIP's competitors (``lrm``, ``opm.mean``, ``opm.l2ball``, ``exm``).

Same harness as ``mechanisms.audit.dp``: worst-case replace-one neighbours drawn
through each mechanism's own code path, five event families at α/5, and a
negative control (noise calibrated for a multiple of ε while ε is charged) that
the interval family must catch; ``exm`` also records each release's work (coins
flipped, and coins that needed the exact tier) for the work family, whose control
is the old rejection sampler on issue #27's pair.

Neighbours:

* ``lrm``: record 0 at the bounds' two ends in every column (p columns: the
  losses add to ε). Records are privatized independently, so one ``run`` on
  ``runs`` copies of record 0 gives ``runs`` independent releases of it;
* ``opm.mean``: n = 2 records, record 0 at the clip interval's two ends;
* ``opm.l2ball``: n = 1 (d = 1: the release is ±B and the loss is exactly
  ln(π̂/(1-π̂)) <= ε, the tightest case) and n = 3 (record 0 moved, direction
  events in R^3);
* ``exm``: n = 2 records of 3 categories, (a, a) vs (a, c), one and two draws; and
  issue #27's pair on the support 0..1999 (D: value 0 at count 40, values 1..20 at
  count 39; D': one record moved from 1 to 0), where the old sampler's run time
  told D from D' at ε >= 1.3 while 1 was charged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np

from mechanisms import registry, sampling
from mechanisms.audit import controls
from mechanisms.audit.dp import (
    TAIL_EPSILON,
    Data,
    FloatArray,
    Plan,
    Scenario,
    audit_plan,
    category_meta,
    checked_cost,
    eps,
    unit_meta,
)
from mechanisms.audit.entries import AuditReport, AuditSize, entry
from mechanisms.base import ColumnMeta, DatasetMeta, Mechanism
from mechanisms.competitors.exm import ExmMechanism
from mechanisms.competitors.lrm import LrmMechanism
from mechanisms.competitors.opm import OpmL2BallMechanism, OpmMeanMechanism, l2ball_sample

M = TypeVar("M", bound=Mechanism)


def _ends(meta: DatasetMeta, names: list[str], n: int) -> tuple[Data, Data]:
    """Every named column's record 0 at lo (D) vs hi (D'); the others at lo."""
    pair: tuple[Data, Data] = ({}, {})
    for name in names:
        col = meta.column(name)
        assert col.bounds is not None
        dtype = np.int64 if col.type == "integer" else np.float64
        base = np.full(n, col.bounds[0], dtype=dtype)
        other = base.copy()
        other[0] = col.bounds[1]
        pair[0][name], pair[1][name] = base, other
    return pair


def lrm_scenario(label: str, mech: LrmMechanism, raw: Mapping[str, Any],
                 budget: Mapping[str, Fraction], meta: DatasetMeta) -> Scenario:
    """One ``run`` on ``runs`` copies of record 0: ``runs`` releases of that record."""
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    names = list(params["columns"])
    pair = _ends(meta, names, meta.n_rows)

    def release(which: int, rng: np.random.Generator, runs: int) -> FloatArray:
        data = {n: np.repeat(pair[which][n][:1], runs) for n in names}
        table = mech.run(data, params, cost, DatasetMeta(runs, meta.columns), rng).table
        assert table is not None
        return np.stack([np.asarray(table[n], dtype=np.float64) for n in names], axis=1)

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        return release(which, rng, runs)

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        out: FloatArray = release(which, rng, 1)[0]
        return out

    return Scenario(label, mech, params, cost, meta, pair, draw, once)


def opm_mean_scenario(label: str, mech: OpmMeanMechanism, raw: Mapping[str, Any],
                      budget: Mapping[str, Fraction], meta: DatasetMeta) -> Scenario:
    """``run``'s lattice sums with ``runs`` noise vectors at once (released via ``estimate``)."""
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    names = list(params["columns"])
    plans = mech._plan(params, cost["epsilon"], meta)
    n = meta.n_rows
    pair: tuple[Data, Data] = ({}, {})
    for name in names:
        lat = plans[name].lattice
        dtype = np.int64 if lat.integer else np.float64
        base = np.full(n, lat.lo, dtype=dtype)
        other = base.copy()
        other[0] = lat.hi
        pair[0][name], pair[1][name] = base, other
    exact = [{nm: int(plans[nm].lattice.index(d[nm]).sum()) for nm in names} for d in pair]

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        cols = []
        for nm in names:
            lat = plans[nm].lattice
            noise = sampling.discrete_laplace(rng, lat.scale, (runs, n))
            sums = exact[which][nm] + noise.sum(axis=1)
            values, inverse = np.unique(sums, return_inverse=True)
            est = np.array([mech.estimate(lat, int(v), n) for v in values])
            cols.append(est[inverse.reshape(-1)])
        return np.stack(cols, axis=1)

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        result = mech.run(pair[which], params, cost, meta, rng).result
        return np.asarray(result["values"], dtype=np.float64)

    return Scenario(label, mech, params, cost, meta, pair, draw, once)


def _looped(label: str, mech: Mechanism, params: dict[str, Any], cost: dict[str, Fraction],
            meta: DatasetMeta, pair: tuple[Data, Data],
            one: Callable[[int, np.random.Generator], FloatArray]) -> Scenario:
    """A scenario whose draws are ``runs`` sequential releases from one generator
    (``one(which, rng)``: one release on neighbour ``which``)."""

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        return np.stack([one(which, rng) for _ in range(runs)])

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        return one(which, rng)

    return Scenario(label, mech, params, cost, meta, pair, draw, once)


def l2ball_scenario(label: str, mech: OpmL2BallMechanism, raw: Mapping[str, Any],
                    budget: Mapping[str, Fraction], meta: DatasetMeta) -> Scenario:
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    pair = _ends(meta, [params["column"]], meta.n_rows)
    name = params["column"]

    plan = mech._plan(params, cost["epsilon"], meta)
    centred = [d[name].astype(np.float64) - plan.centre for d in pair]

    def one(which: int, rng: np.random.Generator) -> FloatArray:
        return l2ball_sample(centred[which], plan, rng) + plan.centre

    scenario = _looped(label, mech, params, cost, meta, pair, one)

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        table = mech.run(pair[which], params, cost, meta, rng).table
        assert table is not None
        return np.asarray(table[name], dtype=np.float64)

    return Scenario(label, mech, params, cost, meta, pair, scenario.draw, once)


def exm_issue_pair(meta: DatasetMeta, name: str) -> tuple[Data, Data]:
    """Issue #27's neighbours: value 0 at count 40 and values 1..20 at count 39 in D; D'
    moves one record from 1 to 0 (acceptance rates 13.1/s and 8.2/s for the old sampler at
    ε = 1). ``meta`` must have 820 rows and an integer column on 0..1999."""
    base = np.concatenate([np.zeros(40, dtype=np.int64)]
                          + [np.full(39, v, dtype=np.int64) for v in range(1, 21)])
    assert base.size == meta.n_rows
    other = base.copy()
    other[40] = 0
    return {name: base}, {name: other}


def exm_scenario(label: str, mech: ExmMechanism, raw: Mapping[str, Any],
                 budget: Mapping[str, Fraction], meta: DatasetMeta,
                 pair: tuple[Data, Data] | None = None) -> Scenario:
    """Default neighbours: (a, …, a) vs (c, a, …, a) on a categorical column. Work counters
    per release: coins flipped (k·s, public) and coins decided by the exact tier; for the
    old rejection sampler (``controls.RejectionExm``), its proposals."""
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    name = params["column"]
    col = meta.column(name)
    if pair is None:
        top = len(col.categories or ()) - 1
        base = np.zeros(meta.n_rows, dtype=np.int64)
        other = base.copy()
        other[0] = top
        pair = ({name: base}, {name: other})
    plan = mech._plan(params, cost["epsilon"], meta)
    counts = [mech.counts(plan, d[name]) for d in pair]
    k = plan.draws

    def draw_work(rng: np.random.Generator, which: int, runs: int
                  ) -> tuple[FloatArray, FloatArray]:
        """Draws are i.i.d. given the counts: ``runs`` releases are runs·k draws at once
        (for runs = 1 exactly ``run``'s call)."""
        if isinstance(mech, controls.RejectionExm):
            idx, proposals = mech.runs(plan, counts[which], rng, runs)
            return idx.astype(np.float64), proposals.astype(np.float64)[:, None]
        flips = mech.flips(plan, counts[which], rng, runs * k)
        refined = flips.refined.reshape(runs, k).sum(axis=1)
        work = np.stack([np.full(runs, flips.coins / runs), refined], axis=1)
        return flips.chosen.reshape(runs, k).astype(np.float64), work.astype(np.float64)

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        return draw_work(rng, which, runs)[0]

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        table = mech.run(pair[which], params, cost, meta, rng).table
        assert table is not None
        if col.type == "categorical":
            index = {c: i for i, c in enumerate(col.categories or ())}
            return np.array([index[str(v)] for v in table[name]], dtype=np.float64)
        return np.asarray(table[name], dtype=np.float64) - plan.offset

    return Scenario(label, mech, params, cost, meta, pair, draw, once, draw_work=draw_work)


def _two_columns(n: int) -> DatasetMeta:
    return DatasetMeta(n, {"x": ColumnMeta("x", "continuous", bounds=(0.0, 1.0)),
                           "k": ColumnMeta("k", "integer", bounds=(0, 5))})


def _get(name: str, cls: type[M]) -> tuple[M, M]:
    """The registered mechanism and its overspending control (noise for 2 ε or 3 ε)."""
    mech = registry.get(name)
    over = controls.overspending(mech, 3 if cls is ExmMechanism else 2)
    assert isinstance(mech, cls) and isinstance(over, cls)
    return mech, over


def _lrm_plan() -> Plan:
    mech, over = _get("lrm", LrmMechanism)
    x = {"columns": ["x"]}
    return Plan([
        lrm_scenario("one column eps=1", mech, x, eps(1), unit_meta(2)),
        lrm_scenario("two columns (eps/2 each) eps=1", mech, {"columns": ["x", "k"]}, eps(1),
                     _two_columns(2)),
        lrm_scenario("integer column, rounded to 0.5, eps=1", mech,
                     {"columns": ["k"], "round_to": 0.5}, eps(1), _two_columns(2)),
        lrm_scenario(f"one column eps={TAIL_EPSILON}", mech, x, eps(TAIL_EPSILON),
                     unit_meta(2)),
    ], [("interval", lrm_scenario("one column, noise for 2 eps", over, x, eps(1),
                                  unit_meta(2)))])


def _opm_mean_plan() -> Plan:
    mech, over = _get("opm.mean", OpmMeanMechanism)
    x = {"columns": ["x"]}
    return Plan([
        opm_mean_scenario("k=inf eps=1", mech, x, eps(1), unit_meta(2)),
        opm_mean_scenario("k=inf midpoint, two columns eps=1", mech,
                          {"columns": ["x", "k"], "center": "midpoint"}, eps(1),
                          _two_columns(2)),
        opm_mean_scenario("k=4, moment bound 0.3, eps=1", mech,
                          {"columns": ["x"], "k": 4, "moment_bound": 0.3}, eps(1),
                          unit_meta(2)),
    ], [("interval", opm_mean_scenario("k=inf, noise for 2 eps", over, x, eps(1),
                                       unit_meta(2)))])


def _l2ball_plan() -> Plan:
    mech, over = _get("opm.l2ball", OpmL2BallMechanism)
    mid = {"column": "x", "center": "midpoint"}
    return Plan([
        l2ball_scenario("d=1 midpoint eps=1", mech, mid, eps(1), unit_meta(1)),
        l2ball_scenario("d=3 eps=1", mech, {"column": "x"}, eps(1), unit_meta(3)),
    ], [("interval", l2ball_scenario("d=1, coin for 2 eps", over, mid, eps(1),
                                     unit_meta(1)))])


def _exm_plan() -> Plan:
    mech, over = _get("exm", ExmMechanism)
    one = {"column": "c"}
    issue = DatasetMeta(820, {"k": ColumnMeta("k", "integer", bounds=(0, 1999))})
    pair = exm_issue_pair(issue, "k")
    return Plan([
        exm_scenario("one draw eps=1", mech, one, eps(1), category_meta(2)),
        exm_scenario("two draws eps=2", mech, {"column": "c", "draws": 2}, eps(2),
                     category_meta(2)),
        exm_scenario("issue #27 pair, support 0..1999, one draw eps=1", mech,
                     {"column": "k"}, eps(1), issue, pair),
    ], [
        ("interval", exm_scenario("one draw, weights for 3 eps", over, one, eps(1),
                                  category_meta(2))),
        # twice the runs: a wide margin over charged (cheap: the control is vectorised)
        ("work", replace(exm_scenario("issue #27 pair, old rejection sampler",
                                      controls.RejectionExm(), {"column": "k"}, eps(1),
                                      issue, pair), scale_runs=2)),
    ])


PLANS: dict[str, Callable[[], Plan]] = {
    "lrm": _lrm_plan,
    "opm.mean": _opm_mean_plan,
    "opm.l2ball": _l2ball_plan,
    "exm": _exm_plan,
}


@entry(*PLANS)
def audit_competitor(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    """The ε-DP audit of one of DIP's competitors (see the module doc)."""
    return audit_plan(PLANS[mechanism](), mechanism, "epsilon-DP", size, seed)
