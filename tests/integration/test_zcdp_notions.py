"""zCDP accounting and per-dataset privacy notions over HTTP and against the real ledger
(the session's store: PostgreSQL or Valkey)."""

from __future__ import annotations

import secrets
import threading
from fractions import Fraction
from typing import Any

from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mechanisms import zcdp
from service import budget, wiring
from service.storage.ledger import Reservation
from service.storage.store import Store
from tests.integration.conftest import LEDGER_OUTPUT, LEDGER_REQUEST, Api

COUNT = {"statistic": "count", "condition": {"column": "k", "op": "ge", "value": 0}}


def _upload(api: Api, **extra: Any) -> str:
    meta = {"name": "z", "columns": {"k": {"type": "integer", "bounds": [0, 9]},
                                     "w": {"type": "continuous", "bounds": [0, 100]}},
            "budgets": {"rho": 1, "noiseless_bits": 8}, **extra}
    csv = "k,w\n" + "".join(f"{i % 10},{i % 100}\n" for i in range(200))
    resp = api.upload(csv, meta)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def _post(api: Api, ds: str, mechanism: str, params: dict[str, Any],
          spend: dict[str, float]) -> Any:
    return api.post("/v1/releases", {"dataset_id": ds, "mechanism": mechanism,
                                     "params": params, "budget": spend})


