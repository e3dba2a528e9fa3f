"""Reads at scale on PostgreSQL (issue #29 §7): with 10^6 releases and 10^4 datasets stored,
every GET answers in about the same time as with 10 of each.

Two databases on one PostgreSQL server, each served by an API of its own (same gunicorn
settings, same Valkey and data folder):

- ``small``: 10 datasets and 10 releases: one dataset registered through the API (R) with
  8 releases run by the worker (result files on disk, as a run stores them), and,
  inserted the same way as the large state's rows, 9 more datasets, one failed release
  and one still queued (so the jobs list has both phases);
- ``large``: a copy of ``small`` (``CREATE DATABASE ... TEMPLATE``) with 9,990 datasets and
  999,990 releases more, inserted with ``generate_series`` in the shapes ``PgLedger``
  writes (``releases`` rows with their request and inline output, ``replays``,
  ``events`` reserve and commit rows with their units and detail, ``datasets`` documents,
  ``ledgers`` and ``budgets`` rows; committed and reserved then summed from the
  releases): 98.9 % succeeded, 1 % failed, 0.1 % queued; one release in ten is R's (10^5),
  the others spread over the synthetic datasets; all older than the real ones. Then
  ``VACUUM ANALYZE``, as autovacuum leaves a table in steady state.

Each GET is asked alternately of the two APIs (one keep-alive client each, so both see
the machine's load at the same moments), ``REQUESTS`` times after a warm-up, in each of
``ROUNDS`` rounds; the figure is the median latency and the ratio large / small. Lists
are read with small pages (``PAGE``; the jobs list 2, its failed phase 1), so both states
return full pages: their first page and a deep one (small: the second page; large: a
cursor half-way down the list). ``/metrics`` is read with the scraper's token, so with
the datasets' count and the balances of the newest ``METRICS_DATASETS`` datasets (as
many in both states: the figure is what the history costs, not a longer answer; the
default, 1000, reads that many in one query). The console's budget chart (PNG) is read
in a console session: the dataset's whole history in the small state (17 events), the
newest ``service.console.views.CHART_EVENTS`` (1000) of its 2 * 10^5 in the large one.
``BENCH_DIR`` places the servers' data. Run with ``make bench``.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import requests

from service.storage import index
from tests.bench.stack import Stack, bench_dir, load_average, recorder
from tests.e2e.harness import TOKEN

pytestmark = [pytest.mark.bench, pytest.mark.timeout(7200)]

RELEASES = int(os.environ.get("READ_BENCH_RELEASES", str(10**6)))
DATASETS = int(os.environ.get("READ_BENCH_DATASETS", str(10**4)))
REQUESTS = int(os.environ.get("READ_BENCH_REQUESTS", "100"))
ROUNDS = int(os.environ.get("READ_BENCH_ROUNDS", "3"))
REAL_RELEASES = 8
PAGE = 4
GOAL = 1.5  # large / small median latency: "about the same time"
#: /metrics with PRIVRELEASE_METRICS_TOKEN: the queue depths, the worker counters, the
#: datasets' count and the balances of the newest METRICS_DATASETS datasets
METRICS_DATASETS = 10
METRICS = f"/metrics (the count, {METRICS_DATASETS} balances)"
CHART = "the console's budget chart"

#: one fill: ``n`` releases over ``d`` new datasets (ids ``ds_<p><15 hex>``) and the
#: registered dataset R (every tenth release), in PgLedger's shapes. Parameters: p, d, n,
#: R, its document, a request and an output of R's (R's id replaced per dataset), the
#: cost (jsonb), the actor, and the time the newest synthetic row precedes.
FILL = """
CREATE TEMP TABLE fill_ds AS
SELECT g, 'ds_' || %(p)s || lpad(to_hex(g), 15, '0') AS id,
       %(before)s::timestamptz - (%(d)s - g + 1) * interval '1 second' AS at
FROM generate_series(1, %(d)s) g;

INSERT INTO datasets (id, document, created_at, created_by)
SELECT id, replace(%(doc)s, %(r)s, id), at, %(actor)s FROM fill_ds;
INSERT INTO ledgers (dataset_id, opened_by, opened_at, recharged_interval)
SELECT id, %(actor)s, at, true FROM fill_ds;
INSERT INTO budgets (dataset_id, measure, cap)
SELECT id, measure, cap FROM fill_ds CROSS JOIN
    (SELECT measure, cap FROM budgets WHERE dataset_id = %(r)s) caps;
