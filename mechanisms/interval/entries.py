"""Registry entries ``interval.*``: thin wrappers from params + metadata to a library design.

Everything the ledger needs is a function of params and public metadata: the
column's declared prior (``ColumnMeta.prior``; None = uniform on the bounds),
its bounds, and the anchor design. The charge is the upper confidence bound
on leakage 1 − τ from the fixed-seed coverage integrator, rounded up to the
ledger's unit (1e-12), per column (``interval_leakage:<column>``; additive,
Thm 4, whatever the column's history: ``composition.price`` proves it for designs chosen
after earlier outputs; the exact joint leakage is shown, not charged, ``priced``). With
``calibrate: true`` the design's free parameter (anchor scale, ring floor, or number
of rounds) is chosen so that the standalone charge meets the agreed budget.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from marshmallow import ValidationError
from numpy.typing import NDArray

from mechanisms import precompute
from mechanisms.base import (
    LEDGER_UNITS,
    Budget,
    Composed,
    DatasetMeta,
    MechanismInputError,
    Output,
    RecordMechanism,
    batch_columns,
    check_range,
    read_number,
)
from mechanisms.interval import anchors as anchor_laws
from mechanisms.interval import composition, coverage, schemas
from mechanisms.interval.coverage import (
    CalibrationError,
    Estimate,
    SelectiveAccount,
    calibrate_increasing,
    calibrate_scale,
    expected_coverage,
    integrate,
    ring_coverage,
    selective_account,
)
from mechanisms.interval.designs import (
    Canonical,
    IntervalMechanism,
    Progressive,
    Ring,
    Selective,
    clean,
)
from mechanisms.interval.priors import Prior, column_prior
from mechanisms.interval.ranges import Law
from mechanisms.interval.transforms import PushforwardLaw, Transform
from mechanisms.statistics import SCALE, Batch, Partial, Statistic, float_sums

MEASURE = "interval_leakage"
#: a row map's bytes per row for each piece column beyond its design's measured width:
#: the column's four table arrays and the piece arithmetic's transients (64 measured by
#: ``tests/memory_probe.py`` for square with an exact range: three more columns)
PIECE_BYTES = 96.0
#: ledger unit of the measure (service/budget.py): charges are rounded up to it
LEDGER_UNIT = LEDGER_UNITS[MEASURE]
#: calibration searches anchor scales in this range, in units of the prior's SD
SCALE_RANGE = (0.05, 1000.0)
RING_FLOOR_MAX = 0.49
PRIVACY_UNIT = (
    "per record (local model): each row's value is released as a random range drawn"
    " independently of the other rows; n_rows public"
)

Design = IntervalMechanism | Selective | Progressive


@dataclass(frozen=True)
class Plan:
    """A resolved release: the design, its coverage, and what the ledger is charged."""

    kind: str
    column: str
    prior: Prior
    design: Design
    estimate: Estimate
    charge: Fraction
    fill: float
    m: int | None
    calibrated: dict[str, Any] | None = None
    notes: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- budget


def _amount(value: Any, field_name: str) -> Fraction:
    return check_range(read_number(value, field_name), MEASURE, Fraction(1), field_name)


def read_leakage(budget: Budget, column: str, name: str) -> Fraction:
    """The agreed leakage: ``interval_leakage`` (or ``interval_leakage:<column>``) only."""
    own = f"{MEASURE}:{column}"
    extra = sorted(set(budget) - {MEASURE, own})
    if extra:
        raise MechanismInputError("budget", f"{name} spends only {MEASURE}; got {', '.join(extra)}")
    if own in budget:
        return _amount(budget[own], f"budget.{own}")
    if MEASURE not in budget:
        raise MechanismInputError(f"budget.{MEASURE}", f"{name} needs an {MEASURE} budget")
    return _amount(budget[MEASURE], f"budget.{MEASURE}")


def _charge(estimate: Estimate) -> Fraction:
    """Upper leakage bound rounded up to the ledger unit (exact, never below the bound)."""
    return Fraction(math.ceil(Fraction(estimate.leakage_bound) * LEDGER_UNIT), LEDGER_UNIT)


# --------------------------------------------------------------------------- resolution

#: the designs ``plan`` resolves (each entry's ``kind``)
KINDS = ("case1", "case2", "casek", "ring", "selective", "progressive")


def plan(kind: str, params: Mapping[str, Any], meta: DatasetMeta,
         target: Fraction | None = None) -> Plan:
    """Resolve params against the metadata (cached: cost, accuracy and run agree). An
    unknown ``kind`` is refused: the resolution below would otherwise read it as Case I."""
    if kind not in KINDS:
        raise MechanismInputError(
            "kind", f"unknown interval design {kind!r}; known: {', '.join(KINDS)}")
    column = meta.column(params["column"])
    key = json.dumps(
        {"params": params, "column": [column.name, column.type, column.bounds, column.prior]},
        sort_keys=True, default=str)
    cache_key = (kind, key, None if target is None else str(target))
    hit = _PLANS.get(cache_key)
    if hit is None:
        hit = _shared_resolve(kind, key, params, meta, target)
        while len(_PLANS) >= _PLAN_CACHE_SIZE:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[cache_key] = hit
        if target is not None:
            # calibration is a fixed point: calibrating to the charge gives this same plan,
            # which is what accuracy() and run() do (they see the cost, not the budget)
            _PLANS[(kind, key, str(hit.charge))] = hit
    return hit


#: resolved plans by (kind, params + column metadata, target): cost, accuracy and run of one
#: request resolve the same design once (calibration runs the integrator dozens of times)
_PLANS: dict[tuple[str, str, str | None], Plan] = {}
_PLAN_CACHE_SIZE = 256


# ------------------------------------------------ heavy results shared across processes

#: the code whose output the shared cache holds (this package, and the base classes):
#: any change to it is a new key space
_CODE = precompute.code_fingerprint(
    [*Path(__file__).parent.glob("*.py"), Path(__file__).parents[1] / "base.py"])


class _Memo:
    """The heavy intermediate results of one resolution, by label: recorded (JSON-able)
    when the plan is computed cold, replayed when another process already computed it,
    so a warm resolution only rebuilds the (cheap) design objects around them."""

    def __init__(self, known: Mapping[str, Any] | None = None) -> None:
        self.known = known or {}
        self.record: dict[str, Any] = {}

    def __call__(self, label: str, compute: Callable[[], Any],
                 encode: Callable[[Any], Any] = float,
                 decode: Callable[[Any], Any] = float) -> Any:
        value = decode(self.known[label]) if label in self.known else compute()
        self.record[label] = encode(value)
        return value


def _enc_estimate(e: Estimate) -> list[float]:
    return [e.value, e.se]


def _dec_estimate(raw: Any) -> Estimate:
    return Estimate(float(raw[0]), float(raw[1]))


def _enc_account(a: SelectiveAccount) -> dict[str, Any]:
    return {"refined": _enc_estimate(a.refined), "per_output": _enc_estimate(a.per_output),
            "null_probability": a.null_probability, "collect_floor": a.collect_floor,
            "null_ratio": a.null_ratio}


def _dec_account(raw: Any) -> SelectiveAccount:
    return SelectiveAccount(
        refined=_dec_estimate(raw["refined"]), per_output=_dec_estimate(raw["per_output"]),
        null_probability=float(raw["null_probability"]),
        collect_floor=float(raw["collect_floor"]), null_ratio=float(raw["null_ratio"]))


#: coverage integrand points per evaluation (coverage.REPLICATES scrambled nets)
_POINTS = coverage.REPLICATES * 2**coverage.LOG2_POINTS
#: coverage evaluations of a calibration: the scale's coarse grid and bisection on its
#: log-grid; the ring's 2 ends and 16 bisection bits
_SCALE_EVALS = 14 + math.ceil(math.log2(
    math.log(SCALE_RANGE[1] / SCALE_RANGE[0]) / 1e-4 / 13))
_RING_EVALS = 2 + 16


def _work(kind: str, params: Mapping[str, Any]) -> tuple[str, float]:
    """The parameter that drives the cost computation, and its work: coverage evaluations
    × integrand points × ranges per point (public inputs only; see precompute.check_work).
    The largest the schemas allow (selective, casek, m = 64, calibrated) is about 2.4e8."""
    calibrate = bool(params.get("calibrate"))
    if kind == "progressive":
        evals = 1 + (schemas.MAX_ROUNDS if calibrate else 0)
        return "params.rounds", float(evals * _POINTS * (int(params["rounds"]) + 1))
    base = params["base"] if kind == "selective" else kind
    m = {"case1": 2, "case2": 3, "ring": 2}.get(base, int(params.get("m", 2)))
    evals = 1 + ((_RING_EVALS if base == "ring" else _SCALE_EVALS) if calibrate else 0)
    if kind == "selective":
        evals *= 2  # collection probability and the account, per evaluation
    name = "params.m" if "m" in params else "params.calibrate" if calibrate else "params"
    return name, float(evals * _POINTS * m)


def _shared_resolve(kind: str, key: str, params: Mapping[str, Any], meta: DatasetMeta,
                    target: Fraction | None) -> Plan:
    """``_resolve`` through the precompute store: its heavy results (calibrated parameter,
    coverage estimates, and a refusal) are computed once by any process, behind the
    service's gate, and replayed by the others."""
    precompute.check_work(*_work(kind, params))
    cold: list[Plan] = []

    def compute() -> dict[str, Any]:
        memo = _Memo()
        try:
            cold.append(_resolve(kind, params, meta, target, memo))
        except MechanismInputError as err:  # a refusal costs the same work: keep it too
            return {"error": [err.field, err.message]}
        return {"memo": memo.record}

    entry = precompute.cached(
        precompute.key("interval.plan", _CODE, [kind, key, None if target is None
                                                 else str(target)]),
        compute, precompute.encode_json, precompute.decode_json)
    if "error" in entry:
        raise MechanismInputError(str(entry["error"][0]), str(entry["error"][1]))
    if cold:
        return cold[0]
    return _resolve(kind, params, meta, target, _Memo(entry["memo"]))


