"""``Mechanism.price``: a pricing's cost and accuracy in one call. The baselines make their
plan once (cost and accuracy each made it: about a tenth of a release POST's CPU), and
answer exactly what ``cost`` then ``accuracy`` of that cost answer, errors included."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import pytest

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.dp import baselines

META = DatasetMeta(
    n_rows=400,
    columns={
        "age": ColumnMeta("age", "integer", (17, 90)),
        "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
        "wage": ColumnMeta("wage", "continuous", (0.0, 200_000.0)),
    },
)
ZCDP = dataclasses.replace(META, gaussian_accounting="zcdp")

CASES: list[tuple[str, dict[str, Any], dict[str, Fraction], DatasetMeta]] = [
    ("laplace", {"statistic": "mean", "column": "wage"}, {"epsilon": Fraction(1, 2)}, META),
    ("laplace", {"statistic": "count", "group_by": ["race"]}, {"epsilon": Fraction(1)}, META),
    ("laplace", {"statistic": "quantile", "column": "wage", "quantiles": [0.5]},
     {"epsilon": Fraction(1)}, META),
    ("geometric", {"statistic": "mean", "column": "age"}, {"epsilon": Fraction(1, 4)}, META),
    ("gaussian", {"statistic": "sum", "column": "wage"},
     {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}, META),
    ("gaussian", {"statistic": "sum", "column": "wage"}, {"rho": Fraction(1, 8)}, ZCDP),
]


@pytest.mark.parametrize(("name", "raw", "budget", "meta"), CASES,
                         ids=[f"{c[0]}-{c[1]['statistic']}-{c[3].gaussian_accounting}"
                              for c in CASES])
def test_price_is_cost_then_its_accuracy(name: str, raw: dict[str, Any],
                                         budget: dict[str, Fraction],
                                         meta: DatasetMeta) -> None:
    mech = registry.get(name)
    params = mech.load_params(raw)
    cost = mech.cost(params, budget, meta)
    assert mech.price(params, budget, meta) == (cost, mech.accuracy(params, cost, meta))


def test_a_baseline_makes_its_plan_once(monkeypatch: pytest.MonkeyPatch) -> None:
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "mean", "column": "wage"})
    made: list[object] = []
    plan = baselines.LaplaceMechanism._plan

    def counted(self: Any, *args: Any) -> Any:
        made.append(args)
        return plan(self, *args)

    monkeypatch.setattr(baselines.LaplaceMechanism, "_plan", counted)
    mech.price(params, {"epsilon": Fraction(1, 2)}, META)
    assert len(made) == 1
    mech.cost(params, {"epsilon": Fraction(1, 2)}, META)
    mech.accuracy(params, {"epsilon": Fraction(1, 2)}, META)
    assert len(made) == 3


def test_price_refuses_as_cost_does() -> None:
    mech = registry.get("laplace")
    params = mech.load_params({"statistic": "mean", "column": "wage"})
    for budget in ({"epsilon": Fraction(10**-12)}, {"delta": Fraction(1, 10)}):
        with pytest.raises(MechanismInputError) as by_cost:
            mech.cost(params, budget, META)
        with pytest.raises(MechanismInputError) as by_price:
            mech.price(params, budget, META)
        assert (by_price.value.field, by_price.value.message) == (
            by_cost.value.field, by_cost.value.message)
