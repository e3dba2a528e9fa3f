"""Analyses validated at POST, listed per release, and their errors (issue #15 item 6).

Against the session's real Valkey and worker: what an analysis would refuse at run
time is a 422 naming the field before anything is queued, a release lists only the
analyses it can run, and ``GET /v1/releases/{id}/analyses`` pages newest first.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from tests.integration.conftest import Api


def _release(api: Api, ds: str, mechanism: str, params: dict[str, Any],
             budget: dict[str, float]) -> dict[str, Any]:
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": budget})
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    return doc


N = 300


@pytest.fixture(scope="module")
def interval(app: Any, worker: Any) -> dict[str, Any]:
    """One case-1 (uniform anchors) and one case-2 release of a 300-row column."""
    api = Api(app.test_client())
    ages = np.clip(np.random.default_rng(5).normal(40, 10, size=N), 0, 100)
    meta = {"name": "ages", "record_level": True, "budgets": {"interval_leakage": 1.0},
            "columns": {"age": {"type": "continuous", "bounds": [0, 100]}}}
    csv = "age\n" + "\n".join(f"{a:.3f}" for a in ages) + "\n"
    uniform = {"family": "uniform", "low": 0, "high": 100}
    out = {}
    for name in ("case1", "case2"):  # a dataset each: leakage caps are at most 1
        resp = api.upload(csv, meta)
        assert resp.status_code == 201, resp.get_json()
        out[name] = _release(api, resp.get_json()["id"], f"interval.{name}",
                             {"column": "age", "anchors": uniform}, {"interval_leakage": 0.9})
    case1, case2 = out["case1"], out["case2"]
    return {"case1": case1, "case2": case2}


@pytest.fixture(scope="module")
def custom(app: Any, worker: Any) -> dict[str, Any]:
    """A subset.custom release (a non-uniform design) of a 4-category column."""
    api = Api(app.test_client())
    cats = ["a", "b", "c", "d"]
    meta = {"name": "cats", "record_level": True, "budgets": {"subset_draws": 1},
            "columns": {"c": {"type": "categorical", "categories": cats}}}
    resp = api.upload("c\n" + "".join(f"{cats[i % 4]}\n" for i in range(200)), meta)
    assert resp.status_code == 201, resp.get_json()
    design = {"type": "mu", "subsets": [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"],
                                        ["a", "d"], ["b", "c"]],
              "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]}
    return _release(api, resp.get_json()["id"], "subset.custom",
                    {"column": "c", "design": design}, {"subset_draws": 1})


def _post(api: Api, release_id: str, name: str, params: dict[str, Any] | None = None) -> Any:
    return api.post(f"/v1/releases/{release_id}/analyses",
                    {"analysis": name, "params": params or {}})


def test_mean_is_refused_at_post_on_case2_and_not_listed(api: Api,
                                                         interval: dict[str, Any]) -> None:
    """Catches: main listed ``mean`` for every interval release and answered 202 on a
    case-2 one; the job then failed ("Example 2's mean needs Case-I ranges")."""
    case1, case2 = interval["case1"], interval["case2"]
    assert "mean" in case1["analyses"] and "npmle" in case1["analyses"]
    assert "mean" not in case2["analyses"] and "npmle" in case2["analyses"]
    again = api.get(f"/v1/releases/{case2['id']}").get_json()
    assert again["analyses"] == case2["analyses"]
    resp = _post(api, case2["id"], "mean")
    assert resp.status_code == 422
    body = resp.get_json()
    assert body["field"] == "analysis" and "mean" not in body["detail"].split("[")[1]
    assert api.get(f"/v1/releases/{case2['id']}/analyses").get_json() == []
    catalog = {m["name"]: m for m in api.get("/v1/mechanisms").get_json()}
    offering = {name for name, m in catalog.items() if "mean" in m["analyses"]}
    assert offering == {"interval.case1", "interval.progressive"}
    assert {"npmle", "moments", "regression"} <= set(catalog["interval.case2"]["analyses"])


def test_regression_with_the_wrong_number_of_rows_is_refused_at_post(
        api: Api, interval: dict[str, Any]) -> None:
    """Catches: n is public, yet main accepted features of the wrong length with 202."""
    resp = _post(api, interval["case2"]["id"], "regression",
                 {"features": [[1.0]] * (N - 1)})
    assert resp.status_code == 422
    assert resp.get_json()["field"] == "params.features"
    assert str(N) in resp.get_json()["detail"]


def test_pava_on_case2_is_refused_at_post(api: Api, interval: dict[str, Any]) -> None:
    resp = _post(api, interval["case2"]["id"], "npmle", {"method": "pava"})
    assert resp.status_code == 422 and resp.get_json()["field"] == "params.method"


def test_mom_closed_on_a_non_uniform_design_is_refused_at_post(
        api: Api, custom: dict[str, Any]) -> None:
    """Catches: main queued ``mom_closed`` on a custom design and failed it later."""
    resp = _post(api, custom["id"], "estimate", {"method": "mom_closed"})
    assert resp.status_code == 422
    assert resp.get_json()["field"] == "params.method"
    assert "uniform" in resp.get_json()["detail"]
    ok = _post(api, custom["id"], "estimate", {"method": "mom"})
    assert ok.status_code == 202, ok.get_json()


def _done(api: Api, release_id: str, aid: str) -> dict[str, Any]:
    for _ in range(600):
        doc: dict[str, Any] = api.get(f"/v1/releases/{release_id}/analyses/{aid}").get_json()
        if doc["status"] not in {"queued", "running"}:
            return doc
        time.sleep(0.05)
    raise TimeoutError(aid)


def test_a_release_lists_its_analyses_newest_first_in_pages(
        api: Api, interval: dict[str, Any]) -> None:
    """Catches: main had no list of a release's analyses (405), and stored them unordered."""
    rid = interval["case1"]["id"]
    ids = []
    for params in ({"method": "pava"}, {"method": "cnm"}, {"method": "auto"}):
        resp = _post(api, rid, "npmle", params)
        assert resp.status_code == 202, resp.get_json()
        ids.append(resp.get_json()["id"])
        assert resp.get_json()["work"] > 0
    first = api.get(f"/v1/releases/{rid}/analyses?limit=2")
    assert first.status_code == 200
    page = first.get_json()  # every list's envelope (#31 item 6): an array, the cursor a header
    assert [a["id"] for a in page] == ids[:-3:-1]  # newest first
    cursor = first.headers["X-Next-Cursor"]
    assert first.headers["Link"].endswith('; rel="next"') and f"cursor={cursor}" in (
        first.headers["Link"].replace("%3A", ":"))
    rest = api.get(f"/v1/releases/{rid}/analyses?limit=2&cursor={cursor}")
    tail = rest.get_json()
    listed = [a["id"] for a in page + tail]
    assert listed[:3] == ids[::-1] and "X-Next-Cursor" not in rest.headers
    assert api.get(f"/v1/releases/{rid}/analyses?limit=0").status_code == 422
    assert api.get(f"/v1/releases/{rid}/analyses?cursor=x").status_code == 422
    for aid in ids:
        assert _done(api, rid, aid)["status"] == "succeeded"