def _resolve(kind: str, params: Mapping[str, Any], meta: DatasetMeta,
             target: Fraction | None, memo: _Memo | None = None) -> Plan:
    memo = memo or _Memo()
    column = meta.column(params["column"])
    prior = column_prior(column)
    support = prior.support
    transform = Transform(params["transform"])
    if transform.name == "log" and not support[0] > 0:
        raise MechanismInputError(
            "params.transform", f"log needs column {column.name!r} to have a positive lower bound")
    g_law: Any = prior
    if not transform.identity:
        g_law = PushforwardLaw(prior, transform,
                               transform.checked_image(*support, column.name))
    fill = support[0] if math.isfinite(support[0]) else prior.median
    calibrate = bool(params.get("calibrate"))
    if calibrate and target is None:
        raise MechanismInputError("params.calibrate", "calibration needs a leakage budget")

    def finish(design: Design, estimate: Estimate, m: int | None,
               calibrated: dict[str, Any] | None = None, charge: Fraction | None = None,
               **notes: Any) -> Plan:
        own = _charge(estimate)
        return Plan(kind, column.name, prior, design, estimate,
                    own if charge is None else max(own, charge), fill, m, calibrated, notes)

    if kind == "progressive":
        return _progressive(params, prior, support, target, finish, memo)
    if kind == "ring" or (kind == "selective" and params["base"] == "ring"):
        make: Callable[[float], IntervalMechanism] = lambda tau: IntervalMechanism(  # noqa: E731
            Ring(g_law, tau), transform, support)
        free_name, free_default = "tau_floor", params.get("tau_floor", 0.25)
        increasing = True
        m = 2
    else:
        m = {"case1": 2, "case2": 3}.get(kind if kind != "selective" else params["base"],
                                         params.get("m", 2))
        dist = _anchor_law(params, g_law, column.name)
        offsets = tuple(params["offsets"]) if params.get("offsets") else None
        exact_cells = tuple(sorted(set(params.get("exact_cells", ()))))
        exact_range = tuple(params["exact_range"]) if params.get("exact_range") else None
        make = lambda scale: IntervalMechanism(  # noqa: E731
            Canonical(dist if scale <= 0 else dist.with_scale(scale), m, offsets), transform,
            support, exact_cells, exact_range)
        free_name, free_default = "scale", 0.0  # 0: keep the law as given
        increasing = False
    if kind == "selective":
        return _selective(params, prior, make, free_name, free_default, increasing, target,
                          g_law, m, finish, memo)

    def leakage(x: float) -> float:
        return _charge_float(_coverage(make(x), prior))

    free = free_default
    calibrated = None
    if calibrate:
        assert target is not None
        free = memo("free", lambda: _calibrate(leakage, float(target), free_name, increasing,
                                                 g_law))
        calibrated = {free_name: free}
    design = make(free)
    return finish(design, memo("estimate", lambda: _coverage(design, prior), _enc_estimate,
                               _dec_estimate), m, calibrated)


