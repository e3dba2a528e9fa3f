"""The smallest budget whose stated interval (95 %) is within ± a target half-width.

An analyst often knows the accuracy she needs, not the ε that buys it. A mechanism's
accuracy statement is a function of public inputs and the budget only, so the budget
for a target is found by evaluating that statement: no data is read and nothing here
depends on it.

* **One reading of a statement** (``stated``): the largest half-width a mechanism's
  accuracy states for its released numbers, at 95 % or, for a table or covariance, at the
  ``confidence`` its params ask (``halfwidth``, ``halfwidths``; ``ci95_halfwidth``, per-entry
  ``ci95_halfwidths``, a function's ``band95`` or 1.96 × its RMS privacy error, per-column
  Chebyshev half-widths, 1.96 × a stated standard deviation of a released mean), or a
  deterministic ``max_error`` (level 1: always within, so within at 95 % too). It is the
  interval ``privrelease_client.reading`` draws (mechanisms import no client package:
  DESIGN §1; ``tests/unit/test_target.py`` holds the two equal).
* **One measure is searched** (``searched_measure``): the one a mechanism charges; on a
  zcdp dataset a Gaussian's ρ; for an (ε, δ) mechanism ε, with δ held as the target
  gives it (``target.delta``). Other combinations are refused: one target can not pick
  among them.
* **The search** (``budget_for``): in whole ledger units of that measure, up to the
  largest amount the caller may ask for. The statement at the top is evaluated first
  (unreachable: refused, naming the best half-width); then from one whole unit of the
  measure (1.0) the budget is doubled or halved until the target is bracketed, then
  bisected to one unit: the answer meets the target and one ledger unit less does not.
  The points evaluated depend on public inputs only, at most ``MAX_EVALUATIONS`` of
  them, and the statement must not grow with the budget on them (else refused: the
  smallest budget would not be well defined). The check sees only those points: a
  statement that dips between two of them is not caught, and then the answer still
  meets the target with one unit less not meeting it, but a smaller budget inside the
  dip would too. Functional mechanisms whose design follows ε (components, η) are not
  monotone on some ranges and get refused there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from mechanisms import precompute, zcdp
from mechanisms.base import LEDGER_UNITS, MAX_EPSILON, DatasetMeta, Mechanism, MechanismInputError
from mechanisms.noiseless.mechanism import MAX_BITS

#: the level the mechanisms state intervals at (tables and covariance: any their params ask)
LEVEL = 0.95
#: the normal quantile of a two-sided 95 % interval (a stated standard deviation times this)
Z95 = 1.959963984540054
#: the most accuracy evaluations one search makes: the top, one whole unit, doublings to
#: the top and a bisection of the last doubling (ρ's 10**15 units from 10**12: 1 + 1 + 10
#: + 49; every other measure fewer)
MAX_EVALUATIONS = 64
#: the largest amount of each measure a mechanism accepts (others: the ledger's largest cap)
CEILINGS: dict[str, Fraction] = {"epsilon": MAX_EPSILON, "rho": zcdp.MAX_RHO,
                                 "noiseless_bits": MAX_BITS, "interval_leakage": Fraction(1),
                                 "delta": Fraction(1)}
DEFAULT_CEILING = Fraction(10**6)


class Unreachable(MechanismInputError):
    """No budget the caller may ask for meets the target (422 ``target_unreachable``)."""

    code = "target_unreachable"


@dataclass(frozen=True)
class Stated:
    """The half-width an accuracy statement gives every released number, and its level
    (0.95; 1.0 for a deterministic bound, which holds at 95 % too)."""

    half_width: float
    level: float


@dataclass(frozen=True)
class Target:
    """What the caller asks: every released number within ± ``half_width`` at ``level``;
    ``fixed``: amounts of other measures held as given (δ of an (ε, δ) mechanism)."""

    half_width: float
    level: float = LEVEL
    fixed: Mapping[str, Fraction] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    """The smallest budget meeting a target: ``budget`` (the searched ``measure`` on its
    ledger lattice, with the fixed amounts), its statement, how many evaluations it took."""

    measure: str
    budget: dict[str, Fraction]
    stated: Stated
    evaluations: int


# ------------------------------------------------------------------ reading a statement


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        x = float(value)
        return x if math.isfinite(x) else None
    return None


def _largest(values: Any) -> float | None:
    """The largest of a non-empty list of finite numbers, else None."""
    if not isinstance(values, list) or not values:
        return None
    numbers = [_number(v) for v in values]
    return None if any(v is None for v in numbers) else max(v for v in numbers if v is not None)


def band95(mechanism: str, accuracy: Mapping[str, Any]) -> float | None:
    """A released function's 95 % band: ``band95``, else 1.96 × the RMS privacy error per
    point (``expected_sq_l2_error``; a density's is integrated over the column's range,
    so per point it is divided by the range)."""
    band = _number(accuracy.get("band95"))
    if band is not None:
        return band
    mse = _number(accuracy.get("expected_sq_l2_error"))
    if mse is None or mse < 0:
        return None
    if mechanism.endswith(".kde"):
        kernel = accuracy.get("kernel")
        domain = kernel.get("domain") if isinstance(kernel, Mapping) else None
        if not isinstance(domain, list | tuple) or len(domain) != 2:
            return None
        lo, hi = _number(domain[0]), _number(domain[1])
        if lo is None or hi is None or not hi > lo:
            return None
        mse /= hi - lo
    return 1.96 * math.sqrt(mse)


def _per_column(columns: Any) -> float | None:
    """opm.mean: each column's Chebyshev half-width; lrm: 1.96 × each mean's noise sd."""
    if not isinstance(columns, Mapping) or not columns:
        return None
    blocks = list(columns.values())
    if not all(isinstance(b, Mapping) for b in blocks):
        return None
    chebyshev = _largest([b.get("ci95_halfwidth_chebyshev") for b in blocks])
    if chebyshev is not None:
        return chebyshev
    sd = _largest([b.get("mean_noise_sd") for b in blocks])
    return None if sd is None else Z95 * sd


def stated(mechanism: str, accuracy: Mapping[str, Any]) -> Stated | None:
    """The half-width ``accuracy`` states for every released number (the largest of
    several), or None when it states none in the statistic's units (a quantile's rank
    error, per-cell mean intervals that depend on the noisy counts, record-level designs,
    estimators chosen at release). A table or covariance states its intervals at the
    confidence its params ask (``confidence``: a level, per entry or simultaneous):
    ``halfwidth``/``halfwidths`` at that level. A std's or variance's ``result.interval``
    is narrower but read from the released value: the public bound is the one stated."""
    confidence = accuracy.get("confidence")
    if isinstance(confidence, Mapping):
        level = _number(confidence.get("level"))
        asked = _largest(accuracy.get("halfwidths"))
        if asked is None:
            asked = _number(accuracy.get("halfwidth"))
        return None if asked is None or level is None else Stated(asked, level)
    half = _largest(accuracy.get("ci95_halfwidths"))
    if half is None:
        half = _number(accuracy.get("ci95_halfwidth"))
    if half is None:
        half = band95(mechanism, accuracy)
    if half is None:
        half = _per_column(accuracy.get("columns"))
    if half is None:
        sd = _number(accuracy.get("mean_sd_bound"))
        half = None if sd is None else Z95 * sd
    if half is not None:
        return Stated(half, LEVEL)
    if accuracy.get("deterministic") is True:
        raw = accuracy.get("max_error")
        bound = _largest(raw) if isinstance(raw, list) else _number(raw)
        if bound is not None:
            return Stated(bound, 1.0)
    return None


# ------------------------------------------------------------------ what is searched


def searched_measure(mechanism: Mechanism, meta: DatasetMeta,
                     fixed: Mapping[str, Fraction]) -> str:
    """The one measure a target's search varies; the others must be in ``fixed``."""
    name, measures = mechanism.name, tuple(mechanism.measures)
    if meta.gaussian_accounting == "zcdp" and mechanism.zcdp_native:
        measures = ("rho",)  # a Gaussian on a zcdp dataset spends ρ alone
    if len(measures) == 1:
        if fixed:
            raise MechanismInputError(f"target.{sorted(fixed)[0]}",
                                      f"{name} spends only {measures[0]} here; a target holds"
                                      " no other measure fixed")
        return measures[0]
    if set(measures) == {"epsilon", "delta"}:
        if "delta" not in fixed:
            raise MechanismInputError("target.delta", f"{name} charges (epsilon, delta): give"
                                      " target.delta, the delta held fixed; epsilon is"
                                      " searched")
        extra = sorted(set(fixed) - {"delta"})
        if extra:
            raise MechanismInputError(f"target.{extra[0]}", f"{name} holds only delta fixed")
        return "epsilon"
    raise MechanismInputError("target", f"{name} charges {', '.join(measures)}: one target"
                              " can not choose among them; give a budget")


