"""DIP's competitors through the whole service: upload, release, microdata CSV, ledger.

One dataset, four releases (lrm on two columns with rounding, opm.mean, opm.l2ball,
exm): each is charged exactly its ε, microdata come back as CSV with every row (exm:
its draws), and the ledger adds the four charges.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.integration.conftest import Api


def _release(api: Api, ds: str, mechanism: str, params: dict[str, Any],
             epsilon: float) -> dict[str, Any]:
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": {"epsilon": epsilon}})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    assert doc["cost"] == {"epsilon": epsilon} and "epsilon-DP" in doc["guarantee"]
    return doc


def _csv(api: Api, release_id: str) -> list[dict[str, str]]:
    lines = api.get(f"/v1/releases/{release_id}/data").get_data(as_text=True).splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]


def test_competitors_release_through_the_api(api: Api, worker: Any) -> None:
    rng = np.random.default_rng(31)
    n = 300
    x = np.clip(rng.normal(5, 2, size=n), 0, 10)
    k = rng.binomial(5, 0.5, size=n)
    g = rng.choice(3, size=n, p=[0.6, 0.3, 0.1])
    meta = {"name": "competitors", "record_level": True, "budgets": {"epsilon": 10},
            "columns": {"x": {"type": "continuous", "bounds": [0, 10]},
                        "k": {"type": "integer", "bounds": [0, 5]},
                        "g": {"type": "categorical", "categories": ["u", "v", "w"]}}}
    csv = "x,k,g\n" + "".join(f"{a:.4f},{b},{'uvw'[c]}\n" for a, b, c in zip(x, k, g,
                                                                             strict=True))
    resp = api.upload(csv, meta)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]

    lrm = _release(api, ds, "lrm", {"columns": ["x", "k"], "round_to": 0.5}, 2)
    rows = _csv(api, lrm["id"])
    assert len(rows) == n and [int(r["_row"]) for r in rows] == list(range(n))
    assert all(float(r["x"]) * 2 == round(float(r["x"]) * 2) and 0 <= float(r["x"]) <= 10
               for r in rows)
    assert lrm["result"]["epsilon"] == {"total": 2.0, "per_column": 1.0}

    opm_mean = _release(api, ds, "opm.mean", {"columns": ["x"], "center": "midpoint"}, 1)
    sd = opm_mean["accuracy"]["columns"]["x"]["ci95_halfwidth_chebyshev"]
    assert abs(opm_mean["result"]["values"][0] - x.mean()) < sd + 0.5  # noise + 4 SE of data

    ball = _release(api, ds, "opm.l2ball", {"column": "x"}, 1)
    z = np.array([float(r["x"]) for r in _csv(api, ball["id"])])
    assert z.size == n
    assert abs(np.sqrt(np.sum(z * z)) / ball["result"]["B"] - 1) < 1e-9  # on the sphere

    exm = _release(api, ds, "exm", {"column": "g", "draws": 5}, 5)
    draws = _csv(api, exm["id"])
    assert len(draws) == 5 and all(r["g"] in {"u", "v", "w"} for r in draws)

    bad = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "exm",
                                    "params": {"column": "x"}, "budget": {"epsilon": 1}})
    assert bad.status_code == 422 and bad.get_json()["field"] == "params.column"
    spent = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert spent["committed"] == 9.0 and spent["reserved"] == 0.0