def _coverage(design: IntervalMechanism, prior: Prior) -> Estimate:
    """τ of a partition mechanism; the ring on a continuous prior has a closed form."""
    part = design.partition
    if (isinstance(part, Ring) and design.transform.identity and not prior.integer
            and part.law is prior):
        return Estimate(ring_coverage(part.tau_floor), 0.0)
    return expected_coverage(design, prior)


def _charge_float(estimate: Estimate) -> float:
    return float(_charge(estimate))


def _calibrate(leakage: Callable[[float], float], target: float, name: str, increasing: bool,
               g_law: Any) -> float:
    try:
        if increasing:
            return calibrate_increasing(leakage, target, 0.0, RING_FLOOR_MAX)
        unit = float(g_law.sd)
        return calibrate_scale(leakage, target, SCALE_RANGE[0] * unit, SCALE_RANGE[1] * unit)
    except CalibrationError as err:
        raise MechanismInputError(f"budget.{MEASURE}", f"{err} ({name})") from None


def _anchor_law(params: Mapping[str, Any], g_law: Any, column: str) -> anchor_laws.AnchorDist:
    spec = params.get("anchors") or {"family": "logistic"}
    if spec["family"] == "optimal":
        try:
            return anchor_laws.optimal(g_law, spec["functional"])
        except ValueError as err:
            raise MechanismInputError("params.anchors", str(err)) from None
    return anchor_laws.from_spec(spec, float(g_law.median), float(g_law.sd))


