"""Each mechanism family through the whole service: upload, release, outputs, analyses."""

from __future__ import annotations

import math
import struct
import time
from typing import Any

import numpy as np

from tests.integration.conftest import Api


def _release(api: Api, ds: str, mechanism: str, params: dict[str, Any],
             budget: dict[str, float]) -> dict[str, Any]:
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": budget})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    return doc


def _analysis(api: Api, release_id: str, name: str, params: dict[str, Any] | None = None,
              others: list[str] | None = None) -> dict[str, Any]:
    resp = api.post(f"/v1/releases/{release_id}/analyses",
                    {"analysis": name, "params": params or {}, "releases": others or []})
    assert resp.status_code == 202, resp.get_json()
    aid = resp.get_json()["id"]
    for _ in range(600):
        doc: dict[str, Any] = api.get(f"/v1/releases/{release_id}/analyses/{aid}").get_json()
        if doc["status"] in {"succeeded", "failed"}:
            assert doc["status"] == "succeeded", doc
            return doc
        time.sleep(0.05)
    raise TimeoutError(aid)


def test_iclp_mean_of_curves_with_plot(api: Api, worker: Any) -> None:
    grid = np.linspace(0, 1, 25)
    rng = np.random.default_rng(3)
    curves = np.sin(2 * math.pi * grid) + 0.1 * rng.normal(size=(300, grid.size))
    header = ",".join(f"f.{i}" for i in range(grid.size))
    csv = header + "\n" + "\n".join(",".join(f"{v:.6f}" for v in row) for row in curves)
    meta = {"name": "curves", "budgets": {"epsilon": 4},
            "columns": {"f": {"type": "functional", "grid": grid.tolist(), "norm_bound": 2}}}
    resp = api.upload(csv + "\n", meta)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]
    doc = _release(api, ds, "iclp.mean", {"column": "f"}, {"epsilon": 2})
    values = np.array(doc["result"]["values"])
    assert values.shape == (25,) and doc["result"]["grid"] == grid.tolist()
    # the released mean tracks sin(2πt) within a few RMSEs of the stated accuracy
    err = np.sqrt(np.mean((values - np.sin(2 * math.pi * grid)) ** 2))
    assert err < 0.5
    png = api.get(f"/v1/releases/{doc['id']}/plot.png")
    assert png.status_code == 200 and png.mimetype == "image/png"
    assert struct.unpack(">II", png.data[16:24]) == (600, 350)
    spent = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert spent["committed"] == 2.0
