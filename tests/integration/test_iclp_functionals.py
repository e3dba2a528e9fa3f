"""ICLP functionals through the HTTP API: the grid limits and the ERM / covariance /
function-on-scalar / 2-D density releases with their plots."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.metadata import MAX_CSV_FIELDS, MAX_GRID
from tests.integration.conftest import Api


def _curves_csv(grid_size: int, rows: int, scalars: int = 3) -> tuple[str, dict[str, Any]]:
    grid = np.linspace(0.0, 1.0, grid_size)
    rng = np.random.default_rng(7)
    curves = np.sin(2 * np.pi * grid) + 0.1 * rng.normal(size=(rows, grid_size))
    header = [f"f.{i}" for i in range(grid_size)] + [f"s{j}" for j in range(scalars)]
    lines = [",".join(header)]
    for row in curves:
        lines.append(",".join(f"{v:.3f}" for v in row) + "," + ",".join(["0.5"] * scalars))
    columns: dict[str, Any] = {"f": {"type": "functional", "grid": grid.tolist(),
                                     "norm_bound": 2}}
    columns.update({f"s{j}": {"type": "continuous", "bounds": [0, 1]} for j in range(scalars)})
    return "\n".join(lines) + "\n", {"name": "wide curves", "budgets": {"epsilon": 4},
                                     "columns": columns}


def test_largest_advertised_grid_uploads_and_releases(api: Api, worker: Any) -> None:
    """Issue 16 item 3: a 2,000-point functional column plus scalars used to be refused
    by the 1,000-field CSV header limit; now it uploads and releases, and one more grid
    point (or one more header field than MAX_CSV_FIELDS) is still refused."""
    csv, meta = _curves_csv(MAX_GRID, rows=12)
    resp = api.upload(csv, meta)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]
    release = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "frl.mean",
                                        "params": {"column": "f"}, "budget": {"epsilon": 1},
                                        "seed": 1})
    assert release.status_code == 202, release.get_json()
    doc = api.wait(release.get_json()["id"], timeout=120)
    assert doc["status"] == "succeeded", doc
    assert len(doc["result"]["values"]) == MAX_GRID

    csv, too_big = _curves_csv(MAX_GRID + 1, rows=2)
    resp = api.upload(csv, too_big)
    assert resp.status_code == 422
    assert resp.get_json()["field"].startswith("metadata.columns.f")

    width = MAX_CSV_FIELDS + 1
    wide = ",".join(f"c{i}" for i in range(width)) + "\n" + ",".join(["1"] * width) + "\n"
    resp = api.upload(wide, meta)
    assert resp.status_code == 422
    assert f"more than {MAX_CSV_FIELDS} columns" in str(resp.get_json())


def _release(api: Api, ds: str, mechanism: str, params: dict[str, Any],
             epsilon: float) -> dict[str, Any]:
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": {"epsilon": epsilon},
                                     "seed": 5})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"], timeout=60)
    assert doc["status"] == "succeeded", doc
    png = api.get(f"/v1/releases/{doc['id']}/plot.png")
    assert png.status_code == 200 and png.mimetype == "image/png"
    return doc


def test_functionals_release_and_plot(api: Api, worker: Any) -> None:
    """iclp.erm, iclp.cov, iclp.fos and iclp.kde2d through HTTP: each charges exactly its
    ε, returns its shape (curve / surface / curves) and draws a plot."""
    rng = np.random.default_rng(11)
    n, m = 300, 20
    grid = np.linspace(0.0, 1.0, m)
    x = rng.uniform(0, 1, n)
    y = np.clip(2 * x - 1 + 0.2 * rng.normal(size=n), -1, 1)
    z = rng.uniform(-1, 1, n)
    curves = np.sin(np.pi * grid) + np.outer(z, grid) + 0.1 * rng.normal(size=(n, m))
    header = ["x", "y", "z"] + [f"f.{i}" for i in range(m)]
    lines = [",".join(header)] + [
        ",".join([f"{x[i]:.5f}", f"{y[i]:.5f}", f"{z[i]:.5f}"] + [f"{v:.5f}" for v in curves[i]])
        for i in range(n)]
    meta = {"name": "functionals", "budgets": {"epsilon": 10}, "columns": {
        "x": {"type": "continuous", "bounds": [0, 1]},
        "y": {"type": "continuous", "bounds": [-1, 1]},
        "z": {"type": "continuous", "bounds": [-1, 1]},
        "f": {"type": "functional", "grid": grid.tolist(), "norm_bound": 3}}}
    resp = api.upload("\n".join(lines) + "\n", meta)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]

    erm = _release(api, ds, "iclp.erm", {"covariate": "x", "response": "y"}, 2)
    fit = np.array(erm["result"]["values"])
    assert fit.shape == (100,) and erm["cost"]["epsilon"] in ("2", 2, 2.0)
    assert np.corrcoef(fit, erm["result"]["grid"])[0, 1] > 0.5  # increasing in x
    cov = _release(api, ds, "iclp.cov", {"column": "f"}, 2)
    values = np.array(cov["result"]["values"])
    assert values.shape == (m, m) and np.array_equal(values, values.T)
    assert cov["accuracy"]["epsilon_split"] == {"second_moment": "3/2", "mean": "1/2"}
    fos = _release(api, ds, "iclp.fos", {"response": "f", "covariates": ["z"]}, 2)
    assert np.array(fos["result"]["values"]).shape == (2, m)
    assert fos["result"]["names"] == ["(intercept)", "z"]
    kde = _release(api, ds, "iclp.kde2d", {"columns": ["x", "z"], "grid_size": 16}, 1)
    density = np.array(kde["result"]["values"])
    assert density.shape == (16, 16) and np.all(density >= 0)
    spent = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert spent["committed"] == 7.0
    bad = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "iclp.erm",
                                    "params": {"covariate": "f", "response": "y"},
                                    "budget": {"epsilon": 1}})
    assert bad.status_code == 422 and bad.get_json()["field"] == "params.covariate"