def _selective(params: Mapping[str, Any], prior: Prior, make: Callable[[float], Any],
               free_name: str, free_default: float, increasing: bool, target: Fraction | None,
               g_law: Any, m: int, finish: Callable[..., Plan], memo: _Memo) -> Plan:
    tau = float(params["tau"])

    def build(x: float) -> tuple[Selective, float]:
        base = make(x)
        probe = Selective(base, tau, 1.0, prior)
        collect = integrate(lambda q: probe.collect_integrand(q, prior), probe.dims)
        # ρ <= P(L >= τ) (Prop 2); the default takes the lower confidence bound
        p_low = max(0.0, collect.value - 5.5 * collect.se - 1e-9)
        rho = params.get("rho", p_low)
        return Selective(base, tau, rho, prior), p_low

    def leakage(x: float) -> float:
        design, p_low = build(x)
        if p_low <= 0:
            return 1.0
        return _charge_float(selective_account(design, prior).charged)

    free, calibrated = free_default, None
    if params.get("calibrate"):
        assert target is not None
        free = memo("free", lambda: _calibrate(leakage, float(target), free_name, increasing,
                                                 g_law))
        calibrated = {free_name: free}
    p_low = memo("p_low", lambda: build(free)[1])
    design = Selective(make(free), tau, params.get("rho", p_low), prior)  # = build(free)[0]
    if p_low <= 0:
        raise MechanismInputError("params.tau", "no range of this design reaches coverage tau")
    if design.rho > p_low:
        raise MechanismInputError(
            "params.rho", f"rho must be at most P(L >= tau) = {p_low:.6g} (Prop 2: otherwise a"
            " null reveals that the range was too narrow)")
    account = memo("account", lambda: selective_account(design, prior), _enc_account,
                   _dec_account)
    return finish(design, account.charged, m, calibrated, collect_probability=p_low,
                  rho=design.rho, null_probability=account.null_probability,
                  null_posterior_ratio_bound=account.null_ratio,
                  null_coverage_counted=account.null_coverage,
                  leakage_per_output=account.per_output.leakage,
                  leakage_post_processing=account.refined.leakage)


def _progressive(params: Mapping[str, Any], prior: Prior, support: tuple[float, float],
                 target: Fraction | None, finish: Callable[..., Plan], memo: _Memo) -> Plan:
    if not all(math.isfinite(b) for b in support):
        raise MechanismInputError(
            "params.column", "progressive narrowing needs a column with finite bounds")

    def make(rounds: int) -> Progressive:
        return Progressive(support, rounds, float(params["tau_stop"]), prior)

    rounds, calibrated, charge = int(params["rounds"]), None, None
    if params.get("calibrate"):
        assert target is not None
        # Leakage grows with the rounds, but once stopping has ended every record the
        # estimates only differ by integration noise; charging the running maximum makes
        # the sequence monotone, so calibrating again to the charge returns the same rounds.
        def search() -> tuple[int, Fraction] | None:
            best, running = None, Fraction(0)
            for r in range(1, schemas.MAX_ROUNDS + 1):
                running = max(running, _charge(expected_coverage(make(r), prior)))
                if running > target:
                    break
                best = (r, running)
            return best

        found = memo("rounds", search, lambda b: None if b is None else [b[0], str(b[1])],
                     lambda raw: None if raw is None else (int(raw[0]), Fraction(raw[1])))
        if found is None:
            raise MechanismInputError(f"budget.{MEASURE}",
                                      "even one round leaks more than the budget")
        rounds, charge = found
        calibrated = {"rounds": rounds}
    design = make(rounds)
    return finish(design, memo("estimate", lambda: expected_coverage(design, prior),
                               _enc_estimate, _dec_estimate), None, calibrated, charge)


