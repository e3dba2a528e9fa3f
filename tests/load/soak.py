"""Load and soak: N concurrent clients for T seconds against a real `privrelease standalone`.

``python -m tests.load.soak --clients 64 --seconds 120`` (``make soak``). Each client
is a thread with its own HTTP session that mixes uploads, estimates, releases of every
registered mechanism (some retried with their Idempotency-Key), reads (release, data CSV,
catalog, budget, ledger) and free analyses. Caps are small, so datasets run out and
releases get ``409 budget_exhausted``. When the time is up every accepted job is waited
for, and the run checks:

- zero 5xx and no connection errors; only the statuses each request may answer;
- zero overspend: committed + reserved <= cap in every budget read during the run; at
  the end committed <= cap (and an analyst's allocation) and the sum of the ledger's
  commit events equals the committed balance, in exact units;
- zero lost or duplicated releases: each 202 has exactly one reserve and one commit
  (release succeeded) or abort (failed, refunded) event, and the ledger reserved
  nothing no client was told about; retries with an Idempotency-Key and replays name
  an accepted release; no job or analysis failed;
- flat memory: after ``--warmup`` seconds, the RSS of the API (gunicorn master and
  workers) and of the worker (Celery main and pool) grows by at most ``--max-growth``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from mechanisms import registry
from service import budget as budget_units
from tests.e2e.harness import TOKEN, Service
from tests.load import workload
from tests.load.procmem import MemoryRow, Sampler

#: how often each operation is picked (analyst clients pick an estimate for an upload
#: and a budget read for a ledger read: they may do neither)
WEIGHTS: dict[str, int] = {
    "upload": 1, "estimate": 10, "release": 24, "race": 2, "retry": 4, "get_release": 20, "data": 8,
    "catalog": 3, "budget": 8, "ledger": 2, "analysis": 8, "get_analysis": 6,
}
#: what each kind of request may answer (anything else is a violation)
EXPECTED: dict[str, set[int]] = {
    "upload": {201}, "allocate": {200}, "estimate": {200, 202}, "release": {200, 202, 409},
    "race": {200, 202, 409}, "retry": {200, 202}, "mismatch": {422}, "get_release": {200},
    "data": {200}, "catalog": {200}, "budget": {200}, "ledger": {200}, "analysis": {202},
    "get_analysis": {200},
}
TERMINAL = {"succeeded", "failed", "cancelled", "refused"}
#: a cold release priced by a worker may end refused as the POST would have answered
#: (409 budget_exhausted, or 200 replayed: the identical earlier release is named), or
#: 409 conflict: an exact interval charge whose column history kept moving while it was
#: priced (concurrent releases on one column; nothing spent)
REFUSALS = {"budget_exhausted", "replayed", "conflict"}
#: a high limit: the limiter still runs on every request, but never refuses one
RATE_LIMIT = "10000000/minute"


@dataclass(frozen=True)
class Call:
    kind: str
    status: int  # 0: no answer (connection error, timeout)
    seconds: float


@dataclass
class Shared:
    """What the clients learn, and what went wrong; guarded by ``lock``."""

    url: str
    analyst: tuple[str, str]  # key id, token
    lock: threading.Lock = field(default_factory=threading.Lock)
    datasets: list[str] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)  # release id -> actor token
    order: list[str] = field(default_factory=list)  # accepted release ids, oldest first
    succeeded: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> document
    with_analyses: list[str] = field(default_factory=list)
    with_data: list[str] = field(default_factory=list)
    uniform: dict[str, dict[str, str]] = field(default_factory=dict)  # ds -> column -> id
    idem: list[tuple[str, str, dict[str, Any], str]] = field(default_factory=list)
    named: collections.Counter[str] = field(default_factory=collections.Counter)
    analyses: dict[str, str] = field(default_factory=dict)  # analysis id -> release id
    calls: list[Call] = field(default_factory=list)
    violations: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, str] = field(default_factory=dict)
    turns: int = 0  # releases asked so far (``Client.body``)

    def violation(self, what: str, detail: str = "") -> None:
        with self.lock:
            self.violations[what] += 1
            self.examples.setdefault(what, detail[:300])


class Client(threading.Thread):
    """One simulated user: a session, a role and a random stream of operations."""

    def __init__(self, n: int, shared: Shared, token: str, operator: bool, deadline: float,
                 seed: int) -> None:
        super().__init__(name=f"client-{n}", daemon=True)
        self.shared, self.token, self.operator = shared, token, operator
        self.deadline = deadline
        self.rng = random.Random(seed)
        self.session = requests.Session()
        self.twin = requests.Session()  # for the second of two simultaneous requests
        self.kinds = list(WEIGHTS)
        self.weights = [WEIGHTS[k] for k in self.kinds]

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            if not self.operator:
                kind = {"upload": "estimate", "ledger": "budget"}.get(kind, kind)
            getattr(self, "op_" + kind)()

    # ---------------------------------------------------------------- plumbing

    def call(self, kind: str, method: str, path: str, token: str | None = None,
             session: requests.Session | None = None,
             **kw: Any) -> requests.Response | None:
        """Send one request, time it, and flag a 5xx or an answer ``kind`` may not give."""
        headers = {"Authorization": f"Bearer {token or self.token}", **kw.pop("headers", {})}
        started = time.perf_counter()
        try:
            resp = (session or self.session).request(method, self.shared.url + path,
                                                     headers=headers, timeout=60, **kw)
        except requests.RequestException as err:
            self.shared.calls.append(Call(kind, 0, time.perf_counter() - started))
            self.shared.violation(f"{kind}: no answer ({type(err).__name__})", path)
            return None
        self.shared.calls.append(Call(kind, resp.status_code, time.perf_counter() - started))
        if resp.status_code >= 500 or resp.status_code not in EXPECTED[kind]:
            code = _code(resp)
            self.shared.violation(f"{kind}: {resp.status_code} {code}", resp.text)
        return resp

    def pick(self, items: list[str], recent: int = 0) -> str | None:
        with self.shared.lock:
            pool = items[-recent:] if recent else items
            return self.rng.choice(pool) if pool else None

    def body(self, in_turn: bool = False) -> dict[str, Any] | None:
        """A release request of a random dataset; ``in_turn``: releases ask the mechanisms
        in turn, not at random, so a short or slow run still asks each of them."""
        dataset = self.pick(self.shared.datasets)
        if dataset is None:
            return None
        if not in_turn:
            return workload.release_body(self.rng, dataset, self.rng.choice(_MECHANISMS))
        with self.shared.lock:
            mechanism = _MECHANISMS[self.shared.turns % len(_MECHANISMS)]
            self.shared.turns += 1
        return workload.release_body(self.rng, dataset, mechanism)

    # ---------------------------------------------------------------- operations

    def op_upload(self) -> None:
        csv = workload.dataset_csv(self.rng.randrange(2**32))
        resp = self.call("upload", "POST", "/v1/datasets", files={"file": ("soak.csv", csv)},
                         data={"metadata": json.dumps(workload.METADATA)})
        if resp is None or resp.status_code != 201:
            return
        dataset = resp.json()["id"]
        # the analyst's allocation is set before anyone sees the dataset, so every
        # reservation of the analyst on it is held against the allocation too
        share = {m: v * workload.ALLOCATION_SHARE for m, v in workload.CAPS.items()}
        share["subset_draws"] = 1
        alloc = self.call("allocate", "PATCH", f"/v1/datasets/{dataset}/budget",
                          json={"allocations": {self.shared.analyst[0]: share}})
        if alloc is not None and alloc.status_code == 200:
            with self.shared.lock:
                self.shared.datasets.append(dataset)

    def op_estimate(self) -> None:
        body = self.body()
        if body is not None:
            self.call("estimate", "POST", "/v1/releases/estimate", json=body)

    def op_release(self) -> None:
        body = self.body(in_turn=True)
        if body is None:
            return
        key = uuid.uuid4().hex if self.rng.random() < 0.5 else None
        headers = {"Idempotency-Key": key} if key else {}
        resp = self.call("release", "POST", "/v1/releases", json=body, headers=headers)
        if resp is None:
            return
        if resp.status_code == 409 and _code(resp) not in {"budget_exhausted", "conflict"}:
            self.shared.violation(f"release: 409 {_code(resp)}", resp.text)
        if resp.status_code not in {200, 202}:
            return
        doc = resp.json()
        with self.shared.lock:
            if resp.status_code == 202:
                if doc["id"] in self.shared.accepted:
                    self.shared.violations["release: 202 for an id already accepted"] += 1
                self.shared.accepted[doc["id"]] = self.token
                self.shared.order.append(doc["id"])
            else:  # a replay names an earlier release, which some client was told about
                if not doc.get("replayed"):
                    self.shared.violations["release: 200 that is not a replay"] += 1
                self.shared.named[doc["id"]] += 1
            if key:
                self.shared.idem.append((self.token, key, body, doc["id"]))

    def op_race(self) -> None:
        """The same new request with one Idempotency-Key, twice at once: one release."""
        body = self.body()
        if body is None:
            return
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        barrier = threading.Barrier(2)
        answers: list[requests.Response | None] = [None, None]

        def send(i: int) -> None:
            barrier.wait()
            answers[i] = self.call("race", "POST", "/v1/releases", json=body, headers=headers,
                                   session=self.twin if i else self.session)

        twin = threading.Thread(target=send, args=(1,))
        twin.start()
        send(0)
        twin.join()
        ok = [a for a in answers if a is not None and a.status_code in {200, 202}]
        ids = {a.json()["id"] for a in ok}
        if len(ids) > 1:
            self.shared.violation("race: two releases for one Idempotency-Key", str(ids))
        with self.shared.lock:
            for answer in ok:
                release_id = answer.json()["id"]
                if answer.status_code == 202 and release_id not in self.shared.accepted:
                    self.shared.accepted[release_id] = self.token
                    self.shared.order.append(release_id)
                else:
                    self.shared.named[release_id] += 1

    def op_retry(self) -> None:
        """Send a release again with its Idempotency-Key: the same release comes back."""
        with self.shared.lock:
            if not self.shared.idem:
                return
            token, key, body, release_id = self.rng.choice(self.shared.idem)
        if self.rng.random() < 0.1:  # the same key with another body is refused
            with self.shared.lock:
                others = [d for d in self.shared.datasets if d != body["dataset_id"]]
            other = dict(body, dataset_id=self.rng.choice(others))
            resp = self.call("mismatch", "POST", "/v1/releases", token=token, json=other,
                             headers={"Idempotency-Key": key})
            if resp is not None and _code(resp) != "idempotency_mismatch":
                self.shared.violation(f"mismatch: {resp.status_code} {_code(resp)}", resp.text)
            return
        resp = self.call("retry", "POST", "/v1/releases", token=token, json=body,
                         headers={"Idempotency-Key": key})
        if resp is not None and resp.status_code in {200, 202}:
            if resp.json()["id"] != release_id:
                self.shared.violation("retry: another release for the same key", key)
            with self.shared.lock:
                self.shared.named[release_id] += 1

    def op_get_release(self) -> None:
        release_id = self.pick(self.shared.order, recent=300)
        if release_id is None:
            return
        resp = self.call("get_release", "GET", f"/v1/releases/{release_id}")
        if resp is not None and resp.status_code == 200:
            self.learn(resp.json())

    def learn(self, doc: dict[str, Any]) -> None:
        """Remember a succeeded release for data reads and analyses."""
        if doc["status"] != "succeeded":
            return
        with self.shared.lock:
            if doc["id"] in self.shared.succeeded:
                return
            self.shared.succeeded[doc["id"]] = doc
            if doc["mechanism"] in workload.WITH_DATA:
                self.shared.with_data.append(doc["id"])
            if workload.analyses_of(doc["mechanism"]):
                self.shared.with_analyses.append(doc["id"])
            if doc["mechanism"] == "subset.uniform":
                column = doc["params"]["column"]
                self.shared.uniform.setdefault(doc["dataset_id"], {})[column] = doc["id"]

    def op_data(self) -> None:
        release_id = self.pick(self.shared.with_data)
        if release_id is None:
            return
        resp = self.call("data", "GET", f"/v1/releases/{release_id}/data")
        if resp is not None and resp.status_code == 200:
            rows = resp.text.count("\n") - 1
            expected = self.shared.succeeded[release_id]["result"]["n_records"]
            if rows != expected:
                self.shared.violation("data: CSV rows differ from n_records", release_id)

    def op_catalog(self) -> None:
        resp = self.call("catalog", "GET", "/v1/mechanisms")
        if (resp is not None and resp.status_code == 200
                and sorted(m["name"] for m in resp.json()) != _MECHANISMS):
            self.shared.violation("catalog: names differ from the registry")

    def op_budget(self) -> None:
        dataset = self.pick(self.shared.datasets)
        if dataset is None:
            return
        resp = self.call("budget", "GET", f"/v1/datasets/{dataset}/budget")
        if resp is not None and resp.status_code == 200:
            tables = [resp.json()["measures"], *resp.json()["allocations"].values()]
            for table in tables:
                for measure, row in table.items():
                    if row["remaining"] < 0 or max(row["committed"], row["reserved"]) > row[
                            "cap"]:  # remaining is exact (integer units); no float sums here
                        self.shared.violation("overspend seen in a budget read",
                                              f"{dataset} {measure} {row}")

    def op_ledger(self) -> None:
        dataset = self.pick(self.shared.datasets)
        if dataset is not None:
            self.call("ledger", "GET", f"/v1/datasets/{dataset}/ledger?kind=commit")

    def op_analysis(self) -> None:
        release_id = self.pick(self.shared.with_analyses)
        if release_id is None:
            return
        doc = self.shared.succeeded[release_id]
        name, params, paired = self.rng.choice(workload.analyses_of(doc["mechanism"]))
        others: list[str] = []
        if paired:  # an independence test against another column of the same dataset
            with self.shared.lock:
                columns = dict(self.shared.uniform.get(doc["dataset_id"], {}))
            columns.pop(doc["params"]["column"], None)
            if not columns:
                return
            others = [columns[self.rng.choice(sorted(columns))]]
        resp = self.call("analysis", "POST", f"/v1/releases/{release_id}/analyses",
                         json={"analysis": name, "params": params, "releases": others})
        if resp is not None and resp.status_code == 202:
            with self.shared.lock:
                self.shared.analyses[resp.json()["id"]] = release_id

    def op_get_analysis(self) -> None:
        with self.shared.lock:
            if not self.shared.analyses:
                return
            analysis_id = self.rng.choice(list(self.shared.analyses)[-300:])
            release_id = self.shared.analyses[analysis_id]
        self.call("get_analysis", "GET", f"/v1/releases/{release_id}/analyses/{analysis_id}")


_MECHANISMS = registry.names()


def _code(resp: requests.Response) -> str:
    try:
        return str(resp.json().get("code", ""))
    except ValueError:
        return ""


# -------------------------------------------------------------------- setup and checks


def _admin(url: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    return session


def setup(url: str) -> Shared:
    """An analyst key beside the operator's, and a first dataset so clients can start."""
    admin = _admin(url)
    key = admin.post(url + "/v1/keys", json={"role": "analyst", "label": "soak"}, timeout=30)
    key.raise_for_status()
    shared = Shared(url, (key.json()["id"], key.json()["token"]))
    seeder = Client(-1, shared, TOKEN, True, 0.0, 0)
    for _ in range(2):
        seeder.op_upload()
    if len(shared.datasets) != 2:
        raise RuntimeError(f"setup failed: {dict(shared.violations)} {shared.examples}")
    return shared