INSERT INTO events (dataset_id, kind, release_id, actor, at, units, detail)
SELECT id, 'cap', '', %(actor)s, at,
       (SELECT jsonb_object_agg(measure, cap) FROM budgets WHERE dataset_id = %(r)s), '{}'
FROM fill_ds;

CREATE TEMP TABLE fill_rel AS
SELECT g,
       'rel_' || substr(md5(%(p)s || 'r' || g), 1, 24) AS id,
       CASE WHEN g %% 10 = 0 THEN %(r)s
            ELSE 'ds_' || %(p)s || lpad(to_hex((g %% %(d)s) + 1), 15, '0') END AS ds,
       CASE WHEN g %% 100 = 1 THEN 'failed' WHEN g %% 1000 = 2 THEN 'queued'
            ELSE 'succeeded' END AS status,
       %(before)s::timestamptz - (%(n)s - g + 1) * interval '1 second' AS at
FROM generate_series(1, %(n)s) g;

INSERT INTO releases (id, dataset_id, actor, status, request, replay_key, version, cost,
                      alloc_cost, error, output, worker, created_at, started_at,
                      finished_at, attempt, data_read, charged, settled_by)
SELECT id, ds, %(actor)s, status, replace(%(request)s, %(r)s, ds),
       md5(%(p)s || 'f' || g), 1, %(cost)s::jsonb, '{}',
       CASE WHEN status = 'failed'
            THEN '{"code": "mechanism_failed", "message": "mechanism failed"}' END,
       CASE WHEN status = 'succeeded' THEN %(output)s END,
       CASE WHEN status <> 'queued' THEN 'bench@synthetic' END,
       at, CASE WHEN status <> 'queued' THEN at + interval '2 ms' END,
       CASE WHEN status <> 'queued' THEN at + interval '5 ms' END,
       CASE WHEN status <> 'queued' THEN 1 ELSE 0 END,
       status <> 'queued', status <> 'queued',
       CASE WHEN status <> 'queued' THEN md5(%(p)s || 's' || g)::text END
FROM fill_rel;
INSERT INTO replays (fingerprint, release_id)
SELECT md5(%(p)s || 'f' || g), id FROM fill_rel;
INSERT INTO events (dataset_id, kind, release_id, actor, at, units, detail)
SELECT ds, kind, id, %(actor)s, at + shift, %(cost)s::jsonb, detail
FROM fill_rel CROSS JOIN LATERAL (VALUES
    (1, 'reserve', interval '0', '{"version": 1}'::jsonb),
    (2, 'commit', interval '5 ms', jsonb_build_object('version', 1, 'outcome', status))
) AS e(step, kind, shift, detail)
WHERE step = 1 OR status <> 'queued'
ORDER BY g, step;

-- committed and reserved as the releases left them (charged: committed; queued: held)
UPDATE budgets b SET committed = s.committed, reserved = s.reserved
FROM (SELECT r.dataset_id, m.key AS measure,
             sum(CASE WHEN r.charged THEN m.value::bigint ELSE 0 END) AS committed,
             sum(CASE WHEN r.status IN ('queued', 'running') THEN m.value::bigint
                      ELSE 0 END) AS reserved
      FROM releases r CROSS JOIN LATERAL jsonb_each_text(r.cost) m
      GROUP BY r.dataset_id, m.key) s
WHERE b.dataset_id = s.dataset_id AND b.measure = s.measure;
DROP TABLE fill_ds;
DROP TABLE fill_rel;
"""


def _db_url(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path="/" + name))


def fill(url: str, prefix: str, datasets: int, releases: int, template: dict[str, Any]
         ) -> float:
    """Insert one fill; seconds it took."""
    start = time.monotonic()
    # bound on the client: the fill is one script of many statements
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("SET work_mem = '256MB'")
        conn.execute(FILL, {"p": prefix, "d": datasets, "n": releases, **template})
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return time.monotonic() - start


class Reader:
    """One keep-alive client of one API, signed in to its console too."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        page = self.session.get(url + "/console/signin", timeout=60).text
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert csrf, page[:300]
        signed = self.session.post(url + "/console/signin", timeout=60, allow_redirects=False,
                                   data={"token": TOKEN, "csrf_token": csrf.group(1)})
        assert signed.status_code == 302, signed.text[:300]
        self.session.headers["Authorization"] = f"Bearer {TOKEN}"

    def get(self, path: str) -> tuple[float, requests.Response]:
        start = time.perf_counter()
        resp = self.session.get(self.url + path, timeout=60)
        took = time.perf_counter() - start
        assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
        return took, resp


