"""Exact per-record composition on a column (spec §1.7; issue #17 item 3)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from mechanisms import interval, registry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.interval import composition
from mechanisms.interval.service import LEDGER_UNIT, composition_report

from .conftest import LOGIS1, NORMAL, case1, rng


def test_two_logistic_case1_releases_match_the_spec() -> None:
    """Spec §1.7/§7.5.5: two independent Logis(1) Case-I releases on N(0, 1) have joint
    coverage 0.608 ± 0.005, leakage 0.392 <= the additive 0.479, and at least either
    release's own leakage."""
    d = case1()
    joint = composition.joint_coverage([d, d], NORMAL)
    single = interval.expected_coverage(d, NORMAL)
    assert joint.value == pytest.approx(0.608, abs=0.005)
    assert single.leakage < joint.leakage < 2 * single.leakage
    three = composition.joint_coverage([d, d, d], NORMAL)
    assert three.leakage > joint.leakage  # more cuts, less coverage


def test_realized_anchors_agree_and_repeats_add_nothing() -> None:
    """Conditioning on realized earlier anchors (n = 20,000) agrees with the design-level
    joint coverage within 4 SE; releasing the same anchors twice changes nothing (the
    additive bound would charge it again: spec pitfall 10)."""
    d = case1()
    g = rng(21)
    a = d.partition.sample(g, 20_000)
    given = composition.joint_coverage_given([a], d, NORMAL, rng(22))
    joint = composition.joint_coverage([d, d], NORMAL)
    assert abs(given.value - joint.value) < 4 * (given.se + joint.se)
    twice = composition.joint_coverage_given([a, a], d, NORMAL, rng(22))
    assert twice.value == pytest.approx(given.value, abs=1e-12)


def test_ineligible_designs_are_refused() -> None:
    ring = interval.IntervalMechanism(interval.Ring(NORMAL, 0.3))
    exact = interval.IntervalMechanism(interval.Canonical(LOGIS1, 3), exact_cells=(2,))
    for d in (ring, exact):
        assert not composition.eligible(d)
        with pytest.raises(ValueError, match="canonical"):
            composition.joint_coverage([case1(), d], NORMAL)


def test_exact_increment() -> None:
    """The joint bound rounded up to the unit, minus what was charged, never negative."""
    est = interval.Estimate(0.6, 0.0)
    bound = Fraction(est.leakage_bound).limit_denominator(10**15)
    inc = composition.exact_increment(est, Fraction(1, 4), LEDGER_UNIT)
    assert inc >= bound - Fraction(1, 4) and inc - (bound - Fraction(1, 4)) <= Fraction(
        1, LEDGER_UNIT) + Fraction(1, 10**14)
    assert composition.exact_increment(est, Fraction(1), LEDGER_UNIT) == 0


META = DatasetMeta(1000, {"x": ColumnMeta("x", "continuous", prior={"family": "normal",
                                                                    "loc": 0, "scale": 1}),
                          "z": ColumnMeta("z", "continuous", prior={"family": "normal",
                                                                    "loc": 0, "scale": 1})})
LOGIS = {"family": "logistic", "scale": 1}


def _earlier(name: str, raw: dict, status: str = "succeeded") -> dict:
    mech = registry.get(name)
    params = mech.load_params(raw)
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, META)
    return {"mechanism": name, "params": params, "status": status, "cost": cost}


def test_composition_report_shows_both() -> None:
    """A second Logis(1) Case-I on the column: additive charge 0.24 (column total 0.48)
    against the exact joint 0.392 (charge ≈ 0.153); a failed release does not count, a
    release of another column does not count, a ring makes exact unavailable, and with
    no earlier release there is nothing to show."""
    mech = registry.get("interval.case1")
    params = mech.load_params({"column": "x", "anchors": LOGIS})
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, META)
    first = _earlier("interval.case1", {"column": "x", "anchors": LOGIS})
    other = _earlier("interval.case1", {"column": "z", "anchors": LOGIS})
    failed = _earlier("interval.case1", {"column": "x", "anchors": LOGIS}, "failed")
    report = composition_report("case1", params, cost, META, [first, other, failed])
    assert report is not None and report["earlier_releases"] == 1
    assert report["additive"]["column_total"] == pytest.approx(2 * report["additive"]["charge"])
    exact = report["exact"]
    assert exact["available"] and exact["joint_coverage"] == pytest.approx(0.608, abs=0.005)
    assert exact["column_total"] == pytest.approx(exact["joint_leakage_bound"], abs=1e-9)
    assert exact["charge"] < report["additive"]["charge"] and exact["saving"] > 0.05
    assert report["charged"] == "exact_increment" and report["charge"] == exact["charge"]
    ring = _earlier("interval.ring", {"column": "x", "tau_floor": 0.3})
    no = composition_report("case1", params, cost, META, [first, ring])
    assert no is not None and not no["exact"]["available"] and "canonical" in no["exact"]["reason"]
    assert no["charged"] == "additive"
    assert composition_report("case1", params, cost, META, [other]) is None
    shown = mech.composition(params, cost, META, lambda: [first])
    assert shown is not None and shown["exact"]["available"]


