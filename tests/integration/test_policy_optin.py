"""Issue #27.3: a dataset admits only the notions, measures and record-level releases its
operator wrote down, and an allocation that lists some measures allows none of the others.

On main, ``{"epsilon": 3, "delta": 1e-7}`` got a ``subset_draws`` cap of 1 per categorical
column and admitted all four notions and every record-level mechanism, and an ε-only
allocation left every other measure unlimited: each test here fails there.
In-process API, the session's real store (a worker only where a release must end).
"""

from __future__ import annotations

import io
import itertools
import json
import secrets
from typing import Any

import pytest
import redis
from flask import Flask

from service import apikeys, wiring
from service.storage.keys import KeyStore
from service.storage.ledger import Reservation
from tests.integration import record_state
from tests.integration.conftest import TOKEN, Api
from tests.integration.test_console import _csrf, _signed_in

CATS = ["d0", "d1", "d2", "d3", "d4"]
COLUMNS = {"diag": {"type": "categorical", "categories": CATS},
           "age": {"type": "integer", "bounds": [0, 100]},
           "income": {"type": "continuous", "bounds": [0, 1000]}}
CSV = "diag,age,income\n" + "".join(
    f"{CATS[i % 5]},{20 + i % 60},{(i * 37) % 1000}.5\n" for i in range(120))
UNIFORM = {"family": "uniform", "low": 0, "high": 100}

#: one valid request per family: (mechanism, params, budget)
LAPLACE = ("laplace", {"statistic": "mean", "column": "income"}, {"epsilon": 0.05})
GAUSSIAN = ("gaussian", {"statistic": "mean", "column": "income"},
            {"epsilon": 0.05, "delta": 1e-8})
SUBSET = ("subset.uniform", {"column": "diag"}, {"subset_draws": 1})
INTERVAL = ("interval.case1", {"column": "age", "anchors": UNIFORM},
            {"interval_leakage": 0.9})
NOISELESS = ("noiseless.aggregate", {"statistic": "mean", "column": "age"},
             {"noiseless_bits": 8})
NOISELESS_LOCAL = ("noiseless.local", {"column": "income"}, {"noiseless_bits": 8})
DIP = ("dip", {"columns": ["income", "diag"]}, {"epsilon": 0.5})
LRM = ("lrm", {"columns": ["income"]}, {"epsilon": 0.5})
OPM_BALL = ("opm.l2ball", {"column": "income"}, {"epsilon": 0.5})


def _upload(api: Api, **meta: Any) -> dict[str, Any]:
    resp = api.upload(CSV, {"name": "patients", "columns": COLUMNS, **meta})
    assert resp.status_code == 201, resp.get_json()
    doc: dict[str, Any] = resp.get_json()
    return doc


def _body(ds: str, probe: tuple[str, dict[str, Any], dict[str, Any]],
          **extra: Any) -> dict[str, Any]:
    mechanism, params, amounts = probe
    return {"dataset_id": ds, "mechanism": mechanism, "params": params, "budget": amounts,
            **extra}


def _ledger_state(app: Flask, ds: str) -> tuple[Any, int, Any]:
    """Everything a refused request must leave as it was, read from the session's store:
    the dataset's ledger (caps, spent and held per measure and per key's allocation, the
    allocations' rules, the notion lock), how many audit events and the dataset's newest
    release (a new one, even refused, would be the newest)."""
    ledger = wiring.of(app).ledger
    return ((ledger.budget(ds), ledger.allocation_scopes(ds), ledger.notion_lock(ds)),
            len(ledger.events(ds)), ledger.dataset_history(ds, 1))


# -- the dataset's own policy ----------------------------------------------------------


