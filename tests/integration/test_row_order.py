"""Microdata in a secret per-dataset row order, through the service (issue #17 item 7)."""

from __future__ import annotations

import base64
import json
import os
import stat
from typing import Any

import numpy as np

from mechanisms import rows
from service import datasets, wiring
from service.storage.objects import LocalStore
from tests.integration.conftest import Api

CATS = ["a", "b", "c", "d", "e"]
N = 200


def _upload(api: Api, x: np.ndarray, **extra: Any) -> str:
    """Columns x and y hold the same categories row by row."""
    meta = {"name": "survey", "budgets": {"subset_draws": 1, "noiseless_bits": 8},
            "record_level": True,
            "columns": {"x": {"type": "categorical", "categories": CATS},
                        "y": {"type": "categorical", "categories": CATS},
                        "v": {"type": "continuous", "bounds": [0, 4]}}, **extra}
    csv = "x,y,v\n" + "".join(f"{CATS[c]},{CATS[c]},{c}\n" for c in x)
    resp = api.upload(csv, meta)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def _release(api: Api, ds: str, mechanism: str, params: dict[str, Any],
             budget: dict[str, float]) -> dict[str, Any]:
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": budget, "seed": 7})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    return doc


def _subsets(api: Api, release_id: str, column: str) -> list[set[str]]:
    lines = api.get(f"/v1/releases/{release_id}/data").get_data(as_text=True).splitlines()
    at = lines[0].split(",").index(column)
    return [set(line.split(",")[at].split("|")) for line in lines[1:]]


def test_releases_are_permuted_alike_and_pair_rows(api: Api, worker: Any) -> None:
    """x's and y's subset releases and a noiseless.local release of v list the same row at
    each position; the order is not the dataset's and differs for another dataset.

    Probability argument for "not the input order": read in the dataset's order, position
    j holds the subset of row r = order[j]. When r != j and x_r != x_j (about 0.8 of
    positions, categories uniform on 5), the p = 5 uniform design's subset holding x_r also
    holds x_j with probability 4 * 0.1 = 0.4, so the check fails at about 200 * 0.8 * 0.6
    = 96 positions (sd about 7); asking for >= 40 leaves a miss below 1e-12. Old code (rows
    in the dataset's order) fails at 0 positions.
    """
    x = np.random.default_rng(3).integers(0, 5, N)
    ds = _upload(api, x)
    rel_x = _release(api, ds, "subset.uniform", {"column": "x", "format": "categories"},
                     {"subset_draws": 1})
    rel_y = _release(api, ds, "subset.uniform", {"column": "y", "format": "categories"},
                     {"subset_draws": 1})
    loc = _release(api, ds, "noiseless.local", {"column": "v"}, {"noiseless_bits": 4})
    order = api.released_rows(ds, N)
    truth = [CATS[c] for c in x[order]]
    sx, sy = _subsets(api, rel_x["id"], "x"), _subsets(api, rel_y["id"], "y")
    assert all(t in a and t in b for t, a, b in zip(truth, sx, sy, strict=True))
    lines = api.get(f"/v1/releases/{loc['id']}/data").get_data(as_text=True).splitlines()
    values = np.array([float(v) for v in lines[1:]])
    assert np.all(np.abs(values - x[order]) <= 0.5)  # 16 levels on [0, 4]: exact-ish
    in_dataset_order = sum(CATS[c] not in s for c, s in zip(x, sx, strict=True))
    assert in_dataset_order >= 40
    for doc in (rel_x, loc):
        assert "secret per-dataset order" in doc["guarantee"]
        assert "secret per-dataset order" in doc["result"]["row_order"]

    other = _upload(api, x)
    assert np.count_nonzero(api.released_rows(other, N) == order) < 20  # Poisson(1) overlap


def test_keep_row_order_leaves_the_dataset_order(api: Api, worker: Any) -> None:
    """The operator flag (local collection): record j is row j; the guarantee says so."""
    x = np.random.default_rng(4).integers(0, 5, N)
    ds = _upload(api, x, keep_row_order=True)
    rel = _release(api, ds, "subset.uniform", {"column": "x", "format": "categories"},
                   {"subset_draws": 1})
    subsets = _subsets(api, rel["id"], "x")
    assert all(CATS[c] in s for c, s in zip(x, subsets, strict=True))
    assert "dataset's row order" in rel["guarantee"] and "secret" not in rel["guarantee"]
    assert api.get(f"/v1/datasets/{ds}").get_json()["keep_row_order"] is True


def test_row_key_is_private(api: Api, worker: Any) -> None:
    """32 owner-only bytes (after the order version's byte) beside the dataset's data object
    that no API response contains, in any encoding (raw, hex, base64)."""
    x = np.random.default_rng(5).integers(0, 5, N)
    ds = _upload(api, x)
    rel = _release(api, ds, "subset.uniform", {"column": "x"}, {"subset_draws": 1})
    store = wiring.of(api.client.application).datasets
    objects = store.objects
    assert isinstance(objects, LocalStore)  # the session's default store: the data directory
    path = objects.root / store.key(ds, 1) / datasets.ROW_KEY
    stored = path.read_bytes()
    key = stored[1:]
    assert stored[0] == rows.V2 and len(key) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    needles = [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key),
               base64.urlsafe_b64encode(key), json.dumps(key.decode("latin-1")).encode()[1:-1]]
    paths = [f"/v1/datasets/{ds}", "/v1/datasets", f"/v1/datasets/{ds}/budget",
             f"/v1/datasets/{ds}/ledger", f"/v1/releases/{rel['id']}",
             f"/v1/releases/{rel['id']}/data", "/v1/releases", "/openapi.json"]
    for where in paths:
        body = api.get(where).get_data()
        assert not any(n in body for n in needles), where
