"""The policy migration (#27.3): a dataset registered before notions, measures and
record-level releases were opt-in keeps working as its operator set it up, now written
down, with one ``policy`` audit event; run by hand (the CLI) or as a process starts, and
idempotent. Real Valkey; the legacy documents are written as the old code wrote them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from typing import Any

import pytest
import redis
from flask import Flask

from service import apikeys, policy, wiring
from service.config import Config
from service.storage import rkeys
from service.storage.keys import KeyStore
from tests.conftest import ROOT
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

#: the legacy policy migration of the Valkey store's datasets (``policy.migrate`` reads
#: ``rkeys`` documents; on PostgreSQL every dataset was registered with its policy)
pytestmark = pytest.mark.valkey_store

SUBSET = {"mechanism": "subset.dummy", "params": {"column": "group", "alpha": 0.2},
          "budget": {"subset_draws": 1}}
GAUSSIAN = {"mechanism": "gaussian", "params": {"statistic": "mean", "column": "income"},
            "budget": {"epsilon": 0.1, "delta": 1e-8}}
LAPLACE = {"mechanism": "laplace", "params": {"statistic": "mean", "column": "income"},
           "budget": {"epsilon": 0.1}}


def _legacy_dataset(api: Api, r: redis.Redis, allocation_key: str | None = None) -> str:
    """A dataset as main registered ``{"epsilon": 5, "delta": 1e-5}`` with a categorical
    column: a subset_draws cap of 1 on it, no notions or record_level in its document,
    and (optionally) an ε allocation written by the old admin script (no rule field)."""
    meta = {k: v for k, v in PEOPLE_META.items() if k not in {"notions", "record_level"}}
    ds: str = api.upload(people_csv(), meta).get_json()["id"]
    doc = json.loads(r.get(rkeys.dataset(ds)))
    for field in ("notions", "record_level"):
        doc.pop(field)
    r.set(rkeys.dataset(ds), json.dumps(doc))
    assert r.hget(rkeys.ledger(ds), "cap:subset_draws:group") == "1"
    if allocation_key:
        r.hset(rkeys.ledger(ds), f"alloc:{allocation_key}:cap:epsilon", 10**9)
    return ds


def _policy_events(api: Api, ds: str) -> list[dict[str, Any]]:
    resp = api.get(f"/v1/datasets/{ds}/ledger?kind=policy")
    assert resp.status_code == 200, resp.get_json()
    events: list[dict[str, Any]] = resp.get_json()
    return events


def test_legacy_dataset_keeps_working_and_is_recorded(api: Api, app: Flask,
                                                       r: redis.Redis, keys: KeyStore) -> None:
    """A legacy dataset and a legacy ε allocation: before and after the migration the
    analyst may still draw a subset (what the operator set up then), the document says
    so explicitly, the allocation is marked legacy, and exactly one policy event records
    it however often the migration runs. A new allocation for the key is a listed one
    (then δ, which it does not list, is refused)."""
    key, token = apikeys.create(keys, "analyst", label="legacy allocation")
    analyst = Api(app.test_client(), token)
    ds = _legacy_dataset(api, r, key.id)
    assert analyst.post("/v1/releases/estimate", {"dataset_id": ds, **SUBSET}
                        ).get_json()["fits"] is True  # read as the legacy policy

    done = policy.migrate(r, wiring.of(app).ledger)
    assert ds in done.datasets and done.legacy_allocations[ds] == [key.id]
    doc = api.get(f"/v1/datasets/{ds}").get_json()
    assert doc["notions"] == ["dp", "noiseless", "interval", "subset"]
    assert doc["record_level"] is True
    assert r.hget(rkeys.ledger(ds), f"alloc:{key.id}:scope") == "legacy"
    (event,) = _policy_events(api, ds)
    assert event["kind"] == "policy" and event["action"] == "migrated"
    assert event["notions"] == "dp,noiseless,interval,subset"
    assert event["record_level"] == "1" and event["legacy_allocations"] == key.id
    assert event["actor"] == policy.ACTOR

    again = policy.migrate(r, wiring.of(app).ledger)
    assert ds not in again.datasets and len(_policy_events(api, ds)) == 1

    budget = analyst.get(f"/v1/datasets/{ds}/budget").get_json()
    assert budget["allocation_rules"] == {key.id: "legacy"}
    est = analyst.post("/v1/releases/estimate", {"dataset_id": ds, **SUBSET}).get_json()
    assert est["fits"] is True, est
    assert analyst.post("/v1/releases", {"dataset_id": ds, **SUBSET}).status_code == 202
    legacy_delta = analyst.post("/v1/releases/estimate", {"dataset_id": ds, **GAUSSIAN})
    assert legacy_delta.get_json()["fits"] is True  # unlisted δ: unlimited, as it was

    # the operator writes the key's allocation again: now the rule is listed
    patch = api.client.patch(f"/v1/datasets/{ds}/budget",
                             json={"allocations": {key.id: {"epsilon": 2}}},
                             headers={"Authorization": f"Bearer {TOKEN}"})
    assert patch.get_json()["allocation_rules"] == {key.id: "listed"}
    refused = analyst.post("/v1/releases", {"dataset_id": ds, **GAUSSIAN})
    assert refused.status_code == 409, refused.get_json()
    assert refused.get_json()["listed"] is False and refused.get_json()["measure"] == "delta"
    assert analyst.post("/v1/releases", {"dataset_id": ds, **LAPLACE}).status_code == 202


def test_migration_runs_from_the_cli_and_at_start_up(api: Api, r: redis.Redis,
                                                      service_env: dict[str, str]) -> None:
    """``privrelease migrate-policy`` and the API's start-up (create_app) each record a
    legacy dataset; a dataset registered now is left alone (it has its fields)."""
    fresh = api.upload(people_csv(), PEOPLE_META).get_json()["id"]
    by_cli = _legacy_dataset(api, r)
    out = subprocess.run([sys.executable, "-m", "service.processes.cli", "migrate-policy"],
                         env=service_env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    assert "recorded the legacy policy of" in out.stdout
    assert len(_policy_events(api, by_cli)) == 1
    assert json.loads(r.get(rkeys.dataset(by_cli)))["record_level"] is True
    assert _policy_events(api, fresh) == []

    at_start = _legacy_dataset(api, r)
    saved = dict(os.environ)
    os.environ.update(service_env)
    try:
        from service.api.app import create_app

        create_app(Config.from_env())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert len(_policy_events(api, at_start)) == 1
    assert len(_policy_events(api, by_cli)) == 1


def test_exact_increment_charges_are_raised_to_the_additive_rule(api: Api, app: Flask,
                                                                 r: redis.Redis) -> None:
    """#27.2 for existing deployments: a release charged an exact increment (0.2 of a
    standalone 0.3) left its column 0.1 under the additive rule, the only one that holds
    against adaptive designs. The migration adds the 0.1 to the column's committed total
    once, with one ``policy`` event saying so; refunded releases and other measures are
    left alone, and a second run changes nothing."""
    meta = {"name": "old-interval", "notions": ["interval", "dp"], "record_level": True,
            "columns": {"age": {"type": "integer", "bounds": [0, 100]}},
            "budgets": {"interval_leakage": 1, "epsilon": 1}}
    ds = api.upload("age\n" + "".join(f"{i % 90}\n" for i in range(60)), meta).get_json()["id"]
    measure, unit = "interval_leakage:age", 10**12
    for i, (status, held) in enumerate([("succeeded", "2/10"), ("cancelled", "1/10")]):
        rid = f"rel_old_increment_{ds}_{i}"
        request = {"dataset_id": ds, "dataset_version": 1, "mechanism": "interval.case1",
                   "params": {"column": "age"}, "cost": {measure: "3/10"},
                   "cost_units": {measure: int(Fraction(held) * unit)},
                   "privacy": {"charged": "exact_increment"}}
        r.hset(rkeys.release(rid), mapping={"status": status, "request": json.dumps(request)})
        r.zadd(rkeys.dataset_releases(ds), {rid: 1.0 + i})
    r.hset(rkeys.ledger(ds), f"committed:{measure}", int(Fraction(2, 10) * unit))
    r.hdel(rkeys.ledger(ds), "recharged:interval")  # as before the migration existed

    done = policy.migrate(r, wiring.of(app).ledger)
    assert done.recharged[ds] == {measure: unit // 10}
    assert int(r.hget(rkeys.ledger(ds), f"committed:{measure}")) == 3 * unit // 10
    (event,) = [e for e in _policy_events(api, ds) if e.get("action") == "recharged"]
    assert event["actor"] == policy.ACTOR
    assert policy.migrate(r, wiring.of(app).ledger).recharged == {}
    assert int(r.hget(rkeys.ledger(ds), f"committed:{measure}")) == 3 * unit // 10
    rows = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]
    assert rows[measure]["committed"] == 0.3
