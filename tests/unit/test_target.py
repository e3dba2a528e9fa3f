"""The smallest budget for a target accuracy (``mechanisms.target``, issue #31 item 10).

The search is checked against closed forms (a Laplace mean: the continuous ε = Δ ln 20 / x
and the exact discrete-lattice one), against its definition on random targets
(hypothesis: the budget found meets the target, one ledger unit less does not), on a
cross-tab, a function and a deterministic statement, and for each refusal. The one
reading of a statement is held equal to the interval the client's reading draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import Schema
from privrelease_client.reading import read_release

import mechanisms
from mechanisms import precompute, target
from mechanisms.base import (
    LEDGER_UNITS,
    Budget,
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
    read_epsilon,
)
from tests.unit.test_readable_releases import BASELINES, CASES, EPS, META, _data

N = 240
LO, HI = 0.0, 10.0
PEOPLE = DatasetMeta(N, {
    "x": ColumnMeta("x", "continuous", bounds=(LO, HI)),
    "g": ColumnMeta("g", "categorical", categories=("a", "b", "c")),
    "h": ColumnMeta("h", "categorical", categories=("p", "q")),
})
MEAN = {"statistic": "mean", "column": "x"}
UNIT = Fraction(1, LEDGER_UNITS["epsilon"])


def _stated(name: str, params: Mapping[str, Any], budget: Mapping[str, Fraction],
            meta: DatasetMeta = PEOPLE) -> float:
    mech = mechanisms.get(name)
    _, accuracy = mech.price(mech.load_params(params), budget, meta)
    found = target.stated(name, accuracy)
    assert found is not None
    return found.half_width


def _found(name: str, params: Mapping[str, Any], half_width: float,
           meta: DatasetMeta = PEOPLE, **kwargs: Any) -> target.Found:
    mech = mechanisms.get(name)
    return target.budget_for(mech, mech.load_params(params), meta,
                             target.Target(half_width, **kwargs))


def _is_smallest(name: str, params: Mapping[str, Any], found: target.Found,
                 half_width: float, meta: DatasetMeta = PEOPLE) -> None:
    """The budget found meets the target and one ledger unit less does not."""
    amount = found.budget[found.measure]
    assert _stated(name, params, found.budget, meta) <= half_width
    below = amount - Fraction(1, LEDGER_UNITS[found.measure])
    if below > 0:
        try:
            assert _stated(name, params, {**found.budget, found.measure: below}, meta) \
                > half_width
        except MechanismInputError as err:  # below what the mechanism accepts: fails too
            assert err.field == f"budget.{found.measure}"


# ------------------------------------------------------------------ closed forms


@pytest.mark.parametrize("half_width", [0.2, 0.5, 1.0, 3.0, 7.5])
def test_laplace_mean_matches_the_closed_forms(half_width: float) -> None:
    """Continuous Laplace: P(|noise| > x) = exp(-x ε/Δ) = 5 % at ε = Δ ln 20 / x, Δ =
    (hi - lo)/n. The release adds discrete Laplace noise on a lattice of step g with L
    lattice units of sensitivity (public: ``grid``, ``grid_sensitivity``) and states
    (k + 1/2) g with k the smallest integer whose two-sided tail P(|X| > k) =
    2 p^(k+1)/(1+p), p = exp(-ε/L), is at most 5 %. So the exact answer is the smallest
    whole unit of ε with 2 p^(K+1)/(1+p) <= 0.05, K = floor(x/g - 1/2), found here by a
    bisection of that formula alone; and it lies within the lattice's slack of the
    continuous closed form."""
    found = _found("laplace", MEAN, half_width)
    eps = found.budget["epsilon"]
    accuracy = mechanisms.get("laplace").accuracy(MEAN, found.budget, PEOPLE)
    g, lattice = accuracy["grid"], accuracy["grid_sensitivity"]
    k_max = math.floor(half_width / g - 0.5)

    def meets(units: int) -> bool:
        p = math.exp(-units / LEDGER_UNITS["epsilon"] / lattice)
        return 2 * p ** (k_max + 1) / (1 + p) <= 0.05

    lo, hi = 0, 100 * LEDGER_UNITS["epsilon"]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    assert eps == Fraction(hi, LEDGER_UNITS["epsilon"])  # exactly, in whole units
    # the continuous closed form, rounded up to units; the lattice moves it by at most its
    # relative slack: sensitivity L g <= Δ + g + 2 err, half-width +1.5 g, tail ≤ ε/(2L)
    delta = (HI - LO) / N
    closed = Fraction(math.ceil(delta * math.log(20) / half_width / UNIT)) * UNIT
    slack = (g + 2**-40) / delta + 1.5 * g / half_width + float(eps) / (2 * lattice)
    assert abs(float(eps / closed) - 1) <= slack
    assert found.stated.level == 0.95 and found.stated.half_width <= half_width


def test_a_statement_that_is_continuous_in_epsilon_returns_its_own_budget() -> None:
    """bernstein.mean states a band continuous and decreasing in ε: the target it states at
    ε = 1 is met first at exactly ε = 1 (one unit less states more)."""
    name, (params, _) = "bernstein.mean", CASES["bernstein.mean"]
    stated = _stated(name, params, {"epsilon": Fraction(1)}, META)
    found = _found(name, params, stated, META)
    assert found.budget == {"epsilon": Fraction(1)}
    _is_smallest(name, params, found, stated, META)


def test_a_cross_tab_meets_the_target_in_every_cell() -> None:
    """A count cross-tab states one 95 % error for every cell (integers: k lattice units);
    the budget found releases cells whose stated errors are all within the target."""
    params = {"statistic": "count", "group_by": ["g", "h"]}
    found = _found("laplace", params, 10.0)
    _is_smallest("laplace", params, found, 10.0)
    mech = mechanisms.get("laplace")
    out = mech.run({"g": np.zeros(N, dtype=np.int64), "h": np.ones(N, dtype=np.int64)},
                   mech.load_params(params), found.budget, PEOPLE, np.random.default_rng(3))
    assert len(out.result["errors"]) == 6
    assert max(out.result["errors"]) == found.stated.half_width <= 10.0


def test_gaussian_holds_delta_and_searches_epsilon() -> None:
    params = {"statistic": "mean", "column": "x"}
    delta = Fraction(1, 10**6)
    found = _found("gaussian", params, 0.5, fixed={"delta": delta})
    assert found.measure == "epsilon" and found.budget["delta"] == delta
    _is_smallest("gaussian", params, found, 0.5)


def test_gaussian_on_a_zcdp_dataset_searches_rho() -> None:
    meta = DatasetMeta(N, PEOPLE.columns, gaussian_accounting="zcdp")
    found = _found("gaussian", MEAN, 0.5, meta)
    assert found.measure == "rho" and set(found.budget) == {"rho"}
    _is_smallest("gaussian", MEAN, found, 0.5, meta)


def test_a_deterministic_bound_counts_at_95() -> None:
    """noiseless.aggregate states max_error, always within (level 1): its bits are searched
    in ledger units and below one bit the mechanism refuses (no output): treated as not
    meeting the target."""
    params = {"statistic": "mean", "column": "x"}
    found = _found("noiseless.aggregate", params, 0.5)
    assert found.measure == "noiseless_bits" and found.stated.level == 1.0
    _is_smallest("noiseless.aggregate", params, found, 0.5)


# ------------------------------------------------------------------ the definition


TARGETS: dict[str, tuple[str, dict[str, Any], dict[str, Fraction]]] = {
    "mean": ("laplace", MEAN, {}),
    "sum": ("laplace", {"statistic": "sum", "column": "x"}, {}),
    "histogram": ("geometric", {"statistic": "histogram", "column": "g"}, {}),
    "count": ("geometric", {"statistic": "count", "condition": {
        "column": "g", "op": "eq", "value": "a"}}, {}),
    "std": ("laplace", {"statistic": "std", "column": "x"}, {}),
    "gaussian": ("gaussian", MEAN, {"delta": Fraction(1, 10**7)}),
}


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(sorted(TARGETS)), st.floats(-9, 4))
def test_found_budget_meets_the_target_and_one_unit_less_does_not(
        case: str, log_width: float) -> None:
    """For targets from far below to far above what ε = 1 buys, when one is reachable
    (ε <= 100) the budget found is the smallest on the ledger's lattice; else the refusal
    names the best half-width, which is above the target."""
    name, params, fixed = TARGETS[case]
    width = math.exp(log_width) * (HI - LO) / N
    try:
        found = _found(name, params, width, fixed=fixed)
    except target.Unreachable as err:
        assert err.field == "target" and err.extra["best_half_width"] > width
        assert err.extra["largest"] == 100.0
        return
    assert found.evaluations <= target.MAX_EVALUATIONS
    assert found.budget[found.measure] * LEDGER_UNITS[found.measure] % 1 == 0
    _is_smallest(name, params, found, width)


# ------------------------------------------------------------------ refusals


def test_unreachable_within_the_cap_names_the_best_half_width() -> None:
    mech = mechanisms.get("laplace")
    with pytest.raises(target.Unreachable) as info:
        target.budget_for(mech, MEAN, PEOPLE, target.Target(0.01), cap=Fraction(1))
    err = info.value
    assert err.code == "target_unreachable" and err.field == "target"
    assert err.extra["largest"] == 1.0
    assert err.extra["best_half_width"] == _stated("laplace", MEAN, {"epsilon": Fraction(1)})
    with pytest.raises(target.Unreachable, match="allow no epsilon"):
        target.budget_for(mech, MEAN, PEOPLE, target.Target(1.0), cap=Fraction(0))


def test_a_cap_below_what_the_mechanism_accepts_is_unreachable() -> None:
    mech = mechanisms.get("noiseless.aggregate")
    with pytest.raises(target.Unreachable, match="refused: noiseless_bits must be at least 1"):
        target.budget_for(mech, mech.load_params(MEAN), PEOPLE, target.Target(1.0),
                          cap=Fraction(1, 2))


def test_the_level_must_be_the_one_stated() -> None:
    """A mean states 95 %; a table states the level its params' confidence asks, per cell
    or simultaneous (then wider: every cell at once)."""
    with pytest.raises(MechanismInputError) as info:
        _found("laplace", MEAN, 1.0, level=0.9)
    assert info.value.field == "target.level" and "at level 0.95" in info.value.message
    table = {"statistic": "count", "group_by": ["g", "h"],
             "confidence": {"level": 0.9, "simultaneous": True}}
    with pytest.raises(MechanismInputError, match=r"at level 0\.9 ") as info:
        _found("laplace", table, 10.0)
    assert info.value.field == "target.level"
    found = _found("laplace", table, 10.0, level=0.9)
    assert found.stated == target.Stated(found.stated.half_width, 0.9)
    _is_smallest("laplace", table, found, 10.0)
    per_cell = _found("laplace", {**table, "confidence": {"level": 0.9}}, 10.0, level=0.9)
    assert per_cell.budget["epsilon"] < found.budget["epsilon"]
    with pytest.raises(MechanismInputError, match=r"must be in \(0, 1\)"):
        _found("laplace", MEAN, 1.0, level=1.0)


@pytest.mark.parametrize(("name", "params"), [
    ("laplace", {"statistic": "quantile", "column": "x", "quantiles": [0.5]}),
    ("laplace", {"statistic": "mean", "column": "x", "group_by": ["g"]}),
    ("subset.uniform", {"column": "g"}),
    ("interval.progressive", {"column": "k", "rounds": 2}),
])
def test_a_statement_without_an_interval_is_refused(name: str, params: dict[str, Any]
                                                    ) -> None:
    """A quantile's rank error, a mean table's intervals (from the noisy counts), subset
    and interval designs: no half-width in the statistic's units."""
    with pytest.raises(MechanismInputError, match="states no interval") as info:
        _found(name, params, 1.0, META)
    assert info.value.field == "target"


