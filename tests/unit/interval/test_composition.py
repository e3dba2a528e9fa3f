"""Composition on a column (spec §1.7; issues #17 item 3, #27 item 2): the ledger charges
the additive standalone bound, which holds for adaptive designs; the exact joint leakage is
shown as information."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import interval, registry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.interval import composition
from mechanisms.interval.entries import LEDGER_UNIT, composition_report

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


def _extra_and_standalone(p: np.ndarray, inside: np.ndarray,
                          cells: np.ndarray) -> tuple[float, float]:
    """Atoms of prior mass ``p``; the record's range r = the atoms ``inside``; a new design
    whose cells are the labels ``cells``. (expected extra leakage of a record whose value
    is in r, Σ_C x_C (m − x_C)/m; the design's standalone leakage 1 − Σ_C y_C²)."""
    m = float(p[inside].sum())
    y = np.bincount(cells, weights=p)
    x = np.bincount(cells, weights=np.where(inside, p, 0.0), minlength=y.size)
    return float(np.sum(x * (m - x)) / m), float(1.0 - np.sum(y * y))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(2, 40), st.integers(1, 12), st.integers(0, 2**32 - 1),
       st.floats(0.05, 5.0))
def test_adaptive_extra_leakage_is_at_most_the_standalone_bound(
        atoms: int, labels: int, seed: int, concentration: float) -> None:
    """``composition.price``'s argument for adaptive designs: whatever range r a record
    was left with and whatever partition the analyst aims at it afterwards, the extra
    leakage given r is at most the partition's standalone leakage, and the cell-by-cell
    slack is at least z_C (1 − z_C/w). Random priors (Dirichlet), ranges (any set of
    atoms, not only intervals) and partitions; hypothesis, derandomized."""
    g = np.random.default_rng(seed)
    p = g.dirichlet(np.full(atoms, concentration))
    inside = g.random(atoms) < g.random()
    inside[g.integers(atoms)] = True
    cells = g.integers(0, labels, size=atoms)
    extra, standalone = _extra_and_standalone(p, inside, cells)
    assert extra <= standalone + 1e-12
    m = float(p[inside].sum())
    y = np.bincount(cells, weights=p)
    x = np.bincount(cells, weights=np.where(inside, p, 0.0), minlength=y.size)
    z, w = y - x, 1.0 - m
    slack = np.where(w > 0, z * (1 - np.divide(z, w, out=np.zeros_like(z), where=w > 0)), 0)
    assert standalone - extra >= float(slack.sum()) - 1e-12


def test_adaptive_bound_is_tight_only_without_information() -> None:
    """Equality needs every cell's share inside r proportional to its share outside
    (x_C = z_C m/w) and z_C (1 − z_C/w) = 0: a design that cuts only inside r, when r
    is the whole line. A cut at the middle of a range of mass 1/2 adds 1/4, half of its
    standalone 1/2."""
    p = np.full(4, 0.25)
    extra, standalone = _extra_and_standalone(p, np.ones(4, bool), np.array([0, 0, 1, 1]))
    assert extra == pytest.approx(standalone)
    extra, standalone = _extra_and_standalone(p, np.array([1, 1, 0, 0], bool),
                                              np.array([0, 1, 1, 1]))
    assert (extra, standalone) == pytest.approx((0.25, 1 - 0.25**2 - 0.75**2))


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
    """A second Logis(1) Case-I on the column: charged its standalone 0.24 (column total
    0.48), the exact joint 0.392 shown as information only; a failed release does not
    count, a release of another column does not count, a ring makes exact unavailable,
    and with no earlier release there is nothing to show."""
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
    assert exact["joint_leakage_bound"] < report["additive"]["column_total"]
    assert "fixed in advance" in exact["note"] and "charge" not in exact
    assert report["charged"] == "additive"
    assert report["charge"] == report["additive"]["charge"] == float(cost["interval_leakage:x"])
    assert "fixed in advance" in report["reason"]
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


def _price(new: object, committed: list, **kw: int) -> composition.Pricing:
    limits = {"max_releases": 8, "max_dims": 32, **kw}
    return composition.price(new, _standalone(new), committed,  # type: ignore[arg-type]
                             NORMAL, **limits)


def test_price_is_always_the_standalone_bound() -> None:
    """Issue #27: a second Logis(1) Case-I release is charged its standalone bound s₂ = s₁,
    not the exact increment ⌈J·unit⌉ − s₁ (a design aimed after reading the first range
    leaks more than that); the joint bound J comes along as information, between either
    release's leakage and the additive total."""
    d = case1()
    s = _standalone(d)
    alone = _price(d, [])
    assert (alone.units, alone.charged, alone.joint) == (s, composition.ADDITIVE, None)
    p = _price(d, [composition.Held(d, s)])
    joint = composition.joint_coverage([d, d], NORMAL)
    assert (p.units, p.charged) == (s, composition.ADDITIVE)
    assert p.joint == joint and p.already_units == s
    assert s < joint.leakage_bound * UNIT < 2 * s
    assert "fixed in advance" in p.reason


def test_price_shows_the_joint_figure_only_where_it_can() -> None:
    """Ineligible designs (ring, exact reports), too many releases or anchors, or nothing
    committed: no joint figure; the charge is the standalone bound every time."""
    d = case1()
    s = _standalone(d)
    done = composition.Held(d, s)
    for p in (_price(d, [done, composition.Held(None, s)]),
              _price(d, [done, done], max_releases=2), _price(d, [done], max_dims=1)):
        assert (p.charged, p.units, p.joint) == ("additive", s, None)
    assert _price(d, [composition.Held(d, 0)]).units == s  # nothing charged before
    ring = interval.IntervalMechanism(interval.Ring(NORMAL, 0.3))
    got = composition.price(ring, 5, [done], NORMAL, max_releases=8, max_dims=32)
    assert (got.charged, got.units, got.joint) == ("additive", 5, None)


def test_composed_charge_and_privacy_record() -> None:
    """``Mechanism.composed``: the charge on the column measure is the cost, whatever the
    column's history; the privacy record says so and why, with the joint bound as
    information (committed releases only: a failed release that was refunded is not in
    it, one charged after reading the data is)."""
    mech = registry.get("interval.case1")
    params = mech.load_params({"column": "x", "anchors": LOGIS})
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, META)
    first = _earlier("interval.case1", {"column": "x", "anchors": LOGIS})
    got = mech.composed(params, cost, META, lambda: [first])
    assert got is not None and got.charge == cost and got.report is not None
    assert got.privacy["charged"] == "additive"
    assert got.privacy["charge"] == got.privacy["standalone"] == float(cost["interval_leakage:x"])
    assert got.privacy["joint_leakage_bound"] < 2 * got.privacy["standalone"]
    assert "fixed in advance" in got.privacy["note"]
    busy = {**first, "status": "running"}
    more = mech.composed(params, cost, META, lambda: [first, busy])
    assert more is not None and more.charge == cost and more.privacy["charged"] == "additive"
    failed = {**first, "status": "failed"}
    refunded = mech.composed(params, cost, META, lambda: [failed])
    assert refunded is not None and refunded.charge == cost
    assert "joint_leakage_bound" not in refunded.privacy
    charged_fail = {**first, "status": "failed", "charged": True}
    after = mech.composed(params, cost, META, lambda: [charged_fail])
    assert after is not None and "joint_leakage_bound" in after.privacy