def _cursor(created: datetime, member: str, phase: str = "") -> str:
    return index.Cursor(created.timestamp(), member, phase).encode()


def deep_cursors(url: str, dataset: str) -> dict[str, str]:
    """Cursors half-way down each list of the large state (its deep pages)."""
    with psycopg.connect(url) as conn:
        def middle(sql: str, *params: Any) -> tuple[Any, ...]:
            (count,) = conn.execute(f"SELECT count(*) FROM ({sql}) q", params).fetchone() \
                or (0,)
            row = conn.execute(f"{sql} OFFSET %s LIMIT 1", (*params, count // 2)).fetchone()
            assert row is not None
            return row

        rel = middle("SELECT created_at, id FROM releases ORDER BY created_at DESC, id DESC")
        mine = middle("SELECT created_at, id FROM releases WHERE dataset_id = %s "
                      "ORDER BY created_at DESC, id DESC", dataset)
        ds = middle("SELECT created_at, id FROM datasets ORDER BY created_at DESC, id DESC")
        (event,) = middle("SELECT id FROM events WHERE dataset_id = %s ORDER BY id", dataset)
    stream = index.stream_cursor(str(event))
    assert stream is not None
    return {"releases": _cursor(*rel), "dataset_releases": _cursor(*mine),
            "datasets": _cursor(*ds), "ledger": stream.encode()}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    base = bench_dir("reads")
    rig = Stack(base)
    try:
        yield rig
    finally:
        rig.stop()
        if not os.environ.get("BENCH_DIR"):
            shutil.rmtree(base, ignore_errors=True)


def test_every_get_answers_as_fast_with_1e6_releases(stack: Stack,
                                                     record: Callable[[str], None]) -> None:
    # the small state's real part: R, and releases the worker ran
    stack.start_api()
    assert stack.api is not None
    stack.start_worker()
    dataset = stack.upload({"epsilon": 1_000_000})
    ids = []
    for i in range(REAL_RELEASES):
        resp = stack.call("POST", "/v1/releases", json={
            "dataset_id": dataset, "mechanism": "laplace",
            "params": {"statistic": "mean", "column": "x"},
            "budget": {"epsilon": 0.001 + i * 1e-6}})
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    for rid in ids:
        assert stack.wait(rid)["status"] == "succeeded"
    stack.stop_worker()
    stack.stop_process(stack.api)
    (doc, actor, request, output, cost, oldest_ds, oldest_rel) = stack.sql(
        "SELECT d.document, r.actor, r.request, r.output, r.cost::text, "
        "(SELECT min(created_at) FROM datasets), (SELECT min(created_at) FROM releases) "
        "FROM releases r JOIN datasets d ON d.id = r.dataset_id "
        "WHERE r.id = %s", (ids[-1],))[0]
    assert output  # the commit wrote it into the row
    template = {"r": dataset, "doc": doc, "actor": actor, "request": request,
                "output": output, "cost": cost,
                "before": min(oldest_ds, oldest_rel)}
    small_url = stack.db_url
    fill(small_url, "e", 9, 2, template)
    counts = stack.sql("SELECT (SELECT count(*) FROM releases), (SELECT count(*) FROM datasets)")
    assert counts[0] == (REAL_RELEASES + 2, 10), counts
    stack.sql("CREATE DATABASE large TEMPLATE privrelease")
    large_url = _db_url(small_url, "large")
    took = fill(large_url, "f", DATASETS - 10, RELEASES - REAL_RELEASES - 2, template)
    with psycopg.connect(large_url) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM releases), "
                           "(SELECT count(*) FROM datasets), (SELECT count(*) FROM events), "
                           "(SELECT count(*) FROM releases WHERE dataset_id = %s)",
                           (dataset,)).fetchone()
    assert row is not None and row[:2] == (RELEASES, DATASETS), row
    record(f"large state: {row[0]} releases ({row[3]} of the dataset read), {row[1]} "
           f"datasets, {row[2]} events; inserted and vacuumed in {took:.0f} s")

    # the scraper's token is the operator's: one client reads /metrics and the API
    stack.env.update(PRIVRELEASE_METRICS_TOKEN=TOKEN,
                     PRIVRELEASE_METRICS_MAX_DATASETS=str(METRICS_DATASETS))
    small_api, _ = stack.start_api(database_url=small_url)
    large_api, _ = stack.start_api(database_url=large_url)
    small, large = Reader(small_api), Reader(large_api)
    deep = deep_cursors(large_url, dataset)

    def second_page(path: str) -> str:
        _, resp = small.get(path)
        nxt = resp.headers.get("X-Next-Cursor")
        assert nxt, path
        return f"{path}&cursor={nxt}"

    gets: list[tuple[str, str, str]] = [
        ("release", f"/v1/releases/{ids[-1]}", f"/v1/releases/{ids[-1]}"),
        ("releases, first page", f"/v1/releases?limit={PAGE}", f"/v1/releases?limit={PAGE}"),
        ("releases, deep page", second_page(f"/v1/releases?limit={PAGE}"),
         f"/v1/releases?limit={PAGE}&cursor={deep['releases']}"),
        ("a dataset's releases, first page",
         f"/v1/releases?dataset_id={dataset}&limit={PAGE}",
         f"/v1/releases?dataset_id={dataset}&limit={PAGE}"),
        ("a dataset's releases, deep page",
         second_page(f"/v1/releases?dataset_id={dataset}&limit={PAGE}"),
         f"/v1/releases?dataset_id={dataset}&limit={PAGE}&cursor={deep['dataset_releases']}"),
        ("jobs", "/v1/jobs?limit=2", "/v1/jobs?limit=2"),
        ("failed jobs", "/v1/jobs?status=failed&limit=1", "/v1/jobs?status=failed&limit=1"),
        ("datasets, first page", f"/v1/datasets?limit={PAGE}", f"/v1/datasets?limit={PAGE}"),
        ("datasets, deep page", second_page(f"/v1/datasets?limit={PAGE}"),
         f"/v1/datasets?limit={PAGE}&cursor={deep['datasets']}"),
        ("a dataset's budget", f"/v1/datasets/{dataset}/budget",
         f"/v1/datasets/{dataset}/budget"),
        ("its ledger, first page", f"/v1/datasets/{dataset}/ledger?limit={PAGE}",
         f"/v1/datasets/{dataset}/ledger?limit={PAGE}"),
        ("its ledger, deep page", second_page(f"/v1/datasets/{dataset}/ledger?limit={PAGE}"),
         f"/v1/datasets/{dataset}/ledger?limit={PAGE}&cursor={deep['ledger']}"),
        ("a dataset", f"/v1/datasets/{dataset}", f"/v1/datasets/{dataset}"),
        ("my releases, first page", f"/v1/releases?mine=true&limit={PAGE}",
         f"/v1/releases?mine=true&limit={PAGE}"),
        (METRICS, "/metrics", "/metrics"),
        (CHART, f"/console/datasets/{dataset}/budget.png",
         f"/console/datasets/{dataset}/budget.png"),
    ]
    for name, path_small, path_large in gets:  # same shapes: full pages in both
        _, one = small.get(path_small)
        _, other = large.get(path_large)
        if one.headers["Content-Type"].startswith("application/json") and isinstance(
                one.json(), list):
            assert len(one.json()) == len(other.json()) > 0, (name, one.json(), other.json())
    for reader, count in ((small, 10), (large, DATASETS)):  # exact: the counter
        text = reader.get("/metrics")[1].text
        assert re.search(rf"^privrelease_datasets {count}\.0$", text, re.M), count
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in gets}
    for round_ in range(1, ROUNDS + 1):
        record(f"round {round_} (load {load_average()}), median of {REQUESTS} GETs each, "
               "ms: 10 / 10^6 releases, ratio")
        for name, path_small, path_large in gets:
            for _ in range(10):  # warm: connections, plans, caches
                small.get(path_small)
                large.get(path_large)
            times_small, times_large = [], []
            for _ in range(REQUESTS):
                times_small.append(small.get(path_small)[0])
                times_large.append(large.get(path_large)[0])
            a, b = statistics.median(times_small), statistics.median(times_large)
            ratios[name].append(b / a)
            record(f"  {name}: {1000 * a:.2f} / {1000 * b:.2f} ms, ratio {b / a:.2f}")
    worst = max(statistics.median(r) for r in ratios.values())
    record("summary (median ratio of the rounds): " + "; ".join(
        f"{name} {statistics.median(r):.2f}" for name, r in ratios.items()))
    assert worst <= GOAL


@pytest.fixture(scope="module")
def record() -> Iterator[Callable[[str], None]]:
    with recorder("bench-reads.txt") as add:
        yield add
