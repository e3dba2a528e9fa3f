"""Extreme but valid metadata x params, for every mechanism, through the real API.

Issue 15 item 4: ``transform: "exp"`` with calibration on bounds beyond ±709 was a 500
(``cannot convert float NaN to integer``), an extreme beta prior a 500
(``ZeroDivisionError``), ``dip`` on ±1e308 bounds a failed job, ``iclp.kde`` /
``bernstein.kde`` on ±1e308 bounds an all-zero density charged ε. Item 5: unknown
prior families, non-positive scales and scipy's parameter names registered with 201.

The sweep (hypothesis, derandomized, bounded) draws a dataset whose numeric domains run
from 1e-100 to 1e308 and whose prior is any family with any parameters in (and around)
the documented ranges, uploads it, and asks every registered mechanism for a release with
parameters drawn from a menu that includes every transform and calibration. For every
request: never a 5xx; a refusal is a 4xx naming a field; an upload refused names a
``metadata`` field; a release accepted with 202 succeeds, and what it charged for holds
no NaN or infinity and, for a density, is not all zero. Runs in the session's Flask app
against the real Valkey and worker.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mechanisms
from mechanisms.interval.priors import RANGES
from tests.integration.conftest import Api

CATS = ["a", "b", "c", "d"]
PAIRS6 = [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"], ["a", "d"], ["b", "c"]]
N_ROWS = 40
LEAK = {"interval_leakage": 0.15}
EPS = {"epsilon": 1}
BITS = {"noiseless_bits": 3}
DRAW = {"subset_draws": 1}

#: per mechanism: (params, budget) choices; x continuous, k integer, g and h categorical,
#: f functional. Every transform and calibration of the interval family is here.
MENU: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {
    "bernstein.kde": [({"column": "x"}, EPS), ({"column": "x", "grid_size": 64}, EPS)],
    "dip": [({"columns": ["x"]}, EPS), ({"columns": ["x", "k", "g"]}, EPS)],
    "exm": [({"column": "h", "draws": 3}, EPS), ({"column": "k"}, EPS)],
    "lrm": [({"columns": ["x"]}, EPS), ({"columns": ["x", "k"], "round_to": 1.0}, EPS)],
    "opm.l2ball": [({"column": "x"}, EPS), ({"column": "k", "center": "midpoint"}, EPS)],
    "opm.mean": [({"columns": ["x", "k"]}, EPS),
                 ({"columns": ["x"], "k": 4, "moment_bound": 1.0}, EPS)],
    "frl.mean": [({"column": "f"}, EPS)],
    "gaussian": [({"statistic": "mean", "column": "x"}, {"epsilon": 1, "delta": 1e-6}),
                 ({"statistic": "histogram", "column": "x", "bins": 4},
                  {"epsilon": 1, "delta": 1e-6})],
    "geometric": [({"statistic": "sum", "column": "k"}, EPS),
                  ({"statistic": "count", "condition": {"column": "x", "op": "ge",
                                                        "value": 0}}, EPS)],
    "iclp.kde": [({"column": "x"}, EPS)],
    "iclp.mean": [({"column": "f"}, EPS)],
    "iclp.erm": [({"covariate": "x", "response": "k"}, EPS),
                 ({"covariate": "x", "response": "k", "loss": "logistic"}, EPS)],
    "iclp.cov": [({"column": "f"}, EPS), ({"column": "f", "centred": False}, EPS)],
    "iclp.fos": [({"response": "f", "covariates": ["x", "k"]}, EPS)],
    "iclp.kde2d": [({"columns": ["x", "k"]}, EPS)],
    "iclp.ar": [({"column": "f"}, EPS)],
    "bernstein.mean": [({"column": "f"}, EPS)],
    "gp.adp": [({"column": "f"}, {"epsilon": 1, "delta": 1e-6})],
    "frl.kde": [({"column": "x"}, EPS)],
    "laplace": [({"statistic": "mean", "column": "x"}, EPS),
                ({"statistic": "sum", "column": "x"}, EPS),
                ({"statistic": "histogram", "column": "k", "bins": 3}, EPS)],
    "noiseless.aggregate": [({"statistic": "mean", "column": "x"}, BITS),
                            ({"statistic": "sum", "column": "k"}, BITS),
                            ({"statistic": "median", "column": "x"}, BITS)],
    "noiseless.vector": [({"queries": [{"statistic": "mean", "column": "x", "bits": 1},
                                       {"statistic": "max", "column": "k", "bits": 2}]}, BITS)],
    "noiseless.local": [({"column": "x"}, BITS), ({"column": "k"}, BITS)],
    "subset.custom": [({"column": "g", "design": {
        "type": "mu", "subsets": PAIRS6,
        "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]}}, DRAW)],
    "subset.dummy": [({"column": "h", "alpha": 0.3}, DRAW)],
    "subset.product": [({"columns": ["g", "h"]}, DRAW)],
    "subset.uniform": [({"column": "h"}, DRAW)],
    "interval.progressive": [({"column": "x", "rounds": 2}, {"interval_leakage": 0.9}),
                             ({"column": "k", "rounds": 2}, {"interval_leakage": 0.9})],
    "interval.progressive_categorical": [({"column": "g", "rounds": 1},
                                          {"interval_leakage": 0.6}),
                                         ({"column": "h", "rounds": 3},
                                          {"interval_leakage": 0.9})],
    "interval.ring": [({"column": "x"}, LEAK),
                      ({"column": "x", "calibrate": True, "transform": "exp"}, LEAK)],
}
for _name, _extra in [("interval.case1", {}), ("interval.case2", {}),
                      ("interval.casek", {"m": 3}), ("interval.selective", {"tau": 0.5})]:
    MENU[_name] = [({"column": c, "calibrate": True, "transform": t, **_extra}, LEAK)
                   for c, t in [("x", "identity"), ("x", "exp"), ("x", "square"),
                                ("x", "log"), ("k", "identity"), ("k", "exp")]]

DENSITIES = {"iclp.kde", "bernstein.kde", "frl.kde"}


def test_menu_covers_every_registered_mechanism() -> None:
    assert set(MENU) == set(mechanisms.names())


def _magnitude(low: int, high: int) -> st.SearchStrategy[float]:
    """10**e for an integer exponent in [low, high], and the ends' neighbours."""
    return st.integers(low, high).map(lambda e: 10.0 ** e)