def drain(shared: Shared, timeout: float) -> dict[str, dict[str, Any]]:
    """Wait until every accepted release and analysis has ended; their final documents."""
    admin = _admin(shared.url)
    deadline = time.monotonic() + timeout

    def final(path: str) -> dict[str, Any] | None:
        while time.monotonic() < deadline:
            resp = admin.get(shared.url + path, timeout=60)
            if resp.status_code != 200:
                shared.violation(f"drain: {resp.status_code}", path)
                return None
            doc: dict[str, Any] = resp.json()
            if doc["status"] in TERMINAL:
                return doc
            time.sleep(0.2)
        shared.violation("lost: never ended", path)
        return None

    with ThreadPoolExecutor(8) as pool:
        releases = dict(zip(shared.accepted, pool.map(
            lambda rid: final(f"/v1/releases/{rid}"), list(shared.accepted)), strict=True))
        analyses = list(pool.map(
            lambda item: final(f"/v1/releases/{item[1]}/analyses/{item[0]}"),
            list(shared.analyses.items())))
    for doc in analyses:
        if doc is not None and doc["status"] != "succeeded":
            shared.violation(f"analysis {doc['analysis']} {doc['status']}", str(doc["error"]))
    return {rid: doc for rid, doc in releases.items() if doc is not None}


