"""Adversarial audit entries of ``iclp.erm``, ``iclp.cov``, ``iclp.fos``, ``iclp.kde2d``.

Same harness as ``mechanisms.audit.dp`` (``Scenario``, ``Plan``, ``audit_plan``,
the overspending control): released lattice coefficients are drawn through
the plan's own noise (``draw``) and through ``run`` (``once``). Neighbours:
record 0 is replaced within a small public candidate set (extreme covariate /
response values, grid corners, curves along leading eigenfunctions) by the
pair whose lattice centres differ most under the claimed noise, Σ|c − c'|/b
(the ``density_neighbours`` rule of the 1-D KDE, generalised to several
columns); the other records sit at a fixed interior point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from mechanisms import registry
from mechanisms.audit import controls
from mechanisms.audit.dp import Data, FloatArray, Plan, Scenario, audit_plan, checked_cost, eps
from mechanisms.audit.entries import AuditReport, AuditSize, entry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.iclp.entries import MultiColumn

NOTION = "epsilon-DP"


def worst_pair(mech: MultiColumn, plan: Any, params: Mapping[str, Any],
               candidates: Sequence[Data]) -> tuple[Data, Data]:
    """The two candidate datasets whose lattice centres cost most under the claimed noise."""
    cols = mech.columns(params)
    centres = np.array([plan.noise.centre(mech.summary(plan, [d[c] for c in cols]))
                        for d in candidates], dtype=np.float64)
    scaled = centres / plan.noise.scales
    loss = np.abs(scaled[:, None, :] - scaled[None, :, :]).sum(axis=2)
    p, q = np.unravel_index(int(np.argmax(loss)), loss.shape)
    return candidates[int(p)], candidates[int(q)]


def scenario(label: str, mech: MultiColumn, raw: Mapping[str, Any],
             budget: Mapping[str, Fraction], meta: DatasetMeta,
             candidates: Sequence[Data], old_solver: bool = False) -> Scenario:
    """``old_solver`` (``iclp.erm``): record the work of the old early-exit solve
    (``controls.old_erm_solve``), the work family's control."""
    params = mech.load_params(raw)
    cost = checked_cost(mech, params, budget, meta)
    plan: Any = mech._calibrated(params, cost["epsilon"], meta)
    pair = worst_pair(mech, plan, params, candidates)
    cols = mech.columns(params)
    centres = [plan.noise.centre(mech.summary(plan, [d[c] for c in cols])) for d in pair]
    steps = plan.noise.steps

    def draw(rng: np.random.Generator, which: int, runs: int) -> FloatArray:
        units = centres[which] + plan.noise.sample(rng, runs)
        out: FloatArray = units.astype(np.float64) * steps
        return out

    def once(rng: np.random.Generator, which: int) -> FloatArray:
        result = mech.run(pair[which], params, cost, meta, rng).result
        return np.asarray(result["coefficients"], dtype=np.float64)

    def loss(v: FloatArray) -> FloatArray:
        out: FloatArray = plan.noise.privacy_loss(v / steps, centres[0], centres[1])
        return out

    draw_work = None
    if hasattr(plan, "solve_traced"):  # iclp.erm: its solver's work on each neighbour
        stats = [plan.bin_stats(*(d[c] for c in cols)) for d in pair]
        if old_solver:
            works = [controls.old_erm_solve(plan, *st)[1:] for st in stats]
        else:
            works = [(t.steps, t.evaluations)
                     for t in (plan.solve_traced(*st)[1] for st in stats)]

        def draw_work(rng: np.random.Generator, which: int, runs: int
                      ) -> tuple[FloatArray, FloatArray]:
            """The solve runs once per release on the neighbour's data: every run records
            its Newton steps and objective evaluations."""
            return draw(rng, which, runs), np.tile(np.asarray(works[which], dtype=np.float64),
                                                   (runs, 1))

    return Scenario(label, mech, params, cost, meta, pair, draw, once,
                    statistics=(("privacy-loss statistic of the claimed noise", loss),),
                    draw_work=draw_work)


def _plan(name: str, configs: Sequence[tuple[str, dict[str, Any], int]], meta: DatasetMeta,
          candidates: Callable[[], list[Data]], factor: float) -> Plan:
    mech = registry.get(name)
    assert isinstance(mech, MultiColumn)
    over = controls.overspending(mech, factor)
    assert isinstance(over, MultiColumn)
    data = candidates()
    honest = [scenario(label, mech, raw, eps(e), meta, data) for label, raw, e in configs]
    label, raw, e = configs[0]
    return Plan(honest, [("interval", scenario(f"{label}, noise for {factor:g} eps", over, raw,
                                              eps(e), meta, data))])


# --------------------------------------------------------------------------- datasets

N = 20
M = 12


def _grid() -> tuple[float, ...]:
    return tuple(float(t) for t in np.linspace(0.0, 1.0, M))


def erm_meta() -> DatasetMeta:
    return DatasetMeta(N, {"x": ColumnMeta("x", "continuous", bounds=(0.0, 1.0)),
                           "y": ColumnMeta("y", "continuous", bounds=(-1.0, 1.0)),
                           "b": ColumnMeta("b", "integer", bounds=(0, 1))})


