"""The adversarial audit of every DP mechanism: worst-case neighbours, five event families.

For each registered DP mechanism, a few configurations (``Scenario``) are run
many times on worst-case neighbours D, D' (one record replaced), drawn
through the mechanism's own code path (``run``, or the library calls ``run``
makes, vectorised over runs; ``tests/audit/test_audit_entries.py`` checks that
one vectorised draw is exactly what ``run`` releases for the same seed).

Neighbours come from the mechanism's sensitivity analysis, as a function of
its params and the public metadata (``neighbours``): a bounded column's record
at lo vs hi, a count's condition false vs true, a histogram's record moved
between two bins, DIP's record in the two extreme cells, ICLP/FRL's curve
along the direction that attains the weighted-ℓ1 sensitivity (its negative for
D'), a density's record at the two grid points whose coefficient difference
costs most under the claimed noise.

Each scenario's runs go through five event families (``events``), each at
level α/5, so the certified bound max_F ε_F holds with probability >= 1 − α. The
fifth, ``work``, sees each run's work counters next to its output (a scenario's
``draw_work``; by default the mechanism's public work bound, the same on every run).
A scenario fails when the bound exceeds the ε it charges (for ``gaussian``:
bounds are computed at its δ) or the tail family finds a support gap. Each
mechanism also runs negative controls (``controls``), each of which its
designated family must catch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms import registry, sampling
from mechanisms.audit import ALPHA, controls, events, tapes
from mechanisms.audit.entries import AuditReport, AuditSize, entry
from mechanisms.base import ColumnMeta, DatasetMeta, Mechanism
from mechanisms.dip.mechanism import DipMechanism
from mechanisms.dip.noise import NoiseStep
from mechanisms.dp import baselines
from mechanisms.iclp.entries import Priced

FloatArray = NDArray[np.float64]
Data = dict[str, np.ndarray]
#: (rng, which, runs) -> (released values, work counters), as ``Scenario.draw_work``
WorkDraw = Callable[[np.random.Generator, int, int], tuple[FloatArray, FloatArray]]
FAMILIES = ("interval", "representation", "learned", "tail", "work")
#: runs per neighbour (half select, half certify) of a vectorised scenario
RUNS: dict[str, int] = {"ci": 20_000, "full": 200_000}
#: runs per neighbour when every run is a full ``run`` (DIP with its dp reference)
SLOW_RUNS: dict[str, int] = {"ci": 2_000, "full": 20_000}
#: extreme tapes per forced prefix (``tapes.PREFIXES``), per neighbour
TAPES: dict[str, int] = {"ci": 3, "full": 10}


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    """One configuration of one mechanism variant, ready to draw releases on D and D'."""

    label: str
    mech: Mechanism
    params: dict[str, Any]
    cost: dict[str, Fraction]
    meta: DatasetMeta
    pair: tuple[Data, Data]
    #: (rng, which: 0 for D and 1 for D', runs) -> released values, shape (runs, d)
    draw: Callable[[np.random.Generator, int, int], FloatArray]
    #: (rng, which) -> one release through ``run``, flattened like a row of ``draw``
    once: Callable[[np.random.Generator, int], FloatArray]
    statistics: tuple[tuple[str, events.StatisticFn], ...] = ()
    extra_events: tuple[tuple[str, events.EventFn], ...] = ()
    slow: bool = False
    #: runs relative to the size's default (a weak effect needs more)
    scale_runs: int = 1
    #: (rng, which, runs) -> (released values as ``draw``, work counters (runs, w)): each
    #: run's proposals, coins, iterations or redraws next to its output. None: the work
    #: is a function of public inputs only, and every run records ``public_work``.
    draw_work: WorkDraw | None = None

    def public_work(self) -> float:
        """The mechanism's work bound from public inputs (``Mechanism.work``)."""
        return float(self.mech.work(self.params, self.meta).units)

    @property
    def charged(self) -> float:
        return float(self.cost["epsilon"])

    @property
    def delta(self) -> float:
        return float(self.cost.get("delta", 0))


@dataclass(frozen=True)
class Outcome:
    """A scenario's family results (one per ``FAMILIES``)."""

    scenario: Scenario
    families: tuple[events.FamilyResult, ...]

    @property
    def certified(self) -> float:
        return max(f.certified for f in self.families)

    @property
    def gap(self) -> bool:
        return any(f.gap for f in self.families)

    @property
    def passed(self) -> bool:
        return self.certified <= self.scenario.charged and not self.gap

    def family(self, name: str) -> events.FamilyResult:
        return next(f for f in self.families if f.family == name)

    def caught_by(self, name: str) -> bool:
        f = self.family(name)
        return f.certified > self.scenario.charged or f.gap

    def worst(self) -> events.FamilyResult:
        return max(self.families, key=lambda f: (f.gap, f.certified))


def _draw(s: Scenario, which: int, runs: int, seed: int) -> tuple[FloatArray, FloatArray]:
    """Released values and work counters of ``runs`` runs on neighbour ``which``."""
    rng = np.random.default_rng([seed, which])
    if s.draw_work is not None:
        return s.draw_work(rng, which, runs)
    x = s.draw(rng, which, runs)
    return x, np.full((x.shape[0], 1), s.public_work())