def check_ledgers(shared: Shared, docs: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Overspend, lost and duplicated releases, per dataset, from the audit log; counts."""
    admin = _admin(shared.url)
    analyst = shared.analyst[0]
    counts = collections.Counter[str]()
    reserved_ids: set[str] = set()
    refused_ids: set[str] = set()
    for dataset in shared.datasets:
        events = admin.get(f"{shared.url}/v1/datasets/{dataset}/ledger", timeout=60).json()
        balance = admin.get(f"{shared.url}/v1/datasets/{dataset}/budget", timeout=60).json()
        caps: dict[str, int] = {}
        alloc_caps: dict[str, int] = {}
        committed = collections.Counter[str]()
        by_analyst = collections.Counter[str]()
        reserve: dict[str, dict[str, int]] = {}
        actor: dict[str, str] = {}
        ends: dict[str, list[tuple[str, dict[str, int]]]] = collections.defaultdict(list)
        for event in events:
            kind, rid, units = event["kind"], event["release_id"], event["units"]
            if kind == "cap":
                caps.update(units)
            elif kind == "allocation" and event.get("key_id") == analyst:
                alloc_caps.update(units)
            elif kind == "reserve":
                if rid in reserve:
                    shared.violation("duplicated: two reserve events", rid)
                reserve[rid], actor[rid] = units, event["actor"]
            elif kind == "refuse":
                refused_ids.add(rid)
            elif kind in {"commit", "abort", "cancel"}:
                ends[rid].append((kind, units))
                if kind == "commit":
                    committed.update(units)
                    if actor.get(rid) == analyst:
                        by_analyst.update(units)
        reserved_ids |= reserve.keys()
        for rid, units in reserve.items():
            end = ends.get(rid, [])
            doc = docs.get(rid)
            if len(end) != 1:
                shared.violation(f"release ended {len(end)} times in the ledger", rid)
            elif doc is None:
                continue  # already reported by the drain
            elif end[0][0] == "commit" and (doc["status"] != "succeeded" or end[0][1] != units):
                shared.violation("commit event without a succeeded release", rid)
            elif end[0][0] != "commit" and doc["status"] == "succeeded":
                shared.violation("succeeded release without a commit event", rid)
            counts[end[0][0] if end else "open"] += 1
        for measure, row in balance["measures"].items():
            units = committed[measure]
            if units > caps.get(measure, 0):
                shared.violation("overspend: committed above the cap", f"{dataset} {measure}")
            if row["committed"] != budget_units.display(measure, units) or row["reserved"]:
                shared.violation("ledger balance differs from its commit events",
                                 f"{dataset} {measure} {row} {units}")
        for measure, row in balance["allocations"].get(analyst, {}).items():
            units = by_analyst[measure]
            if units > alloc_caps.get(measure, 0):
                shared.violation("overspend: analyst above its allocation", measure)
            if row["committed"] != budget_units.display(measure, units) or row["reserved"]:
                shared.violation("allocation balance differs from its commit events",
                                 f"{dataset} {measure} {row} {units}")
        counts["datasets"] += 1
    accepted = set(shared.accepted)
    for rid in reserved_ids - accepted:
        shared.violation("duplicated: reserved but never answered 202", rid)
    for rid in refused_ids & reserved_ids:
        shared.violation("refused after a reserve event", rid)
    for rid in accepted - reserved_ids - refused_ids:
        shared.violation("lost: 202 without a reserve or refuse event", rid)
    for rid in set(shared.named) - accepted:
        shared.violation("retry or replay names a release never accepted", rid)
    for doc in docs.values():
        if doc["status"] == "refused" and (doc.get("error") or {}).get("code") in REFUSALS:
            counts["refused"] += 1
        elif doc["status"] != "succeeded":
            shared.violation(f"release {doc['mechanism']} {doc['status']}", str(doc["error"]))
    counts["succeeded_mechanisms"] = len({d["mechanism"] for d in docs.values()
                                          if d["status"] == "succeeded"})
    return dict(counts)


# ---------------------------------------------------------------------------- the run


@dataclass
class Report:
    clients: int
    seconds: float
    calls: list[Call]
    counts: dict[str, int]
    memory: list[MemoryRow]
    violations: dict[str, int]
    examples: dict[str, str]
    drain_seconds: float
    #: 1-minute load average of the machine when the load started and when it ended
    loadavg: tuple[float, float] = (0.0, 0.0)

    def kinds(self) -> list[tuple[str, int, float, float, float, dict[int, int]]]:
        """Per kind: count, req/s, p50 and p99 latency (ms), statuses."""
        by: dict[str, list[Call]] = collections.defaultdict(list)
        for call in self.calls:
            by[call.kind].append(call)
        out = []
        for kind in [*sorted(by), "all"]:
            calls = self.calls if kind == "all" else by[kind]
            ms = sorted(c.seconds * 1000 for c in calls)
            q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
            statuses = dict(sorted(collections.Counter(c.status for c in calls).items()))
            out.append((kind, len(calls), len(calls) / self.seconds, q[49], q[98], statuses))
        return out

    def render(self) -> str:
        lines = [f"{self.clients} clients x {self.seconds:.0f} s; drain {self.drain_seconds:.1f} s;"
                 f" {os.cpu_count()} CPUs, load average {self.loadavg[0]:.1f} at the start,"
                 f" {self.loadavg[1]:.1f} at the end",
                 "", f"{'kind':<13} {'count':>7} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}  "
                 "statuses"]
        for kind, n, rate, p50, p99, statuses in self.kinds():
            lines.append(f"{kind:<13} {n:>7} {rate:>7.1f} {p50:>8.1f} {p99:>8.1f}  {statuses}")
        lines += ["", "ledger: " + json.dumps(self.counts, sort_keys=True)]
        if self.memory:
            lines += ["", f"{'RSS (MiB)':<22} {'start':>7} {'end':>7} {'peak':>7} {'growth':>7}"]
            for row in self.memory:
                peak = f"{row.peak_kib / 1024:>7.1f}" if row.peak_kib else f"{'-':>7}"
                lines.append(f"{row.name:<22} {row.start_kib / 1024:>7.1f} "
                             f"{row.end_kib / 1024:>7.1f} {peak} {row.growth:>+7.1%}")
        lines += ["", "violations: " + ("none" if not self.violations else "")]
        for what, n in sorted(self.violations.items()):
            lines.append(f"  {n:>5} x {what}: {self.examples.get(what, '')}")
        return "\n".join(lines)


@contextmanager
def standalone(data_dir: Path | None = None) -> Iterator[Service]:
    """A `privrelease standalone` whose rate limit never refuses the load."""
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        svc = Service(data_dir or Path(tmp), env={
            "PRIVRELEASE_RATE_LIMIT": RATE_LIMIT, "PRIVRELEASE_ESTIMATE_RATE_LIMIT": RATE_LIMIT,
            "PRIVRELEASE_LOG_LEVEL": "WARNING"})
        svc.start()
        try:
            yield svc
        finally:
            if svc.proc is not None and svc.proc.poll() is None:
                svc.stop()


def run(svc: Service, clients: int, seconds: float, *, warmup: float = 30.0,
        max_growth: float | None = 0.10, drain_timeout: float = 300.0,
        seed: int = 0) -> Report:
    """Drive the service, wait for its jobs, check everything; the report says what broke."""
    assert svc.proc is not None
    shared = setup(svc.url)
    sampler = Sampler(svc.proc.pid)
    sampler.start()
    load_before = os.getloadavg()[0]
    deadline = time.monotonic() + seconds
    threads = [Client(i, shared, TOKEN if i % 2 == 0 else shared.analyst[1], i % 2 == 0,
                      deadline, seed * 1000 + i) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sampler.stop()
    load_after = os.getloadavg()[0]
    started = time.monotonic()
    docs = drain(shared, drain_timeout)
    drain_seconds = time.monotonic() - started
    counts = check_ledgers(shared, docs)
    if counts.get("succeeded_mechanisms", 0) < len(_MECHANISMS):
        missing = set(_MECHANISMS) - {d["mechanism"] for d in docs.values()
                                      if d["status"] == "succeeded"}
        shared.violation("a mechanism never released", ", ".join(sorted(missing)))
    memory = sampler.table(warmup, seconds) if seconds > warmup else []
    if max_growth is not None:
        for row in memory:  # Valkey holds the releases and the ledger: it grows by design
            if not row.name.startswith("valkey") and row.growth > max_growth:
                shared.violation(f"memory: {row.name} grew {row.growth:+.1%}",
                                 f"{row.start_kib} -> {row.end_kib} KiB")
    return Report(clients, seconds, list(shared.calls), counts, memory,
                  dict(shared.violations), dict(shared.examples), drain_seconds,
                  (load_before, load_after))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--warmup", type=float, default=30, help="seconds before RSS counts")
    parser.add_argument("--max-growth", type=float, default=0.10,
                        help="largest RSS growth after the warm-up (0.10: 10%%)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    with standalone() as svc:
        report = run(svc, args.clients, args.seconds, warmup=args.warmup,
                     max_growth=args.max_growth, seed=args.seed)
    print(report.render())
    if args.json:
        args.json.write_text(json.dumps({
            "clients": report.clients, "seconds": report.seconds,
            "kinds": [dict(zip(("kind", "count", "rps", "p50_ms", "p99_ms", "statuses"), k,
                               strict=True)) for k in report.kinds()],
            "loadavg": report.loadavg, "counts": report.counts,
            "memory": [vars(r) for r in report.memory],
            "violations": report.violations, "examples": report.examples,
        }, indent=2, default=str))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