def test_several_measures_need_a_rule() -> None:
    with pytest.raises(MechanismInputError, match=r"give target\.delta") as info:
        _found("gaussian", MEAN, 1.0)
    assert info.value.field == "target.delta"
    with pytest.raises(MechanismInputError, match="spends only epsilon") as info:
        _found("laplace", MEAN, 1.0, fixed={"delta": Fraction(1, 10**6)})
    assert info.value.field == "target.delta"


def test_params_errors_keep_their_field() -> None:
    with pytest.raises(MechanismInputError) as info:
        _found("laplace", {"statistic": "mean", "column": "nope"}, 1.0)
    assert info.value.field == "params.column"


class _Dip(Mechanism):
    """A statement 1/ε except on [1.5, 2), where it dips to 0.2: the shape of a design
    that changes with ε (more components, another grid)."""

    name = "test.dip"
    measures = ("epsilon",)
    params_schema = Schema

    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
             ) -> dict[str, Fraction]:
        return {"epsilon": read_epsilon(budget, self.name)}

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
                 ) -> dict[str, Any]:
        eps = float(cost["epsilon"])
        return {"ci95_halfwidth": 0.2 if 1.5 <= eps < 2 else 1 / eps}

    def run(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        raise NotImplementedError("priced only")


def test_a_statement_not_monotone_on_the_points_searched_is_refused() -> None:
    """Target 0.6: ε = 1 fails, ε = 2 meets (0.5), so the bisection evaluates ε = 1.5,
    which states 0.2 < 0.5: the refusal names the two budgets where it grows. A target
    whose search evaluates no point of the dip is answered as usual (the check holds on
    the points searched only)."""
    with pytest.raises(MechanismInputError, match=r"not monotone in epsilon .*±0.2 at 1.5,"
                       r" ±0.5 at 2\)") as info:
        target.budget_for(_Dip(), {}, PEOPLE, target.Target(0.6))
    assert info.value.field == "target"
    found = target.budget_for(_Dip(), {}, PEOPLE, target.Target(0.05))
    assert found.budget["epsilon"] == 20


def test_the_search_counts_its_evaluations_against_the_precompute_limit() -> None:
    """Within a search each heavy part's work counts MAX_EVALUATIONS times."""
    with precompute.use(None, None, max_work=1000.0):
        precompute.check_work("params.m", 1000.0)
        with precompute.repeated(target.MAX_EVALUATIONS), \
                pytest.raises(MechanismInputError, match="64 budgets evaluated"):
            precompute.check_work("params.m", 1000.0)


# ------------------------------------------------------------------ one reading


def test_the_stated_half_width_is_the_interval_the_client_reads() -> None:
    """For every mechanism (and baseline statistic) whose statement gives a half-width,
    the client's reading of its release document draws intervals whose largest half-width
    is that one (``mechanisms`` import no client package, so two copies: they agree). The
    ones with no stated half-width draw intervals only from their result (data-dependent
    or chosen at release), listed here."""
    cases = {k: (k, *v) for k, v in CASES.items()} | dict(BASELINES) | {
        "laplace.simultaneous": ("laplace", {"statistic": "count", "group_by": ["g", "h"],
                                             "confidence": {"simultaneous": True}}, EPS),
        "laplace.covariance90": ("laplace", {"statistic": "covariance", "columns": ["x", "u"],
                                             "confidence": {"level": 0.9}}, EPS)}
    from_result_only = set()
    data = _data()
    for label, (name, raw, budget) in sorted(cases.items()):
        mech = mechanisms.get(name)
        params = mech.load_params(raw)
        amounts = {m: Fraction(v) for m, v in budget.items()}
        cost, accuracy = mech.price(params, amounts, META)
        stated = target.stated(name, accuracy)
        out = mech.run(data, params, cost, META, np.random.default_rng(5))
        doc = {"mechanism": name, "params": raw, "result": out.result,
               "accuracy": out.accuracy, "cost": {m: float(v) for m, v in cost.items()}}
        reading = read_release(doc)
        widths = [] if reading is None else [
            (u - lo) / 2 for lo, u, e in zip(reading.lower, reading.upper, reading.estimates,
                                             strict=True)
            if lo is not None and u is not None and e is not None]
        if stated is None:
            if widths:
                from_result_only.add(label)
            continue
        if reading is None:  # records, each within the stated bound: no reading drawn
            assert mech.record_level and label in {"noiseless.local"}, label
            continue
        assert widths, label
        assert reading.level == stated.level, label
        if "interval" in out.result:  # std, variance: read around the released value
            assert max(widths) <= stated.half_width, label
            continue
        assert max(widths) == pytest.approx(stated.half_width, rel=1e-9), label
    assert from_result_only == {"iclp.fos", "laplace.mean_table", "subset.custom",
                                "subset.product", "subset.uniform"}
