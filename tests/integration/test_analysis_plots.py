"""Drawings of analyses and SVG beside PNG (issue #18 §1), against the real worker.

``GET /v1/releases/{rid}/analyses/{aid}/plot.{png,svg}``: the NPMLE's CDF, the fitted
CDF, functionals with intervals, subset estimates as bars; 404 for an analysis with
nothing to draw and, for a key without the dataset's grant, exactly as for a missing
analysis (so nothing is revealed).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from service import apikeys, wiring
from tests.integration.conftest import Api
from tests.integration.test_analyses_api import _done, _post, custom, interval

__all__ = ["custom", "interval"]  # module-scoped fixtures, used here

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: where the drawings are kept for a person to look at (unset: not kept)
KEEP = os.environ.get("PRIVRELEASE_KEEP_PLOTS")


def _analysis(api: Api, rid: str, name: str, params: dict[str, Any]) -> str:
    resp = _post(api, rid, name, params)
    assert resp.status_code == 202, resp.get_json()
    aid: str = resp.get_json()["id"]
    assert _done(api, rid, aid)["status"] == "succeeded"
    return aid


def _check_images(api: Api, rid: str, aid: str, name: str) -> None:
    png = api.get(f"/v1/releases/{rid}/analyses/{aid}/plot.png")
    assert png.status_code == 200, png.get_json()
    assert png.mimetype == "image/png" and png.data.startswith(PNG_MAGIC)
    svg = api.get(f"/v1/releases/{rid}/analyses/{aid}/plot.svg")
    assert svg.status_code == 200, svg.get_json()
    assert svg.mimetype == "image/svg+xml"
    assert svg.data.startswith(b"<?xml") and b"<svg" in svg.data[:2000]
    assert svg.headers["X-Content-Type-Options"] == "nosniff"
    if KEEP:
        with open(os.path.join(KEEP, f"analysis-{name}.png"), "wb") as f:
            f.write(png.data)


@pytest.mark.parametrize(("name", "params"), [
    ("npmle", {}),
    ("mle", {"family": "normal"}),
    ("functionals", {"functionals": [{"type": "cdf", "t": 40}, {"type": "quantile", "p": 0.5},
                                     {"type": "cdf", "t": 50}], "bootstrap": 20}),
])
def test_interval_analyses_are_drawn_as_png_and_svg(api: Api, interval: dict[str, Any],
                                                    name: str, params: dict[str, Any]) -> None:
    rid = interval["case1"]["id"]
    _check_images(api, rid, _analysis(api, rid, name, params), name)


def test_subset_estimate_is_drawn_as_bars(api: Api, custom: dict[str, Any]) -> None:
    rid = custom["id"]
    _check_images(api, rid, _analysis(api, rid, "estimate", {"method": "em"}), "estimate")


def test_nothing_to_draw_missing_and_ungranted_are_404(app: Any, api: Api,
                                                       interval: dict[str, Any]) -> None:
    """A moments result is a few numbers: 404 as a release without a function. A key not
    granted the dataset gets the same 404 as for an analysis that does not exist, and a
    granted consumer gets the drawing."""
    rid = interval["case1"]["id"]
    moments = _analysis(api, rid, "moments", {})
    for fmt in ("png", "svg"):
        resp = api.get(f"/v1/releases/{rid}/analyses/{moments}/plot.{fmt}")
        assert resp.status_code == 404 and resp.get_json()["code"] == "not_found"
    aid = _analysis(api, rid, "npmle", {"method": "pava"})
    keys = wiring.of(app).keys
    granted = Api(app.test_client(), apikeys.create(keys, "consumer",
                                                    datasets=(interval["case1"]["dataset_id"],))[1])
    other = Api(app.test_client(), apikeys.create(keys, "consumer",
                                                  datasets=(interval["case2"]["dataset_id"],))[1])
    for fmt in ("png", "svg"):
        path = f"/v1/releases/{rid}/analyses/{{}}/plot.{fmt}"
        assert granted.get(path.format(aid)).status_code == 200
        hidden, missing = other.get(path.format(aid)), other.get(path.format("ana_none"))
        assert hidden.status_code == missing.status_code == 404
        assert {**hidden.get_json(), "request_id": ""} == {**missing.get_json(), "request_id": ""}
        assert other.get(f"/v1/releases/{rid}/analyses/{aid}").status_code == 404
        unknown = api.get(f"/v1/releases/{rid}/analyses/ana_none/plot.{fmt}")
        assert unknown.status_code == 404
