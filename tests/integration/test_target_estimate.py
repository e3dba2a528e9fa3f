"""Budget for a target accuracy through the API (issue #31 item 10)."""

from __future__ import annotations

from typing import Any

from tests.integration.conftest import Api


def test_smoke(api: Api, dataset: dict[str, Any]) -> None:
    body = {"dataset_id": dataset["id"], "mechanism": "laplace",
            "params": {"statistic": "mean", "column": "age"},
            "target": {"half_width": 1.0}}
    resp = api.estimate(body)
    print(resp.status_code, resp.get_json())
    assert resp.status_code == 200
