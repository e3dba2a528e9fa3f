"""Progressive questions on a categorical column (issue #17 item 4)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError, ReleaseView
from mechanisms.interval import categorical

from .conftest import rng


def _brute_coverage(probs: list[Fraction], rounds: int) -> Fraction:
    """E[π(S_final)] by enumerating every value and every sequence of questions, each
    subset of size ⌈|S|/2⌉ of S equally likely (the repo's ``random.sample``)."""
    k = len(probs)

    def walk(y: int, s: frozenset[int], left: int) -> Fraction:
        if left == 0 or len(s) < 2:
            return sum((probs[c] for c in s), Fraction(0))
        subsets = list(itertools.combinations(sorted(s), (len(s) + 1) // 2))
        total = Fraction(0)
        for q in subsets:
            nxt = frozenset(q) if y in q else s - frozenset(q)
            total += walk(y, nxt, left - 1)
        return total / len(subsets)

    return sum((probs[y] * walk(y, frozenset(range(k)), rounds) for y in range(k)),
               Fraction(0))


@pytest.mark.parametrize(("k", "rounds"), [(2, 1), (3, 1), (3, 2), (4, 2), (5, 1), (5, 2),
                                           (5, 3), (6, 2)])
def test_coverage_formula_is_exact(k: int, rounds: int) -> None:
    """τ = s + (1 − s)Σπ² equals exhaustive enumeration exactly (Fractions) for a
    skewed prior, and the uniform prior gives the largest leakage (the charge)."""
    probs = [Fraction(i + 1, k * (k + 1) // 2) for i in range(k)]
    exact = categorical.expected_coverage(k, rounds, [float(p) for p in probs])
    brute = _brute_coverage(probs, rounds)
    # the formula reads float probabilities: equal up to their rounding
    assert abs(exact - brute) < Fraction(1, 10**12)
    uniform = _brute_coverage([Fraction(1, k)] * k, rounds)
    assert categorical.expected_coverage(k, rounds) == uniform
    assert 1 - uniform == categorical.worst_case_leakage(k, rounds) >= 1 - brute


def test_release_keeps_the_value_and_halves() -> None:
    """Every set holds the value; each answered round leaves ⌈m/2⌉ or m − ⌈m/2⌉ options;
    a record stops at one option; the realized coverage matches the exact τ within 4 SE."""
    k, rounds, n = 9, 4, 40_000
    probs = np.array([0.3, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05])
    g = rng(11)
    y = g.choice(k, n, p=probs)
    rel = categorical.ProgressiveCategorical(k, rounds).release(y, g)
    assert rel.contains(y).all()
    size = np.full(n, k)
    for h in range(rounds):
        asked = rel.asked[:, h, :].sum(axis=1)
        active = rel.answers[:, h] >= 0
        assert np.all(active == (size >= 2))
        assert np.all(asked[active] == (size[active] + 1) // 2)
        size = np.where(active, np.where(rel.answers[:, h] == 1, asked, size - asked), size)
    assert np.array_equal(size, rel.feasible.sum(axis=1))
    cov = rel.coverage(probs)
    exact = float(categorical.expected_coverage(k, rounds, probs))
    assert abs(cov.mean() - exact) < 4 * cov.std() / np.sqrt(n)


def test_npmle_recovers_the_shares() -> None:
    """n = 20,000 records, 2 rounds over 6 categories: every share within 0.025 (the
    NPMLE's SE here is below 0.006), masses on the simplex, KKT-certified."""
    probs = np.array([0.35, 0.25, 0.15, 0.1, 0.1, 0.05])
    g = rng(12)
    y = g.choice(6, 20_000, p=probs)
    rel = categorical.ProgressiveCategorical(6, 2).release(y, g)
    est, res = categorical.category_npmle(rel.feasible)
    assert res.converged and est.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(est, probs, atol=0.025)


META = DatasetMeta(3000, {
    "c": ColumnMeta("c", "categorical", categories=("a", "b", "c", "d")),
    "x": ColumnMeta("x", "continuous", (0.0, 1.0)),
    "wide": ColumnMeta("wide", "categorical", categories=tuple(f"k{i}" for i in range(70))),
})


def test_registered_mechanism_and_categories_analysis() -> None:
    """Cost is the exact worst case rounded up to the ledger unit; over budget, a numeric
    column and more than 62 categories are refused naming the field; the table encodes
    the sets; the ``categories`` analysis estimates the shares."""
    mech = registry.get("interval.progressive_categorical")
    params = mech.load_params({"column": "c", "rounds": 1})
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, META)
    # k = 4, one round: s = (2/4)(1/3) + (2/4)(1/3) = 1/3, leakage (2/3)(3/4) = 1/2
    assert cost == {"interval_leakage:c": Fraction(1, 2)}
    with pytest.raises(MechanismInputError) as err:
        mech.cost(params, {"interval_leakage": Fraction(1, 4)}, META)
    assert err.value.field == "budget.interval_leakage"
    for column in ("x", "wide"):
        with pytest.raises(MechanismInputError) as err:
            mech.cost(mech.load_params({"column": column}), {"interval_leakage": 1}, META)
        assert err.value.field == "params.column"
    g = rng(13)
    codes = g.choice(4, 3000, p=[0.4, 0.3, 0.2, 0.1])
    out = mech.run({"c": codes}, params, cost, META, g)
    assert out.table is not None
    feasible = categorical.masks_from_table(dict(out.table), 4)
    assert feasible[np.arange(3000), codes].all()
    assert out.accuracy["leakage_charged"] == 0.5
    view = ReleaseView("r", mech.name, params, out.result, out.table, META)
    a = mech.analyses["categories"]
    ap = a.load_params({})
    a.check(view, ap, [])
    res = a.run(view, ap, [], g)
    assert res["converged"] and set(res["probabilities"]) == {"a", "b", "c", "d"}
    # one round of halving: SE of a share ~ 0.02 at n = 3000
    assert abs(res["probabilities"]["a"] - 0.4) < 0.08
    assert a.work(view, ap, []).units > 0
