"""Valkey, then the embedded PostgreSQL, killed with SIGKILL under load, against gunicorn.

``privrelease standalone`` (gunicorn + a Celery worker, its record on the PostgreSQL it
embeds) runs against a Valkey of this module's own (AOF, ``appendfsync always``; the
broker, the API keys), which the first test kills with -9 while client threads request
and read releases, and restarts on the same port and data directory. Nothing of the
service is restarted. The second kills the embedded PostgreSQL's postmaster with -9
under the same load on a dataset whose budget the load spends; standalone restarts it
on the same cluster, and nothing else of the service is restarted. Afterwards every
release whose request got a 2xx is settled exactly once (committed or refunded), each
has one reserve event, the ledger's commit events sum to its committed total, the
budget never showed more spent than its cap, and no client ever saw a 500. The
in-process variants (Valkey stopped, uploads while it is down) are in
``tests/integration/test_faults.py``; a worker killed mid-task is
``tests/integration/test_jobs.py::test_worker_killed_mid_task_ends_once_and_balances``.
The record is on PostgreSQL (standalone's): a Valkey kill takes only the broker.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from celery import Celery

from service.releases.sweeper import UNACKED
from service.storage import rkeys
from tests.conftest import start_valkey
from tests.e2e.harness import TOKEN, Service, child_pids

#: short leases and sweeps, so a reservation whose job message was lost in the
#: crash is refunded within seconds rather than a minute
LEASE = 2
THREADS = 4
#: kombu's Redis transport: delivery tag -> delivery time of unacknowledged messages
UNACKED_INDEX = "unacked_index"
EPSILON = 0.01
#: the embedded PostgreSQL's server (the postmaster; its children are its backends)
POSTGRES = ("pginstall/bin/postgres",)
#: the second test's cap: spent during the test, so an overspend would show
CAP = 1.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Our own Valkey (never the session's) and a standalone service using it."""
    valkey_dir = tmp_path_factory.mktemp("faults-valkey")
    state: dict[str, Any] = {"valkey": start_valkey(valkey_dir), "dir": valkey_dir}
    url = state["valkey"].connection_url + "/0"
    svc = Service(tmp_path_factory.mktemp("faults-standalone"), env={
        "PRIVRELEASE_REDIS_URL": url, "PRIVRELEASE_ALLOW_SEEDS": "1",
        "PRIVRELEASE_LEASE_SECONDS": str(LEASE), "PRIVRELEASE_SWEEP_INTERVAL": "0.5",
        "PRIVRELEASE_RATE_LIMIT": "off"})
    svc.start()
    state["service"] = svc
    try:
        yield state
    finally:
        if svc.proc and svc.proc.poll() is None:
            svc.stop()
        if state["valkey"].is_running():
            state["valkey"].stop()


def _descendants(pid: int) -> set[int]:
    """Every process under ``pid`` (gunicorn master and workers, Celery pool, the
    embedded PostgreSQL server), but that server's own children: a backend per
    connection and autovacuum workers come and go with the load."""
    postgres = set(child_pids(pid, *POSTGRES))
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except FileNotFoundError:
            continue
        out.update(int(c) for c in children)
        todo.extend(int(c) for c in children if int(c) not in postgres)
    return out


