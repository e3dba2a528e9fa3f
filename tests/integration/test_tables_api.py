"""Cross-tabs, quantiles, variance and covariance over HTTP: the baselines' registration."""

from __future__ import annotations

from typing import Any

from tests.integration.conftest import Api


def _release(api: Api, ds: str, mechanism: str, params: dict[str, Any],
             budget: dict[str, float]) -> dict[str, Any]:
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": budget})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    assert doc["cost"] == budget
    return doc


def test_cross_tab_end_to_end(api: Api, dataset: dict[str, Any], worker: Any) -> None:
    doc = _release(api, dataset["id"], "gaussian",
                   {"statistic": "mean", "column": "income", "group_by": ["group"],
                    "consistency": True}, {"epsilon": 1, "delta": 1e-6})
    result = doc["result"]
    assert result["categories"] == ["a", "b", "c"] and len(result["intervals"]) == 3
    assert all(c >= 0 for c in result["consistent_counts"])
    assert doc["accuracy"]["count"]["epsilon"] == 0.5 and "consistency" in doc["accuracy"]
    counts = _release(api, dataset["id"], "laplace", {"statistic": "count",
                                                       "group_by": ["group"]}, {"epsilon": 1})
    assert len(counts["result"]["values"]) == 3 and counts["result"]["errors"][0] > 0
    png = api.get(f"/v1/releases/{counts['id']}/plot.png")
    assert png.status_code == 200 and png.data[:4] == b"\x89PNG"


def test_quantiles_end_to_end(api: Api, dataset: dict[str, Any], worker: Any) -> None:
    doc = _release(api, dataset["id"], "laplace",
                   {"statistic": "quantile", "column": "age", "quantiles": [0.25, 0.5, 0.75],
                    "grid_size": 101}, {"epsilon": 1.5})
    assert doc["result"]["quantiles"] == [0.25, 0.5, 0.75]
    assert all(0 <= v <= 100 for v in doc["result"]["values"])
    assert doc["accuracy"]["epsilon_per_quantile"] == 0.5
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "gaussian",
                                     "params": {"statistic": "quantile", "column": "age",
                                                "quantiles": [0.5]},
                                     "budget": {"epsilon": 1, "delta": 1e-6}})
    assert resp.status_code == 422 and resp.get_json()["field"] == "params.statistic"


def test_variance_and_covariance_end_to_end(api: Api, dataset: dict[str, Any],
                                            worker: Any) -> None:
    std = _release(api, dataset["id"], "laplace", {"statistic": "std", "column": "age"},
                   {"epsilon": 1})
    assert 0 <= std["result"]["value"] <= 50.2
    cov = _release(api, dataset["id"], "gaussian",
                   {"statistic": "covariance", "columns": ["age", "income"], "psd": True},
                   {"epsilon": 1, "delta": 1e-6})
    matrix = cov["result"]["matrix"]
    assert matrix[0][1] == matrix[1][0] and cov["result"]["columns"] == ["age", "income"]
    assert len(cov["accuracy"]["ci95_halfwidths"]) == 3


def test_too_many_cells_is_refused_naming_group_by(api: Api) -> None:
    cats = [str(i) for i in range(101)]
    meta = {"name": "wide", "budgets": {"epsilon": 5},
            "columns": {"u": {"type": "categorical", "categories": cats},
                        "v": {"type": "categorical", "categories": cats}}}
    ds = api.upload("u,v\n1,2\n3,4\n", meta).get_json()["id"]
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "laplace",
                                     "params": {"statistic": "count", "group_by": ["u", "v"]},
                                     "budget": {"epsilon": 1}})
    assert resp.status_code == 422 and resp.get_json()["field"] == "params.group_by"