def evaluate(s: Scenario, size: AuditSize, seed: int, alpha: float = ALPHA) -> Outcome:
    """Draw the runs and extreme tapes of ``s`` and run every family at α/F (F families)."""
    runs = (SLOW_RUNS if s.slow else RUNS)[size] * s.scale_runs
    x, wx = _draw(s, 0, runs, seed)
    y, wy = _draw(s, 1, runs, seed)
    probe_x = tapes.reach(lambda g: s.once(g, 0), TAPES[size], seed)
    probe_y = tapes.reach(lambda g: s.once(g, 1), TAPES[size], seed + 1)
    a = alpha / len(FAMILIES)
    families = (
        events.interval_family(x, y, a, s.delta, s.statistics),
        events.representation_family(x, y, a, s.delta, s.extra_events),
        events.learned_family(x, y, a, s.delta),
        events.support_gap(x, y, probe_x, probe_y, a, s.delta),
        events.work_family(x, y, wx, wy, a, s.delta),
    )
    return Outcome(s, families)


# --------------------------------------------------------------------------- neighbours


def _fill(meta: ColumnMeta, n: int, value: float) -> np.ndarray:
    dtype = np.float64 if meta.type == "continuous" else np.int64
    return np.full(n, value, dtype=dtype)


def baseline_neighbours(mech: baselines.Baseline, params: Mapping[str, Any],
                        meta: DatasetMeta) -> tuple[Data, Data]:
    """Record 0 moved so the statistic moves by its sensitivity (others at lo).

    count: the condition false vs true (two values among the bounds, the
    condition's values and the categories); sum/mean: lo vs hi; histogram:
    the first vs the last bin (categories 0 vs k − 1, or lo vs hi).
    """
    q = baselines.resolve_query(params, meta)
    column = q.column
    if q.condition is not None:
        cond = q.condition
        lo, hi = column.bounds or (0.0, float(len(column.categories or ())) - 1)
        candidates = sorted({float(lo), float(hi), *cond.values,
                             *(v + 1 for v in cond.values), *(v - 1 for v in cond.values)})
        candidates = [c for c in candidates if lo <= c <= hi]
        mask = cond.mask(np.asarray(candidates))
        v0 = candidates[int(np.argmin(mask))]
        v1 = candidates[int(np.argmax(mask))]
        if bool(mask.min()) == bool(mask.max()):
            raise ValueError("the condition has the same truth value on the whole domain")
    elif q.histogram and q.edges is None:
        v0, v1 = 0.0, float(len(column.categories or ()) - 1)
    else:
        assert q.bounds is not None
        v0, v1 = float(q.bounds[0]), float(q.bounds[1])
    base = _fill(column, meta.n_rows, v0)
    other = base.copy()
    other[0] = v1
    return {column.name: base}, {column.name: other}


def dip_neighbours(params: Mapping[str, Any], meta: DatasetMeta) -> tuple[Data, Data]:
    """Every column's record 0 at the two ends of its declared range: u in the extreme cells."""
    pair: tuple[Data, Data] = ({}, {})
    for name in params["columns"]:
        column = meta.column(name)
        assert column.bounds is not None
        lo, hi = column.bounds
        base = _fill(column, meta.n_rows, lo)
        other = base.copy()
        other[0] = hi
        pair[0][name], pair[1][name] = base, other
    return pair


def function_neighbours(plan: Any, column: str, meta: DatasetMeta) -> tuple[Data, Data]:
    """Curves ±x with x ∝ Σ_j (f_j/a_j) v_j, ‖x‖ = τ (others 0).

    The release adds Laplace(b·a_j) to f_j⟨x̄, v_j⟩; the loss of replacing x by
    −x is (2/n)Σ_j f_j|⟨x, v_j⟩|/(b a_j), maximised over ‖x‖ <= τ by this x
    (Cauchy–Schwarz): ICLP's ``qr_worst_case``, and for FRL (f = a = 1) the
    equal-weight sum of the first M eigenfunctions.
    """
    eig = plan.eig
    direction = np.zeros(eig.values.size)
    direction[: plan.filter.size] = plan.filter / plan.noise.shape
    curve = eig.synthesize(direction)
    curve = plan.tau * curve / float(np.sqrt(np.sum(eig.weights * curve * curve)))
    base = np.zeros((meta.n_rows, curve.size))
    other = base.copy()
    base[0], other[0] = curve, -curve
    return {column: base}, {column: other}


def sup_neighbours(plan: Any, column: str, meta: DatasetMeta) -> tuple[Data, Data]:
    """Bernstein mean: record 0 at +τ_∞ vs −τ_∞ everywhere (others 0), which moves every
    lattice value by 2τ_∞/n: the ℓ1 sensitivity (K + 1)·Δ_∞ exactly."""
    base = np.zeros((meta.n_rows, plan.grid.size))
    other = base.copy()
    base[0], other[0] = plan.sup_bound, -plan.sup_bound
    return {column: base}, {column: other}


def ar_neighbours(plan: Any, column: str, meta: DatasetMeta) -> tuple[Data, Data]:
    """ICLP-AR: every record τ·v_1, record 0 flipped to −τ·v_1 in D'. The mean's first
    coefficient moves by 2τ/n and stays above θ_1 when θ_1 <= (1 − 2/n)τ, so nothing is
    thresholded away: with J = 1 this attains Δ_AR = (2τ/n)/√λ_1."""
    curve = plan.tau * plan.eig.vectors[:, 0] * (1 - 1e-12)
    base = np.tile(curve, (meta.n_rows, 1))
    other = base.copy()
    other[0] = -curve
    return {column: base}, {column: other}


def gp_neighbours(plan: Any, column: str, meta: DatasetMeta) -> tuple[Data, Data]:
    """GP-ADP: record 0 at ±τ·v_j* with j* = argmax_j F_j/√λ_j (others 0), which attains
    the Cameron–Martin sensitivity (2τ/n)·max_j F_j/√λ_j."""
    eig = plan.eig
    j = int(np.argmax(plan.filter / np.sqrt(eig.values)))
    curve = plan.tau * eig.vectors[:, j] * (1 - 1e-12)
    base = np.zeros((meta.n_rows, curve.size))
    other = base.copy()
    base[0], other[0] = curve, -curve
    return {column: base}, {column: other}