class Load:
    """Client threads that request releases and read them back until told to stop."""

    def __init__(self, svc: Service, dataset: str, spends_all: bool = False) -> None:
        """``spends_all``: the load spends the dataset's budget, and a create answered
        409 ``budget_exhausted`` is expected."""
        self.svc, self.dataset, self.spends_all = svc, dataset, spends_all
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.statuses: Counter[tuple[str, int | str]] = Counter()
        self.accepted: list[str] = []  # release ids of 2xx answers
        self.bad: list[str] = []
        self.counter = 0
        #: the dataset's epsilon budget, each time a read of it was answered
        self.samples: list[dict[str, float]] = []

    def _record(self, what: str, resp: requests.Response | None, err: Exception | None) -> None:
        with self.lock:
            if resp is None:
                self.statuses[(what, type(err).__name__)] += 1
                return
            self.statuses[(what, resp.status_code)] += 1
            problem = resp.headers.get("Content-Type") == "application/problem+json"
            ok = resp.status_code < 300 or (
                resp.status_code == 503 and resp.headers.get("Retry-After") and problem) or (
                self.spends_all and what == "create" and resp.status_code == 409 and problem
                and resp.json().get("code") == "budget_exhausted")
            if not ok:
                self.bad.append(f"{what} {resp.status_code} {resp.text[:200]}")
            if what == "read" and resp.status_code == 200 and resp.url.endswith("/budget"):
                self.samples.append(resp.json()["measures"]["epsilon"])

    def _next_value(self) -> float:
        with self.lock:
            self.counter += 1
            return self.counter / 100_000  # distinct params: never a replay

    def wait_for(self, condition: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(dict(self.statuses))
            time.sleep(0.05)

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        while not self.stop.is_set():
            body: dict[str, Any] = {"dataset_id": self.dataset, "mechanism": "laplace",
                    "budget": {"epsilon": EPSILON},
                    "params": {"statistic": "count",
                               "condition": {"column": "x", "op": "ge",
                                             "value": self._next_value()}}}
            resp, err = None, None
            try:
                resp = session.post(self.svc.url + "/v1/releases", json=body, timeout=30)
            except requests.RequestException as exc:
                err = exc
            self._record("create", resp, err)
            if resp is not None and resp.status_code in (200, 202):
                with self.lock:
                    self.accepted.append(resp.json()["id"])
            with self.lock:
                known = list(self.accepted)
            path = (f"/v1/releases/{rng.choice(known)}" if known and rng.random() < 0.7
                    else f"/v1/datasets/{self.dataset}/budget")
            resp, err = None, None
            try:
                resp = session.get(self.svc.url + path, timeout=30)
            except requests.RequestException as exc:
                err = exc
            self._record("read", resp, err)
            time.sleep(0.01)


def _wait_ready(svc: Service, timeout: float = 60) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if requests.get(svc.url + "/readyz", timeout=5).status_code == 200:
                return time.monotonic() - start
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise TimeoutError("service never ready again")


def _settle(svc: Service, dataset: str, client: redis.Redis,
            timeout: float = 30) -> tuple[dict[str, Any], set[str]]:
    """Wait until every release of ``dataset`` ended, or the only ones left are
    stranded: not started, their message in the broker's unacknowledged set."""
    deadline = time.monotonic() + timeout
    while True:
        resp = svc.call("GET", f"/v1/releases?dataset_id={dataset}&limit=1000")
        assert resp.status_code == 200, resp.text
        docs = {d["id"]: d for d in resp.json()}
        open_ = {i for i, d in docs.items() if d["status"] not in {"succeeded", "failed"}}
        # delivered a while ago and still not started: nobody holds these messages
        tags = client.zrangebyscore(UNACKED_INDEX, 0, time.time() - 3)
        unacked = "\n".join(m for m in client.hmget(UNACKED, tags) if m) if tags else ""
        stranded = {i for i in open_ if docs[i]["status"] == "queued" and i in unacked}
        if open_ == stranded or time.monotonic() > deadline:
            assert open_ == stranded, {i: docs[i]["status"] for i in open_ - stranded}
            return docs, stranded
        time.sleep(0.3)


def _redeliver(client: redis.Redis, url: str) -> None:
    """Requeue unacknowledged messages now, as kombu does after the visibility timeout.

    A message the worker had fetched when Valkey died stays in kombu's unacked
    set: the worker's new connection does not know it, and kombu puts it back in
    the queue only once ``visibility_timeout`` (15 minutes, workers/celery_app.py)
    has passed. This calls kombu's own restore with a zero timeout instead of
    waiting; redelivering a message twice is harmless (the ledger's start and
    settle scripts run a job to one stored result).
    """
    app = Celery(broker=url)
    app.conf.broker_transport_options = {"visibility_timeout": 0}
    with app.connection() as conn:
        conn.default_channel.qos.restore_visible(num=10_000)


def test_valkey_sigkill_under_load_loses_and_duplicates_nothing(rig: dict[str, Any]) -> None:
    svc: Service = rig["service"]
    assert svc.proc is not None
    dataset = svc.upload({"epsilon": 1000})
    pids = _descendants(svc.proc.pid)
    load = Load(svc, dataset)
    threads = [threading.Thread(target=load.run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    try:
        load.wait_for(lambda: len(load.accepted) >= 20)  # every gunicorn worker warmed up
        with load.lock:
            before_kill = set(load.accepted)
        port = rig["valkey"].port
        rig["valkey"].terminate()  # SIGKILL: only the AOF survives
        outage = time.monotonic()
        # requests keep arriving while Valkey is gone: at least 2 s and some refused
        load.wait_for(lambda: load.statuses[("create", 503)] >= 5)
        time.sleep(max(0.0, 2.0 - (time.monotonic() - outage)))
        rig["valkey"] = start_valkey(rig["dir"], port=port)
        outage = time.monotonic() - outage
        recovered = _wait_ready(svc)
        # and keep coming after it is back, answered by the same processes
        load.wait_for(lambda: len(load.accepted) >= len(before_kill) + 20)
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=60)
    print(dict(load.statuses), f"outage {outage:.2f} s, ready {recovered:.2f} s later")
    assert before_kill <= set(load.accepted)
    assert not load.bad, load.bad[:5]  # never a 500, every 503 a problem with Retry-After
    assert load.statuses[("create", 503)] > 0  # the outage was seen
    after = [k for k, n in load.statuses.items() if k[0] == "create" and k[1] in (200, 202)]
    assert after, "no release accepted"

    _verify_settled(rig, load)

    # the same processes served throughout: nothing restarted
    assert svc.proc.poll() is None
    assert _descendants(svc.proc.pid) == pids


def _verify_settled(rig: dict[str, Any], load: Load
                    ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    """Every accepted release of the load's dataset ends, each exactly once: one reserve
    event, one settle (commit or abort), an output only if it succeeded; the budget holds
    nothing and its committed total is the commit events' sum. Returns the releases by
    id, the dataset's events and its epsilon budget."""
    svc, dataset = load.svc, load.dataset
    client = rkeys.connect(rig["valkey"].connection_url + "/0")
    docs, stranded = _settle(svc, dataset, client)
    if stranded:  # see _redeliver: what kombu does once the visibility timeout passes
        _redeliver(client, rig["valkey"].connection_url + "/0")
        docs, left = _settle(svc, dataset, client)
        assert not left, left
    print(f"{len(stranded)} stranded in the broker and redelivered;",
          Counter(d["status"] for d in docs.values()), "failed:",
          Counter(str(d.get("error")) for d in docs.values() if d["status"] == "failed"))
    listing = list(docs.values())
    ids = [d["id"] for d in listing]
    assert len(ids) == len(set(ids))
    assert set(load.accepted) <= set(ids)
    assert len(load.accepted) == len(set(load.accepted))

    resp = svc.call("GET", f"/v1/datasets/{dataset}/ledger")
    assert resp.status_code == 200 and "X-Next-Cursor" not in resp.headers, resp.headers
    events = resp.json()
    assert len({e["id"] for e in events}) == len(events)  # no event recorded twice
    by_kind: dict[str, Counter[str]] = {}
    for e in events:
        by_kind.setdefault(e["kind"], Counter())[e["release_id"]] += 1
    reserves, commits = by_kind.get("reserve", Counter()), by_kind.get("commit", Counter())
    aborts = by_kind.get("abort", Counter())
    # a job whose run lost the record (or its broker) after reading the data is charged
    # (DESIGN §3): its commit event says outcome failed, and the release says only
    # "mechanism failed"
    outputs = Counter(e["release_id"] for e in events
                      if e["kind"] == "commit" and e["outcome"] == "succeeded")
    assert set(reserves) == set(ids) and max(reserves.values()) == 1
    for rid in ids:
        settled = commits[rid] + aborts[rid]
        assert settled == 1, (rid, docs[rid]["status"], commits[rid], aborts[rid])
        assert (outputs[rid] == 1) == (docs[rid]["status"] == "succeeded")
        if commits[rid] and docs[rid]["status"] == "failed":
            assert docs[rid]["error"] == {"code": "mechanism_failed",
                                          "message": "mechanism failed"}
    row = svc.call("GET", f"/v1/datasets/{dataset}/budget").json()["measures"]["epsilon"]
    committed_units = sum(e["units"]["epsilon"] for e in events if e["kind"] == "commit")
    assert row["reserved"] == 0
    assert row["committed"] == pytest.approx(committed_units * 1e-9, abs=1e-12)
    assert sum(1 for d in docs.values() if d["status"] == "succeeded") == len(outputs)
    return docs, events, row


def test_postgres_sigkill_under_load_overspends_loses_and_doubles_nothing(
        rig: dict[str, Any]) -> None:
    """The embedded PostgreSQL (the record) killed with -9 while the load spends a
    dataset's whole budget: standalone restarts it on the same cluster, the API answers
    503 meanwhile, and afterwards the budget was never overspent, every accepted release
    settled once, no event is lost or doubled. Nothing but PostgreSQL restarted."""
    svc: Service = rig["service"]
    assert svc.proc is not None
    dataset = svc.upload({"epsilon": CAP})
    pids = _descendants(svc.proc.pid)
    [postmaster] = child_pids(svc.proc.pid, *POSTGRES)
    load = Load(svc, dataset, spends_all=True)
    threads = [threading.Thread(target=load.run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    try:
        load.wait_for(lambda: len(load.accepted) >= 20)
        with load.lock:
            before_kill = set(load.accepted)
        os.kill(postmaster, signal.SIGKILL)
        outage = time.monotonic()
        # a new server once the supervisor saw the kill (after its backoff, and after it
        # killed the backends the old one left: every pooled connection breaks)
        load.wait_for(lambda: child_pids(svc.proc.pid, *POSTGRES) not in ([], [postmaster]))
        recovered = _wait_ready(svc)
        outage = time.monotonic() - outage
        with load.lock:
            at_restart = len(load.accepted)
        # releases accepted again, by the same API and worker, until the budget is spent
        # (a step whose connection broke is run again: the API may answer 503 meanwhile,
        # or ride over the restart)
        load.wait_for(lambda: len(load.accepted) >= at_restart + 5)
        load.wait_for(lambda: load.statuses[("create", 409)] >= 3)
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=60)
    print(dict(load.statuses), f"PostgreSQL back and ready {outage:.2f} s after the kill "
          f"({recovered:.2f} s waiting for /readyz); accepted {len(before_kill)} before the "
          f"kill, {at_restart} by the restart, {len(load.accepted)} in all; "
          f"{len(load.samples)} budget samples")
    assert before_kill <= set(load.accepted)
    assert not load.bad, load.bad[:5]  # never a 500, every 503 a problem with Retry-After
    assert load.samples
    for sample in load.samples:  # never more spent or held than the cap
        assert sample["committed"] + sample["reserved"] <= CAP + 1e-9, sample

    _, events, row = _verify_settled(rig, load)
    charged = sum(1 for e in events if e["kind"] == "commit")
    assert row["committed"] == pytest.approx(charged * EPSILON, abs=1e-9)
    assert row["committed"] <= CAP + 1e-9

    # PostgreSQL restarted by standalone; the API, the workers and Valkey never were
    assert svc.proc.poll() is None
    [restarted] = child_pids(svc.proc.pid, *POSTGRES)
    assert restarted != postmaster
    assert _descendants(svc.proc.pid) == pids - {postmaster} | {restarted}
    assert "postgres exited (killed by SIGKILL)" in svc.banner
    assert "postgres restarted" in svc.banner