# ------------------------------------------------------------------ the search


class _Statement:
    """The stated half-width at ``u`` units of the searched measure, each point once;
    a budget the mechanism refuses (below its smallest) states nothing (infinite)."""

    def __init__(self, mechanism: Mechanism, params: Mapping[str, Any], meta: DatasetMeta,
                 measure: str, fixed: Mapping[str, Fraction], least: int = 1) -> None:
        self.mechanism, self.params, self.meta = mechanism, params, meta
        self.measure, self.fixed, self.least = measure, fixed, least
        self.seen: dict[int, Stated | None] = {}
        #: why the mechanism refused a budget (public words: its own message)
        self.refused: dict[int, str] = {}

    def budget(self, units: int) -> dict[str, Fraction]:
        return {**self.fixed, self.measure: Fraction(units, LEDGER_UNITS[self.measure])}

    def at(self, units: int) -> Stated | None:
        if units not in self.seen and units < self.least:
            self.seen[units] = None
            self.refused[units] = "below the smallest amount the ledger can charge"
        if units not in self.seen:
            if len(self.seen) >= MAX_EVALUATIONS:  # by construction never; a guard
                raise RuntimeError("target search exceeded its evaluation bound")
            try:
                _, accuracy = self.mechanism.price(self.params, self.budget(units), self.meta)
            except MechanismInputError as err:
                if not err.field.startswith(f"budget.{self.measure}"):
                    raise
                self.seen[units] = None
                self.refused[units] = err.message
            else:
                found = stated(self.mechanism.name, accuracy)
                if found is None:
                    raise MechanismInputError(
                        "target", f"{self.mechanism.name} states no interval for these params"
                        " (its accuracy gives no interval's half-width in the statistic's units);"
                        " give a budget")
                self.seen[units] = found
        return self.seen[units]

    def meets(self, units: int, half_width: float) -> bool:
        got = self.at(units)
        return got is not None and got.half_width <= half_width

    def check_monotone(self) -> None:
        """Refuse when the statement grows with the budget on the points evaluated."""
        points = sorted(self.seen.items())
        for (a, sa), (b, sb) in itertools.pairwise(points):
            wa = math.inf if sa is None else sa.half_width
            wb = math.inf if sb is None else sb.half_width
            if wb > wa:
                fa, fb = (float(Fraction(u, LEDGER_UNITS[self.measure])) for u in (a, b))
                raise MechanismInputError(
                    "target", f"{self.mechanism.name}'s stated half-width is not monotone in"
                    f" {self.measure} for these params (±{wa:.6g} at {fa:g}, ±{wb:.6g} at"
                    f" {fb:g}), so no smallest budget is well defined; give a budget")


