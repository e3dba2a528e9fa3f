"""Dummy rows (#31 item 9): drawn from the public metadata only, free, marked as not data."""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np
from flask import Flask

from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.iclp.domain import curve_norms, quadrature_weights
from service import apikeys, dummy
from service.storage.keys import KeyStore
from tests.integration.conftest import Api
from tests.integration.test_console import _signed_in


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_dummy_rows_keep_to_the_metadata_and_spend_nothing(api: Api,
                                                           dataset: dict[str, Any]) -> None:
    before = api.get(f"/v1/datasets/{dataset['id']}/budget").get_json()
    resp = api.client.get(f"/v1/datasets/{dataset['id']}/dummy.csv?rows=500&seed=7",
                          headers=api._h())
    assert resp.status_code == 200 and resp.mimetype == "text/csv"
    assert resp.headers["X-Privrelease-Dummy"] == dummy.NOTICE
    assert "dummy-" in resp.headers["Content-Disposition"]
    rows = _rows(resp.get_data(as_text=True))
    assert len(rows) == 500 and list(rows[0]) == ["age", "income", "group"]
    ages = [int(r["age"]) for r in rows]
    incomes = [float(r["income"]) for r in rows]
    assert min(ages) >= 0 and max(ages) <= 100 and 0 <= min(incomes) <= max(incomes) <= 1000
    assert {r["group"] for r in rows} == {"a", "b", "c"}
    again = api.client.get(f"/v1/datasets/{dataset['id']}/dummy.csv?rows=500&seed=7",
                           headers=api._h())
    assert again.get_data() == resp.get_data()  # a seed gives the same rows
    assert api.get(f"/v1/datasets/{dataset['id']}/budget").get_json() == before
    too_many = api.client.get(f"/v1/datasets/{dataset['id']}/dummy.csv?rows=10001",
                              headers=api._h())
    assert too_many.status_code == 422 and too_many.get_json()["field"] == "rows"


def test_the_rows_do_not_depend_on_the_data(api: Api) -> None:
    """Two datasets of one metadata and different data: the same seed, the same rows."""
    from tests.integration.conftest import PEOPLE_META, people_csv

    one = api.upload(people_csv(40), PEOPLE_META).get_json()["id"]
    other = api.upload(people_csv(40).replace("a\n", "b\n"), PEOPLE_META).get_json()["id"]
    texts = [api.client.get(f"/v1/datasets/{d}/dummy.csv?seed=3", headers=api._h())
             .get_data() for d in (one, other)]
    assert texts[0] == texts[1]


def test_every_column_type_is_drawn_within_its_domain() -> None:
    grid = (0.0, 0.1, 0.3, 0.6, 1.0)
    meta = DatasetMeta(n_rows=1, columns={
        "k": ColumnMeta("k", "integer", bounds=(-3, 3)),
        "x": ColumnMeta("x", "continuous", bounds=(0.5, 0.75)),
        "g": ColumnMeta("g", "categorical", categories=("u",)),
        "f": ColumnMeta("f", "functional", grid=grid, norm_bound=2.0)})
    cells = dummy.columns(meta, 2000, np.random.default_rng(1))
    assert set(cells) == {"k", "x", "g", *(f"f.{i}" for i in range(5))}
    assert {int(v) for v in cells["k"]} == set(range(-3, 4))
    assert all(0.5 <= float(v) <= 0.75 for v in cells["x"]) and set(cells["g"]) == {"u"}
    curves = np.array([[float(cells[f"f.{i}"][r]) for i in range(5)] for r in range(2000)])
    norms = curve_norms(curves, quadrature_weights(grid))
    assert norms.max() <= 2.0 + 1e-9 and norms.min() >= 0


def test_the_console_serves_them_from_the_dataset_page(app: Flask, keys: KeyStore,
                                                       dataset: dict[str, Any]) -> None:
    client = _signed_in(app, apikeys.create(keys, "consumer", label="dummy-c")[1])
    page = client.get(f"/console/datasets/{dataset['id']}").get_data(as_text=True)
    assert 'id="dummy-link"' in page
    resp = client.get(f"/console/datasets/{dataset['id']}/dummy.csv")
    assert resp.status_code == 200 and len(_rows(resp.get_data(as_text=True))) == 100
    assert resp.headers["X-Privrelease-Dummy"] == dummy.NOTICE