# --------------------------------------------------------------------------- statements


def _describe(p: Plan) -> dict[str, Any]:
    out = p.design.describe()
    out["kind"] = p.kind
    return _json_safe(out)


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _accuracy(p: Plan) -> dict[str, Any]:
    tau = p.estimate.value
    out: dict[str, Any] = {
        "expected_coverage": tau,
        "coverage_se": p.estimate.se,
        "leakage": 1.0 - tau,
        "leakage_charged": float(p.charge),
        "prior": _json_safe(p.prior.describe()),
        "design": _describe(p),
    }
    if p.m is not None:
        out["coverage_lower_bound"] = 1.0 / p.m
    if isinstance(p.design, IntervalMechanism) and isinstance(p.design.partition, Ring):
        out["per_record_floor"] = p.design.partition.tau_floor
    if p.calibrated:
        out["calibrated"] = _json_safe(p.calibrated)
    out.update(_json_safe(p.notes))
    if isinstance(p.design, Selective):
        out["per_record_floor"] = p.design.tau
    if p.prior.integer and "per_record_floor" in out:
        out["floor_note"] = (
            "integer column: the floor holds for the continuous latent prior; rounding to"
            " integers can move an individual coverage slightly below it")
    out["statement"] = (
        f"Under the declared prior of {p.column!r}, a released range holds on average"
        f" {tau:.2%} of the prior mass (expected coverage; leakage {1 - tau:.4g}). Every"
        " range contains the true value; estimates from the ranges (NPMLE, moments,"
        " regression) are free post-processing."
    )
    if isinstance(p.design, Selective):
        out["statement"] = (
            f"Under the declared prior of {p.column!r}, the expected coverage counted is"
            f" {tau:.2%} (leakage {1 - tau:.4g}): a collected range at its prior mass, a null"
            " at 1/(its largest posterior/prior ratio), or rho times the base design's"
            " leakage if that is larger. Every collected range contains the true value."
        )
    return out


def _guarantee(p: Plan) -> str:
    text = (
        f"interval privacy (Ding & Ding 2022, Def. 1) on column {p.column!r}: each released"
        " range contains the true value, and the posterior of a record given its released"
        " range is the declared prior restricted to the range; expected coverage"
        f" {p.estimate.value:.4f} under the declared prior, leakage at most"
        f" {float(p.charge):.6g} on {MEASURE}:{p.column} (additive across releases, Thm 4,"
        " also for designs chosen after earlier outputs: the ledger charges this; the"
        " column's exact joint leakage in the privacy block is information only);"
        f" {PRIVACY_UNIT};"
        " prior-relative, not epsilon-DP"
    )
    if isinstance(p.design, Selective):
        ratio = float(p.notes["null_posterior_ratio_bound"])
        text += (
            "; selective collection: Def. 1 holds for the collected ranges only. A null is"
            " NOT Def. 1: P(null | value) depends on the value, so its posterior is the"
            " prior reweighted (posterior/prior ratio up to"
            f" {ratio:.4g}), not a restricted prior; the charge counts each null as"
            f" coverage 1/{ratio:.4g} (its largest posterior/prior ratio) and is never below"
            " rho times the base design's leakage (the output is post-processing of"
            " releasing the base range with probability rho). Nulls are ignorable in"
            " Prop. 2's sense (P(W=0 | null) >= 1/2) because rho <= P(L >= tau)"
        )
    if isinstance(p.design, Progressive) and p.design.tau_stop > 0:
        text += (
            "; system-side stopping is decided from the released range and the next drawn"
            " anchor only (stop when either side would hold prior mass below"
            f" {p.design.tau_stop:g}), never from the value, so stopped and null records keep"
            " Def. 1 and every released range holds prior mass >= tau_stop"
        )
    return text


# --------------------------------------------------------------------------- mechanisms