def erm_candidates() -> list[Data]:
    out = []
    for x in np.linspace(0.0, 1.0, 6):
        for y in (-1.0, 1.0):
            d = {"x": np.full(N, 0.5), "y": np.zeros(N), "b": np.zeros(N, dtype=np.int64)}
            d["x"][0], d["y"][0], d["b"][0] = x, y, int(y > 0)
            out.append(d)
    return out


def curve_meta() -> DatasetMeta:
    return DatasetMeta(N, {"f": ColumnMeta("f", "functional", grid=_grid(), norm_bound=1.0),
                           "z": ColumnMeta("z", "continuous", bounds=(-1.0, 1.0))})


def curve_candidates() -> list[Data]:
    """Record 0: ±τ·(normalised) low-frequency shapes with z at ±1; others 0.3·τ flat."""
    t = np.linspace(0.0, 1.0, M)
    shapes = [np.ones(M), np.cos(np.pi * t), np.sin(np.pi * t), np.cos(2 * np.pi * t)]
    out = []
    for shape in shapes:
        unit = shape / np.sqrt(np.mean(shape * shape))
        for sign in (-1.0, 1.0):
            for z in (-1.0, 1.0):
                f = np.full((N, M), 0.3)
                f[0] = sign * unit
                zs = np.zeros(N)
                zs[0] = z
                out.append({"f": f, "z": zs})
    f = np.full((N, M), 0.3)
    f[0] = 0.0
    out.append({"f": f, "z": np.zeros(N)})
    return out


def kde2d_meta() -> DatasetMeta:
    return DatasetMeta(N, {"x": ColumnMeta("x", "continuous", bounds=(0.0, 1.0)),
                           "y": ColumnMeta("y", "continuous", bounds=(0.0, 1.0))})


def kde2d_candidates() -> list[Data]:
    out = []
    for x in (0.0, 0.5, 1.0):
        for y in (0.0, 0.5, 1.0):
            d = {"x": np.full(N, 0.5), "y": np.full(N, 0.5)}
            d["x"][0], d["y"][0] = x, y
            out.append(d)
    return out


def erm_work_pair() -> tuple[DatasetMeta, list[Data]]:
    """n = 40 records with a logistic response; D' moves record 0 to x = 1 and flips its
    response. At ψ = 10^-4 the old solve certified D at Newton step 6 and D' at 5."""
    rng = np.random.default_rng(2)
    n = 40
    x = rng.uniform(size=n)
    b = (rng.uniform(size=n) < x).astype(np.int64)
    x2, b2 = x.copy(), b.copy()
    x2[0], b2[0] = 1.0, 1 - b[0]
    meta = DatasetMeta(n, {"x": ColumnMeta("x", "continuous", bounds=(0.0, 1.0)),
                           "b": ColumnMeta("b", "integer", bounds=(0, 1))})
    return meta, [{"x": x, "b": b}, {"x": x2, "b": b2}]


ERM_WORK = {"covariate": "x", "response": "b", "loss": "logistic", "grid_size": 16,
            "smoothing": {"psi": 1e-4}}


def _erm_plan() -> Plan:
    plan = _plan("iclp.erm", [
        ("square loss eps=1", {"covariate": "x", "response": "y", "grid_size": 16}, 1),
        ("logistic eps=1", {"covariate": "x", "response": "b", "loss": "logistic",
                            "grid_size": 16}, 1),
    ], erm_meta(), erm_candidates, 8)
    mech = registry.get("iclp.erm")
    assert isinstance(mech, MultiColumn)
    meta, pair = erm_work_pair()
    plan.honest.append(scenario("logistic, psi=1e-4, neighbours certified at different"
                                " steps, eps=1", mech, ERM_WORK, eps(1), meta, pair))
    plan.controls.append(("work", scenario("logistic, psi=1e-4, old early-exit solve", mech,
                                           ERM_WORK, eps(1), meta, pair, old_solver=True)))
    return plan


PLANS: dict[str, Callable[[], Plan]] = {
    "iclp.erm": _erm_plan,
    "iclp.cov": lambda: _plan("iclp.cov", [
        ("centred eps=1", {"column": "f", "max_components": 4}, 1),
        ("second moment only eps=1", {"column": "f", "max_components": 4,
                                      "centred": False}, 1),
    ], curve_meta(), curve_candidates, 8),
    "iclp.fos": lambda: _plan("iclp.fos", [
        ("one covariate eps=1", {"response": "f", "covariates": ["z"]}, 1),
    ], curve_meta(), curve_candidates, 8),
    "iclp.kde2d": lambda: _plan("iclp.kde2d", [
        ("default eps=1", {"columns": ["x", "y"], "grid_size": 8}, 1),
    ], kde2d_meta(), kde2d_candidates, 8),
}


@entry(*PLANS)
def audit_functionals(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    """The DP audit of one of the ICLP functionals (see the module doc)."""
    return audit_plan(PLANS[mechanism](), mechanism, NOTION, size, seed)