def ceiling(measure: str) -> Fraction:
    """The largest amount of ``measure`` a mechanism accepts."""
    return CEILINGS.get(measure, DEFAULT_CEILING)


def budget_for(mechanism: Mechanism, params: Mapping[str, Any], meta: DatasetMeta,
               target: Target, cap: Fraction | None = None,
               least: Fraction | None = None) -> Found:
    """The smallest budget (whole ledger units of the searched measure) whose stated
    half-width is at most ``target.half_width``; ``cap``: the most of that measure the
    caller may ask for (the dataset's cap), besides the mechanism's own ceiling;
    ``least``: the least the ledger can charge of it (one unit unless, say, a pure ε is
    charged as ρ = ε²/2), a smaller amount counting as refused."""
    if not 0 < target.level < 1:
        raise MechanismInputError("target.level", "must be in (0, 1)")
    if not (math.isfinite(target.half_width) and target.half_width > 0):
        raise MechanismInputError("target.half_width", "must be a positive finite number")
    measure = searched_measure(mechanism, meta, target.fixed)
    per_one = LEDGER_UNITS[measure]
    most = ceiling(measure) if cap is None else min(cap, ceiling(measure))
    top = math.floor(most * per_one)
    if top < 1:
        raise Unreachable("target", f"the dataset's budgets allow no {measure}", measure=measure)
    floor = 1 if least is None else max(1, math.ceil(least * per_one))
    statement = _Statement(mechanism, params, meta, measure, target.fixed, floor)
    # every heavy part a search computes counts MAX_EVALUATIONS times against the limit
    with precompute.repeated(MAX_EVALUATIONS):
        units = _search(statement, top, per_one, target.half_width, target.level)
    statement.check_monotone()
    found = statement.at(units)
    assert found is not None
    return Found(measure, statement.budget(units), found, len(statement.seen))


def _search(statement: _Statement, top: int, per_one: int, half_width: float,
            level: float) -> int:
    """Whole units in [1, top]: the smallest meeting the target, given that ``top`` does."""
    best = _at_top(statement, top)
    if best.level not in (level, 1.0):  # a deterministic bound holds at any level
        tables = " (a table's or covariance's params.confidence.level asks another)"
        raise MechanismInputError("target.level", f"{statement.mechanism.name} states its"
                                  f" intervals at level {best.level:g} for these params;"
                                  f" ask for that level{tables}")
    if best.half_width > half_width:
        amount = Fraction(top, per_one)
        raise Unreachable("target", f"even the largest {statement.measure} allowed"
                          f" ({float(amount):g}) states ±{best.half_width:.6g}, more than the"
                          f" target ±{half_width:g}", measure=statement.measure,
                          best_half_width=best.half_width, largest=float(amount))

    def meets(units: int) -> bool:
        return statement.meets(units, half_width)

    # bracket (lo fails or is 0, hi meets) from one whole unit of the measure
    hi = min(per_one, top)
    if meets(hi):
        lo = hi // 2
        while lo >= 1 and meets(lo):
            hi, lo = lo, lo // 2
    else:
        lo = hi
        while True:
            hi = min(2 * lo, top)
            if meets(hi):
                break
            lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _at_top(statement: _Statement, top: int) -> Stated:
    """The statement at the largest budget allowed; a refusal there is the answer."""
    best = statement.at(top)
    if best is None:
        amount = float(Fraction(top, LEDGER_UNITS[statement.measure]))
        raise Unreachable("target", f"the largest {statement.measure} allowed ({amount:g}) is"
                          f" refused: {statement.refused[top]}", measure=statement.measure,
                          largest=amount)
    return best