def test_mle_and_functionals_over_http(api: Api, interval: dict[str, Any]) -> None:
    """Issue #17 items 1-2 over HTTP: ``mle`` and ``functionals`` are listed for interval
    releases, run on the worker, and absurd sizes are refused with 422 naming the field.
    The column is N(40, 10) clipped to [0, 100] (n = 300, Case-I uniform anchors)."""
    rid = interval["case1"]["id"]
    assert {"mle", "functionals"} <= set(interval["case1"]["analyses"])
    resp = _post(api, rid, "mle", {"family": "normal"})
    assert resp.status_code == 202, resp.get_json()
    mle = _done(api, rid, resp.get_json()["id"])
    assert mle["status"] == "succeeded", mle
    fit = mle["result"]
    assert abs(fit["params"]["loc"] - 40) < 4 * fit["se"]["loc"]
    assert fit["truncated_to"] == [0.0, 100.0]
    spec = [{"type": "cdf", "t": 40}, {"type": "quantile", "p": 0.5}]
    resp = _post(api, rid, "functionals", {"functionals": spec, "bootstrap": 30})
    assert resp.status_code == 202, resp.get_json()
    done = _done(api, rid, resp.get_json()["id"])
    assert done["status"] == "succeeded", done
    items = done["result"]["functionals"]
    assert [i["type"] for i in items] == ["cdf", "quantile"]
    for item in items:
        assert item["ci"][0] <= item["estimate"] <= item["ci"][1]
    too_many = _post(api, rid, "functionals", {"functionals": spec, "bootstrap": 5000})
    assert too_many.status_code == 422
    assert "bootstrap" in too_many.get_json()["field"]
    wrong = _post(api, rid, "mle", {"family": "cauchy"})
    assert wrong.status_code == 422 and "family" in wrong.get_json()["field"]


def test_estimate_shows_additive_and_exact_composition(api: Api,
                                                       interval: dict[str, Any]) -> None:
    """Issues #17 item 3 and #27 item 2 over HTTP: a second Case-I estimate on a column
    that already has one (uniform anchors on [0, 100], uniform prior) is charged the
    additive 1/3 (column total 2/3) and shows the exact joint leakage as information: two
    uniform cuts leave three spacings with E[Σ spacing²] = 1/2, so the joint total is 1/2,
    which holds only for designs fixed in advance."""
    first = interval["case1"]
    body = {"dataset_id": first["dataset_id"], "mechanism": "interval.case1",
            "params": {"column": "age", "anchors": {"family": "uniform", "low": 0,
                                                    "high": 100}},
            "budget": {"interval_leakage": 0.9}}
    resp = api.post("/v1/releases/estimate", body)
    assert resp.status_code == 200, resp.get_json()
    comp = resp.get_json()["accuracy"]["composition"]
    assert comp["earlier_releases"] == 1 and comp["charged"] == "additive"
    assert comp["additive"]["charge"] == pytest.approx(1 / 3, abs=0.003)
    assert comp["charge"] == comp["additive"]["charge"]
    assert comp["additive"]["column_total"] == pytest.approx(2 / 3, abs=0.006)
    assert comp["exact"]["available"]
    assert comp["exact"]["joint_leakage"] == pytest.approx(1 / 2, abs=0.003)
    assert "fixed in advance" in comp["exact"]["note"]