@st.composite
def bounds(draw: st.DrawFn) -> list[float]:
    """Continuous bounds from 1e-100-wide to ±1e308, centred anywhere, incl. exp's ±709."""
    kind = draw(st.sampled_from(["centred", "edge", "exp"]))
    if kind == "edge":
        return draw(st.sampled_from([[-1e308, 1e308], [-1e100, 1e100], [0.0, 1e100],
                                     [-1e100, -1e99], [0.0, 1e-100], [1.0, 1.0 + 1e-9]]))
    if kind == "exp":
        lo = draw(st.sampled_from([-1000.0, -800.0, -745.0, -10.0, 0.0, 700.0]))
        return [lo, lo + draw(st.sampled_from([5.0, 10.0, 100.0, 2000.0]))]
    centre = draw(st.sampled_from([0.0, 1.0, -1.0])) * draw(_magnitude(-50, 100))
    width = draw(_magnitude(-100, 100))
    return [centre - width, centre + width]


@st.composite
def priors(draw: st.DrawFn, lo: float, hi: float) -> dict[str, Any] | None:
    """None, or any family with parameters in its range (sometimes at or past the ends)."""
    if draw(st.booleans()):
        return None
    family = draw(st.sampled_from(sorted(RANGES)))
    prior: dict[str, Any] = {"family": family}
    for name, (low, high) in RANGES[family].items():
        if family == "beta" and name in ("low", "high"):
            continue
        if name in ("loc", "low", "high"):
            u = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
            prior[name] = lo + (hi - lo) * u if math.isfinite(hi - lo) else lo / 2 + hi / 2
        elif name == "scale" and family != "gamma" and math.isfinite(hi - lo):
            # relative to the span: from numerically a point to no mass on the bounds
            prior[name] = min(high, max(low, (hi - lo) * 10.0 ** draw(st.integers(-12, 12))))
        else:
            position = draw(st.sampled_from([0.5, 0.0, 1.0, 0.5, 1.001]))
            if low > 0:  # log-uniform in the range, 1.001: just past the top
                prior[name] = math.exp(math.log(low) + position * math.log(high / low))
            else:
                prior[name] = low + position * (high - low)
    if family == "uniform":
        prior["low"], prior["high"] = lo, hi
    return prior


