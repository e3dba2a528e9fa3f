"""The release pipeline's seams (issue #28).

* A mechanism written in a test, registered with ``mechanisms.register`` and given an
  audit entry, is listed, estimated, released and audited: nothing in ``service/``
  knows it.
* The files one release passes through (the POST, the worker's run, the GET), measured
  by tracing every Python call, are the ones ARCHITECTURE.md lists, fewer than the ~35
  of the pipeline before it had a home.

The release runs in this process (``service.releases.run.execute``, what the worker's
task calls) on a Valkey database of its own (and, on PostgreSQL, a database of its own),
so no worker of the session, which does not know the test mechanism, takes its message
or sends it from the outbox.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import psycopg
import pytest
from flask import Flask
from marshmallow import RAISE, Schema, fields

from mechanisms import DatasetMeta, Mechanism, Output, register, registry, sampling
from mechanisms.audit import dp as dp_audit
from mechanisms.audit import entries as audit_entries
from mechanisms.audit.dp import Data
from mechanisms.base import Budget, read_epsilon
from service import apikeys, budget, wiring
from service.api.app import create_app
from service.releases import run
from tests.conftest import ROOT
from tests.integration import record_state
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

#: a database no worker of the session serves
DB = 9
NAME = "test.tally"


class _Params(Schema):
    class Meta:
        unknown = RAISE

    column = fields.String(required=True)
    at = fields.Integer(required=True)


class Tally(Mechanism):
    """How many rows have ``column`` at least ``at``, plus exact two-sided geometric noise
    of scale 1/ε: one record changed moves the count by at most 1 (sensitivity 1), so the
    release is ε-DP."""

    name = NAME
    measures = ("epsilon",)
    params_schema = _Params
    description = "A test's noisy count."
    #: the noise's ε per charged ε (a broken variant, the audit's control, uses more)
    factor = 1

    def cost(self, params: Mapping[str, Any], budget: Budget,
             meta: DatasetMeta) -> dict[str, Fraction]:
        meta.column(params["column"])
        return {"epsilon": read_epsilon(budget, self.name)}

    def accuracy(self, params: Mapping[str, Any], cost: Budget,
                 meta: DatasetMeta) -> dict[str, Any]:
        return {"ci95_halfwidth": sampling.discrete_laplace_halfwidth(
            1 / float(cost["epsilon"]))}

    def noise(self, rng: np.random.Generator, epsilon: float, runs: int) -> np.ndarray:
        return sampling.discrete_laplace(rng, 1 / (self.factor * epsilon), runs)

    def run(self, data: Data, params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        count = int(np.count_nonzero(np.asarray(data[params["column"]]) >= params["at"]))
        value = count + int(self.noise(rng, float(cost["epsilon"]), 1)[0])
        return Output({"value": value}, self.accuracy(params, cost, meta),
                      f"epsilon-DP (epsilon={float(cost['epsilon']):g})")


class LeakyTally(Tally):
    """The control: noise for three times the charged ε (the audit must catch it)."""

    name = "test.tally.leaky"
    factor = 3


def _scenario(mech: Tally) -> dp_audit.Scenario:
    """Neighbours: every x is 0, or one record is 10 (the count moves by 1)."""
    meta = dp_audit.int_meta(n=20, hi=10)
    params = mech.load_params({"column": "x", "at": 1})
    cost = {"epsilon": Fraction(1, 2)}
    pair = ({"x": np.zeros(20, dtype=np.int64)},
            {"x": np.r_[np.zeros(19, dtype=np.int64), 10]})
    exact = [0, 1]

    def draw(rng: np.random.Generator, which: int, runs: int) -> np.ndarray:
        return (exact[which] + mech.noise(rng, 0.5, runs)).astype(np.float64)[:, None]

    def once(rng: np.random.Generator, which: int) -> np.ndarray:
        return np.array([mech.run(pair[which], params, cost, meta, rng).result["value"]],
                        dtype=np.float64)

    return dp_audit.Scenario(mech.name, mech, params, cost, meta, pair, draw, once)


def _audit(mechanism: str, size: audit_entries.AuditSize,
           seed: int) -> audit_entries.AuditReport:
    plan = dp_audit.Plan([_scenario(Tally())], [("interval", _scenario(LeakyTally()))])
    return dp_audit.audit_plan(plan, mechanism, "epsilon-DP", size, seed)


@pytest.fixture()
def installed() -> Iterator[None]:
    """The mechanism and its audit entry, for this test only."""
    register(Tally())
    audit_entries.entries()  # load the families' entries first: ours joins them
    audit_entries.entry(NAME)(_audit)
    try:
        yield
    finally:
        registry._REGISTRY.pop(NAME, None)
        audit_entries._ENTRIES.pop(NAME, None)


@pytest.fixture()
def own(app: Flask, installed: None, request: pytest.FixtureRequest
        ) -> Iterator[tuple[Flask, Api]]:
    """An app on a Valkey database of its own and, if the session's service runs on
    PostgreSQL, a PostgreSQL database of its own (no session worker's sweeper sends its
    outbox), created after the mechanism was registered."""
    config = app.config["PRIVRELEASE"]
    url = config.redis_url.rsplit("/", 1)[0] + f"/{DB}"
    database_url = record_state.own_database(request)
    # no key cache: the walk's POST looks its key up (ARCHITECTURE.md lists that walk)
    flask_app = create_app(dataclasses.replace(config, redis_url=url,
                                               database_url=database_url,
                                               key_cache_seconds=0))
    client = wiring.of(flask_app).client
    client.flushdb()
    apikeys.create(wiring.of(flask_app).keys, "operator", "tests", token=TOKEN)
    yield flask_app, Api(flask_app.test_client())
    client.flushdb()
    record_state.close(flask_app)
    if database_url is not None:
        with psycopg.connect(request.getfixturevalue("postgres_url"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {urlsplit(database_url).path[1:]} WITH (FORCE)")


class _Walk:
    """The repository's Python files whose functions run, in call order."""

    def __init__(self) -> None:
        self.files: dict[str, None] = {}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(ROOT) and path.parts[len(ROOT.parts)] in {
                    "service", "workers", "mechanisms"}:
                self.files.setdefault(str(path.relative_to(ROOT)), None)

    def __enter__(self) -> _Walk:
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


