"""What a release may cost: never more than the caller wrote, and no amount gives a 5xx.

Issue 27 §5: ``budget: {"epsilon": 1e-10}`` was accepted and charged 1e-9 (one ledger
unit), ten times what the analyst agreed to; a subnormal ε (``5e-324``, ``"1e-9999"``)
made ``POST /v1/releases`` and ``/estimate`` answer 500 (an ``OverflowError`` in the
exact rounding helpers). An amount below one unit of its measure is refused with a 422
naming the field, and nothing is held; an amount off the unit lattice is read rounded
down, so the cost calibrated to it is charged exactly. Runs every registered mechanism
(the metadata sweep's menu) against the session's real Valkey.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import budget
from tests.integration.conftest import Api
from tests.integration.test_metadata_sweep import CATS, MENU

#: amounts below every measure's unit: subnormals, an underflowing decimal string, a tenth
#: of a unit and a hair below one (filled in per measure)
TINY: list[Any] = [5e-324, 2.2250738585072014e-308, "1e-9999", "1e-30"]


def _below_unit(measure: str) -> list[Any]:
    unit = budget.from_units(measure, 1)
    return [*TINY, float(unit / 10), str(Decimal(unit.numerator) / unit.denominator
                                          * Decimal("0.999999"))]


@pytest.fixture(scope="module")
def sweep_dataset(app: Any) -> str:
    """One dataset every mechanism of the menu can be asked about (the sweep's columns)."""
    api = Api(app.test_client())
    m, n = 6, 40
    rng = np.random.default_rng(7)
    meta = {"name": "amounts", "bounds_policy": "clip",
            "budgets": {"epsilon": 100, "delta": 1e-3, "noiseless_bits": 100,
                        "interval_leakage": 1, "subset_draws": 10},
            "columns": {"x": {"type": "continuous", "bounds": [0, 10]},
                        "k": {"type": "integer", "bounds": [0, 9]},
                        "g": {"type": "categorical", "categories": CATS},
                        "h": {"type": "categorical", "categories": ["c0", "c1", "c2"]},
                        "f": {"type": "functional", "norm_bound": 1.0,
                              "grid": np.linspace(0, 1, m).tolist()}}}
    lines = [",".join(["x", "k", "g", "h", *(f"f.{i}" for i in range(m))])]
    for i in range(n):
        curve = 0.1 * rng.standard_normal(m) / np.sqrt(m)
        lines.append(",".join([repr(float(rng.uniform(0, 10))), str(i % 10), CATS[i % 4],
                               f"c{i % 3}", *(repr(float(v)) for v in curve)]))
    resp = api.upload("\n".join(lines) + "\n", meta)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def _held(api: Api, ds: str) -> dict[str, tuple[float, float]]:
    rows = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]
    return {m: (row["committed"], row["reserved"]) for m, row in rows.items()}


@pytest.mark.parametrize("name", sorted(MENU))
def test_an_amount_below_one_unit_is_refused_naming_it(api: Api, sweep_dataset: str,
                                                        name: str) -> None:
    """Every mechanism, every measure it spends, every amount below the measure's unit:
    422 naming ``budget.<measure>`` from the estimate and the release, nothing held."""
    params, spend = MENU[name][0]
    before = _held(api, sweep_dataset)
    for measure in spend:
        for tiny in _below_unit(measure):
            body = {"dataset_id": sweep_dataset, "mechanism": name, "params": params,
                    "budget": {**spend, measure: tiny}}
            for route in ("/v1/releases/estimate", "/v1/releases"):
                resp = api.post(route, body)
                problem = resp.get_json()
                assert resp.status_code == 422, (route, measure, tiny, problem)
                assert problem["field"] == f"budget.{measure}", problem
    assert _held(api, sweep_dataset) == before


#: mechanisms whose estimate is cheap at any amount (calibrated in closed form)
CHEAP = {"laplace": ({"statistic": "mean", "column": "x"}, "epsilon"),
         "geometric": ({"statistic": "sum", "column": "k"}, "epsilon"),
         "exm": ({"column": "h"}, "epsilon"),
         "noiseless.aggregate": ({"statistic": "mean", "column": "x"}, "noiseless_bits")}

AMOUNTS = st.one_of(
    st.floats(min_value=0, max_value=2, allow_subnormal=True, exclude_min=True),
    st.decimals(min_value=Decimal("1e-12"), max_value=Decimal(2), places=12).map(str),
    st.sampled_from(["1e-9999", "1.0000000005", "0.1234567891", "1e-9", "0.9999999999"]),
)


@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(CHEAP)), amount=AMOUNTS)
def test_the_cost_never_exceeds_what_the_caller_wrote(api: Api, sweep_dataset: str,
                                                      name: str, amount: Any) -> None:
    """Any amount: a 422 naming the field, or an estimate whose cost, in the ledger's
    units, is at most the amount exactly as written; never a 5xx."""
    params, measure = CHEAP[name]
    resp = api.post("/v1/releases/estimate", {
        "dataset_id": sweep_dataset, "mechanism": name, "params": params,
        "budget": {measure: amount}})
    written = Fraction(Decimal(amount) if isinstance(amount, str) else Decimal(repr(amount)))
    body = resp.get_json()
    if resp.status_code == 422:
        assert body["field"] == f"budget.{measure}", body
        assert written < budget.from_units(measure, 1) or measure == "noiseless_bits", body
        return
    assert resp.status_code == 200, body
    # the cost is shown as a float of whole units: the nearest whole number of units
    charged = budget.from_units(measure, round(body["cost"][measure] * budget.unit(measure)))
    assert 0 < charged <= written, (amount, body["cost"])
    if measure == "epsilon":  # calibrated to the amount read, rounded down by < a unit
        assert written - charged < budget.from_units(measure, 1)


def test_a_pure_release_on_a_zcdp_dataset_below_one_rho_unit_is_refused(api: Api) -> None:
    """On a zcdp dataset a pure ε is charged ρ = ε²/2: an ε whose ρ is below one ρ unit
    (1e-12) would be charged a whole unit, so it is refused naming ``budget.epsilon``."""
    meta = {"name": "z", "columns": {"k": {"type": "integer", "bounds": [0, 9]}},
            "budgets": {"rho": 1}, "gaussian_accounting": "zcdp"}
    up = api.upload("k\n" + "".join(f"{i % 10}\n" for i in range(50)), meta)
    assert up.status_code == 201, up.get_json()
    ds = up.get_json()["id"]
    count = {"statistic": "count", "condition": {"column": "k", "op": "ge", "value": 0}}
    for eps, status in ((1e-6, 422), (2e-6, 200)):  # ρ = 5e-13, then 2e-12
        resp = api.post("/v1/releases/estimate", {"dataset_id": ds, "mechanism": "laplace",
                                                  "params": count, "budget": {"epsilon": eps}})
        assert resp.status_code == status, resp.get_json()
        if status == 422:
            assert resp.get_json()["field"] == "budget.epsilon"