class Interval(RecordMechanism):
    """Shared cost/accuracy/run; subclasses name the kind and the schema. A row map: each
    record's range is drawn on its own, so the release runs in partitions."""

    record_level = True  # one output per record: the dataset's opt-in

    def charged_columns(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """Its one column's leakage: known before a (possibly cold) calibration."""
        return (f"{MEASURE}:{params['column']}",)

    measures = (MEASURE,)
    kind: ClassVar[str]

    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta) -> dict[
        str, Fraction
    ]:
        agreed = read_leakage(budget, params["column"], self.name)
        p = plan(self.kind, params, meta, agreed if params.get("calibrate") else None)
        if p.charge > agreed:
            raise MechanismInputError(
                f"budget.{MEASURE}",
                f"this design leaks up to {float(p.charge):.6g} (expected coverage"
                f" {p.estimate.value:.4f}) but the budget allows {float(agreed):.6g}; spread"
                " the anchors or use calibrate: true",
            )
        return {f"{MEASURE}:{p.column}": p.charge}

    def composition(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                    earlier: Callable[[], Sequence[Mapping[str, Any]]]) -> dict[str, Any] | None:
        """Additive and exact joint leakage of the column after this release (spec §1.7);
        see ``priced`` (the service charges through ``composed``)."""
        try:
            return composition_report(self.kind, params, cost, meta, earlier())
        except (MechanismInputError, precompute.Busy):  # display only: never refuse or wait
            return None

    def composed(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 earlier: Callable[[], Sequence[Mapping[str, Any]]]) -> Composed:
        """The charge on the column given its history (``priced``): the standalone cost,
        always (``composition.price``); the exact joint figure as information."""
        column = str(params["column"])
        measure = f"{MEASURE}:{column}"
        pricing, report = priced(self.kind, params, cost, meta, earlier())
        standalone = float(cost.get(measure, 0))
        privacy: dict[str, Any] = {
            "charged": pricing.charged, "measure": measure, "standalone": standalone,
            "charge": standalone, "reason": pricing.reason}
        if pricing.joint is not None:
            privacy["joint_leakage_bound"] = pricing.joint.leakage_bound
            privacy["note"] = composition.JOINT_NOTE
        return Composed({measure: Fraction(pricing.units, LEDGER_UNIT)}, report, privacy)

    def _plan(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta) -> Plan:
        charged = read_leakage(cost, params["column"], self.name)
        p = plan(self.kind, params, meta, charged if params.get("calibrate") else None)
        if p.charge > charged:
            raise MechanismInputError(f"budget.{MEASURE}", "the cost does not cover this design")
        return p

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta) -> dict[
        str, Any
    ]:
        return _accuracy(self._plan(params, cost, meta))

    def map_bytes(self, params: Mapping[str, Any], meta: DatasetMeta) -> tuple[float, float]:
        """The measured figure (untransformed designs) plus ``PIECE_BYTES`` for each piece
        column an even transform or an exact range adds (``piece_width``, from params)."""
        ring = self.kind == "ring" or (self.kind == "selective" and params.get("base") == "ring")
        factor = (2 if params.get("transform", "identity") in ("square", "abs") else 1) * (
            2 if params.get("exact_range") else 1)
        return self.map_row_bytes + PIECE_BYTES * (2 if ring else 1) * (factor - 1), 0.0

    def fit(self, params: Mapping[str, Any], partial: Partial | None, cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Plan:
        return self._plan(params, cost, meta)

    def privatize(self, rows: Mapping[str, np.ndarray], start: int,
                  params: Mapping[str, Any], cost: Budget, meta: DatasetMeta, model: Any,
                  rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Each record's range on its own (the designs draw per record: anchors, then
        the assignment), in row order."""
        p: Plan = model
        y = clean(batch_columns(rows, [p.column])[p.column], p.prior.support, p.fill)
        release = p.design.release(y, rng)
        # the design's width, not the rows': every partition's table has the same columns
        release = dataclasses.replace(release, pieces=release.pieces.padded(p.design.piece_width))
        table = release.table(p.prior)
        if isinstance(p.design, Selective):
            # a null is not a restricted prior: show the coverage its charge counts
            table["coverage"] = np.where(release.released, table["coverage"],
                                         float(p.notes["null_coverage_counted"]))
        return table

    def summary(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                model: Any) -> Statistic:
        p: Plan = model
        return _Released(p.design.rounds if isinstance(p.design, Progressive) else None)

    def describe(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 model: Any, released: Partial | None) -> Output:
        p: Plan = model
        assert released is not None
        n = released.rows
        shown, exact = released.parts["counts"]
        columns = list(self.privatize({p.column: np.zeros(0)}, 0, params, cost, meta, p,
                                      np.random.default_rng(0)))  # the names: no rows, no draw
        result: dict[str, Any] = {
            "n": n,
            "column": p.column,
            "mechanism": self.name,
            "design": _describe(p),
            "prior": _json_safe(p.prior.describe()),
            "expected_coverage": p.estimate.value,
            "leakage_charged": float(p.charge),
            # the exact mean, rounded once
            "realized_mean_coverage": (released.parts["coverage"][0] / (n << SCALE)
                                       if n else None),
            "released": shown,
            "nulls": n - shown,
            "exact_reports": exact,
            "columns": columns,
            "convention": (
                "each range is the union of pieces (left, right]; left_closed/right_closed = 1"
                " marks a closed end; unused pieces are NaN; exact is NaN unless the value is"
                " reported exactly; released = 0 marks a null (selective) or no answered round;"
                " coverage is the range's prior mass (a selective null: the coverage its"
                " charge counts, 1/(largest posterior/prior ratio of a null))"
            ),
        }
        if p.calibrated:
            result["calibrated"] = _json_safe(p.calibrated)
        if isinstance(p.design, Progressive):
            result["rounds_histogram"] = list(released.parts["rounds"])
        return Output(result=result, accuracy=_accuracy(p), guarantee=_guarantee(p))



@dataclass(frozen=True)
class _Released(Statistic):
    """What an interval release's result says of its records, exactly: the sum of their
    coverage (units of 2**-SCALE), how many were released and reported exactly, and the
    rounds histogram of a progressive design (``rounds``: its most rounds)."""

    rounds: int | None

    @property
    def columns(self) -> tuple[str, ...]:
        return ("coverage", "released", "exact") + (("rounds",) if self.rounds else ())

    def sizes(self) -> Mapping[str, int]:
        return {"coverage": 1, "counts": 2,
                **({"rounds": self.rounds + 1} if self.rounds is not None else {})}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64] | Sequence[int]]:
        out: dict[str, NDArray[np.int64] | Sequence[int]] = {
            "coverage": float_sums(np.asarray(chunk["coverage"], dtype=np.float64)),
            "counts": np.array([int(np.count_nonzero(chunk["released"])),
                                int(np.count_nonzero(~np.isnan(chunk["exact"])))],
                               dtype=np.int64)}
        if self.rounds is not None:
            out["rounds"] = np.bincount(np.asarray(chunk["rounds"], dtype=np.int64),
                                        minlength=self.rounds + 1).astype(np.int64)
        return out


#: the exact joint figure is computed for at most this many releases of a column and this
#: many anchor dimensions in all (the joint QMC integral's size; bounded work per request);
#: beyond, the report says it is not available
MAX_COMPOSED_RELEASES = 8
MAX_COMPOSED_DIMS = 32
#: statuses of a release holding a reservation (its charge is not final)
_PENDING = ("queued", "running")


def _committed(e: Mapping[str, Any]) -> bool:
    """Its charge is final: succeeded, or failed after reading the data (charged)."""
    return e.get("status") == "succeeded" or (e.get("status") == "failed"
                                              and bool(e.get("charged")))


def _units(e: Mapping[str, Any], measure: str) -> int:
    """The ledger units the release holds on ``measure`` (its cost if units are absent)."""
    units = e.get("units")
    if units is not None:
        return int(units.get(measure, 0))
    return math.ceil(Fraction(e["cost"].get(measure, 0)) * LEDGER_UNIT)


def _held(e: Mapping[str, Any], measure: str, meta: DatasetMeta) -> composition.Held:
    """An earlier release as the pricing sees it; its design is None unless it resolves
    to an eligible canonical design (``composition.eligible``)."""
    design: Design | None = None
    name = str(e["mechanism"]).removeprefix("interval.")
    if name in ("case1", "case2", "casek"):
        try:
            earlier_params = schemas_for(name)().load(e["params"])
            target = Fraction(e["cost"].get(measure, 0)) if earlier_params.get(
                "calibrate") else None
            design = plan(name, earlier_params, meta, target).design
        except (MechanismInputError, ValueError, ValidationError):  # metadata changed?
            design = None
    return composition.Held(design if composition.eligible(design) else None,  # type: ignore[arg-type]
                            _units(e, measure))


def priced(kind: str, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
           earlier: Sequence[Mapping[str, Any]]) -> tuple[composition.Pricing,
                                                          dict[str, Any] | None]:
    """The ledger charge of this release given the column's history, and the report
    ``accuracy.composition`` shows (spec §1.7, §7.3; ``composition.price`` has the rule
    and the proof that it holds for adaptive designs).

    ``additive`` is the standalone bound (Thm 4: the column's holdings plus this one),
    what the ledger holds; ``exact`` the joint leakage of this release with the column's
    committed releases, information only (it holds for designs fixed in advance). The
    report is None when the column has no earlier release.
    """
    column = str(params["column"])
    measure = f"{MEASURE}:{column}"
    mine = plan(kind, params, meta, read_leakage(cost, column, kind)
                if params.get("calibrate") else None)
    standalone = math.ceil(mine.charge * LEDGER_UNIT)
    same = [e for e in earlier if str(e.get("mechanism", "")).startswith("interval.")
            and (e.get("params") or {}).get("column") == column]
    committed = [e for e in same if _committed(e)]
    pending = [e for e in same if e.get("status") in _PENDING]
    if any(e.get("status") == "truncated" for e in earlier):
        reason = ("charged the standalone bound (Thm 4, additive); no exact joint figure:"
                  " the dataset has too many releases to list them all")
        return (composition.Pricing(standalone, composition.ADDITIVE, reason),
                {"column": column, "additive": {"charge": float(mine.charge)},
                 "charged": composition.ADDITIVE, "charge": float(mine.charge),
                 "exact": {"available": False, "reason": reason}})
    pricing = composition.price(
        mine.design, standalone, [_held(e, measure, meta) for e in committed], mine.prior,
        max_releases=MAX_COMPOSED_RELEASES, max_dims=MAX_COMPOSED_DIMS)
    if not committed and not pending:
        return pricing, None
    held = sum((_units(e, measure) for e in (*committed, *pending)), 0)
    out: dict[str, Any] = {
        "column": column,
        "earlier_releases": len(committed) + len(pending),
        "committed_releases": len(committed),
        "pending_releases": len(pending),
        "already_charged": held / LEDGER_UNIT,
        "additive": {"charge": float(mine.charge),
                     "column_total": min(1.0, (held + standalone) / LEDGER_UNIT)},
        "charged": pricing.charged,
        "charge": pricing.units / LEDGER_UNIT,
        "reason": pricing.reason,
    }
    joint = pricing.joint
    if joint is None:
        out["exact"] = {"available": False, "reason": pricing.reason}
        return pricing, out
    out["exact"] = {
        "available": True,
        "joint_coverage": joint.value,
        "joint_leakage": joint.leakage,
        "joint_leakage_bound": joint.leakage_bound,
        "note": composition.JOINT_NOTE + "; pending releases are not in it",
    }
    return pricing, out


def composition_report(kind: str, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                       earlier: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The report of ``priced``: the column's leakage after this release, both ways."""
    return priced(kind, params, cost, meta, earlier)[1]


def schemas_for(name: str) -> type[Any]:
    return {"case1": schemas.Case1Schema, "case2": schemas.Case2Schema,
            "casek": schemas.CaseKSchema}[name]


class Case1(Interval):
    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 224.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 144.0
    map_fixed_bytes = 2 * 2**20
    name = "interval.case1"
    kind = "case1"
    params_schema = schemas.Case1Schema
    description = ("Interval privacy, Case I: each value is released as (-inf, U] or (U, inf)"
                   " for a random anchor U drawn independently of the data.")


class Case2(Interval):
    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 232.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 168.0
    map_fixed_bytes = 2 * 2**20
    name = "interval.case2"
    kind = "case2"
    params_schema = schemas.Case2Schema
    description = "Interval privacy, Case II: ranges cut by an ordered random anchor pair."


class CaseK(Interval):
    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 232.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 168.0
    map_fixed_bytes = 2 * 2**20
    name = "interval.casek"
    kind = "casek"
    params_schema = schemas.CaseKSchema
    description = ("Interval privacy, Case K: m random ranges (iid sorted anchors or a random"
                   " shift of fixed offsets), optional exact-report range A.")


class RingMechanism(Interval):
    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 352.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 240.0
    map_fixed_bytes = 2 * 2**20
    name = "interval.ring"
    kind = "ring"
    params_schema = schemas.RingSchema
    description = ("Interval privacy, ring topology: two ranges, each with prior coverage at"
                   " least tau_floor for every record.")


class SelectiveMechanism(Interval):
    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 224.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 144.0
    map_fixed_bytes = 2 * 2**20
    name = "interval.selective"
    kind = "selective"
    params_schema = schemas.SelectiveSchema
    description = ("Interval privacy, selective collection: keep a range only if its coverage"
                   " is at least tau (and a Bernoulli(rho) coin says so); otherwise a null.")


class ProgressiveMechanism(Interval):
    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 248.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 208.0
    map_fixed_bytes = 2 * 2**20
    name = "interval.progressive"
    kind = "progressive"
    params_schema = schemas.ProgressiveSchema
    description = ("Interval privacy, progressive narrowing: repeated Case-I questions with"
                   " anchors uniform on the current range.")


MECHANISMS: tuple[type[Interval], ...] = (
    Case1, Case2, CaseK, RingMechanism, SelectiveMechanism, ProgressiveMechanism)


def law_of(meta: DatasetMeta, column: str) -> Law:
    """The declared prior of a column (for analyses)."""
    return column_prior(meta.column(column))