@st.composite
def datasets(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """(metadata, CSV) of x (continuous), k (integer), g, h (categorical), f (functional)."""
    lo, hi = draw(bounds())
    k_lo, k_hi = draw(st.sampled_from([(0, 1), (-(2**53), 2**53), (-1000, 1000),
                                       (2**53 - 3, 2**53), (700, 800), (-800, -750)]))
    h_cats = [f"c{i}" for i in range(draw(st.integers(2, 6)))]
    grid_lo = draw(st.sampled_from([0.0, -1e50, 1e6]))
    grid_width = draw(_magnitude(-6, 99))
    m = draw(st.integers(2, 12))
    norm_bound = draw(_magnitude(-50, 100))
    column_x: dict[str, Any] = {"type": "continuous", "bounds": [lo, hi]}
    prior = draw(priors(lo, hi))
    if prior is not None:
        column_x["prior"] = prior
    meta = {"name": "sweep", "bounds_policy": "clip", "record_level": True,
            "budgets": {"epsilon": 100, "delta": 1e-3, "noiseless_bits": 100,
                        "interval_leakage": 1, "subset_draws": 10},
            "columns": {"x": column_x, "k": {"type": "integer", "bounds": [k_lo, k_hi]},
                        "g": {"type": "categorical", "categories": CATS},
                        "h": {"type": "categorical", "categories": h_cats},
                        "f": {"type": "functional", "norm_bound": norm_bound,
                              "grid": (grid_lo + grid_width * np.linspace(0, 1, m)).tolist()}}}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    u = rng.random(N_ROWS)
    span = hi - lo
    x = lo + span * u if math.isfinite(span) else lo * (1 - u) + hi * u
    k = [k_lo + int(v * (k_hi - k_lo)) for v in rng.random(N_ROWS)]
    curves = norm_bound * 0.1 * rng.standard_normal((N_ROWS, m)) / math.sqrt(m)
    header = ["x", "k", "g", "h", *(f"f.{i}" for i in range(m))]
    lines = [",".join(header)]
    for i in range(N_ROWS):
        cells = [repr(float(np.clip(x[i], lo, hi))), str(k[i]), CATS[i % 4],
                 h_cats[i % len(h_cats)], *(repr(float(v)) for v in curves[i])]
        lines.append(",".join(cells))
    return meta, "\n".join(lines) + "\n"


def _finite_numbers(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_numbers(v) for v in value)
    return True


def _refusal(resp: Any, prefix: tuple[str, ...]) -> None:
    """A 4xx problem document naming a field (or a budget conflict: 409)."""
    body = resp.get_json()
    assert 400 <= resp.status_code < 500, (resp.status_code, body)
    if resp.status_code == 422:
        assert str(body.get("field", "")).startswith(prefix), body


#: ~3 s per example that reaches the releases (about half do): ~35 s in CI
SWEEP_EXAMPLES = int(os.environ.get("SWEEP_EXAMPLES", "12"))


@settings(max_examples=SWEEP_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=datasets(), choices=st.data())
def test_sweep_every_mechanism_on_extreme_metadata(
        api: Api, worker: Any, data: tuple[dict[str, Any], str], choices: st.DataObject
) -> None:
    meta, csv = data
    upload = api.upload(csv, meta)
    if upload.status_code != 201:
        _refusal(upload, ("metadata",))
        assert upload.status_code == 422
        event(f"upload refused at {upload.get_json()['field']}")
        return
    ds = upload.get_json()["id"]
    accepted: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in sorted(MENU):
        params, budget = choices.draw(st.sampled_from(MENU[name]), label=name)
        resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": name,
                                         "params": params, "budget": budget, "seed": 1})
        if resp.status_code == 202:
            accepted[name] = (resp.get_json()["id"], params)
        else:
            _refusal(resp, ("params", "budget"))
    event(f"{len(accepted)} of {len(MENU)} releases accepted")
    for name, (release_id, params) in accepted.items():
        doc = api.wait(release_id, timeout=60.0)
        context = json.dumps({"mechanism": name, "params": params,
                              "x": meta["columns"]["x"]})[:600]
        if doc["status"] == "refused":  # cold: priced by a worker, refused as the POST
            error = doc["error"]
            assert 400 <= error["status"] < 500, (context, error)
            if error["status"] == 422:
                assert str(error.get("field", "")).startswith(("params", "budget")), error
            continue
        assert doc["status"] == "succeeded", (context, doc.get("error"))
        assert _finite_numbers(doc["result"]) and _finite_numbers(doc["accuracy"]), context
        if name in DENSITIES:
            assert any(v != 0 for v in doc["result"]["values"]), context


