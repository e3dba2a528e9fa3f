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


def test_a_nul_character_is_a_clear_refusal_anywhere(api: Api, dataset: dict[str, Any]
                                                     ) -> None:
    """PostgreSQL text can not hold NUL: psycopg refused to send it and the API answered
    500 where the input was at fault (the contract fuzz found it in one parameter after
    another). Now a path naming nothing is 404, a query value or a JSON string with one is
    422 naming where, and nothing is spent."""
    before = api.get(f"/v1/datasets/{dataset['id']}/budget").get_json()
    path = api.client.get(f"/v1/datasets/{dataset['id']}%00/budget", headers=api._h())
    assert path.status_code == 404, path.get_json()
    query = api.client.get("/v1/releases?dataset_id=ds%00x", headers=api._h())
    assert query.status_code == 422 and query.get_json()["field"] == "dataset_id"
    cursor = api.client.get("/v1/datasets?cursor=a%00b", headers=api._h())
    assert cursor.status_code == 422 and cursor.get_json()["field"] == "cursor"
    body = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age\x00"},
                                     "budget": {"epsilon": 0.1}})
    assert body.status_code == 422 and body.get_json()["field"] == "body"
    text = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age\\u0000"},
                                     "budget": {"epsilon": 0.1}})
    assert text.status_code == 422 and text.get_json()["field"] == "params.column"  # a name
    assert api.get(f"/v1/datasets/{dataset['id']}/budget").get_json() == before
