"""Bounded work (issue #15 item 1): ceilings at POST, time limits, cancel, queues.

A Valkey, a worker (``privrelease worker``: releases, and analyses in a process of
their own) and an app of this module's own, configured with tiny limits: the work
ceilings low, an analysis time limit of a few seconds, and every analysis held by
the test-only delay until that limit stops it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flask import Flask

from service import analyses, apikeys, wiring
from service.config import Config
from service.storage import rkeys
from tests.conftest import ROOT, start_valkey, wait_for_worker
from tests.integration.conftest import PEOPLE_META, Api, people_csv
from tests.integration.record_state import close, on_record, own_database

TOKEN = "pr_work_limits_operator"
ANALYSIS_LIMIT = 5.0  # seconds; the delay below outlasts it, so every analysis hits it
GRACE = 2.0


class Stack:
    """One Valkey, one worker process tree and one app, with a given environment; their
    record is ``database_url`` (``record_state.own_database``)."""

    def __init__(self, tmp: Path, database_url: str, **settings: str) -> None:
        self.valkey = start_valkey(tmp / "valkey")
        url = f"redis://127.0.0.1:{self.valkey.port}/0"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
        self.env.update(PRIVRELEASE_REDIS_URL=url, PRIVRELEASE_DATA_DIR=str(tmp / "data"),
                        PRIVRELEASE_ALLOW_SEEDS="1", PRIVRELEASE_SWEEP_INTERVAL="1",
                        **{f"PRIVRELEASE_{k}": v for k, v in settings.items()})
        self.env = on_record(self.env, database_url)
        self.r = rkeys.connect(url)
        self.log = tmp / "worker.log"
        with open(self.log, "wb") as fh:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "service.processes.cli", "worker", "--concurrency", "1",
                 "--analysis-concurrency", "1"],
                env=self.env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        saved = dict(os.environ)
        # exactly the worker's environment: the session's app fixture leaves its own
        # PRIVRELEASE_* in os.environ, and an app that read the session's
        # PRIVRELEASE_DATABASE_URL reserved its releases in the session's database: this
        # worker, on another record, never ran them, and the session worker's sweeper
        # re-sent them to its own broker, where they failed (no dataset files there)
        os.environ.clear()
        os.environ.update(self.env)
        try:
            from service.api.app import create_app

            self.app: Flask = create_app(Config.from_env())
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.keys = wiring.of(self.app).keys
        self.analyses = wiring.of(self.app).analyses
        apikeys.create(self.keys, "operator", "tests", token=TOKEN)
        self.api = Api(self.app.test_client(), TOKEN)
        try:
            wait_for_worker(self.r)
        except TimeoutError:
            self.stop()
            raise RuntimeError(self.log.read_text()) from None

    def stop(self) -> None:
        self.worker.terminate()
        try:
            self.worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.worker.kill()
        close(self.app)
        self.valkey.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("limits"), own_database(request),
              MAX_ANALYSIS_WORK="1e8",
              MAX_RELEASE_WORK="1e5", ANALYSIS_TIME_LIMIT=str(ANALYSIS_LIMIT),
              TIME_LIMIT_GRACE=str(GRACE), TEST_ANALYSIS_DELAY="60")
    yield s
    s.stop()


N = 300


@pytest.fixture(scope="module")
def interval_release(stack: Stack) -> str:
    """A succeeded interval.case1 release of N rows (analyses apply to it)."""
    ages = np.clip(np.random.default_rng(5).normal(40, 10, size=N), 0, 100)
    meta = {"name": "ages", "record_level": True, "budgets": {"interval_leakage": 1.0},
            "columns": {"age": {"type": "continuous", "bounds": [0, 100]}}}
    resp = stack.api.upload("age\n" + "\n".join(f"{a:.3f}" for a in ages) + "\n", meta)
    assert resp.status_code == 201, resp.get_json()
    rel = stack.api.post("/v1/releases", {
        "dataset_id": resp.get_json()["id"], "mechanism": "interval.case1",
        "params": {"column": "age", "anchors": {"family": "uniform", "low": 0, "high": 100}},
        "budget": {"interval_leakage": 0.9}})
    assert rel.status_code == 202, rel.get_json()
    doc = stack.api.wait(rel.get_json()["id"])
    assert doc["status"] == "succeeded", doc
    return str(doc["id"])


@pytest.fixture(scope="module")
def people(stack: Stack) -> str:
    resp = stack.api.upload(people_csv(), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


def _analysis(api: Api, release_id: str, params: dict[str, Any] | None = None) -> str:
    resp = api.post(f"/v1/releases/{release_id}/analyses",
                    {"analysis": "npmle", "params": params or {"method": "pava"}})
    assert resp.status_code == 202, resp.get_json()
    return str(resp.get_json()["id"])


def _until(api: Api, release_id: str, aid: str, done: Callable[[dict[str, Any]], bool],
           timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc: dict[str, Any] = api.get(f"/v1/releases/{release_id}/analyses/{aid}").get_json()
        if done(doc) or time.monotonic() > deadline:
            return doc
        time.sleep(0.05)


def test_over_ceiling_analysis_and_release_are_refused_naming_the_parameter(
        stack: Stack, interval_release: str, people: str) -> None:
    """Catches: main queued an NPMLE-EM of max_iter 10^6 (hours on large releases) and any
    release grid, with no ceiling; the 422 must name the parameter and the limit."""
    resp = stack.api.post(f"/v1/releases/{interval_release}/analyses", {
        "analysis": "npmle", "params": {"method": "em", "max_iter": 1_000_000}})
    assert resp.status_code == 422
    body = resp.get_json()
    assert body["code"] == "work_limit" and body["field"] == "params.max_iter"
    assert body["limit"] == 1e8 and body["work"] == 1e6 * N  # iterations x rows x 1 piece
    assert "1e+08" in body["detail"]
    assert stack.analyses.count(interval_release) == 0  # nothing queued
    within = stack.api.post(f"/v1/releases/{interval_release}/analyses", {
        "analysis": "npmle", "params": {"method": "em", "max_iter": 1000}})
    assert within.status_code == 202 and within.get_json()["work"] == 1000.0 * N
    stack.api.post(f"/v1/releases/{interval_release}/analyses/{within.get_json()['id']}"
                   "/cancel", {})

    hist = {"dataset_id": people, "mechanism": "laplace", "budget": {"epsilon": 0.1},
            "params": {"statistic": "histogram", "column": "income", "bins": 1000}}
    refused = stack.api.post("/v1/releases", hist)
    assert refused.status_code == 422
    assert refused.get_json()["code"] == "work_limit"
    assert refused.get_json()["field"] == "params.bins"
    assert stack.api.get(f"/v1/datasets/{people}/budget").get_json()[
        "measures"]["epsilon"]["reserved"] == 0


def test_an_analysis_past_its_time_limit_fails_with_time_limit(
        stack: Stack, interval_release: str) -> None:
    """Catches: main had no task time limit; an analysis ran as long as it liked."""
    started = time.monotonic()
    aid = _analysis(stack.api, interval_release)
    doc = _until(stack.api, interval_release, aid,
                 lambda d: d["status"] not in {"queued", "running"}, ANALYSIS_LIMIT + 20)
    assert doc["status"] == "failed", doc
    assert doc["error"]["code"] == "time_limit" and doc["result"] is None
    assert time.monotonic() - started >= ANALYSIS_LIMIT


def test_cancel_stops_a_running_analysis_and_frees_its_slot(
        stack: Stack, interval_release: str) -> None:
    """Catches: main had no way to cancel an analysis. The analyses worker has one slot;
    a cancelled running analysis is stopped by its worker, so the next one starts well
    before the cancelled one would have reached its time limit, and it stays cancelled."""
    first = _analysis(stack.api, interval_release)
    running = _until(stack.api, interval_release, first,
                     lambda d: d["status"] == "running", 20)
    assert running["status"] == "running"
    _, token = apikeys.create(stack.keys, "consumer", "someone else")
    other = Api(stack.app.test_client(), token)
    path = f"/v1/releases/{interval_release}/analyses/{first}/cancel"
    assert other.post(path, {}).status_code == 403
    cancelled_at = time.monotonic()
    resp = stack.api.post(path, {})
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json()["status"] == "cancelled"
    assert resp.get_json()["error"]["code"] == "cancelled"
    assert stack.api.post(path, {}).status_code == 409
    second = _analysis(stack.api, interval_release)
    doc = _until(stack.api, interval_release, second, lambda d: d["status"] != "queued",
                 ANALYSIS_LIMIT)
    assert doc["status"] == "running", "the cancelled analysis still holds the slot"
    assert time.monotonic() - cancelled_at < ANALYSIS_LIMIT - 1
    stack.api.post(f"/v1/releases/{interval_release}/analyses/{second}/cancel", {})
    time.sleep(1.0)
    assert stack.api.get(f"/v1/releases/{interval_release}/analyses/{first}").get_json()[
        "status"] == "cancelled"


def test_releases_complete_while_analyses_hold_the_analyses_queue(
        stack: Stack, interval_release: str, people: str) -> None:
    """Catches: main ran analyses and releases from one queue and pool, so long analyses
    took every slot and releases waited behind them."""
    held = [_analysis(stack.api, interval_release) for _ in range(2)]
    assert _until(stack.api, interval_release, held[0],
                  lambda d: d["status"] == "running", 20)["status"] == "running"
    resp = stack.api.post("/v1/releases", {
        "dataset_id": people, "mechanism": "laplace", "budget": {"epsilon": 0.1},
        "params": {"statistic": "count", "condition": {"column": "age", "op": "ge",
                                                       "value": 30}}})
    assert resp.status_code == 202, resp.get_json()
    doc = stack.api.wait(resp.get_json()["id"], timeout=ANALYSIS_LIMIT)
    assert doc["status"] == "succeeded"
    states = [stack.api.get(f"/v1/releases/{interval_release}/analyses/{a}").get_json()[
        "status"] for a in held]
    assert states == ["running", "queued"]
    for aid in held:  # a queued one is cancelled too, and never runs
        stack.api.post(f"/v1/releases/{interval_release}/analyses/{aid}/cancel", {})
    time.sleep(1.0)
    assert "started_at" not in (stack.analyses.fields(held[1]) or {"started_at": "gone"})


def test_a_redelivered_analysis_is_not_run_again(stack: Stack, interval_release: str) -> None:
    """Catches: main restarted an analysis whenever its message came back (a killed
    worker's analysis ran again, forever); and one killed by the hard limit stayed
    running. Both now end failed, with a code."""
    r = stack.analyses
    aid = analyses.create(r, interval_release, "npmle", {"method": "pava"}, [], "tests")
    assert analyses.start(r, aid, 60) is not None
    assert analyses.start(r, aid, 60) is None  # the message again: its run died
    doc = analyses.document(r, aid)
    assert doc is not None and doc["status"] == "failed"
    assert doc["error"]["code"] == "worker_lost"
    assert not analyses.finish(r, aid, result_json="{}")  # a late result is not stored
    killed = analyses.create(r, interval_release, "npmle", {"method": "pava"}, [], "tests")
    assert analyses.start(r, killed, -1.0) is not None  # its hard deadline has passed
    doc = analyses.document(r, killed)
    assert doc is not None and doc["status"] == "failed"
    assert doc["error"]["code"] == "time_limit"


def test_a_release_past_its_time_limit_is_charged_and_says_mechanism_failed(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Catches: main had no release time limit. Stopped after reading the data, the
    release follows the failure rule: charged, and only ``mechanism_failed``."""
    s = Stack(tmp_path, own_database(request), RELEASE_TIME_LIMIT="2", TIME_LIMIT_GRACE="2",
              TEST_JOB_DELAY="60")
    try:
        ds = s.api.upload(people_csv(), PEOPLE_META).get_json()["id"]
        resp = s.api.post("/v1/releases", {
            "dataset_id": ds, "mechanism": "laplace", "budget": {"epsilon": 0.5},
            "params": {"statistic": "mean", "column": "age"}})
        assert resp.status_code == 202, resp.get_json()
        doc = s.api.wait(resp.get_json()["id"], timeout=20)
        assert doc["status"] == "failed"
        assert doc["error"] == {"code": "mechanism_failed", "message": "mechanism failed"}
        eps = s.api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
        assert eps["committed"] == 0.5 and eps["reserved"] == 0
    finally:
        s.stop()