def _run(api: Api, ds: str, mechanism: str, params: dict[str, Any],
         spend: dict[str, float]) -> dict[str, Any]:
    resp = _post(api, ds, mechanism, params, spend)
    assert resp.status_code == 202, resp.get_json()
    doc = api.wait(resp.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    return doc


def test_zcdp_dataset_over_http(api: Api, worker: Any) -> None:
    """Upload with zcdp accounting; two Gaussian releases at ρ = 0.1 compose to exactly
    0.2; a Laplace release at ε = 0.2 charges ε²/2 = 0.02 into the same ρ budget; the
    budget view shows ρ and its (ε, δ) at the dataset's δ; the estimate shows the ρ cost
    and its conversion. Old code: 'rho' was an unknown measure (422)."""
    ds = _upload(api, gaussian_accounting="zcdp", zcdp_delta=1e-8)
    est = api.estimate({"dataset_id": ds, "mechanism": "gaussian", "params": COUNT,
                        "budget": {"rho": 0.1}})
    assert est.status_code == 200, est.get_json()
    body = est.get_json()
    assert body["cost"] == {"rho": 0.1} and body["fits"]
    want = zcdp.epsilon_for(Fraction(1, 10), Fraction(1, 10**8))
    assert body["accuracy"]["zcdp"]["approx_dp"] == {"epsilon": want, "delta": 1e-8}
    first = _run(api, ds, "gaussian", COUNT, {"rho": 0.1})
    assert first["cost"] == {"rho": 0.1} and "rho-zCDP" in first["guarantee"]
    assert first["privacy"]["notions"] == ["dp"]
    _run(api, ds, "gaussian", {"statistic": "mean", "column": "w"}, {"rho": 0.1})
    lap = _run(api, ds, "laplace", COUNT, {"epsilon": 0.2})
    assert lap["cost"] == {"rho": 0.02} and "pure epsilon-DP" in lap["guarantee"]
    view = api.get(f"/v1/datasets/{ds}/budget").get_json()
    row = view["measures"]["rho"]
    units = budget.cost_units("rho", Fraction(1, 10)) * 2 + budget.cost_units(
        "rho", Fraction(1, 50))
    assert row["committed"] == budget.display("rho", units) == 0.22
    assert row["remaining"] == 0.78 and view["gaussian_accounting"] == "zcdp"
    delta = Fraction(1, 10**8)
    assert row["approx_dp"] == {
        "delta": 1e-8, "cap_epsilon": zcdp.epsilon_for(Fraction(1), delta),
        "committed_epsilon": zcdp.epsilon_for(Fraction(22, 100), delta),
        "remaining_epsilon": zcdp.epsilon_for(Fraction(78, 100), delta)}
    # an (ε, δ) Gaussian budget on a zcdp dataset is a mistake the API names
    bad = _post(api, ds, "gaussian", COUNT, {"epsilon": 1, "delta": 1e-6})
    assert bad.status_code == 422 and bad.get_json()["field"] == "budget"
    patch = api.client.patch(f"/v1/datasets/{ds}/budget", json={"caps": {"epsilon": 2}},
                             headers=api._h())
    assert patch.status_code == 422 and patch.get_json()["field"] == "caps.epsilon"
    # gp.adp calibrates its own (ε, δ): refused here, before its params are even read
    gp = _post(api, ds, "gp.adp", {}, {"epsilon": 1, "delta": 1e-6})
    assert gp.status_code == 422 and gp.get_json()["field"] == "mechanism"
    refused = api.upload("k\n1\n", {"name": "z", "columns": {"k": {"type": "integer",
                                                                  "bounds": [0, 9]}},
                                    "budgets": {"epsilon": 1}, "gaussian_accounting": "zcdp"})
    assert refused.status_code == 422
    assert refused.get_json()["field"] == "metadata.budgets.epsilon"


def test_notion_lock_and_notions_over_http(api: Api, worker: Any) -> None:
    """By default the first DP or noiseless release locks the dataset to its notion: the
    other kind is 409 notion_locked before anything is spent, and both views show the
    lock. A notion the metadata does not admit is 422 notion_not_admitted. With
    allow_mixed_noiseless_dp both run and both say the pair has no finite guarantee."""
    # both notions' measures named (a measure not named is refused before any lock)
    ds = _upload(api, budgets={"rho": 1, "epsilon": 1, "noiseless_bits": 8})
    assert api.get(f"/v1/datasets/{ds}").get_json()["notion_lock"] is None
    noiseless = _run(api, ds, "noiseless.aggregate", {"statistic": "mean", "column": "w"},
                     {"noiseless_bits": 2})
    assert "mixed_noiseless_dp" not in noiseless["privacy"]
    before = api.get(f"/v1/datasets/{ds}/budget").get_json()
    locked = _post(api, ds, "laplace", COUNT, {"rho": 0.1})  # zcdp off: laplace reads ε
    assert locked.status_code == 422  # a bad budget is still a bad budget
    locked = _post(api, ds, "laplace", COUNT, {"epsilon": 0.1})
    problem = locked.get_json()
    assert locked.status_code == 409 and problem["code"] == "notion_locked"
    assert problem["notion"] == "noiseless"
    after = api.get(f"/v1/datasets/{ds}/budget").get_json()
    assert after == before and after["notion_lock"] == "noiseless"
    assert api.get(f"/v1/datasets/{ds}").get_json()["notion_lock"] == "noiseless"
    reserves = api.get(f"/v1/datasets/{ds}/ledger?kind=reserve").get_json()
    assert [e.get("notion_lock") for e in reserves] == ["noiseless"]  # the audit records it
    _run(api, ds, "noiseless.aggregate", {"statistic": "mean", "column": "w"},
         {"noiseless_bits": 3})  # the locked notion goes on

    only_dp = _upload(api, notions=["dp"], budgets={"epsilon": 1, "noiseless_bits": 8})
    no = _post(api, only_dp, "noiseless.aggregate", {"statistic": "mean", "column": "w"},
               {"noiseless_bits": 2})
    assert no.status_code == 422 and no.get_json()["code"] == "notion_not_admitted"
    assert api.get(f"/v1/datasets/{only_dp}/budget").get_json()["notion_lock"] is None

    mixed = _upload(api, allow_mixed_noiseless_dp=True, budgets={"epsilon": 1,
                                                                "noiseless_bits": 8})
    a = _run(api, mixed, "noiseless.aggregate", {"statistic": "mean", "column": "w"},
             {"noiseless_bits": 2})
    b = _run(api, mixed, "laplace", COUNT, {"epsilon": 0.5})
    for doc in (a, b):
        assert doc["privacy"]["mixed_noiseless_dp"]["pair_guarantee"] is None
        assert "no finite guarantee" in doc["privacy"]["mixed_noiseless_dp"]["statement"]
    assert api.get(f"/v1/datasets/{mixed}/budget").get_json()["notion_lock"] is None


def _race(ledger: Store, ds: str) -> dict[str, list[str]]:
    """16 threads released together, half reserving a DP cost, half a noiseless one."""
    outcomes: dict[str, list[str]] = {"dp": [], "noiseless": []}
    barrier = threading.Barrier(16)

    def go(kind: str) -> None:
        measure = "epsilon" if kind == "dp" else "noiseless_bits"
        barrier.wait()
        res = ledger.reserve(Reservation(ds, "rel_" + secrets.token_hex(8), {measure: 1}, actor="a",
                             fingerprint=secrets.token_hex(8), request_json=LEDGER_REQUEST,
                             notion_lock=kind))
        outcomes[kind].append(res.outcome)

    threads = [threading.Thread(target=go, args=("dp" if i % 2 else "noiseless",))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_concurrent_first_releases_lock_exactly_one_notion(app: Flask) -> None:
    """16 threads race first reservations, half DP and half noiseless, on each of 10 fresh
    ledgers: every time exactly one kind wins (all its reservations held), every loser is
    notion_locked and holds nothing. The reserve step (PgLedger's transaction) checks
    and sets the lock atomically."""
    ledger = wiring.of(app).ledger
    for _ in range(10):
        ds = "ds_" + secrets.token_hex(6)
        ledger.open(ds, {"epsilon": 10**9, "noiseless_bits": 10**9}, "op")
        outcomes = _race(ledger, ds)
        winner = ledger.notion_lock(ds)
        loser = "noiseless" if winner == "dp" else "dp"
        assert winner in ("dp", "noiseless")
        assert outcomes[winner] == ["reserved"] * 8
        assert outcomes[loser] == ["notion_locked"] * 8
        balance = ledger.balance(ds)
        held = "epsilon" if winner == "dp" else "noiseless_bits"
        other = "noiseless_bits" if winner == "dp" else "epsilon"
        assert balance[held]["reserved"] == 8 and balance[other]["reserved"] == 0


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 10**6), st.lists(st.fractions(Fraction(1, 10**6), Fraction(1, 2),
                                                    max_denominator=10**6), max_size=12))
def test_rho_charges_never_exceed_the_cap(app: Flask, cap_millis: int,
                                          costs: list[Fraction]) -> None:
    """Through the session store's real reserve step: the ρ committed is exactly the sum of
    the accepted costs' units and never above the cap (units: costs rounded up, the cap
    down)."""
    ledger = wiring.of(app).ledger
    ds = "ds_" + secrets.token_hex(6)
    cap = budget.cap_units("rho", Fraction(cap_millis, 1000))
    ledger.open(ds, {"rho": cap}, "op")
    accepted = 0
    for c in costs:
        units = budget.cost_units("rho", c)
        rid = "rel_" + secrets.token_hex(8)
        res = ledger.reserve(Reservation(ds, rid, {"rho": units}, actor="a",
                             fingerprint=secrets.token_hex(8), request_json=LEDGER_REQUEST))
        assert res.outcome == ("reserved" if accepted + units <= cap else "exhausted")
        if res.outcome == "reserved":
            run = ledger.mark_running(rid, "w")
            assert run is not None and ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"
            accepted += units
    row = ledger.balance(ds)["rho"]
    assert row["committed"] == accepted <= cap and row["reserved"] == 0
