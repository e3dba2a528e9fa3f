"""Releases a person can read through the service (issue #31 items 1-2), in-process.

``plot.png``/``plot.svg`` answer a histogram, quantiles and a mean (404 "no function to
draw" before) with axis titles, the statistic, its column and ε in the SVG twin; a
record-level release is still 404, saying where its numbers are. The console's release
page opens on the accuracy sentence with ± as itself, the result as a table with its
interval, and the JSON behind "details"; the estimate shows its accuracy in words first.
"""

from __future__ import annotations

import html
import io
import re
from typing import Any

import pytest
from flask import Flask
from matplotlib import image as mpimg

from service import apikeys
from service.storage.keys import KeyStore
from tests.integration.conftest import Api
from tests.integration.test_console import _csrf, _signed_in

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _texts(svg: bytes) -> list[str]:
    """The SVG's texts (drawn as paths, each preceded by its text as a comment)."""
    return [html.unescape(t) for t in re.findall(r"<!-- (.*?) -->", svg.decode())]


def _release(api: Api, dataset: dict[str, Any], mechanism: str, params: dict[str, Any],
             budget: dict[str, Any] | None = None) -> dict[str, Any]:
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": mechanism,
                                     "params": params, "budget": budget or {"epsilon": 0.5}})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    return doc


@pytest.mark.parametrize(("params", "labels"), [
    ({"statistic": "histogram", "column": "age", "bins": 4},
     {"bin of age", "count", "[0, 25)", "[75, 100)"}),
    ({"statistic": "quantile", "column": "income", "quantiles": [0.25, 0.5, 0.9]},
     {"quantile level", "income", "0.25", "0.5", "0.9"}),
    ({"statistic": "mean", "column": "income"}, {"statistic", "mean of income"}),
])
def test_tables_quantiles_and_means_are_drawn(api: Api, dataset: dict[str, Any],
                                              worker: Any, params: dict[str, Any],
                                              labels: set[str]) -> None:
    """Issue #31 item 2: these answered 404; now a PNG and its SVG twin with both axis
    titles, the cells' own labels (levels, not 0..3), the statistic, column and ε."""
    rid = _release(api, dataset, "laplace", params)["id"]
    png = api.get(f"/v1/releases/{rid}/plot.png")
    assert png.status_code == 200 and png.data.startswith(PNG_MAGIC)
    pixels = mpimg.imread(io.BytesIO(png.data), format="png")
    assert pixels.shape[1] >= 600 and float(pixels[..., :3].std()) > 0.05
    svg = api.get(f"/v1/releases/{rid}/plot.svg")
    assert svg.status_code == 200 and svg.mimetype == "image/svg+xml"
    texts = _texts(svg.data)
    assert labels <= set(texts), texts
    title = f"{params['statistic']}" + ("s" if params["statistic"] == "quantile" else "")
    assert any(t.startswith(title) and params["column"] in t and "ε = 0.5" in t
               for t in texts), texts


def test_record_level_release_answers_where_its_numbers_are(
        api: Api, dataset: dict[str, Any], worker: Any) -> None:
    rid = _release(api, dataset, "dip", {"columns": ["age"]})["id"]
    resp = api.get(f"/v1/releases/{rid}/plot.png")
    assert resp.status_code == 404
    assert "/data" in resp.get_json()["detail"]


def test_release_page_opens_on_the_accuracy_sentence(app: Flask, api: Api, keys: KeyStore,
                                                      dataset: dict[str, Any],
                                                      worker: Any) -> None:
    """Issue #31 item 1: the sentence first and in words (± as itself, never \\u00b1),
    the result as a table with lower/upper and its level, the JSON behind toggles."""
    doc = _release(api, dataset, "laplace", {"statistic": "histogram", "column": "age",
                                             "bins": 4})
    client = _signed_in(app, apikeys.create(keys, "consumer", label="reader")[1])
    page = client.get(f"/console/releases/{doc['id']}").get_data(as_text=True)
    statement = doc["accuracy"]["statement"]
    assert "±" in statement
    sentence = page.index('id="accuracy-sentence"')
    assert html.escape(statement, quote=False) in page[sentence:sentence + 2000]
    assert "\\u00b1" not in page
    assert sentence < page.index('id="plot"') < page.index('id="result-table"')
    assert page.index('id="result-table"') < page.index('<pre id="accuracy">')
    accuracy = page[page.index('<details id="accuracy-details">'):]
    assert accuracy.index('<pre id="accuracy">') < accuracy.index("</details>")
    table = page[page.index('id="result-table"'):page.index("</table>",
                                                             page.index('id="result-table"'))]
    heads = re.findall(r"<th>(.*?)</th>", table)
    assert heads[:5] == ["bin", "estimate", "lower", "upper", "level"]
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>"
                      r"<td>(.*?)</td>", table)
    half = doc["accuracy"]["ci95_halfwidth"]
    assert [r[0] for r in rows] == ["[0, 25)", "[25, 50)", "[50, 75)", "[75, 100)"]
    for (_, est, lo, hi, level), value in zip(rows, doc["result"]["values"], strict=True):
        assert float(est) == value and float(hi) - float(lo) == 2 * half
        assert level == "0.95"
    assert "Interval at 95 %" in page


def test_estimate_shows_expected_accuracy_in_words_first(app: Flask, keys: KeyStore,
                                                          dataset: dict[str, Any]) -> None:
    client = _signed_in(app, apikeys.create(keys, "analyst", label="estimator")[1])
    page = client.post("/console/mechanisms/laplace", data={
        "csrf_token": _csrf(client, "/console/mechanisms/laplace"), "action": "estimate",
        "dataset_id": dataset["id"], "p.statistic": "mean", "p.column": "income",
        "b.epsilon": "0.5"}).get_data(as_text=True)
    assert 'id="estimate-sentence"' in page, page[:3000]
    sentence = page.index('id="estimate-sentence"')
    assert "within ±" in page[sentence:sentence + 600]
    assert sentence < page.index('<details id="estimate-details">')
    assert "\\u00b1" not in page
