"""The mechanisms' budget readers refuse an amount below one ledger unit (issue 27 §5).

A subnormal ε reached the exact rounding helpers and raised ``OverflowError`` (a 500
through the API); an ε below 1e-9 was charged a whole unit. Every reader now refuses
both with a ``MechanismInputError`` naming the field, the same floor the ledger uses.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mechanisms import zcdp
from mechanisms.base import (
    LEDGER_UNITS,
    MAX_EPSILON,
    MechanismInputError,
    read_amount,
    read_budget,
    read_epsilon,
    smallest,
)
from mechanisms.interval.entries import read_leakage as interval_budget
from service import budget

SUBNORMALS = [5e-324, 2.2250738585072014e-308, Fraction(1, 10**9999)]


def test_the_service_and_the_mechanisms_share_one_unit_per_measure() -> None:
    assert {m: budget.unit(m) for m in budget.MEASURES} == LEDGER_UNITS


@pytest.mark.parametrize("measure", ["epsilon", "rho", "interval_leakage", "delta"])
@given(amount=st.one_of(st.sampled_from(SUBNORMALS),
                        st.floats(min_value=0, max_value=1e-9, exclude_min=True,
                                  allow_subnormal=True)))
def test_read_amount_refuses_less_than_one_unit(measure: str, amount: Any) -> None:
    if Fraction(amount) >= smallest(measure):
        assert read_amount({measure: amount}, measure, Fraction(1), "x") == Fraction(amount)
        return
    with pytest.raises(MechanismInputError) as err:
        read_amount({measure: amount}, measure, Fraction(1), "x")
    assert err.value.field == f"budget.{measure}"
    assert "smallest amount" in err.value.message


@pytest.mark.parametrize("tiny", [*SUBNORMALS, 1e-10, 9.99e-10])
def test_every_reader_refuses_a_subnormal_or_sub_unit_amount(tiny: Any) -> None:
    cases = [
        (lambda: read_epsilon({"epsilon": tiny}, "laplace"), "budget.epsilon"),
        (lambda: read_budget({"epsilon": tiny}, ("epsilon",), "laplace"),
         "budget.epsilon"),
        (lambda: read_budget({"epsilon": 1, "delta": tiny * 1e-6},
                             ("epsilon", "delta"), "gaussian"), "budget.delta"),
        (lambda: zcdp.read_rho({"rho": tiny * 1e-3}, "gaussian"), "budget.rho"),
        (lambda: interval_budget({"interval_leakage": tiny * 1e-3}, "age", "interval.case1"),
         "budget.interval_leakage"),
    ]
    for call, field in cases:
        with pytest.raises(MechanismInputError) as err:
            call()
        assert err.value.field == field


def test_one_unit_and_the_ceiling_are_accepted() -> None:
    assert read_epsilon({"epsilon": Fraction(1, 10**9)}, "laplace") == Fraction(1, 10**9)
    assert read_epsilon({"epsilon": MAX_EPSILON}, "laplace") == MAX_EPSILON
    assert read_budget({"epsilon": 1, "delta": 1e-15}, ("epsilon", "delta"),
                       "gaussian")["delta"] == Fraction(1e-15)


def test_an_off_lattice_amount_is_read_rounded_down() -> None:
    assert budget.on_lattice("epsilon", Fraction("0.1234567891")) == Fraction("0.123456789")
    assert budget.on_lattice("epsilon", Fraction(1, 3)) == Fraction(333333333, 10**9)
    assert budget.on_lattice("delta", Fraction(1, 10**15)) == Fraction(1, 10**15)