def test_epsilon_delta_dataset_is_dp_only_and_refuses_record_level(
        api: Api, app: Flask, r: redis.Redis) -> None:
    """The issue's case: ``{"epsilon": 3, "delta": 1e-7}`` with a categorical diagnosis.
    It stores notions ["dp"] and record_level false (the API and the console's dataset page
    show them), has no subset_draws cap, and refuses
    every subset, interval and noiseless release (422 notion_not_admitted) and DIP, lrm
    and opm.l2ball (422 record_level_not_admitted), as releases and as estimates, with
    nothing reserved and no audit event (main: the subset release was 202)."""
    doc = _upload(api, budgets={"epsilon": 3, "delta": 1e-7})
    ds = doc["id"]
    assert doc["notions"] == ["dp"] and doc["record_level"] is False
    assert not any(m.startswith("subset_draws") for m in doc["budgets"])
    shown = api.get(f"/v1/datasets/{ds}").get_json()
    assert shown["notions"] == ["dp"] and shown["record_level"] is False
    page = _signed_in(app, TOKEN).get(f"/console/datasets/{ds}").get_data(as_text=True)
    assert '<td id="policy-notions">dp</td>' in page
    assert "refused (record_level: false)" in page
    before = _ledger_state(app, ds)
    expected = [(SUBSET, "notion_not_admitted"), (INTERVAL, "notion_not_admitted"),
                (NOISELESS, "notion_not_admitted"), (NOISELESS_LOCAL, "notion_not_admitted"),
                (DIP, "record_level_not_admitted"), (LRM, "record_level_not_admitted"),
                (OPM_BALL, "record_level_not_admitted")]
    for probe, code in expected:
        for path in ("/v1/releases", "/v1/releases/estimate"):
            resp = api.post(path, _body(ds, probe))
            problem = resp.get_json()
            assert resp.status_code == 422, (probe[0], path, problem)
            assert problem["code"] == code and problem["field"] == "mechanism", problem
    assert _ledger_state(app, ds) == before
    # a cap cannot enable a notion the metadata does not admit: it would never be spent
    for body, field in (({"caps": {"subset_draws": 5}}, "caps.subset_draws"),
                        ({"caps": {"interval_leakage:age": 0.5}},
                         "caps.interval_leakage:age")):
        patch = api.client.patch(f"/v1/datasets/{ds}/budget", json=body,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        assert patch.status_code == 422 and patch.get_json()["field"] == field
    assert _ledger_state(app, ds) == before
    # the dataset's own notion still works
    assert api.post("/v1/releases/estimate", _body(ds, LAPLACE)).get_json()["fits"]


def test_opt_in_enables_exactly_what_is_named(api: Api, app: Flask) -> None:
    """Notions, record-level releases and measures are three separate opt-ins: each one
    missing refuses with its own 422 (naming the measure), before anything is reserved."""
    everything = ["dp", "noiseless", "interval", "subset"]
    on = _upload(api, budgets={"epsilon": 3, "delta": 1e-7, "subset_draws:diag": 1},
                 notions=["dp", "subset"], record_level=True)
    assert on["notions"] == ["dp", "subset"] and on["record_level"] is True
    assert api.post("/v1/releases/estimate", _body(on["id"], SUBSET)).get_json()["fits"]
    assert api.post("/v1/releases/estimate", _body(on["id"], DIP)).status_code == 200

    # record-level not opted in: the subset notion and its cap are not enough
    off = _upload(api, budgets={"epsilon": 3, "subset_draws:diag": 1},
                  notions=["dp", "subset"])
    resp = api.post("/v1/releases", _body(off["id"], SUBSET))
    assert resp.status_code == 422
    assert resp.get_json()["code"] == "record_level_not_admitted"

    # every notion admitted, record-level allowed, but no measure named: no default cap
    uncapped = _upload(api, budgets={"epsilon": 3}, notions=everything, record_level=True)
    before = _ledger_state(app, uncapped["id"])
    for probe, measure in ((SUBSET, "subset_draws"), (INTERVAL, "interval_leakage"),
                           (NOISELESS, "noiseless_bits"), (GAUSSIAN, "delta")):
        for path in ("/v1/releases", "/v1/releases/estimate"):
            problem = api.post(path, _body(uncapped["id"], probe)).get_json()
            assert problem["status"] == 422, (probe[0], problem)
            assert problem["code"] == "measure_not_admitted", problem
            assert problem["measure"] == measure and problem["field"] == "mechanism"
    assert _ledger_state(app, uncapped["id"]) == before

    # a per-column cap names that column only
    other = _upload(api, budgets={"epsilon": 3, "interval_leakage:income": 0.9},
                    record_level=True)
    assert other["notions"] == ["dp", "interval"]
    problem = api.post("/v1/releases", _body(other["id"], INTERVAL)).get_json()
    assert problem["code"] == "measure_not_admitted", problem
    assert problem["measure"] == "interval_leakage:age"


def test_version_keeps_the_dataset_policy(api: Api) -> None:
    """record_level belongs to the dataset: a version naming another value is refused
    (422 naming the field), one omitting it keeps the dataset's."""
    ds = _upload(api, budgets={"epsilon": 3})
    meta = {"name": "patients", "columns": COLUMNS}
    for change, status in (({"record_level": True}, 422), ({}, 201)):
        data = {"metadata": json.dumps({**meta, **change}), "compatible": "true",
                "file": (io.BytesIO(CSV.encode()), "v.csv")}
        resp = api.client.post(f"/v1/datasets/{ds['id']}/versions", data=data,
                               headers={"Authorization": f"Bearer {TOKEN}"},
                               content_type="multipart/form-data")
        assert resp.status_code == status, resp.get_json()
        if status == 422:
            assert resp.get_json()["field"] == "metadata.record_level"


# -- allocations -----------------------------------------------------------------------


def _everything(api: Api) -> dict[str, Any]:
    """A dataset whose operator enabled every notion and measure and record-level ones."""
    return _upload(api, budgets={"epsilon": 5, "delta": 1e-5, "subset_draws": 2,
                                 "interval_leakage": 0.95, "noiseless_bits": 20},
                   notions=["dp", "noiseless", "interval", "subset"], record_level=True)


def test_epsilon_allocation_allows_no_other_measure(api: Api, app: Flask,
                                                    keys: KeyStore, worker: Any) -> None:
    """An analyst whose allocation lists only ε cannot spend subset draws, interval leakage,
    noiseless bits or δ, though the dataset has caps for them: 409 budget_exhausted,
    scope allocation, listed false, nothing held; its estimate says it does not fit
    (main: every one was accepted)."""
    ds = _everything(api)["id"]
    key, token = apikeys.create(keys, "analyst", label="eps only")
    patch = api.client.patch(f"/v1/datasets/{ds}/budget",
                             json={"allocations": {key.id: {"epsilon": 1}}},
                             headers={"Authorization": f"Bearer {TOKEN}"})
    assert patch.status_code == 200, patch.get_json()
    assert patch.get_json()["allocation_rules"] == {key.id: "listed"}
    analyst = Api(app.test_client(), token)
    for probe, measure in ((SUBSET, "subset_draws:diag"), (INTERVAL, "interval_leakage:age"),
                           (NOISELESS, "noiseless_bits"), (GAUSSIAN, "delta")):
        before = _ledger_state(app, ds)
        est = analyst.estimate(_body(ds, probe))
        assert est.status_code == 200, est.get_json()
        assert est.get_json()["fits"] is False
        assert measure in est.get_json()["shortfall"], est.get_json()
        resp = analyst.post("/v1/releases", _body(ds, probe))
        if resp.status_code == 202:  # priced by a worker first: refused there
            assert resp.get_json()["status"] == "pricing", resp.get_json()
            problem = analyst.wait(resp.get_json()["id"], timeout=60)["error"]
        else:
            problem = resp.get_json()
            assert resp.status_code == 409, problem
            assert _ledger_state(app, ds)[0] == before[0]  # nothing held
        assert problem["code"] == "budget_exhausted", problem
        assert problem["scope"] == "allocation" and problem["listed"] is False
        assert problem["measure"] == measure
    ok = analyst.post("/v1/releases", _body(ds, LAPLACE))
    assert ok.status_code == 202, ok.get_json()
    budget = analyst.get(f"/v1/datasets/{ds}/budget").get_json()
    assert set(budget["allocations"][key.id]) == {"epsilon"}
    held = {m for m, row in budget["measures"].items() if row["committed"] + row["reserved"]}
    assert held <= {"epsilon"}


def test_per_column_allocation(api: Api, app: Flask, keys: KeyStore) -> None:
    """An allocation of ``interval_leakage:age`` lists that column only; one of
    ``interval_leakage`` (no column) lists every column, as a cap does."""
    ds = _everything(api)["id"]
    one, one_token = apikeys.create(keys, "analyst", label="age only")
    every, every_token = apikeys.create(keys, "analyst", label="all columns")
    patch = api.client.patch(f"/v1/datasets/{ds}/budget", json={"allocations": {
        one.id: {"interval_leakage:age": 0.95}, every.id: {"interval_leakage": 0.95}}},
        headers={"Authorization": f"Bearer {TOKEN}"})
    assert patch.status_code == 200, patch.get_json()
    income = ("interval.case1", {"column": "income",
                                 "anchors": {"family": "uniform", "low": 0, "high": 1000}},
              {"interval_leakage": 0.9})
    for token, probe, fits in ((one_token, INTERVAL, True), (one_token, income, False),
                               (every_token, INTERVAL, True), (every_token, income, True)):
        est = Api(app.test_client(), token).estimate(_body(ds, probe))
        assert est.status_code == 200 and est.get_json()["fits"] is fits, est.get_json()


# -- the route x role grid ---------------------------------------------------------------

ROUTES = ("api.release", "api.estimate", "console.request", "console.estimate")
#: probes on the grid's dataset: (request, what the operator wrote down for it)
GRID_PROBES = {"laplace": LAPLACE, "subset": SUBSET, "gaussian": GAUSSIAN,
               "noiseless": NOISELESS}


def _console(app: Flask, token: str, route: str, ds: str,
             probe: tuple[str, dict[str, Any], dict[str, Any]]) -> tuple[int, str]:
    """The console's mechanism form: (status, page); a request that went through is a
    redirect to its release page."""
    client = _signed_in(app, token)
    mechanism, params, amounts = probe
    path = f"/console/mechanisms/{mechanism}"
    form = {"csrf_token": _csrf(client, path), "dataset_id": ds,
            "action": "request" if route == "console.request" else "estimate",
            **{f"p.{k}": json.dumps(v) if isinstance(v, dict) else str(v)
               for k, v in params.items()},
            **{f"b.{m}": str(a) for m, a in amounts.items()}}
    resp = client.post(path, data=form)
    return resp.status_code, resp.get_data(as_text=True)


def test_route_role_grid_spends_only_what_the_operator_wrote(
        api: Api, app: Flask, keys: KeyStore) -> None:
    """Operator, allocated analyst, unallocated analyst and consumer x every route that
    can spend or estimate (API release and estimate, the console's request and estimate
    forms) x one probe per case: named and allocated (laplace: ε), named but not in the
    analyst's allocation (subset draws), a measure not named (gaussian's δ) and a notion
    not admitted (noiseless). Each cell gets the answer the operator's policy implies,
    and afterwards the ledger holds spend only on measures the operator named, and the
    allocated analyst's only on ε."""
    ds = _upload(api, budgets={"epsilon": 5, "subset_draws:diag": 20},
                 notions=["dp", "subset"], record_level=True)["id"]
    allocated, allocated_token = apikeys.create(keys, "analyst", label="grid allocated")
    _free, free_token = apikeys.create(keys, "analyst", label="grid unallocated")
    _consumer, consumer_token = apikeys.create(keys, "consumer", label="grid consumer")
    patch = api.client.patch(f"/v1/datasets/{ds}/budget",
                             json={"allocations": {allocated.id: {"epsilon": 2}}},
                             headers={"Authorization": f"Bearer {TOKEN}"})
    assert patch.status_code == 200
    # the allocated analyst first: the console sends no seed, so a later identical request
    # replays the first one (a replay spends nothing, and any key with the grant may read
    # the release anyway)
    roles = {"analyst": allocated_token, "operator": TOKEN, "analyst_free": free_token,
             "consumer": consumer_token}

    def expected(role: str, probe: str) -> str:
        if role == "consumer":
            return "forbidden"
        if probe == "gaussian":
            return "measure_not_admitted"
        if probe == "noiseless":
            return "notion_not_admitted"
        if probe == "subset" and role == "analyst":
            return "not_allocated"
        return "ok"

    seeds = itertools.count(1)
    for role, route, probe in itertools.product(roles, ROUTES, GRID_PROBES):
        want, token = expected(role, probe), roles[role]
        where = (role, route, probe)
        request = GRID_PROBES[probe]
        if route.startswith("api."):
            path = "/v1/releases" if route == "api.release" else "/v1/releases/estimate"
            # a seed per cell: identical requests would replay the first one
            resp = Api(app.test_client(), token).post(
                path, _body(ds, request, seed=next(seeds)))
            doc = resp.get_json()
            if want == "forbidden":
                assert resp.status_code == 403, where
            elif want in {"measure_not_admitted", "notion_not_admitted"}:
                assert resp.status_code == 422 and doc["code"] == want, (where, doc)
            elif route == "api.estimate":
                assert resp.status_code == 200, (where, doc)
                assert doc["fits"] is (want == "ok"), (where, doc)
            elif want == "not_allocated":
                assert resp.status_code == 409 and doc["listed"] is False, (where, doc)
            else:
                assert resp.status_code in {200, 202}, (where, doc)
        else:
            status, page = _console(app, token, route, ds, request)
            if want == "forbidden":
                assert status == 403, where
            elif want in {"measure_not_admitted", "notion_not_admitted"}:
                assert status == 422, (where, page[-2000:])
            elif route == "console.estimate":
                assert status == 200, (where, page[-2000:])
                assert ("Does not fit" in page) is (want != "ok"), where
            elif want == "not_allocated":
                assert status == 409, where
            else:
                assert status == 302, (where, page[-2000:])
    budget = api.get(f"/v1/datasets/{ds}/budget").get_json()
    spent = {m for m, row in budget["measures"].items() if row["committed"] + row["reserved"]}
    assert spent <= {"epsilon", "subset_draws:diag"} and "subset_draws:diag" in spent
    mine = budget["allocations"][allocated.id]
    assert set(mine) == {"epsilon"}
    assert mine["epsilon"]["reserved"] + mine["epsilon"]["committed"] > 0
    # the allocated analyst's own releases charged ε only
    for event in api.get(f"/v1/datasets/{ds}/ledger?kind=reserve").get_json():
        if event["actor"] == allocated.id:
            assert set(event["units"]) == {"epsilon"}, event


@pytest.mark.parametrize("probe", [SUBSET, DIP])
def test_record_level_refused_for_every_role(api: Api, app: Flask, keys: KeyStore,
                                             probe: Any) -> None:
    """Without the opt-in a record-level mechanism is refused whoever asks, the operator
    included (the opt-in is metadata, not a role)."""
    ds = _upload(api, budgets={"epsilon": 3, "subset_draws:diag": 1},
                 notions=["dp", "subset"])["id"]
    _key, token = apikeys.create(keys, "analyst", label="record level")
    for who in (TOKEN, token):
        for path in ("/v1/releases", "/v1/releases/estimate"):
            resp = Api(app.test_client(), who).post(path, _body(ds, probe))
            assert resp.status_code == 422, resp.get_json()
            assert resp.get_json()["code"] == "record_level_not_admitted"


# -- the ledger script alone -----------------------------------------------------------


def test_reserve_script_enforces_the_rules_itself(app: Flask) -> None:
    """The store's reserve step (PgLedger's transaction) refuses, atomically
    and whatever the caller checked: a measure the dataset's caps do not name
    (not_admitted), and a measure a listed allocation does not list (exhausted, scope
    allocation, not listed); a legacy allocation limits only what it lists. A refusal
    holds nothing and records nothing."""
    from tests.integration.conftest import LEDGER_REQUEST

    ds = "ds_policy_" + secrets.token_hex(6)
    ledger = wiring.of(app).ledger
    ledger.open(ds, {"epsilon": 10**10, "noiseless_bits": 10**10}, "op")
    ledger.set_caps(ds, {"epsilon": 10**9}, "op", key_id="key_listed")
    ledger.set_caps(ds, {"epsilon": 10**9}, "op", key_id="key_legacy")
    # what the policy migration leaves on an allocation written before allocations listed
    record_state.set_allocation_scope(ledger, ds, "key_legacy", "legacy")
    assert ledger.allocation_scopes(ds) == {"key_listed": "listed", "key_legacy": "legacy"}
    assert ledger.named_measures(ds) == {"epsilon", "noiseless_bits"}

    def reserve(rid: str, cost: dict[str, int], actor: str) -> Any:
        rid = f"{rid}_{ds}"
        return ledger.reserve(Reservation(ds, rid, cost, actor=actor, fingerprint=rid,
                              request_json=LEDGER_REQUEST))

    before = _ledger_state(app, ds)
    res = reserve("rel_p1", {"delta": 1, "epsilon": 1}, "key_free")
    assert (res.outcome, res.measure) == ("not_admitted", "delta")
    res = reserve("rel_p2", {"noiseless_bits": 5}, "key_listed")
    assert (res.outcome, res.scope, res.listed, res.remaining) == (
        "exhausted", "allocation", False, 0)
    assert _ledger_state(app, ds) == before  # nothing held, nothing recorded
    assert reserve("rel_p3", {"noiseless_bits": 5}, "key_legacy").outcome == "reserved"
    assert reserve("rel_p4", {"noiseless_bits": 5}, "key_free").outcome == "reserved"
    assert reserve("rel_p5", {"epsilon": 5}, "key_listed").outcome == "reserved"