ISSUE_UPLOADS = [
    ({"family": "cauchy", "loc": 0, "scale": 1}, "metadata.columns.x.prior.family"),
    ({"family": "normal", "loc": 5, "scale": 0}, "metadata.columns.x.prior.scale"),
    ({"family": "normal", "loc": 5, "scale": -1}, "metadata.columns.x.prior.scale"),
    ({"family": "lognormal", "s": 1, "scale": 1}, "metadata.columns.x.prior.s"),
    ({"family": "normal", "mean": 5, "sd": 1}, "metadata.columns.x.prior.mean"),
    ({"family": "normal", "loc": 5, "sd": 1}, "metadata.columns.x.prior.sd"),
    ({"family": "beta", "a": 1e300, "b": 1e300}, "metadata.columns.x.prior.a"),
]


@pytest.mark.parametrize(("prior", "field"), ISSUE_UPLOADS)
def test_issue_priors_are_422_at_upload(api: Api, prior: dict[str, Any], field: str) -> None:
    """Catches the 201 these got (and the releases they broke later)."""
    meta = {"name": "p", "record_level": True, "budgets": {"interval_leakage": 1},
            "columns": {"x": {"type": "continuous", "bounds": [0, 10], "prior": prior}}}
    resp = api.upload("x\n1\n2\n", meta)
    assert resp.status_code == 422, resp.get_json()
    assert resp.get_json()["field"] == field


def test_huge_bounds_are_422_at_upload(api: Api) -> None:
    """Catches ±1e308 bounds registering (dip then failed, the KDEs released zeros)."""
    meta = {"name": "p", "record_level": True, "budgets": {"epsilon": 1},
            "columns": {"x": {"type": "continuous", "bounds": [-1e308, 1e308]}}}
    resp = api.upload("x\n1\n2\n", meta)
    assert resp.status_code == 422 and resp.get_json()["field"] == "metadata.columns.x.bounds"


@pytest.mark.parametrize("name", ["interval.case1", "interval.case2", "interval.casek",
                                  "interval.selective"])
def test_exp_transform_beyond_709_is_422_at_post(api: Api, worker: Any, name: str) -> None:
    """Catches the 500 (NaN in calibrate_scale); nothing is reserved. A cold request is
    refused after pricing with the same 422 (its error), a warm one at the POST."""
    meta = {"name": "e", "record_level": True, "budgets": {"interval_leakage": 1},
            "columns": {"x": {"type": "continuous", "bounds": [-1000, 1000]}}}
    ds = api.upload("x\n1\n2\n", meta).get_json()["id"]
    params = {"column": "x", "calibrate": True, "transform": "exp",
              **{"interval.casek": {"m": 3}, "interval.selective": {"tau": 0.5}}.get(name, {})}
    resp = api.post("/v1/releases", {"dataset_id": ds, "mechanism": name, "params": params,
                                     "budget": {"interval_leakage": 0.5}})
    problem, status = resp.get_json(), resp.status_code
    if status == 202:  # cold: priced by a worker, which refuses it as the POST would
        doc = api.wait(problem["id"])
        assert doc["status"] == "refused", doc
        problem, status = doc["error"], doc["error"]["status"]
    assert status == 422, problem
    assert problem["field"] == "params.transform"
    spent = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]
    assert spent["interval_leakage:x"]["reserved"] == 0 == spent["interval_leakage:x"][
        "committed"]


def test_openapi_documents_the_metadata(api: Api) -> None:
    spec = api.get("/openapi.json").get_json()
    body = spec["paths"]["/v1/datasets"]["post"]["requestBody"]["content"][
        "multipart/form-data"]
    assert body["schema"]["properties"]["metadata"] == {
        "$ref": "#/components/schemas/DatasetMetadata"}
    assert body["encoding"]["metadata"]["contentType"] == "application/json"
    schemas = spec["components"]["schemas"]
    assert {"DatasetMetadata", "ContinuousColumn", "IntegerColumn", "CategoricalColumn",
            "FunctionalColumn", "NormalPrior", "BetaPrior", "GammaPrior"} <= set(schemas)
    assert set(schemas["BetaPrior"]["properties"]) == {"family", "a", "b", "low", "high"}
