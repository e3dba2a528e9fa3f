"""Subset-design thresholds through the API (issue #17 item 6): 422 before anything is spent."""

from __future__ import annotations

from typing import Any

from tests.integration.conftest import Api

CATS = ["a", "b", "c", "d", "e"]


def _dataset(api: Api, **extra: Any) -> str:
    meta = {"name": "survey", "record_level": True, "budgets": {"subset_draws": 2},
            "columns": {"x": {"type": "categorical", "categories": CATS,
                              "subset_policy": {"max_prediction_risk": 0.45}},
                        "y": {"type": "categorical", "categories": CATS}}, **extra}
    csv = "x,y\n" + "".join(f"{CATS[i % 5]},{CATS[(3 * i) % 5]}\n" for i in range(50))
    resp = api.upload(csv, meta)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def test_policy_violation_is_422_and_reserves_nothing(api: Api) -> None:
    """The dataset default (τ ≥ 0.6) refuses y's uniform design (τ = 0.52 under the uniform
    prior) with code policy_violation naming the threshold, on release and estimate alike;
    the ledger holds nothing. On a permissive dataset, estimate shows the values and the
    thresholds (x's own R ≤ 0.45 beside the dataset default). Old code: 200/202."""
    ds = _dataset(api, subset_policy={"min_size_coverage": 0.6})
    body = {"dataset_id": ds, "mechanism": "subset.uniform", "params": {"column": "y"},
            "budget": {"subset_draws": 1}}
    for path in ("/v1/releases", "/v1/releases/estimate"):
        resp = api.post(path, body)
        problem = resp.get_json()
        assert resp.status_code == 422, problem
        assert problem["code"] == "policy_violation"
        assert problem["field"] == "metadata.subset_policy.min_size_coverage"
        assert problem["threshold"] == "min_size_coverage" and problem["limit"] == 0.6
        assert abs(problem["computed"] - 0.52) < 1e-12
    measures = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]
    assert all(row["reserved"] == 0 and row["committed"] == 0 for row in measures.values())

    ok = _dataset(api, subset_policy={"min_size_coverage": 0.5})
    est = api.post("/v1/releases/estimate", {**body, "dataset_id": ok,
                                             "params": {"column": "x"}})
    assert est.status_code == 200, est.get_json()
    (var,) = est.get_json()["accuracy"]["policy"]["variables"]
    assert var["thresholds"] == {"min_size_coverage": 0.5, "max_prediction_risk": 0.45}
    assert abs(var["computed"]["prediction_risk"] - 0.4) < 1e-12