def gp_scenario(label: str, mech: Mechanism, raw: Mapping[str, Any],
                budget: Mapping[str, Fraction], meta: DatasetMeta) -> Scenario:
    """GP-ADP's lattice coefficients (centre + discrete Gaussian, ``runs`` at once), with the
    Neyman–Pearson statistic of the claimed Gaussian noise between the two centres."""
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    plan: Any = mech._gp_plan(params, cost, meta)  # type: ignore[attr-defined]
    column = params["column"]
    pair = gp_neighbours(plan, column, meta)
    nz = plan.gaussian
    centres = [nz.centre(plan.summary(d[column])) for d in pair]
    steps = nz.steps

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        out: FloatArray = (centres[which] + nz.sample(rng, runs)).astype(np.float64) * steps
        return out

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        result = mech.run(pair[which], params, cost, meta, rng).result
        return np.asarray(result["coefficients"], dtype=np.float64)

    def loss(v: FloatArray) -> FloatArray:
        y = v / steps
        a, b = centres[0].astype(np.float64), centres[1].astype(np.float64)
        out: FloatArray = (((y - b) ** 2 - (y - a) ** 2) / (2.0 * nz.scales**2)).sum(axis=1)
        return out

    return Scenario(label, mech, params, cost, meta, pair, draw, once,
                    statistics=(("privacy-loss statistic of the claimed noise", loss),))