def _documented() -> set[str]:
    """The files ARCHITECTURE.md lists for the walk of a POST (between its markers)."""
    block = (ROOT / "ARCHITECTURE.md").read_text().split("<!-- walk -->")[1]
    return set(re.findall(r"\b((?:service|workers|mechanisms)/[\w/]+\.py)\b", block))


def test_a_mechanism_added_in_a_test_is_listed_estimated_served_and_audited(
        own: tuple[Flask, Api]) -> None:
    flask_app, api = own
    listed = api.get("/v1/mechanisms").get_json()
    assert NAME in {m["name"] for m in listed}
    upload = api.upload(people_csv(), PEOPLE_META)
    assert upload.status_code == 201, upload.get_json()
    body = {"dataset_id": upload.get_json()["id"], "mechanism": NAME,
            "params": {"column": "age", "at": 60}, "budget": {"epsilon": 0.5}}
    estimate = api.post("/v1/releases/estimate", body)
    assert estimate.status_code == 200, estimate.get_json()
    assert estimate.get_json()["cost"] == {"epsilon": 0.5} and estimate.get_json()["fits"]

    svc = wiring.of(flask_app)
    with _Walk() as walk:
        posted = api.post("/v1/releases", body)
        assert posted.status_code == 202, posted.get_json()
        release_id = posted.get_json()["id"]
        assert run.execute(svc, release_id, "test-worker") == "succeeded"
        doc = api.get(f"/v1/releases/{release_id}").get_json()
    assert doc["status"] == "succeeded" and isinstance(doc["result"]["value"], int)
    assert doc["cost"] == {"epsilon": 0.5}
    cap, spent = (budget.cost_units("epsilon", Fraction(a)) for a in (5, Fraction(1, 2)))
    assert svc.ledger.balance(body["dataset_id"])["epsilon"] == {
        "cap": cap, "committed": spent, "reserved": 0, "remaining": cap - spent}

    report = audit_entries.run(NAME, "ci", seed=0)
    assert report.passed and report.control_caught, report.detail

    # the walk: no Celery in the run, and exactly the service files ARCHITECTURE.md lists
    # (and the worker's task, which calls run.execute); its mechanism files among those
    documented = _documented()
    assert not [f for f in walk.files if f.startswith("workers/")]
    ours = {f for f in walk.files if not f.startswith("mechanisms/")}
    assert ours | {"workers/tasks.py"} == {f for f in documented
                                          if not f.startswith("mechanisms/")}
    assert {f for f in walk.files if f.startswith("mechanisms/")} <= documented
