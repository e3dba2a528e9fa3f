"""Exact amounts: decimals read as written, costs rounded up, caps down."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service import budget


def test_decimal_amounts_are_exact() -> None:
    assert budget.to_fraction(0.1, "f") == Fraction(1, 10)
    assert budget.cost_units("epsilon", Fraction(1, 10)) == 10**8
    assert budget.cost_units("delta", budget.to_fraction(1e-6, "f")) == 10**9
    # 1/3 cannot be represented: the cost rounds up, the cap down
    assert budget.cost_units("epsilon", Fraction(1, 3)) == 333_333_334
    assert budget.cap_units("epsilon", Fraction(1, 3)) == 333_333_333


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "x", True, None, [1]])
def test_bad_amounts(bad: object) -> None:
    with pytest.raises(budget.AmountError):
        budget.to_fraction(bad, "budget.epsilon")


def test_caps_expand_per_column_measures() -> None:
    caps = budget.parse_caps(
        {"epsilon": 5, "interval_leakage": 0.5, "interval_leakage:b": 0.25},
        ["a", "b", "c"])
    assert caps == {
        "epsilon": 5 * 10**9,
        "interval_leakage:a": 5 * 10**11,
        "interval_leakage:b": 25 * 10**10,
        "interval_leakage:c": 5 * 10**11,
    }


def test_no_measure_has_a_default_cap() -> None:
    """#27.3: an ε/δ dataset with a categorical column got subset_draws:<c> = 1 and so
    admitted subset releases; only the measures the budgets name get a cap now."""
    caps = budget.parse_caps({"epsilon": 3, "delta": 1e-7}, ["diagnosis", "age"])
    assert caps == {"epsilon": 3 * 10**9, "delta": 10**8}
    assert budget.default_notions(caps) == ["dp"]
    named = budget.parse_caps({"epsilon": 1, "subset_draws:diagnosis": 2,
                               "noiseless_bits": 4}, ["diagnosis", "age"])
    assert budget.default_notions(named) == ["dp", "noiseless", "subset"]
    assert budget.default_notions({}) == []


def test_policy_of_a_document() -> None:
    """Registration stores notions and record_level; a document from before them reads as
    the legacy policy the migration records (all notions, record-level allowed)."""
    assert budget.admitted_notions({"notions": ["dp"]}) == ["dp"]
    assert budget.record_level({"record_level": False}) is False
    assert budget.admitted_notions({}) == list(budget.NOTIONS)
    assert budget.record_level({}) is True


def test_record_level_mechanisms_declare_it() -> None:
    """Every mechanism that releases one output per record says so in its class (the
    service keeps no list); aggregates and exm's draws from a DP distribution do not."""
    import mechanisms

    record_level = {n for n in mechanisms.names() if mechanisms.get(n).record_level}
    assert record_level == {
        "dip", "lrm", "noiseless.local", "opm.l2ball",
        *(n for n in mechanisms.names() if n.startswith(("subset.", "interval.")))}
    assert {"laplace", "gaussian", "exm", "noiseless.aggregate", "opm.mean"} \
        .isdisjoint(record_level)


def test_mechanisms_that_write_tables_declare_it() -> None:
    """A run that writes a table (a file) is preflighted before it reads the data, so
    each mechanism whose output may hold one says so: the record-level ones and exm's
    draws; aggregates write none."""
    import mechanisms

    writers = {n for n in mechanisms.names() if mechanisms.get(n).writes_table({})}
    assert writers == {n for n in mechanisms.names() if mechanisms.get(n).record_level} \
        | {"exm"}


@pytest.mark.parametrize(("raw", "field"), [
    ({"zeta": 1}, "metadata.budgets.zeta"),
    ({"epsilon:a": 1}, "metadata.budgets.epsilon:a"),
    ({"interval_leakage:zz": 1}, "metadata.budgets.interval_leakage:zz"),
    ({"epsilon": 10**7}, "metadata.budgets.epsilon"),
    ({"subset_draws": 1.5}, "metadata.budgets.subset_draws"),
    # Thm 4's additive bound on interval leakage is vacuous past 1 (main accepted 1000)
    ({"interval_leakage": 1.5}, "metadata.budgets.interval_leakage"),
    ({"interval_leakage:a": "1.000000000001"}, "metadata.budgets.interval_leakage:a"),
    ([], "metadata.budgets"),
])
def test_bad_caps_name_the_field(raw: object, field: str) -> None:
    with pytest.raises(budget.AmountError) as info:
        budget.parse_caps(raw, ["a"])
    assert info.value.field == field


@given(st.sampled_from(sorted(budget.MEASURES)), st.fractions(0, 1000))
def test_rounding_never_favours_the_spender(measure: str, amount: Fraction) -> None:
    assert budget.from_units(measure, budget.cost_units(measure, amount)) >= amount
    assert budget.from_units(measure, budget.cap_units(measure, amount)) <= amount
    # every cap (times 3, as in the Lua check) stays exact in a double
    assert budget.cap_units(measure, budget.MEASURES[measure][1]) * 3 < 2**53


def test_interval_leakage_caps_stop_at_one() -> None:
    """A leakage cap of exactly 1 is the largest accepted (main accepted up to 1000)."""
    assert budget.parse_caps({"interval_leakage": 1}, ["a"]) == {
        "interval_leakage:a": 10**12}
    with pytest.raises(budget.AmountError, match=r"between 0 and 1$"):
        budget.parse_caps({"interval_leakage": 2}, ["a"], where="caps")
