"""A misspelt public name gets a "did you mean" (#31 item 6), and nothing is spent."""

from __future__ import annotations

from typing import Any

import pytest

from mechanisms.suggest import did_you_mean
from tests.integration.conftest import Api


def test_did_you_mean_names_only_a_close_choice() -> None:
    assert did_you_mean("laplce", ["laplace", "gaussian"]) == " (did you mean 'laplace'?)"
    assert did_you_mean("zzzz", ["laplace", "gaussian"]) == ""
    assert did_you_mean("x", []) == ""


@pytest.mark.parametrize(("mechanism", "params", "budget", "field", "meant"), [
    ("laplce", {"statistic": "mean", "column": "age"}, {"epsilon": 0.1}, "mechanism",
     "laplace"),
    ("laplace", {"statistic": "mean", "column": "incme"}, {"epsilon": 0.1},
     "params.column", "income"),
    ("laplace", {"statistic": "mean", "column": "age"}, {"epsilonn": 0.1}, "budget.epsilonn",
     "epsilon"),
])
def test_a_misspelt_name_is_answered_with_the_close_one(
        api: Api, dataset: dict[str, Any], mechanism: str, params: dict[str, Any],
        budget: dict[str, float], field: str, meant: str) -> None:
    before = api.get(f"/v1/datasets/{dataset['id']}/budget").get_json()
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": mechanism,
                                     "params": params, "budget": budget})
    assert resp.status_code == 422, resp.get_json()
    problem = resp.get_json()
    assert problem["field"] == field, problem
    assert f"did you mean {meant!r}?" in problem["detail"], problem
    assert api.get(f"/v1/datasets/{dataset['id']}/budget").get_json() == before