def test_truncated_history_composes_nothing() -> None:
    """When the service could not list every earlier release, exact is not claimed and
    no column total is shown (it would miss charges)."""
    mech = registry.get("interval.case1")
    params = mech.load_params({"column": "x", "anchors": LOGIS})
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, META)
    first = _earlier("interval.case1", {"column": "x", "anchors": LOGIS})
    report = composition_report("case1", params, cost, META, [{"status": "truncated"}, first])
    assert report is not None and not report["exact"]["available"]
    assert "column_total" not in report["additive"]


# ----------------------------------------------------- the ledger's charge (composition.price)

UNIT = LEDGER_UNIT


def _standalone(d: interval.IntervalMechanism) -> int:
    return math.ceil(Fraction(interval.expected_coverage(d, NORMAL).leakage_bound) * UNIT)


def _price(new: object, committed: list, pending: list, **kw: int) -> composition.Pricing:
    limits = {"max_releases": 8, "max_dims": 32, **kw}
    return composition.price(new, _standalone(new), committed,  # type: ignore[arg-type]
                             pending, NORMAL, UNIT, **limits)


def test_price_second_release_is_the_exact_increment() -> None:
    """Two Logis(1) Case-I releases: the second is charged ⌈J·unit⌉ − s₁ exactly (J the
    joint bound, 0.392 + its margin), well below its standalone s₂ = s₁; with nothing
    committed the charge is standalone."""
    d = case1()
    s = _standalone(d)
    alone = _price(d, [], [])
    assert (alone.units, alone.charged) == (s, composition.ADDITIVE)
    p = _price(d, [composition.Held(d, s, False)], [])
    joint = composition.joint_coverage([d, d], NORMAL)
    assert p.charged == composition.EXACT_INCREMENT
    assert p.units == math.ceil(Fraction(joint.leakage_bound) * UNIT) - s
    assert p.units + s >= joint.leakage * UNIT and p.units < 0.7 * s
    assert p.already_units == s and p.joint == joint


def test_price_falls_back_to_additive_where_the_proof_needs_it() -> None:
    """Catches the concurrent-pair underpayment: a pending release charged an increment
    forces additive (two increments against one history would together pay less than the
    joint leakage); a pending standalone release does not. Ineligible designs (ring, exact
    reports), too many releases or anchors, and an increment not below standalone are
    additive; so is a new design that is itself ineligible."""
    d = case1()
    s = _standalone(d)
    done = composition.Held(d, s, False)
    inc = _price(d, [done], [])
    assert _price(d, [done], [composition.Held(d, inc.units, True)]).charged == "additive"
    assert _price(d, [done], [composition.Held(d, s, False)]).charged == "exact_increment"
    assert _price(d, [done, composition.Held(None, s, False)], []).charged == "additive"
    assert _price(d, [done], [composition.Held(None, s, False)]).charged == "additive"
    assert _price(d, [done, done], [], max_releases=2).charged == "additive"
    assert _price(d, [done], [], max_dims=1).charged == "additive"
    cheap = _price(d, [composition.Held(d, 0, False)], [])  # nothing charged before
    assert (cheap.charged, cheap.units) == ("additive", s)
    ring = interval.IntervalMechanism(interval.Ring(NORMAL, 0.3))
    assert composition.price(ring, 5, [done], [], NORMAL, UNIT, max_releases=8,
                             max_dims=32).charged == "additive"


def test_composed_charge_and_privacy_record() -> None:
    """``Mechanism.composed``: the charge on the column measure is the increment in exact
    ledger units, and the privacy record says what was charged and why; a pending
    increment makes it additive (the cost as is)."""
    mech = registry.get("interval.case1")
    params = mech.load_params({"column": "x", "anchors": LOGIS})
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, META)
    first = _earlier("interval.case1", {"column": "x", "anchors": LOGIS})
    got = mech.composed(params, cost, META, lambda: [first])
    assert got is not None and got.exact and got.column == "interval_leakage:x"
    charge = got.charge["interval_leakage:x"]
    assert charge.denominator <= UNIT and charge < cost["interval_leakage:x"]
    assert got.privacy["charged"] == "exact_increment" and got.report is not None
    assert got.privacy["charge"] == float(charge)
    busy = {**first, "status": "running", "incremental": True}
    more = mech.composed(params, cost, META, lambda: [first, busy])
    assert more is not None and not more.exact and more.charge == cost
    assert more.privacy["charged"] == "additive" and "pending" in more.privacy["reason"]
    failed = {**first, "status": "failed"}
    assert not mech.composed(params, cost, META, lambda: [failed]).exact  # type: ignore[union-attr]
    charged_fail = {**first, "status": "failed", "charged": True}
    assert mech.composed(params, cost, META, lambda: [charged_fail]).exact  # type: ignore[union-attr]


def test_stale_reservation_is_a_conflict_with_retry_after() -> None:
    """A reservation refused 'stale' (the column's history moved after pricing, retries
    used up) is answered 409 ``conflict`` with a Retry-After, for the API and a pricing
    job alike (``releases.refusal``)."""
    from service import releases
    from service.ledger import ReserveResult

    err = releases.refusal(ReserveResult("stale", measure="history:1:interval_leakage:x",
                                         remaining=3))
    assert err is not None and (err.status, err.code) == (409, "conflict")
    assert err.extra["retry_after"] == releases.CONFLICT_RETRY_AFTER
    assert "nothing was spent" in err.detail
