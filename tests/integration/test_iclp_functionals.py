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