def density_neighbours(plan: Any, column: str, meta: DatasetMeta) -> tuple[Data, Data]:
    """Record 0 at the two output-grid points whose coefficients differ most in the claimed
    noise's loss Σ_j |c_p − c_q| / b_j (others at the middle point)."""
    grid = np.asarray(plan.grid, dtype=np.float64)
    middle = grid[grid.size // 2]
    base = np.full(meta.n_rows, middle)
    rows = []
    for p in grid:
        values = base.copy()
        values[0] = p
        rows.append(plan.summary(values))
    c = np.asarray(rows) / plan.noise.laplace_scales
    loss = np.abs(c[:, None, :] - c[None, :, :]).sum(axis=2)
    p, q = np.unravel_index(int(np.argmax(loss)), loss.shape)
    d0, d1 = base.copy(), base.copy()
    d0[0], d1[0] = grid[p], grid[q]
    return {column: d0}, {column: d1}


# --------------------------------------------------------------------------- builders


def checked_cost(mech: Mechanism, params: dict[str, Any], budget: Mapping[str, Fraction],
                 meta: DatasetMeta) -> dict[str, Fraction]:
    """``mech.cost``, checked to charge exactly the budget the scenario gives it."""
    cost = mech.cost(params, budget, meta)
    assert cost == dict(budget)  # controls charge what they claim, too
    return dict(cost)


def baseline_scenario(label: str, mech: baselines.Baseline, raw: Mapping[str, Any],
                      budget: Mapping[str, Fraction], meta: DatasetMeta) -> Scenario:
    """``run``'s steps with ``runs`` noise draws at once (released via ``_release``)."""
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    pair = baseline_neighbours(mech, params, meta)
    plan = mech._plan(params, cost, meta)
    exact = [baselines.lattice_values(plan, d) for d in pair]
    move = np.abs(exact[1] - exact[0]).astype(np.float64)
    # Laplace is calibrated to the L1 total; the Gaussian to a shift per moved bin, and a
    # histogram's record leaves one bin for another (√2 of it in L2)
    bins = 2 if plan.query.histogram else 1
    _check_attained(label, float(np.sqrt(np.sum(move**2)) if plan.l2 else np.sum(move)),
                    plan.lattice_sensitivity * math.sqrt(bins) if plan.l2
                    else plan.lattice_sensitivity)

    def released(which: int, noise: NDArray[np.int64], runs: int) -> FloatArray:
        d = exact[which].size
        noisy = exact[which][None, :] + noise.reshape(runs, d)
        if plan.query.histogram:
            return noisy.astype(np.float64)
        values, inverse = np.unique(noisy[:, 0], return_inverse=True)
        out = [mech._release(plan, np.array([v]))["value"] for v in values]
        return np.asarray(out, dtype=np.float64)[inverse.reshape(-1)][:, None]

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        return released(which, mech._sample(rng, plan, runs * exact[which].size), runs)

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        result = mech.run(pair[which], params, cost, meta, rng).result
        return np.asarray(result.get("values", [result.get("value")]), dtype=np.float64)

    draw_work: WorkDraw | None = None
    if type(mech) is baselines.GaussianMechanism:  # rejection sampling: record its trials

        def draw_work(rng: np.random.Generator, which: int, runs: int
                      ) -> tuple[FloatArray, FloatArray]:
            """``draw``'s releases (the same generator calls as ``_sample``) and each
            release's discrete Gaussian proposals."""
            d = exact[which].size
            noise, trials = sampling.discrete_gaussian_trials(rng, plan.noise_scale, runs * d)
            work = trials.reshape(runs, d).sum(axis=1).astype(np.float64)[:, None]
            return released(which, noise, runs), work

    return Scenario(label, mech, params, cost, meta, pair, draw, once, draw_work=draw_work)


def float_laplace_scenario(label: str, raw: Mapping[str, Any], budget: Mapping[str, Fraction],
                           meta: DatasetMeta) -> Scenario:
    """The Mironov control: ``laplace``'s neighbours, raw float Laplace noise."""
    mech = controls.FloatLaplace()
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    pair = baseline_neighbours(mech, params, meta)

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        return mech.draw(pair[which], params, cost, meta, rng, runs)[:, None]

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        return np.array([mech.run(pair[which], params, cost, meta, rng).result["value"]])

    return Scenario(label, mech, params, cost, meta, pair, draw, once, scale_runs=5)


def function_scenario(label: str, mech: Priced, raw: Mapping[str, Any],
                      budget: Mapping[str, Fraction], meta: DatasetMeta) -> Scenario:
    """Released lattice coefficients (centre + noise, ``runs`` at once); the interval family
    also gets the Neyman–Pearson statistic of the claimed noise between the two centres."""
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    plan: Any = mech._calibrated(params, cost["epsilon"], meta)
    column = params["column"]
    if hasattr(plan, "sup_bound"):
        pair = sup_neighbours(plan, column, meta)
    elif hasattr(plan, "thresholds"):
        pair = ar_neighbours(plan, column, meta)
    elif hasattr(plan, "eig") and hasattr(plan, "tau"):
        pair = function_neighbours(plan, column, meta)
    else:
        pair = density_neighbours(plan, column, meta)
    centres = [plan.noise.centre(plan.summary(d[column])) for d in pair]
    steps = plan.noise.steps

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        units = centres[which] + plan.noise.sample(rng, runs)
        out: FloatArray = units.astype(np.float64) * steps
        return out

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        result = mech.run(pair[which], params, cost, meta, rng).result
        return np.asarray(result["coefficients"], dtype=np.float64)

    def loss(v: FloatArray) -> FloatArray:
        return plan.noise.privacy_loss(v / steps, centres[0], centres[1])

    return Scenario(label, mech, params, cost, meta, pair, draw, once,
                    statistics=(("privacy-loss statistic of the claimed noise", loss),))


def dip_scenario(label: str, mech: DipMechanism, raw: Mapping[str, Any],
                 budget: Mapping[str, Fraction], meta: DatasetMeta,
                 old_step: bool = False,
                 step_class: type[NoiseStep] = controls.OldNoiseStep) -> Scenario:
    """DIP on its extreme-cell neighbours.

    A public reference (parametric) makes DIP ε-local-DP per record
    (``chain``): one run on ``runs`` copies of record 0 gives ``runs``
    independent draws of its release, so ``draw`` is one real ``run``. The dp
    reference couples the records through the histogram: every run is a full
    run (slow), and the release is the whole (n-row) column. ``old_step``
    swaps in another noise step (default: the old one, the representation
    control), same pipeline.
    """
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    pair = dip_neighbours(params, meta)
    name = params["columns"][0]
    plan = mech.plan(params, cost, meta)
    local = plan.kind == "parametric"

    def table(data: Data, rng: np.random.Generator, rows: int) -> FloatArray:
        sub = DatasetMeta(rows, meta.columns)
        if old_step:
            assert plan.parametric is not None
            return controls.old_privatize(data[name], plan.parametric, name, plan.epsilon_dip,
                                          rng, plan.step.resolution, step_class)
        out = mech.run(data, params, cost, sub, rng).table
        assert out is not None
        return np.asarray(out[name], dtype=np.float64)

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        if local:
            record = pair[which][name][:1]
            return table({name: np.repeat(record, runs)}, rng, runs)[:, None]
        return np.stack([table(pair[which], rng, meta.n_rows) for _ in range(runs)])

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        if local:
            return table({name: pair[which][name][:1]}, rng, 1)
        return table(pair[which], rng, meta.n_rows)

    extra: tuple[tuple[str, events.EventFn], ...] = ()
    if local and plan.parametric is not None:
        cells = [float(plan.step.cell(np.array([d[name][0]], dtype=np.float64))[0])
                 for d in pair]
        extra = (("reachable from a zero noise draw", _zero_noise_events(plan, cells)),)
    return Scenario(label, mech, params, cost, meta, pair, draw, once, extra_events=extra,
                    slow=not local)


def _zero_noise_events(plan: Any, cells: Sequence[float]) -> events.EventFn:
    """DIP's representation events (uniform reference: the release is g itself).

    For each neighbour's cell c: g in the range of W = c + 1, and whether some
    V = A/(z/2), A on the 2^-53 grid (the old construction's V when the noise
    is 0), gives g bit for bit through the noise step's own arithmetic.
    """
    step = plan.step
    half_zero = 0.5 * math.tanh(0.5 / step.scale)
    upper = plan.parametric.needs_upper_tail

    def g_of(t: float, v: FloatArray) -> FloatArray:
        return step._uniformize(np.full(v.shape, t), v.astype(np.float64), upper)[0]

    def fn(x: FloatArray) -> NDArray[np.bool_]:
        g = x[:, 0]
        out = []
        for c in cells:
            g0, g1 = g_of(c, np.zeros(1))[0], g_of(c, np.ones(1))[0]
            lo, hi = min(g0, g1), max(g0, g1)
            in_cell = (g >= lo) & (g <= hi)
            a_hat = np.rint((g - g0) / (g1 - g0) * half_zero * 2.0**53)
            reach = np.zeros(g.shape, dtype=bool)
            for k in range(-2, 3):
                a = np.clip(a_hat + k, 0.0, None) * 2.0**-53
                reach |= in_cell & (g_of(c, a / half_zero) == g)
            out += [in_cell & reach, in_cell & ~reach]
        return np.stack(out, axis=1)

    return fn


# --------------------------------------------------------------------------- metadata


def int_meta(n: int = 20, hi: int = 10) -> DatasetMeta:
    return DatasetMeta(n, {"x": ColumnMeta("x", "integer", bounds=(0, hi))})


def unit_meta(n: int) -> DatasetMeta:
    return DatasetMeta(n, {"x": ColumnMeta("x", "continuous", bounds=(0.0, 1.0))})


def category_meta(n: int = 20) -> DatasetMeta:
    return DatasetMeta(n, {"c": ColumnMeta("c", "categorical", categories=("a", "b", "c"))})


def functional_meta(n: int = 20, points: int = 50) -> DatasetMeta:
    grid = tuple(float(t) for t in np.linspace(0.0, 1.0, points))
    return DatasetMeta(n, {"f": ColumnMeta("f", "functional", grid=grid, norm_bound=1.0)})


def eps(value: int | Fraction, delta: Fraction | None = None) -> dict[str, Fraction]:
    out = {"epsilon": Fraction(value)}
    if delta is not None:
        out["delta"] = delta
    return out


COUNT = {"statistic": "count", "condition": {"column": "x", "op": "ge", "value": 5}}
MEAN = {"statistic": "mean", "column": "x"}
UNIFORM = {"kind": "parametric", "family": "uniform", "params": {"low": 0.0, "high": 1.0}}
#: the issue's large budgets: numpy's exponential is cut at 44.43 scale units, so a
#: one-coefficient release is not pure DP beyond ε = 44.43
TAIL_EPSILON = 45


# --------------------------------------------------------------------------- the audit


@dataclass
class Plan:
    """An entry's honest scenarios and its controls (family that must catch each)."""

    honest: list[Scenario]
    controls: list[tuple[str, Scenario]] = field(default_factory=list)


def audit_plan(plan: Plan, mechanism: str, notion: str, size: AuditSize, seed: int
               ) -> AuditReport:
    """Run every scenario; the report's bound is the scenario closest to failing."""
    outcomes = [evaluate(s, size, seed + 10 * i) for i, s in enumerate(plan.honest)]
    checks = [(fam, evaluate(s, size, seed + 1000 + 10 * i))
              for i, (fam, s) in enumerate(plan.controls)]
    worst = max(outcomes, key=lambda o: (o.gap, o.certified - o.scenario.charged))
    caught = all(o.caught_by(fam) for fam, o in checks)
    tried = sum(f.events_tried for o in outcomes for f in o.families)
    failing = [o.scenario.label for o in outcomes if not o.passed]
    w = worst.worst()
    def margin(fam: str) -> Callable[[Outcome], float]:
        return lambda o: o.family(fam).certified - o.scenario.charged

    closest = {fam: max(outcomes, key=margin(fam)) for fam in FAMILIES}
    by_family = ", ".join(f"{fam} {o.family(fam).certified:.3g}/{o.scenario.charged:.3g}"
                          for fam, o in closest.items())
    parts = [f"worst: {worst.scenario.label}: {w.family}: {w.what}",
             f"by family (certified/charged, closest scenario): {by_family}"]
    if failing:
        parts.append("FAILED: " + ", ".join(failing))
    for fam, o in checks:
        f = o.family(fam)
        mark = "caught" if o.caught_by(fam) else "NOT caught"
        gap = ", support gap" if f.gap else ""
        parts.append(f"control {o.scenario.label} [{fam}] {f.certified:.3g}{gap} {mark}")
    return AuditReport(
        mechanism=mechanism,
        notion=notion,
        events_tried=tried,
        certified=worst.certified,
        charged=worst.scenario.charged,
        passed=not failing,
        control_caught=caught,
        detail="; ".join(parts),
    )


def _laplace_plan() -> Plan:
    mech = registry.get("laplace")
    assert isinstance(mech, baselines.Baseline)
    meta = int_meta()
    hist = {"statistic": "histogram", "column": "c"}
    honest = [
        baseline_scenario("count eps=1", mech, COUNT, eps(1), meta),
        baseline_scenario("mean eps=1", mech, MEAN, eps(1), unit_meta(20)),
        baseline_scenario("histogram eps=1", mech, hist, eps(1), category_meta()),
        baseline_scenario(f"count eps={TAIL_EPSILON + 5}", mech, COUNT, eps(TAIL_EPSILON + 5),
                          meta),
        baseline_scenario(f"mean eps={TAIL_EPSILON}", mech, MEAN, eps(TAIL_EPSILON),
                          unit_meta(20)),
    ]
    over = controls.overspending(mech, 2)
    assert isinstance(over, baselines.Baseline)
    return Plan(honest, [
        ("interval", baseline_scenario("count, noise for 2 eps", over, COUNT, eps(1), meta)),
        ("tail", baseline_scenario(f"mean eps={TAIL_EPSILON}, truncated sampler",
                                   controls.TruncatedLaplace(), MEAN, eps(TAIL_EPSILON),
                                   unit_meta(20))),
        ("representation", float_laplace_scenario("sum, float Laplace (Mironov)",
                                                  {"statistic": "sum", "column": "x"},
                                                  eps(1), unit_meta(20))),
    ])


def _geometric_plan() -> Plan:
    mech = registry.get("geometric")
    assert isinstance(mech, baselines.Baseline)
    over = controls.overspending(mech, 2)
    assert isinstance(over, baselines.Baseline)
    return Plan([
        baseline_scenario("count eps=1", mech, COUNT, eps(1), int_meta()),
        baseline_scenario("mean eps=1", mech, MEAN, eps(1), int_meta()),
        baseline_scenario("sum eps=45", mech, {"statistic": "sum", "column": "x"},
                          eps(TAIL_EPSILON), int_meta(hi=1000)),
    ], [("interval", baseline_scenario("count, noise for 2 eps", over, COUNT, eps(1),
                                       int_meta()))])


def _gaussian_plan() -> Plan:
    mech = registry.get("gaussian")
    assert isinstance(mech, baselines.Baseline)
    over = controls.overspending(mech, 3)
    assert isinstance(over, baselines.Baseline)
    small = eps(1, Fraction(1, 100))
    return Plan([
        baseline_scenario("count eps=1 delta=1e-2", mech, COUNT, small, int_meta()),
        baseline_scenario("mean eps=1 delta=1e-5", mech, MEAN, eps(1, Fraction(1, 10**5)),
                          unit_meta(20)),
        baseline_scenario("histogram eps=1 delta=1e-2", mech,
                          {"statistic": "histogram", "column": "c"}, small, category_meta()),
    ], [("interval", baseline_scenario("count, noise for 3 eps", over, COUNT, small,
                                       int_meta()))])


def _dip_plan() -> Plan:
    mech = registry.get("dip")
    assert isinstance(mech, DipMechanism)
    coarse = {"columns": ["x"], "reference": UNIFORM, "resolution": 16}
    over = controls.overspending(mech, 3)
    assert isinstance(over, DipMechanism)
    return Plan([
        dip_scenario("public reference, resolution 16", mech, coarse, eps(1), unit_meta(2)),
        dip_scenario("public reference", mech, {"columns": ["x"], "reference": UNIFORM},
                     eps(1), unit_meta(2)),
        dip_scenario("dp reference", mech, {"columns": ["x"]}, eps(1), unit_meta(2)),
    ], [
        ("interval", dip_scenario("public reference, noise for 3 eps", over,
                                  {"columns": ["x"], "reference": UNIFORM}, eps(1),
                                  unit_meta(2))),
        ("representation", dip_scenario("resolution 16, old recycled-V noise step", mech,
                                        coarse, eps(1), unit_meta(2), old_step=True)),
    ])


def _function_plan(name: str, configs: Sequence[tuple[str, dict[str, Any], int]],
                   meta: DatasetMeta, factor: float, learned: bool) -> Plan:
    mech = registry.get(name)
    assert isinstance(mech, Priced)
    over = controls.overspending(mech, factor)
    assert isinstance(over, Priced)
    honest = [function_scenario(label, mech, raw, eps(e), meta) for label, raw, e in configs]
    label, raw, e = configs[0]
    family = "learned" if learned else "interval"
    return Plan(honest, [(family, function_scenario(f"{label}, noise for {factor:g} eps", over,
                                                    raw, eps(e), meta))])


def _pin_psi(raw: dict[str, Any], meta: DatasetMeta) -> dict[str, Any]:
    """ICLP's default tuning (ρ, J, η, ψ) depends on ε: pin it so the control differs in
    its noise only."""
    mech = registry.get("iclp.mean")
    plan: Any = mech._calibrated(mech.load_params(raw), Fraction(1), meta)  # type: ignore[attr-defined]
    sm = plan.smoothing
    return {**raw, "smoothing": {"psi": sm["psi"], "eta": sm["eta"]},
            "kernel": {"rho": sm["rho"]}, "max_components": sm["components"]}


def _ar_one_component() -> dict[str, Any]:
    """η = 10 and ψ with θ_1 = 0.7τ < τ < θ_2: J = 1, and ``ar_neighbours`` attains Δ."""
    mech = registry.get("iclp.ar")
    raw = {"column": "f", "smoothing": {"eta": 10.0, "psi": 1e-30}}
    plan: Any = mech._calibrated(mech.load_params(raw), Fraction(1),  # type: ignore[attr-defined]
                                 functional_meta())
    lam1 = float(plan.eig.values[0])
    return {"column": "f", "smoothing": {"eta": 10.0, "psi": 1.4 * lam1**5}}


def _gp_plan_audit() -> Plan:
    mech = registry.get("gp.adp")
    cls = type(mech)

    class Overspent(cls):  # type: ignore[valid-type,misc]
        """Noise for 4ε while claiming and charging ε."""

        def _gp_plan(self, params: Any, amounts: Any, meta: DatasetMeta) -> Any:
            more = {**amounts, "epsilon": Fraction(amounts["epsilon"]) * 4}
            return super()._gp_plan(params, more, meta)

    pinned = {"column": "f", "smoothing": {"psi": 0.01}}
    budget = eps(1, Fraction(1, 10**5))
    return Plan([
        gp_scenario("psi=0.01 eps=1 delta=1e-5", mech, pinned, budget, functional_meta()),
        gp_scenario("default eps=1 delta=1e-5", mech, {"column": "f"}, budget,
                    functional_meta()),
    ], [("learned", gp_scenario("psi=0.01, noise for 4 eps", Overspent(), pinned, budget,
                                functional_meta()))])


def _pin_kde(raw: dict[str, Any], meta: DatasetMeta) -> dict[str, Any]:
    """The KDE's default (h, η) depends on ε: pin it so the control differs in its noise
    only."""
    mech = registry.get("iclp.kde")
    plan: Any = mech._calibrated(mech.load_params(raw), Fraction(1), meta)  # type: ignore[attr-defined]
    sm = plan.smoothing
    return {**raw, "kernel": {"rho": sm["bandwidth_fraction"]}, "smoothing": {"eta": sm["eta"]}}


NOTION = "epsilon-DP"
PLANS: dict[str, Callable[[], Plan]] = {
    "laplace": _laplace_plan,
    "geometric": _geometric_plan,
    "gaussian": _gaussian_plan,
    "dip": _dip_plan,
    "iclp.mean": lambda: _function_plan("iclp.mean", [
        ("all components eps=1", _pin_psi({"column": "f"}, functional_meta()), 1),
        ("one component eps=1", {"column": "f", "max_components": 1}, 1),
        (f"one component eps={TAIL_EPSILON}", {"column": "f", "max_components": 1},
         TAIL_EPSILON),
    ], functional_meta(), 4, learned=True),
    "frl.mean": lambda: _function_plan("frl.mean", [
        ("one component eps=1", {"column": "f", "components": 1}, 1),
        ("default components eps=1", {"column": "f"}, 1),
        (f"one component eps={TAIL_EPSILON}", {"column": "f", "components": 1}, TAIL_EPSILON),
    ], functional_meta(), 2, learned=False),
    "iclp.kde": lambda: _function_plan("iclp.kde", [
        ("default (h, eta) at eps=1, pinned", _pin_kde({"column": "x"}, unit_meta(20)), 1),
        ("default eps=1", {"column": "x"}, 1)], unit_meta(20), 3, learned=True),
    "bernstein.kde": lambda: _function_plan("bernstein.kde", [
        ("default eps=1", {"column": "x"}, 1)], unit_meta(20), 8, learned=False),
    "iclp.ar": lambda: _function_plan("iclp.ar", [
        ("one component (theta_1 = 0.7 tau) eps=1", _ar_one_component(), 1),
        ("default eps=1", {"column": "f"}, 1),
    ], functional_meta(), 4, learned=True),
    "frl.kde": lambda: _function_plan("frl.kde", [
        ("default eps=1", {"column": "x", "components": 8}, 1)], unit_meta(20), 3,
        learned=True),
    "bernstein.mean": lambda: _function_plan("bernstein.mean", [
        ("lattice 4 eps=1", {"column": "f", "lattice_size": 4}, 1),
        ("default eps=1", {"column": "f"}, 1)], functional_meta(), 3, learned=True),
    "gp.adp": _gp_plan_audit,
}


# --------------------------------------------------------------------------- issue 20: tables,
# quantiles and moments of the baselines (one block: each baseline's plan gains honest
# scenarios; its controls stay those above)


def _extended_neighbours(params: Mapping[str, Any], meta: DatasetMeta,
                         same_cell: bool = False) -> tuple[Data, Data]:
    """Worst cases from the sensitivity analyses in ``tables`` and ``moments``.

    Tables: record 0 moves from the first cell to the last one, at the end of largest
    magnitude (the others in the first cell at lo), or with ``same_cell`` stays in the
    first cell and moves from lo to hi (a sum's worst case in L2 when (hi − lo)² >
    2·max(|lo|, |hi|)², e.g. 3² > 2·2² on [−1, 2]; ``extended_scenario`` takes whichever
    attains the calibrated sensitivity); moments: every column's record 0 at lo vs hi (the
    others at lo); quantiles: the same, the others spread over [lo, hi].
    """
    numeric = [params["column"]] if "column" in params else list(params.get("columns", ()))
    base: Data = {}
    for name in numeric:
        col = meta.columns[name]
        lo, hi = col.bounds or (0.0, 1.0)
        base[name] = _fill(col, meta.n_rows, lo)
    other = {k: v.copy() for k, v in base.items()}
    if "group_by" in params:
        for name in params["group_by"]:
            col = meta.columns[name]
            base[name] = np.zeros(meta.n_rows, dtype=np.int64)
            other[name] = base[name].copy()
            other[name][0] = 0 if same_cell else len(col.categories or ()) - 1
        for name in numeric:
            lo, hi = meta.columns[name].bounds or (0.0, 1.0)
            if same_cell:
                base[name][0], other[name][0] = lo, hi
            else:
                base[name][0] = other[name][0] = lo if abs(lo) >= abs(hi) else hi
    else:
        for name in numeric:
            lo, hi = meta.columns[name].bounds or (0.0, 1.0)
            if "quantiles" in params:  # spread: the move shifts every rank in between
                base[name] = np.linspace(lo, hi, meta.n_rows)
                other[name] = base[name].copy()
            base[name][0], other[name][0] = lo, hi
    return base, other


def extended_scenario(label: str, mech: baselines.Baseline, raw: Mapping[str, Any],
                      budget: Mapping[str, Fraction], meta: DatasetMeta) -> Scenario:
    """A cross-tab (its counts and sums: the means are post-processing of them), a
    covariance triangle or a variance, drawn vectorised; a quantile, by full runs."""
    from mechanisms.dp import moments, tables

    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    plan = baselines.extended_plan(mech.name, params, cost, meta)
    pair = _extended_neighbours(params, meta)
    if isinstance(plan, tables.TablePlan):
        pairs = [pair, _extended_neighbours(params, meta, same_cell=True)]
        pair = max(pairs, key=lambda p: sum(a / c for a, c in _table_moves(plan, p)))
        for attained, calibrated in _table_moves(plan, pair):
            _check_attained(label, attained, calibrated)

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        result = mech.run(pair[which], params, cost, meta, rng).result
        if "counts" in result:
            return np.asarray(result["counts"] + result["sums"], dtype=np.float64)
        if "matrix" in result:
            m = np.asarray(result["matrix"], dtype=np.float64)
            return m[np.triu_indices(m.shape[0])]
        return np.asarray(result.get("values", [result.get("value")]), dtype=np.float64)

    if isinstance(plan, tables.TablePlan):
        table = plan
        exact = [table.exact(d) for d in pair]

        def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
            parts = []
            for name, part in (("count", table.count), ("sum", table.sum)):
                if part is not None:
                    noise = part.noise.sample(rng, runs * table.cells).reshape(runs, -1)
                    parts.append((exact[which][name][None, :] + noise) * part.grid)
            return np.concatenate(parts, axis=1).astype(np.float64)
    elif isinstance(plan, moments.MomentPlan):
        moment = plan
        lattice = [moment.exact(d) for d in pair]
        move = (lattice[1] - lattice[0]).astype(np.float64) * moment.grid
        deltas = [float(x) for x in moment.sensitivity]
        if moment.noise.kind == "discrete_gaussian":
            _check_attained(label, float(np.sqrt(np.sum(move**2))),
                            math.sqrt(sum(x * x for x in deltas)))
        else:
            _check_attained(label, float(np.sum(np.abs(move))), sum(deltas))

        def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
            d = lattice[which].size
            noisy = lattice[which][None, :] + moment.noise.sample(rng, runs * d).reshape(runs, d)
            if moment.statistic == "covariance":
                return noisy.astype(np.float64) * moment.grid
            values, inverse = np.unique(noisy[:, 0], return_inverse=True)
            released = [moment.release(np.array([v]))["value"] for v in values]
            return np.asarray(released, dtype=np.float64)[inverse.reshape(-1)][:, None]
    else:
        def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
            return np.stack([once(rng, which) for _ in range(runs)])

        return Scenario(label, mech, params, cost, meta, pair, draw, once, slow=True)
    return Scenario(label, mech, params, cost, meta, pair, draw, once)


def _check_attained(label: str, attained: float, calibrated: float) -> None:
    """A scenario's neighbours must move the statistic by the sensitivity its noise is
    calibrated for (up to the lattice's rounding allowance, below 2^-8 of it): a weaker
    pair would let a miscalibration pass the audit."""
    if not attained >= calibrated * (1 - 2**-8):
        raise AssertionError(f"{label}: the neighbours move the statistic by {attained:.6g},"
                             f" the noise is calibrated for {calibrated:.6g}")


def _table_moves(plan: Any, pair: tuple[Data, Data]) -> list[tuple[float, float]]:
    """Per part of a cross-tab: (how far ``pair`` moves it in its noise's norm, the
    sensitivity that noise is calibrated for), in statistic units."""
    exact = [plan.exact(d) for d in pair]
    out = []
    for part in (plan.count, plan.sum):
        if part is None:
            continue
        move = (exact[1][part.name] - exact[0][part.name]).astype(np.float64) * part.grid
        if part.noise.kind == "discrete_gaussian":
            out.append((float(np.sqrt(np.sum(move**2))), float(part.sensitivity_l2)))
        else:
            out.append((float(np.sum(np.abs(move))), float(part.sensitivity_l1)))
    return out


def _table_meta(n: int = 20) -> DatasetMeta:
    return DatasetMeta(n, {
        "a": ColumnMeta("a", "categorical", categories=("p", "q")),
        "b": ColumnMeta("b", "categorical", categories=("r", "s")),
        "v": ColumnMeta("v", "continuous", bounds=(-1.0, 2.0)),
        "w": ColumnMeta("w", "continuous", bounds=(0.0, 1.0)),
        "k": ColumnMeta("k", "integer", bounds=(-3, 5)),
    })


COUNT_TABLE = {"statistic": "count", "group_by": ["a", "b"]}
COVARIANCE = {"statistic": "covariance", "columns": ["v", "w"]}


def _extended(name: str) -> list[Scenario]:
    mech = registry.get(name)
    assert isinstance(mech, baselines.Baseline)
    meta = _table_meta()
    if name == "laplace":
        return [
            extended_scenario("count table 2x2 eps=1", mech, COUNT_TABLE, eps(1), meta),
            extended_scenario("mean table eps=1", mech, {"statistic": "mean", "column": "v",
                                                         "group_by": ["a"]}, eps(1), meta),
            extended_scenario("median, grid 11, eps=1", mech,
                              {"statistic": "quantile", "column": "w", "quantiles": [0.5],
                               "grid_size": 11}, eps(1), meta),
            extended_scenario("covariance eps=1", mech, COVARIANCE, eps(1), meta),
            extended_scenario("variance eps=1", mech, {"statistic": "variance", "column": "v"},
                              eps(1), meta),
        ]
    if name == "geometric":
        return [
            extended_scenario("sum table of an integer column eps=1", mech,
                              {"statistic": "sum", "column": "k", "group_by": ["a", "b"]},
                              eps(1), meta),
        ]
    small = eps(1, Fraction(1, 100))
    return [
        extended_scenario("count table 2x2 eps=1 delta=1e-2", mech, COUNT_TABLE, small, meta),
        extended_scenario("sum table eps=1 delta=1e-2", mech,
                          {"statistic": "sum", "column": "v", "group_by": ["b"]}, small, meta),
        extended_scenario("covariance eps=1 delta=1e-2", mech, COVARIANCE, small, meta),
    ]


def _with_extended(name: str, base: Callable[[], Plan]) -> Callable[[], Plan]:
    def plan() -> Plan:
        out = base()
        out.honest.extend(_extended(name))
        return out

    return plan


for _name in ("laplace", "geometric", "gaussian"):
    PLANS[_name] = _with_extended(_name, PLANS[_name])


@entry(*PLANS)
def audit_dp(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    """The DP audit of ``mechanism`` (see the module doc)."""
    notion = "(epsilon, delta)-DP" if mechanism in ("gaussian", "gp.adp") else NOTION
    return audit_plan(PLANS[mechanism](), mechanism, notion, size, seed)
